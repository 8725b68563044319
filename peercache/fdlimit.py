"""The open-file limit (RLIMIT_NOFILE) of a process that serves many connections.

A soft limit of 1024 (a common default) is smaller than what the tcp data
server alone may hold (DEFAULT_MAX_CONNECTIONS greeted connections plus the
ones waiting for their hello), besides the control port's. A server raises
its soft limit to the hard one at start, which needs no privilege, and says
so when even that is too low for what it may be asked to hold.
"""
from __future__ import annotations

import resource


def raise_to_hard() -> tuple[int, int, int]:
    """Raise this process's soft open-file limit to its hard limit: (soft before, soft now, hard)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft >= hard:
        return soft, soft, hard
    target = hard
    if hard == resource.RLIM_INFINITY:
        target = max(soft, 1 << 20)     # "unlimited" is refused as a soft value: a large finite one
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        return soft, soft, hard
    return soft, resource.getrlimit(resource.RLIMIT_NOFILE)[0], hard


def shortfall(need: int) -> str | None:
    """Why the soft open-file limit is too low for ``need`` descriptors (None: it is enough)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return None
    return (f"the open-file limit is {soft} (hard limit {hard}), below the {need} this server may need for "
            f"its connections: past it, new connections fail to be accepted (EMFILE); raise the hard "
            f"limit (ulimit -Hn, or LimitNOFILE= in a systemd unit) to {need} or more")
