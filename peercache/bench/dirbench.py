"""Directory throughput: batched lookups per second against the embedded directory or Redis.

::

    python -m peercache.bench.dirbench --directory 127.0.0.1:31990 --batch 128 --keys 16384 \\
        --clients 1 --duration 3
    python -m peercache.bench.dirbench --directory redis://127.0.0.1:6379/0 --batch 128 ...

This process is the producer: a registered node with a pool of ``--keys``
small slots that publishes every key through the directory, as ``serve``
does (``HOST:PORT``: it hosts the embedded directory there itself, as the
node named by ``--discovery-addr`` does; ``redis://``/``rediss://``: the
Redis backend). Then ``--clients`` client *processes* (not threads: one
Python process is GIL-bound, and the directory is what is measured) each
look up random batches of ``--batch`` published keys, one batch in flight
per client, back to back, over one shared measurement window
``[t0 + warmup, t0 + warmup + duration]``. A client counts only the batches
that finish inside the window; every key must be found (a miss fails the
run: it would measure something else). Clients ask through the engine's
directory client (:func:`peercache.directory.client.connect_directory`) as a
consumer node does (``--path node``: through a consumer ``Node``'s own
resolution, the embedded directory's one-sided table first, as a read resolves
its keys); after the window the producer looks every published
key up once more through its own uncached ``Node.lookup`` and checks each
location against the key (its key hash and the producer's node id).

Progress goes to stderr; the result is one JSON line on stdout (and in
``--out``): keys/s, batches/s, p50/p99/p99.9 batch latency in µs, with the
run's meta block.
"""
from __future__ import annotations

import argparse
import ctypes
import multiprocessing as mp
import os
import signal
import sys
import time
from importlib import metadata

import numpy as np

from .. import checks, tags
from ..config import NodeConfig
from ..directory.client import connect_directory
from ..directory.redis.url import FORMS, is_redis
from ..errors import ConfigError, PeerCacheError
from ..node import Node
from ..redact import redact
from ..transport.base import ABSENT
from . import meta, options
from .processes import end_all, recv   # a worker's reply, bounded in time; its death an error
from .serve import fill_page

#: Bytes per published slot: the directory does not care what a slot holds.
SLOT_BYTES = 64
#: Keys per publish call (as serve publishes).
PUBLISH_BATCH = 512
#: Random batches each client draws up front and cycles through (per-batch Python work stays out).
DRAWN_BATCHES = 256
#: How long after its window a client may take to report before it counts as lost.
GRACE_S = 20.0
#: Key counts above which a client draws its batches without permuting every key (10^7 keys)
LARGE_DRAW = 1 << 20
#: Upper bound on one client's batches in one window (the loop also ends with the window).
MAX_BATCHES = 50_000_000
SCHEMA_VERSION = 1
TOOL = "peercache-dirbench"


def backend_of(spec: str) -> str:
    """``redis`` for Redis URLs (:func:`~peercache.directory.is_redis`), ``embedded`` for HOST:PORT; else
    a ConfigError."""
    if is_redis(spec):
        return "redis"
    if "://" in spec:
        raise ConfigError(f"--directory {redact(spec)!r}: unknown scheme; give HOST:PORT (the embedded directory) "
                          f"or {FORMS} (Redis)")
    options.check_addr(spec, "--directory")
    return "embedded"


# --- the directory seen from a producer and from a client ---------------------

class Producer:
    """A registered node that published the bench keys (hosting the embedded directory when asked)."""

    def __init__(self, spec: str, keys: list[bytes], heartbeat_timeout: float = 5.0, *, host: bool = True,
                 max_seconds: float | None = None):
        """``host`` (embedded only): this node hosts the directory at ``spec`` (False: another process
        does, e.g. one whose memory is measured alone); ``max_seconds``: a bound on publishing (a
        PeerCacheError saying how far it got when passed)."""
        self.spec, self.backend = spec, backend_of(spec)
        # Embedded: this node hosts the directory at HOST:PORT, as serve's node does; Redis: it talks to it.
        conf = NodeConfig(discovery_addr=spec, directory=spec, protocol="tcp",
                          host_discovery=self.backend == "embedded" and host, page_bytes=SLOT_BYTES,
                          heartbeat_timeout=heartbeat_timeout)
        self.node = Node(**conf.node_kwargs(pool_slots=len(keys), name="dirbench"))
        try:
            t0 = time.monotonic()
            for i in range(0, len(keys), PUBLISH_BATCH):
                self.node.put_batch(keys[i:i + PUBLISH_BATCH], fill=fill_page)
                if max_seconds is not None and time.monotonic() - t0 > max_seconds:
                    raise PeerCacheError(f"publishing {len(keys)} keys passed its bound of {max_seconds:g} s "
                                         f"after {min(len(keys), i + PUBLISH_BATCH)} keys")
            self.publish_s = time.monotonic() - t0
        except BaseException:
            self.node.close()
            raise

    @property
    def node_id(self) -> str:
        return self.node.node_id

    def verify(self, keys: list[bytes], batch: int) -> list[str]:
        """Every published key looked up once more through the node's own (uncached) lookup, and checked."""
        bad: list[str] = []
        for i in range(0, len(keys), batch):
            part = keys[i:i + batch]
            bad += check_locations(part, self.node.lookup(part, use_cache=False), self.node_id)
        return bad

    def close(self) -> None:
        self.node.close()


class LookupClient:
    """One client's batched lookups through the engine's directory client: one round trip per batch, no cache.

    It asks as a consumer node does (fixed binary records where the backend has them, and the
    epoch of the node infos it already holds, so they are not resent with every reply).
    """

    def __init__(self, spec: str, timeout: float = 3.0):
        self.spec, self.backend = spec, backend_of(spec)
        self._dir = connect_directory(spec, timeout=timeout)
        self.epoch: int | None = None

    def lookup(self, keys: list[bytes]) -> int:
        """Look ``keys`` up (one round trip); returns how many were not found."""
        res = self._dir.lookup(keys, recs=True, epoch=self.epoch)
        self.epoch = res.epoch
        if res.records:
            missing = res.missing or b""
            return len(missing) // 4 if isinstance(missing, (bytes, bytearray)) else len(missing)
        return sum(loc is None for loc in res.locs)

    def close(self) -> None:
        self._dir.close()


class NodeLookupClient:
    """``--path node``: one client's batched lookups the way a consumer Node resolves keys before a
    read (:meth:`peercache.node.Node.lookup_rows`, no cache): one one-sided read of the embedded
    directory's table, the lookup RPC only for what the table cannot answer."""

    def __init__(self, spec: str, timeout: float = 3.0):
        self.spec, self.backend = spec, backend_of(spec)
        conf = NodeConfig(discovery_addr=spec, directory=spec, protocol="tcp", dir_cache_ttl=0.0, timeout=timeout)
        self.node = Node(**conf.node_kwargs(name="dirbench-client"))

    def lookup(self, keys: list[bytes]) -> int:
        """Resolve ``keys``; returns how many were not found."""
        return int((self.node.lookup_rows(keys)["node"] == ABSENT).sum())

    def close(self) -> None:
        self.node.close()


CLIENTS = {"rpc": LookupClient, "node": NodeLookupClient}


# --- client processes -----------------------------------------------------------

def _die_with_parent(parent_pid: int) -> None:
    # The kernel ends this client when dirbench dies, even by SIGKILL (Linux; elsewhere the pipe's EOF does).
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:
        os._exit(1)


def draw_batches(n_keys: int, batch: int, count: int, seed: int) -> np.ndarray:
    """``count`` batches of ``batch`` distinct key indices in [0, n_keys), reproducible from ``seed``."""
    rng = np.random.default_rng(seed)
    if n_keys > LARGE_DRAW:
        # rng.choice(replace=False) permutes all n_keys each time: draw with replacement and redraw
        # the few duplicates instead (the same distinct uniform batches, in O(batch) each)
        out = np.empty((count, batch), np.int64)
        for j in range(count):
            b = np.unique(rng.integers(0, n_keys, batch))
            while len(b) < batch:
                b = np.unique(np.concatenate([b, rng.integers(0, n_keys, batch - len(b))]))
            out[j] = rng.permutation(b)
        return out
    return np.stack([rng.choice(n_keys, batch, replace=False) for _ in range(count)])


def check_locations(keys: list[bytes], locs: list, node_id: str) -> list[str]:
    """Why each location is wrong for its key (absent, other node, wrong key hash); [] when all are right."""
    bad = []
    for k, loc in zip(keys, locs):
        if loc is None:
            bad.append(f"{k!r}: not found")
        elif loc[0] != node_id:
            bad.append(f"{k!r}: published by node {loc[0]!r}, not the producer {node_id!r}")
        elif int(loc[7]) != tags.key_hash(k):
            bad.append(f"{k!r}: key hash {int(loc[7]):#x} is not the key's {tags.key_hash(k):#x}")
    return bad


def keys_at(indices) -> list[bytes]:
    """The bench keys at ``indices`` of ``options.page_keys(n, "mla")`` (any n above them), without
    building the whole list (a client of 10^7 published keys needs only the ones it draws)."""
    (sfx,) = options.LAYOUTS["mla"]
    return [f"{options.KEY_ROOT}{int(i)}{sfx}".encode() for i in indices]


def client_loop(cfg: dict, idx: int, t0: float) -> dict:
    """One client: lookups back to back until the window ends (counting the keys not found)."""
    drawn = [keys_at(b) for b in draw_batches(cfg["keys"], cfg["batch"], DRAWN_BATCHES,
                                              cfg["seed"] * 7919 + idx)]
    win_start, win_end = t0 + cfg["warmup"], t0 + cfg["warmup"] + cfg["duration"]
    cli = CLIENTS[cfg.get("path", "rpc")](cfg["directory"])
    lat: list[float] = []
    batches = misses = 0
    try:
        while time.time() < t0:
            time.sleep(min(0.01, max(0.0, t0 - time.time())))
        i = 0
        while i < MAX_BATCHES:
            b = drawn[i % DRAWN_BATCHES]
            i += 1
            t_s = time.perf_counter()
            missed = cli.lookup(b)
            dt = time.perf_counter() - t_s
            done = time.time()
            if done > win_end:
                break
            if done >= win_start:
                batches += 1
                lat.append(dt)
                misses += missed
    finally:
        cli.close()
    return {"batches": batches, "keys": batches * cfg["batch"], "misses": misses, "latencies": lat}


def _client_main(conn, cfg: dict, idx: int, parent_pid: int) -> None:
    _die_with_parent(parent_pid)
    try:
        CLIENTS[cfg.get("path", "rpc")](cfg["directory"]).close()   # fail fast on a spec this client cannot use
        conn.send(("ready", None))
        if not conn.poll(cfg["ready_timeout"] + 30):
            return
        msg = conn.recv()
        if msg[0] == "go":
            conn.send(("result", client_loop(cfg, idx, msg[1])))
    except PeerCacheError as e:
        conn.send(("error", f"client {idx}: {e}"))
    except Exception as e:  # report, never hang the parent
        conn.send(("error", f"client {idx} failed: {type(e).__name__}: {e}"))


# --- the run ----------------------------------------------------------------------

def percentiles_us(lat: list[float]) -> dict[str, float | None]:
    """p50 / p99 / p99.9 of latencies given in seconds, in µs."""
    if not lat:
        return {"p50": None, "p99": None, "p999": None}
    p = np.percentile(np.asarray(lat) * 1e6, [50, 99, 99.9])
    return {"p50": round(float(p[0]), 1), "p99": round(float(p[1]), 1), "p999": round(float(p[2]), 1)}


def summarise(results: list[dict], cfg: dict) -> dict:
    """The run's figures from every client's counts over the one shared window."""
    dur = cfg["duration"]
    batches = sum(r["batches"] for r in results)
    lat = [x for r in results for x in r["latencies"]]
    keys = sum(r["keys"] for r in results)
    return {"keys_per_s": round(keys / dur, 1), "batches_per_s": round(batches / dur, 1),
            "latency_us": percentiles_us(lat), "batches": batches, "keys": keys,
            "misses": sum(r["misses"] for r in results),
            "per_client_batches": [r["batches"] for r in results]}


def client_versions(spec: str) -> dict[str, str | None]:
    """Versions of the Redis client libraries when the directory is Redis (none for the embedded one)."""
    if backend_of(spec) != "redis":
        return {}
    out: dict[str, str | None] = {}
    for name in ("redis", "hiredis"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def validate(a) -> None:
    """Refuse options that cannot make a measurement, saying which and what to give."""
    backend_of(a.directory)
    for name in ("batch", "keys", "clients"):
        if getattr(a, name) < 1:
            raise ConfigError(f"--{name} must be >= 1, got {getattr(a, name)}")
    if a.batch > a.keys:
        raise ConfigError(f"--batch {a.batch} is larger than --keys {a.keys}; publish at least one batch of keys")
    if a.clients > 64:
        raise ConfigError(f"--clients {a.clients}: at most 64 client processes")
    if not 0 < a.duration <= 600 or not 0 <= a.warmup <= 60:
        raise ConfigError(f"--duration must be in (0, 600] and --warmup in [0, 60] seconds, "
                          f"got {a.duration} and {a.warmup}")
    checks.seconds("--ready-timeout", a.ready_timeout, positive=True)
    checks.integer("--seed", a.seed, minimum=0, maximum=(1 << 63) - 1)
    if getattr(a, "out", None) is not None:
        checks.writable_file("--out", a.out)


def run(a, say=lambda msg: None) -> dict:
    """Publish, then measure with the client processes; the result document (status ok or failed)."""
    validate(a)
    cfg = {"directory": a.directory, "batch": a.batch, "keys": a.keys, "clients": a.clients,
           "duration": a.duration, "warmup": a.warmup, "seed": a.seed, "ready_timeout": a.ready_timeout,
           "path": getattr(a, "path", "rpc")}
    doc = {"schema_version": SCHEMA_VERSION, "tool": TOOL, "status": "ok", "error": None,
           "meta": {**meta.host_block(), "command": meta.command_line(), "start": meta.now_iso(), "end": None,
                    "directory": redact(a.directory), "backend": backend_of(a.directory), "batch": a.batch,
                    "keys": a.keys, "clients": a.clients, "path": cfg["path"],
                    "client_model": "one process per client, one batch "
                    "in flight each", "duration": a.duration, "warmup": a.warmup, "seed": a.seed,
                    "versions": {**meta.versions(), **client_versions(a.directory)},
                    "git_revision": meta.git_revision()},
           "result": None}
    keys = options.page_keys(a.keys, "mla")
    producer = None
    try:
        producer = Producer(a.directory, keys)
        cfg["node_id"] = producer.node_id
        doc["meta"].update(publish_s=round(producer.publish_s, 3), producer_node=producer.node_id)
        say(f"dirbench: published {len(keys)} keys to the {producer.backend} directory at "
            f"{redact(a.directory)} in {producer.publish_s:.2f} s")
        res = measure(cfg, say)
        bad = producer.verify(keys, a.batch)   # after the window: every published key, checked
        res.update(verified_keys=len(keys), verify_failures=len(bad))
        doc["result"] = res
        if res["batches"] == 0:
            doc["status"], doc["error"] = "failed", (
                f"no lookup batch finished inside the {a.duration:g} s window; lengthen --duration")
        elif res["misses"] or bad:
            doc["status"], doc["error"] = "failed", (
                f"{res['misses']} of {res['keys']} keys looked up in the window were not found and "
                f"{len(bad)} of {len(keys)} published keys had a wrong or no location afterwards"
                + (f" (e.g. {bad[0]})" if bad else "") + "; the directory lost or changed published keys")
        say(f"dirbench: {res['keys_per_s']:.0f} keys/s ({res['batches_per_s']:.0f} batches/s), "
            f"p50 {res['latency_us']['p50']} us, p99 {res['latency_us']['p99']} us, status {doc['status']}")
    except PeerCacheError as e:
        doc["status"], doc["error"] = "failed", str(e)
    finally:
        if producer is not None:
            producer.close()
    doc["meta"]["end"] = meta.now_iso()
    return doc


def measure(cfg: dict, say=lambda msg: None) -> dict:
    """The lookup window over keys already published (``cfg``: directory, batch, keys, clients, duration,
    warmup, seed, ready_timeout, path): ``clients`` client processes, one shared window; the summary
    (:func:`summarise`) with the window's bounds. A PeerCacheError when a client fails or is lost."""
    ctx = mp.get_context("spawn")
    procs, conns = [], []
    try:
        for i in range(cfg["clients"]):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_client_main, args=(child, cfg, i, os.getpid()), daemon=True)
            p.start()
            child.close()
            procs.append(p), conns.append(parent)
        for i, c in enumerate(conns):
            msg = recv(c, cfg["ready_timeout"], f"client {i} did not get ready")
            if msg[0] == "error":
                raise PeerCacheError(msg[1])
        t0 = time.time() + 0.3
        for c in conns:
            c.send(("go", t0))
        say(f"dirbench: {cfg['clients']} client(s), batch {cfg['batch']}: {cfg['warmup']:g} s warm-up, then "
            f"{cfg['duration']:g} s measured")
        res = summarise(_collect(conns, t0, cfg["warmup"], cfg["duration"], say), cfg)
        res.update(window_start=round(t0 + cfg["warmup"], 6), window_end=round(t0 + cfg["warmup"] + cfg["duration"], 6))
        return res
    finally:
        end_all(procs, 5.0, terminate=False, last=5.0)
        for c in conns:
            c.close()


def _collect(conns, t0: float, warmup: float, duration: float, say) -> list[dict]:
    """Every client's result, with a progress line a second until the window ends (bounded by GRACE_S)."""
    end = t0 + warmup + duration
    results: list = [None] * len(conns)
    last = 0.0
    while any(r is None for r in results):
        now = time.time()
        if now > end + GRACE_S:
            lost = [i for i, r in enumerate(results) if r is None]
            raise PeerCacheError(f"client(s) {lost} did not report their window within {GRACE_S:.0f} s after it")
        if now - last >= 1.0 and now < end:
            last = now
            phase = "warm-up" if now < t0 + warmup else "measure"
            say(f"dirbench: {max(0.0, now - t0):4.1f}/{warmup + duration:g} s {phase}")
        for i, c in enumerate(conns):
            if results[i] is None and c.poll(0.05):
                try:
                    msg = c.recv()
                except EOFError:
                    raise PeerCacheError(f"client {i} exited before reporting its window") from None
                if msg[0] == "error":
                    raise PeerCacheError(msg[1])
                results[i] = msg[1]
    return results



def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m peercache.bench.dirbench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--directory", default=options.DEFAULT_DISCOVERY,
                   help="HOST:PORT (host the embedded directory there) or redis://HOST:PORT/DB [%(default)s]")
    p.add_argument("--batch", type=int, default=128, help="keys per lookup [%(default)s]")
    p.add_argument("--keys", type=int, default=16384, help="keys published [%(default)s]")
    p.add_argument("--clients", type=int, default=1, help="client processes, one batch in flight each [%(default)s]")
    p.add_argument("--duration", type=float, default=3.0, help="measured seconds [%(default)s]")
    p.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds first [%(default)s]")
    p.add_argument("--seed", type=int, default=1, help="seed of the random batches [%(default)s]")
    p.add_argument("--path", default="rpc", choices=sorted(CLIENTS),
                   help="rpc: the directory's lookup op itself; node: as a consumer node resolves keys "
                        "(the embedded directory's one-sided table first, the lookup op for the rest) [%(default)s]")
    p.add_argument("--ready-timeout", type=float, default=60.0,
                   help="seconds a client may take to start [%(default)s]")
    p.add_argument("--out", default=None, help="also write the JSON result here")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    return p


def main(argv=None) -> int:
    return meta.one_document_main("dirbench", build_parser().parse_args(argv), run, indent=None)


if __name__ == "__main__":
    sys.exit(main())
