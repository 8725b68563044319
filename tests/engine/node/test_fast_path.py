"""The read's fast path: a batch whose keys are all cached and all hits is one native call
(``_native.read_cached``: the cache's lookup, then the slot reads); anything else is read by the full
path, which says what happened to each key. Both give the same answers, and the cache's counters count
each key once."""
from __future__ import annotations

import numpy as np
import pytest

import peercache
from conftest import free_port
from peercache.node import Get
from peercache.transport.base import native_module

mod, _why = native_module()
pytestmark = pytest.mark.skipif(mod is None, reason=str(_why))
PAGE = 4096


class Spy:
    """The native module, counting the calls of its two batch reads."""

    def __init__(self, real):
        self.real, self.calls = real, {"read_cached": 0, "read_slots": 0}

    def __getattr__(self, name):
        attr = getattr(self.real, name)
        if name in self.calls:
            def counted(*a, **kw):
                self.calls[name] += 1
                return attr(*a, **kw)
            return counted
        return attr


@pytest.fixture(params=["shm", "tcp"])
def pair(request):
    addr = f"127.0.0.1:{free_port()}"
    prod = peercache.Client(addr, protocol=request.param, host_discovery=True, pool_bytes=64 * (PAGE + 256),
                            page_size=PAGE)
    cons = peercache.Client(addr, protocol=request.param, page_size=PAGE, dir_cache_ttl=3600)
    keys = [f"fast/{i}".encode() for i in range(16)]
    for i, k in enumerate(keys):
        prod.put(k, bytes([i]) * PAGE)
    spy = Spy(cons.node.reader.native)
    cons.node.reader.native = spy
    yield prod, cons, keys, spy
    cons.close()
    prod.close()


def _read(cons, keys, **kw):
    dest = np.zeros(len(keys) * PAGE, np.uint8)
    r = cons.node.get_batch_into(keys, dest, np.arange(len(keys), dtype=np.uint64) * PAGE, **kw)
    return r, dest


def test_an_all_cached_all_hit_batch_is_one_native_call_with_the_same_answers(pair):
    _, cons, keys, spy = pair
    first, d1 = _read(cons, keys)                       # nothing cached: the full path locates and reads
    assert spy.calls["read_cached"] == 1 and spy.calls["read_slots"] >= 1 and first.hits == len(keys)
    spy.calls = dict.fromkeys(spy.calls, 0)
    second, d2 = _read(cons, keys)                      # all cached: one call
    assert spy.calls == {"read_cached": 1, "read_slots": 0}
    assert (second.status == Get.HIT).all() and second.hits == len(keys) and second.error is None
    assert (second.lengths == PAGE).all() and (second.generations == first.generations).all()
    assert (d1 == d2).all() and all((d2[i * PAGE:(i + 1) * PAGE] == i).all() for i in range(len(keys)))
    # every key counted once by the cache: 16 misses (the first batch), 16 hits (the second)
    assert (cons.node.cache.hits, cons.node.cache.misses) == (len(keys), len(keys))


def test_a_partly_cached_batch_goes_the_full_path_and_counts_each_key_once(pair):
    prod, cons, keys, spy = pair
    _read(cons, keys[:8])
    h0, m0 = cons.node.cache.hits, cons.node.cache.misses
    spy.calls = dict.fromkeys(spy.calls, 0)
    r, dest = _read(cons, keys)
    assert r.hits == len(keys) and spy.calls == {"read_cached": 1, "read_slots": 1}   # the fast call read nothing
    assert (cons.node.cache.hits - h0, cons.node.cache.misses - m0) == (8, 8)
    assert all((dest[i * PAGE:(i + 1) * PAGE] == i).all() for i in range(len(keys)))


def test_a_miss_among_cached_keys_is_answered_by_the_full_path(pair):
    prod, cons, keys, spy = pair
    _read(cons, keys)
    prod.put(keys[3], b"\x07" * PAGE)       # a new generation: the cached location is stale
    spy.calls = dict.fromkeys(spy.calls, 0)
    r, dest = _read(cons, keys)
    assert spy.calls["read_cached"] == 1 and spy.calls["read_slots"] >= 1   # the full path, which relocated it
    assert r.hits == len(keys) and (r.status == Get.HIT).all()
    assert (dest[3 * PAGE:4 * PAGE] == 7).all()


def test_a_content_mismatch_found_on_the_fast_path_is_reported_by_the_full_path(pair):
    """check_pattern: a hit whose bytes are not the bench pattern is still a hit, listed in
    content_mismatch; the fast path cannot list it, so the batch goes the full path."""
    _, cons, keys, spy = pair
    _read(cons, keys)
    spy.calls = dict.fromkeys(spy.calls, 0)
    r, _ = _read(cons, keys, check_pattern=True)       # the pages hold bytes([i]), not the pattern
    assert r.hits == len(keys) and r.content_mismatch.tolist() == list(range(len(keys)))
    assert spy.calls == {"read_cached": 1, "read_slots": 1}
