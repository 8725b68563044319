"""The time bounds of ``peercache-bench drive``: every wait of a driver, in one place.

Every fault ends a drive within 5 s. Each wait of a driver is bounded by one of these: its
directory calls (lookups, heartbeats) give up after IO_TIMEOUT_S without an answer (over rdma
IO_TIMEOUT_S + RDMA_COMPLETION_S, a GET's whole bound: see :class:`.worker.Worker`), its tcp
data connection after DATA_TIMEOUT_S without progress; a point ends once the directory has
answered none of the node's heartbeats (one a second) for DIRECTORY_SILENCE_S, which also
catches a stopped producer hosting the directory whose pages one-sided reads still reach
(shm, rdma), unless --faults-expected says the directory may go away and come back (each of its
calls stays bounded, and one to a directory that went away fails at once: see
:class:`~peercache.rpc.RpcClient`); threads still inside a read are then given STUCK_GRACE_S and
left behind, and after a failed run the driver processes are given END_GRACE_S before they are
ended.

--time-scale multiplies POINT_GRACE_S, IO_TIMEOUT_S, DATA_TIMEOUT_S, DIRECTORY_SILENCE_S and
RDMA_CONNECT_S (emulated hosts); RDMA_COMPLETION_S, STUCK_GRACE_S and END_GRACE_S stay.
"""
from __future__ import annotations

from ...timeouts import DEFAULT as ENGINE

#: How long a point may overrun its window before the driver gives up on it.
POINT_GRACE_S = 20.0
#: A directory call's bound (a GET's bound, every step included; over rdma plus RDMA_COMPLETION_S).
IO_TIMEOUT_S = 3.0
#: A tcp data connection's bound without progress.
DATA_TIMEOUT_S = 2.0
#: How long the directory may answer no heartbeat before the point ends.
DIRECTORY_SILENCE_S = 3.0
#: The rdma transport's connection setup bound drive gives it (the engine's own, before --time-scale).
RDMA_CONNECT_S = ENGINE.rdma_connect_s
#: The rdma transport's completion bound drive gives it: a READ with no completion for this long is a
#: path fault, failed over to another rail (the engine's own; not stretched by --time-scale: see Worker).
RDMA_COMPLETION_S = ENGINE.rdma_completion_s
#: How long threads still inside a read are waited for once a point stopped, before they are left behind.
STUCK_GRACE_S = 0.2
#: How long the driver processes of a failed run are given to end before they are ended.
END_GRACE_S = 1.0
#: How long the driver processes of a run that went well are given to end.
CLEAN_END_S = 5.0
#: How long process 0 waits for serve's metrics text at a window edge (--metrics-scrapes).
SCRAPE_TIMEOUT_S = 3.0
#: How often a driver process checks on its point's threads and its directory.
WATCH_S = 0.1
