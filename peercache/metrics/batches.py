"""What each GET batch call records: its latency (a histogram), keys asked, keys hit, bytes landed.

The one per-call cost of the metrics, so it is kept small: no lock and no Prometheus object per call.
Each thread writes a plain list of its own (its cell); a scrape adds the cells up (:meth:`BatchStats.snapshot`)
and folds the cells of threads that ended into one retired cell, so short-lived threads (a driver's
threads per point) leave their counts without leaving their cells behind.
"""
from __future__ import annotations

import threading
from bisect import bisect_left
from dataclasses import dataclass

import numpy as np

from ..node import Get

#: Upper bounds (seconds) of the batch-latency buckets: a 4 KiB GET over loopback (tens of µs) up to a
#: batch stuck behind a reconnect (seconds).
LATENCY_BUCKETS = (10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3,
                   0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

# A hit is status 0, so the hits of a batch are its length less the nonzero statuses (one numpy call).
assert int(Get.HIT) == 0, "BatchStats counts hits as the zero statuses"


@dataclass(frozen=True)
class BatchTotals:
    """The sums over every thread at one moment (see :meth:`BatchStats.snapshot`)."""

    buckets: tuple          #: the upper bounds, seconds
    counts: tuple           #: batches per bucket (not cumulative), the last one above every bound (+Inf)
    seconds: float          #: sum of the batches' latencies
    keys: int               #: keys asked
    hits: int               #: keys read whole (status HIT)
    bytes: int              #: payload bytes of the hits

    @property
    def batches(self) -> int:
        """Batch calls recorded."""
        return sum(self.counts)


class BatchStats:
    """Per-call figures of ``get_batch_into`` (see the module doc); the node's Reader calls
    :meth:`record` once per batch when it holds one (``reader.batches``)."""

    def __init__(self, buckets: tuple = LATENCY_BUCKETS):
        if list(buckets) != sorted(set(buckets)) or not buckets or buckets[0] <= 0:
            raise ValueError(f"latency buckets must be positive and increasing, got {buckets}")
        self.buckets = tuple(float(b) for b in buckets)
        n = len(self.buckets) + 1
        #: positions in a cell after the bucket counts (the +Inf bucket is at n - 1)
        self._sum, self._keys, self._hits, self._bytes = n, n + 1, n + 2, n + 3
        self._width = n + 4
        self._local = threading.local()
        self._cells: list[tuple[threading.Thread, list]] = []
        self._retired = [0] * self._width
        self._lock = threading.Lock()

    def _cell(self) -> list:
        cell = [0] * self._width
        cell[self._sum] = 0.0
        self._local.cell = cell
        with self._lock:
            self._cells.append((threading.current_thread(), cell))
        return cell

    def record(self, seconds: float, status: np.ndarray, lengths: np.ndarray) -> None:
        """One batch call: ``seconds`` it took, its per-key ``status`` and ``lengths`` (0 but for hits)."""
        try:
            cell = self._local.cell
        except AttributeError:
            cell = self._cell()
        cell[bisect_left(self.buckets, seconds)] += 1
        cell[self._sum] += seconds
        n = len(status)
        cell[self._keys] += n
        if n == 1:          # the latency path: no numpy call, no numpy scalar
            if status.item(0) == 0:
                cell[self._hits] += 1
                cell[self._bytes] += lengths.item(0)
        else:
            cell[self._hits] += n - int(np.count_nonzero(status))
            cell[self._bytes] += np.add.reduce(lengths).item()

    def snapshot(self) -> BatchTotals:
        """The sums of every thread's cell now (cells of ended threads folded into one)."""
        total = [0] * self._width
        with self._lock:
            live = []
            for thread, cell in self._cells:
                # Asked before the copy: a thread that has ended wrote its last record before it.
                alive = thread.is_alive()
                # One C call; a record in flight may show in part, and whole from the next scrape on.
                copy = cell[:]
                if not alive:
                    self._retired = [a + b for a, b in zip(self._retired, copy)]
                    continue
                live.append((thread, cell))
                total = [a + b for a, b in zip(total, copy)]
            self._cells = live
            total = [a + b for a, b in zip(total, self._retired)]
        nb = len(self.buckets) + 1
        return BatchTotals(self.buckets, tuple(int(c) for c in total[:nb]), float(total[self._sum]),
                           int(total[self._keys]), int(total[self._hits]), int(total[self._bytes]))
