"""The memcpy limit: single-thread copy bandwidth of page-sized blocks.

The raw figure the shm transport is compared with: the same bytes copied by
one thread from a pool-sized source into a batch-sized destination, so the
source misses the cache as a pool read does. Run as
``python -m peercache.lab.memcpy --size 131072 --duration 2`` for one JSON line.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np


def measure(size: int, duration: float, pool_bytes: int = 256 << 20, batch: int = 32) -> dict:
    """Copy ``size``-byte blocks for ``duration`` s; bytes/s and blocks/s."""
    if size <= 0 or duration <= 0:
        raise ValueError(f"size ({size}) and duration ({duration}) must be positive")
    blocks = max(batch, pool_bytes // size)
    src = np.ones(blocks * size, dtype=np.uint8)
    dst = np.empty(batch * size, dtype=np.uint8)
    srcv = src.reshape(blocks, size)
    dstv = dst.reshape(batch, size)
    copied = 0
    i = 0
    t0 = time.perf_counter()
    deadline = t0 + duration
    while True:
        for j in range(batch):
            np.copyto(dstv[j], srcv[i])
            i = (i + 97) % blocks   # stride through the pool, not one hot block
        copied += batch
        now = time.perf_counter()
        if now >= deadline:
            break
    secs = now - t0
    return {"tool": "memcpy", "size_bytes": size, "blocks": copied, "seconds": secs,
            "bytes_per_s": copied * size / secs, "blocks_per_s": copied / secs, "threads": 1}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m peercache.lab.memcpy", description=__doc__)
    p.add_argument("--size", type=int, default=131072)
    p.add_argument("--duration", type=float, default=2.0)
    a = p.parse_args(argv)
    try:
        print(json.dumps(measure(a.size, a.duration)))
    except ValueError as e:
        print(f"memcpy: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
