"""What limited each measurement: evidence from the run, rules from data, a "limited by" with reasons.

The runner records evidence beside each throughput row (CPU use of each
side's process tree over the measured window, port counters and line rates,
NUMA bindings); :func:`evidence` gathers it, with the raw limit of the same
path from the same run, into one flat dict. The rules
(``data/reference/attribution.yaml``) are tried in order; :func:`limited_by`
returns the first that holds, formatted with the evidence, for example
``one core (consumer thread at 0.98 of a core)``. Nothing here is measured
or guessed: a field that was not recorded is absent, and a rule that needs
it does not fire.
"""
from __future__ import annotations

import json
import math
import operator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from peercache.lab.analysis.rawlimit import BW_METRICS
from peercache.lab.analysis.references import convert, row_devices, row_extra
from peercache.lab.analysis.spread import point_keys
from peercache.lab.tools.hicache_suite import PRIMARY as SUITE_PRIMARY

RULES_FILE = Path(__file__).resolve().parents[3] / "data" / "reference" / "attribution.yaml"
SCHEMA_VERSION = 1

#: Evidence fields a rule may test (see the rules file for their meaning).
EVIDENCE = ("fraction_of_raw", "raw_tool", "raw_busiest_thread", "raw_retransmits", "GBps_per_core",
            "raw_GBps_per_core", "raw_cores", "per_core_vs_raw", "line_fraction", "line_rate_gbps", "consumer_busiest_thread",
            "producer_busiest_thread", "consumer_cores", "producer_cores", "cpu_fraction", "host_cores",
            "numa_remote", "memory_node", "nic_node", "summed_windows", "pcie_fraction", "pcie_GBps",
            "pcie_gen", "pcie_width", "rails", "rail_low", "rail_low_share", "rail_fair_share", "rail_low_vs_fair",
            "consumer_runnable", "consumer_runnable_wait", "consumer_runnable_cpu", "producer_runnable",
            "producer_runnable_wait", "producer_runnable_cpu", "machine_cpus", "machine_busy_cores", "machine_busy",
            "softirq_cores", "ksoftirqd_cores", "steal_cores", "procs_cores", "other_cores", "peer_busy_cores", "peer_cpus",
            "peer_machine_busy")
#: The rows attribution judges: every bandwidth figure, and the HiCache suite's pages/s (its headline: every
#: op has one, exists moves no bytes; its CPU evidence is of that point's own window).
ATTRIBUTED = (*BW_METRICS, SUITE_PRIMARY)
_OPS = {"gt": operator.gt, "ge": operator.ge, "lt": operator.lt, "le": operator.le, "eq": operator.eq}


class RulesError(ValueError):
    """The rules file is malformed; the message names the rule and field."""


@dataclass(frozen=True)
class Rule:
    """One rule: conditions on evidence fields, and the sentence it says."""

    id: str
    when: dict[str, tuple[str, Any]]     #: field -> (op, value)
    says: str

    def holds(self, ev: dict[str, Any]) -> bool:
        for name, (op, want) in self.when.items():
            have = ev.get(name)
            if have is None:
                return False
            try:
                if not _OPS[op](have, want):
                    return False
            except TypeError:
                return False
        return True


def load_rules(path: str | Path = RULES_FILE) -> list[Rule]:
    """The rules of ``path``, checked; RulesError names what is wrong."""
    path = Path(path)
    doc = yaml.safe_load(path.read_text())
    if not isinstance(doc, dict) or doc.get("schema_version") != SCHEMA_VERSION:
        raise RulesError(f"{path}: needs schema_version: {SCHEMA_VERSION} and a rules list")
    rules = []
    for i, r in enumerate(doc.get("rules") or []):
        where = f"{path}: rule {i} ({r.get('id', '?') if isinstance(r, dict) else r!r})"
        if not isinstance(r, dict) or not {"id", "when", "says"} <= set(r):
            raise RulesError(f"{where}: needs id, when and says")
        when = {}
        for field_name, cond in (r["when"] or {}).items():
            if field_name not in EVIDENCE:
                raise RulesError(f"{where}: unknown evidence field {field_name!r} (known: {', '.join(EVIDENCE)})")
            if not isinstance(cond, dict) or len(cond) != 1 or next(iter(cond)) not in _OPS:
                raise RulesError(f"{where}: condition on {field_name!r} must be one of "
                                 f"{{{', '.join(_OPS)}: value}}, got {cond!r}")
            (op, val), = cond.items()
            when[field_name] = (op, val)
        rules.append(Rule(str(r["id"]), when, str(r["says"])))
    if not rules or rules[-1].when:
        raise RulesError(f"{path}: the last rule must have no conditions (what to say when nothing holds)")
    return rules


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def evidence(row: pd.Series | dict, *, raw_Bps: float | None = None, raw_tool: str | None = None,
             raw_busiest_thread: float | None = None, raw_retransmits: float | None = None,
             raw_cpu: dict[str, float] | None = None, line_rate_Bps: float | None = None, host_cores: int | None = None,
             shared_host: bool = False, numa: dict[str, Any] | None = None,
             pcie: list[dict[str, Any]] | None = None, rail_shares: dict[str, float] | None = None) -> dict[str, Any]:
    """The evidence of one throughput row (pure): what was recorded, nothing filled in. ``rail_shares``: each
    rail's share of the bytes over the row's window (collect's ``rail_share`` rows), where it had two or more."""
    ex = row_extra(row)
    ev: dict[str, Any] = {}
    try:
        bps = convert(float(row["value"]), str(row["unit"]), "B/s")
    except (TypeError, ValueError):
        bps = None
    if bps is not None and raw_Bps:
        ev["fraction_of_raw"], ev["raw_tool"] = bps / raw_Bps, raw_tool
        if _num(raw_busiest_thread) is not None:
            ev["raw_busiest_thread"] = float(raw_busiest_thread)
        if _num(raw_retransmits) is not None:
            ev["raw_retransmits"] = float(raw_retransmits)
    line = _num(ex.get("line_rate_Bps")) or line_rate_Bps
    if bps is not None and line:
        ev["line_fraction"], ev["line_rate_gbps"] = bps / line, line * 8 / 1e9
    if bps is not None and pcie and all(p and p.get("GBps") for p in pcie):
        ev["pcie_GBps"] = sum(p["GBps"] for p in pcie)
        ev.update(pcie_fraction=bps / 1e9 / ev["pcie_GBps"], pcie_gen=pcie[0]["gen"], pcie_width=pcie[0]["width"])
    if ex.get("aggregate") == "sum_of_windows":
        ev["summed_windows"] = True
    cpu = ex.get("cpu") or {}
    machines = {side: (cpu.get(side) or {}).get("machine") or {} for side in ("consumer", "producer")}
    # one machine under both sides: the testbed says so, or both samplers read one kernel's boot id
    # (network namespaces)
    shared_host = shared_host or bool(machines["consumer"].get("boot")
                                      and machines["consumer"].get("boot") == machines["producer"].get("boot"))
    used = 0.0
    for side in ("consumer", "producer"):
        u = cpu.get(side) or {}
        if _num(u.get("cores")) is not None:
            ev[f"{side}_cores"] = float(u["cores"])
            ev[f"{side}_busiest_thread"] = float(u.get("busiest_thread") or 0.0)
            if side == "consumer" or shared_host:
                used += float(u["cores"])
        if _num(u.get("runnable")) is not None:
            wait = float(u.get("runnable_wait") or 0.0)
            ev.update({f"{side}_runnable": float(u["runnable"]), f"{side}_runnable_wait": wait,
                       f"{side}_runnable_cpu": max(0.0, float(u["runnable"]) - wait)})
    if host_cores and ("consumer_cores" in ev or "producer_cores" in ev):
        ev["host_cores"], ev["cpu_fraction"] = int(host_cores), used / host_cores
    ev.update(_machine_evidence(machines["consumer"], used))
    # the producer's machine: its own reading, or the consumer's where they are one machine
    peer = machines["consumer"] if shared_host else machines["producer"]
    if peer.get("cpus") and _num(peer.get("busy_cores")) is not None:
        ev.update(peer_busy_cores=float(peer["busy_cores"]), peer_cpus=int(peer["cpus"]),
                  peer_machine_busy=float(peer["busy_cores"]) / int(peer["cpus"]))
    # Bytes per busy core of the figure and of its raw run, counted alike (the consumer; both sides on one machine)
    raw_used = sum(c for s, c in (raw_cpu or {}).items() if s == "consumer" or shared_host)
    if bps and raw_Bps and used > 0 and raw_used > 0 and "consumer_cores" in ev and "consumer" in (raw_cpu or {}):
        ev.update(GBps_per_core=bps / 1e9 / used, raw_GBps_per_core=raw_Bps / 1e9 / raw_used, raw_cores=raw_used,
                  per_core_vs_raw=(bps / used) / (raw_Bps / raw_used))
    if rail_shares and len(rail_shares) >= 2:
        # the rail that carried least, against an even split of the bytes over the rails
        low = min(sorted(rail_shares), key=lambda k: rail_shares[k])
        n = len(rail_shares)
        ev.update(rails=n, rail_low=low, rail_low_share=float(rail_shares[low]), rail_fair_share=1.0 / n,
                  rail_low_vs_fair=float(rail_shares[low]) * n)
    if numa and numa.get("memory_node") is not None and numa.get("nic_node") is not None:
        ev.update(memory_node=numa["memory_node"], nic_node=numa["nic_node"],
                  numa_remote=numa["memory_node"] != numa["nic_node"])
    return ev


def _machine_evidence(m: dict, procs_cores: float) -> dict[str, Any]:
    """The consumer machine's CPUs over the window (cpusample's ``machine`` reading): busy, and how much of
    it was interrupts and softirqs, ksoftirqd, a hypervisor's steal and the measured processes."""
    if not m.get("cpus") or _num(m.get("busy_cores")) is None:
        return {}
    return {"machine_cpus": int(m["cpus"]), "machine_busy_cores": float(m["busy_cores"]),
            "machine_busy": float(m["busy_cores"]) / int(m["cpus"]),
            "softirq_cores": float(m.get("softirq_cores") or 0.0), "ksoftirqd_cores": float(m.get("ksoftirqd_cores") or 0.0),
            "steal_cores": float(m.get("steal_cores") or 0.0), "procs_cores": procs_cores,
            # busy neither in the measured processes nor in interrupts and softirqs: other processes, kernel threads
            "other_cores": max(0.0, float(m["busy_cores"]) - procs_cores - float(m.get("softirq_cores") or 0.0))}


#: How a rule's threshold reads in a "ruled out" list.
_OP_TEXT = {"gt": ">", "ge": "≥", "lt": "<", "le": "≤", "eq": "="}


def ruled_out(ev: dict[str, Any], rules: list[Rule]) -> str:
    """What the rules with one numeric limit checked and found below it, with the values, and the evidence they
    could not check because it was not recorded (pure): "nothing at its limit: consumer_busiest_thread 0.62
    (consumer_core at ≥ 0.9); ...; not measured: line_fraction, pcie_fraction"."""
    # by field, the last rule's limit on it (the lowest: raw_path's 0.8 comes after above_raw's 1)
    low: dict[str, str] = {}
    missing = []
    for rule in rules:
        if len(rule.when) != 1:
            continue
        (name, (op, want)), = rule.when.items()
        if isinstance(want, bool) or not isinstance(want, (int, float)):
            continue
        have = ev.get(name)
        if have is None:
            missing.append(name)
        elif not _OPS[op](have, want):
            low[name] = f"{name} {have:.2f} ({rule.id} at {_OP_TEXT[op]} {want:g})"
    text = ("nothing at its limit: " + "; ".join(low.values())) if low else "no evidence was recorded"
    missing = list(dict.fromkeys(missing))
    return text + (f"; not measured: {', '.join(missing)}" if missing else "")


def limited_by(ev: dict[str, Any], rules: list[Rule]) -> tuple[str, str]:
    """(rule id, sentence) of the first rule that holds for ``ev``; the last rule (nothing held) may say what was
    ruled out (``{ruled_out}``)."""
    for rule in rules:
        if rule.holds(ev):
            if not rule.when:
                ev = dict(ev, ruled_out=ruled_out(ev, rules))
            try:
                return rule.id, rule.says.format(**ev)
            except (KeyError, ValueError, IndexError) as e:
                return rule.id, f"{rule.says} (cannot fill in {e})"
    raise RulesError("no rule held; the last rule must have no conditions")


def _numa(row, devs: list[str], nics: dict[str, dict]) -> dict[str, Any] | None:
    """Where the consumer's memory sat (cpusample's numa_maps reading) and its NICs' node, when both are known."""
    mem = ((row_extra(row).get("cpu") or {}).get("consumer") or {}).get("memory_node")
    nodes = {(nics.get(d) or {}).get("numa_node") for d in devs}
    if mem is None or len(nodes) != 1 or None in nodes:
        return None
    return {"memory_node": int(mem), "nic_node": int(nodes.pop())}


def host_of(runs: pd.DataFrame, run_id: str) -> tuple[int | None, bool, dict[str, dict]]:
    """Of one run: (the consumer machine's logical CPUs, whether producer and consumer share it,
    the consumer's NICs by name from its testbed capture)."""
    m = runs[runs["run_id"] == run_id]
    if m.empty:
        return None, False, {}
    hosts = m.iloc[0]["hosts"]
    hosts = json.loads(hosts) if isinstance(hosts, str) else (hosts or {})
    cons, prod = hosts.get("consumer") or {}, hosts.get("producer") or {}
    threads = cons.get("threads") or prod.get("threads")
    shared = bool(cons.get("host")) and cons.get("host") == prod.get("host")
    nics = {n.get("name"): n for n in cons.get("nics") or [] if isinstance(n, dict)}
    return (int(threads) if threads else None), shared, nics


def rail_shares_of(rows: pd.DataFrame) -> dict[tuple[str, Any], dict[str, float]]:
    """{(run id, threads): {rail: share}} of the ok ``rail_share`` rows (collect's, from the metrics scrapes)."""
    out: dict[tuple[str, Any], dict[str, float]] = {}
    sub = rows[(rows["metric"] == "rail_share") & (rows["status"] == "ok") & rows["value"].notna()]
    for _, r in sub.iterrows():
        out.setdefault((r["run_id"], _threads(r)), {})[str(r["devices"])] = float(r["value"])
    return out


def _threads(r) -> int | None:
    t = r.get("threads")
    return None if t is None or pd.isna(t) else int(t)


def attribute(rows: pd.DataFrame, runs: pd.DataFrame, raw_of, rules: list[Rule] | None = None,
              line_rate_of=lambda row: None) -> pd.DataFrame:
    """``rows`` with ``limited_by`` (sentence) and ``limit`` (rule id) on every ok throughput row.

    ``raw_of(row)``: the raw limit (:class:`peercache.lab.analysis.rawlimit.RawLimit`: ``bps``, ``label``,
    ``busiest_thread``, ``retransmits``, ``cores``) of the same path measured the same way in the same run, over
    as many NICs as the row, or None (raw rows themselves, or nothing comparable); ``line_rate_of(row)``: the
    row's summed line rate in bit/s from the references, or None (the runner's port rates are used first).
    """
    rules = rules or load_rules()
    shares = rail_shares_of(rows) if {"metric", "status", "value", "devices"} <= set(rows.columns) else {}
    out = rows.copy()
    out["limited_by"], out["limit"] = None, None
    for i, r in out.iterrows():
        if r["metric"] not in ATTRIBUTED or r["status"] != "ok" or pd.isna(r["value"]):
            continue
        raw = raw_of(r)    # already scaled to the row's NICs (rawlimit.raw_for)
        cores, shared, nics = host_of(runs, r["run_id"])
        devs = row_devices(r)
        bits = line_rate_of(r)
        ev = evidence(r, raw_Bps=raw.bps if raw else None, raw_tool=raw.label if raw else None,
                      raw_busiest_thread=raw.busiest_thread if raw else None,
                      raw_retransmits=raw.retransmits if raw else None,
                      raw_cpu=dict(raw.cores) if raw and raw.cores else None,
                      line_rate_Bps=bits / 8 if bits else None, host_cores=cores, shared_host=shared,
                      pcie=[(nics.get(d) or {}).get("pcie") for d in devs] if devs and nics else None,
                      numa=_numa(r, devs, nics),
                      # a group's own row is one rail of the whole machine: its share says nothing of it alone
                      rail_shares=None if r.get("side") == "per_device" else shares.get((r["run_id"], _threads(r))))
        out.at[i, "limit"], out.at[i, "limited_by"] = limited_by(ev, rules)
    return out


def within_spread(rows: pd.DataFrame, raw_of) -> pd.DataFrame:
    """``rows`` judged "above raw" by a rule but measured several times with a run at or below the raw limit:
    the ranges overlap, so the verdict is not drawn. Such a row says "the path itself, within the spread of
    raw" with the point's runs (rule id ``raw_spread``); a point measured once keeps its rule's verdict."""
    out = rows.copy()
    ok = out[(out["status"] == "ok") & out["value"].notna() & out["metric"].isin(list(ATTRIBUTED))]
    if not (ok["limit"] == "above_raw").any():
        return out
    # every run of the point, of the same figure (spread.point_keys: the grouping every spread is read by)
    for _, same in ok.groupby(point_keys(ok), sort=False, dropna=False):
        above = same[same["limit"] == "above_raw"]
        if len(same) < 2 or above.empty:
            continue
        gbs = sorted(convert(float(v), str(u), "GB/s") for v, u in zip(same["value"], same["unit"]))
        for i, r in above.iterrows():
            lim = raw_of(r)
            if lim is not None and lim.gbs and gbs[0] <= lim.gbs:
                out.at[i, "limit"] = "raw_spread"
                out.at[i, "limited_by"] = (
                    f"the path itself, within the spread of raw: its {len(gbs)} runs {gbs[0]:.4g}–{gbs[-1]:.4g} "
                    f"GB/s against {lim.label} at {lim.gbs:.4g} GB/s")
    return out
