"""What a driver thread counts inside the measurement window, and what a driver process reads off its rails."""
from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np

from ...transport.base import Transport
from . import timeline

#: Per-batch latencies one driver thread keeps for the percentiles: beyond this many, a uniform
#: sample of the window's batches (reservoir sampling), so memory stays bounded on long points.
LATENCY_SAMPLES = 100_000


@dataclass
class ThreadStats:
    """Counters of one driver thread inside the measurement window."""

    bytes: int = 0
    keys: int = 0
    hits: int = 0
    misses: int = 0
    errors: int = 0
    verify_failures: int = 0
    #: misses whose directory entry pointed at another key's slot (BatchResult.redirected)
    redirected: int = 0
    batches: int = 0
    latencies: list = field(default_factory=list)
    #: batches whose latency was offered to ``latencies`` (more than it holds once it is full)
    latency_seen: int = 0
    #: reason of the first batch with errors (the point's reason when nothing aborted)
    first_error: str | None = None
    #: why the first redirected entry was a miss, in or out of the window (it fails the point)
    first_redirect: str | None = None
    #: bytes hit per --key-prefix, in their order (empty when drive reads one working set)
    bytes_by_prefix: list = field(default_factory=list)
    #: --timeline-ms: counters per bucket of the window and the longest stall (timeline.ThreadTimeline.part;
    #: None without one)
    timeline: dict | None = None

    def add(self, other: "ThreadStats") -> None:
        """Add another thread's counters to these (latencies pooled, the first reasons kept)."""
        for f in ("bytes", "keys", "hits", "misses", "errors", "verify_failures", "redirected", "batches",
                  "latency_seen"):
            setattr(self, f, getattr(self, f) + getattr(other, f))
        self.latencies.extend(other.latencies)
        if other.bytes_by_prefix:
            mine = self.bytes_by_prefix or [0] * len(other.bytes_by_prefix)
            self.bytes_by_prefix = [a + b for a, b in zip(mine, other.bytes_by_prefix)]
        if other.timeline is not None:
            self.timeline = timeline.merge([self.timeline, other.timeline])
        self.first_error = self.first_error or other.first_error
        self.first_redirect = self.first_redirect or other.first_redirect

    def sample_latency(self, seconds: float, rnd: random.Random) -> None:
        """Keep one batch's latency: all of the first LATENCY_SAMPLES, then a uniform sample of them all."""
        self.latency_seen += 1
        if len(self.latencies) < LATENCY_SAMPLES:
            self.latencies.append(seconds)
        else:
            j = rnd.randrange(self.latency_seen)
            if j < LATENCY_SAMPLES:
                self.latencies[j] = seconds


def percentiles(lat: list) -> dict:
    """p50, p99 and p999 of batch latencies in seconds, as µs (None each when there are none)."""
    if not lat:
        return {"p50": None, "p99": None, "p999": None}
    a = np.asarray(lat) * 1e6
    p = np.percentile(a, [50, 99, 99.9])
    return {"p50": round(float(p[0]), 1), "p99": round(float(p[1]), 1), "p999": round(float(p[2]), 1)}


def rail_delta(before: list[dict], after: list[dict]) -> list[dict]:
    """Per rail, what its counters (Transport.rail_stats) grew by between two readings, and its state
    at the second."""
    old = {r["rail"]: r for r in before}
    out = []
    for r in after:
        o = old.get(r["rail"], {})
        errs = {k: n - o.get("completion_errors", {}).get(k, 0) for k, n in r["completion_errors"].items()}
        out.append({"rail": r["rail"], "state": r["state"],
                    **{k: r[k] - o.get(k, 0) for k in Transport.RAIL_COUNTS},
                    "completion_errors": {k: n for k, n in errs.items() if n}})
    return out
