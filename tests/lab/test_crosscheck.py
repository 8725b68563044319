"""Port-counter cross-check of a point's figures (fixture sysfs tree, no RDMA needed)."""
from pathlib import Path

from peercache.lab import crosscheck
from peercache.lab.hosts import LocalHost
from peercache.lab.portcounters import PortSample
from peercache.lab.sysroot import using_root

CX7 = Path(__file__).resolve().parents[1] / "fixtures" / "lab" / "hosts" / "cx7-8bond"


def s(dev, rcv, t):
    return PortSample(dev, 1, rcv, 0, t)


def test_samples_and_rates_read_through_the_host_from_the_fixture_tree():
    with using_root(CX7):
        got = crosscheck.sample_ports(LocalHost(), ["mlx5_bond_1", "mlx5_nope"])
        rates = crosscheck.line_rates(LocalHost(), ["mlx5_bond_1", "mlx5_nope"])
    assert got["mlx5_bond_1"].rcv_data is not None and got["mlx5_bond_1"].reason is None
    assert got["mlx5_nope"].rcv_data is None and "cannot read counters of mlx5_nope" in got["mlx5_nope"].reason
    assert rates["mlx5_bond_1"] == 400e9 / 8 and rates["mlx5_nope"] is None


def test_figure_within_counters_and_line_rate_passes():
    before, after = {"d": s("d", 0, 0.0)}, {"d": s("d", 10_000_000_000 // 4, 12.0)}   # 10 GB moved
    pc = crosscheck.check(before, after, {"d": 50e9}, figure_Bps=0.9e9, window_s=10)
    assert pc.flags == [] and pc.deltas[0].rcv_bytes == 10_000_000_000


def test_figure_above_line_rate_and_above_counters_are_flagged():
    before, after = {"d": s("d", 0, 0.0)}, {"d": s("d", 1_000_000 // 4, 3.0)}
    pc = crosscheck.check(before, after, {"d": 1e9}, figure_Bps=2e9, window_s=2)
    assert set(pc.flags) == {"above_line_rate", "counter_disagreement"}
    assert any("summed line rate" in m for m in pc.messages)
    assert pc.as_extra()["crosscheck_flags"] == pc.flags


def test_unreadable_counters_and_unknown_rate_are_flags_not_passes():
    before = {"d": PortSample("d", 1, None, None, 0.0, reason="gone")}
    after = {"d": PortSample("d", 1, None, None, 1.0, reason="gone")}
    pc = crosscheck.check(before, after, {"d": None}, figure_Bps=1e9, window_s=1)
    assert set(pc.flags) == {"line_rate_unknown", "counters_unusable"}
