"""``drive --timeline-ms N``: what each driver thread completed in every N ms of the measurement window.

A thread keeps one row of counters per bucket (numpy, sized once when the point starts) and the longest
gap between two of its completed batches (its "stall"). A batch adds to the row of its bucket (index
arithmetic) through a few plain integers that are moved into the row when the thread's batches reach
the next bucket: nothing is allocated per batch, and a batch costs a quarter of a microsecond more. :func:`merge` adds the threads' and processes' parts (pure), :func:`document`
gives the point's ``timeline`` record.
"""
from __future__ import annotations

import numpy as np

from .. import options

#: The counters of one bucket, in the order of a row of :attr:`ThreadTimeline.counts`.
FIELDS = ("batches", "keys", "hits", "misses", "errors", "verify_failures", "bytes")
assert len(FIELDS) == options.TIMELINE_COUNTERS
#: Buckets of one point's timeline at most (--timeline-ms over --duration beyond it is refused).
MAX_BUCKETS = options.MAX_TIMELINE_BUCKETS
bucket_count = options.timeline_buckets


class ThreadTimeline:
    """One driver thread's timeline: counters per bucket from ``start`` (epoch s), and its longest stall."""

    __slots__ = ("start", "bucket_ms", "per_s", "last", "counts", "by_prefix", "stall", "prev", "cur", "acc",
                 "acc_prefix")

    def __init__(self, start: float, bucket_ms: int, duration_s: float, prefixes: int = 0):
        n = bucket_count(duration_s, bucket_ms)
        self.start, self.bucket_ms = start, bucket_ms
        self.per_s = 1000.0 / bucket_ms       # buckets per second
        self.last = n - 1
        self.counts = np.zeros((n, len(FIELDS)), dtype=np.int64)
        #: hits per --key-prefix (in their order) per bucket; None when drive reads one working set
        self.by_prefix = np.zeros((n, prefixes), dtype=np.int64) if prefixes > 1 else None
        self.stall = 0.0
        #: when this thread last completed a batch (epoch s; the window's start until it has)
        self.prev = start
        #: the bucket whose counts ``acc`` (and ``acc_prefix``) hold until they are moved into its row
        self.cur = 0
        self.acc = [0] * len(FIELDS)
        self.acc_prefix = np.zeros(prefixes, dtype=np.int64) if prefixes > 1 else None

    def bucket(self, t: float) -> int:
        """The bucket of a moment inside the window (its end falls in the last bucket)."""
        i = int((t - self.start) * self.per_s)
        return i if i < self.last else self.last

    def add(self, t: float, keys: int, hits: int, misses: int, errors: int, verify_failures: int, nbytes: int,
            hits_by_prefix=None) -> None:
        """A batch completed at ``t`` inside the window: its counts (``hits_by_prefix``: its hits per
        --key-prefix, an array, or None when it has none) go to its bucket."""
        i = int((t - self.start) * self.per_s)
        if i > self.last:
            i = self.last
        if i != self.cur:
            self.flush()
            self.cur = i
        a = self.acc
        a[0] += 1
        a[1] += keys
        a[2] += hits
        a[3] += misses
        a[4] += errors
        a[5] += verify_failures
        a[6] += nbytes
        if hits_by_prefix is not None and self.acc_prefix is not None:
            self.acc_prefix += hits_by_prefix

    def flush(self) -> None:
        """Move the counts held for the current bucket into its row."""
        if self.acc[0]:
            self.counts[self.cur] += self.acc
            self.acc = [0] * len(FIELDS)
            if self.acc_prefix is not None:
                self.by_prefix[self.cur] += self.acc_prefix
                self.acc_prefix[:] = 0

    def completed(self, t: float) -> None:
        """A batch of this thread completed at ``t`` (in or after the window): the gap since the last one."""
        if t > self.start:
            gap = t - self.prev
            if gap > self.stall:
                self.stall = gap
            self.prev = t

    def part(self) -> dict:
        """What this thread sends its supervisor (picklable; :func:`merge` adds such parts), once it ended."""
        self.flush()
        return {"start": self.start, "bucket_ms": self.bucket_ms, "counts": self.counts,
                "by_prefix": self.by_prefix, "max_stall_s": self.stall}


def merge(parts: list) -> dict | None:
    """The timeline of several threads (or processes): counters added bucket by bucket, the longest stall
    of them all. None parts (a thread or process without one) are skipped; None if none has one.

    Parts of one point share the window start and the bucket width; a part of another is refused."""
    parts = [p for p in parts if p is not None]
    if not parts:
        return None
    first = parts[0]
    counts = np.array(first["counts"], dtype=np.int64, copy=True)
    by_prefix = None if first["by_prefix"] is None else np.array(first["by_prefix"], dtype=np.int64, copy=True)
    stall = float(first["max_stall_s"])
    for p in parts[1:]:
        if p["bucket_ms"] != first["bucket_ms"] or abs(p["start"] - first["start"]) > 1e-6 \
                or np.shape(p["counts"]) != counts.shape:
            raise ValueError(f"timelines of different windows: start {p['start']} / {first['start']}, "
                             f"{p['bucket_ms']} / {first['bucket_ms']} ms, "
                             f"{np.shape(p['counts'])} / {counts.shape} buckets")
        counts += p["counts"]
        if p["by_prefix"] is not None:
            by_prefix = by_prefix + p["by_prefix"] if by_prefix is not None else np.array(p["by_prefix"])
        stall = max(stall, float(p["max_stall_s"]))
    return {"start": first["start"], "bucket_ms": first["bucket_ms"], "counts": counts, "by_prefix": by_prefix,
            "max_stall_s": stall}


def document(merged: dict | None, fault_bound_s: float | None = None) -> dict | None:
    """The point's ``timeline`` record: ``bucket_ms``, ``start`` (epoch s), ``buckets`` (one per bucket:
    ``t``, s from the start, then the counters of FIELDS, and ``hits_by_prefix`` with several
    --key-prefix's), ``max_stall_s`` and the ``fault_bound_s`` a thread's stall stays under (one GET's
    bound; given by the caller). None without a timeline."""
    if merged is None:
        return None
    width = merged["bucket_ms"] / 1000.0
    rows = merged["counts"].tolist()
    by = merged["by_prefix"].tolist() if merged["by_prefix"] is not None else None
    buckets = []
    for i, row in enumerate(rows):
        b = {"t": round(i * width, 6), **dict(zip(FIELDS, row))}
        if by is not None:
            b["hits_by_prefix"] = by[i]
        buckets.append(b)
    return {"bucket_ms": merged["bucket_ms"], "start": round(merged["start"], 6), "buckets": buckets,
            "max_stall_s": round(merged["max_stall_s"], 6),
            **({"fault_bound_s": round(fault_bound_s, 3)} if fault_bound_s is not None else {})}
