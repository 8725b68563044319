"""The ``growth`` kind: how a cost grows with keys, members, pool size or batch size
(``python -m peercache.bench.growth``) on this host, with the power law fitted to it.

Declaration (:class:`GrowthRun`), run (the tool on this host; the ``redis`` backend on a redis-server
started here), sanity (the tool's own status) and the rows (:func:`rows_of`): one row per x value and
metric, then one ``fit_exponent`` row per fitted cost.
"""
from __future__ import annotations

import contextlib
import json
import time
from typing import TYPE_CHECKING, Any, Iterator

from peercache import atomic
from peercache.lab.launch import redis as redis_launch
from peercache.lab.pipeline.points.declare import POSITIVE_INT, SECONDS, Timed, one_of, parameter, timing, variable
from peercache.lab.tidy import Row

if TYPE_CHECKING:
    from peercache.lab.pipeline.runpoint import PointRun, TestbedHosts

TOOL = "peercache-growth"
#: the backends each curve takes: the directory's (embedded, redis) or the data transport's (tcp, shm)
BACKENDS = {"directory": ("embedded", "redis"), "members": ("embedded",), "register": ("tcp", "shm"),
            "get_cpu": ("tcp", "shm")}
#: metric -> unit of every row the tool's curves yield (peercache.bench.growth.METRICS, flattened)
METRICS = {"dir_bytes_per_key": "B", "publish_keys_per_s": "ops/s", "lookup_keys_per_s": "ops/s",
           "heartbeat_cpu_cores": "ratio", "heartbeat_msgs_per_s": "msg/s", "join_seen_ms": "ms",
           "members_call_ms": "ms", "register_s": "s", "node_start_s": "s", "get_cpu_us_per_page": "us",
           "get_pages_per_s": "pages/s", "fit_exponent": "ratio"}
#: the headline metric of each curve (a skipped or failed point's row)
HEADLINE = {"directory": "dir_bytes_per_key", "members": "heartbeat_cpu_cores", "register": "register_s",
            "get_cpu": "get_cpu_us_per_page"}
#: Seconds the harness adds to the tool's own --max-seconds before it gives up on it.
GRACE_S = 120.0


class GrowthRun(Timed):
    """One curve of ``python -m peercache.bench.growth`` on this host: ``curve`` against ``sizes`` on each of
    ``backend`` (a point per backend), with a power law fitted to each cost.

    ``directory`` (sizes: keys): directory memory per key, publish and lookup keys/s, embedded (hosted by a
    process of its own) or Redis (a redis-server started here, emptied before each size). ``members``
    (sizes: members): the directory host's CPU, heartbeats/s, join-seen time and members-call latency.
    ``register`` (sizes: pool bytes): registering a pool on tcp or shm. ``get_cpu`` (sizes: keys per
    batch): consumer CPU per page of 128 KiB (``page_size``) GETs on loopback. ``duration`` is the
    directory's lookup window and the members/get_cpu window; sizes that pass ``size_seconds`` (or the
    memory here) are not_measured, with the reason, as are the larger ones after them.
    """

    name = "growth"
    metrics = METRICS
    primary = "fit_exponent"
    tool_column = TOOL

    #: which cost against which size (str)
    curve = variable(one_of(*BACKENDS), doc="the curve (growth --curve): directory, members, register, get_cpu")
    #: the directory backend or the data transport (str, swept): a point per backend
    backend = parameter(one_of("embedded", "redis", "tcp", "shm"),
                        doc="directory: embedded / redis; members: embedded; register, get_cpu: tcp / shm")
    #: the x values (list of int): keys, members, pool bytes or keys per batch
    sizes = variable({"type": "array", "minItems": 2, "items": POSITIVE_INT},
                     doc="the x values (growth --sizes): keys, members, pool bytes or keys per batch")
    #: bytes of a page (register, get_cpu)
    page_size = variable(POSITIVE_INT, 131072, "page bytes (growth --page-size; register, get_cpu)", tag="s{}")
    #: bound on one size's publish or joins (s)
    size_seconds = variable(SECONDS, 180.0, "bound on one size (growth --size-seconds)")
    #: bound on the whole curve (s)
    max_seconds = variable(SECONDS, 900.0, "bound on the whole curve (growth --max-seconds)")

    @classmethod
    def point_name(cls, one):
        return f"growth_{one['curve']}_{one['backend']}"

    @classmethod
    def params(cls, one, devices):
        if one["backend"] not in BACKENDS[one["curve"]]:
            raise ValueError(f"growth curve {one['curve']!r} takes backend {' or '.join(BACKENDS[one['curve']])}, "
                             f"not {one['backend']!r}")
        return {"curve": one["curve"], "backend": one["backend"], "sizes": list(one["sizes"]),
                **cls.changed(one, "page_size", "size_seconds", "max_seconds"), **timing(one)}

    @classmethod
    def argv(cls, p: dict[str, Any], directory: str | None, duration: float, warmup: float) -> list[str]:
        """The tool's options for the point ``p`` (``directory``: the Redis URL of the redis backend)."""
        out = ["--curve", p["curve"], "--sizes", ",".join(str(s) for s in p["sizes"]),
               "--size-seconds", f"{p.get('size_seconds', 180.0):g}",
               "--max-seconds", f"{p.get('max_seconds', 900.0):g}"]
        if p["curve"] == "directory":
            out += ["--duration", f"{duration:g}", "--warmup", f"{warmup:g}"]
            if directory:
                out += ["--directory", directory, "--redis-flush"]
        elif p["curve"] in ("members", "get_cpu"):
            out += ["--window", f"{duration:g}", "--warmup", f"{warmup:g}"]
        if p["curve"] in ("register", "get_cpu"):
            out += ["--protocol", p["backend"], "--page-size", str(p.get("page_size", 131072))]
        return out

    @classmethod
    def run(cls, pr: PointRun, th: TestbedHosts) -> None:
        """One curve: the growth tool on this host (with a redis-server of its own for the redis backend)."""
        p = pr.point.params
        headline = HEADLINE[p["curve"]]
        ctx = pr.ctx(tool=TOOL, side="client", host=str(th.producer),
                     protocol=p["backend"] if p["backend"] in ("tcp", "shm") else "tcp")
        why = pr.local_only(th, "a growth point")
        if why:
            pr.fail(headline, METRICS[headline], why, **ctx_where(ctx))
            return
        if p["backend"] == "redis":
            ok, why = redis_launch.available()
            if not ok:
                pr.rows.append(Row(metric=headline, value=None, unit=METRICS[headline], status="skipped",
                                   reason=f"no Redis here: {why}", **ctx))
                return
        with contextlib.ExitStack() as stack:
            url = None
            if p["backend"] == "redis":
                srv = stack.enter_context(pr.redis_server())
                url = srv.url
                pr.notes.append(f"redis-server {redis_launch.server_version()} on {srv.url} (no persistence)")
            argv = [*pr.python_tool(th, "producer", "peercache.bench.growth"),
                    *cls.argv(p, url, pr.duration, pr.warmup)]
            pr.commands["client"] = argv
            t0 = time.time()
            r = th.producer.run(argv, timeout=pr.scaled(float(p.get("max_seconds", 900.0)) + GRACE_S))
            pr.notes.append(f"growth ran {time.time() - t0:.0f} s")
        atomic.write_text(pr.raw_dir / "growth.log", r.stdout + r.stderr)
        lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
        if not lines:
            pr.fail(headline, METRICS[headline], f"growth --curve {p['curve']} exited {r.rc} without a result: "
                    f"{r.stderr.strip()[-300:]}", **ctx_where(ctx))
            return
        doc = json.loads(lines[-1])
        atomic.write_text(pr.raw_dir / "growth.json", json.dumps(doc, indent=1))
        why = sanity(doc)
        if why:
            pr.fail(headline, METRICS[headline], why, **ctx_where(ctx))
        pr.rows += rows_of(doc, p, ctx)


def ctx_where(ctx: dict[str, Any]) -> dict[str, Any]:
    return {k: ctx[k] for k in ("tool", "protocol", "host")}


def sanity(doc: dict[str, Any]) -> str | None:
    """Why the tool's document holds no trustworthy curve (None: it holds one): it said it failed."""
    return None if doc.get("status") == "ok" else f"growth: {doc.get('error')}"


def rows_of(doc: dict[str, Any], p: dict[str, Any], ctx: dict[str, Any]) -> Iterator[Row]:
    """One row per x value and metric (not_measured / failed with the tool's reason where the size was not
    measured), then one ``fit_exponent`` row per fitted cost (value b; a, b, r2, linear, superlinear)."""
    res = doc.get("result") or {}
    curve = res.get("curve", p["curve"])
    x_unit = res.get("x_unit", "")
    units = res.get("units") or {}
    base = {"curve": curve, "backend": p["backend"], "x_unit": x_unit}
    for pt in res.get("points", []):
        x = pt["x"]
        extra = {**base, "x": x, **({"detail": pt["detail"]} if pt.get("detail") else {})}
        shape = {"batch": x} if curve == "get_cpu" else {"size_bytes": x} if curve == "register" else {}
        for metric, unit in units.items():
            v = (pt.get("metrics") or {}).get(metric)
            if pt["status"] == "ok" and v is not None:
                yield Row(metric=metric, value=float(v), unit=unit, raw_value=float(v), raw_unit=unit,
                          extra=extra, **shape, **ctx)
            else:
                st = pt["status"] if pt["status"] in ("not_measured", "failed") else "not_measured"
                yield Row(metric=metric, value=None, unit=unit, status=st,
                          reason=pt.get("reason") or "the tool gave no figure", extra=extra, **shape, **ctx)
    for f in res.get("fits", []):
        yield Row(metric="fit_exponent", value=float(f["b"]), unit="ratio",
                  extra={**base, "fitted_metric": f["metric"], "cost": f["cost"], "cost_unit": f["cost_unit"],
                         "a": f["a"], "b": f["b"], "r2": f["r2"], "n": f["n"], "linear": f["linear"],
                         "superlinear": f["superlinear"], "xs": f["xs"], "costs": f["costs"]}, **ctx)
