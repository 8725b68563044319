"""``make bench``: PeerCache GET against the raw limits, side by side, in one run.

The bench is one scenario of the lab's point kinds (``experiments/bench/scenarios.yaml``)
on the bench testbed (``experiments/bench/testbed.yaml``, this machine), run point by
point through the same hosts, pair runner and point runner as every pipeline point
(readiness by output or port, free ports, every process ended on every path). Each
point leaves its raw folder and ``result.json`` under ``results/bench/<run>/``, and the
run's tidy rows (with verdicts; the ratios against ``bench_targets`` of
``data/reference/references.yaml``) are written there as ``rows.parquet`` and
``runs.parquet``.

Prints one ``ratio <name> <value>`` line per target and the raw figures behind each
(``raw <name> <value> <unit>``), plus ``check`` lines for the verified runs. Throughput
figures run with verification off. What each figure measures:

- ``shm_vs_memcpy_128k``: ``peercache-bench drive --protocol shm`` (one thread, one
  channel, 128 KiB pages, directory cached) against a ``serve`` process, vs a
  single-thread native memcpy of the same pages from a memfd region of the same size and
  layout into a batch-sized buffer (``peercache.lab.tools.memcpy``).
- ``tcp_vs_iperf3_128k``: ``serve`` in network namespace A and ``drive`` in namespace B
  over a veth pair (198.18.x addresses; loopback when not root), one thread and one
  channel, vs ``iperf3 -R -l 131072 -P 1`` on the same path and direction (server sends,
  as a GET does), warm-up omitted (``-O``).
- ``ours_vs_mooncake_tcp_128k``: ``peercache_tcp_128k`` (the unverified tcp drive above) over Mooncake
  Transfer Engine's ``transfer_engine_bench`` on the same netns path at the same shape: target in
  namespace A, initiator in B, ``-protocol=tcp -metadata_server=P2PHANDSHAKE``, READs of 128 KiB in
  batches of 32, one thread (``.venv-mooncake``, ``make engines``; it checks no bytes either). Mooncake
  runs first in each tcp round, before the iperf3 baseline and the PeerCache drive.
- ``ours_vs_nixl_tcp_128k``: the same ``peercache_tcp_128k`` over NIXL (``nixl_agent``, UCX backend, DRAM)
  through our driver (``peercache.lab.tools.nixl_driver``, ``.venv-nixl``) on the same path at the same
  shape: target in namespace A with 256 pages registered, initiator in B, ``UCX_TLS=tcp`` on the veth,
  batches of 32 random 128 KiB pages per ``make_prepped_xfer`` READ, one thread, verification off as
  the drive's. NIXL runs right after Mooncake in each tcp round.
- ``pages_per_s_64b``: ``Node.get_batch_into`` of 128 random 64-byte pages per call over
  shm, directory cached, one thread in one consumer process
  (``peercache.lab.tools.nodeloop``), against a ``serve`` process; the
  ``peercache-bench drive`` rate, whose Python driver loop adds its own cost per batch,
  is printed beside it as a raw figure.

- ``verify_vs_noverify_{shm,tcp}_128k``: the same drive with every page checked against
  the bench pattern in the native read pass (fused with the shm copy, right after each
  tcp reply), over the unverified run measured just before it in the same round.
- ``integrity_vs_off_128k``: over tcp (the path across hosts), serve and drive with
  ``--integrity`` (a checksum per page written at put, checked before each hit) over the
  unverified run without it. ``integrity_vs_off_shm_128k`` is the same on shm, where the
  copy runs at memory speed and the checksum's own cost shows (no target).
- ``metrics_on_vs_off_tcp_128k``: over tcp, serve and drive each serving their Prometheus
  metrics (``--metrics-addr 127.0.0.1:0``, not scraped: the cost of having it on) over the
  unverified run without them, measured just before it in the same round.
  ``latency_4k_cached_metrics_vs_off``: the cached 4 KiB GET's p50 with the metrics on over the
  same GET without them (at most; the per-batch record where a batch is shortest).

- ``latency_4k_uncached_vs_rtt`` / ``latency_4k_cached_vs_rtt``: the p50 of one 4 KiB GET
  (``drive --protocol tcp --batch-size 1 --page-size 4096``, one thread, one channel; the
  time of each ``get_batch_into`` call) with ``--dir-cache-ttl 0`` (every GET asks the
  directory, then reads) and with the location cached, over the p50 round trip of
  ``sockperf ping-pong --tcp -m 4096 --full-rtt`` between the same two network namespaces,
  measured just before them in the same round. Targets are upper bounds (``at_most``).
  drive's tcp client polls its socket for each reply (up to 50 µs, ``--tcp-poll-us``) before it
  sleeps, and sockperf's client sleeps in epoll_wait; so two more figures give each GET a
  baseline that waits the way it does (no targets): ``latency_4k_{cached,uncached}_vs_busy_rtt``
  over sockperf with a polling client (``--nonblocked --timeout 0``), and
  ``latency_4k_cached_sleep_vs_rtt``, the cached GET with ``--tcp-poll-us 0``, over sockperf's default.

- ``hicache_v1_vs_drive_128k``: SGLang HiCache's zero-copy read, ``PeerCacheStore.batch_get_v1``
  of 128 pages of 128 KiB (SGLang's storage batch) into a page_first host KV pool
  (``python -m peercache.bench.hicache_drive drive``: drive's loop, window and document, each
  batch read through the store) against ``drive`` at the same geometry over shm, against the
  same kind of ``serve``, drive measured just before it in the same round.

- ``dir_lookups_embedded_128``: directory lookups per second (keys/s, the ``ops/s`` of its
  rows) at a batch of 128 keys, ``python -m peercache.bench.dirbench --directory 127.0.0.1:P
  --path node``: a producer node hosting the embedded directory publishes 16384 keys, then 2
  client processes, one lookup in flight each, look up random batches (no cache) as a consumer
  Node resolves the keys of a read: the directory's one-sided table first (one native read of
  the buckets), the lookup op for what it cannot answer. Target: at least.
  ``dir_lookups_embedded_rpc_128`` (no target) is the same with ``--path rpc``: the lookup op alone.
- ``dir_lookups_embedded_rpc_16384``: the lookup op alone with big requests, as a consumer's lookup of
  many keys sends them (it splits them into requests of up to ``max_keys_per_request``, 65536):
  ``--path rpc --batch 16384 --clients 1``, each batch every one of the 16384 published keys in a random
  order, one request. Target: at least 5e5 keys/s, a million keys in 2 s; the unit test that held that
  bound (tests/engine/rpc/test_hardening_control.py) failed whenever the suite shared the machine.
- ``dir_lookups_redis_vs_mget_128``: the same dirbench against the Redis backend
  (``--directory redis://127.0.0.1:P/0``) over ``redis-benchmark -c 2 -P 1 -r 16384 --csv MGET``
  of 128 random keys out of 16384 stored ones (56-byte values, the size of the backend's records,
  under its own entry names), as dirbench's clients draw theirs, on the same redis-server (one
  per bench run, started and stopped by ``peercache.lab.launch.redis``, emptied before each
  point), measured just before it in the same round; equal concurrency: 2 client processes
  against 2 connections, one request in flight on each. The server's keyspace_hits/misses
  must show that every key redis-benchmark read was stored. ``dir_lookups_redis_vs_mget_fixed_128``
  (no target) is over redis-benchmark's MGET of the same 128 keys every time, which stay hot in
  redis-server's caches (about a third of the server CPU per MGET): shown, not the limit.

- ``get_batch_outs_vs_copy_4k``: the library's zero-copy batch read, ``Client.get_batch(keys, outs)`` (a
  caller's buffer per key, as a serving engine reads), over its copying form ``Client.get_batch(keys)``
  measured just before it in the same round: batches of 32 random 4 KiB pages over shm from a serve,
  directory cached, one thread (``node_api`` points with ``api: client`` and ``api: client_outs``:
  ``peercache.lab.tools.nodeloop``; pages/s of each; every key a hit of the right length, then a
  verified pass).

Ratios come from paired rounds: each round's PeerCache figure over the baseline measured
just before it (in the same round); the median of those per-round ratios, with min and max.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import pandas as pd

from peercache import atomic
from peercache.bench import meta
from peercache.lab import tidy
from peercache.lab.analysis import collect
from peercache.lab.analysis.references import apply_verdicts, load_bench_targets
from peercache.lab.pipeline import experiments, runpoint

BENCH_DIR = experiments.EXPERIMENTS_DIR / "bench"
SCENARIOS_FILE = BENCH_DIR / "scenarios.yaml"
TESTBED_FILE = BENCH_DIR / "testbed.yaml"
SCENARIO = "bench"

#: figure (a part of the bench scenario) -> (metric of its rows, unit it is reported in).
FIGURES: dict[str, tuple[str, str]] = {
    "memcpy_128k": ("bw", "GB/s"),
    "peercache_shm_128k": ("get_throughput", "GB/s"),
    "peercache_shm_verified_128k": ("get_throughput", "GB/s"),
    "peercache_shm_integrity_128k": ("get_throughput", "GB/s"),
    "iperf3_tcp_128k": ("bw", "GB/s"),
    "mooncake_tcp_128k": ("get_throughput", "GB/s"),
    "nixl_tcp_128k": ("get_throughput", "GB/s"),
    "peercache_tcp_128k": ("get_throughput", "GB/s"),
    "peercache_tcp_verified_128k": ("get_throughput", "GB/s"),
    "peercache_tcp_integrity_128k": ("get_throughput", "GB/s"),
    "peercache_tcp_metrics_128k": ("get_throughput", "GB/s"),
    "node_api_pages_per_s_64b": ("pages_per_s", "pages/s"),
    "drive_pages_per_s_64b": ("pages_per_s", "pages/s"),
    "drive_shm_128k_b128": ("get_throughput", "GB/s"),
    "hicache_v1_shm_128k": ("get_throughput", "GB/s"),
    "sockperf_tcp_4k": ("rtt_p50", "us"),
    "sockperf_tcp_4k_busy": ("rtt_p50", "us"),
    "peercache_tcp_4k_cached_sleep": ("latency_p50", "us"),
    "peercache_tcp_4k_uncached": ("latency_p50", "us"),
    "peercache_tcp_4k_cached": ("latency_p50", "us"),
    "peercache_tcp_4k_cached_metrics": ("latency_p50", "us"),
    "dirlookup_embedded_128": ("keys_per_s", "ops/s"),
    "dirlookup_embedded_rpc_128": ("keys_per_s", "ops/s"),
    "dirlookup_embedded_rpc_16384": ("keys_per_s", "ops/s"),
    "redis_mget_128": ("keys_per_s", "ops/s"),
    "redis_mget_128_fixed": ("keys_per_s", "ops/s"),
    "dirlookup_redis_128": ("keys_per_s", "ops/s"),
    "get_batch_copy_4k": ("pages_per_s", "pages/s"),
    "get_batch_outs_4k": ("pages_per_s", "pages/s"),
}
#: part -> another metric of its rows printed beside its figure (median and rounds), with its unit.
ALSO: dict[str, tuple[str, str]] = {"node_api_pages_per_s_64b": ("cpu_ns_per_page", "ns")}
#: ratio -> (PeerCache figure, baseline figure measured just before it in each round; None: the figure itself).
RATIOS: dict[str, tuple[str, str | None]] = {
    "shm_vs_memcpy_128k": ("peercache_shm_128k", "memcpy_128k"),
    "tcp_vs_iperf3_128k": ("peercache_tcp_128k", "iperf3_tcp_128k"),
    "ours_vs_mooncake_tcp_128k": ("peercache_tcp_128k", "mooncake_tcp_128k"),
    "ours_vs_nixl_tcp_128k": ("peercache_tcp_128k", "nixl_tcp_128k"),
    "verify_vs_noverify_shm_128k": ("peercache_shm_verified_128k", "peercache_shm_128k"),
    "verify_vs_noverify_tcp_128k": ("peercache_tcp_verified_128k", "peercache_tcp_128k"),
    "integrity_vs_off_128k": ("peercache_tcp_integrity_128k", "peercache_tcp_128k"),
    "integrity_vs_off_shm_128k": ("peercache_shm_integrity_128k", "peercache_shm_128k"),
    "metrics_on_vs_off_tcp_128k": ("peercache_tcp_metrics_128k", "peercache_tcp_128k"),
    "pages_per_s_64b": ("node_api_pages_per_s_64b", None),
    "hicache_v1_vs_drive_128k": ("hicache_v1_shm_128k", "drive_shm_128k_b128"),
    "latency_4k_uncached_vs_rtt": ("peercache_tcp_4k_uncached", "sockperf_tcp_4k"),
    "latency_4k_cached_vs_rtt": ("peercache_tcp_4k_cached", "sockperf_tcp_4k"),
    "latency_4k_uncached_vs_busy_rtt": ("peercache_tcp_4k_uncached", "sockperf_tcp_4k_busy"),
    "latency_4k_cached_vs_busy_rtt": ("peercache_tcp_4k_cached", "sockperf_tcp_4k_busy"),
    "latency_4k_cached_sleep_vs_rtt": ("peercache_tcp_4k_cached_sleep", "sockperf_tcp_4k"),
    "latency_4k_cached_metrics_vs_off": ("peercache_tcp_4k_cached_metrics", "peercache_tcp_4k_cached"),
    "dir_lookups_embedded_128": ("dirlookup_embedded_128", None),
    "dir_lookups_embedded_rpc_128": ("dirlookup_embedded_rpc_128", None),
    "dir_lookups_embedded_rpc_16384": ("dirlookup_embedded_rpc_16384", None),
    "dir_lookups_redis_vs_mget_128": ("dirlookup_redis_128", "redis_mget_128"),
    "dir_lookups_redis_vs_mget_fixed_128": ("dirlookup_redis_128", "redis_mget_128_fixed"),
    "get_batch_outs_vs_copy_4k": ("get_batch_outs_4k", "get_batch_copy_4k"),
}
#: latency breakdown -> the get_trace part behind it (``--only latency_breakdown`` runs just these)
BREAKDOWNS: dict[str, str] = {"tcp_4k_cached": "trace_tcp_4k_cached", "tcp_4k_uncached": "trace_tcp_4k_uncached"}
ONLY_BREAKDOWN = "latency_breakdown"
#: ``check`` line -> the verified part behind it.
CHECKS: dict[str, str] = {"shm_128k": "shm_128k_check", "tcp_128k": "tcp_128k_check",
                          "node_64b": "node_api_pages_per_s_64b"}
#: Run order: parts measured once, or round by round (a round runs its parts back to back, baseline first).
STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("once", ("shm_128k_check",)),
    ("rounds", ("memcpy_128k", "peercache_shm_128k", "peercache_shm_verified_128k",
                "peercache_shm_integrity_128k")),
    ("once", ("tcp_128k_check",)),
    # each metrics-on twin right after the run without it: its target is the tightest of its round, and
    # drift between runs a few apart was the larger error (docs/performance.md)
    ("rounds", ("mooncake_tcp_128k", "nixl_tcp_128k", "iperf3_tcp_128k", "peercache_tcp_128k",
                "peercache_tcp_metrics_128k", "peercache_tcp_verified_128k", "peercache_tcp_integrity_128k")),
    ("rounds", ("node_api_pages_per_s_64b",)),
    ("rounds", ("get_batch_copy_4k", "get_batch_outs_4k")),
    ("rounds", ("drive_shm_128k_b128", "hicache_v1_shm_128k")),
    ("rounds", ("sockperf_tcp_4k", "sockperf_tcp_4k_busy", "peercache_tcp_4k_uncached", "peercache_tcp_4k_cached",
                "peercache_tcp_4k_cached_metrics", "peercache_tcp_4k_cached_sleep")),
    ("rounds", ("dirlookup_embedded_128", "dirlookup_embedded_rpc_128", "dirlookup_embedded_rpc_16384",
                "redis_mget_128_fixed", "redis_mget_128", "dirlookup_redis_128")),
    ("once", ("drive_pages_per_s_64b",)),
    ("once", tuple(BREAKDOWNS.values())),
)


class BenchError(RuntimeError):
    """One measurement could not be made; the message says which and why."""


@dataclasses.dataclass
class BenchPlan:
    """The bench testbed, its points by part, and the run order."""

    testbed: experiments.Testbed
    points: dict[str, experiments.Point]
    schedule: list[tuple[experiments.Point, int]]


def plan(rounds: int, duration: float, warmup: float, scenarios_file: Path = SCENARIOS_FILE,
         testbed_file: Path = TESTBED_FILE, only: list[str] | None = None) -> BenchPlan:
    """The bench's points (one per part) and their run order for ``rounds`` paired rounds; nothing runs.

    ``only``: ratio names; the schedule keeps just the parts behind them (``--only``, a quick look)."""
    sc = experiments.load_scenarios(scenarios_file, forms=("local",))
    tb = experiments.load_testbed(testbed_file, sc)
    tb.doc.update(duration=duration, warmup=warmup, repetitions=rounds)
    by_part: dict[str, experiments.Point] = {}
    for p in experiments.expand(tb, sc):
        if p.part in by_part:
            raise experiments.DefinitionError(f"{scenarios_file}: field '{SCENARIO}.local.{p.part}': the bench "
                                              "takes one point per part; give each parameter one value")
        by_part[p.part] = p
    named = set(FIGURES) | {x for pc, base in RATIOS.values() for x in (pc, base) if x} | set(CHECKS.values()) \
        | {part for _, parts in STAGES for part in parts} | set(BREAKDOWNS.values())
    missing = sorted(named - set(by_part))
    if missing:
        raise experiments.DefinitionError(f"{scenarios_file}: field '{SCENARIO}.local': no part(s) {missing}, "
                                          f"which peercache.lab.ratios measures (it has {sorted(by_part)})")
    schedule: list[tuple[experiments.Point, int]] = []
    for how, parts in STAGES:
        for r in range(rounds if how == "rounds" else 1):
            schedule += [(by_part[part], r) for part in parts]
    if only:
        unknown = sorted(set(only) - set(RATIOS) - {ONLY_BREAKDOWN})
        if unknown:
            raise experiments.DefinitionError(f"--only: no ratio(s) {unknown}; the bench's ratios are {sorted(RATIOS)}, "
                                              f"and {ONLY_BREAKDOWN} its latency breakdown")
        keep = {x for name in only if name != ONLY_BREAKDOWN for x in RATIOS[name] if x}
        if ONLY_BREAKDOWN in only:
            keep |= set(BREAKDOWNS.values())
        schedule = [(pt, r) for pt, r in schedule if pt.part in keep]
    return BenchPlan(tb, by_part, schedule)


def figure(rows: list[tidy.Row], part: str) -> float:
    """The figure of one point's rows in the unit the bench reports it in (best NUMA node for memcpy)."""
    metric, unit = FIGURES[part]
    ok = [r for r in rows if r.metric == metric and r.status == "ok" and r.value is not None]
    if not ok:
        bad = [r.reason for r in rows if r.status == "failed"] or ["no such row"]
        raise BenchError(f"{part}: no {metric} measured: {bad[0]}")
    return max(tidy.convert(r.value, r.unit, unit) for r in ok)


def check_line(name: str, rows: list[tidy.Row]) -> str:
    """A ``check`` line from a verified point's rows."""
    val = {r.metric: r.value for r in rows if r.value is not None}
    failed = any(r.status == "failed" for r in rows)
    if name == "node_64b":
        keys, fails = int(val.get("verified_keys", 0)), int(val.get("verify_failures", 0))
        status = "ok" if not failed and keys and not fails else "failed"
        return f"check {name} verify=on keys={keys} failures={fails} status={status}"
    hit = val.get("hit_rate")
    fails = int(val.get("verify_failures", 0))
    status = "ok" if not failed and "keys" in val and not fails else "failed"
    return (f"check {name} verify=on keys={int(val.get('keys', 0))} hit_rate={hit} "
            f"errors={int(val.get('errors', 0))} verify_failures={fails} status={status}")


def paired(res: dict, name: str, pc: str, base: str) -> None:
    """A ratio from paired rounds: each round's PeerCache figure over the baseline measured just before it;
    the median of those per-round ratios, with their min and max (the raw figures: medians too)."""
    per = res["rounds"]
    each = [a / b for a, b in zip(per[pc], per[base], strict=True) if b > 0]
    if not each:
        raise BenchError(f"{name}: the baseline {base} measured 0 in every round")
    res["raw"][base] = round(statistics.median(per[base]), 4)
    res["raw"][pc] = round(statistics.median(per[pc]), 4)
    res["ratios"][name] = {"median": statistics.median(each), "min": min(each), "max": max(each),
                           "rounds": len(each), "each": [round(x, 4) for x in each]}


def single(res: dict, name: str, part: str) -> None:
    """A "ratio" that is the figure itself (pages/s): median of its rounds, with min and max."""
    vals = res["rounds"][part]
    res["raw"][part] = round(statistics.median(vals))
    res["ratios"][name] = {"median": statistics.median(vals), "min": min(vals), "max": max(vals),
                           "rounds": len(vals)}


def summarise(res: dict, point_rows: dict[tuple[str, int], list[tidy.Row]], rounds: int,
              only: list[str] | None = None) -> None:
    """Fill ``res`` (raw, rounds, ratios, checks) from every point's rows (``only``: just those ratios)."""
    in_rounds = {part for how, parts in STAGES if how == "rounds" for part in parts}
    measured = {part for part, _ in point_rows}
    for part in FIGURES:
        if only and part not in measured:
            continue
        reps = sorted(k for p, k in point_rows if p == part)
        vals = [figure(point_rows[(part, k)], part) for k in reps]
        if part in in_rounds:
            res["rounds"][part] = [round(v, 4) for v in vals]
        else:
            res["raw"][part] = round(vals[0], 4) if FIGURES[part][1] == "GB/s" else round(vals[0])
    for name, part in CHECKS.items():
        if only and part not in measured:
            continue
        reps = sorted(k for p, k in point_rows if p == part)
        res["checks"].append(check_line(name, point_rows[(part, reps[-1])]))
    for part, (metric, unit) in ALSO.items():
        vals = [r.value for k in sorted(k for p, k in point_rows if p == part) for r in point_rows[(part, k)]
                if r.metric == metric and r.status == "ok" and r.value is not None]
        if vals:
            res.setdefault("also", {})[f"{part}.{metric}"] = {"median": statistics.median(vals), "unit": unit,
                                                             "rounds": [round(v, 2) for v in vals]}
    for name, part in BREAKDOWNS.items():
        if (part, 0) in point_rows:
            res.setdefault("breakdowns", {})[name] = breakdown_of(point_rows[(part, 0)], part)
    for name, (pc, base) in RATIOS.items():
        if only and name not in only:
            continue
        if base is None:
            single(res, name, pc)
        else:
            paired(res, name, pc, base)
    # raw lines in figure order (as the bench always printed them)
    res["raw"] = {k: res["raw"][k] for k in FIGURES if k in res["raw"]}


def breakdown_of(rows: list[tidy.Row], part: str) -> dict:
    """A get_trace point's breakdown from its rows: the untraced and traced p50 and each part's p50 and share."""
    val = {r.metric: r.value for r in rows if r.status == "ok" and r.metric in ("latency_p50", "traced_p50")}
    if "latency_p50" not in val:
        bad = [r.reason for r in rows if r.status == "failed"] or ["no such row"]
        raise BenchError(f"{part}: no latency breakdown measured: {bad[0]}")
    parts = [{"label": r.extra["label"], "segment": r.extra["segment"], "p50_us": r.value, "share": r.extra["share"]}
             for r in rows if r.metric == "part_p50" and r.status == "ok"]   # share None: within the part above
    joined = next((r.extra.get("joined") for r in rows if r.metric == "traced_p50"), None)
    return {"untraced_p50_us": val["latency_p50"], "traced_p50_us": val.get("traced_p50"), "joined": joined,
            "parts": parts}


def breakdown_lines(name: str, b: dict) -> list[str]:
    """The printed table of one breakdown: a header line, then one line per part (µs, share)."""
    out = [f"breakdown {name}: p50 {b['untraced_p50_us']:.1f} us untraced, {b['traced_p50_us']:.1f} us traced "
           f"(parts: p50 of each over the {b['joined']} GETs whose points came in the usual order)"]
    out += [f"  {p['p50_us']:6.2f} us {100 * p['share']:5.1f} %  {p['label']}" if p["share"] is not None
            else f"  ({p['p50_us']:5.2f} us)          {p['label']}" for p in b["parts"]]
    return out


def ratio_rows(res: dict, run_id: str, targets: dict[str, float],
               at_most: dict[str, float] | None = None) -> pd.DataFrame:
    """One tidy row per ratio with its verdict against the references' ``bench_targets``
    (``targets``: at least; ``at_most``: at most, a latency over its baseline)."""
    out = []
    at_most = at_most or {}
    for name, v in res["ratios"].items():
        pc, base = RATIOS[name]
        t, most = (at_most[name], True) if name in at_most else (targets.get(name), False)
        if t is None:
            verdict = "unchecked"
        elif most:
            verdict = "ok" if v["median"] <= t else "high"
        else:
            verdict = "ok" if v["median"] >= t else "low"
        op = {("ok", False): ">=", ("low", False): "<", ("ok", True): "<=", ("high", True): ">"}.get((verdict, most))
        why = (f"no bench_targets.{name} in the references" if t is None else
               f"median {v['median']:.4g} {op} target {t:g} (bench_targets.{name})")
        row = tidy.Row(experiment=SCENARIO, testbed=SCENARIO, scenario=SCENARIO, run_id=run_id, metric=name,
                       value=float(v["median"]), unit="ratio" if base else FIGURES[pc][1], side="aggregate",
                       tool="peercache.lab.ratios",
                       extra={"min": v["min"], "max": v["max"], "rounds": v["rounds"], "each": v.get("each"),
                              "peercache": pc, "baseline": base,
                              ("target_at_most" if most else "target_at_least"): t})
        out.append(dict(row.to_dict(), verdict=verdict, verdict_reason=why))
    return pd.DataFrame(out)


def write_tidy(run_dir: Path, point_rows: dict, res: dict | None, targets: dict[str, float],
               at_most: dict[str, float] | None = None) -> Path:
    """results/bench/<run>/rows.parquet (every point's rows and the ratios, with verdicts) and runs.parquet."""
    metas = [tidy.read_result(p)[0] for p in sorted(run_dir.rglob(tidy.RESULT_FILE))]
    rows = collect.normalize_rows(collect.rows_frame(r for rs in point_rows.values() for r in rs))
    rows = apply_verdicts(rows, {})
    if res is not None and res["ratios"]:
        rr = ratio_rows(res, f"{SCENARIO}/{run_dir.name}/ratios", targets, at_most)
        rows = pd.concat([rows, collect.normalize_rows(rr).assign(verdict=rr["verdict"].values,
                                                                   verdict_reason=rr["verdict_reason"].values)],
                         ignore_index=True)
    with atomic.replacing(run_dir / "rows.parquet") as tmp:
        rows.to_parquet(tmp, index=False)
    with atomic.replacing(run_dir / "runs.parquet") as tmp:
        collect.runs_frame(metas).to_parquet(tmp, index=False)
    return run_dir


def path_notes(pair: runpoint.TestbedHosts) -> list[str]:
    """The ``#`` lines saying where the tcp parts ran: the namespace pair and each side's CPUs, or loopback
    and why (no root); and the hosts' note (CPUs this machine lacks)."""
    if pair.producer.kind != "netns":
        return [f"tcp over loopback 127.0.0.1, not netns: {pair.note}"]
    cpus = ", ".join(f"{role} on CPU {h.cpus}" if h.cpus else f"{role} unpinned"
                     for role, h in (("producer", pair.producer), ("consumer", pair.consumer)))
    return [f"tcp path: netns {pair.producer.name} ({pair.producer_addr}) -> {pair.consumer.name} "
            f"({pair.consumer_addr}) over veth; {cpus}"] + ([pair.note] if pair.note else [])


def run(bp: BenchPlan, run_dir: Path, log=print) -> tuple[dict, dict]:
    """Every point of the plan in order on the bench testbed's hosts; (summary, {(part, round): rows})."""
    res: dict = {"ratios": {}, "raw": {}, "rounds": {}, "checks": [], "notes": [], "breakdowns": {}}
    point_rows: dict[tuple[str, int], list[tidy.Row]] = {}
    tb = bp.testbed
    # The netns pair only when a scheduled part uses it (an --only run of loopback parts leaves it alone);
    # one redis-server for the run's Redis points (the MGET limit and the backend on the same server).
    on_loopback = all(pt.loopback for pt, _ in bp.schedule)
    with runpoint.testbed_hosts(tb, loopback=on_loopback) as pair, runpoint.testbed_hosts(tb, loopback=True) as lo, \
            runpoint.shared_redis():
        if not on_loopback:
            res["notes"] += path_notes(pair)
        for pt, k in bp.schedule:
            out = run_dir / pt.scenario / pt.name / f"rep{k}" / tidy.RESULT_FILE
            point_rows[(pt.part, k)] = runpoint.run_point(tb, pt, k, out, hosts=lo if pt.loopback else pair,
                                                          quiet=True)
    return res, point_rows


def _run_name() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + f"-{os.getpid()}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m peercache.lab.ratios", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=3.0, help="measured seconds per figure [%(default)s]")
    p.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each [%(default)s]")
    p.add_argument("--rounds", type=int, default=3,
                   help="paired rounds (baseline, then PeerCache); the median of the per-round ratios is "
                        "reported with min and max [%(default)s]")
    p.add_argument("--results", default="results/bench",
                   help="folder of the bench's runs; this run goes in <results>/<UTC time>-<pid>/ [%(default)s]")
    p.add_argument("--out", default=None, help="also write the JSON document here")
    p.add_argument("--only", default=None, metavar="RATIO,...",
                   help="run only the parts behind these ratios (a quick look; `make bench` runs them all)")
    args = p.parse_args(argv)
    only = [x for x in (args.only or "").split(",") if x] or None
    if args.duration <= 0 or args.duration > 30 or args.warmup < 0 or args.warmup > 10:
        p.error("--duration must be in (0, 30] and --warmup in [0, 10] seconds")
    if not 1 <= args.rounds <= 5:
        p.error("--rounds must be 1..5 (the whole bench must stay well under 5 minutes)")
    try:
        bp = plan(args.rounds, args.duration, args.warmup, only=only)
        targets = load_bench_targets()
        at_most = load_bench_targets(bound="at_most")
    except (experiments.DefinitionError, ValueError) as e:
        print(f"bench: invalid definition: {e}", file=sys.stderr)
        return 2
    host = meta.host_block()
    print(f"# {host['host']} ({host.get('cpu')}), {os.cpu_count()} cores, kernel {platform.release()}, "
          f"python {platform.python_version()}, rev {meta.git_revision()}, start {meta.now_iso()}")
    print(f"# throughput figures: verification off except the *_verified ones, {args.duration:g} s after "
          f"{args.warmup:g} s warm-up, {args.rounds} paired rounds, ratio = median of the per-round ratios; "
          "check lines: verification on", flush=True)
    t0 = time.monotonic()
    run_dir = Path(args.results) / _run_name()
    run_dir.mkdir(parents=True, exist_ok=True)
    res, point_rows = None, {}
    try:
        res, point_rows = run(bp, run_dir)
        summarise(res, point_rows, args.rounds, only)
    except BenchError as e:
        print(f"bench: FAILED: {e} (logs and results: {run_dir})", file=sys.stderr)
        write_tidy(run_dir, point_rows, None, targets, at_most)
        return 1
    write_tidy(run_dir, point_rows, res, targets, at_most)
    for line in res["checks"]:
        print(line)
    for n in res["notes"]:
        print(f"# {n}")
    for k, v in res["raw"].items():
        rounds = res["rounds"].get(k)
        print(f"raw {k} {v} {FIGURES[k][1]}" + (f" rounds={','.join(str(x) for x in rounds)}" if rounds else ""))
    for k, v in res.get("also", {}).items():
        print(f"raw {k} {v['median']:.1f} {v['unit']} rounds={','.join(str(x) for x in v['rounds'])}")
    for k, v in res["ratios"].items():
        fmt = (lambda x: f"{x:.3f}") if v["median"] < 100 else (lambda x: f"{x:.4g}")
        print(f"ratio {k} {fmt(v['median'])} (median of {v['rounds']} paired rounds; min {fmt(v['min'])}, "
              f"max {fmt(v['max'])})")
        t = targets.get(k)
        if k in at_most:
            print(f"#   target <= {at_most[k]:g} (data/reference/references.yaml): "
                  f"{'met' if v['median'] <= at_most[k] else 'NOT met'}")
        elif t is None:
            print(f"#   no target for {k} in the references")
        else:
            print(f"#   target >= {t:g} (data/reference/references.yaml): "
                  f"{'met' if v['median'] >= t else 'NOT met'}")
    for k, b in res.get("breakdowns", {}).items():
        for line in breakdown_lines(k, b):
            print(line)
    print(f"# results: {run_dir}/ (rows.parquet, runs.parquet, one folder per point)")
    print(f"# bench took {time.monotonic() - t0:.0f} s")
    doc = dict(res, meta={**host, "git_revision": meta.git_revision(), "end": meta.now_iso(),
                          "duration": args.duration, "warmup": args.warmup, "results": str(run_dir)})
    atomic.write_text(run_dir / "bench.json", json.dumps(doc, indent=1))
    if args.out:
        atomic.write_text(args.out, json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
