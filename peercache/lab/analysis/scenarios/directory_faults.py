"""directory_faults: the directory's own failure under a verifying read, for each form of the directory.

One figure per form (embedded, redis, sentinel, redis-cluster), a panel per fault: the consumers' hit rate
and GB/s per 100 ms bucket against time, the share of the producers' entries the directory resolved (the
watcher, :mod:`peercache.lab.tools.dirwatch`), the fault's moment marked (and its other events: the
directory back, SIGCONT). The table gives per point the time reads were failing or missing, the time until
the hit rate was back to its level before the fault, the entries lost and republished (those the directory
stopped resolving after the fault, and those it resolved again by the window's end), the wrong pages and
the longest stall against its bound. The overview has a row per form; the conclusions say what each form
survived, how long it took, and where entries did not come back.
"""
from __future__ import annotations

from typing import Any

import pandas as pd

from peercache.lab.analysis.format import fmt_number, short_run, why_empty
from peercache.lab.analysis.metablock import meta_block
from peercache.lab.analysis.references import TestbedRefs, row_extra
from peercache.lab.analysis.scenarios.declare import (OVERVIEW_COLUMNS, Chart, Conclusion, Limits, NotDrawn, Scenario,
                                                      Table, ok_rows)
from peercache.lab.analysis.scenarios.draw import OVER_COLOR, PEERCACHE_COLOR, RAW_COLOR, new_fig
from peercache.lab.pipeline.points.directory_faults import ALL_FAULTS, FAULT_TEXT, FAULTS, FORMS

#: The colour of the directory's resolved entries in the figures.
ENTRIES_COLOR = "#2ca02c"
#: The shade of the buckets in which no read completed (every consumer waiting on the directory).
IDLE_COLOR = "#e8e8e8"
#: Events drawn beside the fault, and their labels.
EVENT_LABELS = {"back": "directory back", "SIGCONT": "SIGCONT"}
#: What each form is, in the overview and the conclusions.
FORM_TEXT = {"embedded": "embedded (peercache-bench meta)", "redis": "one Redis, no persistence",
             "sentinel": "Redis Sentinel (master, replica, 3 sentinels)",
             "redis-cluster": "Redis Cluster (3 masters, 3 replicas)"}


def records(sub: pd.DataFrame) -> list[dict[str, Any]]:
    """One record per point (run): its form and fault, the figures of its rows and the aggregate's timeline."""
    recs: dict[str, dict[str, Any]] = {}
    for _, r in sub.iterrows():
        ex = row_extra(r)
        if ex.get("form") not in FAULTS:
            continue
        rec = recs.setdefault(r["run_id"], {"run": r["run_id"], "form": ex["form"], "fault": ex.get("fault"),
                                            "protocol": r.get("protocol"), "stalls": [], "failed": [], "why": {}})
        if r["status"] == "failed":
            rec["failed"].append(str(r["reason"]))
            continue
        if r["status"] != "ok" or pd.isna(r["value"]):
            rec["why"][r["metric"]] = r["reason"]
            if r["metric"] == "unavailable_s" and ex.get("timeline"):
                rec.update(timeline=ex["timeline"], watch=ex.get("watch") or [], fault_s=ex.get("fault_s"),
                           events=ex.get("events") or [])
            continue
        m, v = r["metric"], float(r["value"])
        if m == "max_stall_s":
            rec["stalls"].append((v, ex.get("bound_s")))
        elif r["side"] == "aggregate":
            rec[m] = v
            if m == "unavailable_s":
                rec.update(timeline=ex.get("timeline") or [], watch=ex.get("watch") or [], fault_s=ex.get("fault_s"),
                           events=ex.get("events") or [], level=ex.get("level_before"), target=ex.get("target"),
                           keys_per_master=ex.get("keys_per_master"), outages=ex.get("outages") or [],
                           bucket_s=ex.get("bucket_s"))
            elif m in ("entries_lost", "entries_republished"):
                rec.update(entries_before=ex.get("before"), entries_keys=ex.get("keys"),
                           registered_again=ex.get("registered_again") or {})
            elif m == "old_master_demoted_s":
                rec["role"] = ex.get("role")
    order = {f: i for i, f in enumerate(FORMS)}
    return sorted(recs.values(), key=lambda x: (order.get(x["form"], 99),
                                                ALL_FAULTS.index(x["fault"]) if x["fault"] in ALL_FAULTS else 99,
                                                str(x["protocol"])))


def _s(v: float | None) -> str:
    return "—" if v is None else f"{v:.1f}"


def record(rec: dict[str, Any]) -> dict[str, Any]:
    """One point's table record."""
    lost, back = rec.get("entries_lost"), rec.get("entries_republished")
    worst = max(rec["stalls"], default=(None, None))
    return {"form": rec["form"], "fault": FAULT_TEXT.get((rec["form"], rec["fault"]), rec["fault"]),
            "reads": rec.get("protocol") or "—",
            "unavailable (s)": _s(rec.get("unavailable_s")),
            "recovered (s)": (_s(rec.get("recovery_s")) if rec.get("recovery_s") is not None
                              else "not by the window's end" if "unavailable_s" in rec else "—"),
            "directory back (s)": _s(rec.get("directory_back_s")),
            "entries lost / republished": (f"{int(lost)} / {int(back)}" if lost is not None and back is not None
                                           else "—") + (f" of {rec['entries_before']}" if rec.get("entries_before")
                                                        else ""),
            "wrong pages": int(rec["verify_failures"]) if rec.get("verify_failures") is not None else "—",
            "longest stall (s, bound)": (f"{worst[0]:.2f} ({fmt_number(worst[1])})" if worst[0] is not None else "—"),
            "old master's role": (f"{rec['role']} after {rec['old_master_demoted_s']:.1f} s"
                                  if rec.get("old_master_demoted_s") is not None else rec.get("role") or "—"),
            "run": short_run(rec["run"])}


def figure_of(form: str):
    """The figure builder of one form: a panel per fault."""
    name = f"directory_faults_{form.replace('-', '')}"

    def figure(rows: pd.DataFrame, runs: pd.DataFrame, refs: TestbedRefs | None) -> Chart | NotDrawn:
        recs = [r for r in records(rows) if r["form"] == form]
        drawn = [r for r in recs if r.get("timeline")]
        if not drawn:
            failed = "; ".join(f for r in recs for f in r["failed"])
            mine = rows[rows.apply(lambda r: row_extra(r).get("form") == form, axis=1)] if not rows.empty else rows
            return NotDrawn(name, failed or why_empty(mine, f"a {form} timeline"))
        fig, axes = new_fig(nrows=len(drawn), w=8.0, h=2.6 * len(drawn) + 0.6)
        notes = []
        for ax, rec in zip((a[0] for a in axes), drawn):
            panel(ax, rec)
            notes += [f"{short_run(rec['run'])}: {rec['fault']}: {f}" for f in rec["failed"]]
        axes[-1][0].set_xlabel("s into the measured window")
        notes.append("hit rate and GB/s: the consumers' summed drive timelines (100 ms buckets, every page "
                     "verified, no location cache); entries: the share of the producers' entries the directory "
                     "resolved, asked every 100 ms")
        fig.tight_layout()
        return Chart(name, f"Directory faults, {FORM_TEXT[form]}: hit rate and throughput through each fault", fig,
                     [record(r) for r in drawn],
                     meta_block(ok_rows(rows[rows["run_id"].isin([r["run"] for r in drawn])]), runs), notes)

    return figure


def panel(ax, rec: dict[str, Any]) -> None:
    """One fault's panel: hit rate, entries resolved (left axis), GB/s (right axis), the fault marked."""
    tl = rec["timeline"]
    width = rec.get("bucket_s") or (tl[1][0] - tl[0][0] if len(tl) > 1 else 0.1)
    idle = [b[0] for b in tl if b[1] is None]
    spans: list[list[float]] = []
    for t in idle:                      # buckets in which no read completed, merged into stretches
        if spans and abs(spans[-1][1] - t) < width / 2:
            spans[-1][1] = t + width
        else:
            spans.append([t, t + width])
    for i, (a, b) in enumerate(spans):
        ax.axvspan(a, b, color=IDLE_COLOR, linewidth=0, label="no read completed" if i == 0 else None)
    # dots too: a bucket between two in which nothing completed has no line to either
    ax.plot([b[0] for b in tl], [b[1] for b in tl], color=PEERCACHE_COLOR, linewidth=1.2, marker=".", markersize=3,
            label="hit rate")
    keys = rec.get("entries_keys")
    watch = [(t, f) for t, f in rec.get("watch") or [] if t >= 0 and (not tl or t <= tl[-1][0] + 0.1)]
    if keys:
        ax.step([t for t, _ in watch], [None if f is None else f / keys for _, f in watch], where="post",
                color=ENTRIES_COLOR, linewidth=1, linestyle="-", alpha=0.8, label="entries resolved (share)")
    ax.set_ylim(-0.02, 1.12)
    ax.set_ylabel("hit rate, entries")
    right = ax.twinx()
    right.plot([b[0] for b in tl], [b[2] for b in tl], color=RAW_COLOR, linewidth=0.8, label="GB/s")
    right.set_ylim(bottom=0, top=max([b[2] for b in tl] + [1e-9]) * 1.25)
    right.set_ylabel("GB/s", fontsize=8)
    if rec.get("fault_s") is not None:
        ax.axvline(rec["fault_s"], color=OVER_COLOR, linestyle="--", linewidth=1.2)
        ax.annotate("fault", (rec["fault_s"], 1.0), xycoords=("data", "axes fraction"), fontsize=7, color=OVER_COLOR,
                    ha="left", va="top")
    for e in rec.get("events") or []:
        label = EVENT_LABELS.get(e.get("event")) or EVENT_LABELS.get(e.get("signal"))
        if label and e.get("t") is not None:
            ax.axvline(e["t"], color=RAW_COLOR, linestyle=":", linewidth=1)
            ax.annotate(label, (e["t"], 0.9), xycoords=("data", "axes fraction"), fontsize=7, ha="left", va="top")
    got = [f"unavailable {_s(rec.get('unavailable_s'))} s",
           f"back in {_s(rec.get('recovery_s'))} s" if rec.get("recovery_s") is not None else "not back in the window",
           f"entries lost {fmt_number(rec.get('entries_lost'))}, republished {fmt_number(rec.get('entries_republished'))}",
           f"{fmt_number(rec.get('verify_failures'))} wrong"]
    ax.set_title(f"{FAULT_TEXT.get((rec['form'], rec['fault']), rec['fault'])}, over {rec.get('protocol')}: "
                 + ", ".join(got), fontsize=8)
    lines = ax.get_legend_handles_labels()
    more = right.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=7, loc="lower right")


def conclusion(rec: dict[str, Any]) -> str:
    """What one point showed, in a sentence."""
    what = FAULT_TEXT.get((rec["form"], rec["fault"]), rec["fault"])
    parts = []
    if rec.get("unavailable_s") is not None:
        out = rec.get("outages") or []
        parts.append((f"reads failed or missed for {rec['unavailable_s']:.1f} s"
                      + (f" in {len(out)} stretches (" + ", ".join(f"{a:.1f}–{b:.1f} s" for a, b in out)
                         + " into the window)" if len(out) > 1 else ""))
                     if rec["unavailable_s"] > 0 else "no read failed or missed")
    if rec.get("recovery_s") is not None and rec.get("unavailable_s"):
        parts.append(f"the hit rate was back to {rec.get('level', 1.0):.2f} {rec['recovery_s']:.1f} s after the fault")
    elif rec.get("unavailable_s") is not None and rec.get("recovery_s") is None:
        parts.append("the hit rate was not back to its level before the fault by the window's end")
    lost, back = rec.get("entries_lost"), rec.get("entries_republished")
    if lost:
        parts.append(f"the directory stopped resolving {int(lost)} of {rec.get('entries_before', '?')} entries and "
                     + (f"resolved all of them again {rec['republished_s']:.1f} s after the fault"
                        if rec.get("republished_s") is not None and back is not None and back >= lost
                        else f"resolved {int(back or 0)} again by the window's end"))
    elif lost == 0:
        parts.append("no entry was lost")
    again = {p: n for p, n in (rec.get("registered_again") or {}).items() if n}
    if again:
        parts.append("the directory forgot the producers, which registered again and republished ("
                     + ", ".join(f"{p} {n}x" for p, n in sorted(again.items())) + ")")
    if rec.get("old_master_demoted_s") is not None:
        parts.append(f"the old master came back as a {rec.get('role')} {rec['old_master_demoted_s']:.1f} s after SIGCONT")
    elif rec.get("role"):
        parts.append(f"the old master still said {rec['role']!r} after its bound")
    parts.append(f"{int(rec['verify_failures']) if rec.get('verify_failures') is not None else '?'} wrong pages")
    worst = max(rec["stalls"], default=(None, None))
    if worst[0] is not None and worst[1] is not None:
        parts.append(f"longest stall {worst[0]:.2f} s " + ("within" if worst[0] <= worst[1] else "beyond")
                     + f" its {fmt_number(worst[1])} s bound")
    return f"{FORM_TEXT[rec['form']]}, {what}, pages read over {rec.get('protocol')}: " + "; ".join(parts) + "."


class DirectoryFaults(Scenario):
    """The directory_faults scenario's report."""

    figures = {f"directory_faults_{f.replace('-', '')}": figure_of(f) for f in FORMS}

    def tables(self, sub: pd.DataFrame, limits: Limits) -> list[Table]:
        recs = [record(r) for r in records(sub) if "unavailable_s" in r or r.get("timeline")]
        return [("entries lost: those the directory stopped resolving after the fault (the entry gone, or its "
                 "owner's registration); republished: resolved again by the window's end", recs)] if recs else []

    def overview(self, scenario: str, sub: pd.DataFrame, rows: pd.DataFrame, bw: pd.DataFrame,
                 limits: Limits) -> list[dict[str, Any]]:
        """A row per form: its faults' unavailability, recovery, entries and wrong pages."""
        out = []
        recs = records(sub)
        for form in dict.fromkeys(r["form"] for r in recs):
            mine = [r for r in recs if r["form"] == form]
            notes = []
            for r in mine:
                if r["failed"]:
                    notes.append(f"{r['fault']} ({r['protocol']}): failed ({r['failed'][0][:120]})")
                    continue
                notes.append(f"{r['fault']} ({r['protocol']}): unavailable {_s(r.get('unavailable_s'))} s, back "
                             + (f"in {_s(r.get('recovery_s'))} s" if r.get("recovery_s") is not None else "not in the window")
                             + f", entries lost/republished {fmt_number(r.get('entries_lost'))}/"
                               f"{fmt_number(r.get('entries_republished'))}, {fmt_number(r.get('verify_failures'))} wrong")
            gets = [r["get_throughput"] for r in mine if r.get("get_throughput") is not None]
            row = dict.fromkeys(OVERVIEW_COLUMNS, "—")
            row.update({"scenario": f"{scenario}: {FORM_TEXT.get(form, form)}",
                        "GET throughput": ("—" if not gets else f"{fmt_number(gets[0])} GB/s over a window with a "
                                           "fault" if len(gets) == 1 else f"{fmt_number(min(gets))} – "
                                           f"{fmt_number(max(gets))} GB/s over windows with a fault"),
                        "% of single-NIC raw limit": "— (not a bandwidth figure)",
                        "notes": "; ".join(notes), "run": ", ".join(short_run(r["run"]) for r in mine)})
            out.append(row)
        return out

    def conclusions(self, sub: pd.DataFrame, limits: Limits) -> list[Conclusion]:
        """A conclusion per point, then one on wrong pages over them all."""
        recs = [r for r in records(sub) if "unavailable_s" in r]
        out = [Conclusion(conclusion(r), [r["run"]]) for r in recs]
        wrong = [r for r in recs if r.get("verify_failures")]
        if recs:
            out.append(Conclusion(
                f"Wrong pages: {'none' if not wrong else sum(int(r['verify_failures']) for r in wrong)} in "
                f"{len(recs)} faults of {len({r['form'] for r in recs})} forms of the directory"
                + (", every page verified: a failing directory cost misses and errors, never a wrong page."
                   if not wrong else f" (in {', '.join(r['form'] + ' ' + r['fault'] for r in wrong)})."),
                [r["run"] for r in recs]))
        return out
