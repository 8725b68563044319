"""Slot layout and the seqlock tag that makes one-sided reads safe.

A slot in a pool region is laid out as::

    +0   header  : seq u64 | key_hash u64 | generation u64 | length u64 | checksum u64
                   | 3 x u64 reserved (0)                                          (64 B)
    +64  payload : `capacity` bytes (the object, `length` <= capacity)
    +64+capacity trailer : seq u64                                                 (8 B)

and padded to a multiple of 64 bytes, so every payload starts on a cache line
(a copy or a check of it never loads across two lines). A writer bumps ``seq`` to odd in the
header and the trailer before it touches anything, writes, then stores the
new even ``seq`` in the trailer and last in the header. A reader copies
header, payload and trailer in ascending address order (one RDMA READ with a
scatter list, one TCP reply, or a memcpy) and accepts the object only if the
header and trailer ``seq`` are equal and even, the key hash is the hash of the
key it asked for (computed by the consumer itself: an entry the directory gave
may point at another key's slot), and generation and length are the ones the
directory gave. Any overlap with a writer makes
the two ``seq`` copies differ, so a stale or torn slot reads as a miss, never
as wrong bytes.

The checksum word is 0 unless the producer runs with ``integrity`` on; then
it is the checksum of the payload (XXH3-64 seeded by :func:`checksum_seed`, from the key hash
and generation; :func:`peercache.transport.base.checksum`, in the native module), written inside the same seqlock window, and a consumer with
``integrity`` on recomputes it before it returns a hit. The seqlock catches
a slot that changed while it was read; only the checksum catches a payload
that changed without its tag (a bug, a bit flip in host memory, a wrong DMA).
"""
from __future__ import annotations

import hashlib

import numpy as np

HEADER_BYTES = 64
TRAILER_BYTES = 8
TAG_BYTES = HEADER_BYTES + TRAILER_BYTES  # scratch bytes per read (header + trailer)
TAG_WORDS = TAG_BYTES // 8                # header words, then the trailer's seq
SLOT_ALIGN = 64

# Field positions (in u64 words) inside the header.
SEQ, KEY_HASH, GENERATION, LENGTH, CHECKSUM = 0, 1, 2, 3, 4
#: The tag scratch word holding the trailer's seq.
TRAILER_SEQ = TAG_WORDS - 1

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_MIX = 0xBF58476D1CE4E5B9


def slot_stride(capacity: int) -> int:
    """Bytes one slot of ``capacity`` payload bytes occupies in a region."""
    raw = HEADER_BYTES + capacity + TRAILER_BYTES
    return (raw + SLOT_ALIGN - 1) // SLOT_ALIGN * SLOT_ALIGN


def key_bytes(key: str | bytes) -> bytes:
    """Keys travel as bytes; str keys are UTF-8."""
    if isinstance(key, bytes):
        return key
    if isinstance(key, str):
        return key.encode()
    raise TypeError(f"a key must be str or bytes, not {type(key).__name__}")


def key_hash(key: bytes) -> int:
    """64-bit hash stored in the slot tag; never 0 so an empty slot never matches."""
    h = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")
    return h or 1


def key_hashes(keys) -> np.ndarray:
    """:func:`key_hash` of each key, as u64 (the same hash, with less per-key overhead)."""
    b2, frm = hashlib.blake2b, int.from_bytes
    return np.fromiter(((frm(b2(k, digest_size=8).digest(), "little") or 1) for k in keys), np.uint64, len(keys))


#: Outcomes of :func:`tag_check` (the native module's per-key codes of the same names).
TAG_OK, TAG_MISMATCH, KEY_MISMATCH = 0, 101, 106


def tag_check(tags: np.ndarray, want: np.ndarray, generations: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The slot tag check, vectorised: ``tags`` is (n, TAG_WORDS) u64 = header words + trailer seq,
    ``want`` the :func:`key_hash` of each key asked for, computed by the consumer (never the hash its
    directory entry carries), ``generations`` and ``lengths`` those of its entry.

    Per key: TAG_OK (the bytes are that object), KEY_MISMATCH (the slot is stable and is the one its
    entry describes, but it holds another key: the entry points at another key's slot) or
    TAG_MISMATCH (evicted, reused or torn while read). The native reader's pc_tag_check."""
    seq = tags[:, SEQ]
    as_described = ((seq & 1) == 0) & (seq != 0) & (tags[:, TRAILER_SEQ] == seq) \
        & (tags[:, GENERATION] == generations) & (tags[:, LENGTH] == lengths)
    return np.where(as_described, np.where(tags[:, KEY_HASH] == want, TAG_OK, KEY_MISMATCH), TAG_MISMATCH)


def pattern_seed(khash: int, generation: int) -> int:
    """Seed of the synthetic page content derived from (key, generation)."""
    return (khash ^ ((generation * _MIX) & _MASK64)) & _MASK64


def fill_pattern(out: np.ndarray, khash: int, generation: int) -> None:
    """Write the bench content of (key, generation) into the uint8 array ``out``."""
    n = out.size
    words = (n + 7) // 8
    seq = np.arange(words, dtype=np.uint64)
    with np.errstate(over="ignore"):
        vals = np.uint64(pattern_seed(khash, generation)) + seq * np.uint64(_GOLDEN)
    out[:] = vals.view(np.uint8)[:n]


def verify_patterns(pages: np.ndarray, khashes: np.ndarray, generations: np.ndarray) -> np.ndarray:
    """Check (n, page) uint8 pages against their expected content; bool per page."""
    n, size = pages.shape
    ok = np.zeros(n, dtype=bool)
    words = size // 8
    idx = np.arange(words, dtype=np.uint64) * np.uint64(_GOLDEN)
    for i in range(n):
        seed = np.uint64(pattern_seed(int(khashes[i]), int(generations[i])))
        page = pages[i]
        with np.errstate(over="ignore"):
            good = np.array_equal(page[:words * 8].view(np.uint64), seed + idx)
        if good and size % 8:
            tail = np.empty(size - words * 8, dtype=np.uint8)
            with np.errstate(over="ignore"):
                last = np.array([seed + np.uint64(words) * np.uint64(_GOLDEN)], dtype=np.uint64)
            tail[:] = last.view(np.uint8)[:tail.size]
            good = np.array_equal(page[words * 8:], tail)
        ok[i] = good
    return ok


def checksum_seed(khash: int, generation: int) -> int:
    """Seed of a payload's checksum: ties the bytes to the (key, generation) they were written as."""
    return (khash ^ ((generation * _GOLDEN) & _MASK64)) & _MASK64
