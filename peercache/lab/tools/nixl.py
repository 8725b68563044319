"""NIXL (PyPI ``nixl-cu12``, ``nixl_agent`` with UCX over DRAM) through our driver: command builders and a strict
parser of the initiator's JSON result.

NIXL's wheel has no benchmark of its own, so the lab runs :mod:`peercache.lab.tools.nixl_driver` with
``.venv-nixl``'s python (``make engines``; the driver imports only numpy and NIXL). The *target* on the
producer registers a pool of pages filled with a pattern and prints one ready line with its agent name
and pool address (:data:`TARGET_READY` captures them; the pair runner fills the initiator's
``{nixl_agent}`` and ``{nixl_pool}`` with them); the *initiator* on the consumer fetches the target's
metadata from the target's NIXL listener, READs batches of random pages from ``--threads`` threads for
a warm-up and the measured window, checks every page it read (``--verify``) and prints one JSON
document. See the driver's docstring for the metadata exchange and the UCX transport settings.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from peercache.lab.errors import ParseError, ToolError
from peercache.lab.tidy import Row

TOOL = "nixl_driver"
VENV = ".venv-nixl"
#: The executable the lab checks on each host and runs: the venv's interpreter (the driver is a file of
#: this checkout, run with ``-P`` so the tools folder never shadows a module NIXL or numpy imports).
BINARY = f"{VENV}/bin/python"
DRIVER = "peercache/lab/tools/nixl_driver.py"
SCHEMA = "peercache-lab.nixl_driver/1"
PROTOCOLS = ("tcp", "rdma")
#: The target's ready line: registered, filled and listening.
TARGET_READY = (r"nixl_driver target ready: agent=(?P<nixl_agent>\S+) pool=(?P<nixl_pool>0x[0-9a-f]+) "
                r"pages=\d+ page_size=\d+ listen=\S+")
#: Log lines the initiator's stdout may carry beside its result (UCX's and NIXL's own logging).
_LOG_LINE = re.compile(r"^\[\d+\.\d+\] \[[^\]]+\]|^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d NIXL |^\s*$")
#: What each field of the result document must be.
FIELDS = {"schema": str, "engine": str, "nixl_version": str, "backend": str, "memory": str, "protocol": str,
          "ucx_env": dict, "page_size": int, "batch": int, "threads": int, "pages": int,
          "warmup_s": (int, float), "duration_s": (int, float), "batches": int, "bytes": int,
          "gb_per_s": (int, float), "latency_us": dict, "metadata_s": (int, float), "poll_spin_us": (int, float),
          "poll_sleep_us": (int, float),
          "stopped_by": str,
          "verify": bool, "verified_pages": int, "mismatched_pages": int}


def _positive(**vals: int) -> None:
    for k, v in vals.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{k} {v!r} must be a positive integer")


def _side(python: str, driver: str, mode: str, protocol: str, host: str, listen_port: int, page_size: int,
          pages: int, device: str | None, gid_index: int | None) -> list[str]:
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol {protocol!r} is not one of {PROTOCOLS} (what the lab runs UCX over)")
    _positive(listen_port=listen_port, page_size=page_size, pages=pages)
    if page_size % 8:
        raise ValueError(f"page_size {page_size} is not a multiple of 8 (the driver's pattern is 64-bit words)")
    argv = [python, "-P", driver, mode, "--protocol", protocol, "--host", host, "--listen-port", str(listen_port),
            "--page-size", str(page_size), "--pages", str(pages)]
    if protocol == "rdma":
        if not device:
            raise ValueError("protocol rdma needs the RDMA device (UCX_NET_DEVICES); the testbed names none")
        argv += ["--device", device]
        if gid_index is not None:
            argv += ["--gid-index", str(int(gid_index))]
    return argv


def target_command(python: str, driver: str, protocol: str, host: str, listen_port: int, page_size: int,
                   pages: int, device: str | None = None, gid_index: int | None = None) -> list[str]:
    """argv of the target (producer): registers ``pages`` pages, listens on ``listen_port``, serves until stopped."""
    return _side(python, driver, "target", protocol, host, listen_port, page_size, pages, device, gid_index)


def initiator_command(python: str, driver: str, protocol: str, host: str, listen_port: int, target: str,
                      page_size: int, pages: int, batch: int, threads: int, duration: float, warmup: float,
                      verify: bool = True, connect_timeout: float = 30.0, batch_timeout: float = 10.0,
                      poll_spin_us: float = 50.0, poll_sleep_us: float = 50.0, agent: str = "{nixl_agent}",
                      pool: str = "{nixl_pool}", device: str | None = None,
                      gid_index: int | None = None) -> list[str]:
    """argv of the initiator (consumer): READs from the target's listener ``target`` (HOST:PORT); ``agent`` and
    ``pool`` default to the placeholders the pair runner fills from the target's ready line."""
    _positive(batch=batch, threads=threads)
    if duration <= 0 or warmup < 0 or min(connect_timeout, batch_timeout) <= 0 or min(poll_spin_us, poll_sleep_us) < 0:
        raise ValueError(f"duration ({duration}), connect_timeout ({connect_timeout}) and batch_timeout "
                         f"({batch_timeout}) must be > 0, warmup ({warmup}), poll_spin_us ({poll_spin_us}) and "
                         f"poll_sleep_us ({poll_sleep_us}) >= 0")
    if ":" not in target or target.startswith("-"):
        raise ValueError(f"target {target!r} is not HOST:PORT of the target's NIXL listener")
    return [*_side(python, driver, "initiator", protocol, host, listen_port, page_size, pages, device, gid_index),
            "--target", target, "--agent", agent, "--pool", pool, "--batch", str(batch), "--threads", str(threads),
            "--duration", f"{duration:g}", "--warmup", f"{warmup:g}", "--connect-timeout", f"{connect_timeout:g}",
            "--batch-timeout", f"{batch_timeout:g}", "--poll-spin-us", f"{poll_spin_us:g}",
            "--poll-sleep-us", f"{poll_sleep_us:g}",
            "--verify" if verify else "--no-verify"]


@dataclass
class NixlResult:
    """What one initiator run reported (the driver's JSON document, checked)."""

    page_size: int
    batch: int
    threads: int
    pages: int
    duration_s: float              #: measured window (first measured batch's start to the last one's end)
    batches: int                   #: batches completed in the window, all threads
    bytes: int
    gb_per_s: float                #: 10^9 bytes per second over the window
    p50_us: float                  #: per-batch latency: make_prepped_xfer + transfer until DONE
    p99_us: float
    max_us: float
    verify: bool
    verified_pages: int
    nixl_version: str
    ucx_env: dict[str, str]
    metadata_s: float              #: fetch_remote_metadata until the metadata had arrived
    poll_spin_us: float            #: the readers poll a batch's state without sleeping this long, then
    poll_sleep_us: float           #: sleep this long between two polls
    stopped_by: str
    source: str = "<stdout>"
    log_lines: list[str] = field(default_factory=list)


def _doc_line(text: str, source: str) -> tuple[int, str]:
    """The one JSON line of the initiator's stdout (its number and text); other lines must be UCX/NIXL logging."""
    found: list[tuple[int, str]] = []
    for i, ln in enumerate(text.splitlines(), 1):
        if ln.lstrip().startswith("{"):
            found.append((i, ln))
        elif not _LOG_LINE.search(ln):
            raise ParseError(TOOL, "a line that is neither the driver's JSON nor UCX/NIXL logging", source=source,
                             line_no=i, line=ln)
    if not found:
        raise ParseError(TOOL, "no JSON result line (did the initiator finish? read its stderr)", source=source)
    if len(found) > 1:
        raise ParseError(TOOL, "a second JSON line (one initiator run prints one)", source=source,
                         line_no=found[1][0], line=found[1][1])
    return found[0]


def parse_output(text: str, page_size: int, batch: int, threads: int, source: str = "<stdout>",
                 host: str = "") -> NixlResult:
    """The initiator's result from its stdout, or :class:`ToolError` (the driver's own error, or pages that came
    back wrong) / :class:`ParseError` (no result, two, a field missing or mistyped, figures that disagree with
    each other or with the geometry asked)."""
    i, line = _doc_line(text, source)

    def bad(msg: str) -> ParseError:
        return ParseError(TOOL, msg, source=source, line_no=i, line=line)
    try:
        doc = json.loads(line)
    except json.JSONDecodeError as e:
        raise bad(f"not JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise bad(f"not a {SCHEMA} document")
    if "error" in doc:
        kind = "cannot_connect" if "no metadata" in doc["error"] or "did not complete" in doc["error"] else "failed"
        raise ToolError(host=host, tool=TOOL, kind=kind, detail=f"{source}: {doc['error']}",
                        check=str(doc.get("check") or "read the initiator's and the target's logs"))
    for k, t in FIELDS.items():
        if k not in doc:
            raise bad(f"field {k!r} missing")
        if not isinstance(doc[k], t) or (t is int and isinstance(doc[k], bool)):
            raise bad(f"field {k!r} is {type(doc[k]).__name__}, not {getattr(t, '__name__', t)}")
    asked = {"page_size": page_size, "batch": batch, "threads": threads}
    for k, v in asked.items():
        if doc[k] != v:
            raise bad(f"{k} {doc[k]} is not the {v} the command asked for")
    lat = doc["latency_us"]
    if set(lat) != {"p50", "p99", "max"} or not all(isinstance(v, (int, float)) for v in lat.values()):
        raise bad("latency_us must hold numbers p50, p99 and max")
    if not 0 < lat["p50"] <= lat["p99"] <= lat["max"]:
        raise bad(f"latency percentiles out of order (p50 {lat['p50']}, p99 {lat['p99']}, max {lat['max']} us)")
    if doc["batches"] < 1 or doc["duration_s"] <= 0:
        raise bad(f"{doc['batches']} batches in {doc['duration_s']} s: nothing measured")
    if doc["bytes"] != doc["batches"] * batch * page_size:
        raise bad(f"bytes {doc['bytes']} is not batches x batch x page_size = {doc['batches'] * batch * page_size}")
    mine = doc["bytes"] / doc["duration_s"] / 1e9
    if abs(doc["gb_per_s"] - mine) > 1e-6 * max(mine, 1e-9):
        raise bad(f"gb_per_s {doc['gb_per_s']} disagrees with bytes / duration_s = {mine}")
    if doc["stopped_by"] not in ("duration", "max_batches"):
        raise bad(f"stopped_by {doc['stopped_by']!r} is not duration or max_batches")
    if doc["verify"]:
        if doc["mismatched_pages"]:
            raise ToolError(host=host, tool=TOOL, kind="failed",
                            detail=f"{source}: {doc['mismatched_pages']} of {doc['verified_pages']} pages read "
                                   "differed from the target's pattern",
                            check="NIXL returned wrong bytes: read the target's log and UCX's settings (ucx_env)")
        # warm-up batches are checked too: at least every measured page was
        if doc["verified_pages"] < doc["batches"] * batch:
            raise bad(f"verify on, but {doc['verified_pages']} pages checked for {doc['batches'] * batch} read")
    return NixlResult(page_size=page_size, batch=batch, threads=threads, pages=doc["pages"],
                      duration_s=float(doc["duration_s"]), batches=doc["batches"], bytes=doc["bytes"],
                      gb_per_s=float(doc["gb_per_s"]), p50_us=float(lat["p50"]), p99_us=float(lat["p99"]),
                      max_us=float(lat["max"]), verify=doc["verify"], verified_pages=doc["verified_pages"],
                      nixl_version=doc["nixl_version"], ucx_env=dict(doc["ucx_env"]),
                      metadata_s=float(doc["metadata_s"]), poll_spin_us=float(doc["poll_spin_us"]),
                      poll_sleep_us=float(doc["poll_sleep_us"]),
                      stopped_by=doc["stopped_by"], source=source,
                      log_lines=[ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("{")])


def verification(res: NixlResult) -> dict[str, Any]:
    """The verification fields of the rows: verified (every page checked against the target's pattern) or not."""
    if res.verify:
        return {"verified": True, "verification": f"verified: {res.verified_pages} pages checked word by word "
                                                  "against the target's pattern, none differed"}
    return {"verified": False, "verification": "unverified: the driver ran with --no-verify"}


def to_rows(res: NixlResult, **ctx: Any) -> list[Row]:
    """The run's rows: ``get_throughput`` (GB/s), ``latency_p50`` / ``latency_p99`` per batch (us), ``batches``."""
    extra = {**verification(res), "nixl_version": res.nixl_version, "backend": "UCX", "memory": "DRAM",
             "ucx_env": res.ucx_env, "duration_s": res.duration_s, "bytes": res.bytes, "pages": res.pages,
             "metadata_s": res.metadata_s, "poll_spin_us": res.poll_spin_us,
             "poll_sleep_us": res.poll_sleep_us, "stopped_by": res.stopped_by,
             "latency_max_us": res.max_us}
    extra.update(ctx.pop("extra", {}) or {})
    base = dict(size_bytes=res.page_size, batch=res.batch, threads=res.threads, processes=1, **ctx)
    return [Row(metric="get_throughput", value=res.gb_per_s, unit="GB/s", raw_value=res.gb_per_s, raw_unit="GB/s",
                extra=extra, **base),
            Row(metric="latency_p50", value=res.p50_us, unit="us", extra=extra, **base),
            Row(metric="latency_p99", value=res.p99_us, unit="us", extra=extra, **base),
            Row(metric="batches", value=float(res.batches), unit="count", extra=extra, **base)]
