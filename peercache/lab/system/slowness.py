"""How much slower the lab's hosts are than a plain machine: one factor every wait stretches by."""
from __future__ import annotations

import os


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
