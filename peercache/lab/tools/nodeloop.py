"""The engine's batch API measured in one consumer process: one batch read in a tight loop.

The client side of the ``node_api`` point kind (``make bench``'s 64-byte
pages/s figure, and the library's two batch reads): it attaches to a
``peercache-bench serve`` over shm with the directory cached, warms the cache
and the mapping, then for ``--duration`` seconds reads batches of random
published keys with the API ``--api`` names (verification off: the API call
is what is measured, not a driver loop):

- ``node``: ``Node.get_batch_into`` into one registered buffer (the engine's seam);
- ``client``: ``Client.get_batch(keys)``, the library's copying form (bytes returned);
- ``client_outs``: ``Client.get_batch(keys, outs)``, its zero-copy form into a caller's buffer per key
  (a serving engine's).

The loop's thread CPU time (its own clock, ``time.thread_time``) over the pages it read is
``cpu_ns_per_page``. Then it checks every batch once more with the page patterns
(``peercache.tags``), tells serve it is done (one of serve's ``--readers``)
and prints one JSON line::

    python -m peercache.lab.tools.nodeloop --discovery-addr 127.0.0.1:PORT --page-size 64 \\
        --working-set 4096 --batch 128 --duration 3 [--api client_outs]

Uses only the documented seams (``peercache.node``, ``peercache.connect``) and ``peercache.tags``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Callable

import numpy as np

import peercache
from peercache import tags
from peercache.bench import options
from peercache.node import Get, Node

#: Pre-drawn batches (the loop cycles through the first :data:`LOOP_BATCHES` of them).
DRAWN_BATCHES = 64
LOOP_BATCHES = 16
#: The batch reads --api measures (see the module's docstring).
APIS = ("node", "client", "client_outs")


def page_keys(working_set: int) -> list[str]:
    """The keys serve publishes for an mla working set (peercache.bench.options' naming)."""
    return options.page_keys(working_set, "mla")


def reader(api: str, node: Node, into: tuple, addr: str, page: int,
           batch: int) -> tuple[Callable[[list], int], Callable[[], None]]:
    """(read(keys) -> hits, close) of the batch API ``api`` (:data:`APIS`): each read one call of it; ``node``
    reads into ``into`` (its registered buffer, offsets and capacities)."""
    if api == "node":
        return (lambda keys: node.get_batch_into(keys, *into).hits), (lambda: None)
    client = peercache.connect(addr, protocol="shm", page_size=page, dir_cache_ttl=3600.0)
    if api == "client":
        return (lambda keys: sum(1 for v in client.get_batch(keys) if v is not None and len(v) == page)), client.close
    outs = [bytearray(page) for _ in range(batch)]
    return (lambda keys: sum(1 for n in client.get_batch(keys, outs) if n == page)), client.close


def measure(addr: str, page: int, working_set: int, batch: int, duration: float, api: str = "node") -> dict:
    """Objects/s of the batch API ``api`` (verification off), then one verified pass over every drawn batch."""
    if batch > working_set:
        raise ValueError(f"--batch {batch} is larger than --working-set {working_set}; lower the batch")
    if api not in APIS:
        raise ValueError(f"--api {api!r}: one of {', '.join(APIS)}")
    keys = page_keys(working_set)
    rng = np.random.default_rng(2)
    batches = [[keys[j] for j in rng.choice(working_set, batch, replace=False)] for _ in range(DRAWN_BATCHES)]
    dest = np.zeros(batch * page, dtype=np.uint8)
    offsets = np.arange(batch, dtype=np.uint64) * page
    caps = np.full(batch, page, dtype=np.uint64)
    node = Node(addr, protocol="shm", dir_cache_ttl=3600.0, name="lab-node-api")
    read, close = reader(api, node, (dest, offsets, caps), addr, page, batch)
    try:
        for b in batches:  # warm the directory cache and the mapping
            read(b)
        hits = calls = 0
        t0, cpu0 = time.perf_counter(), time.thread_time()
        deadline = t0 + duration
        while time.perf_counter() < deadline:
            for b in batches[:LOOP_BATCHES]:
                hits += read(b)
            calls += LOOP_BATCHES
        seconds, cpu = time.perf_counter() - t0, time.thread_time() - cpu0
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
        close()
        node.close()
    return {"tool": "peercache-node-api", "api": api, "page_size": page, "working_set": working_set, "batch": batch,
            "gets": calls * batch, "hits": hits, "seconds": seconds, "pages_per_s": hits / seconds,
            "cpu_ns_per_page": cpu / max(hits, 1) * 1e9,
            "verified_keys": checked, "verify_failures": failures}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m peercache.lab.tools.nodeloop", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--discovery-addr", required=True, help="serve's host:port")
    p.add_argument("--page-size", type=int, required=True, help="bytes per page (as serve published)")
    p.add_argument("--working-set", type=int, required=True, help="pages serve published")
    p.add_argument("--batch", type=int, default=128, help="keys per call [%(default)s]")
    p.add_argument("--duration", type=float, default=3.0, help="measured seconds [%(default)s]")
    p.add_argument("--api", choices=APIS, default="node",
                   help="the batch read measured: node (Node.get_batch_into), client (Client.get_batch(keys)), "
                        "client_outs (Client.get_batch(keys, outs)) [%(default)s]")
    a = p.parse_args(argv)
    try:
        print(json.dumps(measure(a.discovery_addr, a.page_size, a.working_set, a.batch, a.duration, a.api)),
              flush=True)
    except (ValueError, RuntimeError, OSError) as e:
        print(f"nodeloop: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
