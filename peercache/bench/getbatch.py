"""The library's two batch reads side by side: ``Client.get_batch(keys)`` (copies, returns bytes)
and ``Client.get_batch(keys, outs)`` (zero-copy into the caller's buffers, a serving engine's form).

::

    python -m peercache.bench.getbatch --page-size 4096 --batch 32 --rounds 3 --duration 1

One process: a producer ``Client`` with a pool (hosting the embedded directory on a free
loopback port) puts ``--working-set`` pages; a consumer ``Client`` over ``--protocol``
(shm by default), directory cached, reads random batches of ``--batch`` keys. Each round
times the copying form for ``--duration`` seconds, then the ``outs`` form right after it
(paired rounds: each round's ratio is the outs form's calls/s over the copying form's);
every key of every batch must be a hit of the right length, or the run fails. The result
is one JSON line on stdout: per round the calls/s of each form and their ratio, and the
median ratio.
"""
from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import time

import numpy as np


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rate(call, batches: list, duration: float) -> float:
    """Calls per second of ``call(batch)`` over batches in turn for ``duration`` seconds."""
    n, i = 0, 0
    start = time.perf_counter()
    end = start + duration
    while True:
        call(batches[i])
        n += 1
        i = (i + 1) % len(batches)
        now = time.perf_counter()
        if now >= end:
            return n / (now - start)


def measure(page_size: int = 4096, batch: int = 32, working_set: int = 1024, rounds: int = 3,
            duration: float = 1.0, warmup: float = 0.2, protocol: str = "shm") -> dict:
    """Paired rounds of the copying form, then the outs form; the figures of each round and the median ratio."""
    import peercache
    addr = f"127.0.0.1:{_free_port()}"
    keys = [f"pc/{i}" for i in range(working_set)]
    rng = np.random.default_rng(1)
    batches = [[keys[j] for j in rng.choice(working_set, batch, replace=False)] for _ in range(64)]
    outs = [bytearray(page_size) for _ in range(batch)]
    with peercache.connect(addr, pool_bytes=2 * working_set * (page_size + 4096), page_size=page_size,
                           host_discovery=True, protocol=protocol) as producer, \
            peercache.connect(addr, page_size=page_size, protocol=protocol, dir_cache_ttl=3600) as consumer:
        page = bytes(range(256)) * (page_size // 256) + bytes(page_size % 256)
        for i in range(0, working_set, 256):
            producer.put_batch(keys[i:i + 256], [page] * len(keys[i:i + 256]))

        def copy(b):
            got = consumer.get_batch(b)
            if any(g is None or len(g) != page_size for g in got):
                raise SystemExit(f"getbatch: a key of {b} was not a {page_size}-byte hit: the run is invalid")

        def into(b):
            got = consumer.get_batch(b, outs)
            if any(g != page_size for g in got):
                raise SystemExit(f"getbatch: a key of {b} was not a {page_size}-byte hit: the run is invalid")

        rate(copy, batches, warmup)
        rate(into, batches, warmup)
        per = []
        for _ in range(rounds):
            c = rate(copy, batches, duration)
            o = rate(into, batches, duration)
            per.append({"copy_calls_per_s": round(c, 1), "outs_calls_per_s": round(o, 1),
                        "copy_us": round(1e6 / c, 1), "outs_us": round(1e6 / o, 1), "ratio": round(o / c, 4)})
        if outs[0][:page_size] != page:
            raise SystemExit("getbatch: the outs form's bytes differ from what was put: the run is invalid")
    return {"page_size": page_size, "batch": batch, "protocol": protocol, "rounds": per,
            "ratio_median": statistics.median(r["ratio"] for r in per)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m peercache.bench.getbatch", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--page-size", type=int, default=4096, help="bytes per page [%(default)s]")
    p.add_argument("--batch", type=int, default=32, help="keys per get_batch call [%(default)s]")
    p.add_argument("--working-set", type=int, default=1024, help="pages put, read at random [%(default)s]")
    p.add_argument("--rounds", type=int, default=3, help="paired rounds (copy, then outs) [%(default)s]")
    p.add_argument("--duration", type=float, default=1.0, help="measured seconds per form per round [%(default)s]")
    p.add_argument("--warmup", type=float, default=0.2, help="unmeasured seconds of each form first [%(default)s]")
    p.add_argument("--protocol", default="shm", choices=("shm", "tcp"), help="data transport [%(default)s]")
    a = p.parse_args(argv)
    if a.batch < 1 or a.batch > a.working_set or a.rounds < 1 or a.duration <= 0:
        p.error("--batch must be 1..--working-set, --rounds at least 1, --duration positive")
    res = measure(a.page_size, a.batch, a.working_set, a.rounds, a.duration, a.warmup, a.protocol)
    print(json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
