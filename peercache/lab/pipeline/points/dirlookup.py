"""The ``dirlookup`` kind: directory lookups/s (``python -m peercache.bench.dirbench``) on this host.

Declaration (:class:`DirLookupRun`), run (dirbench against the embedded directory or a redis-server
started here), sanity (dirbench's own status) and metric extraction (:func:`extract`).
"""
from __future__ import annotations

import contextlib
import json
import time
from typing import TYPE_CHECKING, Any, Iterator

from peercache import atomic
from peercache.lab.launch import redis as redis_launch
from peercache.lab.pipeline.points.declare import POSITIVE_INT, Timed, one_of, parameter, timing, variable
from peercache.lab.tidy import Row

if TYPE_CHECKING:
    from peercache.lab.pipeline.runpoint import PointRun, TestbedHosts

#: Seconds dirbench may take to start its directory and publish its keys (--ready-timeout, emulated hosts).
DIRBENCH_READY_S = 60.0

# Directory throughput: keys/s and batches/s are rates of ops (an op = one key, resp. one batch).
DIR_METRICS = {"keys_per_s": "ops/s", "batches_per_s": "ops/s", "latency_p50": "us", "latency_p99": "us"}


class DirLookupRun(Timed):
    """Directory lookups/s (``python -m peercache.bench.dirbench``) on this host: a producer node publishes
    ``keys`` keys, then ``clients`` client processes look up random batches, one batch in flight each.

    ``directory: embedded``: dirbench hosts the embedded directory itself (as serve's node does) on a free
    127.0.0.1 port. ``directory: redis``: the Redis backend on a redis-server started by launch code
    (peercache.lab.launch.redis) and emptied first; in ``make bench`` one server for the whole run (see
    runpoint.shared_redis), the one the ``redis_benchmark`` point measured just before. Equal concurrency for that
    pair: ``clients`` here is the client *processes* (each one connection, one batch in flight) and the
    redis_benchmark part's ``clients`` its connections (``-c``, no pipelining): give both the same value.
    """

    name = "dirlookup"
    metrics = {**DIR_METRICS, "misses": "count", "verify_failures": "count"}
    primary = "keys_per_s"
    tool_column = "peercache-dirbench"

    #: the directory backend (str): embedded (HOST:PORT) or redis (redis://127.0.0.1:PORT/0)
    directory = variable(one_of("embedded", "redis"), doc="directory backend (dirbench --directory)")
    #: keys per lookup (int, swept), --batch
    batch = parameter(POSITIVE_INT, doc="keys per lookup (--batch)")
    #: client processes, one batch in flight each (int, swept), --clients
    clients = parameter(POSITIVE_INT, [1], "client processes, one batch in flight each (--clients)")
    #: keys published before the lookups (int), --keys
    keys = variable(POSITIVE_INT, 16384, "keys published (--keys)", tag="k{}")
    #: how a client asks (str), --path: rpc = the directory's lookup op; node = as a consumer Node
    #: resolves keys (the embedded directory's one-sided table first, the lookup op for the rest)
    path = variable(one_of("rpc", "node"), "rpc", "dirbench --path: the lookup op, or a Node's resolution",
                    tag="{}")

    @classmethod
    def point_name(cls, one):
        return f"dir_{one['directory']}_b{one['batch']}_c{one['clients']}"

    @classmethod
    def params(cls, one, devices):
        return {"directory": one["directory"], "batch": one["batch"], "clients": one["clients"],
                "keys": one["keys"], **({"path": one["path"]} if one["path"] != "rpc" else {}), **timing(one)}

    @classmethod
    def run(cls, pr: PointRun, th: TestbedHosts) -> None:
        """Directory lookups/s at one batch size: dirbench against the embedded directory or a redis-server."""
        p = pr.point.params
        ctx = pr.ctx(tool="peercache-dirbench", side="client", host=str(th.producer), protocol="tcp",
                     batch=p["batch"], processes=p["clients"], threads=1)
        where = {k: ctx[k] for k in ("tool", "protocol", "batch", "processes")}
        why = pr.local_only(th, "a dirlookup point")
        if why:
            pr.fail("keys_per_s", "ops/s", why, **where)
            return
        with contextlib.ExitStack() as stack:
            if p["directory"] == "redis":
                srv = stack.enter_context(pr.redis_server())
                spec, shown = srv.url, srv.url
                pr.notes.append(f"redis-server {redis_launch.server_version()} on {srv.url} (no persistence)")
            else:
                spec = shown = f"127.0.0.1:{pr.ports.allocate()}"
            argv = [*pr.python_tool(th, "producer", "peercache.bench.dirbench"), "--directory", spec,
                    "--batch", str(p["batch"]), "--keys", str(p["keys"]), "--clients", str(p["clients"]),
                    "--duration", str(pr.duration), "--warmup", str(pr.warmup),
                    *(["--path", p["path"]] if p.get("path") else [])]
            if pr.slow > 1:
                argv += ["--ready-timeout", f"{pr.scaled(DIRBENCH_READY_S):.0f}"]
            pr.commands["client"] = argv
            wrapped = pr.cpu_wrap("consumer", th, "producer", argv)
            t0 = time.time()
            r = th.producer.run(wrapped, timeout=pr.timeout)
            t1 = time.time()
        atomic.write_text(pr.raw_dir / "dirbench.log", r.stdout + r.stderr)
        lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
        if not lines:
            pr.fail("keys_per_s", "ops/s", f"dirbench --directory {shown} exited {r.rc} without a result: "
                    f"{r.stderr.strip()[-300:]}", **where)
            return
        doc = json.loads(lines[-1])
        atomic.write_text(pr.raw_dir / "dirbench.json", json.dumps(doc, indent=1))
        why = sanity(doc)
        if why:
            pr.fail("keys_per_s", "ops/s", why, **where)
        pr.rows += extract(doc, p, ctx, measured=why is None)
        span = t1 - t0   # the clients' window is the end of the run (after spawn, publish and warm-up)
        pr.attach_cpu_to("keys_per_s", pr.cpu_usage({"consumer": "consumer"}, t0 + 0.4 * span, t1 - 0.1 * span))


def sanity(doc: dict[str, Any]) -> str | None:
    """Why dirbench's document holds no figure (None: it holds one): dirbench said it failed."""
    return None if doc["status"] == "ok" else f"dirbench: {doc['error']}"


def extract(doc: dict[str, Any], p: dict[str, Any], ctx: dict[str, Any], measured: bool) -> Iterator[Row]:
    """keys/s, batches/s and the latency percentiles (when ``measured``), then the misses and failed checks."""
    res = doc.get("result") or {}
    extra = {"directory": p["directory"], "keys_published": p["keys"], "window_start": res.get("window_start"),
             "window_end": res.get("window_end"), "verified_keys": res.get("verified_keys")}
    if measured:
        for metric, value in (("keys_per_s", res["keys_per_s"]), ("batches_per_s", res["batches_per_s"]),
                              ("latency_p50", res["latency_us"]["p50"]),
                              ("latency_p99", res["latency_us"]["p99"])):
            unit = "us" if metric.startswith("latency") else "ops/s"
            yield Row(metric=metric, value=value, unit=unit, raw_value=value, raw_unit=unit, extra=extra, **ctx)
    for metric in ("misses", "verify_failures"):
        if metric in res:
            yield Row(metric=metric, value=float(res[metric]), unit="count", extra=extra, **ctx)
