"""The directory table: locations in a fixed-size hash table that consumers read one-sided.

The embedded directory keeps its Python dict as the truth. The node that hosts
it also keeps this *view* of it in a memfd region exposed through its own data
transport (tcp / shm / rdma), so a consumer resolves an uncached key with one
one-sided read of the key's bucket, the same kind of read it fetches pages
with, instead of a ZeroMQ request/reply (FaRM / Pilaf-style lookups).

Layout: 64-byte *lines* of 8 little-endian u64 words. Line 0 is the table
header; bucket ``b`` is the ``ways + 1`` lines starting at line
``1 + b * (ways + 1)``: a bucket line, then ``ways`` entries::

    header : MAGIC | epoch | buckets | ways | 0 | 0 | 0 | check
    bucket : overflowed (0/1) | 0 x 6 | check
    entry  : the 56-byte LOC_DTYPE record (node = the directory's member number) | check

A key lives in bucket ``key_hash % buckets`` (``key_hash`` = :func:`tags.key_hash`,
the hash its slot tag carries, so a consumer computes it from the key) and is
found by its key hash, which the entry's record holds.

No read order is assumed (an RDMA READ or a memcpy gives none), so each line
carries a check word over its seven others and its own line number (XXH3-64
seeded by the table's random seal and the line number; one C call per line,
which at one key costs a fraction of what a vectorised NumPy pass would):
a line read while it was being written (old and new bytes mixed) fails its
check with overwhelming probability, and anything that fails is not trusted
(the consumer asks the ZeroMQ directory instead). An all-zero line is a valid
empty one, so a fresh (zeroed) region is a valid empty table whose pages are
touched only as buckets fill. A bucket that had no free way for a key marks itself
overflowed while such keys exist (they live only in the dict); a key absent
from a bucket whose every line checks and that is not overflowed is a
definitive miss. A record the table cannot hold (a field beyond its width, a
key hash that is not the key's, two keys with one hash) is kept out of it in
the same way.
"""
from __future__ import annotations

import os
import secrets
import struct

import numpy as np
import xxhash

from .. import tags
from ..errors import ConfigError
from ..pool import sealed_region
from ..transport.base import OP_DTYPE

LINE_BYTES = 64
LINE_WORDS = LINE_BYTES // 8
#: "PCDIRTB1" little-endian: the header's first word
MAGIC = int.from_bytes(b"PCDIRTB1", "little")
DEFAULT_WAYS = 7
#: Entries of a hosting node's table unless told otherwise (~18 MiB of region, touched as it fills).
DEFAULT_ENTRIES = 1 << 18
#: The transport region id the table is exposed as (the pool is region 1).
TABLE_REGION = 2
#: Word of an entry that holds the key hash (LOC_DTYPE: node+region, rkey, offset, length,
#: capacity, generation, key_hash).
KEY_HASH_WORD = 6
RECORD_BYTES = 56

_GOLDEN = 0x9E3779B97F4A7C15
_MASK64 = (1 << 64) - 1
_ZERO = bytes(LINE_BYTES)
_HEAD = struct.Struct("<4Q")
_SPEC = struct.Struct("<IIQQQ")   # region, ways, rkey, buckets, seal


def line_check(body: bytes, line: int, seal: int) -> int:
    """The check word of a line: XXH3-64 of its first 56 bytes, seeded with the table's seal and
    the line number (so a line copied elsewhere, or from another table, does not check).

    An all-zero line (check word 0 too) is a valid empty line: a fresh region needs no writes.
    """
    return xxhash.xxh3_64_intdigest(body, (seal ^ (line * _GOLDEN)) & _MASK64)


def line_ok(raw: bytes, off: int, line: int, seal: int) -> bool:
    """Whether the 64 bytes at ``raw[off:]`` are a consistent copy of line ``line``."""
    chunk = raw[off:off + LINE_BYTES]
    if chunk == _ZERO:
        return True
    return line_check(chunk[:56], line, seal) == int.from_bytes(chunk[56:], "little")


def bucket_line(bucket, ways: int):
    """First line (the bucket line) of ``bucket``; works on arrays."""
    return 1 + bucket * (ways + 1)


class DirTable:
    """The writer's side: ``entries`` locations (rounded up to whole buckets of ``ways``) in a memfd.

    Not thread-safe on its own: the :class:`~peercache.directory.store.Directory` calls it under its lock.
    """

    def __init__(self, entries: int, ways: int = DEFAULT_WAYS, name: str = "peercache-dirtable"):
        if entries <= 0:
            raise ConfigError(f"a directory table needs at least one entry, got {entries}; "
                              "give 0 to the option to run without a table")
        if not 1 <= ways <= 63:
            raise ConfigError(f"directory table ways must be in [1, 63], got {ways}")
        self.ways = ways
        self.buckets = -(-entries // ways)
        self.lines = 1 + self.buckets * (ways + 1)
        self.size = self.lines * LINE_BYTES
        self.rkey = secrets.randbits(63) | 1
        self.seal = secrets.randbits(64)
        self.fd, self.mm = sealed_region(name, self.size, f"directory table ({entries} entries)",
                                         "lower --dir-table-entries (0 disables the table)")
        self.words = np.frombuffer(self.mm, dtype=np.uint64).reshape(self.lines, LINE_WORDS)
        self._line_of: dict[bytes, int] = {}           # key -> its entry's line
        self._key_at: dict[int, bytes] = {}            # entry line -> key
        self._hash_at: dict[int, int] = {}             # entry line -> its key hash
        self._spilled: dict[int, set[bytes]] = {}      # bucket -> keys kept out of it (dict only)
        self._bucket_of_spilled: dict[bytes, int] = {}
        self.epoch = 0
        self.set_epoch(0)

    # -- what consumers need -------------------------------------------------------------
    def info(self) -> dict:
        """The table's geometry and capability, as announced to consumers (without the serving node)."""
        return {"region": TABLE_REGION, "rkey": self.rkey, "buckets": self.buckets, "ways": self.ways,
                "line": LINE_BYTES, "seal": self.seal, "magic": MAGIC}

    # -- writes ------------------------------------------------------------------------
    # Changes are collected per call (line -> seven words, None = clear) and written at once,
    # checks computed vectorised: bucket flags raised first, entries, then flags lowered.
    def _flush(self, raise_: dict, entries: dict, lower: dict) -> None:
        words, seal = self.words, self.seal
        for part in (raise_, entries, lower):
            for line, w in part.items():
                row = words[line]
                if w is None:
                    row[7] = 1              # (no read order is assumed; this only keeps a
                    row[:7] = 0             # rewritten line invalid meanwhile)
                    row[7] = 0
                    continue
                body = np.asarray(w, np.uint64)
                row[7] = ~np.uint64(line_check(body.tobytes(), line, seal))
                row[:7] = body
                row[7] = line_check(body.tobytes(), line, seal)

    def set_epoch(self, epoch: int) -> None:
        """The membership epoch consumers compare with the one they mapped node numbers at."""
        self.epoch = int(epoch)
        self._flush({}, {0: [MAGIC, self.epoch, self.buckets, self.ways, 0, 0, 0]}, {})

    def put_many(self, keys, records) -> None:
        """Insert or replace each key's entry with its 56-byte record (a record of None, or one
        the table cannot hold, keeps the key out of the table: the dict alone answers it)."""
        raise_: dict = {}
        entries: dict = {}
        lower: dict = {}
        for key, record in zip(keys, records):
            self._put(key, record, raise_, entries, lower)
        self._flush(raise_, entries, lower)

    def put(self, key: bytes, record) -> None:
        """:meth:`put_many` of one key."""
        self.put_many([key], [record])

    def _put(self, key, record, raise_, entries, lower) -> None:
        khash = tags.key_hash(key)
        b = khash % self.buckets
        ok = type(record) is bytes and len(record) == RECORD_BYTES \
            and int.from_bytes(record[48:56], "little") == khash
        line = self._line_of.get(key)
        if ok and line is not None:
            entries[line] = np.frombuffer(record, "<u8")
            return
        if line is not None:
            self._drop_entry(key, entries)
        if ok and key not in self._bucket_of_spilled:
            first = bucket_line(b, self.ways) + 1
            free, twin = None, None
            for ln in range(first, first + self.ways):
                h = self._hash_at.get(ln)
                if h is None:
                    free = ln if free is None else free
                elif h == khash:
                    twin = ln
            if twin is not None:          # two keys, one hash: neither may be served by the table
                other = self._key_at[twin]
                self._spill(b, other, raise_, lower)
                self._drop_entry(other, entries)
            elif free is not None:
                self._line_of[key], self._key_at[free], self._hash_at[free] = free, key, khash
                entries[free] = np.frombuffer(record, "<u8")
                return
        self._spill(b, key, raise_, lower)

    def _spill(self, b: int, key: bytes, raise_: dict, lower: dict) -> None:
        keys = self._spilled.setdefault(b, set())
        if not keys:
            line = bucket_line(b, self.ways)
            lower.pop(line, None)
            raise_[line] = [1, 0, 0, 0, 0, 0, 0]
        keys.add(key)
        self._bucket_of_spilled[key] = b

    def _drop_entry(self, key: bytes, entries: dict) -> None:
        line = self._line_of.pop(key)
        del self._key_at[line], self._hash_at[line]
        entries[line] = None

    def remove_many(self, keys) -> None:
        """Forget ``keys`` (those absent: nothing happens)."""
        entries: dict = {}
        lower: dict = {}
        for key in keys:
            if key in self._line_of:
                self._drop_entry(key, entries)
                continue
            b = self._bucket_of_spilled.pop(key, None)
            if b is None:
                continue
            spilled = self._spilled[b]
            spilled.discard(key)
            if not spilled:
                del self._spilled[b]
                lower[bucket_line(b, self.ways)] = None   # no key of this bucket lives elsewhere now
        self._flush({}, entries, lower)

    def remove(self, key: bytes) -> None:
        """:meth:`remove_many` of one key."""
        self.remove_many([key])

    def __len__(self) -> int:
        """Entries held in the table."""
        return len(self._line_of)

    @property
    def spilled(self) -> int:
        """Keys kept out of the table (full buckets, hash twins, records that do not fit)."""
        return len(self._bucket_of_spilled)

    def close(self) -> None:
        """Release the mapping and the memfd."""
        self.words = None
        try:
            self.mm.close()
        except BufferError:
            pass   # a live view keeps it; the fd close still frees it at exit
        os.close(self.fd)


# -- the reader's side (a consumer) ---------------------------------------------------

class TableView:
    """What a consumer knows of a directory's table (from the register or members reply), and the
    parsing of what one read of it returned.

    This parsing is the reference: a node with the native module reads the table with one
    ``peercache._native.table_lookup`` call (native/dirtable.c: the key hashes, the plan, the read
    and these checks without the GIL), which tests compare with it on the same tables."""

    def __init__(self, info: dict):
        try:
            self.region, self.rkey = int(info["region"]), int(info["rkey"])
            self.buckets, self.ways = int(info["buckets"]), int(info["ways"])
            self.seal, self.node_id = int(info["seal"]), str(info["node_id"])
            line = int(info.get("line", LINE_BYTES))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"directory table announcement is incomplete ({e!r})") from e
        if line != LINE_BYTES or not 1 <= self.ways <= 63 or self.buckets <= 0:
            raise ValueError(f"directory table of {line} B lines x {self.ways} ways x {self.buckets} buckets "
                             "is not one this version reads")
        try:
            #: the geometry as the native read takes it (pc_table_spec in native/pc.h)
            self.native_spec = _SPEC.pack(self.region, self.ways, self.rkey, self.buckets, self.seal)
        except struct.error as e:
            raise ValueError(f"directory table announcement has a field out of range ({e}): region "
                             f"{self.region}, rkey {self.rkey}, buckets {self.buckets}, seal {self.seal}") from e
        self.data = dict(info.get("data") or {})
        self.bucket_bytes = (self.ways + 1) * LINE_BYTES
        #: the ops of a one-key read (header, then the bucket at remote_offset[1]) as bytes
        ops = np.zeros(2, dtype=OP_DTYPE)
        ops["region"], ops["rkey"] = self.region, self.rkey
        ops["length"] = (LINE_BYTES, self.bucket_bytes)
        ops["local_offset"] = (0, LINE_BYTES)
        self.ops_one = ops.tobytes()

    def plan_one(self, khash: int) -> tuple[int, int]:
        """The bucket of one key and the remote offset of its bucket (the header is at 0)."""
        b = khash % self.buckets
        return b, bucket_line(b, self.ways) * LINE_BYTES

    def parse_one(self, raw: bytes, bucket: int, khash: int):
        """:meth:`parse` of one key without NumPy (the latency path): ``(epoch or None, the
        56-byte record or None, absent)`` from ``raw`` = header line + the key's bucket."""
        seal, ways = self.seal, self.ways
        magic, epoch, buckets, nways = _HEAD.unpack_from(raw, 0)
        if not (magic == MAGIC and buckets == self.buckets and nways == ways and line_ok(raw, 0, 0, seal)):
            return None, None, False
        first = bucket_line(bucket, ways)
        want = khash.to_bytes(8, "little")
        for w in range(1, ways + 1):
            off = LINE_BYTES * (1 + w)
            if raw[off + 48:off + 56] == want and line_ok(raw, off, first + w, seal):
                return epoch, raw[off:off + RECORD_BYTES], False
        clean = raw[LINE_BYTES:LINE_BYTES + 8] == bytes(8) and all(
            line_ok(raw, LINE_BYTES * (1 + i), first + i, seal) for i in range(ways + 1))
        return epoch, None, clean

    def plan(self, khashes: np.ndarray):
        """The reads for keys of ``khashes``: (unique buckets, each key's index into them, the op
        fields (remote offsets, lengths, local offsets) of header + buckets, bytes to land them in)."""
        b = khashes % np.uint64(self.buckets)
        if len(b) == 1:
            ub, inv = b, np.zeros(1, np.intp)
        else:
            ub, inv = np.unique(b, return_inverse=True)
        nb = len(ub)
        remote = np.empty(nb + 1, np.uint64)
        remote[0] = 0
        remote[1:] = bucket_line(ub, self.ways) * np.uint64(LINE_BYTES)
        length = np.full(nb + 1, self.bucket_bytes, np.uint64)
        length[0] = LINE_BYTES
        local = np.empty(nb + 1, np.uint64)
        local[0] = 0
        local[1:] = LINE_BYTES + np.arange(nb, dtype=np.uint64) * np.uint64(self.bucket_bytes)
        return ub, inv, remote, length, local, LINE_BYTES + nb * self.bucket_bytes

    def parse(self, buf: np.ndarray, ub: np.ndarray, inv: np.ndarray, khashes: np.ndarray):
        """``(epoch or None, records (n, 7) u64 words, found, absent)`` from the bytes a read of
        :meth:`plan`'s ops left in ``buf``.

        ``found``: a checked entry holds the key (its record is in ``records``); ``absent``: the
        key is definitively not in the directory (its bucket's every line checks and it is not
        overflowed). Keys neither found nor absent are doubtful. A header that fails its check
        (or names another geometry) makes every key doubtful (epoch None).
        """
        n, ways, seal = len(khashes), self.ways, self.seal
        raw = buf.tobytes()
        words = np.frombuffer(raw, np.uint64).reshape(-1, LINE_WORDS)
        none = np.zeros(n, bool)
        head = words[0].tolist()
        if not (line_ok(raw, 0, 0, seal) and head[0] == MAGIC and head[2] == self.buckets and head[3] == ways):
            return None, None, none, none
        block = words[1:].reshape(len(ub), ways + 1, LINE_WORDS)
        step = self.bucket_bytes
        qs, ws = np.nonzero(block[inv, 1:, KEY_HASH_WORD] == khashes[:, None])   # candidates, not yet checked
        found = none.copy()
        way = np.zeros(n, np.intp)
        inv_l = inv.tolist()
        if len(qs):
            cu = inv[qs]
            lines = (bucket_line(ub[cu], ways) + 1 + ws).astype(np.uint64)
            offs = (LINE_BYTES + cu * step + (ws + 1) * LINE_BYTES).tolist()
            with np.errstate(over="ignore"):
                seeds = (np.uint64(seal) ^ (lines * np.uint64(_GOLDEN))).tolist()
            h = xxhash.xxh3_64_intdigest
            calc = np.fromiter((h(raw[o:o + 56], sd) for o, sd in zip(offs, seeds)), np.uint64, len(offs))
            ok = calc == block[cu, 1 + ws, 7]          # a candidate's line is non-zero: its hash is the key's
            found[qs[ok]] = True
            way[qs[ok]] = ws[ok]
        absent = none.copy()
        if not found.all():
            clean: dict[int, bool] = {}
            for q in np.flatnonzero(~found).tolist():
                u = inv_l[q]
                c = clean.get(u)
                if c is None:
                    base = LINE_BYTES + u * step
                    first = bucket_line(int(ub[u]), ways)
                    c = clean[u] = raw[base:base + 8] == bytes(8) and all(
                        line_ok(raw, base + i * LINE_BYTES, first + i, seal) for i in range(ways + 1))
                absent[q] = c
        records = block[inv, 1 + way, :7]
        return int(head[1]), records, found, absent
