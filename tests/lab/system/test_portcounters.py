"""portcounters: counter deltas in 4-byte units, line rate, and the one check of a figure (flags)."""
from __future__ import annotations

from pathlib import Path

import pytest

from peercache.lab.launch.hosts import LocalHost
from peercache.lab.system import crosscheck
from peercache.lab.system import portcounters as pc
from peercache.sysfs import using_root

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "lab" / "portcounters"
BEFORE, AFTER = FIX / "before", FIX / "after"
DEVS = ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]


def read(root):
    """Samples of DEVS as the pipeline reads them (through a host), from a fixture sysfs tree."""
    with using_root(root):
        return crosscheck.sample_ports(LocalHost(), DEVS)


def rates(*devs):
    with using_root(AFTER):
        return crosscheck.line_rates(LocalHost(), list(devs))


@pytest.fixture
def moved():
    before, after = read(BEFORE), read(AFTER)
    return {d.device: d for d in pc.deltas(before, after)}


def test_counters_are_4_byte_units(moved):
    assert moved["mlx5_0"].rcv_bytes == 2_500_000_000 * 4 == 10_000_000_000
    assert moved["mlx5_0"].xmit_bytes == 1_000_000_000
    assert moved["mlx5_1"].rcv_bytes == 10_000_000_000 and moved["mlx5_1"].flags == []


def test_counter_problems_are_flagged(moved):
    assert "port_rcv_data_saturated" in moved["mlx5_2"].flags and moved["mlx5_2"].rcv_bytes is None
    assert moved["mlx5_2"].xmit_bytes == 40
    assert {"port_rcv_data_unreadable", "port_xmit_data_unreadable"} <= set(moved["mlx5_3"].flags)
    backwards = pc.delta(pc.PortSample("d", 1, 10, 10, 0.0), pc.PortSample("d", 1, 5, 20, 1.0))
    assert backwards.flags == ["port_rcv_data_went_backwards"] and backwards.xmit_bytes == 40


def test_line_rate_from_sysfs():
    assert pc.parse_rate("400 Gb/sec (4X NDR)") == 400e9
    assert pc.parse_rate("25 Gb/sec (1X EDR)") == 25e9
    assert rates("mlx5_0", "mlx5_9") == {"mlx5_0": 50e9, "mlx5_9": None}
    with pytest.raises(ValueError, match="Gb/sec"):
        pc.parse_rate("fast")


def line(*devs):
    return sum(rates(*devs).values())


def test_agreeing_figure_passes(moved):
    ck = pc.check([moved["mlx5_0"]], line("mlx5_0"), 9.8e9, 1.0)
    assert ck.ok and ck.flags == [] and ck.line_rate_Bps == 50e9


def test_bonded_figure_sums_ports(moved):
    # 19.5 GB/s over 1 s on two ports that moved 10 GB each, 100 GB/s of line rate together
    ck = pc.check([moved["mlx5_0"], moved["mlx5_1"]], line("mlx5_0", "mlx5_1"), 19.5e9, 1.0)
    assert ck.ok and ck.line_rate_Bps == 100e9
    ck = pc.check([moved["mlx5_0"]], line("mlx5_0"), 19.5e9, 1.0)   # one port alone cannot have moved it
    assert ck.flags == ["counter_disagreement"]


def test_above_line_rate_is_flagged(moved):
    # 10 GB in 0.1 s = 100 GB/s on a 50 GB/s port: a wrong window, not a fast NIC
    ck = pc.check([moved["mlx5_0"]], line("mlx5_0"), 100e9, 0.1)
    assert not ck.ok and ck.flags == ["above_line_rate"] and "summed line rate" in ck.messages[0]


def test_counters_bound_the_figure_from_above(moved):
    # The counters span the whole run (warm-up included), so a figure below them passes...
    assert pc.check([moved["mlx5_0"]], line("mlx5_0"), 8e9, 1.0).ok
    # ...and one claiming more than the tolerance above them does not.
    ck = pc.check([moved["mlx5_0"]], line("mlx5_0"), 10.3e9, 1.0)
    assert ck.flags == ["counter_disagreement"] and "moved only 10000000000 B" in ck.messages[0]
    assert pc.check([moved["mlx5_0"]], line("mlx5_0"), 10.1e9, 1.0).ok          # within 2 %
    assert pc.check([moved["mlx5_0"]], line("mlx5_0"), 1e9, 1.0, direction="xmit").ok   # xmit moved 1 GB
    assert pc.check([moved["mlx5_0"]], line("mlx5_0"), 2e9, 1.0, direction="xmit").flags == [
        "counter_disagreement"]


def test_checks_that_cannot_run_are_flags_not_passes(moved):
    assert pc.check([], line("mlx5_0"), 1e9, 1.0).flags == ["counters_unusable"]
    ck = pc.check([moved["mlx5_2"]], line("mlx5_2"), 1e9, 1.0)
    assert not ck.ok and ck.flags == ["counters_unusable"] and "saturated" in ck.messages[0]
    ck = pc.check([moved["mlx5_0"]], None, 1e9, 1.0)
    assert ck.flags == ["line_rate_unknown"] and not ck.ok
    assert pc.check([moved["mlx5_0"]], 50e9, None, 1.0).flags == ["no_figure"]
    ck = pc.check([pc.PortDelta("d", 1, 0, 0, 1.0)], 50e9, 5e9, 1.0)
    assert ck.flags == ["counter_disagreement"]
    with pytest.raises(ValueError, match="direction"):
        pc.check([], 1, 1, 1, "both")


def test_reads_live_sysfs_without_crashing():
    s = crosscheck.sample_ports(LocalHost(), ["pclab-no-such-dev"])["pclab-no-such-dev"]  # real root
    assert s.rcv_data is None and "cannot read counters of pclab-no-such-dev" in s.reason
