"""``peercache-bench drive``: GET (or exists) load against a serving node.

Every driver process runs the same threads against the same absolute measurement window
``[t0 + warmup, t0 + warmup + duration]`` (one host, one clock), so the aggregate is total bytes over
that one window, never a sum of rates measured over different windows.

- :mod:`.config`: :class:`DriveConfig`, what every driver process is given (typed, picklable);
- :mod:`.bounds`: every time bound of a driver (the fault bounds --time-scale stretches);
- :mod:`.worker`: one driver process (its node, receive buffer and thread loop);
- :mod:`.stats`: what a thread counts in the window, and a process's rail readings;
- :mod:`.timeline`: --timeline-ms, a thread's counts per bucket of the window and its longest stall;
- :mod:`.supervisor`: :func:`run`, which starts and watches the processes and places each point's window;
- :mod:`.aggregate`: one DrivePoint (peercache.bench.document) from every process's counters;
- :mod:`.table`: the console table.
"""
from __future__ import annotations

from .aggregate import aggregate, merge_rails
from .config import DriveConfig, safe_directory
from .stats import ThreadStats, percentiles, rail_delta
from .supervisor import await_start_file, check_prerequisites, run, tell_serve
from .table import format_table
from .worker import Worker

__all__ = ["DriveConfig", "ThreadStats", "Worker", "aggregate", "await_start_file", "check_prerequisites",
           "format_table", "merge_rails", "percentiles", "rail_delta", "run", "safe_directory", "tell_serve"]
