"""How much slower the lab's hosts are than a plain machine: one factor every wait stretches by, and the one
rule that stretches a bound (:func:`scaled`)."""
from __future__ import annotations

import os

#: Seconds a short command on a host (cat, rm, test -x, command -v) may take on a plain machine.
HOST_COMMAND_S = 30.0


def slowness() -> float:
    """How much slower the hosts are than a plain machine (``PEERCACHE_SLOWNESS``, at least 1).

    The Soft-RoCE guests measure it at boot and export it (the one-guest runner to its command, the
    two-machine launcher to the pipeline it runs); every wait on a host command stretches by it,
    since an emulated guest is slow, not hung. Measured windows never do.
    """
    try:
        return max(1.0, float(os.environ.get("PEERCACHE_SLOWNESS") or 1))
    except ValueError:
        return 1.0


def scaled(seconds: float, slow: float | None = None) -> float:
    """``seconds``, a bound on a plain machine, stretched by the hosts' slowness (``slow``, default
    :func:`slowness`): the one rule every wait of the lab follows (a measured window never does)."""
    return seconds * (slowness() if slow is None else slow)
