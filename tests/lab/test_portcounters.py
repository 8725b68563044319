"""portcounters: counter deltas in 4-byte units, line rate, and explicit flags."""
from __future__ import annotations

from pathlib import Path

import pytest

from peercache.lab.system import portcounters as pc

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "lab" / "portcounters"
BEFORE, AFTER = FIX / "before", FIX / "after"
PORTS = [("mlx5_0", 1), ("mlx5_1", 1), ("mlx5_2", 1), ("mlx5_3", 1)]


@pytest.fixture
def moved():
    before, after = pc.sample(PORTS, root=BEFORE), pc.sample(PORTS, root=AFTER)
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
    assert pc.line_rate_Bps("mlx5_0", 1, root=AFTER) == (50e9, None)
    rate, why = pc.line_rate_Bps("mlx5_9", 1, root=AFTER)
    assert rate is None and "does not exist" in why
    with pytest.raises(ValueError, match="Gb/sec"):
        pc.parse_rate("fast")


def rate(*devs):
    return sum(pc.line_rate_Bps(d, 1, root=AFTER)[0] for d in devs)


def test_agreeing_figure_passes(moved):
    ck = pc.check_figure(9.8e9, 1.0, [moved["mlx5_0"]], "rcv", rate("mlx5_0"), tolerance=0.05)
    assert ck.ok and ck.flags == [] and ck.counter_bytes == 10e9 and ck.figure_Bps == 9.8e9


def test_bonded_figure_sums_ports(moved):
    ck = pc.check_figure(19.5e9, 0.5, [moved["mlx5_0"], moved["mlx5_1"]], "rcv",
                         rate("mlx5_0", "mlx5_1"))
    assert ck.ok and ck.counter_bytes == 20e9 and ck.line_rate_Bps == 100e9


def test_above_line_rate_is_flagged(moved):
    # 10 GB in 0.1 s = 100 GB/s on a 50 GB/s port: a wrong window, not a fast NIC
    ck = pc.check_figure(10e9, 0.1, [moved["mlx5_0"]], "rcv", rate("mlx5_0"))
    assert not ck.ok and ck.codes == ["above_line_rate"]
    ck = pc.check_figure(None, None, [moved["mlx5_0"]], "rcv", rate("mlx5_0"), reported_Bps=60e9)
    assert "above_line_rate" in ck.codes


def test_counter_disagreement_is_flagged(moved):
    ck = pc.check_figure(8e9, 1.0, [moved["mlx5_0"]], "rcv", rate("mlx5_0"), tolerance=0.05)
    assert ck.codes == ["counter_disagreement"] and "20.0% apart" in ck.flags[0].message
    ck = pc.check_figure(1e9, 1.0, [moved["mlx5_0"]], "xmit", rate("mlx5_0"), tolerance=0.05)
    assert ck.ok  # xmit moved 1 GB


def test_checks_that_cannot_run_are_flags_not_passes(moved):
    ck = pc.check_figure(1e9, 1.0, None, "rcv", rate("mlx5_0"))
    assert not ck.ok and ck.codes == ["counters_unavailable"]
    ck = pc.check_figure(1e9, 1.0, [moved["mlx5_2"]], "rcv", rate("mlx5_2"))
    assert not ck.ok and ck.codes == ["counters_unusable"] and "saturated" in ck.flags[0].message
    ck = pc.check_figure(1e9, 1.0, [moved["mlx5_0"]], "rcv", None)
    assert "line_rate_unknown" in ck.codes and not ck.ok
    ck = pc.check_figure(5e9, 1.0, [pc.PortDelta("d", 1, 0, 0, 1.0)], "rcv", 50e9)
    assert ck.codes == ["counter_disagreement"]
    with pytest.raises(ValueError, match="direction"):
        pc.check_figure(1, 1, None, "both", 1)


def test_reads_live_sysfs_without_crashing():
    s = pc.read_port("pclab-no-such-dev", 1)  # real root: absent device -> reason, no exception
    assert s.rcv_data is None and "does not exist" in s.reason
