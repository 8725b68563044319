"""The memcpy limit: one thread copying page-sized slots out of a pool-shaped region.

The raw figure the shm transport is compared with. The source is a memfd of
the same size and slot layout as a PeerCache pool (same page type: a memfd
is not backed by transparent huge pages where an anonymous numpy array
would be), read at random slots into a batch-sized destination, with the
same native copy routine the shm backend uses. Run as
``python -m peercache.lab.tools.memcpy --size 131072 --working-set 2048 --duration 2``
for one JSON line.
"""
from __future__ import annotations

import argparse
import json
import mmap
import os
import sys
import time

import numpy as np

from peercache import tags

WARMUP_S = 0.5


def measure(page: int, working_set: int, batch: int, duration: float) -> dict:
    """Bytes/s and pages/s of one thread copying random slots of a pool-shaped memfd."""
    if page <= 0 or working_set < batch or batch <= 0 or duration <= 0:
        raise ValueError(f"need page > 0, 0 < batch <= working set, duration > 0 (got page {page}, "
                         f"working set {working_set}, batch {batch}, duration {duration})")
    try:
        # the native module may not be built: say how to build it; argument checks and --help need it not
        from peercache._native import copy_pages
    except ImportError as e:
        raise RuntimeError(f"the native module is not built ({e}); run `pip install -e .`") from e
    stride = tags.slot_stride(page)
    fd = os.memfd_create("peercache-memcpy", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, stride * working_set)
        with mmap.mmap(fd, stride * working_set) as mm:
            src = np.frombuffer(mm, dtype=np.uint8)
            src[:] = 1  # fault every page in, as serve's publish does
            dst = np.zeros(batch * page, dtype=np.uint8)
            dst_off = np.arange(batch, dtype=np.uint64) * page
            rng = np.random.default_rng(1)
            warm_end = time.perf_counter() + WARMUP_S
            deadline = warm_end + duration
            copied, t0 = 0, None
            while True:
                now = time.perf_counter()
                if t0 is None and now >= warm_end:
                    t0, copied = now, 0
                # A window holds at least one batch: a thread descheduled through a whole short
                # window (a loaded machine) would otherwise report 0 bytes/s.
                if now >= deadline and copied:
                    break
                slots = rng.integers(0, working_set, batch).astype(np.uint64)
                copy_pages(src, dst, slots * np.uint64(stride) + np.uint64(tags.HEADER_BYTES), dst_off, page)
                copied += batch
            secs = time.perf_counter() - t0
            del src
    finally:
        os.close(fd)
    return {"tool": "memcpy", "size_bytes": page, "working_set": working_set, "batch": batch,
            "pages": copied, "seconds": secs, "bytes_per_s": copied * page / secs,
            "pages_per_s": copied / secs, "threads": 1}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m peercache.lab.tools.memcpy", description=__doc__)
    p.add_argument("--size", type=int, default=131072, help="page bytes [%(default)s]")
    p.add_argument("--working-set", type=int, default=2048, help="slots in the region [%(default)s]")
    p.add_argument("--batch", type=int, default=32, help="pages per copy call [%(default)s]")
    p.add_argument("--duration", type=float, default=2.0, help="measured seconds [%(default)s]")
    a = p.parse_args(argv)
    try:
        print(json.dumps(measure(a.size, a.working_set, a.batch, a.duration)))
    except (ValueError, RuntimeError) as e:
        print(f"memcpy: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
