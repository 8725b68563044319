"""sockperf wrapper: command builders and the parser, on real captures (tests/fixtures/lab/sockperf)."""
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from peercache.lab.errors import ParseError, ToolError
from peercache.lab.tools import sockperf

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "lab" / "sockperf"


def read(name: str) -> str:
    return (FIX / name).read_text()


def test_commands_are_pure_and_checked():
    assert sockperf.server_command(5001) == ["sockperf", "server", "-i", "127.0.0.1", "-p", "5001", "--tcp"]
    assert sockperf.client_command("198.18.0.1", 5001, 4096, 3) == [
        "sockperf", "ping-pong", "-i", "198.18.0.1", "-p", "5001", "--tcp", "-m", "4096", "-t", "3", "--full-rtt"]
    # a polling client: a non-blocking socket and epoll_wait with a zero timeout
    assert sockperf.client_command("198.18.0.1", 5001, 4096, 3, busy_poll=True)[-4:] == [
        "--full-rtt", "--nonblocked", "--timeout", "0"]
    for bad in (lambda: sockperf.server_command(0), lambda: sockperf.client_command("-x", 5001),
                lambda: sockperf.client_command("h", 5001, msg_size=8),
                lambda: sockperf.client_command("h", 5001, duration=0)):
        with pytest.raises(ValueError):
            bad()


def test_full_rtt_report_is_read_as_round_trips():
    r = sockperf.parse_output(read("pingpong_tcp_m4096_full_rtt.stdout"), source="full_rtt")
    assert not r.one_way and r.version == "3.7-no.git" and r.protocol == "TCP"
    assert (r.server, r.port) == ("127.0.0.1", 46211)
    assert r.rtt_us(50) == pytest.approx(14.231) and r.rtt_us(99.9) == pytest.approx(3833.119)
    assert r.observations == 48825 and r.received == r.sent == 48825
    assert r.rtt_min_us == pytest.approx(13.910) and r.rtt_avg_us == pytest.approx(31.677)
    with pytest.raises(KeyError, match="no percentile 42"):
        r.rtt_us(42)


def test_latency_report_is_doubled_to_round_trips():
    """Without --full-rtt sockperf 3.7 prints RTT/2: the same server measured both ways agrees."""
    full = sockperf.parse_output(read("pingpong_tcp_m4096_full_rtt.stdout"))
    half = sockperf.parse_output(read("pingpong_tcp_m4096_latency.stdout"))
    assert half.one_way and half.rtt_us(50) == pytest.approx(2 * 7.110)
    assert half.rtt_us(50) == pytest.approx(full.rtt_us(50), rel=0.05)


def test_rows_carry_round_trip_and_raw_values():
    r = sockperf.parse_output(read("pingpong_tcp_m4096_latency.stdout"), source="lat")
    rows = {x.metric: x for x in sockperf.to_rows(r, scenario="bench", size_bytes=4096)}
    assert set(rows) == {"rtt_p50", "rtt_p99", "rtt_p999", "rtt_avg", "observations"}
    assert rows["rtt_p50"].value == pytest.approx(14.22) and rows["rtt_p50"].raw_value == pytest.approx(7.110)
    assert rows["rtt_p50"].unit == "us" and rows["rtt_p50"].tool == "sockperf" and rows["rtt_p50"].size_bytes == 4096
    with pytest.raises(TypeError, match="unknown Row fields"):
        sockperf.to_rows(r, nonsense=1)


def test_failures_exit_0_but_are_tool_errors():
    with pytest.raises(ToolError) as e:
        sockperf.parse_output(read("err_no_server.stdout"), host="netns:b")
    assert e.value.kind == "cannot_connect" and "Connection refused" in str(e.value) and "netns:b" in str(e.value)
    with pytest.raises(ToolError) as e:
        sockperf.parse_output(read("err_unknown_option.stdout"))
    assert e.value.kind == "unknown_option"


def test_truncated_or_foreign_reports_are_parse_errors():
    text = read("pingpong_tcp_m4096_full_rtt.stdout")
    cut = "\n".join(ln for ln in text.splitlines() if "percentile 50.000" not in ln)
    with pytest.raises(ParseError, match="percentile 50"):
        sockperf.parse_output(cut, source="cut")
    with pytest.raises(ParseError, match="Summary"):
        sockperf.parse_output(text.split("Summary")[0], source="head")
    with pytest.raises(ParseError, match="line"):
        sockperf.parse_output(text.replace("percentile 99.000 =   56.183", "percentile 99.000 = n/a"))
    with pytest.raises(ParseError):
        sockperf.parse_output(read("server_tcp.stdout"))


@pytest.mark.skipif(shutil.which("sockperf") is None, reason="sockperf is not installed (apt-get install sockperf)")
def test_real_loopback_run_parses(port, procs):
    procs.start(sockperf.server_command(port))
    deadline = time.monotonic() + 10
    while not _listening(port) and time.monotonic() < deadline:
        time.sleep(0.05)
    out = subprocess.run(sockperf.client_command("127.0.0.1", port, 4096, 1), capture_output=True, text=True,
                         timeout=30)
    r = sockperf.parse_output(out.stdout, source="live")
    assert not r.one_way and r.observations > 100 and 0 < r.rtt_us(50) < r.rtt_max_us


def _listening(port: int) -> bool:
    from peercache.lab.tools.iperf3 import is_listening
    return is_listening(Path("/proc/net/tcp").read_text(), port)
