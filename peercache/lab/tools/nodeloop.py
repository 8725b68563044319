"""The engine's batch API measured in one consumer process: ``Node.get_batch_into`` in a tight loop.

The client side of the ``node_api`` point kind (``make bench``'s 64-byte
pages/s figure): it attaches to a ``peercache-bench serve`` over shm with the
directory cached, warms the cache and the mapping, then for ``--duration``
seconds calls ``get_batch_into`` on batches of random published keys into
one registered buffer (verification off: the API call is what is measured,
not a driver loop), then checks every batch once more with the page
patterns (``peercache.tags``). It tells serve it is done (one of serve's
``--readers``) and prints one JSON line::

    python -m peercache.lab.tools.nodeloop --discovery-addr 127.0.0.1:PORT --page-size 64 \\
        --working-set 4096 --batch 128 --duration 3

Uses only the documented batch seam (``peercache.node``) and ``peercache.tags``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from peercache import tags
from peercache.bench import options
from peercache.node import Get, Node

#: Pre-drawn batches (the loop cycles through the first :data:`LOOP_BATCHES` of them).
DRAWN_BATCHES = 64
LOOP_BATCHES = 16


def page_keys(working_set: int) -> list[str]:
    """The keys serve publishes for an mla working set (peercache.bench.options' naming)."""
    return options.page_keys(working_set, "mla")


def measure(addr: str, page: int, working_set: int, batch: int, duration: float) -> dict:
    """Objects/s of get_batch_into (verification off), then one verified pass over every drawn batch."""
    if batch > working_set:
        raise ValueError(f"--batch {batch} is larger than --working-set {working_set}; lower the batch")
    keys = page_keys(working_set)
    rng = np.random.default_rng(2)
    batches = [[keys[j] for j in rng.choice(working_set, batch, replace=False)] for _ in range(DRAWN_BATCHES)]
    dest = np.zeros(batch * page, dtype=np.uint8)
    offsets = np.arange(batch, dtype=np.uint64) * page
    caps = np.full(batch, page, dtype=np.uint64)
    node = Node(addr, protocol="shm", dir_cache_ttl=3600.0, name="lab-node-api")
    try:
        for b in batches:  # warm the directory cache and the mapping
            node.get_batch_into(b, dest, offsets, caps)
        hits = calls = 0
        t0 = time.perf_counter()
        deadline = t0 + duration
        while time.perf_counter() < deadline:
            for b in batches[:LOOP_BATCHES]:
                hits += node.get_batch_into(b, dest, offsets, caps).hits
            calls += LOOP_BATCHES
        seconds = time.perf_counter() - t0
        failures = checked = 0
        khash = {k: tags.key_hash(k) for k in keys}
        for b in batches:  # correctness: verification on
            r = node.get_batch_into(b, dest, offsets, caps)
            hit = r.status == Get.HIT
            ok = tags.verify_patterns(dest.reshape(batch, page)[hit],
                                      np.array([khash[k] for k in b], dtype=np.uint64)[hit],
                                      r.generations[hit])
            failures += int((~ok).sum()) + int((~hit).sum())
            checked += len(b)
        # Count this process as one of serve's readers, so serve exits when its readers are done.
        node.call("reader_done", summary={"status": "ok", "points": 1})
    finally:
        node.close()
    return {"tool": "peercache-node-api", "page_size": page, "working_set": working_set, "batch": batch,
            "gets": calls * batch, "hits": hits, "seconds": seconds, "pages_per_s": hits / seconds,
            "verified_keys": checked, "verify_failures": failures}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m peercache.lab.tools.nodeloop", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--discovery-addr", required=True, help="serve's host:port")
    p.add_argument("--page-size", type=int, required=True, help="bytes per page (as serve published)")
    p.add_argument("--working-set", type=int, required=True, help="pages serve published")
    p.add_argument("--batch", type=int, default=128, help="keys per call [%(default)s]")
    p.add_argument("--duration", type=float, default=3.0, help="measured seconds [%(default)s]")
    a = p.parse_args(argv)
    try:
        print(json.dumps(measure(a.discovery_addr, a.page_size, a.working_set, a.batch, a.duration)), flush=True)
    except (ValueError, RuntimeError, OSError) as e:
        print(f"nodeloop: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
