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
from typing import Any, Iterable

SCHEMA_VERSION = 1

#: Allowed values of ``Row.status``.
STATUSES = ("ok", "skipped", "failed", "not_measured", "not_supported", "not_counted")

#: Allowed values of ``Row.verdict`` (set against references, see references.py).
VERDICTS = ("ok", "low", "high", "unchecked", "above_line_rate", "above_raw")


@dataclass
class Row:
    """One measurement with its unit and where it came from."""

    experiment: str            #: experiment (testbed definition) name
    scenario: str              #: single_nic, multi_rail, whole_machine, gpudirect, msgsize_sweep, ...
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
    """Write one point's result document (atomically: temp file, then rename)."""
    import os
    from pathlib import Path

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"schema_version": SCHEMA_VERSION, "meta": meta.to_dict(),
           "rows": [dataclasses.asdict(r) for r in rows]}
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True, default=str))
    os.replace(tmp, path)


def read_result(path) -> tuple[RunMeta, list[Row]]:
    """Read a result document written by :func:`write_result`."""
    from pathlib import Path

    doc = json.loads(Path(path).read_text())
    version = doc.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ValueError(f"{path}: result schema version {version!r}, this code reads "
                         f"{SCHEMA_VERSION}; re-run the point or collect it with a matching version")
    meta = RunMeta(**doc["meta"])
    rows = [Row(**r) for r in doc["rows"]]
    return meta, rows
