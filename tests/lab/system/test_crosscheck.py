"""Port-counter cross-check of a point's figures (fixture sysfs tree, no RDMA needed)."""
from pathlib import Path

from peercache.lab.system import crosscheck
from peercache.lab.launch.hosts import LocalHost
from peercache.lab.system.portcounters import PortSample
from peercache.sysfs import using_root

CX7 = Path(__file__).resolve().parents[2] / "fixtures" / "lab" / "hosts" / "cx7-8bond"


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


def test_a_port_without_data_counters_is_read_through_its_netdev(tmp_path):
    # Soft-RoCE ports have no counters/port_*_data; their netdev's byte counters stand in.
    port = tmp_path / "sys/class/infiniband/rxe_b0/ports/1"
    (port / "gid_attrs/ndevs").mkdir(parents=True)
    (port / "gid_attrs/ndevs/0").write_text("pcg0b\n")
    stats = tmp_path / "sys/class/net/pcg0b/statistics"
    stats.mkdir(parents=True)
    (stats / "rx_bytes").write_text("1000\n")
    (stats / "tx_bytes").write_text("50\n")
    with using_root(tmp_path):
        before = crosscheck.sample_ports(LocalHost(), ["rxe_b0"])
        (stats / "rx_bytes").write_text("5001000\n")
        after = crosscheck.sample_ports(LocalHost(), ["rxe_b0"])
    assert before["rxe_b0"].source == "netdev:pcg0b" and before["rxe_b0"].unit_bytes == 1
    pc = crosscheck.check(before, after, {"rxe_b0": 1.25e9}, figure_Bps=2e6, window_s=2)
    assert pc.deltas[0].rcv_bytes == 5_000_000 and pc.flags == []
    assert pc.as_extra()["port_counters"]["rxe_b0"]["source"] == "netdev:pcg0b"
    pc = crosscheck.check(before, after, {"rxe_b0": 1.25e9}, figure_Bps=4e6, window_s=2)
    assert pc.flags == ["counter_disagreement"]


def test_writes_are_checked_against_what_the_client_sent():
    from peercache.lab.pipeline import experiments, runpoint
    from peercache.lab.tidy import Row

    tb = experiments.load_testbed("experiments/testbeds/softroce.yaml")
    point = experiments.Point("msgsize_sweep", "ib_write_bw_q1_s1M", "perftest", {"tool": "ib_write_bw"})
    before = {"rxe_b0": PortSample("rxe_b0", 1, 0, 0, 0.0, unit_bytes=1, source="netdev:pcg0b")}
    after = {"rxe_b0": PortSample("rxe_b0", 1, 70_000, 40_000_000, 3.0, unit_bytes=1, source="netdev:pcg0b")}
    for tool, flagged in (("ib_write_bw", False), ("ib_read_bw", True)):
        pr = runpoint.PointRun(tb, point, 0, Path("/nonexistent"))
        pr.duration = 2.0          # the window the figure claims: 18.75 MB/s x 2 s = 37.5 MB
        pr.rows.append(Row(metric="bw", value=18.75e6, unit="B/s", tool=tool, side="client", devices="rxe_b0",
                           **pr.ctx()))
        pr.check_counters(before, after, {"rxe_b0": 1.25e9})
        assert ("counter_disagreement" in pr.rows[0].extra["crosscheck_flags"]) is flagged, tool
