"""``--access zipf``: page popularity that follows Zipf's law over a finite working set.

The page of popularity rank r (1 = the hottest) of ``n`` pages is drawn with probability

    P(r) = (1 / r^S) / H(n, S),   H(n, S) = sum over k = 1..n of 1 / k^S

(numpy's ``zipf`` draws over all positive integers and needs S > 1: not this). The cumulative
distribution is built once per driver process; a thread draws a whole block of batches at once, one
``searchsorted`` of uniform numbers into it, as the random access draws its blocks.

Which page has which rank is a permutation fixed by ``--seed`` alone (not by the driver process or
thread), so every driver with the same seed and working set agrees which pages are hot, and, the
permutation being random, the hot pages are spread over the producers of a union of prefixes.

As with ``--access random``, the draws are independent: a batch may ask for one page more than once.
"""
from __future__ import annotations

import numpy as np

#: Mixed into --seed for the rank -> page permutation, so it is not the stream of any driver thread.
ORDER_STREAM = 0x5A1F


def zipf_probabilities(n: int, s: float) -> np.ndarray:
    """P(rank r) for r = 1..n (index r - 1), proportional to 1/r^s, summing to 1."""
    if n < 1 or not s > 0:
        raise ValueError(f"Zipf over {n} pages with exponent {s}: needs n >= 1 and s > 0")
    w = np.arange(1, n + 1, dtype=np.float64) ** -float(s)
    return w / w.sum()


class ZipfPages:
    """Zipf draws of page indices 0..n-1: rank -> page by a permutation of ``seed``."""

    def __init__(self, n: int, s: float, seed: int):
        self.n, self.s = n, float(s)
        cdf = np.cumsum(zipf_probabilities(n, s))
        cdf[-1] = 1.0            # rounding: a uniform draw in [0, 1) always lands in a rank
        self.cdf = cdf
        #: page of each rank (index 0: the hottest page)
        self.order = np.random.default_rng([ORDER_STREAM, seed]).permutation(n)

    def draw(self, rng: np.random.Generator, shape) -> np.ndarray:
        """Page indices of ``shape`` (e.g. (blocks, batch)), drawn independently with ``rng``: as with
        ``--access random``, one batch may hold a page more than once."""
        ranks = np.searchsorted(self.cdf, rng.random(shape), side="right")
        return self.order[ranks]

    def hottest(self, k: int) -> np.ndarray:
        """The ``k`` most popular pages, hottest first."""
        return self.order[:k]
