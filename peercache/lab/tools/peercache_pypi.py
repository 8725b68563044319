"""The published PeerCache 0.8.4 (PyPI ``peercache``): its ``peercache-bench serve`` / ``drive``, command
builders and a strict parser of drive's result document.

It installs as the same ``peercache`` package as this checkout, so it runs from a venv of its own
(``.venv-peercache-pypi``, ``make engines``). Its two-host mode: ``serve`` on the producer joins a
discovery ring it hosts, waits for ``--readers`` reader nodes, then publishes ``--working-set`` pages
through its store's ``batch_set_v1`` and idles until SIGTERM; ``drive`` on the consumer joins the ring,
waits until the pages are visible, and reads batches of ``--batch-size`` pages with ``batch_get_v1``
from ``--concurrencies`` threads for ``--warmup`` + ``--duration`` seconds. It writes a JSON report
(and a Markdown copy) into ``--out-dir`` under a time-stamped name it prints ("wrote PATH.json").

What it reports per point: GB/s (10^9 bytes over the measured window, counting only pages that hit),
pages/s, per-batch-call latency percentiles and the hit rate. It never compares the bytes it read with
what serve wrote (its drive loop only counts hits): its figures are unverified.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from peercache.lab.errors import ParseError, ToolError
from peercache.lab.tidy import Row

TOOL = "peercache-bench==0.8.4"
VERSION = "0.8.4"
VENV = ".venv-peercache-pypi"
BINARY = f"{VENV}/bin/peercache-bench"
#: serve prints this once its node is up and it waits for readers (it publishes only after they join).
SERVE_READY = r"\[serve\] waiting for \d+ reader\(s\) to join the ring"
#: drive prints where it wrote its JSON report.
_WROTE = re.compile(r"^wrote (?P<path>\S+\.json)\s*$", re.M)
PROTOCOLS = ("tcp", "rdma")
#: Fields every result of drive's document carries (name -> type).
RESULT_FIELDS = {"system": str, "path": str, "protocol": str, "block_size": int, "batch_size": int, "threads": int,
                 "duration_s": (int, float), "bytes_total": int, "throughput_gbps": (int, float),
                 "pages": int, "pages_per_s": (int, float), "hit_rate": (int, float), "ok": bool}
LATENCIES = {"latency_p50": "lat_us_p50", "latency_p99": "lat_us_p99", "latency_p999": "lat_us_p999"}


def _common(protocol: str, discovery: str, local_host: str, layout: str, page_size: int, working_set: int,
            device: str | None, gid_index: int | None) -> list[str]:
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol {protocol!r} is not one of {PROTOCOLS} (what peercache 0.8.4 offers)")
    if layout not in ("mla", "mha"):
        raise ValueError(f"layout {layout!r} is not mla or mha")
    for k, v in (("page_size", page_size), ("working_set", working_set)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{k} {v!r} must be a positive integer")
    argv = ["--discovery-addr", discovery, "--local-host", local_host, "--protocol", protocol, "--layout", layout,
            "--page-size", str(page_size), "--working-set", str(working_set)]
    if protocol == "rdma":
        if not device:
            raise ValueError("protocol rdma needs the RDMA device (--device-name); the testbed names none")
        argv += ["--device-name", device]
        if gid_index is not None:
            argv += ["--gid-index", str(int(gid_index))]
    return argv


def serve_command(binary: str, protocol: str, discovery: str, local_host: str, layout: str, page_size: int,
                  working_set: int, readers: int = 1, device: str | None = None,
                  gid_index: int | None = None, connect_timeout: float = 60.0) -> list[str]:
    """argv of serve on the producer: hosts the discovery ring at ``discovery`` (its own address:port)."""
    return [binary, "serve", *_common(protocol, discovery, local_host, layout, page_size, working_set, device,
                                      gid_index),
            "--readers", str(readers), "--connect-timeout", f"{connect_timeout:g}"]


def drive_command(binary: str, protocol: str, discovery: str, local_host: str, layout: str, page_size: int,
                  working_set: int, batch: int, threads: int, duration: float, warmup: float, out_dir: str,
                  processes: int = 1, dir_cache_ttl: float = 0.0, device: str | None = None,
                  gid_index: int | None = None, connect_timeout: float = 60.0) -> list[str]:
    """argv of drive on the consumer: one point (``threads`` concurrency) of batch_get_v1 reads."""
    if batch < 1 or threads < 1 or processes < 1 or duration <= 0 or warmup < 0:
        raise ValueError(f"batch ({batch}), threads ({threads}) and processes ({processes}) must be >= 1, "
                         f"duration ({duration}) > 0 and warmup ({warmup}) >= 0")
    return [binary, "drive", *_common(protocol, discovery, local_host, layout, page_size, working_set, device,
                                      gid_index),
            "--op", "get", "--batch-size", str(batch), "--concurrencies", str(threads),
            "--processes", str(processes), "--duration", f"{duration:g}", "--warmup", f"{warmup:g}",
            "--dir-cache-ttl", f"{dir_cache_ttl:g}", "--connect-timeout", f"{connect_timeout:g}",
            "--out-dir", out_dir]


def report_path(stdout: str, source: str = "<stdout>") -> str:
    """Where drive wrote its JSON report (its "wrote PATH.json" line); ParseError when it printed none."""
    found = _WROTE.findall(stdout)
    if len(found) != 1:
        raise ParseError(TOOL, f"expected one 'wrote PATH.json' line, found {len(found)} (did drive finish? "
                               "read its log)", source=source)
    return found[0]


def failure(stdout: str, stderr: str, host: str = "") -> ToolError | None:
    """drive's own explanation of a failed run (it exits through SystemExit with a message), as a ToolError."""
    text = stdout + "\n" + stderr
    for rx, kind, check in (
            (r"timed out after .* waiting for \d+ nodes in the ring", "cannot_connect",
             "drive could not join serve's discovery ring; is serve running and its port reachable?"),
            (r"timed out after .* waiting for the producer to publish", "failed",
             "serve did not publish its pages in time; it must run with the same --working-set/--layout/--page-size"),
            (r"reader process \d+ failed: .*", "failed", "a reader process of drive failed; read its log")):
        m = re.search(rx, text)
        if m:
            return ToolError(host=host, tool=TOOL, kind=kind, detail=m.group(0).strip(), check=check)
    return None


@dataclass
class DriveResult:
    """One point of drive's report."""

    gb_per_s: float
    pages_per_s: float
    hit_rate: float
    pages: int
    bytes_total: int
    duration_s: float
    block_size: int
    batch_size: int
    threads: int
    processes: int
    latency_us: dict[str, float | None]
    protocol: str
    layout: str
    source: str = "<json>"


def _need(d: dict, key: str, kind, where: str, source: str) -> Any:
    if key not in d:
        raise ParseError(TOOL, f"{where}: no {key!r}", source=source)
    v = d[key]
    if isinstance(v, bool) and kind is not bool:
        raise ParseError(TOOL, f"{where}.{key} is {v!r}, not a number", source=source)
    if not isinstance(v, kind):
        raise ParseError(TOOL, f"{where}.{key} is {type(v).__name__} {v!r}, not {kind}", source=source)
    return v


def parse_report(text: str, source: str = "<json>") -> DriveResult:
    """The one point of drive's JSON report; ParseError names what is missing or wrong."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ParseError(TOOL, f"not JSON: {e}", source=source) from None
    if not isinstance(doc, dict):
        raise ParseError(TOOL, "the report is not a JSON object", source=source)
    meta = _need(doc, "meta", dict, "report", source)
    results = _need(doc, "results", list, "report", source)
    if meta.get("role") != "drive" or meta.get("op") != "get":
        raise ParseError(TOOL, f"meta says role={meta.get('role')!r} op={meta.get('op')!r}, not a drive of get",
                         source=source)
    if len(results) != 1:
        raise ParseError(TOOL, f"{len(results)} results; the lab runs drive with one concurrency (one point)",
                         source=source)
    r = results[0]
    if not isinstance(r, dict):
        raise ParseError(TOOL, "results[0] is not an object", source=source)
    for k, kind in RESULT_FIELDS.items():
        _need(r, k, kind, "results[0]", source)
    if not r["ok"]:
        raise ParseError(TOOL, f"results[0] is marked ok=false ({r.get('note')!r})", source=source)
    if r["path"] != "hicache-get":
        raise ParseError(TOOL, f"results[0].path is {r['path']!r}, not 'hicache-get'", source=source)
    hit = float(r["hit_rate"])
    if math.isnan(hit) or not 0 <= hit <= 1:
        raise ParseError(TOOL, f"results[0].hit_rate {r['hit_rate']!r} is not a ratio in [0, 1]", source=source)
    dur = float(r["duration_s"])
    if dur <= 0:
        raise ParseError(TOOL, "results[0].duration_s is not positive", source=source)
    mine = r["bytes_total"] / dur / 1e9
    if abs(mine - r["throughput_gbps"]) > max(1e-4, 0.01 * mine):
        raise ParseError(TOOL, f"throughput_gbps {r['throughput_gbps']} disagrees with bytes_total / duration_s = "
                               f"{mine:.4f} GB/s", source=source)
    lat = {}
    for metric, key in LATENCIES.items():
        v = r.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise ParseError(TOOL, f"results[0].{key} is {v!r}, not a number", source=source)
        lat[metric] = None if v is None else float(v)
    return DriveResult(gb_per_s=mine, pages_per_s=float(r["pages_per_s"]), hit_rate=hit, pages=r["pages"],
                       bytes_total=r["bytes_total"], duration_s=dur, block_size=r["block_size"],
                       batch_size=r["batch_size"], threads=r["threads"], processes=int(meta.get("processes", 1)),
                       latency_us=lat, protocol=r["protocol"], layout=str(meta.get("layout", "")), source=source)


def to_rows(res: DriveResult, **ctx: Any) -> list[Row]:
    """The point's rows (throughput, pages/s, latency percentiles per batch call, hit rate); unverified."""
    extra = {"verified": False, "verification": "unverified: peercache 0.8.4's drive counts hits, never checks bytes",
             "version": VERSION, "duration_s": res.duration_s, "bytes": res.bytes_total,
             "latency_of": "one batch_get_v1 call"}
    extra.update(ctx.pop("extra", {}) or {})
    base = dict(size_bytes=res.block_size, batch=res.batch_size, threads=res.threads, processes=res.processes,
                layout=res.layout, **ctx)
    rows = [Row(metric="get_throughput", value=res.gb_per_s, unit="GB/s", extra=extra, **base),
            Row(metric="pages_per_s", value=res.pages_per_s, unit="pages/s", extra=extra, **base),
            Row(metric="hit_rate", value=res.hit_rate, unit="ratio", extra=extra, **base)]
    for metric, v in res.latency_us.items():
        rows.append(Row(metric=metric, value=v, unit="us", extra=extra, **base) if v is not None else
                    Row(metric=metric, value=None, unit="us", status="not_measured",
                        reason="drive reported no latency (no batch completed)", extra=extra, **base))
    return rows
