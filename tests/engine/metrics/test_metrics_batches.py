"""peercache.metrics.batches: what one GET batch call records, summed over threads at a scrape."""
import threading

import numpy as np
import pytest

from peercache.metrics.batches import LATENCY_BUCKETS, BatchStats
from peercache.node import Get


def _batch(statuses, lengths):
    return np.asarray(statuses, np.int8), np.asarray(lengths, np.uint64)


def test_one_record_per_batch_with_keys_hits_and_bytes():
    b = BatchStats()
    b.record(3e-5, *_batch([Get.HIT, Get.MISS, Get.HIT, Get.ERROR], [4096, 0, 100, 0]))
    b.record(2e-3, *_batch([Get.HIT], [4096]))            # the one-key path
    b.record(7.0, *_batch([Get.MISS], [0]))
    t = b.snapshot()
    assert t.batches == 3 and t.keys == 6 and t.hits == 3 and t.bytes == 4096 + 100 + 4096
    assert t.seconds == pytest.approx(3e-5 + 2e-3 + 7.0)
    assert len(t.counts) == len(LATENCY_BUCKETS) + 1
    # each batch in the first bucket whose bound is at least its latency
    assert t.counts[LATENCY_BUCKETS.index(5e-5)] == 1
    assert t.counts[LATENCY_BUCKETS.index(2.5e-3)] == 1
    assert t.counts[LATENCY_BUCKETS.index(10.0)] == 1


def test_a_latency_on_a_bound_is_in_that_bucket_and_beyond_the_last_in_inf():
    b = BatchStats(buckets=(1e-3, 1e-2))
    b.record(1e-3, *_batch([Get.HIT], [1]))
    b.record(0.5, *_batch([Get.HIT], [1]))
    assert b.snapshot().counts == (1, 0, 1)


def test_threads_keep_their_own_cells_and_ended_threads_are_folded_not_lost():
    b = BatchStats()
    per_thread, threads = 2000, 4
    start = threading.Barrier(threads)

    def work():
        start.wait()
        for _ in range(per_thread):
            b.record(1e-4, *_batch([Get.HIT, Get.HIT], [10, 20]))

    ts = [threading.Thread(target=work) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    first = b.snapshot()
    assert first.batches == threads * per_thread and first.bytes == 30 * threads * per_thread
    assert first.keys == first.hits == 2 * threads * per_thread
    assert b._cells == []                          # the ended threads' cells were folded
    b.record(1e-4, *_batch([Get.MISS], [0]))        # this thread's cell, alive
    second = b.snapshot()
    assert second.batches == first.batches + 1 and second.keys == first.keys + 1 and second.hits == first.hits


def test_buckets_must_increase():
    with pytest.raises(ValueError, match="increasing"):
        BatchStats(buckets=(1.0, 0.5))
