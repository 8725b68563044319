"""One module per scenario's report, each holding its figure builder(s), its compact table(s), its rows of the
overview and its key conclusions (in the shape of the point kinds' :mod:`peercache.lab.pipeline.points`):

====================  =============================================================
``single_nic``        PeerCache over one NIC beside the raw tool, with the percentage
``multi_rail``        one process over every rail: GB/s against threads
``whole_machine``     every NIC at once: per-NIC bars, the aggregate, line rates
``gpudirect``         GETs into GPU memory beside GETs into host memory
``msgsize_sweep``     the raw tool against message size and QPs, with perf stat counters
``engines``           PeerCache, the other engines and the raw limit, cell by cell
``hicache``           the HiCache suite: pages/s by op and threads, PEAK per op
``cluster``           the shared-cache patterns over N hosts, churn, the directory's lookups
``growth``            how costs grow with keys, members, pool and batch size, power laws
``directory_faults``  the directory's own failure per form: hit rate and GB/s through each fault
====================  =============================================================

What every scenario's report is made of (and the default a scenario without a module gets) is in
:mod:`.declare`; the harnesses that draw and assemble them are :mod:`peercache.lab.analysis.charts` and
:mod:`peercache.lab.analysis.report`. A new scenario's report is one module here and one line in
:data:`REPORTS` (a test checks every scenario of experiments/scenarios.yaml has one).
"""
from __future__ import annotations

from peercache.lab.analysis.scenarios import engines, gpudirect, hicache, msgsize_sweep, multi_rail, single_nic
from peercache.lab.analysis.scenarios import cluster, directory_faults, growth, whole_machine
from peercache.lab.analysis.scenarios.declare import Scenario

#: scenario name (experiments/scenarios.yaml) -> its report
REPORTS: dict[str, Scenario] = {
    "single_nic": single_nic.SingleNic(),
    "multi_rail": multi_rail.MultiRail(),
    "whole_machine": whole_machine.WholeMachine(),
    "gpudirect": gpudirect.GpuDirect(),
    "msgsize_sweep": msgsize_sweep.MsgsizeSweep(),
    "engines": engines.Engines(),
    "hicache": hicache.HiCache(),
    "cluster": cluster.Cluster(),
    "growth": growth.Growth(),
    "directory_faults": directory_faults.DirectoryFaults(),
}
#: What a scenario without a module of its own gets (one in the data but not in the scenario file).
DEFAULT = Scenario()


def report_of(scenario: str) -> Scenario:
    """The report of ``scenario`` (the default for a scenario without a module of its own)."""
    return REPORTS.get(scenario, DEFAULT)
