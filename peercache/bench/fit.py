"""Power-law fits of a cost against a size: ``cost = a * x ** b``, least squares on log-log.

Pure functions (NumPy only), used by :mod:`peercache.bench.growth` to say how each cost grows:
``b`` near 1 is linear, above :data:`SUPERLINEAR_B` faster than linear.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np

#: |b - 1| within this is "linear"
LINEAR_TOLERANCE = 0.1
#: b above this is "faster than linear"
SUPERLINEAR_B = 1.1


@dataclass(frozen=True)
class PowerFit:
    """``y = a * x ** b`` fitted on ``n`` points; ``r2`` on the log-log line."""

    a: float
    b: float
    r2: float
    n: int
    linear: bool          #: |b - 1| <= the tolerance it was judged with
    superlinear: bool     #: b > the superlinear threshold

    def predict(self, x):
        """The fitted cost at ``x`` (a number or an array)."""
        return self.a * np.asarray(x, dtype=float) ** self.b

    def as_dict(self) -> dict:
        return asdict(self)


def power_fit(xs: Sequence[float], ys: Sequence[float], *, tolerance: float = LINEAR_TOLERANCE,
              superlinear_b: float = SUPERLINEAR_B) -> PowerFit:
    """Least-squares fit of ``log y = log a + b log x``.

    Needs at least two points with distinct x, all x and y positive (a ValueError saying which is
    not); with two points the line passes through both (r2 = 1).
    """
    x = np.asarray(xs, dtype=float)
    y = np.asarray(ys, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"power_fit: xs and ys must be equal-length sequences, got {x.shape} and {y.shape}")
    if len(x) < 2:
        raise ValueError(f"power_fit: needs at least 2 points, got {len(x)}")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y)) and np.all(x > 0) and np.all(y > 0)):
        raise ValueError("power_fit: every x and y must be finite and positive (log-log fit)")
    if np.unique(x).size < 2:
        raise ValueError("power_fit: needs at least 2 distinct x values")
    lx, ly = np.log(x), np.log(y)
    b, la = np.polyfit(lx, ly, 1)
    resid = ly - (la + b * lx)
    ss_tot = float(((ly - ly.mean()) ** 2).sum())
    r2 = 1.0 - float((resid ** 2).sum()) / ss_tot if ss_tot > 0 else 1.0
    b = float(b)
    return PowerFit(a=float(math.exp(la)), b=b, r2=r2, n=len(x), linear=abs(b - 1.0) <= tolerance,
                    superlinear=b > superlinear_b)
