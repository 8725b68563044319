"""Membership churn under load (the cluster kind's ``churn`` pattern): when its events happen, and what the
consumers' timelines say about them (pure; the kind runs it).

During a shared-cache read over hosts 1 … N−1, host N−1's producer leaves cleanly (SIGTERM: it leaves the
directory on its way out), host N−2's crashes (SIGKILL: its entries stay until the directory's heartbeat
timeout expires it) and host N joins, publishing the crashed host's pages again (its key prefix), as a
replacement node re-populates what was lost. Every drive reads with ``--faults-expected`` (a read of a
gone producer is an error that does not stop it) and ``--timeline-ms``; wrong pages still fail the point.

From the consumers' summed timeline: the hit rate of each phase once settled, each event's dip (the level
before it minus the lowest bucket after it, inside its phase) and its recovery time (from the event to the
first bucket from which its running mean over :data:`SMOOTH` buckets stays within :data:`SETTLED` of
where that phase settles).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Where in the measured window each event happens (fraction of the window).
EVENT_AT = {"leave": 0.2, "crash": 0.45, "join": 0.65}
#: The phases between events, in order, and the event that opens each.
PHASES = (("steady", None), ("after_leave", "leave"), ("after_crash", "crash"), ("after_join", "join"))
#: A phase's hit rate has settled when its running mean over SMOOTH buckets stays within this of where the
#: phase ends (Zipf draws make single 100 ms buckets noisier than that).
SETTLED = 0.05
#: Buckets in the running mean the settling is judged on.
SMOOTH = 3
#: Buckets at a phase's end whose median is where the phase settled.
TAIL_BUCKETS = 3
#: drive's timeline bucket for the churn pattern (ms).
TIMELINE_MS = 100
#: drive's directory cache for the churn pattern (s): a departed producer's cached locations go within it.
DIR_CACHE_TTL_S = 0.5


@dataclass(frozen=True)
class Roles:
    """Who does what in a churn run."""

    leaves: str          #: its producer leaves cleanly
    crashes: str         #: its producer is SIGKILLed
    joins: str           #: a new producer, publishing the crashed one's prefix
    prefix: str          #: the key prefix the joiner publishes (the crashed host's)


def roles(names: tuple[str, ...]) -> Roles:
    """The churn roles of the hosts ``names`` (at least 4): the last joins, the two before it leave and crash."""
    if len(names) < 4:
        raise ValueError(f"the churn pattern needs at least 4 hosts (3 producers, one joiner), got {len(names)}")
    return Roles(leaves=names[-2], crashes=names[-3], joins=names[-1], prefix=names[-3])


def summed(timelines: list[dict[str, Any]]) -> list[dict[str, float]]:
    """The consumers' timelines bucket by bucket (bucket i of each is the same time within their start skew)."""
    n = min(len(t["buckets"]) for t in timelines) if timelines else 0
    out = []
    for i in range(n):
        b = {k: sum(t["buckets"][i][k] for t in timelines) for k in ("keys", "hits", "misses", "errors",
                                                                    "verify_failures", "bytes")}
        b["t"] = timelines[0]["buckets"][i]["t"]
        out.append(b)
    return out


def rate(b: dict[str, float]) -> float | None:
    return b["hits"] / b["keys"] if b["keys"] else None


def analyse(buckets: list[dict[str, float]], events: dict[str, float], window_s: float) -> dict[str, Any]:
    """Each phase's settled hit rate and each event's dip and recovery time (pure).

    ``buckets``: the summed timeline (t in s from the window's start); ``events``: event -> s from the
    window's start when it happened. A phase with no bucket of keys is left out, and so is its event."""
    bounds = [0.0] + [events.get(e, float("inf")) for _, e in PHASES[1:]] + [window_s]
    width = buckets[1]["t"] - buckets[0]["t"] if len(buckets) > 1 else window_s
    phases: dict[str, Any] = {}
    before = None
    for i, (name, event) in enumerate(PHASES):
        lo, hi = bounds[i], bounds[i + 1]
        if event is not None and event not in events:
            continue
        # a phase's buckets lie wholly inside it; one an event falls in counts only towards that event's dip
        raw = [(b["t"], rate(b)) for b in buckets
               if lo - 1e-9 <= b["t"] and b["t"] + width <= hi + 1e-9 and rate(b) is not None]
        touching = [rate(b) for b in buckets if lo < b["t"] + width <= hi + 1e-9 and rate(b) is not None]
        if not raw:
            continue
        mine = [(t, sum(r for _, r in raw[max(0, j - SMOOTH + 1): j + 1]) / len(raw[max(0, j - SMOOTH + 1): j + 1]))
                for j, (t, _) in enumerate(raw)]
        tail = sorted(r for _, r in mine[-TAIL_BUCKETS:])
        settled = tail[len(tail) // 2]
        rec: dict[str, Any] = {"from_s": round(lo, 3), "to_s": round(min(hi, window_s), 3),
                               "settled_hit_rate": settled, "buckets": len(mine)}
        if event is not None:
            lowest = min(touching)
            rec["event"] = event
            rec["dip"] = max(0.0, before - lowest) if before is not None else None
            back = None
            # settled: from bucket j to the phase's end, at least TAIL_BUCKETS long (the last bucket alone
            # is always within itself)
            for j in range(len(mine) - TAIL_BUCKETS + 1):
                if all(abs(r - settled) <= SETTLED for _, r in mine[j:]):
                    back = mine[j][0]
                    break
            rec["recovery_s"] = round(max(0.0, back - lo), 3) if back is not None else None
        phases[name] = rec
        before = settled
    return phases
