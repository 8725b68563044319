"""Expected values with tolerances, line rates, and the verdict each tidy row gets.

The references file is YAML (``data/reference/references.yaml`` by default)::

    schema_version: 1
    testbeds:
      my-cluster:
        extends: peercache-8xcx7-roce     # optional: inherit checks and line rates
        line_rate:                        # physical rate of one device
          default: {value: 400, unit: Gbit/s}
          mlx5_bond_3: {value: 200, unit: Gbit/s}
        checks:
          - scenario: single_nic
            metric: get_throughput
            where: {tool: peercache-bench}  # optional: equality filters on row columns
                                            # ("extra.<key>" looks inside the extra JSON)
            target: 46.0
            lower: 10                       # % below target still "ok"
            upper: 10                       # % above target still "ok"
            unit: GB/s

Verdicts (``tidy.VERDICTS``): ``ok`` / ``low`` / ``high`` against a matching
check, ``unchecked`` when no check matches or the row has no value, and
``above_line_rate`` when a bandwidth exceeds what the row's devices can carry
physically -- that one wins over any tolerance, because such a value is a
measurement or reporting error (or a wrong line rate), never a result.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from peercache.lab.tidy import UNITS, VERDICTS, convert, is_bandwidth  # noqa: F401 (re-exported)

REFERENCES_SCHEMA_VERSION = 1

# The unit table and its conversions belong to the result schema (tidy), so the pipeline's
# point runner converts with the same table; they are re-exported here for the analysis code.


@dataclass
class Check:
    """One expected value: target with lower/upper tolerance in percent."""

    scenario: str
    metric: str
    target: float
    unit: str
    lower: float = 10.0   #: percent below target still ok
    upper: float = 10.0   #: percent above target still ok
    where: dict[str, Any] = field(default_factory=dict)  #: equality filters on row columns

    def matches(self, row: pd.Series) -> bool:
        """True when this check applies to ``row``."""
        if row["scenario"] != self.scenario or row["metric"] != self.metric:
            return False
        for col, want in self.where.items():
            if col.startswith("extra."):
                have = row_extra(row).get(col[len("extra."):])
            elif col in row.index:
                have = row[col]
            else:
                return False
            if _isnull(have) or not _same(have, want):
                return False
        return True


def _same(have: Any, want: Any) -> bool:
    # Integer columns come back as floats when they hold nulls (131072.0).
    if isinstance(want, (int, float)) and not isinstance(want, bool):
        try:
            return float(have) == float(want)
        except (TypeError, ValueError):
            return False
    return str(have) == str(want)


@dataclass
class TestbedRefs:
    """References of one testbed: line rates per device and checks."""

    line_rate: dict[str, tuple[float, str]] = field(default_factory=dict)  #: device|"default" -> (value, unit)
    checks: list[Check] = field(default_factory=list)

    def line_rate_bps(self, device: str) -> float | None:
        """Physical rate of ``device`` in bit/s, or None when not known."""
        entry = self.line_rate.get(device) or self.line_rate.get("default")
        if entry is None:
            return None
        return convert(entry[0], entry[1], "bit/s")


def _isnull(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA


def load_references(path) -> dict[str, TestbedRefs]:
    """Read a references YAML file into ``{testbed: TestbedRefs}``."""
    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise FileNotFoundError(f"references file {path} not found; pass the path of a "
                                "references YAML (e.g. data/reference/references.yaml)") from None
    if doc.get("schema_version") != REFERENCES_SCHEMA_VERSION:
        raise ValueError(f"{path}: references schema_version {doc.get('schema_version')!r}, "
                         f"this code reads {REFERENCES_SCHEMA_VERSION}")
    raw = doc.get("testbeds") or {}
    out: dict[str, TestbedRefs] = {}

    def build(name: str, seen: tuple[str, ...]) -> TestbedRefs:
        if name in out:
            return out[name]
        if name in seen:
            raise ValueError(f"{path}: testbed {name!r} extends itself through {' -> '.join(seen)}")
        if name not in raw:
            raise ValueError(f"{path}: testbed {seen[-1]!r} extends {name!r}, which is not defined")
        spec = raw[name] or {}
        refs = TestbedRefs()
        if spec.get("extends"):
            base = build(spec["extends"], seen + (name,))
            refs.line_rate.update(base.line_rate)
            refs.checks.extend(base.checks)
        for dev, lr in (spec.get("line_rate") or {}).items():
            try:
                refs.line_rate[dev] = (float(lr["value"]), str(lr["unit"]))
                convert(1.0, refs.line_rate[dev][1], "bit/s")
            except (KeyError, TypeError, ValueError) as e:
                raise ValueError(f"{path}: testbed {name!r} line_rate {dev!r} must be "
                                 f"{{value: N, unit: Gbit/s}} with a bandwidth unit ({e})") from None
        for i, c in enumerate(spec.get("checks") or []):
            try:
                check = Check(scenario=c["scenario"], metric=c["metric"], target=float(c["target"]),
                              unit=str(c["unit"]), lower=float(c.get("lower", 10.0)),
                              upper=float(c.get("upper", 10.0)), where=dict(c.get("where") or {}))
            except (KeyError, TypeError, ValueError) as e:
                raise ValueError(f"{path}: testbed {name!r} check #{i} needs scenario, metric, "
                                 f"target, unit (and optional lower, upper, where): {e}") from None
            if check.unit not in UNITS:
                raise ValueError(f"{path}: testbed {name!r} check #{i}: unknown unit {check.unit!r}")
            refs.checks.append(check)
        out[name] = refs
        return refs

    for name in raw:
        build(name, ())
    return out


def row_devices(row: pd.Series) -> list[str]:
    """Device names a row's value was measured over (empty when not recorded)."""
    devs = row.get("devices")
    if _isnull(devs) or not str(devs).strip():
        return []
    return [d.strip() for d in str(devs).split(",") if d.strip()]


def row_extra(row: pd.Series) -> dict[str, Any]:
    """The row's ``extra`` field as a dict (it is JSON text in tidy tables)."""
    ex = row.get("extra")
    if isinstance(ex, dict):
        return ex
    if _isnull(ex) or ex == "":
        return {}
    return json.loads(ex)


def line_capacity_bps(row: pd.Series, refs: TestbedRefs) -> float | None:
    """Most bit/s the row's devices can carry, or None when it cannot be told."""
    devs = row_devices(row)
    extra = row_extra(row)
    if row.get("side") == "per_device":
        # A per-device figure (or a statistic over devices) is bounded by one
        # device; take the fastest of the set so only certain violations flag.
        rates = [refs.line_rate_bps(d) for d in devs] or [refs.line_rate_bps("")]
        rates = [r for r in rates if r is not None]
        return max(rates) if rates else None
    if devs:
        rates = [refs.line_rate_bps(d) for d in devs]
        return None if any(r is None for r in rates) else sum(rates)
    n = extra.get("n_devices")
    one = refs.line_rate_bps("")
    if n and one is not None:
        return one * int(n)
    return None


def verdict_for(row: pd.Series, refs: TestbedRefs | None) -> tuple[str, str]:
    """(verdict, why) for one tidy row against its testbed's references."""
    value = row.get("value")
    if row.get("status") != "ok" or _isnull(value):
        return "unchecked", f"no value (status {row.get('status')})"
    if refs is None:
        return "unchecked", "no references for this testbed"
    unit = str(row["unit"])
    if is_bandwidth(unit):
        cap = line_capacity_bps(row, refs)
        if cap is not None:
            bps = convert(float(value), unit, "bit/s")
            if bps > cap:
                return ("above_line_rate",
                        f"{value:g} {unit} = {bps / 1e9:.1f} Gbit/s exceeds the devices' line rate "
                        f"{cap / 1e9:g} Gbit/s")
    for check in refs.checks:
        if not check.matches(row):
            continue
        v = convert(float(value), unit, check.unit)
        lo = check.target * (1 - check.lower / 100.0)
        hi = check.target * (1 + check.upper / 100.0)
        span = f"target {check.target:g} {check.unit} (-{check.lower:g}%/+{check.upper:g}%)"
        if v < lo:
            return "low", f"{v:g} {check.unit} below {span}"
        if v > hi:
            return "high", f"{v:g} {check.unit} above {span}"
        return "ok", f"{v:g} {check.unit} within {span}"
    return "unchecked", "no reference for this scenario/metric"


def apply_verdicts(df: pd.DataFrame, refs: dict[str, TestbedRefs]) -> pd.DataFrame:
    """Copy of tidy rows ``df`` with ``verdict`` and ``verdict_reason`` columns added."""
    out = df.copy()
    verdicts, reasons = [], []
    for _, row in out.iterrows():
        v, why = verdict_for(row, refs.get(str(row.get("testbed", ""))))
        assert v in VERDICTS
        verdicts.append(v)
        reasons.append(why)
    out["verdict"] = pd.Series(verdicts, index=out.index, dtype=object)
    out["verdict_reason"] = pd.Series(reasons, index=out.index, dtype=object)
    return out


def load_bench_targets(path=None, bound: str = "at_least") -> dict[str, float]:
    """``make bench``'s targets from the references file: ratio name -> the least median that meets
    it (``bound="at_least"``), or the largest (``bound="at_most"``: a latency over its baseline)."""
    path = Path(path) if path else Path(__file__).resolve().parents[3] / "data" / "reference" / "references.yaml"
    doc = yaml.safe_load(path.read_text()) or {}
    out = {}
    for name, t in (doc.get("bench_targets") or {}).items():
        try:
            (how, value), = t.items()
            if how not in ("at_least", "at_most"):
                raise KeyError(how)
            if how == bound:
                out[str(name)] = float(value)
        except (KeyError, TypeError, ValueError, AttributeError):
            raise ValueError(f"{path}: bench_targets.{name} must be {{at_least: N}} or {{at_most: N}}, "
                             f"got {t!r}") from None
    return out
