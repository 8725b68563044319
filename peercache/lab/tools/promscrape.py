"""PeerCache's Prometheus metrics (docs/metrics.md) read around a measured window, kept as raw data.

``peercache-bench drive --metrics-scrapes`` records, at the start and at the end of each point's measured
window, what every driver process's metrics endpoint answers and, asked over the control plane, serve's
(the endpoints stay on their hosts' loopback and close with their processes, so nothing outside has to
reach them in time). Here:

- :func:`keep` takes those texts out of drive's result document into a point's raw folder: one
  ``.prom`` file per scrape and ``scrapes.json``, the index (:data:`INDEX`);
- :func:`parse` reads one text with prometheus-client's parser, strictly (Prometheus text format 0.0.4:
  a ``ParseError`` names the line);
- :func:`rails` gives a scrape's per-rail counters, :func:`rail_window` what each rail's grew by between
  two scrapes of one process, and :func:`consumer_window` the rails of every driver process of one point,
  summed, from an index; :func:`shares` each rail's part of the bytes.
"""
from __future__ import annotations

import io
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from peercache import atomic
from peercache.lab.errors import ParseError

TOOL = "prometheus scrape"
#: The index of a point's scrapes, beside their files.
INDEX = "scrapes.json"
INDEX_SCHEMA_VERSION = 1
#: The two moments of a window drive scrapes at.
EDGES = ("start", "end")
#: Which host's process a scrape source runs on.
ROLE_OF = {"drive": "consumer", "serve": "producer"}

# Per-rail families (docs/metrics.md): every PeerCache scrape declares them, with or without samples.
READ_BYTES = "peercache_read_bytes_total"
READS = "peercache_reads_total"
COMPLETION_ERRORS = "peercache_completion_errors_total"
RAIL_UP = "peercache_rail_up"
TRANSITIONS = "peercache_rail_transitions_total"
NODE_INFO = "peercache_node_info"

_TYPES = ("counter", "gauge", "histogram", "summary", "untyped")
#: Samples a family of each type may hold beyond its own name (prometheus-client's 0.0.4 output).
_SUFFIXES = {"histogram": ("_bucket", "_count", "_sum", "_created"), "summary": ("_count", "_sum", "_created"),
             "gauge": (), "untyped": (), "counter": ()}
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Scrape:
    """One parsed scrape: each family's type, and every sample by (name, sorted labels)."""

    source: str
    types: dict[str, str]
    samples: dict[tuple[str, Labels], float]

    def series(self, name: str) -> dict[Labels, float]:
        """The samples named ``name``, by their labels."""
        return {labels: v for (n, labels), v in self.samples.items() if n == name}


def _family_of(name: str, types: dict[str, str], current: str | None) -> str | None:
    """The declared family a sample ``name`` belongs to (it must be the family declared last)."""
    if current is None:
        return None
    kind = types[current]
    if name == current or any(name == current + s for s in _SUFFIXES[kind]):
        return current
    if kind == "counter" and current.endswith("_total") and name == current[: -len("_total")] + "_created":
        return current
    return None


def _declarations(text: str, source: str) -> tuple[dict[str, str], list[tuple[int, str, str | None]]]:
    """Each family's ``# TYPE``, and each sample line (number, line, the family declared last before it),
    lines split as prometheus-client splits them. Refused here, as prometheus-client lets them pass: a
    comment other than HELP and TYPE, an unknown type, a family declared twice."""
    types: dict[str, str] = {}
    sample_lines: list[tuple[int, str, str | None]] = []
    current: str | None = None
    for no, line in enumerate((line.rstrip("\r\n") for line in io.StringIO(text)), start=1):
        if not line.strip().startswith("#"):
            if line.strip():
                sample_lines.append((no, line, current))
            continue
        parts = line.split(None, 3)
        if len(parts) < 3 or parts[1] not in ("HELP", "TYPE") or not _NAME.fullmatch(parts[2]):
            raise ParseError(TOOL, "a comment that is neither '# HELP name text' nor '# TYPE name type'",
                             source=source, line_no=no, line=line)
        if parts[1] == "TYPE":
            if len(parts) != 4 or parts[3] not in _TYPES:
                raise ParseError(TOOL, f"unknown metric type (known: {', '.join(_TYPES)})", source=source,
                                 line_no=no, line=line)
            if parts[2] in types:
                raise ParseError(TOOL, f"family {parts[2]} declared twice", source=source, line_no=no, line=line)
            types[parts[2]] = parts[3]
            current = parts[2]
    return types, sample_lines


def parse(text: str, source: str = "<scrape>") -> Scrape:
    """A Prometheus text-format scrape (0.0.4, as prometheus-client writes it) read by prometheus-client's
    parser, strictly: every sample under the ``# TYPE`` of its family, each family declared once, no sample
    twice, numbers only; a ParseError names the line otherwise."""
    if not text.strip():
        raise ParseError(TOOL, "empty scrape: the endpoint answered nothing", source=source)
    types, sample_lines = _declarations(text, source)
    try:
        # one sample per sample line, in the text's order
        parsed = [(f, s) for f in text_string_to_metric_families(text) for s in f.samples]
    except (ValueError, LookupError) as e:      # (IndexError on some malformed lines) the line it refuses is named
        for no, line, _ in sample_lines:
            try:
                list(text_string_to_metric_families(line))
            except (ValueError, LookupError) as why:
                raise ParseError(TOOL, f"not a sample line ('name{{labels}} value [timestamp]'): {why}",
                                 source=source, line_no=no, line=line) from None
        raise ParseError(TOOL, f"prometheus-client refused it: {e}", source=source) from None
    if len(parsed) != len(sample_lines):
        raise ParseError(TOOL, f"{len(parsed)} samples read from {len(sample_lines)} sample lines", source=source)
    samples: dict[tuple[str, Labels], float] = {}
    for (family, sample), (no, line, current) in zip(parsed, sample_lines):
        name = sample.name
        if family.type == "counter" and family.name == current and name == f"{current}_total":
            name = current      # a counter declared without _total: prometheus-client adds it to the samples
        if _family_of(name, types, current) is None:
            raise ParseError(TOOL, f"sample {name} outside its family's '# TYPE' block"
                             + (f" (the block open is {current})" if current else ""),
                             source=source, line_no=no, line=line)
        key = (name, tuple(sorted(sample.labels.items())))
        if key in samples:
            raise ParseError(TOOL, "the same sample twice", source=source, line_no=no, line=line)
        samples[key] = float(sample.value)
    return Scrape(source, types, samples)


# --- rails ------------------------------------------------------------------------

@dataclass
class RailCounters:
    """One rail's counters in one scrape, or (from :func:`rail_window`) what they grew by over a window."""

    rail: str
    bytes: float = 0.0
    reads: float = 0.0
    completion_errors: dict[str, float] = field(default_factory=dict)   #: by ibv_wc_status name
    downs: float = 0.0
    ups: float = 0.0
    up: bool | None = None          #: planned for reads (the scrape's peercache_rail_up; at the end of a window)

    def as_dict(self) -> dict[str, Any]:
        """Plain figures (bytes, reads, errors by status, downs, ups, up)."""
        return {"bytes": self.bytes, "reads": self.reads, "completion_errors": dict(self.completion_errors),
                "downs": self.downs, "ups": self.ups, "up": self.up}


def _rail_of(labels: Labels, family: str, source: str) -> str:
    d = dict(labels)
    if "rail" not in d:
        raise ParseError(TOOL, f"a {family} sample without a rail label: {labels}", source=source)
    return d["rail"]


def rails(s: Scrape) -> dict[str, RailCounters]:
    """The per-rail counters of one PeerCache scrape ({} for a process without rails: tcp, shm). ParseError
    when it is not a PeerCache scrape (the per-rail families are not declared)."""
    missing = [f for f in (READ_BYTES, READS, COMPLETION_ERRORS, RAIL_UP, TRANSITIONS) if f not in s.types]
    if missing:
        raise ParseError(TOOL, f"not a PeerCache scrape: no {', '.join(missing)} family (docs/metrics.md); "
                         "was it read from a peercache-bench process?", source=s.source)
    out: dict[str, RailCounters] = {}
    for labels, v in s.series(READ_BYTES).items():
        r = _rail_of(labels, READ_BYTES, s.source)
        out[r] = RailCounters(r, bytes=v)

    def rail(labels: Labels, family: str) -> RailCounters:
        r = _rail_of(labels, family, s.source)
        if r not in out:
            raise ParseError(TOOL, f"rail {r!r} has a {family} sample but no {READ_BYTES} one", source=s.source)
        return out[r]
    for labels, v in s.series(READS).items():
        rail(labels, READS).reads = v
    for labels, v in s.series(COMPLETION_ERRORS).items():
        rail(labels, COMPLETION_ERRORS).completion_errors[dict(labels).get("status", "?")] = v
    for labels, v in s.series(TRANSITIONS).items():
        to = dict(labels).get("to")
        if to not in ("down", "up"):
            raise ParseError(TOOL, f"{TRANSITIONS} with to={to!r}, not down or up", source=s.source)
        setattr(rail(labels, TRANSITIONS), f"{to}s", v)
    for labels, v in s.series(RAIL_UP).items():
        rail(labels, RAIL_UP).up = bool(v)
    return out


def node_of(s: Scrape) -> str | None:
    """The node a scrape came from (peercache_node_info's node label), or None when it names none yet."""
    nodes = [dict(labels).get("node") for labels in s.series(NODE_INFO)]
    return nodes[0] if len(nodes) == 1 else None


def rail_window(start: Scrape, end: Scrape) -> dict[str, RailCounters]:
    """What each rail's counters grew by between two scrapes of one process (its state: at the end).
    ParseError when they are of different processes, name different rails, or a counter went down."""
    where = f"{start.source} -> {end.source}"
    if node_of(start) != node_of(end):
        raise ParseError(TOOL, f"the two scrapes are of different nodes ({node_of(start)} and {node_of(end)}); "
                         "a window's delta needs both ends of one process", source=where)
    a, b = rails(start), rails(end)
    if set(a) != set(b):
        raise ParseError(TOOL, f"the rails differ between the window's ends ({sorted(a)} and {sorted(b)})",
                         source=where)
    out = {}
    for name, e in b.items():
        s = a[name]
        d = RailCounters(name, e.bytes - s.bytes, e.reads - s.reads, downs=e.downs - s.downs, ups=e.ups - s.ups,
                         up=e.up)
        for status in set(s.completion_errors) | set(e.completion_errors):
            n = e.completion_errors.get(status, 0.0) - s.completion_errors.get(status, 0.0)
            if n:
                d.completion_errors[status] = n
        bad = [k for k in ("bytes", "reads", "downs", "ups") if getattr(d, k) < 0] + \
              [f"completion errors {k}" for k, n in d.completion_errors.items() if n < 0]
        if bad:
            raise ParseError(TOOL, f"rail {name}: {', '.join(bad)} went down over the window (a counter only "
                             "grows: the process restarted, or the ends are swapped)", source=where)
        out[name] = d
    return out


def add(into: dict[str, RailCounters], more: dict[str, RailCounters]) -> dict[str, RailCounters]:
    """Rail figures of several processes summed by rail name (``up``: every process had it up)."""
    for name, r in more.items():
        t = into.setdefault(name, RailCounters(name, up=r.up))
        t.bytes += r.bytes
        t.reads += r.reads
        t.downs += r.downs
        t.ups += r.ups
        for k, n in r.completion_errors.items():
            t.completion_errors[k] = t.completion_errors.get(k, 0.0) + n
        if r.up is not None:
            t.up = r.up if t.up is None else (t.up and r.up)
    return into


def shares(by_rail: dict[str, RailCounters]) -> dict[str, float] | None:
    """Each rail's share of the bytes all rails carried (None when they carried none: no share to give)."""
    total = sum(r.bytes for r in by_rail.values())
    if not by_rail or total <= 0 or not math.isfinite(total):
        return None
    return {name: r.bytes / total for name, r in by_rail.items()}


# --- the raw folder ------------------------------------------------------------------

def file_name(rec: dict[str, Any], threads: Any) -> str:
    """The file of one scrape record of drive's document: role, process, threads, edge."""
    if rec.get("source") not in ROLE_OF or rec.get("edge") not in EDGES:
        raise ParseError("peercache-bench drive", f"a metrics scrape record with source {rec.get('source')!r} and "
                         f"edge {rec.get('edge')!r} (expected one of {sorted(ROLE_OF)} and {EDGES})")
    proc = f"-p{rec['process']}" if rec.get("process") is not None else ""
    return f"{ROLE_OF[rec['source']]}{proc}-t{threads}.{rec['edge']}.prom"


def split_document(doc: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str], dict[str, Any]]:
    """(drive's document without the scrape texts, {file name: text}, the index) (pure). Each point's
    ``metrics_scrapes`` becomes index entries: role, source, process, threads, edge, time, url and the file,
    or the error drive recorded in place of a text."""
    doc = json.loads(json.dumps(doc))
    files: dict[str, str] = {}
    entries = []
    for k, pt in enumerate(doc.get("points") or []):
        recs = pt.pop("metrics_scrapes", None)
        if recs is None:
            continue
        threads = pt.get("concurrency", k)   # threads per driver process: the rows' threads
        kept = []
        for rec in recs:
            entry = {key: rec.get(key) for key in ("source", "process", "edge", "time", "url")}
            entry.update(role=ROLE_OF.get(rec.get("source")), threads=threads, point=k)
            if rec.get("text") is not None:
                entry["file"] = name = file_name(rec, threads)
                if name in files:
                    raise ParseError("peercache-bench drive", f"two metrics scrapes would both be {name}")
                files[name] = rec["text"]
            else:
                entry["error"] = rec.get("error") or "drive recorded neither a text nor why"
            kept.append(entry)
        pt["metrics_scrapes"] = kept
        entries += kept
    index = {"schema_version": INDEX_SCHEMA_VERSION, "tool": "peercache-bench drive --metrics-scrapes",
             "scrapes": entries}
    return doc, files, index


def keep(doc: dict[str, Any], folder: Path) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Write the scrapes of drive's document under ``folder`` (files and :data:`INDEX`); (the document
    without their texts, the index, or None when the document holds no scrape)."""
    out, files, index = split_document(doc)
    if not index["scrapes"]:
        return out, None
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        atomic.write_text(folder / name, text)
    atomic.write_text(folder / INDEX, json.dumps(index, indent=1))
    return out, index


def read_index(path: Path) -> dict[str, Any]:
    """A scrape index (:data:`INDEX`), checked; ParseError names what is wrong."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ParseError(TOOL, f"cannot read the scrape index: {e}", source=str(path)) from None
    if not isinstance(doc, dict) or doc.get("schema_version") != INDEX_SCHEMA_VERSION \
            or not isinstance(doc.get("scrapes"), list):
        raise ParseError(TOOL, f"not a scrape index of schema_version {INDEX_SCHEMA_VERSION} with a scrapes list",
                         source=str(path))
    return doc


@dataclass
class Window:
    """The consumer's rails over one point's window, summed over its driver processes, and what is missing."""

    threads: Any
    rails: dict[str, RailCounters]
    processes: int
    start: float | None             #: the earliest start scrape (epoch s)
    end: float | None               #: the latest end scrape
    missing: list[str] = field(default_factory=list)   #: scrapes drive could not take, with why


def consumer_window(index_path: Path) -> list[Window]:
    """Per drive point of one index: every driver process's rails between its start and end scrapes, summed.
    ParseError when a file is unreadable or a process has one end without the other."""
    path = Path(index_path)
    index = read_index(path)
    by_point: dict[Any, dict[Any, dict[str, dict]]] = {}
    missing: dict[Any, list[str]] = {}
    failed: set[tuple[Any, Any]] = set()     # (threads, process) with a scrape drive could not take
    for e in index["scrapes"]:
        if e.get("role") != "consumer":
            continue
        pt = e.get("threads")
        if e.get("error"):
            missing.setdefault(pt, []).append(f"driver process {e.get('process')} at the {e.get('edge')}: {e['error']}")
            failed.add((pt, e.get("process")))
            continue
        by_point.setdefault(pt, {}).setdefault(e.get("process"), {})[e.get("edge")] = e
    out = []
    for pt in dict.fromkeys([*by_point, *missing]):
        total: dict[str, RailCounters] = {}
        starts, ends = [], []
        procs = {p: e for p, e in by_point.get(pt, {}).items() if (pt, p) not in failed}
        for proc, ends_of in sorted(procs.items(), key=lambda kv: str(kv[0])):
            if set(ends_of) != set(EDGES):
                raise ParseError(TOOL, f"driver process {proc} (threads {pt}) has a scrape at the "
                                 f"{', '.join(ends_of)} of its window only; a delta needs both", source=str(path))
            pair = []
            for edge in EDGES:
                f = path.parent / ends_of[edge]["file"]
                try:
                    text = f.read_text()
                except OSError as e:
                    raise ParseError(TOOL, f"cannot read {f.name}: {e}", source=str(path)) from None
                pair.append(parse(text, str(f)))
            add(total, rail_window(*pair))
            starts.append(ends_of["start"].get("time"))
            ends.append(ends_of["end"].get("time"))
        starts, ends = [t for t in starts if t is not None], [t for t in ends if t is not None]
        out.append(Window(pt, total, len(procs), min(starts) if starts else None,
                          max(ends) if ends else None, missing.get(pt, [])))
    return out
