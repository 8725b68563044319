"""perftest.failures: what a failed run says (classify_failure, completion_errors), on real captures
(Soft-RoCE, public outputs, this host) and on perftest's own message formats."""
from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from lab.tools.perftest.captures import DAMAGED, FAILED, MANIFEST, SUCCESS, load, parse_real, public, real
from peercache.lab.errors import TOOL_ERROR_KINDS, ParseError, ToolError
from peercache.lab.tools import perftest as pt


# --- what a failed run says -------------------------------------------------------------------

@pytest.mark.parametrize("text, kind, needle", [
    (lambda: load("no_device.txt"), "no_device", "ibv_devices"),
    (lambda: load("unknown_option.txt"), "unknown_option", "--help"),
    # real captures in the Soft-RoCE guest, stdout + stderr as runpoint joins them
    (lambda: real("err_no_device_server.server+err"), "no_device", "ibv_devices"),
    (lambda: real("err_no_server.client+err"), "cannot_connect", "server was started"),
    (lambda: real("err_port_in_use.server+err"), "port_in_use", "-p port"),
    (lambda: real("read_below_limit.client+err"), "below_limit", "limit"),
], ids=["no_device", "unknown_option", "no_device_rxe", "cannot_connect", "port_in_use", "below_limit"])
def test_classify_failure(text, kind, needle):
    err = pt.classify_failure(text(), 1, "B", "ib_read_bw")
    assert isinstance(err, ToolError) and err.kind == kind and err.host == "B"
    assert str(err).startswith("ib_read_bw on host B: ") and needle in str(err)


def test_classify_success_and_unknown():
    assert pt.classify_failure(load("read_bw_q16_mib.txt"), 0, "A", "ib_read_bw") is None
    err = pt.classify_failure("something odd happened\n", 3, "A", "ib_read_bw")
    assert err.kind == "failed" and "something odd happened" in str(err)
    assert pt.classify_failure("", 127, "A", "ib_read_bw").kind == "not_installed"


# --- Soft-RoCE captures: classified from stdout + stderr, as runpoint does --------------------

@pytest.mark.parametrize("name, side, kind, said", [
    ("err_no_device_server", "server", "no_device", "IB device nosuchdev not found"),
    ("err_no_device_client", "client", "no_device", "IB device nosuchdev not found"),
    ("err_no_server", "client", "cannot_connect", "Couldn't connect to 198.18.0.1:18591"),
    ("err_no_server_rdma_cm", "client", "cannot_connect", "Unable to perform rdma_client function"),
    ("err_port_in_use", "server", "port_in_use", "Couldn't listen to port 18594"),
    ("err_all_sizes_duration", "client", "unknown_option",
     "Duration mode currently doesn't support running on all sizes"),
    ("err_margin", "client", "unknown_option", "please check that DURATION > 2*MARGIN"),
    ("read_below_limit", "client", "below_limit", "BW result is below bw limit"),
])
def test_real_failures_are_classified(name, side, kind, said):
    rc, cmd = MANIFEST[(name, side)]
    out = real(f"{name}.{side}.stdout") + real(f"{name}.{side}.stderr")
    tool = shlex.split(cmd)[0]
    err = pt.classify_failure(out, rc, "B", tool)
    assert isinstance(err, ToolError) and err.kind == kind, (err, out)
    assert said in err.detail and err.returncode == rc and str(err).startswith(f"{tool} on host B: ")
    if kind != "below_limit":
        with pytest.raises(ParseError):
            pt.parse_output(real(f"{name}.{side}.stdout"), name)


def test_below_limit_stdout_alone_still_has_the_numbers():
    # the -w verifier fails the run (exit 1) after printing a complete, real result
    [row] = parse_real("read_below_limit.client.stdout").rows
    assert (row.bw_average_raw, row.msg_rate_mpps) == (39.43, 0.000315)
    assert "Error: BW result is below bw limit" in real("read_below_limit.client.stderr")
    assert pt.classify_failure(real("read_below_limit.server.stdout")
                               + real("read_below_limit.server.stderr"), 0, "A", "ib_read_bw") is None


def test_successes_classify_as_none():
    for name, side in SUCCESS:
        rc, cmd = MANIFEST[(name, side)]
        out = real(f"{name}.{side}.stdout") + real(f"{name}.{side}.stderr")
        assert pt.classify_failure(out, rc, "A", shlex.split(cmd)[0]) is None, name


# --- public outputs ---------------------------------------------------------------------------

def test_damaged_pastes_are_not_mistaken_for_a_known_failure():
    # a cut or mangled success is not a failed run: nothing to classify with rc 0
    for name in DAMAGED:
        assert pt.classify_failure(public(name), 0, "h", "ib_write_bw") is None, name


@pytest.mark.parametrize("name", sorted(FAILED))
def test_public_failure_is_classified(name):
    kind, fragments, parse_line = FAILED[name]
    raw = public(name)
    assert kind in TOOL_ERROR_KINDS
    err = pt.classify_failure(raw, 1, "B", "ib_write_bw")
    assert isinstance(err, ToolError) and err.kind == kind, (name, err)
    msg = str(err)
    assert msg.startswith("ib_write_bw on host B: ") and "exit status 1" in msg
    for frag in fragments:
        assert frag in msg, (name, frag, msg)
    # the parser never takes a failed run for a result, and names the line it stopped at
    with pytest.raises(ParseError) as e:
        pt.parse_output(raw, name)
    assert e.value.line_no == parse_line, (name, e.value)
    assert err.to_dict()["kind"] == kind


def test_resource_error_outranks_the_rdma_cm_errors_it_causes():
    # perftest#26: the rdma_cm client errors follow the failed MR registration
    raw = public("perftest26_send_bw_rdma_cm_alloc_mr.txt")
    assert "Unable to perform rdma_client function" in raw
    assert pt.classify_failure(raw, 1, "A", "ib_send_bw").kind == "resource_error"


# --- completion errors ------------------------------------------------------------------------

def test_completion_error_records():
    [e] = pt.completion_errors(public("perftest173_completion_status4_cuda.txt"))
    assert (e.side, e.status, e.name, e.description, e.wr_id, e.syndrome, e.posted, e.completed) == (
        "client", 4, "IBV_WC_LOC_PROT_ERR", "local protection error", 0, "0x51", 828, 700)
    [e] = pt.completion_errors(public("softiwarp27_completion_status12_one_line.txt"))
    assert (e.status, e.name, e.syndrome, e.posted, e.completed) == (
        12, "IBV_WC_RETRY_EXC_ERR", "0x81", 128, 0)
    [e] = pt.completion_errors(public("project_softroce_completion_status5.txt"))
    assert (e.status, e.name, e.wr_id, e.posted, e.completed) == (5, "IBV_WC_WR_FLUSH_ERR", 6, 195, 69)
    assert pt.completion_errors(public("stm_write_lat_a_mlx4_ib.txt")) == []


def test_completion_error_newest_format_and_first_cause():
    # perftest PR #342 (2025) prints the status string: "Failed status-<str> (<n>): ...", from
    # NOTIFY_COMP_ERROR_SEND/RECV in src/perftest_resources.h; and a flush after a real error
    # is reported as the consequence of the first
    log = (" Completion with error at client\n"
           " Failed status-transport retry counter exceeded (12): wr_id 0 syndrom 0x81\n"
           " scnt=128, ccnt=0\n"
           " Completion with error at server\n"
           " Failed status-Work Request Flushed Error (5): wr_id 3 syndrom 0x0\n"
           " rcnt=17\n")
    first, second = pt.completion_errors(log)
    assert (first.status, first.description, first.posted) == (12, "transport retry counter exceeded", 128)
    assert (second.side, second.status, second.received) == ("server", 5, 17)
    err = pt.classify_failure(log, 1, "A", "ib_send_bw")
    assert err.kind == "completion_error" and "IBV_WC_RETRY_EXC_ERR" in err.detail
    assert "the first of 2 reports" in err.detail
    flush_first = log.split(" Completion with error at server\n")[1]
    flush_first = " Completion with error at server\n" + flush_first
    err = pt.classify_failure(flush_first + log, 1, "A", "ib_send_bw")
    assert "IBV_WC_RETRY_EXC_ERR" in err.detail  # the flush is not taken for the cause


@pytest.mark.parametrize("status, name, needle", [
    (2, "IBV_WC_LOC_QP_OP_ERR", "max_inline_data"),
    (10, "IBV_WC_REM_ACCESS_ERR", "rkey"),
    (13, "IBV_WC_RNR_RETRY_EXC_ERR", "receiver had no receive posted"),
    (42, "unknown ibv_wc_status 42", "ibv_poll_cq"),
])
def test_completion_error_each_status_says_what_to_check(status, name, needle):
    log = (f" Completion with error at client\n Failed status {status}: wr_id 1 syndrom 0x0\n"
           "scnt=10, ccnt=9\n")
    err = pt.classify_failure(log, 1, "A", "ib_read_bw")
    assert err.kind == "completion_error" and name in err.detail and needle in err.check


def test_work_completion_statuses_are_the_engines_table():
    # Codes and IBV_WC_ names exist once, in the engine's WC enum; the lab adds only the text and the advice.
    from peercache.rdma.completion import WC
    assert set(pt.WC_TEXT) == {wc.name for wc in WC if wc is not WC.SUCCESS}
    table = pt.wc_status_table()
    assert table[12][0] == "IBV_WC_RETRY_EXC_ERR" and table[12][1] == "transport retry counter exceeded"
    assert set(table) == {int(wc) for wc in WC} - {0}


def test_reading_perftest_output_does_not_import_the_engines_rdma_path():
    import sys
    code = ("import sys; from peercache.lab.tools import perftest as pt; "
            "pt.classify_failure('Couldn\\'t allocate MR', 1, 'h', 'ib_read_bw'); "
            "print(sorted(m for m in ('numpy', 'peercache.rdma.completion') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


# --- a real run on this machine ---------------------------------------------------------------

def test_real_ib_read_bw_without_device_is_classified():
    exe = shutil.which("ib_read_bw")
    if exe is None:
        pytest.skip("perftest is not installed here (apt-get install perftest)")
    ib = Path("/sys/class/infiniband")
    if ib.is_dir() and any(ib.iterdir()):
        pytest.skip("this host has RDMA devices; the no-device path cannot be exercised")
    argv = pt.server_command(pt.PerftestParams(tool="ib_read_bw", size=4096, iterations=5,
                                               tcp_port=18599))
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    err = pt.classify_failure(out, proc.returncode, "localhost", "ib_read_bw")
    assert err is not None and err.kind == "no_device", out
    assert "ibv_devices" in str(err)
    with pytest.raises(ParseError):
        pt.parse_output(out)
