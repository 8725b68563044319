"""The bounds of a point's waits that several kinds and the harness share: seconds on a plain machine, each
declared once, stretched by the hosts' slowness through the one rule (:func:`peercache.lab.system.slowness.scaled`,
on the harness :meth:`PointRun.scaled`). A kind's own bound is declared in its module, a host command's in
:mod:`peercache.lab.system.slowness`; a measured window never stretches.
"""
from __future__ import annotations

from peercache.lab.system.slowness import scaled

#: Seconds a server that fills its pages before it says so in its output (``peercache-bench serve``, the
#: published serve, NIXL's target) may take to be ready.
READY_S = 60.0
#: Seconds a server whose listening port is its readiness (iperf3, sockperf) may take to listen.
PORT_READY_S = 15.0
#: Seconds drive (and the HiCache suite) waits for serve's published pages on an emulated host (--ready-timeout).
DRIVE_READY_S = 30.0
#: Seconds a one-shot server (serve once its readers are done, perftest, iperf3) may take to exit after its
#: clients finished: serve leaves the directory and closes its node first (the runners' own default, now
#: stretched: on the emulated two-machine pair, slowness about 23, serve once took longer than 10 s).
SERVER_EXIT_S = 10.0
#: Seconds of a point's client bound beyond its measured windows.
POINT_BASE_S = 60.0
#: How many times over a client may take each of its measured windows (warm-up + duration).
WINDOW_ALLOWANCE = 4


def point_bound(windows: int, duration: float, warmup: float, slow: float) -> float:
    """Seconds a point's client (and serve's --max-wait) may run: :data:`POINT_BASE_S` and
    :data:`WINDOW_ALLOWANCE` x each of its ``windows`` of ``warmup`` + ``duration``, stretched by ``slow``."""
    return scaled(POINT_BASE_S + WINDOW_ALLOWANCE * windows * (duration + warmup), slow)
