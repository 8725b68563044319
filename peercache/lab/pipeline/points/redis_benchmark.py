"""The ``redis_benchmark`` kind: ``redis-benchmark``'s MGET of ``batch`` keys on a redis-server here (the raw
limit of the Redis directory).

Declaration (:class:`RedisBenchmarkRun`), run (seed the keys, a calibration run, then the measured
run sized to the point's duration), sanity (:func:`sanity`: the server's counters say every key read
was a stored one) and metric extraction (the tool's rows).
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from peercache import atomic
from peercache.lab.errors import ToolError
from peercache.lab.launch import redis as redis_launch
from peercache.lab.launch.hosts import CommandTimeout
from peercache.lab.pipeline.points.declare import NULLABLE_INT, POSITIVE_INT, Timed, parameter, timing, variable
from peercache.lab.pipeline.points.dirlookup import DIR_METRICS
from peercache.lab.tools import redis_benchmark as redis_tool

if TYPE_CHECKING:
    from peercache.lab.pipeline.runpoint import PointRun, TestbedHosts


class RedisBenchmarkRun(Timed):
    """``redis-benchmark`` MGET of ``batch`` keys (Redis's own client, the raw limit of a Redis directory) on a
    redis-server started by launch code on this host (in ``make bench``: the run's shared one), emptied first.

    The keys are those the Redis backend stores the bench's first ``batch`` entries under
    (``pc:e:pc/<i>``), each holding ``value_bytes`` bytes; with ``keyspace``, ``keyspace`` such keys
    (``pc:e:pc/<12 digits>``, redis-benchmark's ``-r`` names) and each MGET asks for a random
    ``batch`` of them, as dirlookup's clients do; ``clients`` connections (``-c``), no pipelining
    (``-P 1``): one MGET in flight per connection, as each dirlookup client process has one lookup in
    flight. A short calibration run sizes ``-n`` so the measured run lasts about the point's duration.
    """

    name = "redis_benchmark"
    metrics = dict(DIR_METRICS)
    primary = "keys_per_s"
    tool_column = "redis-benchmark"

    #: keys per MGET (int, swept)
    batch = parameter(POSITIVE_INT, doc="keys per MGET")
    #: parallel connections, -c (int, swept): the dirlookup clients it is the limit for
    clients = parameter(POSITIVE_INT, [1], "connections (-c), one MGET in flight each")
    #: bytes of each key's value (int): one Redis backend entry is a 56-byte LOC_DTYPE record
    value_bytes = variable(POSITIVE_INT, 56, "bytes per value (a Redis backend entry's size)", tag="v{}")
    #: keys stored and drawn at random for each MGET (int or null: the same ``batch`` keys every time)
    keyspace = variable(NULLABLE_INT, None, "random batches out of this many keys (-r) [the same keys each MGET]",
                        tag="r{}")

    @classmethod
    def point_name(cls, one):
        return f"redis_mget_b{one['batch']}_c{one['clients']}"

    @classmethod
    def params(cls, one, devices):
        return {"batch": one["batch"], "clients": one["clients"], "value_bytes": one["value_bytes"],
                **({"keyspace": one["keyspace"]} if one["keyspace"] else {}), **timing(one)}

    @classmethod
    def run(cls, pr: PointRun, th: TestbedHosts) -> None:
        """redis-benchmark's MGET of ``batch`` keys on a redis-server here: the raw limit of the Redis directory."""
        p = pr.point.params
        ctx = pr.ctx(tool="redis-benchmark", side="client", host=str(th.producer), protocol="tcp",
                     batch=p["batch"], processes=1, threads=p["clients"])
        where = {k: ctx[k] for k in ("tool", "protocol", "batch")}
        why = pr.local_only(th, "a redis_benchmark point")
        if why:
            pr.fail("keys_per_s", "ops/s", why, **where)
            return
        # The keys under which the Redis backend (prefix "pc") stores the bench's entries: its first
        # `batch` ones, or (keyspace) `keyspace` of them as redis-benchmark -r names them, a random
        # batch of which each MGET asks for.
        space = p.get("keyspace")
        if space:
            keys = [f"pc:e:pc/{redis_tool.RAND}"] * p["batch"]
            stored = [redis_tool.random_key("pc:e:pc/", i) for i in range(space)]
        else:
            keys = stored = [f"pc:e:pc/{i}" for i in range(p["batch"])]
        with pr.redis_server() as srv:
            pr.notes.append(f"redis-server {redis_launch.server_version()} on {srv.url} (no persistence)")
            for i in range(0, len(stored), 4096):
                srv.seed(stored[i:i + 4096], "v" * p["value_bytes"])
            # Calibration (also the warm-up): a short run, then -n sized to last about the duration.
            calib = redis_tool.mget_command(srv.port, keys, requests=max(200, 1000 * p["clients"]),
                                            clients=p["clients"], keyspace=space)
            first = run_once(pr, th, calib, "calibration", p["batch"])
            n = int(min(50_000_000, max(1000, first.rps * pr.duration)))
            argv = redis_tool.mget_command(srv.port, keys, requests=n, clients=p["clients"], keyspace=space)
            pr.commands["client"] = argv
            wrapped = pr.cpu_wrap("consumer", th, "producer", argv)
            srv.keyspace_stats(reset=True)
            t0 = time.time()
            result = run_once(pr, th, wrapped, "measured", p["batch"])
            t1 = time.time()
            read = srv.keyspace_stats()
        why = sanity(read, n * p["batch"])
        if why:
            pr.fail("keys_per_s", "ops/s", why, **where)
            return
        extra = {"requests": n, "seconds": round(t1 - t0, 3), "value_bytes": p["value_bytes"],
                 "calibration_rps": first.rps, "keyspace": space, **read}
        pr.rows += redis_tool.to_rows(result, extra=extra, **ctx)
        span = t1 - t0
        pr.attach_cpu_to("keys_per_s", pr.cpu_usage({"consumer": "consumer"}, t0 + 0.2 * span,
                                                    t1 - 0.2 * span))


def sanity(read: dict[str, Any], keys_asked: int) -> str | None:
    """Why the figure is not of stored entries (None: it is). redis-benchmark cannot tell a nil from a value:
    the server's counters say what was read."""
    if read["keyspace_misses"] or read["keyspace_hits"] < keys_asked:
        return (f"redis-benchmark's MGETs read {read['keyspace_misses']} keys that "
                f"were not stored ({read['keyspace_hits']} that were): the figure would not be of "
                "stored entries; check the stored key names against the MGET's")
    return None


def run_once(pr: PointRun, th: TestbedHosts, argv: list[str], label: str, batch: int) -> redis_tool.BenchmarkResult:
    """One redis-benchmark run (bounded: it retries forever when it cannot connect), parsed and checked."""
    try:
        r = th.producer.run(argv, timeout=pr.timeout)
        out, err, rc = r.stdout, r.stderr, r.rc
    except CommandTimeout as e:
        out, err, rc = e.completed.stdout, e.completed.stderr, None
    atomic.write_text(pr.raw_dir / f"redis-benchmark.{label}.csv", out)
    atomic.write_text(pr.raw_dir / f"redis-benchmark.{label}.stderr", err)
    te = redis_tool.classify_failure(out, err, rc, host=str(th.producer))
    if te is not None:
        raise te
    if rc is None:
        raise ToolError(host=str(th.producer), tool="redis-benchmark", kind="failed",
                        detail=f"the {label} run did not finish within {pr.timeout:.0f} s",
                        check="read redis-benchmark.*.stderr beside the result")
    return redis_tool.mget_result(redis_tool.parse_csv(out, source=f"{pr.run_id}/{label}"),
                                  batch, source=f"{pr.run_id}/{label}")
