"""``python -m peercache.bench.churn``: verified GETs while the producer overwrites and evicts.

One producer (this process, which also hosts discovery) keeps rewriting and
evicting random keys of a key space larger than its pool, while reader
processes GET random batches of that key space through cached directory
locations (``--dir-cache-ttl`` > 0, so many of them are stale) and check
every hit byte for byte against the content the producer wrote for that
(key, generation). A hit with one wrong byte is the failure this exists to
catch; misses (evicted keys, stale or torn slots) are expected.

    python -m peercache.bench.churn --protocol tcp --gets 10000000
    python -m peercache.bench.churn --protocol shm --gets 10000000
    python -m peercache.bench.churn --protocol rdma --gets 200000      # devices from
        # --producer-devices / --consumer-devices, else $PEERCACHE_RDMA_PRODUCER / _CONSUMER

It prints one line, e.g.
``churn tcp gets=10000000 hits=... misses=... errors=0 wrong_bytes=0 seconds=...``,
and exits 0 only when every requested GET ran, nothing was wrong, nothing
failed and something was verified. Every loop is bounded by ``--gets`` and
``--max-seconds``.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import sys
import threading
import time

import numpy as np

from .. import tags
from ..config import NodeConfig
from ..errors import PeerCacheError
from ..timeouts import DEFAULT as TIMEOUTS
from ..node import Get, Node
from ..transport import PROTOCOLS
from .processes import die_with_parent, end_all

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX = np.uint64(0xBF58476D1CE4E5B9)


def expected_pages(khashes: np.ndarray, generations: np.ndarray, size: int) -> np.ndarray:
    """(n, size) uint8: what :func:`tags.fill_pattern` writes for each (key hash, generation).

    Vectorised and written independently of :func:`tags.verify_patterns`, so
    the check does not share a bug with the code it checks.
    """
    words = (size + 7) // 8
    with np.errstate(over="ignore"):
        seeds = khashes.astype(np.uint64) ^ (generations.astype(np.uint64) * _MIX)
        vals = seeds[:, None] + np.arange(words, dtype=np.uint64)[None, :] * _GOLDEN
    return vals.view(np.uint8).reshape(len(khashes), words * 8)[:, :size]


def key_names(n: int) -> list[bytes]:
    return [f"churn/{i}".encode() for i in range(n)]


def _devices(text: str | None, env: str) -> list[str]:
    return [d for d in (text if text is not None else os.environ.get(env, "")).split(",") if d]


def node_config(cfg: dict, devices: list[str], **more) -> NodeConfig:
    """The options of a churn node on ``devices`` (rdma): the run's address, protocol and channels, and ``more``."""
    return NodeConfig(discovery_addr=cfg["addr"], protocol=cfg["protocol"], max_channels=cfg["max_channels"],
                      devices=tuple(devices), **more)


# ------------------------------------------------------------------------------ readers
def _reader(conn, cfg: dict, ridx: int, quota: int, deadline: float, parent_pid: int) -> None:
    die_with_parent(parent_pid)
    res = {"gets": 0, "hits": 0, "misses": 0, "errors": 0, "wrong_pages": 0, "wrong_bytes": 0,
           "short_hits": 0, "first_error": None, "first_wrong": None, "cache_hits": 0, "cache_misses": 0,
           "bad_locations": 0, "stale": 0}
    node = None
    try:
        conf = node_config(cfg, cfg["consumer_devices"], dir_cache_ttl=cfg["dir_cache_ttl"],
                           timeout=TIMEOUTS.directory_s)
        node = Node(**conf.node_kwargs(name=f"churn-reader-{ridx}"))
        keys = np.empty(cfg["keys"], dtype=object)
        keys[:] = key_names(cfg["keys"])
        khash = np.fromiter((tags.key_hash(k) for k in keys), np.uint64, len(keys))
        page, batch = cfg["page_size"], cfg["batch_size"]
        dest = np.zeros(batch * page, dtype=np.uint8)
        offsets = np.arange(batch, dtype=np.uint64) * np.uint64(page)
        caps = np.full(batch, page, dtype=np.uint64)
        rng = np.random.default_rng(cfg["seed"] * 1009 + ridx)
        view = dest.reshape(batch, page)
        while res["gets"] < quota and time.time() < deadline:
            n = min(batch, quota - res["gets"])
            idx = rng.integers(0, len(keys), n)
            dest[: n * page] = 0xA5   # a hit must overwrite every byte of its page
            r = node.get_batch_into(keys[idx].tolist(), dest, offsets[:n], caps[:n])
            hit = r.status == Get.HIT
            nh = int(np.count_nonzero(hit))
            ne = int(np.count_nonzero(r.status == Get.ERROR))
            res["gets"] += n
            res["hits"] += nh
            res["errors"] += ne
            res["misses"] += n - nh - ne
            if ne and res["first_error"] is None:
                res["first_error"] = r.error or f"{ne} key(s) failed"
            if nh:
                short = hit & (r.lengths != page)
                res["short_hits"] += int(np.count_nonzero(short))
                want = expected_pages(khash[idx][hit], r.generations[hit], page)
                got = view[:n][hit]
                diff = got != want
                bad = diff.any(axis=1)
                if bad.any():
                    res["wrong_pages"] += int(bad.sum())
                    res["wrong_bytes"] += int(diff.sum())
                    if res["first_wrong"] is None:
                        j = int(np.flatnonzero(bad)[0])
                        res["first_wrong"] = (f"{keys[idx][hit][j]!r} generation {int(r.generations[hit][j])}: "
                                              f"{int(diff[j].sum())} of {page} bytes wrong")
        res["cache_hits"], res["cache_misses"] = node.cache.hits, node.cache.misses
        res["bad_locations"] = node.bad_locations
        res["stale"] = node.stale_locations
    except PeerCacheError as e:
        res["first_error"] = res["first_error"] or str(e)
        res["errors"] += 1
    except Exception as e:  # report it; never leave the parent waiting
        res["first_error"] = res["first_error"] or f"reader {ridx} failed: {type(e).__name__}: {e}"
        res["errors"] += 1
    finally:
        if node is not None:
            node.close()
        conn.send(res)
        conn.close()


# ------------------------------------------------------------------------------ producer
class Producer:
    """Hosts discovery, fills the pool, then rewrites and evicts random keys until stopped."""

    def __init__(self, cfg: dict):
        self.cfg = cfg
        conf = node_config(cfg, cfg["producer_devices"], bind="127.0.0.1", host_discovery=True,
                           page_bytes=cfg["page_size"])
        self.node = Node(**conf.node_kwargs(pool_slots=cfg["slots"], name="churn-producer"))
        self.keys = key_names(cfg["keys"])
        self.puts = 0
        self.batches = 0
        self.error: str | None = None
        self.stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="churn-producer", daemon=True)

    @staticmethod
    def fill(view, ref) -> None:
        tags.fill_pattern(view, ref.key_hash, ref.generation)

    def start(self) -> None:
        for a in range(0, self.cfg["slots"], 256):   # a full pool before the readers start
            self.node.put_batch(self.keys[a: min(a + 256, self.cfg["slots"])], fill=self.fill)
        self._thread.start()

    def _loop(self) -> None:
        rng = np.random.default_rng(self.cfg["seed"])
        pause, batch = self.cfg["put_pause"], self.cfg["put_batch"]
        try:
            while not self.stop.is_set():
                idx = rng.integers(0, len(self.keys), batch)
                self.node.put_batch([self.keys[i] for i in idx], fill=self.fill)
                self.puts += batch
                self.batches += 1
                if pause:
                    self.stop.wait(pause)
        except PeerCacheError as e:
            self.error = str(e)
        except Exception as e:
            self.error = f"producer failed: {type(e).__name__}: {e}"

    def close(self) -> None:
        self.stop.set()
        self._thread.join(timeout=10)
        self.node.close()


# ------------------------------------------------------------------------------ the run
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m peercache.bench.churn", description=__doc__.split("\n\n")[0])
    p.add_argument("--protocol", default="tcp", choices=PROTOCOLS)
    p.add_argument("--gets", type=int, default=10_000_000, help="verified GETs (keys) in all [%(default)s]")
    p.add_argument("--readers", type=int, default=2, help="reader processes [%(default)s]")
    p.add_argument("--page-size", type=int, default=4096, help="bytes per object [%(default)s]")
    p.add_argument("--slots", type=int, default=1024, help="pool slots of the producer [%(default)s]")
    p.add_argument("--keys", type=int, default=1280,
                   help="key space (> --slots, so puts evict) [%(default)s]")
    p.add_argument("--batch-size", type=int, default=256, help="keys per reader batch [%(default)s]")
    p.add_argument("--put-batch", type=int, default=16, help="keys per producer put_batch [%(default)s]")
    p.add_argument("--put-pause", type=float, default=0.002,
                   help="seconds the producer sleeps between batches (0 = as fast as it can) [%(default)s]")
    p.add_argument("--dir-cache-ttl", type=float, default=5.0,
                   help="seconds readers reuse a looked-up location (> 0: stale locations) [%(default)s]")
    p.add_argument("--max-channels", type=int, default=2, help="data channels per peer [%(default)s]")
    p.add_argument("--max-seconds", type=float, default=1800.0,
                   help="stop (and fail) after this long even if --gets were not done [%(default)s]")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--discovery-addr", default=None, help="HOST:PORT [127.0.0.1 and a free port]")
    p.add_argument("--producer-devices", default=None, help="rdma devices of the producer "
                   "[$PEERCACHE_RDMA_PRODUCER]")
    p.add_argument("--consumer-devices", default=None, help="rdma devices of the readers "
                   "[$PEERCACHE_RDMA_CONSUMER]")
    return p


def _free_addr() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def validate(args) -> None:
    """Exit 2 (argparse) on values that cannot make a churn run."""
    bad = []
    for name in ("gets", "readers", "page_size", "slots", "keys", "batch_size", "put_batch", "max_channels"):
        if getattr(args, name) <= 0:
            bad.append(f"--{name.replace('_', '-')} must be positive")
    if not args.keys > args.slots:
        bad.append(f"--keys {args.keys} must exceed --slots {args.slots}, or nothing is evicted")
    if not args.dir_cache_ttl > 0 or args.dir_cache_ttl == float("inf"):
        bad.append("--dir-cache-ttl must be a finite number > 0 (the point is reading cached locations)")
    if not 0 < args.max_seconds < float("inf"):
        bad.append("--max-seconds must be a finite number > 0")
    if not 0 <= args.put_pause < 60:
        bad.append("--put-pause must be in [0, 60) seconds")
    if args.readers > 64:
        bad.append("--readers must be <= 64")
    if args.slots * tags.slot_stride(max(1, args.page_size)) > 8 << 30:
        bad.append("--slots x --page-size is more than 8 GiB")
    if bad:
        build_parser().error("; ".join(bad))


def run(args) -> tuple[int, str]:
    """One churn run; returns (exit status, the result line)."""
    cfg = {"addr": args.discovery_addr or _free_addr(), "protocol": args.protocol, "page_size": args.page_size,
           "slots": args.slots, "keys": args.keys, "batch_size": args.batch_size, "put_batch": args.put_batch,
           "put_pause": args.put_pause, "dir_cache_ttl": args.dir_cache_ttl, "max_channels": args.max_channels,
           "seed": args.seed,
           "producer_devices": _devices(args.producer_devices, "PEERCACHE_RDMA_PRODUCER"),
           "consumer_devices": _devices(args.consumer_devices, "PEERCACHE_RDMA_CONSUMER")}
    t_start = time.time()
    deadline = t_start + args.max_seconds
    prod = Producer(cfg)
    ctx = mp.get_context("spawn")
    procs, conns = [], []
    results: list[dict] = []
    try:
        prod.start()
        t0 = time.monotonic()
        share = [args.gets // args.readers + (1 if i < args.gets % args.readers else 0)
                 for i in range(args.readers)]
        for i in range(args.readers):
            parent, child = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_reader, args=(child, cfg, i, share[i], deadline, os.getpid()), daemon=True)
            p.start()
            child.close()
            procs.append(p), conns.append(parent)
        for i, c in enumerate(conns):
            left = max(0.0, deadline - time.time()) + 60
            try:
                if c.poll(left):
                    results.append(c.recv())
                    continue
                why = f"reader {i} did not report within {left:.0f} s"
            except (EOFError, OSError):
                procs[i].join(timeout=1)
                why = f"reader {i} exited without a result (exit status {procs[i].exitcode})"
            results.append({"gets": 0, "hits": 0, "misses": 0, "errors": 1, "wrong_pages": 0,
                            "wrong_bytes": 0, "short_hits": 0, "first_error": why, "first_wrong": None})
        seconds = time.monotonic() - t0
    finally:
        prod.close()
        end_all(procs, 5.0, terminate=False)
    tot = {k: sum(r.get(k, 0) for r in results)
           for k in ("gets", "hits", "misses", "errors", "wrong_pages", "wrong_bytes", "short_hits",
                     "cache_hits", "cache_misses", "bad_locations", "stale")}
    problems = [m for m in ([r.get("first_wrong") for r in results] + [r.get("first_error") for r in results]
                            + [prod.error]) if m]
    if tot["gets"] < args.gets:
        problems.append(f"only {tot['gets']} of {args.gets} GETs ran within --max-seconds {args.max_seconds:g}")
    if tot["hits"] == 0:
        problems.append("no GET hit: nothing was verified")
    ok = not problems and tot["wrong_bytes"] == 0 and tot["errors"] == 0 and tot["short_hits"] == 0
    line = (f"churn {args.protocol} gets={tot['gets']} hits={tot['hits']} misses={tot['misses']} "
            f"errors={tot['errors']} wrong_bytes={tot['wrong_bytes']} wrong_pages={tot['wrong_pages']} "
            f"seconds={seconds:.1f} gets_per_s={tot['gets'] / max(seconds, 1e-9):.0f} puts={prod.puts} "
            f"dir_cache_hits={tot['cache_hits']} stale_locations={tot['stale']} page_size={args.page_size} slots={args.slots} keys={args.keys} "
            f"ttl={args.dir_cache_ttl:g} readers={args.readers} status={'ok' if ok else 'FAILED'}")
    if problems:
        line += "\nchurn: " + "\nchurn: ".join(problems[:5])
    return (0 if ok else 1), line


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    validate(args)
    try:
        rc, line = run(args)
    except PeerCacheError as e:
        print(f"churn {args.protocol}: FAILED: {e}", file=sys.stderr)
        return 1
    print(line, flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
