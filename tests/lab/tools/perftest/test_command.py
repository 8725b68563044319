"""perftest.command: the server's and client's argv from one PerftestParams, and the server's ready line."""
from __future__ import annotations

import pytest

from lab.tools.perftest.captures import load, parse_real, real
from peercache.lab.tools import perftest as pt


# --- builder ----------------------------------------------------------------------------------

def test_server_and_client_share_symmetric_flags():
    p = pt.PerftestParams(tool="ib_read_bw", device="mlx5_bond_1", gid_index=3, qps=16,
                          size=131072, duration=10, tx_depth=128, qp_timeout=20, cpu_util=True, tcp_port=18600)
    srv = pt.server_command(p)
    cli = pt.client_command(p, "10.0.1.12")
    assert srv[0] == cli[0] == "ib_read_bw"
    assert cli[-1] == "10.0.1.12" and cli[:-1] == srv
    for flag in (["-q", "16"], ["-s", "131072"], ["-D", "10"], ["-t", "128"], ["-u", "20"], ["-p", "18600"],
                 ["-d", "mlx5_bond_1"], ["-x", "3"]):
        i = srv.index(flag[0])
        assert srv[i:i + 2] == flag
    assert "--report_gbits" in srv and "--cpu_util" in srv
    # the symmetric part is the same list on both sides, whatever the local device
    other = pt.client_command(pt.PerftestParams(**{**p.__dict__, "device": "mlx5_bond_5"}), "h")
    assert pt.symmetric_args(p) == [a for a in other if a not in ("-d", "mlx5_bond_5", "-x", "3", "h")][1:]


def test_builder_all_sizes_bidir_cuda_json():
    p = pt.PerftestParams(tool="ib_write_bw", size=None, all_sizes=True, bidirectional=True,
                          report_both=True, report_gbits=False, use_cuda=0, out_json="/tmp/x.json")
    argv = pt.server_command(p)
    assert "-a" in argv and "-s" not in argv
    assert "-b" in argv and "--report-both" in argv and "--report_gbits" not in argv
    assert "--use_cuda=0" in argv and "--out_json" in argv and "--out_json_file=/tmp/x.json" in argv
    assert p.bw_unit == "MiB/sec"


@pytest.mark.parametrize("kwargs, msg", [
    (dict(tool="ib_atomic_bw"), "not one of"),
    (dict(qp_timeout=32), "5-bit exponent"),
    (dict(size=4096, all_sizes=True), "not both"),
    (dict(duration=5, iterations=1000), "not both"),
    (dict(cpu_util=True), "duration"),
    (dict(report_both=True), "bidirectional"),
    (dict(tool="ib_write_bw", outs=16), "ib_read_bw only"),
    (dict(iterations=2), "at least 5"),
    (dict(size=None, all_sizes=True, duration=2), "duration mode"),  # perftest exits 1 on it
    (dict(margin=1), "needs a duration"),
    (dict(duration=4, margin=2), "above twice it"),                  # perftest: DURATION > 2*MARGIN
])
def test_builder_rejects_inconsistent_params(kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        pt.PerftestParams(**kwargs)


def test_a_margin_is_passed_to_both_sides_and_places_the_sample_in_the_loop():
    p = pt.PerftestParams(size=4096, duration=6, margin=1)
    assert pt.symmetric_args(p)[:6] == ["-s", "4096", "-q", "1", "-D", "6"] and "-f" in pt.server_command(p)
    assert pt.client_command(p, "h")[pt.client_command(p, "h").index("-f") + 1] == "1"
    assert pt.sample_window(p) == (1, 4)
    # perftest's own margin: duration / 4, integer division
    assert pt.sample_window(pt.PerftestParams(duration=10)) == (2, 6)
    assert pt.sample_window(pt.PerftestParams(duration=3)) == (0, 3)
    with pytest.raises(ValueError, match="duration mode"):
        pt.sample_window(pt.PerftestParams(iterations=100))


def test_ignore_cpu_freq_is_F_on_both_sides():
    p = pt.PerftestParams(size=4096, duration=2, ignore_cpu_freq=True)
    assert "-F" in pt.server_command(p) and "-F" in pt.client_command(p, "h")
    assert "-F" not in pt.server_command(pt.PerftestParams(size=4096, duration=2))


def test_client_needs_an_address():
    with pytest.raises(ValueError):
        pt.client_command(pt.PerftestParams(), "-x")


# --- server readiness -------------------------------------------------------------------------

def test_server_ready_pattern():
    assert pt.SERVER_READY_PATTERN.search(real("write_s131072_q1.server.stdout"))
    assert pt.SERVER_READY_PATTERN.search(real("write_rdma_cm_s131072.server.stdout"))
    assert not pt.SERVER_READY_PATTERN.search(real("write_s131072_q1.client.stdout"))
    assert not pt.SERVER_READY_PATTERN.search(load("read_bw_q16_mib.txt"))


def test_server_stdout_is_empty_while_it_listens():
    at_listen = real("ready_probe.server.stdout_at_listen")
    assert at_listen == ""  # block-buffered: nothing yet, 2 s after the port listened
    final = real("ready_probe.server.stdout")
    assert pt.SERVER_READY_PATTERN.search(final)
    assert not pt.SERVER_READY_PATTERN.search(at_listen)
    assert parse_real("ready_probe.server.stdout").rows[0].bw_average_raw == 19.90
