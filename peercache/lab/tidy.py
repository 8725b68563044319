"""The tidy result schema: one row per measurement, shared by every lab stage.

A row is a :class:`Row`; the run it came from is described once in a meta
block (``RunMeta``) and rows point at it by ``run_id``. Parsers of tool
output produce rows; the pipeline writes them as Parquet under
``data/tidy/``; ``make_charts.py`` and the report notebook read them back.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from peercache import atomic
from peercache.redact import redact, redact_doc

SCHEMA_VERSION = 1

#: Allowed values of ``Row.status``.
STATUSES = ("ok", "skipped", "failed", "not_measured", "not_supported", "not_counted")

#: Allowed values of ``Row.verdict`` (set against references, see references.py).
VERDICTS = ("ok", "low", "high", "unchecked", "above_line_rate", "above_raw")

#: unit name -> (dimension, factor to the dimension's base unit). Decimal
#: prefixes (GB = 1e9 B) as the published baselines and perftest's --report_gbits use.
UNITS: dict[str, tuple[str, float]] = {
    "bit/s": ("bandwidth", 1.0), "Kbit/s": ("bandwidth", 1e3), "Mbit/s": ("bandwidth", 1e6),
    "Gbit/s": ("bandwidth", 1e9), "Gb/s": ("bandwidth", 1e9), "Gbps": ("bandwidth", 1e9),
    "Tbit/s": ("bandwidth", 1e12),
    "B/s": ("bandwidth", 8.0), "KB/s": ("bandwidth", 8e3), "MB/s": ("bandwidth", 8e6),
    "GB/s": ("bandwidth", 8e9), "TB/s": ("bandwidth", 8e12),
    "MiB/s": ("bandwidth", 8.0 * 2**20), "GiB/s": ("bandwidth", 8.0 * 2**30),
    "pps": ("rate", 1.0), "Kpps": ("rate", 1e3), "Mpps": ("rate", 1e6), "msg/s": ("rate", 1.0),
    "pages/s": ("pages_rate", 1.0), "tokens/s": ("tokens_rate", 1.0), "ops/s": ("ops_rate", 1.0),
    "ns": ("time", 1e-9), "us": ("time", 1e-6), "ms": ("time", 1e-3), "s": ("time", 1.0),
    "B": ("bytes", 1.0), "count": ("count", 1.0), "ratio": ("ratio", 1.0), "%": ("ratio", 0.01),
    "s/GiB": ("cpu_time_per_bytes", 1.0),     # CPU seconds per GiB moved
}


def convert(value: float, unit: str, to: str) -> float:
    """Convert ``value`` from ``unit`` to ``to`` (same dimension only)."""
    if unit == to:
        return value
    for u in (unit, to):
        if u not in UNITS:
            raise ValueError(f"unknown unit {u!r}; known units: {', '.join(UNITS)} "
                             "(add it to peercache.lab.tidy.UNITS)")
    dim_from, f_from = UNITS[unit]
    dim_to, f_to = UNITS[to]
    if dim_from != dim_to:
        raise ValueError(f"cannot convert {unit!r} ({dim_from}) to {to!r} ({dim_to}); "
                         "check the unit of the reference or of the row")
    return value * f_from / f_to


def is_bandwidth(unit: str) -> bool:
    """True when ``unit`` is a bandwidth unit (checked against line rate)."""
    return UNITS.get(unit, ("", 0.0))[0] == "bandwidth"


@dataclass
class Row:
    """One measurement with its unit and where it came from."""

    experiment: str            #: experiment (testbed definition) name
    scenario: str              #: a scenario of experiments/scenarios.yaml (or "bench")
    run_id: str                #: key into the runs table (meta block)
    metric: str                #: e.g. bw, msg_rate, get_throughput, pages_per_s, latency_p99, ipc
    value: float | None        #: None when not measured / not supported (never 0 in its place)
    unit: str                  #: e.g. "B/s", "Gbit/s", "GB/s", "pages/s", "us", "count", "ratio"
    status: str = "ok"         #: one of STATUSES
    reason: str | None = None  #: why status is not ok
    repetition: int = 0
    tool: str = ""             #: ib_read_bw, ib_write_bw, iperf3, peercache-bench, perf, memcpy
    side: str = ""             #: client, server, both, aggregate
    host: str = ""
    peer: str = ""
    devices: str = ""          #: comma-separated device names
    numa_node: int | None = None
    protocol: str = ""         #: rdma, tcp, shm, roce, ib ...
    layout: str = ""           #: mla, mha, or "" for raw tools
    size_bytes: int | None = None  #: page size (PeerCache) or message size (perftest/iperf3 length)
    batch: int | None = None
    qps: int | None = None     #: QPs (perftest) / streams (iperf3) / channels (PeerCache)
    threads: int | None = None
    processes: int | None = None
    raw_value: float | None = None  #: the number exactly as the tool printed it
    raw_unit: str | None = None     #: the unit the tool printed it in
    testbed: str = ""
    extra: dict[str, Any] = field(default_factory=dict)  #: tool-specific detail (JSON-able)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"row status {self.status!r} is not one of {STATUSES}")
        if self.status == "ok" and self.value is None:
            raise ValueError(f"row {self.metric!r} has status ok but no value; "
                             "use status not_measured/not_supported with a reason")

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for JSON / DataFrame construction (extra serialised as JSON text)."""
        d = dataclasses.asdict(self)
        d["extra"] = json.dumps(self.extra, sort_keys=True)
        return d


COLUMNS = [f.name for f in dataclasses.fields(Row)]


@dataclass
class RunMeta:
    """The meta block of one run: what ran where, with which versions, when."""

    run_id: str
    testbed: str
    experiment: str
    scenario: str
    point: str                 #: the parameter point's name, e.g. "q16_s131072"
    repetition: int
    hosts: dict[str, Any]      #: role -> testbed capture summary (host, kernel, cpu, nics ...)
    commands: dict[str, Any]   #: side -> exact argv (list) or command line
    start: str                 #: ISO 8601 UTC
    end: str
    git_revision: str | None
    versions: dict[str, Any] = field(default_factory=dict)
    numa_binding: dict[str, Any] = field(default_factory=dict)  #: side -> {"node": N} or {"node": None, "reason": ...}
    params: dict[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def rows_to_records(rows: Iterable[Row]) -> list[dict[str, Any]]:
    """Rows as a list of plain dicts in COLUMNS order."""
    return [r.to_dict() for r in rows]


# --- raw result files -------------------------------------------------------
# Every measured point of the pipeline leaves one ``result.json`` in its raw
# folder, data/raw/<testbed>/<scenario>/<point>/rep<k>/result.json, beside
# both sides' logs:  {"schema_version": 1, "meta": RunMeta, "rows": [Row...]}.
# The collect stage concatenates them into data/tidy/<testbed>/rows.parquet
# (one row per measurement) and data/tidy/<testbed>/runs.parquet (one meta
# block per run_id).

RESULT_FILE = "result.json"


def write_result(path, meta: RunMeta, rows: Iterable[Row]) -> None:
    """Write one point's result document (whole or not at all: :mod:`peercache.atomic`), its secrets masked."""
    doc = redact_doc({"schema_version": SCHEMA_VERSION, "meta": meta.to_dict(),
                      "rows": [dataclasses.asdict(r) for r in rows]})
    atomic.write_text(path, json.dumps(doc, indent=1, sort_keys=True, default=str))


def read_result(path) -> tuple[RunMeta, list[Row]]:
    """Read a result document written by :func:`write_result`."""
    doc = json.loads(Path(path).read_text())
    version = doc.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ValueError(f"{path}: result schema version {version!r}, this code reads "
                         f"{SCHEMA_VERSION}; re-run the point or collect it with a matching version")
    meta = RunMeta(**doc["meta"])
    rows = [Row(**r) for r in doc["rows"]]
    return meta, rows


def redact_folder(folder) -> list:
    """Mask every secret (:func:`peercache.redact.redact`) in the text files under ``folder``, a point's
    raw folder once its processes ended: their logs, captured outputs and documents. JSON documents are
    also redacted as documents (values of secret-named keys). Returns the files that changed."""
    changed = []
    for path in sorted(Path(folder).rglob("*")):
        if path.is_symlink() or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue                      # not text (or gone): nothing this can mask
        new = redact(text)
        if path.suffix == ".json":
            try:
                doc = json.loads(new)
            except ValueError:
                doc = None
            if doc is not None and redact_doc(doc) != doc:
                new = json.dumps(redact_doc(doc), indent=1, sort_keys=True, default=str)
        if new != text:
            atomic.write_text(path, new)
            changed.append(path)
    return changed
