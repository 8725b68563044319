import numpy as np
import pytest

from peercache import tags
from peercache.errors import ConfigError
from peercache.pool import Pool


def header(pool, ref):
    h = ref.offset // 8
    t = (ref.offset + tags.HEADER_BYTES + pool.capacity) // 8
    return pool.words[h:h + 4].tolist(), int(pool.words[t])


def test_put_writes_payload_and_consistent_tag():
    pool = Pool(4, 64)
    ref, evicted = pool.put(b"k", b"hello")
    assert evicted is None and ref.length == 5 and ref.generation == 1
    start = ref.offset + tags.HEADER_BYTES
    assert bytes(pool.bytes[start:start + 5]) == b"hello"
    (seq, kh, gen, ln), trailer = header(pool, ref)
    assert seq % 2 == 0 and seq == trailer and kh == tags.key_hash(b"k") and gen == 1 and ln == 5
    pool.close()


def test_lru_evicts_oldest_and_bumps_generation():
    pool = Pool(2, 16)
    a, _ = pool.put(b"a", b"1")
    pool.put(b"b", b"2")
    pool.put(b"a", b"3")          # touches a: b is now the oldest
    c, ev = pool.put(b"c", b"4")
    assert ev is not None and ev.key == b"b"
    assert c.slot == ev.slot and c.generation == ev.generation + 1
    assert pool.ref(b"b") is None and pool.ref(b"a") is not None
    assert len(pool) == 2
    pool.close()


def test_remove_invalidates_tag():
    pool = Pool(2, 16)
    ref, _ = pool.put(b"a", b"xyz")
    pool.remove(b"a")
    (seq, *_), trailer = header(pool, ref)
    assert seq % 2 == 1 and seq != trailer   # any reader now sees a torn/odd slot
    assert pool.remove(b"a") is None
    pool.close()


def test_object_larger_than_slot_is_refused():
    pool = Pool(1, 8)
    with pytest.raises(ConfigError, match="does not fit"):
        pool.put(b"big", b"123456789")
    with pytest.raises(ConfigError):
        Pool(0, 8)
    pool.close()


def test_fill_callback_gets_payload_view():
    pool = Pool(1, 32)
    ref, _ = pool.put(b"p", None, fill=lambda view, r: tags.fill_pattern(view, r.key_hash, r.generation))
    start = ref.offset + tags.HEADER_BYTES
    page = pool.bytes[start:start + 32].reshape(1, 32)
    assert tags.verify_patterns(page, np.array([ref.key_hash], np.uint64), np.array([1], np.uint64))[0]
    pool.close()


def test_region_size_is_sealed():
    import os
    pool = Pool(2, 64)
    with pytest.raises(PermissionError):
        os.ftruncate(pool.fd, 0)          # would SIGBUS consumers that map the pool
    pool.close()
