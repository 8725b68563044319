"""One point of a drive from what its driver processes counted in one shared window: the DrivePoint of
:mod:`peercache.bench.document`."""
from __future__ import annotations

from ...transport.base import Transport
from .. import options
from ..document import DrivePoint
from .config import DriveConfig
from .stats import ThreadStats, percentiles
from .bounds import IO_TIMEOUT_S, RDMA_COMPLETION_S
from .timeline import document as timeline_document


def merge_rails(per_process: list[list[dict]]) -> list[dict]:
    """The rails of one point over all driver processes (by device name): counts summed, ``state`` "up"
    only where every process saw it up, ``share`` each rail's part of all bytes read."""
    merged: dict[str, dict] = {}
    for rails in per_process:
        for r in rails:
            m = merged.setdefault(r["rail"], {"rail": r["rail"], "state": "up", "share": None,
                                              **dict.fromkeys(Transport.RAIL_COUNTS, 0), "completion_errors": {}})
            for k in Transport.RAIL_COUNTS:
                m[k] += r[k]
            for k, n in r["completion_errors"].items():
                m["completion_errors"][k] = m["completion_errors"].get(k, 0) + n
            if r["state"] != "up":
                m["state"] = "down"
    total = sum(m["bytes_read"] for m in merged.values())
    for m in merged.values():
        m["share"] = round(m["bytes_read"] / total, 4) if total else None
    return list(merged.values())


def get_bound(cfg: DriveConfig) -> float:
    """The longest one GET may take before it fails (the worker gives the node this bound): a thread stalls
    no longer than this on a fault (--faults-expected)."""
    return IO_TIMEOUT_S * cfg.time_scale + (RDMA_COMPLETION_S if cfg.node.protocol == "rdma" else 0.0)


def aggregate(conc: int, cfg: DriveConfig, results: list[dict]) -> DrivePoint:
    """One point from the per-process results of one shared window (its window is placed by run)."""
    total = ThreadStats()
    aborts = []
    for r in results:
        total.add(ThreadStats(**r["stats"]))
        aborts += r["abort"]
    dur = cfg.duration
    objs = options.objects_per_page(cfg.layout)
    get = cfg.op == "get"
    # A directory entry that points at another key's slot is a miss, never those bytes; but the
    # directory is corrupt (or written by someone who should not), so nothing it measured stands.
    # --faults-expected: errors (producers going away) are counted and reported, not a failure; a wrong
    # page, a redirected entry, an aborted thread or nothing measured still fails the point.
    errors_fail = total.errors > 0 and not cfg.faults_expected
    failed = bool(aborts) or errors_fail or total.verify_failures > 0 or total.batches == 0 \
        or total.first_redirect is not None
    reason = aborts[0] if aborts else total.first_error if not cfg.faults_expected else None
    if reason is None and total.verify_failures:
        reason = f"{total.verify_failures} page(s) read as hits had wrong contents"
    if reason is None and total.first_redirect is not None:
        reason = total.first_redirect
    if reason is None and total.batches == 0:
        reason = (f"no batch completed inside the {dur:g} s measurement window; nothing was measured "
                  "(is a batch slower than the window? see the driver log)")
    return DrivePoint(
        concurrency=conc, processes=cfg.processes, threads=conc * cfg.processes,
        batch_size=cfg.batch_size, page_size=cfg.page_size, duration_s=dur,
        bytes=total.bytes, batches=total.batches,
        gb_per_s=round(total.bytes / dur / 1e9, 4) if get else None,
        pages_per_s=round(total.hits / objs / dur, 1),
        objects_per_s=round(total.hits / dur, 1),
        latency_us=percentiles(total.latencies),
        latency_samples=len(total.latencies), latency_batches=total.latency_seen,
        hit_rate=round(total.hits / total.keys, 6) if total.keys else None,
        keys=total.keys, errors=total.errors, verify_failures=total.verify_failures,
        redirected=total.redirected,
        bytes_by_prefix=(dict(zip(cfg.key_prefixes, total.bytes_by_prefix))
                         if total.bytes_by_prefix else None),
        verified=bool(cfg.verify and get),
        # per rail over the window (rdma; [] otherwise): bytes and share, READs, errors, downs and ups
        rails=merge_rails([r.get("rails", []) for r in results]),
        status="failed" if failed else "ok", reason=reason if failed else None,
        first_error=total.first_error if cfg.faults_expected and total.errors else None,
        timeline=timeline_document(total.timeline, fault_bound_s=get_bound(cfg)),
    )
