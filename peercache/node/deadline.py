"""One bound for a whole read: its deadline, what spent the time, and the keys it ran out on."""
from __future__ import annotations

import time

import numpy as np

from ..errors import DiscoveryUnreachable


class Deadline:
    """The time a batch read has, set once when the call starts (``seconds``, the node's
    ``timeout``) and handed to every tier that may block: the directory's table, the lookup
    RPC, the members call that maps numbers, and the data read. Each asks :meth:`left` how long
    it may still wait, so the tiers share one bound instead of each waiting its own.

    What used time is noted (:meth:`spent`), and the keys a tier gave up on because the time ran
    out are collected (:meth:`give_up`), so the call can say which step did not answer and which
    keys it did not read, instead of reading them as misses.
    """

    __slots__ = ("seconds", "at", "steps", "_late")

    def __init__(self, seconds: float):
        self.seconds = float(seconds)
        self.at = time.monotonic() + self.seconds
        #: (what, seconds it took, why it failed) of each step that failed or ran out of time
        self.steps: list[tuple[str, float, str]] = []
        self._late: list[np.ndarray] = []

    def left(self) -> float:
        """Seconds left (0 once over)."""
        return max(0.0, self.at - time.monotonic())

    def over(self) -> bool:
        return time.monotonic() >= self.at

    def spent(self, what: str, since: float, why: str) -> None:
        """Note that ``what`` (a step begun at monotonic ``since``) failed or timed out: ``why``."""
        self.steps.append((what, time.monotonic() - since, why))

    def rpc_failed(self, what: str, since: float, e: DiscoveryUnreachable) -> bool:
        """A directory call that raised ``e``: noted, and True when the call's time is over (the keys
        it was for are then given up, not the whole read); False: re-raise it."""
        self.spent(what, since, str(e))
        return self.over()

    def give_up(self, indices) -> None:
        """The keys (indices into the keys of the caller's lookup) no tier answered in time."""
        idx = np.asarray(indices, dtype=np.intp).reshape(-1)
        if len(idx):
            self._late.append(idx)

    def take_late(self) -> list:
        """The index arrays given up since the last take ([] when none: the common case), cleared."""
        late, self._late = self._late, []
        return late

    def reason(self, n: int, outcome: str = "each an error, not a miss") -> str:
        """Why ``n`` keys of the call have ``outcome``: the call's bound and the steps that used it."""
        steps = "; ".join(f"{what} failed after {took:.2f} s ({why})" for what, took, why in self.steps) \
            or "the steps before used it up"
        return (f"timed out: the call has {self.seconds:g} s in all (the library's timeout=, --timeout on the "
                f"command line) and {n} key(s) were not answered in time, {outcome}: {steps}; check that the "
                "node named is running and not stopped or overloaded, or raise the timeout")
