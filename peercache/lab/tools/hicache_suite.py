"""The HiCache-faithful suite (``python -m peercache.bench.hicache_drive suite``): its command line, and a strict
parser of the result document it writes with ``--out``.

The suite drives one rank's ``PeerCacheStore`` against a running ``peercache-bench serve`` as SGLang's cache
controller does: ``get`` (``batch_get_v1`` into the host KV pool), ``set`` (``batch_set_v1``, the backup
path) and ``exists`` (``batch_exists``), each swept over a list of concurrencies, with the PEAK point of
each op named in the document. Its human table goes to stdout; the lab reads only the JSON document.

What the document gives per point: calls, pages, pages/s, tokens/s, GB/s (pages that arrived or were
stored, 10^9 bytes per second; none for exists, which moves no page bytes), p50/p99/p999 of one batch call
in µs, misses, errors and verify failures, and the measured window (epoch seconds). The parser checks every
figure against the counts it comes from and the PEAK against the point it names; it never fills in a value.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from peercache.bench.document import SUITE_MODE, DocumentError, SuiteDocument
from peercache.lab.errors import ParseError
from peercache.lab.tidy import Row

#: The ``tool`` column of the suite's rows.
TOOL = "peercache-hicache-suite"
#: The consumer's module (``python -m MODULE suite ...``).
MODULE = "peercache.bench.hicache_drive"
#: The document's mode, as the engine declares it (peercache.bench.document, whose schema version the parser
#: checks on every read).
MODE = SUITE_MODE
#: op -> the HiCacheStorage call it makes, as the document names them (its order: the suite's default).
CALLS = {"get": "batch_get_v1", "set": "batch_set_v1", "exists": "batch_exists"}
OPS = tuple(CALLS)
POINT_STATUSES = ("ok", "failed", "skipped")
#: metric -> unit of the rows of one point (the kind's declaration takes them from here).
METRICS = {"store_pages_per_s": "pages/s", "store_tokens_per_s": "tokens/s", "store_throughput": "GB/s",
           "latency_p50": "us", "latency_p99": "us", "latency_p999": "us", "misses": "count",
           "errors": "count", "verify_failures": "count"}
#: The headline metric: every op has pages/s (exists moves no bytes, so no GB/s).
PRIMARY = "store_pages_per_s"
#: Fields of the document's meta block the lab reads (name -> type).
META_FIELDS = {"protocol": str, "layout": str, "objects_per_page": int, "object_bytes": int, "page_tokens": int,
               "batch_size": int, "concurrencies": list, "ops": list, "tp_rank": int, "tp_size": int,
               "is_storage_writer": bool, "verify": bool, "store_base": str}
#: Fields of every point (name -> type; None allowed where the second element says so).
POINT_FIELDS = {"op": (str, False), "call": (str, False), "threads": (int, False), "batch_size": (int, False),
                "calls": (int, False), "seconds": ((int, float), False), "pages": (int, False),
                "tokens": (int, False), "bytes": (int, False), "pages_per_s": ((int, float), False),
                "tokens_per_s": ((int, float), False), "gb_per_s": ((int, float), True),
                "latency_us": (dict, False), "misses": (int, False), "errors": (int, False),
                "verify_failures": (int, False), "verified": (bool, False), "status": (str, False),
                "reason": (str, True), "window_start": ((int, float), True), "window_end": ((int, float), True)}
#: Relative tolerance of a rate against its counts (the suite rounds rates to 0.1 and GB/s to 4 decimals).
REL_TOL = 0.01


def suite_command(prefix: list[str], shared: list[str], *, batch: int, concurrencies: list[int], ops: list[str],
                  page_tokens: int, duration: float, warmup: float, out_path: str, verify: bool = True,
                  integrity: bool = False, dir_cache_ttl: float | None = None, tp_size: int = 1, tp_rank: int = 0,
                  max_calls: int | None = None, ready_timeout: float | None = None) -> list[str]:
    """argv of the suite on the consumer (pure): ``prefix`` runs ``python -m MODULE``; ``shared`` are the flags
    it shares with serve (discovery address, protocol, layout, page size, working set, devices)."""
    if not concurrencies or any(not isinstance(c, int) or isinstance(c, bool) or c < 1 for c in concurrencies):
        raise ValueError(f"concurrencies {concurrencies!r} must be a non-empty list of positive integers "
                         "(the suite's --concurrencies sweep)")
    bad = [o for o in ops if o not in CALLS]
    if not ops or bad or len(set(ops)) != len(ops):
        raise ValueError(f"ops {ops!r} must name each of {', '.join(OPS)} at most once, and at least one")
    for name, v in (("batch", batch), ("page_tokens", page_tokens), ("tp_size", tp_size)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} {v!r} must be a positive integer")
    if not 0 <= tp_rank < tp_size:
        raise ValueError(f"tp_rank {tp_rank} is not a rank of tp_size {tp_size} (0..{tp_size - 1})")
    if duration <= 0 or warmup < 0:
        raise ValueError(f"duration ({duration}) must be > 0 and warmup ({warmup}) >= 0")
    argv = [*prefix, "suite", *shared, "--batch-size", str(batch),
            "--concurrencies", ",".join(str(c) for c in concurrencies), "--ops", ",".join(ops),
            "--page-tokens", str(page_tokens), "--duration", f"{duration:g}", "--warmup", f"{warmup:g}"]
    if tp_size != 1 or tp_rank != 0:
        argv += ["--tp-size", str(tp_size), "--tp-rank", str(tp_rank)]
    if not verify:
        argv.append("--no-verify")
    if integrity:
        argv.append("--integrity")
    if dir_cache_ttl is not None:
        argv += ["--dir-cache-ttl", f"{dir_cache_ttl:g}"]
    if max_calls is not None:
        argv += ["--max-calls", str(max_calls)]
    if ready_timeout is not None:
        argv += ["--ready-timeout", f"{ready_timeout:.0f}"]
    return [*argv, "--out", out_path]


@dataclass
class SuitePoint:
    """One point of the suite: one op at one concurrency (rates over its measured window)."""

    op: str
    call: str
    threads: int
    calls: int
    seconds: float
    pages: int
    bytes: int
    pages_per_s: float
    tokens_per_s: float
    gb_per_s: float | None          #: None for exists (no page bytes move)
    latency_us: dict[str, float | None]
    misses: int
    errors: int
    verify_failures: int
    verified: bool
    status: str                     #: ok, failed or skipped (a set on a rank that is not the storage writer)
    reason: str | None
    window_start: float | None
    window_end: float | None
    peak: bool = False              #: the suite named it its op's PEAK
    roundtrip: dict[str, int] | None = None


@dataclass
class SuiteResult:
    """The suite's document: the rank's geometry and its points, in the order it ran them."""

    protocol: str
    layout: str
    object_bytes: int
    objects_per_page: int
    page_tokens: int
    batch_size: int
    tp_rank: int
    tp_size: int
    is_storage_writer: bool
    store_base: str
    status: str
    error: str | None
    points: list[SuitePoint] = field(default_factory=list)
    source: str = "<json>"


def _need(d: dict, key: str, kind, where: str, source: str, nullable: bool = False) -> Any:
    if key not in d:
        raise ParseError(TOOL, f"{where}: no {key!r} (is the consumer's peercache older than the lab?)", source=source)
    v = d[key]
    if v is None and nullable:
        return None
    if isinstance(v, bool) and kind is not bool:
        raise ParseError(TOOL, f"{where}.{key} is {v!r}, not a number", source=source)
    if not isinstance(v, kind):
        raise ParseError(TOOL, f"{where}.{key} is {type(v).__name__} {v!r}, not {kind}", source=source)
    return v


def _close(a: float, b: float, tol: float) -> bool:
    return abs(a - b) <= max(tol, REL_TOL * abs(b))


def _point(p: Any, i: int, page_tokens: int, source: str) -> SuitePoint:
    where = f"points[{i}]"
    if not isinstance(p, dict):
        raise ParseError(TOOL, f"{where} is not an object", source=source)
    for k, (kind, nullable) in POINT_FIELDS.items():
        _need(p, k, kind, where, source, nullable)
    op = p["op"]
    if op not in CALLS or p["call"] != CALLS[op]:
        raise ParseError(TOOL, f"{where}: op {op!r} with call {p['call']!r} is not one of {CALLS}", source=source)
    where = f"{where} ({op} threads={p['threads']})"
    if p["status"] not in POINT_STATUSES:
        raise ParseError(TOOL, f"{where}: status {p['status']!r} is not one of {POINT_STATUSES}", source=source)
    lat = {}
    for q in ("p50", "p99", "p999"):
        v = p["latency_us"].get(q, "absent")
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0):
            raise ParseError(TOOL, f"{where}: latency_us.{q} is {v!r}, not a positive number or null", source=source)
        lat[q] = None if v is None else float(v)
    if p["status"] != "ok":
        if not p["reason"]:
            raise ParseError(TOOL, f"{where}: status {p['status']} without a reason", source=source)
    else:
        if p["calls"] < 1 or p["seconds"] <= 0 or p["window_start"] is None or p["window_end"] is None:
            raise ParseError(TOOL, f"{where}: an ok point with {p['calls']} calls over {p['seconds']} s and window "
                                   f"{p['window_start']}..{p['window_end']}", source=source)
        if not _close(p["window_end"] - p["window_start"], p["seconds"], 1e-3):
            raise ParseError(TOOL, f"{where}: window {p['window_start']}..{p['window_end']} is not its "
                                   f"{p['seconds']} s", source=source)
        if p["tokens"] != p["pages"] * page_tokens:
            raise ParseError(TOOL, f"{where}: {p['tokens']} tokens is not {p['pages']} pages x {page_tokens} "
                                   "tokens per page", source=source)
        for name, count, tol in (("pages_per_s", p["pages"], 0.1), ("tokens_per_s", p["tokens"], 0.1),
                                 ("gb_per_s", p["bytes"] / 1e9, 1e-4)):
            if name == "gb_per_s" and op == "exists":
                if p["gb_per_s"] is not None or p["bytes"]:
                    raise ParseError(TOOL, f"{where}: exists moves no page bytes, but says {p['bytes']} B and "
                                           f"{p['gb_per_s']} GB/s", source=source)
                continue
            if p[name] is None or not _close(float(p[name]), count / p["seconds"], tol):
                raise ParseError(TOOL, f"{where}: {name} {p[name]} disagrees with its counts over "
                                       f"{p['seconds']} s ({count / p['seconds']:.4g})", source=source)
        known = [lat[q] for q in ("p50", "p99", "p999")]
        if None in known or not known[0] <= known[1] <= known[2]:
            raise ParseError(TOOL, f"{where}: latencies {lat} are not p50 <= p99 <= p999", source=source)
    rt = p.get("roundtrip")
    if rt is not None and not (isinstance(rt, dict) and all(isinstance(rt.get(k), int)
                                                            for k in ("pages", "arrived", "mismatched"))):
        raise ParseError(TOOL, f"{where}: roundtrip {rt!r} is not pages/arrived/mismatched counts", source=source)
    return SuitePoint(op=op, call=p["call"], threads=p["threads"], calls=p["calls"], seconds=float(p["seconds"]),
                      pages=p["pages"], bytes=p["bytes"], pages_per_s=float(p["pages_per_s"]),
                      tokens_per_s=float(p["tokens_per_s"]),
                      gb_per_s=None if p["gb_per_s"] is None else float(p["gb_per_s"]), latency_us=lat,
                      misses=p["misses"], errors=p["errors"], verify_failures=p["verify_failures"],
                      verified=p["verified"], status=p["status"], reason=p["reason"],
                      window_start=p["window_start"], window_end=p["window_end"], roundtrip=rt)


def parse_document(text: str, source: str = "<json>") -> SuiteResult:
    """The suite's result document; ParseError names what is missing, wrong or inconsistent."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ParseError(TOOL, f"not JSON: {e}", source=source) from None
    if not isinstance(doc, dict):
        raise ParseError(TOOL, "the document is not a JSON object", source=source)
    try:
        SuiteDocument.check(doc)        # its schema version and mode, as the engine declares them
    except DocumentError as e:
        raise ParseError(TOOL, f"{e} (did the consumer run `hicache_drive suite`?)", source=source) from None
    meta = _need(doc, "meta", dict, "document", source)
    for k, kind in META_FIELDS.items():
        _need(meta, k, kind, "meta", source)
    status = _need(doc, "status", str, "document", source)
    if status not in ("ok", "failed"):
        raise ParseError(TOOL, f"status {status!r} is not ok or failed", source=source)
    error = _need(doc, "error", str, "document", source, nullable=True)
    if status == "failed" and not error:
        raise ParseError(TOOL, "status failed without an error", source=source)
    raw = _need(doc, "points", list, "document", source)
    points = [_point(p, i, meta["page_tokens"], source) for i, p in enumerate(raw)]
    if status == "ok" and not points:
        raise ParseError(TOOL, "status ok with no point", source=source)
    ops = _need(doc, "ops", dict, "document", source)
    for op, block in ops.items():
        mine = [p for p in points if p.op == op]
        if op not in meta["ops"] or not isinstance(block, dict) or len(block.get("points") or []) != len(mine):
            raise ParseError(TOOL, f"ops.{op}: not one of meta.ops {meta['ops']} or not the {len(mine)} "
                                   f"point(s) of {op} in points", source=source)
        pk = block.get("peak")
        if pk is None:
            if any(p.status == "ok" for p in mine):
                raise ParseError(TOOL, f"ops.{op}: no PEAK although {op} has ok points", source=source)
            continue
        named = [p for p in mine if p.status == "ok" and p.threads == pk.get("threads")]
        if len(named) != 1 or not _close(named[0].pages_per_s, float(pk.get("pages_per_s", -1)), 0.1):
            raise ParseError(TOOL, f"ops.{op}.peak {pk!r} is not one ok point of {op}", source=source)
        if named[0].pages_per_s < max(p.pages_per_s for p in mine if p.status == "ok"):
            raise ParseError(TOOL, f"ops.{op}.peak (threads={pk['threads']}) is not the ok point with the most "
                                   "pages/s", source=source)
        named[0].peak = True
    missing = sorted({p.op for p in points} - set(ops))
    if missing:
        raise ParseError(TOOL, f"ops has no block for {', '.join(missing)} although points do", source=source)
    return SuiteResult(protocol=meta["protocol"], layout=meta["layout"], object_bytes=meta["object_bytes"],
                       objects_per_page=meta["objects_per_page"], page_tokens=meta["page_tokens"],
                       batch_size=meta["batch_size"], tp_rank=meta["tp_rank"], tp_size=meta["tp_size"],
                       is_storage_writer=meta["is_storage_writer"], store_base=meta["store_base"], status=status,
                       error=error, points=points, source=source)


def to_rows(res: SuiteResult, **ctx: Any) -> list[Row]:
    """The rows of every point: pages/s, tokens/s, GB/s, p50/p99/p999 per batch call, misses, errors, verify
    failures; ``extra`` says the op, its call, the window and whether the suite named the point its PEAK."""
    extra_ctx = ctx.pop("extra", {}) or {}
    rows = []
    for p in res.points:
        extra = {"op": p.op, "call": p.call, "peak": p.peak, "page_tokens": res.page_tokens,
                 "objects_per_page": res.objects_per_page, "page_bytes": res.object_bytes * res.objects_per_page,
                 "verified": p.verified, "window_start": p.window_start, "window_end": p.window_end,
                 "tp_rank": res.tp_rank, "tp_size": res.tp_size, "is_storage_writer": res.is_storage_writer,
                 "store_base": res.store_base, "latency_of": f"one {p.call} call", **extra_ctx}
        if p.roundtrip is not None:
            extra["roundtrip"] = p.roundtrip
        base = dict(ctx, layout=res.layout, size_bytes=res.object_bytes, batch=res.batch_size, threads=p.threads,
                    processes=1)
        values = {"store_pages_per_s": p.pages_per_s, "store_tokens_per_s": p.tokens_per_s,
                  "store_throughput": p.gb_per_s, **{f"latency_{q}": v for q, v in p.latency_us.items()}}
        for metric, v in values.items():
            unit = METRICS[metric]
            if p.status != "ok":
                rows.append(Row(metric=metric, value=None, unit=unit, status=p.status, reason=p.reason, extra=extra,
                                **base))
            elif v is None:
                why = ("batch_exists moves no page bytes (a directory query)" if metric == "store_throughput"
                       else "the suite reported none")
                rows.append(Row(metric=metric, value=None, unit=unit, status="not_measured", reason=why,
                                extra=extra, **base))
            else:
                rows.append(Row(metric=metric, value=v, unit=unit, raw_value=v, raw_unit=unit, extra=extra, **base))
        for metric in ("misses", "errors", "verify_failures"):
            rows.append(Row(metric=metric, value=float(getattr(p, metric)), unit="count", extra=extra, **base))
    return rows
