"""cluster: the traffic patterns of a shared KV cache (pairwise, incast, fan-out, shared) against hosts.

One figure per pattern: PeerCache's aggregate GB/s (blue) beside the raw pattern's (grey) at each host
count, with every consumer host's own figure as a dot over its bar; the table gives per point the
aggregate, raw, the share of raw, the per-host range, Jain's fairness index, p99 batch latency, the hit
rate, wrong pages and CPU seconds per GiB; the overview has a row per pattern (its largest host count);
the conclusions say how each pattern scaled from its smallest to its largest host count and what
limited it (the raw pattern, or the CPU every host shares).

The directory under the patterns (points with ``op: exists``: the consumers only look their keys up, with
no location cache): lookups/s and the worst host's p99 batch lookup latency against the clients, per
directory, in one figure and a table; each is set against the keys/s the same pattern's GETs read at
the same host count (a read that misses the location cache looks up every key), which says which
directory would limit which pattern's uncached reads, and from how many hosts on.
"""
from __future__ import annotations

from typing import Any

import pandas as pd

from peercache.lab.analysis.format import fmt_number, short_run, throughput_text, why_empty
from peercache.lab.analysis.metablock import meta_block
from peercache.lab.analysis.rawlimit import pct_text
from peercache.lab.analysis.references import TestbedRefs, row_extra
from peercache.lab.analysis.scenarios.declare import (Chart, Conclusion, Limits, NotDrawn, Scenario, Table, gbs,
                                                      ok_rows, overview_row)
from peercache.lab.analysis.scenarios.draw import PEERCACHE_COLOR, RAW_COLOR, new_fig, raw_legend
from peercache.lab.pipeline.points.cluster import PATTERNS
from peercache.lab.pipeline.points.cluster_raw import RAW_FORMS, RAW_TOOLS

#: A figure at or above this share of its raw pattern is limited by what the raw pattern is limited by.
RAW_BOUND_SHARE = 0.8
#: CPU seconds per second at or above this share of the machine's logical CPUs: the CPU limited the run.
CPU_BOUND_SHARE = 0.8
#: Aggregates grown by less than this share of the hosts' growth have stopped scaling.
SCALING_SHARE = 0.7
#: A directory process busy at or above this share of one core limited the lookups (Redis serves its
#: commands on one thread).
DIRECTORY_CORE_SHARE = 0.8
#: Markers of the directories' curves in the lookup figure.
DIRECTORY_MARKERS = {"embedded": "o", "redis": "s", "redis-cluster": "^"}


def points(sub: pd.DataFrame) -> list[dict[str, Any]]:
    """One record per cluster point (run): its pattern, hosts, aggregates, per-host figures and evidence."""
    recs: dict[str, dict[str, Any]] = {}
    for _, r in sub.iterrows():
        ex = row_extra(r)
        if ex.get("pattern") is None or ex.get("op", "get") != "get":
            continue
        rec = recs.setdefault(r["run_id"], {"run": r["run_id"], "pattern": ex["pattern"], "hosts": ex["hosts"],
                                            "zipf_s": ex.get("zipf_s"),
                                            "directory": ex.get("directory") or "embedded", "per_host": {}, "raw_per_host": {},
                                            "p99": [], "failed": []})
        if r["status"] == "failed":
            rec["failed"].append(f"{r['tool']}: {r['reason']}")
            continue
        if r["status"] != "ok" or pd.isna(r["value"]):
            continue
        key = (r["tool"], r["metric"], r["side"])
        if key == ("peercache-bench", "get_throughput", "aggregate"):
            rec.update(agg=gbs(r), row=r, cpu_s=ex.get("cpu_s"), machine_cpus=ex.get("machine_cpus"),
                       machine_busy=ex.get("machine_busy_cores"),
                       window_s=(ex["window_end"] - ex["window_start"]) if ex.get("window_end") else None)
        elif key == ("peercache-bench", "get_throughput", "per_host"):
            rec["per_host"][r["devices"]] = gbs(r)
        elif key[0] in RAW_TOOLS and key[2] == "aggregate":
            rec.update(raw=gbs(r), raw_tool=r["tool"])
        elif key[0] in RAW_TOOLS and key[2] == "per_host":
            rec["raw_per_host"][r["devices"]] = gbs(r)
        elif key == ("peercache-bench", "jain_index", "aggregate"):
            rec["jain"] = float(r["value"])
        elif key == ("peercache-bench", "latency_p99", "per_host"):
            rec["p99"].append(float(r["value"]))
        elif key == ("peercache-bench", "hit_rate", "aggregate"):
            rec["hit_rate"] = float(r["value"])
        elif key == ("peercache-bench", "verify_failures", "aggregate"):
            rec["wrong"] = int(r["value"])
        elif key == ("peercache-bench", "cpu_s_per_gib", "aggregate"):
            rec["cpu_per_gib"] = float(r["value"])
        if key[1:] == ("get_throughput", "aggregate"):
            rec["size_bytes"] = r.get("size_bytes")
    return sorted(recs.values(), key=lambda x: (PATTERNS.index(x["pattern"]) if x["pattern"] in PATTERNS else 99,
                                                 x["zipf_s"] or 0, x["directory"], x["hosts"]))


def label(rec: dict[str, Any]) -> str:
    """'shared (Zipf s=0.8)', 'incast' ..."""
    return (rec["pattern"] + (f" (Zipf s={rec['zipf_s']:g})" if rec.get("zipf_s") is not None else "")
            + ("" if rec.get("directory", "embedded") == "embedded" else f", {rec['directory']} directory"))


def series_key(rec: dict[str, Any]) -> tuple:
    """What a pattern's curve against hosts is drawn for: the pattern, Zipf exponent and directory."""
    return rec["pattern"], rec["zipf_s"], rec.get("directory", "embedded")


def limited_by(rec: dict[str, Any]) -> str:
    """What limited one point, with its evidence: the CPU every host shares (hosts on one machine), the raw
    pattern, or unknown."""
    cpus = rec.get("machine_cpus")
    procs = (rec["cpu_s"] / rec["window_s"]) if rec.get("cpu_s") and rec.get("window_s") else None
    # the machine's own reading counts the kernel's network work too, which no process of the point is charged
    busy = rec.get("machine_busy") if rec.get("machine_busy") is not None else procs
    if busy is not None and cpus and busy >= CPU_BOUND_SHARE * cpus:
        return (f"CPU: {busy:.1f} of the machine's {cpus} logical CPUs busy over the window"
                + (f" ({procs:.1f} in the hosts' processes, the rest the kernel's network work)"
                   if procs is not None and rec.get("machine_busy") is not None else ""))
    if rec.get("raw") and rec.get("agg") and rec["agg"] >= RAW_BOUND_SHARE * rec["raw"]:
        return f"the raw pattern's links: {100 * rec['agg'] / rec['raw']:.0f}% of its {fmt_number(rec['raw'])} GB/s"
    why = []
    if busy is not None:
        why.append(f"{busy:.1f} CPUs busy" + (f" of {cpus}" if cpus else ""))
    if rec.get("raw") and rec.get("agg"):
        why.append(f"{100 * rec['agg'] / rec['raw']:.0f}% of raw")
    return "unknown (" + ", ".join(why) + ")" if why else "unknown (no CPU or raw evidence)"


def figure_of(pattern: str):
    """The figure builder of one pattern."""

    def figure(rows: pd.DataFrame, runs: pd.DataFrame, refs: TestbedRefs | None) -> Chart | NotDrawn:
        recs = [r for r in points(rows) if r["pattern"] == pattern]
        drawn = [r for r in recs if r.get("agg") is not None]
        if not drawn:
            failed = "; ".join(f for r in recs for f in r["failed"])
            return NotDrawn(f"cluster_{pattern}", failed or why_empty(rows, f"a {pattern} aggregate"))
        fig, axes = new_fig(w=7.5)
        ax = axes[0][0]
        table, x, ticks = [], 0.0, []
        for rec in drawn:
            ax.bar(x - 0.2, rec["agg"], 0.4, color=PEERCACHE_COLOR)
            ax.annotate(f"{rec['agg']:.2f}", (x - 0.2, rec["agg"]), ha="center", va="bottom", fontsize=7)
            if rec.get("raw") is not None:
                ax.bar(x + 0.2, rec["raw"], 0.4, color=RAW_COLOR)
                ax.annotate(f"{rec['raw']:.2f}", (x + 0.2, rec["raw"]), ha="center", va="bottom", fontsize=7)
            vals = list(rec["per_host"].values())
            ax.scatter([x - 0.2] * len(vals), vals, s=12, color="black", zorder=3)
            ticks.append((x, f"{rec['hosts']} hosts" + (f"\ns={rec['zipf_s']:g}" if rec.get("zipf_s") else "")
                          + ("" if rec["directory"] == "embedded" else f"\n{rec['directory']}")))
            table.append(record(rec))
            x += 1.0
        ax.set_xticks([t[0] for t in ticks], [t[1] for t in ticks], fontsize=8)
        ax.set_ylabel("GB/s (bars: aggregate; dots: each consumer host)")
        top = max([r["agg"] for r in drawn] + [r["raw"] for r in drawn if r.get("raw") is not None])
        ax.set_ylim(0, top * 1.3)      # room for the legend above the bars
        raw_legend(ax)
        notes = [raw_note(pattern, [r.get("raw_tool") for r in drawn])]
        missing = [f for r in recs for f in r["failed"]]
        if missing:
            notes.append("failed: " + "; ".join(missing))
        return Chart(f"cluster_{pattern}", f"Cluster, {pattern}: aggregate and per-host GET throughput against hosts",
                     fig, table, meta_block(ok_rows(rows[rows["run_id"].isin([r["run"] for r in drawn])]), runs),
                     notes)

    return figure


def raw_note(pattern: str, tools: list[str | None]) -> str:
    """What the figure's raw bars are: how each raw tool its points used was run (none: not measured)."""
    how = {f.tool: f.how for f in RAW_FORMS.values()}
    ran = [how[t] for t in dict.fromkeys(tools) if t in how]
    if not ran:
        return "raw: not measured"
    return ("raw: " + "; ".join(ran) + (" (a ring: each host sends to the next)" if pattern == "shared" else "")
            + ", all released together and summed over one window")


def record(rec: dict[str, Any]) -> dict[str, Any]:
    """One point's table record."""
    per = list(rec["per_host"].values())
    return {"pattern": label(rec), "hosts": rec["hosts"],
            "aggregate (GB/s)": fmt_number(rec.get("agg")),
            "raw (GB/s)": fmt_number(rec.get("raw")) if rec.get("raw") is not None else "not measured",
            "% of raw": f"{100 * rec['agg'] / rec['raw']:.0f}%" if rec.get("raw") and rec.get("agg") else "—",
            "per host (GB/s)": f"{fmt_number(min(per))} – {fmt_number(max(per))}" if per else "—",
            "Jain": f"{rec['jain']:.3f}" if rec.get("jain") is not None else "—",
            "p99 (µs, worst host)": fmt_number(max(rec["p99"])) if rec["p99"] else "—",
            "hit rate": f"{rec['hit_rate']:.3f}" if rec.get("hit_rate") is not None else "—",
            "wrong pages": rec.get("wrong", "—"),
            "CPU s/GiB": fmt_number(rec.get("cpu_per_gib")) if rec.get("cpu_per_gib") is not None else "—",
            "limited by": limited_by(rec), "run": short_run(rec["run"])}


def scaling(recs: list[dict[str, Any]]) -> tuple[dict, dict, float] | None:
    """(smallest, largest, aggregate growth / host growth) of one pattern's points with an aggregate."""
    got = [r for r in recs if r.get("agg")]
    if len(got) < 2:
        return None
    lo, hi = min(got, key=lambda r: r["hosts"]), max(got, key=lambda r: r["hosts"])
    if hi["hosts"] == lo["hosts"]:
        return None
    return lo, hi, (hi["agg"] / lo["agg"]) / (hi["hosts"] / lo["hosts"])


def churn_records(sub: pd.DataFrame) -> list[dict[str, Any]]:
    """One record per churn run: its summed hit-rate timeline, the events' times, each phase's settled hit
    rate, each event's dip and recovery, the longest stall against its bound, errors and wrong pages."""
    out: dict[str, dict[str, Any]] = {}
    for _, r in ok_rows(sub).iterrows():
        ex = row_extra(r)
        if ex.get("pattern") != "churn":
            continue
        rec = out.setdefault(r["run_id"], {"run": r["run_id"], "hosts": ex.get("hosts"), "phases": {},
                                            "stalls": [], "wrong": None})
        side = str(r["side"])
        if r["metric"] == "errors" and side == "aggregate":
            rec.update(errors=int(r["value"]), timeline=ex.get("timeline") or [], events=ex.get("events") or {},
                       roles=ex.get("roles") or {})
        elif r["metric"] == "verify_failures" and side == "aggregate":
            rec["wrong"] = int(r["value"])
        elif r["metric"] == "hit_rate" and side.startswith("phase:"):
            rec["phases"].setdefault(side[6:], {})["settled"] = float(r["value"])
        elif r["metric"] in ("hit_rate_dip", "recovery_s") and side.startswith("event:"):
            phase = row_extra(r).get("phase")
            rec["phases"].setdefault(phase, {})[r["metric"]] = float(r["value"])
        elif r["metric"] == "max_stall_s":
            rec["stalls"].append((float(r["value"]), ex.get("bound_s")))
    return [r for r in out.values() if "timeline" in r]


def churn_text(rec: dict[str, Any]) -> list[dict[str, Any]]:
    """The churn table: a row per phase."""
    roles = rec.get("roles") or {}
    who = {"after_leave": f"{roles.get('leaves', '?')} leaves (SIGTERM)",
           "after_crash": f"{roles.get('crashes', '?')} crashes (SIGKILL)",
           "after_join": f"{roles.get('joins', '?')} joins with {roles.get('prefix', '?')}'s pages",
           "steady": "before any event"}
    ev = {"after_leave": "leave", "after_crash": "crash", "after_join": "join"}
    rows = []
    for name, ph in rec["phases"].items():
        at = rec["events"].get(ev.get(name, ""), 0.0)
        rows.append({"phase": who.get(name, name), "from (s)": f"{at:.1f}",
                     "settled hit rate": f"{ph['settled']:.3f}" if "settled" in ph else "—",
                     "dip": f"{ph['hit_rate_dip']:.3f}" if "hit_rate_dip" in ph else "—",
                     "back to steady (s)": (f"{ph['recovery_s']:.1f}" if "recovery_s" in ph
                                            else "—" if name == "steady" else "did not settle"),
                     "run": short_run(rec["run"])})
    return rows


def churn_figure(rows: pd.DataFrame, runs: pd.DataFrame, refs: TestbedRefs | None) -> Chart | NotDrawn:
    """Membership churn: the consumers' hit rate against time, each event marked."""
    recs = churn_records(rows)
    if not recs:
        return NotDrawn("cluster_churn", why_empty(rows[rows.apply(lambda r: row_extra(r).get("pattern") == "churn",
                                                                   axis=1)] if not rows.empty else rows,
                                                   "a churn timeline"))
    fig, axes = new_fig(w=7.5)
    ax = axes[0][0]
    table, notes = [], []
    for rec in recs:
        pts = [(t, v) for t, v in rec["timeline"] if v is not None]
        ax.plot([t for t, _ in pts], [v for _, v in pts], color=PEERCACHE_COLOR, linewidth=1,
                label=f"{rec['hosts']} hosts: hit rate per 100 ms")
        for name, t in rec["events"].items():
            ax.axvline(t, color=RAW_COLOR, linestyle="--", linewidth=1)
            ax.annotate(name, (t, 1.02), fontsize=7, ha="left", xycoords=("data", "axes fraction"))
        table += churn_text(rec)
        worst = max(rec["stalls"], default=(None, None))
        notes.append(f"{short_run(rec['run'])}: {rec['wrong']} wrong pages, {rec['errors']} read errors; longest "
                     f"stall of a consumer {fmt_number(worst[0])} s (bound {fmt_number(worst[1])} s)")
    ax.set_xlabel("s into the measured window")
    ax.set_ylabel("hit rate (all consumers)")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=7, loc="lower left")
    return Chart("cluster_churn", "Cluster: hit rate through a leave, a crash and a join", fig, table,
                 meta_block(ok_rows(rows[rows["run_id"].isin([r["run"] for r in recs])]), runs), notes)


def lookup_records(sub: pd.DataFrame) -> list[dict[str, Any]]:
    """One record per ``op: exists`` point: its pattern, directory, hosts, clients, lookups/s in all and per
    client host, the worst host's p99 batch lookup latency, the directory's CPU and the machine's."""
    recs: dict[str, dict[str, Any]] = {}
    for _, r in sub.iterrows():
        ex = row_extra(r)
        if ex.get("op") != "exists" or ex.get("pattern") is None:
            continue
        rec = recs.setdefault(r["run_id"], {"run": r["run_id"], "pattern": ex["pattern"], "hosts": ex["hosts"],
                                            "zipf_s": ex.get("zipf_s"), "directory": ex.get("directory") or "embedded",
                                            "per_host": {}, "p99": [], "failed": []})
        if r["status"] == "failed":
            rec["failed"].append(f"{r['tool']}: {r['reason']}")
        if r["status"] != "ok" or pd.isna(r["value"]):
            continue
        if (r["metric"], r["side"]) == ("lookup_rate", "aggregate"):
            rec.update(ops=float(r["value"]), row=r, clients=ex.get("clients"), batch=r.get("batch"),
                       directory_cores=ex.get("directory_cores"), each=ex.get("directory_cores_each") or {},
                       machine_cpus=ex.get("machine_cpus"), machine_busy=ex.get("machine_busy_cores"))
        elif (r["metric"], r["side"]) == ("lookup_rate", "per_host"):
            rec["per_host"][r["devices"]] = float(r["value"])
        elif (r["metric"], r["side"]) == ("latency_p99", "per_host"):
            rec["p99"].append(float(r["value"]))
        elif (r["metric"], r["side"]) == ("hit_rate", "aggregate"):
            rec["hit_rate"] = float(r["value"])
    return sorted(recs.values(), key=lambda x: (x["directory"], PATTERNS.index(x["pattern"])
                                                 if x["pattern"] in PATTERNS else 99, x["hosts"]))


def lookup_limited_by(rec: dict[str, Any]) -> str:
    """What limited one lookup point: a directory process at a core, the CPU the hosts share, or unknown."""
    busiest = max(rec.get("each", {}).items(), key=lambda kv: kv[1], default=None)
    if busiest and busiest[1] >= DIRECTORY_CORE_SHARE:
        return f"the directory: its process {busiest[0]} at {busiest[1]:.2f} of a core"
    cpus, busy = rec.get("machine_cpus"), rec.get("machine_busy")
    dir_cores = rec.get("directory_cores")
    if busy is not None and cpus and busy >= CPU_BOUND_SHARE * cpus:
        return (f"CPU: {busy:.1f} of the machine's {cpus} logical CPUs busy, the directory's processes "
                f"{fmt_number(dir_cores, 2)} of them, the clients the rest")
    why = [f"{busy:.1f} CPUs busy" + (f" of {cpus}" if cpus else "")] if busy is not None else []
    if dir_cores is not None:
        why.append(f"directory {dir_cores:.2f} cores")
    return "unknown (" + ", ".join(why) + ")" if why else "unknown (no CPU evidence)"


def get_keys_per_s(rec: dict[str, Any]) -> float | None:
    """Keys per second a GET point read (objects of ``size_bytes``): one lookup each when uncached."""
    size = rec.get("size_bytes")
    if rec.get("agg") is None or not size or pd.isna(size):
        return None
    return rec["agg"] * 1e9 / float(size)


def directory_verdicts(lookups: list[dict[str, Any]], gets: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per lookup point with a GET point of the same pattern, directory and host count: the share of that
    GET's key rate its lookups cover (below 1: the directory would limit the pattern's uncached reads)."""
    by = {(g["pattern"], g["directory"], g["hosts"]): g for g in gets if g.get("agg") is not None
          and (g["pattern"] != "shared" or g.get("zipf_s") == min((x.get("zipf_s") or 0) for x in gets
                                                                   if x["pattern"] == "shared"))}
    out = []
    for lk in lookups:
        g = by.get((lk["pattern"], lk["directory"], lk["hosts"]))
        need = get_keys_per_s(g) if g else None
        if lk.get("ops") is None or need is None:
            continue
        out.append({"pattern": lk["pattern"], "directory": lk["directory"], "hosts": lk["hosts"],
                    "cover": lk["ops"] / need, "need": need, "ops": lk["ops"], "runs": [lk["run"], g["run"]]})
    return out


def lookup_record(rec: dict[str, Any], verdict: dict[str, Any] | None) -> dict[str, Any]:
    """One lookup point's table record."""
    per = list(rec["per_host"].values())
    return {"directory": rec["directory"], "pattern": rec["pattern"] + (f" (Zipf s={rec['zipf_s']:g})"
                                                                        if rec.get("zipf_s") is not None else ""),
            "hosts": rec["hosts"], "clients": rec.get("clients", "—"),
            "lookups/s (keys)": fmt_number(rec.get("ops"), 3),
            "per client host": f"{fmt_number(min(per), 3)} – {fmt_number(max(per), 3)}" if per else "—",
            "p99 batch (µs, worst host)": fmt_number(max(rec["p99"]), 3) if rec["p99"] else "—",
            "keys/batch": rec.get("batch") if rec.get("batch") is not None else "—",
            "directory CPU (cores)": fmt_number(rec.get("directory_cores"), 2),
            "GET keys/s, same pattern": (f"{fmt_number(verdict['need'], 3)} ({100 * verdict['cover']:.0f}% covered)"
                                         if verdict else "no GET point at these hosts"),
            "limited by": lookup_limited_by(rec), "run": short_run(rec["run"])}


def directory_figure(rows: pd.DataFrame, runs: pd.DataFrame, refs: TestbedRefs | None) -> Chart | NotDrawn:
    """Lookups/s and p99 batch lookup latency against clients, a curve per directory and pattern."""
    recs = lookup_records(rows)
    drawn = [r for r in recs if r.get("ops") is not None and r.get("clients")]
    if not drawn:
        failed = "; ".join(f for r in recs for f in r["failed"])
        return NotDrawn("cluster_directory", failed or why_empty(rows, "a lookup_rate aggregate (op: exists)"))
    fig, axes = new_fig(ncols=2, w=10)
    left, right = axes[0][0], axes[0][1]
    verdicts = {(v["pattern"], v["directory"], v["hosts"]): v for v in directory_verdicts(recs, points(rows))}
    table = []
    curves: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in drawn:
        curves.setdefault((r["directory"], r["pattern"]), []).append(r)
    for (directory, pattern), mine in curves.items():
        mine.sort(key=lambda r: r["clients"])
        lab = f"{directory}, {pattern}"
        marker = DIRECTORY_MARKERS.get(directory, "x")
        left.plot([r["clients"] for r in mine], [r["ops"] / 1e3 for r in mine], marker=marker, label=lab)
        right.plot([r["clients"] for r in mine], [max(r["p99"]) / 1e3 if r["p99"] else None for r in mine],
                   marker=marker, label=lab)
    for rec in drawn:
        table.append(lookup_record(rec, verdicts.get((rec["pattern"], rec["directory"], rec["hosts"]))))
    left.set_xlabel("clients (drive threads, all hosts)")
    left.set_ylabel("lookups/s, in thousands of keys")
    left.set_ylim(bottom=0)
    right.set_xlabel("clients (drive threads, all hosts)")
    right.set_ylabel("p99 batch lookup latency, ms (worst host)")
    right.set_ylim(bottom=0)
    left.legend(fontsize=7)
    notes = ["drive --op exists with no location cache: every key of every batch asks the directory; "
             "'% covered': these lookups/s over the keys/s the same pattern's GETs read at these hosts (below "
             "100%: the directory would limit reads that miss the location cache)"]
    missing = [f for r in recs for f in r["failed"]]
    if missing:
        notes.append("failed: " + "; ".join(missing))
    return Chart("cluster_directory", "Cluster: the directory's lookups/s and p99 against clients, per directory",
                 fig, table, meta_block(ok_rows(rows[rows["run_id"].isin([r["run"] for r in drawn])]), runs),
                 notes)


def directory_conclusions(sub: pd.DataFrame) -> list[Conclusion]:
    """Per directory: its lookups/s at its most clients and what limited them; per (pattern, directory):
    from how many hosts on it would limit uncached reads, or that it covered them at every host count."""
    recs = lookup_records(sub)
    out = []
    for directory in dict.fromkeys(r["directory"] for r in recs):
        mine = [r for r in recs if r["directory"] == directory and r.get("ops") is not None and r.get("clients")]
        if not mine:
            continue
        top = max(mine, key=lambda r: (r["clients"], r["ops"]))
        best = max(mine, key=lambda r: r["ops"])
        out.append(Conclusion(
            f"Directory {directory}: at most {fmt_number(best['ops'], 3)} lookups/s ({best['clients']} clients, "
            f"{best['pattern']}); at {top['clients']} clients {fmt_number(top['ops'], 3)} lookups/s with a p99 "
            f"batch of {fmt_number(max(top['p99']) if top['p99'] else None, 3)} µs, limited by "
            f"{lookup_limited_by(top)}.", [best["run"], top["run"]]))
    verdicts = directory_verdicts(recs, points(sub))
    for key in dict.fromkeys((v["pattern"], v["directory"]) for v in verdicts):
        mine = sorted((v for v in verdicts if (v["pattern"], v["directory"]) == key), key=lambda v: v["hosts"])
        short = [v for v in mine if v["cover"] < 1]
        if short:
            v = short[0]
            text = (f"Directory {key[1]} under {key[0]}: from {v['hosts']} hosts on it would limit reads that miss "
                    f"the location cache ({fmt_number(v['ops'], 3)} lookups/s for the "
                    f"{fmt_number(v['need'], 3)} keys/s the GETs read, {100 * v['cover']:.0f}%).")
        else:
            text = (f"Directory {key[1]} under {key[0]}: its lookups covered the GETs' keys/s at every host count "
                    f"measured (up to {mine[-1]['hosts']} hosts, {100 * mine[-1]['cover']:.0f}%): it limits no "
                    "uncached read there.")
        out.append(Conclusion(text, sorted({r for v in mine for r in v["runs"]})))
    return out


class Cluster(Scenario):
    """The cluster scenario's report."""

    figures = {**{f"cluster_{p}": figure_of(p) for p in PATTERNS if p != "churn"}, "cluster_churn": churn_figure,
               "cluster_directory": directory_figure}

    def tables(self, sub: pd.DataFrame, limits: Limits) -> list[Table]:
        recs = [record(r) for r in points(sub) if r.get("agg") is not None and r["pattern"] != "churn"]
        churn = [row for rec in churn_records(sub) for row in churn_text(rec)]
        verdicts = {(v["pattern"], v["directory"], v["hosts"]): v for v in directory_verdicts(lookup_records(sub),
                                                                                               points(sub))}
        lookups = [lookup_record(r, verdicts.get((r["pattern"], r["directory"], r["hosts"])))
                   for r in lookup_records(sub) if r.get("ops") is not None]
        return (([("", recs)] if recs else []) + ([("membership churn under the shared read", churn)] if churn else [])
                + ([("the directory's lookups under the patterns (op: exists)", lookups)] if lookups else []))

    def headline(self, scenario: str, s: pd.DataFrame, rows: pd.DataFrame, limits: Limits) -> list[dict[str, Any]]:
        """A row per pattern (and Zipf exponent): its largest host count, against its raw pattern."""
        out = []
        recs = points(rows[rows["scenario"] == scenario])
        for key in dict.fromkeys(series_key(r) for r in recs):
            mine = [r for r in recs if series_key(r) == key and r.get("agg") is not None]
            if not mine or key[0] == "churn":
                continue
            top = max(mine, key=lambda r: r["hosts"])
            row = overview_row(scenario, f"{label(top)} at {top['hosts']} hosts", top["row"], limits)
            notes = [f"per host {record(top)['per host (GB/s)']} GB/s",
                     f"Jain {top['jain']:.3f}" if top.get("jain") is not None else "",
                     f"{top.get('wrong', '?')} wrong pages"]
            sc = scaling(mine)
            if sc:
                notes.append(f"{sc[1]['agg'] / sc[0]['agg']:.2f}x the {sc[0]['hosts']}-host aggregate")
            pct = 100 * top["agg"] / top["raw"] if top.get("raw") else None
            row["% of single-NIC raw limit"] = "—" if pct is None else pct_text(pct, "the raw pattern")
            row["limited by"] = limited_by(top)
            row["notes"] = "; ".join(n for n in notes if n)
            out.append(row)
        return out

    def conclusions(self, sub: pd.DataFrame, limits: Limits) -> list[Conclusion]:
        """Per pattern: how its aggregate grew with hosts and, where it stopped growing, at what."""
        out = []
        recs = points(sub)
        for key in dict.fromkeys(series_key(r) for r in recs):
            mine = [r for r in recs if series_key(r) == key]
            sc = scaling(mine)
            if sc is None:
                continue
            lo, hi, eff = sc
            grew = "kept scaling" if eff >= SCALING_SHARE else "stopped scaling"
            text = (f"Cluster, {label(hi)}: from {lo['hosts']} to {hi['hosts']} hosts the aggregate went from "
                    f"{throughput_text(lo['agg'])} to {throughput_text(hi['agg'])} "
                    f"({hi['agg'] / lo['agg']:.2f}x for {hi['hosts'] / lo['hosts']:.0f}x the hosts): it {grew}"
                    + (f"; at {hi['hosts']} hosts limited by {limited_by(hi)}" if eff < SCALING_SHARE else "")
                    + (f"; Jain's index {hi['jain']:.3f}" if hi.get("jain") is not None else "") + ".")
            out.append(Conclusion(text, [lo["run"], hi["run"]]))
        for rec in churn_records(sub):
            ph = rec["phases"]
            parts = []
            for name, what in (("after_leave", "a clean leave"), ("after_crash", "a crash"), ("after_join", "a join")):
                p = ph.get(name) or {}
                if "settled" not in p or name == "steady":
                    continue
                back = (f"settled at {p['settled']:.2f} after {p['recovery_s']:.1f} s" if "recovery_s" in p
                        else f"had not settled at {p['settled']:.2f} when the next phase began")
                dip = f"dipped by {p['hit_rate_dip']:.2f}, then " if p.get("hit_rate_dip") else ""
                parts.append(f"after {what} the hit rate {dip}{back}")
            worst = max(rec["stalls"], default=(None, None))
            out.append(Conclusion(
                f"Cluster, membership churn over {rec['hosts']} hosts: " + "; ".join(parts)
                + f"; {rec['wrong']} wrong pages; no consumer stopped longer than {fmt_number(worst[0])} s "
                  f"(its bound {fmt_number(worst[1])} s).", [rec["run"]]))
        return out + directory_conclusions(sub)
