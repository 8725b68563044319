"""Raw result files of one testbed into the tidy tables, with the checks the collect notebook shows.

Tidy tables live in ``data/tidy/<testbed>/rows.parquet`` (one row per
measurement, ``tidy.COLUMNS``) and ``runs.parquet`` (one meta block per
``run_id``; its dict fields are stored as JSON text). Published reference data
lives in ``data/reference/<name>/rows.csv`` + ``runs.json`` (text, so it diffs);
:func:`load_tidy` reads either into the same two DataFrames.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from peercache import atomic
from peercache.lab import tidy
from peercache.lab.analysis.references import UNITS, TestbedRefs, convert, line_capacity_bps, is_bandwidth
from peercache.lab.errors import ParseError
from peercache.lab.tools import promscrape
from peercache.redact import redact_doc

ROWS_FILE = "rows.parquet"
RUNS_FILE = "runs.parquet"
REF_ROWS_FILE = "rows.csv"
REF_RUNS_FILE = "runs.json"

#: RunMeta fields holding dicts; JSON text in runs tables.
RUN_DICT_FIELDS = ("hosts", "commands", "versions", "numa_binding", "params")
RUN_COLUMNS = [f.name for f in dataclasses.fields(tidy.RunMeta)] + ["source"]

_INT_COLUMNS = ("repetition", "numa_node", "size_bytes", "batch", "qps", "threads", "processes")
_FLOAT_COLUMNS = ("value", "raw_value")
_ROW_DEFAULTS = {f.name: (f.default if f.default is not dataclasses.MISSING else None)
                 for f in dataclasses.fields(tidy.Row)}

#: Metrics whose value is a percentage of something that cannot exceed 100 %.
_BOUNDED_PERCENT_METRICS = ("hit_rate",)


def normalize_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Tidy rows with COLUMNS in order and one dtype per column, whatever they were read from."""
    df = df.copy()
    for col in tidy.COLUMNS:
        if col not in df.columns:
            df[col] = _ROW_DEFAULTS[col] if col != "extra" else "{}"
    df = df[tidy.COLUMNS]
    for col in _INT_COLUMNS:
        df[col] = pd.to_numeric(df[col], errors="raise").astype("Int64")
    for col in _FLOAT_COLUMNS:
        df[col] = pd.to_numeric(df[col], errors="raise").astype("float64")
    for col in tidy.COLUMNS:
        if col in _INT_COLUMNS or col in _FLOAT_COLUMNS:
            continue
        s = df[col].astype(object)
        df[col] = s.where(s.notna(), None)
    # Empty strings and None both mean "not recorded" for text fields; keep ""
    # for the fields Row defaults to "" so comparisons stay simple.
    for col in tidy.COLUMNS:
        if _ROW_DEFAULTS.get(col) == "":
            df[col] = df[col].map(lambda v: "" if v is None else str(v))
    df["extra"] = df["extra"].map(lambda v: v if isinstance(v, str) and v else
                                  (json.dumps(v, sort_keys=True) if isinstance(v, dict) else "{}"))
    return df.reset_index(drop=True)


def rows_frame(rows: Iterable[tidy.Row]) -> pd.DataFrame:
    """Tidy rows DataFrame from Row objects."""
    return normalize_rows(pd.DataFrame([redact_doc(r) for r in tidy.rows_to_records(rows)], columns=tidy.COLUMNS))


def runs_frame(metas: Iterable[tidy.RunMeta | dict[str, Any]]) -> pd.DataFrame:
    """Runs DataFrame (dict fields as JSON text) from RunMeta objects or dicts."""
    recs = []
    for m in metas:
        d = redact_doc(m.to_dict() if isinstance(m, tidy.RunMeta) else dict(m))   # no secret in tidy data
        for k in RUN_DICT_FIELDS + ("source",):
            if k in d and not isinstance(d[k], str):
                d[k] = json.dumps(d[k], sort_keys=True, ensure_ascii=False, default=str)
        recs.append(d)
    df = pd.DataFrame(recs, columns=RUN_COLUMNS)
    return df.astype(object).where(df.notna(), None)


def run_field(run: pd.Series | dict, key: str) -> Any:
    """A runs-table field, with JSON-text dict fields decoded."""
    v = run.get(key)
    if key in RUN_DICT_FIELDS + ("source",) and isinstance(v, str):
        return json.loads(v) if v else {}
    return v


def write_tidy(tidy_dir, testbed: str, rows: pd.DataFrame, runs: pd.DataFrame) -> Path:
    """Write data/tidy/<testbed>/rows.parquet and runs.parquet; returns the folder."""
    out = Path(tidy_dir) / testbed
    out.mkdir(parents=True, exist_ok=True)
    with atomic.replacing(out / ROWS_FILE) as tmp:
        normalize_rows(rows).to_parquet(tmp, index=False)
    with atomic.replacing(out / RUNS_FILE) as tmp:
        runs.to_parquet(tmp, index=False)
    return out


def load_tidy(path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(rows, runs) of one testbed folder: tidy Parquet or reference CSV + JSON."""
    path = Path(path)
    if (path / ROWS_FILE).exists():
        rows = normalize_rows(pd.read_parquet(path / ROWS_FILE))
        runs_path = path / RUNS_FILE
        runs = pd.read_parquet(runs_path) if runs_path.exists() else runs_frame([])
        for col in RUN_COLUMNS:
            if col not in runs.columns:
                runs[col] = None
        return rows, runs[RUN_COLUMNS]
    if (path / REF_ROWS_FILE).exists():
        return _load_reference(path)
    raise FileNotFoundError(f"{path}: neither {ROWS_FILE} (tidy) nor {REF_ROWS_FILE} (reference) "
                            "found; run the collect notebook for this testbed, or check the path")


def _load_reference(path: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    doc = json.loads((path / REF_RUNS_FILE).read_text())
    if doc.get("schema_version") != tidy.SCHEMA_VERSION:
        raise ValueError(f"{path / REF_RUNS_FILE}: schema_version {doc.get('schema_version')!r}, "
                         f"this code reads {tidy.SCHEMA_VERSION}")
    testbed, experiment = doc["testbed"], doc["experiment"]
    raw = pd.read_csv(path / REF_ROWS_FILE, dtype=str, keep_default_na=False)
    rows = []
    for i, rec in enumerate(raw.to_dict("records"), start=2):
        kw: dict[str, Any] = {"testbed": testbed, "experiment": experiment, "value": None}
        for k, v in rec.items():
            if v == "":
                continue
            if k == "extra":
                kw[k] = json.loads(v)
            elif k in _FLOAT_COLUMNS:
                kw[k] = float(v)
            elif k in _INT_COLUMNS:
                kw[k] = int(v)
            else:
                kw[k] = v
        try:
            rows.append(tidy.Row(**kw))
        except (TypeError, ValueError) as e:
            raise ValueError(f"{path / REF_ROWS_FILE} line {i}: {e}; fix the row") from None
    metas = []
    for r in doc["runs"]:
        m = {"testbed": testbed, "experiment": experiment, "repetition": 0, "start": None,
             "end": None, "git_revision": doc["testbed_block"].get("git_revision"),
             "versions": {}, "numa_binding": {}, "params": {},
             "schema_version": tidy.SCHEMA_VERSION, **r}
        # The published testbed block stands for every host of every run.
        m.setdefault("hosts", {})
        if not m["hosts"]:
            m["hosts"] = {"testbed (as published)": doc["testbed_block"]}
        m["source"] = doc.get("source")
        metas.append(m)
    return rows_frame(rows), runs_frame(metas)


def find_testbeds(*roots) -> dict[str, Path]:
    """``{name: folder}`` of every testbed folder (tidy or reference) under ``roots``."""
    found: dict[str, Path] = {}
    for root in roots:
        root = Path(root)
        if not root.is_dir():
            continue
        for d in sorted(p for p in root.iterdir() if p.is_dir()):
            if (d / ROWS_FILE).exists() or (d / REF_ROWS_FILE).exists():
                if d.name in found:
                    raise ValueError(f"testbed {d.name!r} exists in both {found[d.name].parent} and "
                                     f"{root}; rename one of them")
                found[d.name] = d
    return found


# --- collecting raw results -----------------------------------------------------

@dataclass
class CollectResult:
    """What :func:`collect_testbed` produced: tidy tables and the check findings."""

    rows: pd.DataFrame
    runs: pd.DataFrame
    issues: pd.DataFrame   #: columns ISSUE_COLUMNS, one finding per line
    out_dir: Path | None

    @property
    def errors(self) -> pd.DataFrame:
        """Findings of severity error."""
        return self.issues[self.issues["severity"] == "error"]


ISSUE_COLUMNS = ["severity", "check", "scenario", "point", "run_id", "metric", "message"]


def _issue(severity, check, message, scenario="", point="", run_id="", metric="") -> dict:
    return dict(severity=severity, check=check, scenario=scenario, point=point,
                run_id=run_id, metric=metric, message=message)


def planned_points(expected: Iterable[str]) -> set[tuple[str, str, int | None]]:
    """``(scenario, point, repetition)`` of each expected name: ``scenario/point`` (any repetition, None)
    or ``scenario/point/rep<k>``."""
    out = set()
    for exp in expected:
        scenario, _, rest = str(exp).partition("/")
        point, _, rep = rest.partition("/")
        if rep and not (rep.startswith("rep") and rep[3:].isdigit()):
            raise ValueError(f"expected point {exp!r}: the third part must be rep<k>, e.g. "
                             f"{scenario}/{point}/rep0")
        out.add((scenario, point, int(rep[3:]) if rep else None))
    return out


def in_plan(plan: set[tuple[str, str, int | None]], scenario: str, point: str, rep: int | None) -> bool:
    """Whether a result of ``scenario/point`` repetition ``rep`` is in the plan (every result is, without one)."""
    return not plan or (scenario, point, None) in plan or (scenario, point, rep) in plan


def _rep_of(name: str) -> int | None:
    return int(name[3:]) if name.startswith("rep") and name[3:].isdigit() else None


def read_raw(raw_dir, testbed: str, plan: set[tuple[str, str, int | None]] | None = None
             ) -> tuple[list[tidy.Row], list[tidy.RunMeta], list[dict]]:
    """The result.json files of data/raw/<testbed>/** as rows, metas and read problems. With a ``plan``
    (:func:`planned_points`) only its points are read: a result the plan does not name was left by an earlier
    run with another grid, and is reported as stale instead of read."""
    base = Path(raw_dir) / testbed
    if not base.is_dir():
        raise FileNotFoundError(f"raw folder {base} does not exist; run the pipeline for testbed "
                                f"{testbed!r} first, or pass the right raw_dir")
    rows: list[tidy.Row] = []
    metas: list[tidy.RunMeta] = []
    issues: list[dict] = []
    plan = plan or set()
    for path in sorted(base.rglob(tidy.RESULT_FILE)):
        rel = path.relative_to(base).parts
        scenario, point = (rel[0], rel[1]) if len(rel) >= 3 else ("", "")
        if not in_plan(plan, scenario, point, _rep_of(rel[2]) if len(rel) >= 4 else None):
            issues.append(_issue("warning", "stale_point",
                                 f"{path.parent.relative_to(base)}: not in the current plan (left by an "
                                 "earlier run with another grid or repetitions); left out of the tidy tables "
                                 f"and the report. Delete {path.parent} to drop it", scenario, point))
            continue
        try:
            meta, rs = tidy.read_result(path)
        except (ValueError, TypeError, KeyError, json.JSONDecodeError) as e:
            issues.append(_issue("error", "unreadable_result", f"{path}: {e}", scenario, point))
            continue
        metas.append(meta)
        more, found = rail_rows(path.parent, rs)
        issues += [_issue(sev, check, msg, scenario, point, meta.run_id) for sev, check, msg in found]
        for r in [*rs, *more]:
            if not r.testbed:
                r.testbed = meta.testbed or testbed
            rows.append(r)
    # A repetition folder without result.json means the point started but left nothing.
    for rep in sorted(p for p in base.glob("*/*/rep*") if p.is_dir()):
        if not (rep / tidy.RESULT_FILE).exists():
            scenario, point = rep.parent.parent.name, rep.parent.name
            if not in_plan(plan, scenario, point, _rep_of(rep.name)):
                continue
            issues.append(_issue("error", "missing_point",
                                 f"{rep.relative_to(base)} has no {tidy.RESULT_FILE}: the point neither "
                                 "ran to completion nor was marked skipped/failed; re-run it",
                                 scenario, point))
    return rows, metas, issues


#: The tidy metrics collect makes of a point's metrics scrapes (per rail, over the measured window).
RAIL_METRICS = {"rail_bytes": "B", "rail_share": "ratio"}


def _headline(rows: list[tidy.Row], threads: Any) -> tidy.Row | None:
    """The GET throughput row of a point (its whole figure, not a group's) whose context rail rows take."""
    heads = [r for r in rows if r.metric == "get_throughput" and r.side in ("client", "aggregate")]
    same = [r for r in heads if r.threads == threads]
    return (same or heads or [None])[0]


def rail_rows(folder: Path, rows: list[tidy.Row]) -> tuple[list[tidy.Row], list[tuple[str, str, str]]]:
    """Each rail's bytes (``rail_bytes``, B) and share of all rails' bytes (``rail_share``, ratio) over a
    point's measured window, from the metrics scrapes in its raw ``folder`` (``metrics/``, and each group's
    ``<group>/metrics/``: a whole-machine point's rails are its groups' rails), summed over driver
    processes, in the context of the point's headline row; and what went wrong, as (severity, check,
    message). No rows where the processes had no rails (tcp, shm) or the point failed."""
    indexes = sorted(folder.glob(f"metrics/{promscrape.INDEX}")) + sorted(folder.glob(f"*/metrics/{promscrape.INDEX}"))
    out: list[tidy.Row] = []
    found: list[tuple[str, str, str]] = []
    windows: dict[Any, list[promscrape.Window]] = {}
    for index in indexes:
        try:
            for w in promscrape.consumer_window(index):
                windows.setdefault(w.threads, []).append(w)
        except ParseError as e:
            found.append(("error", "unreadable_scrape", f"{e}; the point's per-rail rows are left out"))
            return [], found
    for threads, ws in windows.items():
        missing = [m for w in ws for m in w.missing]
        if missing:
            found.append(("warning", "missing_scrape", "no per-rail rows: " + "; ".join(missing)))
            continue
        rails: dict[str, promscrape.RailCounters] = {}
        for w in ws:
            promscrape.add(rails, w.rails)
        head = _headline(rows, threads)
        if not rails or head is None or head.status != "ok":
            continue
        shares = promscrape.shares(rails)
        starts, ends = [w.start for w in ws if w.start], [w.end for w in ws if w.end]
        ctx = {k: getattr(head, k) for k in ("experiment", "scenario", "run_id", "repetition", "tool", "side", "host",
                                             "peer", "protocol", "layout", "size_bytes", "batch", "qps", "threads",
                                             "processes", "testbed")}
        for name in sorted(rails):
            r = rails[name]
            extra = dict(r.as_dict(), source="metrics scrapes (drive --metrics-scrapes)",
                         processes_scraped=sum(w.processes for w in ws), rails=len(rails),
                         scrape_start=min(starts) if starts else None, scrape_end=max(ends) if ends else None)
            out.append(tidy.Row(metric="rail_bytes", value=r.bytes, unit="B", devices=name, extra=extra, **ctx))
            if shares is None:
                out.append(tidy.Row(metric="rail_share", value=None, unit="ratio", status="not_measured",
                                    reason="no rail carried a byte over the window", devices=name, extra=extra, **ctx))
            else:
                out.append(tidy.Row(metric="rail_share", value=shares[name], unit="ratio", devices=name,
                                    extra=extra, **ctx))
    return out, found


def check_tidy(rows: pd.DataFrame, runs: pd.DataFrame, expected: Iterable[str] = (),
               refs: TestbedRefs | None = None) -> list[dict]:
    """Findings on tidy tables: missing points, reasons, units, impossible values."""
    issues: list[dict] = []
    ran = {(m["scenario"], m["point"], m["repetition"]) for m in runs.to_dict("records")}
    ran |= {(s, p, None) for s, p, _ in ran}
    for exp in expected:
        key = planned_points([exp]).pop()
        if key not in ran:
            issues.append(_issue("error", "missing_point",
                                 f"expected point {exp} has no result (not even skipped/failed); "
                                 "re-run it or mark it skipped with a reason", key[0], key[1]))
    known_runs = set(runs["run_id"])
    point_of = {m["run_id"]: m["point"] for m in runs.to_dict("records")}
    for rid in sorted(set(rows["run_id"]) - known_runs):
        issues.append(_issue("error", "no_meta", f"rows of run {rid} have no meta block in the runs "
                             "table; re-collect from result.json files", run_id=rid))
    for r in rows.to_dict("records"):
        where = dict(scenario=r["scenario"], point=point_of.get(r["run_id"], ""),
                     run_id=r["run_id"], metric=r["metric"])
        if r["status"] != "ok":
            if not r["reason"]:
                issues.append(_issue("error", "no_reason", f"status {r['status']} without a reason; "
                                     "the parser or runner must say why", **where))
            else:
                issues.append(_issue("info", "marked", f"{r['status']}: {r['reason']}", **where))
            continue
        v = r["value"]
        if v is None or (isinstance(v, float) and not math.isfinite(v)):
            issues.append(_issue("error", "impossible_value", f"value {v!r} with status ok", **where))
            continue
        if r["unit"] not in UNITS:
            issues.append(_issue("warning", "unknown_unit", f"unit {r['unit']!r} is not known to "
                                 "the lab; conversions and line-rate checks skip it", **where))
        elif v < 0:
            issues.append(_issue("error", "impossible_value", f"negative {r['metric']} {v:g} {r['unit']}",
                                 **where))
        elif r["unit"] == "%" and r["metric"] in _BOUNDED_PERCENT_METRICS and v > 100:
            issues.append(_issue("error", "impossible_value", f"{r['metric']} {v:g} % above 100 %", **where))
        elif refs is not None and is_bandwidth(r["unit"]):
            cap = line_capacity_bps(pd.Series(r), refs)
            if cap is not None and convert(v, r["unit"], "bit/s") > cap:
                issues.append(_issue("error", "above_line_rate",
                                     f"{v:g} {r['unit']} exceeds the line rate of its devices "
                                     f"({cap / 1e9:g} Gbit/s); check the tool's unit and window", **where))
    for (scenario, metric), units in rows[rows["status"] == "ok"].groupby(["scenario", "metric"])["unit"]:
        if units.nunique() > 1:
            issues.append(_issue("error", "unit_mismatch",
                                 f"{scenario}/{metric} rows use several units {sorted(units.unique())}; "
                                 "a parser reports the wrong unit", scenario, metric=metric))
    return issues


def collect_testbed(raw_dir, tidy_dir, testbed: str, expected: Iterable[str] = (),
                    refs: TestbedRefs | None = None, write: bool = True) -> CollectResult:
    """Read data/raw/<testbed> (only the ``expected`` points where it names any: see :func:`read_raw`), write
    data/tidy/<testbed>/{rows,runs}.parquet, run the checks."""
    expected = list(expected)
    rows, metas, issues = read_raw(raw_dir, testbed, planned_points(expected))
    rows_df = rows_frame(rows)
    runs_df = runs_frame(metas)
    dup = runs_df["run_id"][runs_df["run_id"].duplicated()]
    for rid in sorted(set(dup)):
        issues.append(_issue("error", "duplicate_run", f"run_id {rid} appears in several result files; "
                             "run ids must be unique per testbed", run_id=rid))
    flagged = {(i["scenario"], i["point"]) for i in issues if i["check"] == "missing_point"}
    issues += [i for i in check_tidy(rows_df, runs_df, expected, refs)     # a crashed point is named once
               if i["check"] != "missing_point" or (i["scenario"], i["point"]) not in flagged]
    out = write_tidy(tidy_dir, testbed, rows_df, runs_df) if write else None
    return CollectResult(rows_df, runs_df, pd.DataFrame(issues, columns=ISSUE_COLUMNS), out)


def write_raw_from_tidy(rows: pd.DataFrame, runs: pd.DataFrame, raw_dir, testbed: str) -> list[Path]:
    """Write one result.json per run (the pipeline's raw layout) from tidy tables; for fixtures."""
    written = []
    for run in runs.to_dict("records"):
        meta_kw = {k: (run_field(run, k) if k in RUN_DICT_FIELDS else run[k])
                   for k in RUN_COLUMNS if k != "source"}
        meta_kw["schema_version"] = int(meta_kw.get("schema_version") or tidy.SCHEMA_VERSION)
        meta_kw["repetition"] = int(meta_kw.get("repetition") or 0)
        meta = tidy.RunMeta(**meta_kw)
        rs = []
        for rec in rows[rows["run_id"] == meta.run_id].to_dict("records"):
            kw = {k: (None if _missing(v) else v) for k, v in rec.items()}
            for k in _INT_COLUMNS:
                if kw.get(k) is not None:
                    kw[k] = int(kw[k])
            kw["repetition"] = kw.get("repetition") or 0
            kw["extra"] = json.loads(kw["extra"]) if kw.get("extra") else {}
            rs.append(tidy.Row(**kw))
        path = Path(raw_dir) / testbed / meta.scenario / meta.point / f"rep{meta.repetition}" / tidy.RESULT_FILE
        tidy.write_result(path, meta, rs)
        written.append(path)
    return written


def _missing(v: Any) -> bool:
    return v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v))
