"""iperf3: builder, strict -J parser, error classification, a real loopback run."""
from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from peercache.lab.tools import iperf3 as ip
from peercache.lab.errors import ParseError, ToolError

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "lab" / "iperf3"


def load(name: str) -> str:
    return (FIX / name).read_text()


def test_builders_always_json():
    assert ip.server_command(5201) == ["iperf3", "-s", "-J", "-B", "127.0.0.1", "-p", "5201", "-1"]
    assert "-1" not in ip.server_command(5201, one_off=False)
    argv = ip.client_command("127.0.0.1", 5201, length=65536, streams=4, duration=1,
                             bind="127.0.0.1", reverse=True)
    assert argv[:4] == ["iperf3", "-c", "127.0.0.1", "-p"] and "-J" in argv
    for pair in (["-l", "65536"], ["-P", "4"], ["-t", "1"], ["-B", "127.0.0.1"]):
        i = argv.index(pair[0])
        assert argv[i:i + 2] == pair
    assert argv[-1] == "-R"
    with pytest.raises(ValueError):
        ip.client_command("127.0.0.1", 70000)
    with pytest.raises(ValueError):
        ip.client_command("127.0.0.1", 5201, streams=0)


def test_builder_emits_the_matched_window_and_refuses_blocks_iperf3_cannot_write():
    # The local TCP limit's shape: 1 MiB requests, the data server's 256 KiB send buffer, the server sending.
    argv = ip.client_command("198.18.77.1", 5201, length=1048576, window=262144, reverse=True)
    for pair in (["-l", "1048576"], ["-w", "262144"]):
        i = argv.index(pair[0])
        assert argv[i:i + 2] == pair
    assert argv[-1] == "-R"
    assert "-w" not in ip.client_command("198.18.77.1", 5201)          # no window: the kernel's autotuning
    with pytest.raises(ValueError, match="over iperf3's largest TCP block"):
        ip.client_command("198.18.77.1", 5201, length=4 << 20)       # a 4 MiB batch is no -l
    with pytest.raises(ValueError, match="window 0"):
        ip.client_command("198.18.77.1", 5201, window=0)


def test_window_as_iperf3_reported_it():
    r = ip.parse_json(load("client_loopback_p1_reverse_l1M_w256K.json"))
    assert (r.length, r.window, r.sndbuf_actual, r.rcvbuf_actual, r.reverse) == (1048576, 262144, 524288, 524288, True)
    bw = next(x for x in ip.to_rows(r) if x.metric == "bw_received")
    assert bw.extra["window"] == 262144 and bw.extra["sndbuf_actual"] == 524288
    # without -w iperf3 reports sock_bufsize 0: autotuned, no window
    auto = ip.parse_json(load("client_loopback_p2_reverse.json"))
    assert auto.window is None and auto.sndbuf_actual == 16384


def test_client_result():
    r = ip.parse_json(load("client_loopback_p1.json"))
    assert (r.role, r.num_streams, r.length, r.duration, r.reverse) == ("client", 1, 131072, 1, False)
    assert r.sent_bytes == 4692377600 and r.retransmits == 2
    assert r.sent_bps == pytest.approx(37534967023.561455)
    assert r.cpu_local_pct == pytest.approx(90.92, abs=0.01)
    assert r.cpu_remote_pct == pytest.approx(72.03, abs=0.01)
    rows = {x.metric: x for x in ip.to_rows(r, experiment="e", scenario="tcp_baseline", run_id="r")}
    assert rows["bw_sent"].value == pytest.approx(r.sent_bps / 8) and rows["bw_sent"].unit == "B/s"
    assert rows["bw_sent"].raw_unit == "bit/s" and rows["retransmits"].value == 2
    assert rows["bw_sent"].qps == 1 and rows["bw_sent"].size_bytes == 131072


def test_server_result_does_not_invent_numbers():
    r = ip.parse_json(load("server_loopback_p1.json"))
    assert r.role == "server" and r.received_bytes == 4692377600
    assert r.retransmits is None and r.cpu_remote_pct is None
    rows = {x.metric: x for x in ip.to_rows(r)}
    assert rows["cpu_remote"].status == "not_measured" and rows["cpu_remote"].value is None
    assert rows["retransmits"].status == "not_measured"


def test_reverse_multistream():
    r = ip.parse_json(load("client_loopback_p2_reverse.json"))
    assert r.reverse and r.num_streams == 2 and len(r.streams) == 2 and r.length == 65536


@pytest.mark.parametrize("name, kind", [("error_refused.json", "cannot_connect"),
                                        ("error_port_in_use.json", "port_in_use")])
def test_error_documents(name, kind):
    with pytest.raises(ToolError) as e:
        ip.parse_json(load(name), host="B")
    assert e.value.kind == kind and "on host B" in str(e.value)


@pytest.mark.parametrize("path", ["end.sum_sent.bytes", "start.test_start.num_streams",
                                  "end.cpu_utilization_percent.host_total"])
def test_missing_key_names_the_path(path):
    doc = json.loads(load("client_loopback_p1.json"))
    cur = doc
    *parents, leaf = path.split(".")
    for p in parents:
        cur = cur[p]
    del cur[leaf]
    with pytest.raises(ParseError, match=path.replace(".", r"\.")):
        ip.parse_json(json.dumps(doc))


def test_truncated_json_names_the_line():
    text = load("client_loopback_p1.json")
    with pytest.raises(ParseError, match=r"line \d+"):
        ip.parse_json(text[: len(text) // 2], source="cut.json")


def test_wrong_type_is_an_error():
    doc = json.loads(load("client_loopback_p1.json"))
    doc["end"]["sum_sent"]["bytes"] = "lots"
    with pytest.raises(ParseError, match="sum_sent.bytes"):
        ip.parse_json(json.dumps(doc))


def test_is_listening():
    text = ("  sl  local_address rem_address   st tx_queue rx_queue\n"
            "   0: 0100007F:3B41 00000000:0000 0A 00000000:00000000 00:00000000 00000000\n")
    assert ip.is_listening(text, 0x3B41)
    assert not ip.is_listening(text, 0x3B42)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_real_iperf3_over_loopback():
    if shutil.which("iperf3") is None:
        pytest.skip("iperf3 is not installed here (apt-get install iperf3)")
    port = _free_port()
    server = subprocess.Popen(ip.server_command(port, bind="127.0.0.1"), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 10
        for _ in range(200):  # bounded: 200 polls and 10 s
            if ip.is_listening(Path("/proc/net/tcp").read_text(), port):
                break
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"iperf3 server did not listen on 127.0.0.1:{port}")
            time.sleep(0.05)
        cli = subprocess.run(ip.client_command("127.0.0.1", port, duration=1, bind="127.0.0.1"),
                             capture_output=True, text=True, timeout=30)
        r = ip.parse_json(cli.stdout, source="client", host="localhost")
        assert r.role == "client" and r.sent_bytes > 0 and r.received_bps > 0
        out, _ = server.communicate(timeout=15)
        s = ip.parse_json(out, source="server", host="localhost")
        assert s.role == "server" and s.received_bytes > 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(timeout=10)


def test_real_iperf3_refused_is_classified():
    if shutil.which("iperf3") is None:
        pytest.skip("iperf3 is not installed here (apt-get install iperf3)")
    port = _free_port()  # nothing listens there
    cli = subprocess.run(ip.client_command("127.0.0.1", port, duration=1), capture_output=True,
                         text=True, timeout=30)
    with pytest.raises(ToolError) as e:
        ip.parse_json(cli.stdout, host="localhost")
    assert e.value.kind == "cannot_connect"
