"""How PeerCache's costs grow: one curve of a cost against keys, members, pool size or batch size,
with a power law fitted to it.

::

    python -m peercache.bench.growth --curve directory --sizes 10000,100000,1000000,10000000 --out dir.json
    python -m peercache.bench.growth --curve directory --directory redis://127.0.0.1:6379/0 --redis-flush ...
    python -m peercache.bench.growth --curve members --sizes 2,4,8,16,32,64 --out members.json
    python -m peercache.bench.growth --curve register --protocol tcp --sizes 64M,256M,1G,2G --out reg.json
    python -m peercache.bench.growth --curve get_cpu --sizes 1,4,16,64,256 --page-size 131072 --out get.json

Curves (x, what each x measures):

``directory`` (keys published)
    A fresh directory per size. ``--directory embedded`` (the default): a process of its own hosts the
    embedded directory (a Node with ``host_discovery`` and a one-slot pool, ``--dir-table-entries``),
    so its RSS growth is the directory's alone (the dict of packed records, the per-node key sets and
    the table pages written); ``redis://``: ``INFO memory`` used_memory before and after (the database
    is emptied before each size: ``--redis-flush`` allows that). A producer node
    (:class:`peercache.bench.dirbench.Producer`, 64-byte slots) publishes the keys in batches as serve
    does (``publish_keys_per_s``), then dirbench's client processes look random batches up over one
    window (:func:`peercache.bench.dirbench.measure`; ``lookup_keys_per_s``), and a sample of keys is
    checked afterwards. ``dir_bytes_per_key`` = memory growth / keys.
``members`` (members)
    One process hosts the embedded directory; lightweight members (each a real Node with its own id,
    heartbeat thread and 16-slot tcp pool, ``--member-procs`` processes holding them round-robin, as 64
    processes do not fit two cores) join until there are N. At each N: the time from a join's start
    until another client's ``members`` call lists it (``join_seen_ms``), then over ``--window``
    seconds the host's CPU seconds per second (``heartbeat_cpu_cores``) and the heartbeat requests it
    served per second (``heartbeat_msgs_per_s``, counted at its RPC handlers), then the latency of a
    ``members`` call (``members_call_ms``, median of 20).
``register`` (pool bytes)
    What registering a pool costs on ``--protocol`` tcp or shm: the pool's memfd, its mapping and
    slot bookkeeping, exposing it and starting the data server (``register_s``, median of
    ``--repeats``), and a whole Node's start with that pool (``node_start_s``). On rdma this step is
    ibv_reg_mr (it pins every page): not measured here.
``get_cpu`` (keys per GET batch)
    A producer process hosts the directory and a pool of ``--page-size`` pages; this process is the
    consumer: ``Node.get_batch_into`` of random distinct batches back to back over ``--window``
    seconds; its CPU time (every thread, ``time.process_time``) over the window / pages read =
    ``get_cpu_us_per_page``; ``get_pages_per_s`` beside it.

Every loop is bounded in count and time: each size has ``--size-seconds`` (publishing, joining), the
whole run ``--max-seconds``; a size that does not fit (its bound, the memory it would need) is
``not_measured`` with the reason, and so are the larger ones after it. Each fitted cost is a *total*
(the bytes of the whole directory, the seconds to publish or look up every key once, the CPU of one
batch), so ``b`` > 1.1 means it grows faster than linearly (:mod:`peercache.bench.fit`).

Progress goes to stderr; the result is one JSON document on stdout (and in ``--out``) with the run's
meta block.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import statistics
import sys
import threading
import time
from collections import Counter
from typing import Any, Callable

import numpy as np

from .. import checks
from ..config import NodeConfig
from ..directory.client import connect_directory
from ..directory.redis.url import SENTINEL_SCHEME
from ..errors import ConfigError, PeerCacheError
from ..node import Node
from ..pool import Pool
from ..redact import redact
from ..transport import make_transport
from . import dirbench, meta, options
from .fit import power_fit
from .processes import die_with_parent, end_all, recv
from .serve import fill_page

SCHEMA_VERSION = 1
TOOL = "peercache-growth"
CURVES = ("directory", "members", "register", "get_cpu")
#: x's unit per curve
X_UNIT = {"directory": "keys", "members": "members", "register": "B", "get_cpu": "keys/batch"}
DEFAULT_SIZES = {"directory": "10000,100000,1000000,10000000", "members": "2,4,8,16,32,64",
                 "register": "64M,256M,1G,2G", "get_cpu": "1,4,16,64,256"}
#: metric -> unit of the figures each curve yields
METRICS = {
    "directory": {"dir_bytes_per_key": "B", "publish_keys_per_s": "ops/s", "lookup_keys_per_s": "ops/s"},
    "members": {"heartbeat_cpu_cores": "ratio", "heartbeat_msgs_per_s": "msg/s", "join_seen_ms": "ms",
                "members_call_ms": "ms"},
    "register": {"register_s": "s", "node_start_s": "s"},
    "get_cpu": {"get_cpu_us_per_page": "us", "get_pages_per_s": "pages/s"},
}
#: metric -> (the total cost fitted, its unit, cost from (x, value)); metrics not here are not fitted
COSTS: dict[str, tuple[str, str, Callable[[float, float], float]]] = {
    "dir_bytes_per_key": ("dir_bytes", "B", lambda x, v: v * x),
    "publish_keys_per_s": ("publish_all_s", "s", lambda x, v: x / v),
    "lookup_keys_per_s": ("lookup_all_s", "s", lambda x, v: x / v),
    "heartbeat_cpu_cores": ("heartbeat_cpu_cores", "ratio", lambda x, v: v),
    "heartbeat_msgs_per_s": ("heartbeat_msgs_per_s", "msg/s", lambda x, v: v),
    "join_seen_ms": ("join_seen_ms", "ms", lambda x, v: v),
    "members_call_ms": ("members_call_ms", "ms", lambda x, v: v),
    "register_s": ("register_s", "s", lambda x, v: v),
    "node_start_s": ("node_start_s", "s", lambda x, v: v),
    "get_cpu_us_per_page": ("get_cpu_us_per_batch", "us", lambda x, v: v * x),
}
#: Rough bytes per key a directory size needs on this host (producer node + directory), for refusing
#: a size that cannot fit in the memory available (measured here: about 2/3 of these)
NEED_PER_KEY = {"embedded": 1400, "redis": 1200}
#: keys whose locations are checked after each directory size
VERIFY_SAMPLE = 4096
#: slots (and keys published) of each lightweight member
MEMBER_SLOTS = 16
MEMBERS_CALLS = 20


# --- small helpers -------------------------------------------------------------------

def parse_sizes(text: str) -> list[int]:
    """``"64M,1G"`` / ``"1e4,100000"`` -> ints (K/M/G: binary multiples), ascending and distinct."""
    out = []
    for part in str(text).split(","):
        t = part.strip()
        if not t:
            continue
        mult = 1
        if t[-1] in "KMGkmg":
            mult, t = 1 << (10 * ("KMG".index(t[-1].upper()) + 1)), t[:-1]
        try:
            v = float(t) * mult
        except ValueError:
            raise ConfigError(f"--sizes: {part!r} is not a number (e.g. 10000, 1e6, 64M, 2G)") from None
        if v < 1 or v != int(v):
            raise ConfigError(f"--sizes: {part!r} must be a positive whole number")
        out.append(int(v))
    if not out:
        raise ConfigError("--sizes: give at least one size")
    return sorted(set(out))


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_bytes(pid: int | str = "self") -> int:
    """Resident set of ``pid`` in bytes (VmRSS: anonymous, file and shared memory pages)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise PeerCacheError(f"no VmRSS in /proc/{pid}/status")


def mem_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def fits(points: list[dict], curve: str) -> list[dict]:
    """A power-law fit of each cost (:data:`COSTS`) over the points measured (two at least)."""
    out = []
    for metric in METRICS[curve]:
        if metric not in COSTS:
            continue
        cost, unit, of = COSTS[metric]
        xy = [(p["x"], of(p["x"], p["metrics"][metric])) for p in points
              if p["status"] == "ok" and p["metrics"].get(metric) and p["metrics"][metric] > 0]
        if len(xy) < 2:
            continue
        f = power_fit([x for x, _ in xy], [y for _, y in xy])
        out.append({"metric": metric, "cost": cost, "cost_unit": unit, **f.as_dict(),
                    "xs": [x for x, _ in xy], "costs": [y for _, y in xy]})
    return out


class Child:
    """A spawned helper process driven over a pipe (a reply per command, each bounded in time)."""

    def __init__(self, target, *args, ready_timeout: float = 120.0, what: str = "helper"):
        ctx = mp.get_context("spawn")
        self.what = what
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=target, args=(child, os.getpid(), *args), daemon=True)
        self.proc.start()
        child.close()
        self.ready = self._reply(recv(self.conn, ready_timeout, f"{what} did not start"))

    def _reply(self, msg):
        if msg[0] == "error":
            raise PeerCacheError(f"{self.what}: {msg[1]}")
        return msg[1]

    def ask(self, *msg, timeout: float = 60.0):
        self.conn.send(msg)
        return self._reply(recv(self.conn, timeout, f"{self.what} did not answer {msg[0]!r}"))

    def close(self, grace: float = 20.0) -> None:
        try:
            self.conn.send(("stop",))
        except (OSError, BrokenPipeError):
            pass
        end_all([self.proc], grace)
        self.conn.close()


def _serve_commands(conn, handlers: dict) -> None:
    """Answer commands until ``stop`` (or the parent goes away)."""
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg[0] == "stop":
            return
        try:
            conn.send(("ok", handlers[msg[0]](*msg[1:])))
        except Exception as e:  # report, never hang the parent
            conn.send(("error", f"{msg[0]} failed: {type(e).__name__}: {e}"))


def _child(fn, name: str):
    """Run ``fn(conn, *args)`` in a child: started with the parent's death, errors sent back."""
    def main(conn, parent_pid, *args):
        die_with_parent(parent_pid)
        try:
            fn(conn, *args)
        except Exception as e:
            try:
                conn.send(("error", f"{type(e).__name__}: {e}"))
            except OSError:
                pass
    main.__name__ = main.__qualname__ = name   # spawn finds it by this module attribute
    return main


# --- child processes (module-level so that spawn can import them) ----------------------

def _host_node(spec: str, table_entries: int, heartbeat_timeout: float, name: str, **kw) -> Node:
    conf = NodeConfig(discovery_addr=spec, directory=spec, protocol="tcp", host_discovery=True,
                      page_bytes=64, heartbeat_timeout=heartbeat_timeout, dir_table_entries=table_entries, **kw)
    return Node(**conf.node_kwargs(pool_slots=1, name=name))


def _dir_host(conn, spec: str, table_entries: int, heartbeat_timeout: float) -> None:
    """Host the embedded directory alone; answer ``stats`` (its RSS, entries, table keys and spills)."""
    node = _host_node(spec, table_entries, heartbeat_timeout, "growth-dirhost")
    try:
        d = node.hosted_directory.directory

        def stats():
            return {"rss": rss_bytes(), "entries": len(d), "table_keys": len(d.table) if d.table else 0,
                    "table_spilled": d.table.spilled if d.table else 0,
                    "table_bytes": d.table.size if d.table else 0}
        conn.send(("ready", {"pid": os.getpid(), **stats()}))
        _serve_commands(conn, {"stats": stats})
    finally:
        node.close()


def _members_host(conn, spec: str, heartbeat_interval: float, heartbeat_timeout: float) -> None:
    """Host the embedded directory for the members curve, counting the requests each op served."""
    node = _host_node(spec, 0, heartbeat_timeout, "growth-memberhost", heartbeat_interval=heartbeat_interval)
    counts: Counter = Counter()
    lock = threading.Lock()
    try:
        hs = node.directory_server.handlers

        def counted(op, fn):
            def wrapped(*args, **kw):
                with lock:
                    counts[op] += 1
                return fn(*args, **kw)
            return wrapped
        for op in list(hs):
            hs[op] = counted(op, hs[op])

        def stats():
            with lock:
                c = dict(counts)
            return {"cpu_s": time.process_time(), "wall": time.monotonic(), "ops": c}
        conn.send(("ready", {"pid": os.getpid()}))
        _serve_commands(conn, {"stats": stats})
    finally:
        node.close()


def _members_worker(conn, spec: str, heartbeat_interval: float, heartbeat_timeout: float) -> None:
    """Hold lightweight member nodes: ``add`` one (its own id, heartbeat and pool, 16 keys published)."""
    nodes: list[Node] = []

    def add(name: str):
        t0 = time.time()
        conf = NodeConfig(discovery_addr=spec, directory=spec, protocol="tcp", page_bytes=64,
                          heartbeat_interval=heartbeat_interval, heartbeat_timeout=heartbeat_timeout)
        n = Node(**conf.node_kwargs(pool_slots=MEMBER_SLOTS, name=name))
        nodes.append(n)
        n.put_batch([f"growth/{name}/{j}".encode() for j in range(MEMBER_SLOTS)], fill=fill_page)
        return {"start": t0, "node_id": n.node_id, "construct_s": time.time() - t0}
    try:
        conn.send(("ready", {"pid": os.getpid()}))
        _serve_commands(conn, {"add": add})
    finally:
        for n in nodes:
            n.close()


def _get_producer(conn, spec: str, protocol: str, pages: int, page_bytes: int) -> None:
    """Host the directory and a pool of ``pages`` bench pages, all published."""
    conf = NodeConfig(discovery_addr=spec, directory=spec, protocol=protocol, host_discovery=True,
                      page_bytes=page_bytes)
    node = Node(**conf.node_kwargs(pool_slots=pages, name="growth-producer"))
    try:
        keys = options.page_keys(pages, "mla")
        for i in range(0, pages, dirbench.PUBLISH_BATCH):
            node.put_batch(keys[i:i + dirbench.PUBLISH_BATCH], fill=fill_page)
        conn.send(("ready", {"pid": os.getpid()}))
        _serve_commands(conn, {})
    finally:
        node.close()


main_dir_host = _child(_dir_host, "main_dir_host")
main_members_host = _child(_members_host, "main_members_host")
main_members_worker = _child(_members_worker, "main_members_worker")
main_get_producer = _child(_get_producer, "main_get_producer")


# --- the curves --------------------------------------------------------------------------

class Budget:
    """The whole run's bound: how much of --max-seconds is left."""

    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


def _skip_rest(sizes: list[int], done: list[dict], reason: str) -> list[dict]:
    return done + [{"x": x, "status": "not_measured", "reason": reason, "metrics": {}, "detail": {}}
                   for x in sizes[len(done):]]


def curve_directory(a, say, budget: Budget) -> tuple[list[dict], dict]:
    backend = "embedded" if a.directory == "embedded" else dirbench.backend_of(a.directory)
    info = {"backend": backend, "dir_table_entries": a.dir_table_entries if backend == "embedded" else None,
            "slot_bytes": dirbench.SLOT_BYTES, "publish_batch": dirbench.PUBLISH_BATCH, "lookup_batch": a.batch,
            "clients": a.clients, "memory": ("RSS growth of the process hosting the embedded directory alone"
                                             if backend == "embedded" else "Redis INFO memory used_memory growth")}
    r = None
    if backend == "redis":
        import redis   # only for a redis:// directory
        r = redis.Redis.from_url(a.directory, socket_timeout=30)
        info["redis_version"] = r.info("server").get("redis_version")
    try:
        return _directory_sizes(a, say, budget, backend, r), info
    finally:
        if r is not None:
            r.close()


def _directory_sizes(a, say, budget: Budget, backend: str, r) -> list[dict]:
    points: list[dict] = []
    for n in a.sizes:
        need, avail = NEED_PER_KEY[backend] * n, mem_available()
        if avail is not None and need > 0.8 * avail:
            return _skip_rest(a.sizes, points, f"{n} keys would need about {need / 2**30:.1f} GiB here, more "
                              f"than 80% of the {avail / 2**30:.1f} GiB available")
        if budget.left() < 10:
            return _skip_rest(a.sizes, points, f"the run's bound of {a.max_seconds:g} s was used up")
        bound = min(a.size_seconds, budget.left())
        say(f"growth directory ({backend}): {n} keys, publishing (bound {bound:.0f} s)")
        try:
            p = _directory_size(a, n, backend, r, bound, say)
        except PeerCacheError as e:
            if "passed its bound" in str(e):
                return _skip_rest(a.sizes, points, f"{e} (this size and the larger ones)")
            p = {"x": n, "status": "failed", "reason": str(e), "metrics": {}, "detail": {}}
        points.append(p)
        if p["status"] == "ok":
            m = p["metrics"]
            say(f"growth directory ({backend}): {n} keys: {m['dir_bytes_per_key']:.0f} B/key, publish "
                f"{m['publish_keys_per_s']:.0f} keys/s, lookup {m['lookup_keys_per_s']:.0f} keys/s")
    return points


def _directory_size(a, n: int, backend: str, r, bound: float, say) -> dict:
    keys = options.page_keys(n, "mla")
    host = producer = None
    detail: dict[str, Any] = {}
    try:
        if backend == "embedded":
            spec = f"127.0.0.1:{free_port()}"
            host = Child(main_dir_host, spec, a.dir_table_entries, a.heartbeat_timeout, what="directory host")
            before = host.ready["rss"]
        else:
            spec = a.directory
            if a.redis_flush:
                r.flushdb()
            elif r.dbsize():
                raise ConfigError("the Redis database is not empty: growth measures each size from an empty "
                                  "one; give --redis-flush to empty it (a database of its own)")
            before = int(r.info("memory")["used_memory"])
        producer = dirbench.Producer(spec, keys, a.heartbeat_timeout, host=False, max_seconds=bound)
        del keys
        if host is not None:
            st = host.ask("stats", timeout=120)
            after = st["rss"]
            if st["entries"] != n:
                raise PeerCacheError(f"the directory holds {st['entries']} entries after publishing {n} keys")
            detail.update(host_rss_before=before, host_rss_after=after, table_keys=st["table_keys"],
                          table_spilled=st["table_spilled"], table_bytes=st["table_bytes"])
        else:
            after = int(r.info("memory")["used_memory"])
            detail.update(used_memory_before=before, used_memory_after=after, dbsize=int(r.dbsize()))
        detail["publish_s"] = round(producer.publish_s, 3)
        cfg = {"directory": spec, "batch": min(a.batch, n), "keys": n, "clients": a.clients,
               "duration": a.duration, "warmup": a.warmup, "seed": 1, "ready_timeout": 120.0, "path": "rpc"}
        res = dirbench.measure(cfg, say)
        if res["batches"] == 0:
            raise PeerCacheError(f"no lookup batch finished inside the {a.duration:g} s window")
        if res["misses"]:
            raise PeerCacheError(f"{res['misses']} of {res['keys']} keys looked up were not found")
        rng = np.random.default_rng(n)
        sample = dirbench.keys_at(rng.choice(n, min(n, VERIFY_SAMPLE), replace=False))
        bad = producer.verify(sample, 256)
        if bad:
            raise PeerCacheError(f"{len(bad)} of {len(sample)} keys checked had a wrong location, e.g. {bad[0]}")
        detail.update(lookup_latency_us=res["latency_us"], lookup_batches=res["batches"], verified_keys=len(sample))
        return {"x": n, "status": "ok", "reason": None, "detail": detail,
                "metrics": {"dir_bytes_per_key": (after - before) / n,
                            "publish_keys_per_s": n / producer.publish_s,
                            "lookup_keys_per_s": res["keys_per_s"]}}
    finally:
        if producer is not None:
            producer.close()
        if host is not None:
            host.close()


def curve_members(a, say, budget: Budget) -> tuple[list[dict], dict]:
    procs = max(1, min(a.member_procs, max(a.sizes)))
    info = {"member_model": f"lightweight members: real Nodes (own id, heartbeat thread, {MEMBER_SLOTS}-slot tcp "
                            f"pool, {MEMBER_SLOTS} keys published) held {procs} process(es) round-robin",
            "member_procs": procs, "heartbeat_interval": a.heartbeat_interval, "window": a.window,
            "cpu": "the directory host's process CPU (every thread) per wall second"}
    spec = f"127.0.0.1:{free_port()}"
    points: list[dict] = []
    host = None
    workers: list[Child] = []
    observer = None
    try:
        host = Child(main_members_host, spec, a.heartbeat_interval, a.heartbeat_timeout, what="directory host")
        workers = [Child(main_members_worker, spec, a.heartbeat_interval, a.heartbeat_timeout,
                         what=f"member process {i}") for i in range(procs)]
        observer = connect_directory(spec, timeout=10.0)
        base = len(observer.members().nodes)   # the host itself
        joined = 0
        for n in a.sizes:
            if budget.left() < a.window + 10:
                return _skip_rest(a.sizes, points, f"the run's bound of {a.max_seconds:g} s was used up"), info
            t_size = time.monotonic()
            seen_ms = None
            while joined < n:
                if time.monotonic() - t_size > a.size_seconds:
                    return _skip_rest(a.sizes, points, f"joining {n} members passed its bound of "
                                      f"{a.size_seconds:g} s at {joined}"), info
                w = workers[joined % procs]
                last = joined == n - 1
                w.conn.send(("add", f"growth-m{joined}"))
                if last:   # poll members until the new one is listed
                    want, t_seen = base + n, None
                    until = time.monotonic() + a.size_seconds
                    while time.monotonic() < until:
                        if len(observer.members().nodes) >= want:
                            t_seen = time.time()
                            break
                        time.sleep(0.001)
                rep = w._reply(recv(w.conn, a.size_seconds, f"member {joined} did not join"))
                joined += 1
                if last:
                    if t_seen is None:
                        raise PeerCacheError(f"member {joined} never showed in the member list")
                    seen_ms = (t_seen - rep["start"]) * 1e3
            time.sleep(a.heartbeat_interval)   # one heartbeat round after the last join
            s0 = host.ask("stats")
            time.sleep(a.window)
            s1 = host.ask("stats")
            dt = s1["wall"] - s0["wall"]
            ops = {op: (s1["ops"].get(op, 0) - s0["ops"].get(op, 0)) / dt for op in s1["ops"]}
            lat = []
            for _ in range(MEMBERS_CALLS):
                t = time.perf_counter()
                m = observer.members()
                lat.append(time.perf_counter() - t)
            listed = len(m.nodes)
            if listed != base + n:
                raise PeerCacheError(f"{listed} nodes listed at {n} members (+{base} host): members were lost")
            p = {"x": n, "status": "ok", "reason": None,
                 "metrics": {"heartbeat_cpu_cores": (s1["cpu_s"] - s0["cpu_s"]) / dt,
                             "heartbeat_msgs_per_s": ops.get("heartbeat", 0.0), "join_seen_ms": seen_ms,
                             "members_call_ms": statistics.median(lat) * 1e3},
                 "detail": {"ops_per_s": {k: round(v, 2) for k, v in ops.items() if v},
                            "window_s": round(dt, 3), "members_listed": listed,
                            "members_call_p90_ms": float(np.percentile(lat, 90) * 1e3)}}
            points.append(p)
            mm = p["metrics"]
            say(f"growth members: {n}: host {mm['heartbeat_cpu_cores'] * 100:.2f}% of a core, "
                f"{mm['heartbeat_msgs_per_s']:.1f} heartbeats/s, join seen {seen_ms:.1f} ms, "
                f"members call {mm['members_call_ms']:.2f} ms")
    finally:
        if observer is not None:
            observer.close()
        for w in workers:
            w.close()
        if host is not None:
            host.close()
    return points, info


def _register_once(protocol: str, size: int, page: int) -> float:
    t0 = time.perf_counter()
    pool = Pool(max(1, size // page), page, region_id=1)
    tr = make_transport(protocol)
    try:
        tr.expose(1, pool.mm, pool.rkey, fd=pool.fd, size=pool.size)
        tr.start("127.0.0.1")
        return time.perf_counter() - t0
    finally:
        tr.close()
        pool.close()


def _node_start_once(protocol: str, size: int, page: int) -> float:
    spec = f"127.0.0.1:{free_port()}"
    conf = NodeConfig(discovery_addr=spec, directory=spec, protocol=protocol, host_discovery=True,
                      page_bytes=page, dir_table_entries=0)
    t0 = time.perf_counter()
    node = Node(**conf.node_kwargs(pool_slots=max(1, size // page), name="growth-register"))
    dt = time.perf_counter() - t0
    node.close()
    return dt


def curve_register(a, say, budget: Budget) -> tuple[list[dict], dict]:
    info = {"protocol": a.protocol, "page_bytes": a.page_size, "repeats": a.repeats,
            "register": "Pool (memfd, mapping, slot bookkeeping) + transport expose + data server start",
            "rdma": "on rdma registration is ibv_reg_mr, which pins every page: not measured here (no RDMA)",
            "touched": "the pool's pages are not touched at registration on tcp/shm (memfd, mapped lazily)"}
    points: list[dict] = []
    for size in a.sizes:
        avail = mem_available()
        if avail is not None and size > 0.5 * avail:
            return _skip_rest(a.sizes, points, f"a {size} B pool is more than half of the "
                              f"{avail / 2**30:.1f} GiB available"), info
        if budget.left() < 5:
            return _skip_rest(a.sizes, points, f"the run's bound of {a.max_seconds:g} s was used up"), info
        reg = [_register_once(a.protocol, size, a.page_size) for _ in range(a.repeats)]
        node = [_node_start_once(a.protocol, size, a.page_size) for _ in range(a.repeats)]
        p = {"x": size, "status": "ok", "reason": None,
             "metrics": {"register_s": statistics.median(reg), "node_start_s": statistics.median(node)},
             "detail": {"register_all_s": reg, "node_start_all_s": node, "slots": max(1, size // a.page_size)}}
        points.append(p)
        say(f"growth register ({a.protocol}): {size} B: register {p['metrics']['register_s'] * 1e3:.2f} ms, "
            f"node start {p['metrics']['node_start_s'] * 1e3:.1f} ms")
    return points, info


def curve_get_cpu(a, say, budget: Budget) -> tuple[list[dict], dict]:
    pages = max(1024, 4 * max(a.sizes))
    info = {"protocol": a.protocol, "page_bytes": a.page_size, "pages": pages, "window": a.window,
            "warmup": a.warmup, "cpu": "the consumer process's CPU time (every thread) over the window / pages read"}
    spec = f"127.0.0.1:{free_port()}"
    points: list[dict] = []
    producer = node = None
    try:
        producer = Child(main_get_producer, spec, a.protocol, pages, a.page_size, what="producer")
        conf = NodeConfig(discovery_addr=spec, directory=spec, protocol=a.protocol)
        node = Node(**conf.node_kwargs(name="growth-consumer"))
        for b in a.sizes:
            if b > pages:
                raise ConfigError(f"batch {b} is larger than the {pages} pages published")
            if budget.left() < a.window + a.warmup + 5:
                return _skip_rest(a.sizes, points, f"the run's bound of {a.max_seconds:g} s was used up"), info
            batches = [dirbench.keys_at(x) for x in dirbench.draw_batches(pages, b, 64, seed=b)]
            dest = np.empty(b * a.page_size, np.uint8)
            offs = np.arange(b, dtype=np.int64) * a.page_size
            got = misses = calls = 0
            t_end = time.perf_counter() + a.warmup
            i = 0
            while time.perf_counter() < t_end:
                node.get_batch_into(batches[i % 64], dest, offs)
                i += 1
            c0, w0 = time.process_time(), time.perf_counter()
            while time.perf_counter() - w0 < a.window and calls < 10_000_000:
                res = node.get_batch_into(batches[i % 64], dest, offs)
                i += 1
                calls += 1
                h = res.hits
                got += h
                misses += b - h
            c1, w1 = time.process_time(), time.perf_counter()
            if misses:
                p = {"x": b, "status": "failed", "reason": f"{misses} of {got + misses} GETs missed or failed "
                     "(every page was published)", "metrics": {}, "detail": {}}
            else:
                p = {"x": b, "status": "ok", "reason": None,
                     "metrics": {"get_cpu_us_per_page": (c1 - c0) / got * 1e6, "get_pages_per_s": got / (w1 - w0)},
                     "detail": {"pages": got, "calls": calls, "cpu_s": round(c1 - c0, 4), "window_s": round(w1 - w0, 4),
                                "cpu_cores": round((c1 - c0) / (w1 - w0), 3)}}
                say(f"growth get_cpu ({a.protocol}): batch {b}: {p['metrics']['get_cpu_us_per_page']:.1f} us CPU "
                    f"per page, {p['metrics']['get_pages_per_s']:.0f} pages/s")
            points.append(p)
    finally:
        if node is not None:
            node.close()
        if producer is not None:
            producer.close()
    return points, info


RUNNERS = {"directory": curve_directory, "members": curve_members, "register": curve_register,
           "get_cpu": curve_get_cpu}


# --- the run -------------------------------------------------------------------------------

def validate(a) -> None:
    """Refuse options that cannot make a measurement, saying which and what to give."""
    if a.curve not in CURVES:
        raise ConfigError(f"--curve must be one of {', '.join(CURVES)}, got {a.curve!r}")
    a.sizes = parse_sizes(a.sizes or DEFAULT_SIZES[a.curve])
    if a.curve == "directory":
        if a.directory != "embedded":
            dirbench.backend_of(a.directory)
            if a.directory.lower().startswith(SENTINEL_SCHEME):
                # its memory is read from the one server the URL names (INFO memory), and flushed there
                raise ConfigError(f"--directory {redact(a.directory)!r}: the directory curve measures one "
                                  "Redis's memory; give the master's redis://HOST:PORT/DB instead of the "
                                  "sentinels' URL")
        if max(a.sizes) > 50_000_000:
            raise ConfigError("--sizes: at most 5e7 keys")
    if a.curve == "members" and max(a.sizes) > 256:
        raise ConfigError("--sizes: at most 256 members")
    if a.curve == "register" and a.protocol not in ("tcp", "shm"):
        raise ConfigError("--curve register measures tcp or shm (rdma's ibv_reg_mr is not measured here)")
    if a.curve == "get_cpu" and max(a.sizes) > 4096:
        raise ConfigError("--sizes: batches of at most 4096 keys")
    for name in ("batch", "clients", "member_procs", "repeats", "page_size"):
        if getattr(a, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    for name in ("duration", "window", "size_seconds", "max_seconds", "heartbeat_interval"):
        checks.seconds(f"--{name.replace('_', '-')}", getattr(a, name), positive=True)
    if a.heartbeat_interval >= a.heartbeat_timeout:
        raise ConfigError("--heartbeat-interval must be below --heartbeat-timeout")
    if a.out is not None:
        checks.writable_file("--out", a.out)


def run(a, say=lambda msg: None) -> dict:
    """One curve: its points, its fits; the result document (status ok, or failed with the reasons)."""
    validate(a)
    doc = {"schema_version": SCHEMA_VERSION, "tool": TOOL, "status": "ok", "error": None,
           "meta": {**meta.host_block(), "command": meta.command_line(), "start": meta.now_iso(), "end": None,
                    "curve": a.curve, "sizes": a.sizes, "x_unit": X_UNIT[a.curve],
                    "directory": redact(a.directory), "size_seconds": a.size_seconds, "max_seconds": a.max_seconds,
                    "versions": {**meta.versions(), **(dirbench.client_versions(a.directory)
                                                       if a.directory != "embedded" else {})},
                    "git_revision": meta.git_revision()},
           "result": None}
    t0 = time.monotonic()
    try:
        points, info = RUNNERS[a.curve](a, say, Budget(a.max_seconds))
        doc["meta"].update(info)
        doc["result"] = {"curve": a.curve, "x_unit": X_UNIT[a.curve], "units": METRICS[a.curve],
                         "points": points, "fits": fits(points, a.curve), "seconds": round(time.monotonic() - t0, 1)}
        failed = [f"{p['x']}: {p['reason']}" for p in points if p["status"] == "failed"]
        if failed:
            doc["status"], doc["error"] = "failed", "; ".join(failed)
        elif not any(p["status"] == "ok" for p in points):
            doc["status"], doc["error"] = "failed", "no size was measured: " + "; ".join(
                f"{p['x']}: {p['reason']}" for p in points)
        for f in doc["result"]["fits"]:
            say(f"growth {a.curve}: {f['cost']} ~ {f['a']:.3g} * x^{f['b']:.3f} (r2 {f['r2']:.3f})"
                + (", faster than linear" if f["superlinear"] else ", linear" if f["linear"] else ""))
    except PeerCacheError as e:
        doc["status"], doc["error"] = "failed", str(e)
    doc["meta"]["end"] = meta.now_iso()
    return doc


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m peercache.bench.growth", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--curve", required=True, choices=CURVES, help="which cost against which size")
    p.add_argument("--sizes", default=None, help="the x values, comma-separated (1e4, 64M, 2G); default per curve: "
                   + "; ".join(f"{k}: {v}" for k, v in DEFAULT_SIZES.items()))
    p.add_argument("--directory", default="embedded",
                   help="directory: 'embedded' (hosted by a process of its own) or redis://HOST:PORT/DB [%(default)s]")
    p.add_argument("--redis-flush", action="store_true",
                   help="empty the Redis database before each size (it must be one of its own)")
    p.add_argument("--dir-table-entries", type=int, default=NodeConfig.options()["dir_table_entries"].default,
                   help="directory: entries of the embedded directory's one-sided table [%(default)s]")
    p.add_argument("--batch", type=int, default=128, help="directory: keys per lookup [%(default)s]")
    p.add_argument("--clients", type=int, default=1, help="directory: lookup client processes [%(default)s]")
    p.add_argument("--duration", type=float, default=3.0, help="directory: measured lookup seconds [%(default)s]")
    p.add_argument("--warmup", type=float, default=1.0, help="directory, get_cpu: unmeasured seconds [%(default)s]")
    p.add_argument("--window", type=float, default=4.0, help="members, get_cpu: measured seconds [%(default)s]")
    p.add_argument("--heartbeat-interval", type=float, default=1.0, help="members: seconds between heartbeats "
                   "[%(default)s]")
    p.add_argument("--heartbeat-timeout", type=float, default=60.0,
                   help="seconds of silence before the directory drops a node (long: a 10^7-key publish keeps "
                        "the processes busy) [%(default)s]")
    p.add_argument("--member-procs", type=int, default=4, help="members: processes holding the members [%(default)s]")
    p.add_argument("--protocol", default="tcp", choices=("tcp", "shm"), help="register, get_cpu [%(default)s]")
    p.add_argument("--page-size", type=int, default=131072, help="register, get_cpu: page bytes [%(default)s]")
    p.add_argument("--repeats", type=int, default=3, help="register: repeats per size (median) [%(default)s]")
    p.add_argument("--size-seconds", type=float, default=180.0,
                   help="bound on one size's publish or joins; past it that size and the larger ones are "
                        "not_measured [%(default)s]")
    p.add_argument("--max-seconds", type=float, default=900.0, help="bound on the whole run [%(default)s]")
    p.add_argument("--out", default=None, help="also write the JSON document here")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    return p


def main(argv=None) -> int:
    return meta.one_document_main("growth", build_parser().parse_args(argv), run, indent=1)


if __name__ == "__main__":
    sys.exit(main())
