import numpy as np

from peercache import tags


def test_slot_stride_aligned_and_holds_tag():
    for cap in (1, 64, 4096, 131072, 131073):
        s = tags.slot_stride(cap)
        assert s % tags.SLOT_ALIGN == 0
        assert s >= cap + tags.TAG_BYTES


def test_key_hash_stable_nonzero_and_distinct():
    a, b = tags.key_hash(b"layer0/page1"), tags.key_hash(b"layer0/page2")
    assert a == tags.key_hash(b"layer0/page1") and a != b and a != 0


def test_pattern_roundtrip_and_mismatch():
    pages = np.zeros((3, 100), dtype=np.uint8)  # not a multiple of 8: tail bytes matter
    for i in range(3):
        tags.fill_pattern(pages[i], 1000 + i, 1)
    assert tags.verify_patterns(pages, np.array([1000, 1001, 1002], np.uint64), np.ones(3, np.uint64)).all()
    ok = tags.verify_patterns(pages, np.array([1000, 1001, 1002], np.uint64), np.array([1, 2, 1], np.uint64))
    assert ok.tolist() == [True, False, True]
    pages[2, 99] ^= 1
    assert not tags.verify_patterns(pages[2:], np.array([1002], np.uint64), np.ones(1, np.uint64))[0]


def test_tag_check_rules():
    good = np.array([[4, 7, 2, 10, 12345, 0, 0, 0, 4]], dtype=np.uint64)   # checksum, reserved: not the tag
    kh, gen, ln = np.array([7], np.uint64), np.array([2], np.uint64), np.array([10], np.uint64)
    assert tags.tag_check(good, kh, gen, ln).tolist() == [tags.TAG_OK]
    for col, val in ((0, 5), (tags.TRAILER_SEQ, 6), (2, 3), (3, 11)):  # odd seq, torn, gen, length
        bad = good.copy()
        bad[0, col] = val
        assert tags.tag_check(bad, kh, gen, ln).tolist() == [tags.TAG_MISMATCH], col
    other = good.copy()
    other[0, 1] = 8                          # a stable slot, as its entry says, of another key
    assert tags.tag_check(other, kh, gen, ln).tolist() == [tags.KEY_MISMATCH]
    other[0, 2] = 3                          # ... and another generation: stale, not redirected
    assert tags.tag_check(other, kh, gen, ln).tolist() == [tags.TAG_MISMATCH]
    empty = np.zeros((1, tags.TAG_WORDS), dtype=np.uint64)
    assert tags.tag_check(empty, np.zeros(1, np.uint64), np.zeros(1, np.uint64),
                          np.zeros(1, np.uint64)).tolist() == [tags.TAG_MISMATCH]


def test_key_hashes_are_key_hash():
    keys = [b"", b"pc/0", b"x" * 300]
    assert tags.key_hashes(keys).tolist() == [tags.key_hash(k) for k in keys]
