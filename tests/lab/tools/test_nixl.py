"""The ``nixl`` kind: our driver over nixl_agent (its pure parts: the page pattern and its check, percentiles,
the interface lookup, UCX's environment), the command builders, the strict parser over real captures
(tests/fixtures/lab/engines/README.md), the skip over rdma, and the driver itself against NIXL when
``.venv-nixl`` is there."""
import json
import re
import socket
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from peercache.lab.errors import ParseError, ToolError
from peercache.lab.launch.hosts import LocalHost
from peercache.lab.launch.runners import fill_placeholders
from peercache.lab.pipeline import experiments, runpoint
from peercache.lab.pipeline.points import nixl as nixl_kind
from peercache.lab.tools import nixl as nx
from peercache.lab.tools import nixl_driver as drv

ROOT = Path(__file__).resolve().parents[3]
FIX = ROOT / "tests/fixtures/lab/engines"
NETNS = "nixl_initiator_netns_tcp_t1_s128K_b32.log"


def _read(name: str) -> str:
    return (FIX / name).read_text()


# -- the driver's pure parts -----------------------------------------------------------------------------

def test_pattern_check_finds_a_page_from_elsewhere_a_shifted_one_and_one_that_never_arrived():
    pool = drv.fill_pool(16, 4096).reshape(16, 512)
    idx = np.array([3, 7, 0, 15])
    dest = pool[idx].copy()
    ramp, scratch = np.arange(512, dtype=np.uint64), np.empty_like(dest)
    assert drv.mismatched(dest, idx, ramp, scratch) == 0
    dest[1] = pool[8]                                     # another page
    dest[2, :-1] = pool[0, 1:]                            # one word late
    drv.poison(dest[3:4])                                 # never arrived
    assert drv.mismatched(dest, idx, ramp, scratch) == 3
    dest[1, 100] ^= np.uint64(1)                          # one bit in an already bad page: still one page
    assert drv.mismatched(dest, idx, ramp, scratch) == 3


def test_pattern_needs_whole_words_and_poison_is_no_page_word():
    with pytest.raises(ValueError, match="multiple of 8"):
        drv.words_per_page(4100)
    assert drv.fill_pool(1 << 10, 1 << 20).max() < drv.POISON


def test_percentiles_are_nearest_rank_in_microseconds():
    lat = [i / 1e6 for i in range(1, 101)]                # 1..100 us
    assert drv.percentiles_us(lat) == pytest.approx({"p50": 50.0, "p99": 99.0, "max": 100.0})
    assert drv.percentiles_us([0.002]) == pytest.approx({"p50": 2000.0, "p99": 2000.0, "max": 2000.0})
    with pytest.raises(ValueError, match="no batch completed"):
        drv.percentiles_us([])


def test_ucx_env_keeps_ucx_on_the_path_measured():
    assert drv.interface_of("127.0.0.1") == "lo"
    assert drv.ucx_env("tcp", "127.0.0.1", None, None) == {"UCX_TLS": "tcp", "UCX_NET_DEVICES": "lo"}
    assert drv.ucx_env("rdma", "127.0.0.1", "rxe0", 1) == {"UCX_TLS": "rc", "UCX_NET_DEVICES": "rxe0:1",
                                                          "UCX_IB_GID_INDEX": "1"}
    with pytest.raises(ValueError, match="no network interface here holds 192.0.2.254"):
        drv.interface_of("192.0.2.254")
    with pytest.raises(ValueError, match="needs --device"):
        drv.ucx_env("rdma", "127.0.0.1", None, None)


# -- command builders ----------------------------------------------------------------------------------

def test_commands_match_the_peercache_point_and_take_the_targets_ready_line():
    t = nx.target_command("/v/python", "/c/drv.py", "tcp", "198.18.77.1", 42000, 131072, 256)
    i = nx.initiator_command("/v/python", "/c/drv.py", "tcp", "198.18.77.2", 42001, "198.18.77.1:42000", 131072,
                             256, 32, 2, 3.0, 0.5)
    assert t == ["/v/python", "-P", "/c/drv.py", "target", "--protocol", "tcp", "--host", "198.18.77.1",
                 "--listen-port", "42000", "--page-size", "131072", "--pages", "256"]
    assert i[:4] == ["/v/python", "-P", "/c/drv.py", "initiator"] and i[-1] == "--verify"
    got = dict(zip(i[4::2], i[5::2]))
    assert got["--batch"] == "32" and got["--threads"] == "2" and got["--duration"] == "3"
    assert got["--agent"] == "{nixl_agent}" and got["--pool"] == "{nixl_pool}"
    # the target's real ready line fills both placeholders
    m = re.search(nx.TARGET_READY, _read("nixl_target_netns_tcp_s128K.log"))
    filled = fill_placeholders(i, m.groupdict())
    assert "pclab-nixl-target-19159" in filled and "0x7ff60bce9010" in filled
    assert nx.initiator_command("/v/python", "/c/drv.py", "tcp", "h", 1, "t:2", 4096, 64, 32, 1, 1, 0,
                                verify=False)[-1] == "--no-verify"


def test_commands_refuse_what_the_driver_cannot_run():
    with pytest.raises(ValueError, match="protocol rdma needs the RDMA device"):
        nx.target_command("p", "d", "rdma", "h", 1, 4096, 64)
    with pytest.raises(ValueError, match="multiple of 8"):
        nx.target_command("p", "d", "tcp", "h", 1, 4100, 64)
    with pytest.raises(ValueError, match="not HOST:PORT"):
        nx.initiator_command("p", "d", "tcp", "h", 1, "nohost", 4096, 64, 32, 1, 1.0, 0.0)
    r = nx.target_command("p", "d", "rdma", "h", 1, 4096, 64, device="rxe0", gid_index=1)
    assert r[-4:] == ["--device", "rxe0", "--gid-index", "1"]


def test_the_driver_takes_every_flag_the_builders_give():
    i = nx.initiator_command("p", "d", "rdma", "h", 1, "t:2", 4096, 64, 32, 1, 1.5, 0.25, device="rxe0",
                             gid_index=1)
    a = drv.parser().parse_args(i[3:])
    assert (a.mode, a.page_size, a.batch, a.duration, a.device, a.gid_index, a.verify) == \
        ("initiator", 4096, 32, 1.5, "rxe0", 1, True)
    assert (a.poll_spin_us, a.poll_sleep_us) == (50.0, 50.0)
    t = drv.parser().parse_args(nx.target_command("p", "d", "tcp", "h", 9, 4096, 64)[3:])
    assert (t.mode, t.listen_port, t.pages) == ("target", 9, 64)


# -- the parser, on real captures -----------------------------------------------------------------------

def test_parse_netns_captures():
    r = nx.parse_output(_read(NETNS), 131072, 32, 1)
    assert r.bytes == r.batches * 32 * 131072 and r.gb_per_s == pytest.approx(r.bytes / r.duration_s / 1e9)
    assert r.verify and r.verified_pages >= r.batches * 32 and r.ucx_env["UCX_TLS"] == "tcp"
    assert r.p50_us <= r.p99_us <= r.max_us and r.nixl_version == "1.5.1"
    assert all("NIXL INFO" in ln for ln in r.log_lines)
    r2 = nx.parse_output(_read("nixl_initiator_netns_tcp_t2_s4K_b32.log"), 4096, 32, 2)
    assert r2.threads == 2 and r2.batches == 3436
    rows = nx.to_rows(r, tool=nx.TOOL, experiment="local", scenario="engines", run_id="x")
    assert [(x.metric, x.unit) for x in rows] == [("get_throughput", "GB/s"), ("latency_p50", "us"),
                                                 ("latency_p99", "us"), ("batches", "count")]
    assert rows[0].extra["verified"] is True and rows[0].extra["verification"].startswith("verified: ")


def test_parse_an_unverified_run_says_so():
    r = nx.parse_output(_read("nixl_initiator_loopback_noverify_t1_s1M_b32.out"), 1 << 20, 32, 1)
    assert not r.verify and nx.verification(r) == {"verified": False,
                                                   "verification": "unverified: the driver ran with --no-verify"}


def test_wrong_bytes_and_the_drivers_own_error_are_tool_errors():
    with pytest.raises(ToolError, match="576 of 576 pages read differed") as e:
        nx.parse_output(_read("nixl_initiator_loopback_shifted_pool.out"), 1 << 20, 32, 1)
    assert e.value.kind == "failed"
    with pytest.raises(ToolError, match="no metadata from NIXL agent") as e:
        nx.parse_output(_read("nixl_initiator_no_target.out"), 131072, 32, 1, host="consumer")
    assert e.value.kind == "cannot_connect" and "listener port reachable" in str(e.value)


def _doc_of(name: str) -> dict:
    return json.loads(next(ln for ln in _read(name).splitlines() if ln.startswith("{")))


def _with(doc: dict) -> str:
    return "2026-12-02 16:07:11 NIXL INFO    _api.py:281 Initialized NIXL agent: x\n" + json.dumps(doc) + "\n"


@pytest.mark.parametrize("change, match", [
    (lambda d: d.update(batches=d["batches"] + 1), "bytes .* is not batches x batch x page_size"),
    (lambda d: d.update(gb_per_s=d["gb_per_s"] * 2), "disagrees with bytes / duration_s"),
    (lambda d: d.update(batch=16), "batch 16 is not the 32 the command asked for"),
    (lambda d: d.pop("latency_us"), "field 'latency_us' missing"),
    (lambda d: d.update(batches=True), "field 'batches' is bool"),
    (lambda d: d["latency_us"].update(p50=d["latency_us"]["max"] + 1), "out of order"),
    (lambda d: d.update(verified_pages=3), "pages checked for"),
    (lambda d: d.update(schema="other/1"), "not a peercache-lab.nixl_driver/1 document"),
    (lambda d: d.update(stopped_by="signal"), "stopped_by 'signal'"),
    (lambda d: d.pop("poll_sleep_us"), "field 'poll_sleep_us' missing"),
])
def test_parse_refuses_a_result_that_does_not_hold_together(change, match):
    doc = _doc_of(NETNS)
    change(doc)
    with pytest.raises(ParseError, match=match):
        nx.parse_output(_with(doc), 131072, 32, 1)


def test_parse_refuses_no_result_two_results_and_stray_output():
    text = _read(NETNS)
    with pytest.raises(ParseError, match="no JSON result line"):
        nx.parse_output("\n".join(ln for ln in text.splitlines() if not ln.startswith("{")), 131072, 32, 1)
    with pytest.raises(ParseError, match="a second JSON line"):
        nx.parse_output(text + text, 131072, 32, 1)
    with pytest.raises(ParseError, match="neither the driver's JSON nor UCX/NIXL logging"):
        nx.parse_output("Traceback (most recent call last):\n" + text, 131072, 32, 1)
    with pytest.raises(ParseError, match="not JSON"):
        nx.parse_output(text.replace('"engine"', '"engine', 1), 131072, 32, 1)


# -- the kind ------------------------------------------------------------------------------------------

def _point(testbed: str, name: str):
    sc = experiments.load_scenarios()
    tb = experiments.load_testbed(ROOT / testbed, sc)
    tb.doc["scenarios"] = ["engines"]
    return tb, experiments.find_point(experiments.expand(tb, sc), "engines", name)


def test_an_rdma_point_is_skipped_with_the_reason(tmp_path, monkeypatch):
    tb, pt = _point("experiments/testbeds/softroce.yaml", "nixl_rdma_t1_s128K_b32_ws256")
    assert pt.params["protocol"] == "rdma" and pt.params["devices"] == ["rxe_b0"]
    # the venv is there (a stand-in executable) and the device named: what is left is the reason itself
    py = tmp_path / nx.BINARY
    py.parent.mkdir(parents=True)
    py.write_text("#!/bin/sh\n")
    py.chmod(0o755)
    monkeypatch.setattr(nixl_kind, "engine_path", lambda rel: str(tmp_path / rel))
    monkeypatch.setattr("peercache.lab.pipeline.points.engines.engine_path", lambda rel: str(tmp_path / rel))
    th = runpoint.TestbedHosts(LocalHost(), LocalHost(), "127.0.0.1", "127.0.0.1", None)
    rows = runpoint.run_point(tb, pt, 0, tmp_path / "out" / "result.json", hosts=th)
    assert [(r.status, r.reason) for r in rows] == [("skipped", nixl_kind.RDMA_UNSHOWN)]
    assert "run_unshown_rdma: true" in nixl_kind.RDMA_UNSHOWN


# -- the driver against NIXL (only where make engines made .venv-nixl) ------------------------------------

VENV_PY = ROOT / nx.BINARY


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(not VENV_PY.exists(), reason=f"{nx.VENV} missing; run make engines")
def test_the_driver_reads_and_verifies_pages_through_nixl_on_loopback(tmp_path):
    tport, iport = _free_port(), _free_port()
    driver = str(ROOT / nx.DRIVER)
    target = subprocess.Popen(nx.target_command(str(VENV_PY), driver, "tcp", "127.0.0.1", tport, 4096, 64),
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line, t0 = "", time.monotonic()
        while "ready" not in line and time.monotonic() - t0 < 30:
            line = target.stdout.readline()
        m = re.search(nx.TARGET_READY, line)
        assert m, f"no ready line from the target: {line!r}"
        argv = nx.initiator_command(str(VENV_PY), driver, "tcp", "127.0.0.1", iport, f"127.0.0.1:{tport}", 4096, 64,
                                    8, 2, 0.5, 0.1, connect_timeout=10)
        out = subprocess.run(fill_placeholders(argv, m.groupdict()), capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr
        r = nx.parse_output(out.stdout, 4096, 8, 2)
        assert r.verify and r.verified_pages >= r.batches * 8 > 0
    finally:
        target.terminate()
        assert target.wait(20) == 0                       # stopped by its signal, not crashed at exit
