"""What a failed perftest run says: its completion errors and the :class:`ToolError` of its output.

Part of :mod:`peercache.lab.tools.perftest` (its docstring says the units, sides and formats).
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from peercache.lab.errors import ToolError

#: What a failed work completion says and what to check, by ``ibv_wc_status``: its code and
#: ``IBV_WC_`` name are the engine's :class:`peercache.rdma.completion.WC` (rdma-core's verbs.h, the one
#: table of them, see :func:`wc_status_table`); here, by member name, the ``ibv_wc_status_str()`` text and
#: the advice. perftest prints "Failed status N: ..." (up to 25.07) or "Failed status-TEXT (N): ..."
#: (perftest PR #342, 2025).
WC_TEXT: dict[str, tuple[str, str]] = {
    "LOC_LEN_ERR": ("local length error",
        "a message was longer than the buffer posted for it: run both sides with the same -s "
        "size (and the same test)"),
    "LOC_QP_OP_ERR": ("local QP operation error",
        "the work request does not fit this QP (too many SGEs, inline data above the QP's "
        "max_inline_data, or a message above the port's max_msg_sz): check -I, -s and -t against "
        "`ibv_devinfo -v` limits"),
    "LOC_EEC_OP_ERR": ("local EE context operation error",
        "an EE context error (RD transport); not expected with RC/UC/UD"),
    "LOC_PROT_ERR": ("local protection error",
        "the local buffer is not covered by a valid memory registration (lkey or access): with "
        "--use_cuda / --use_rocm check GPUDirect RDMA (nvidia-peermem or dmabuf loaded, the "
        "GPU's BAR/MMIO setup under a hypervisor), otherwise the registered size"),
    "WR_FLUSH_ERR": ("Work Request Flushed Error",
        "the QP was already in the error state, so outstanding work was flushed: this is a "
        "consequence, not the cause; look for the first non-flush error on this side and on the "
        "peer (the peer exiting, or a retry-exceeded error before it)"),
    "MW_BIND_ERR": ("memory management operation error",
        "a memory window bind failed: check the MR access flags"),
    "BAD_RESP_ERR": ("bad response error",
        "the responder sent an unexpected transport response: check the peer's device and "
        "firmware logs (dmesg)"),
    "LOC_ACCESS_ERR": ("local access error",
        "a protection error on a local buffer written by an RDMA read response or atomic: check "
        "the local MR access flags"),
    "REM_INV_REQ_ERR": ("remote invalid request error",
        "the peer rejected the request as invalid: an opcode its QP does not allow (server and "
        "client running different tests), no room for the message, or a message too long: run "
        "the same tool with the same flags on both sides"),
    "REM_ACCESS_ERR": ("remote access error",
        "the peer refused the rkey/address: wrong rkey or address, a remote buffer smaller than "
        "the message, or a remote MR without that access right (e.g. a write into an "
        "ib_read_bw server's buffer): run the same test with the same -s on both sides"),
    "REM_OP_ERR": ("remote operation error",
        "the responder could not complete the operation (its QP failed or its receive WQE was "
        "malformed): read the peer's log; a server running another test gives this too"),
    "RETRY_EXC_ERR": ("transport retry counter exceeded",
        "the peer stopped answering (no ACK or NAK within the retries): the peer process exited "
        "or its QP is in error (read its log), or the path drops packets (link or port down, "
        "wrong GID index or route, MTU mismatch, no lossless/ECN setup for RoCE); on emulated "
        "devices (Soft-RoCE, siw) under CPU load ACKs can come too late; check `ibv_devinfo` "
        "port state and the port error counters on both hosts"),
    "RNR_RETRY_EXC_ERR": ("RNR retry counter exceeded",
        "the receiver had no receive posted (receiver not ready): the server posts receives "
        "too slowly or ran out (ib_send_*), or it is not running the same test; raise the "
        "server's RX depth (-r) or the RNR timer"),
    "LOC_RDD_VIOL_ERR": ("local RDD violation error",
        "an RD domain violation (RD transport); not expected with RC/UC/UD"),
    "REM_INV_RD_REQ_ERR": ("remote invalid RD request",
        "an RD request error (RD transport); not expected with RC/UC/UD"),
    "REM_ABORT_ERR": ("aborted error",
        "the responder aborted the operation: read the peer's log"),
    "INV_EECN_ERR": ("invalid EE context number",
        "an EE context error (RD transport); not expected with RC/UC/UD"),
    "INV_EEC_STATE_ERR": ("invalid EE context state",
        "an EE context error (RD transport); not expected with RC/UC/UD"),
    "FATAL_ERR": ("fatal error",
        "the device reported a fatal error: check dmesg and the device's health on this host"),
    "RESP_TIMEOUT_ERR": ("response timeout error",
        "the responder did not answer in time: check the peer and the path as for a retry "
        "exceeded error"),
    "GENERAL_ERR": ("general error",
        "the device reported an error it does not classify: check dmesg on both hosts"),
}


@functools.cache
def wc_status_table() -> dict[int, tuple[str, str, str]]:
    """``ibv_wc_status`` code -> (``IBV_WC_`` name, ``ibv_wc_status_str()`` text, what to check) of every
    failed status, derived from the engine's WC enum (the import contracts' seam peercache.rdma.completion).

    Imported on the first completion error read, not with this module: the engine's completion module
    brings the transport layer's base and numpy, which reading perftest's output never needs.
    """
    from peercache.rdma.completion import WC  # transport base and numpy (~85 ms): only a failed completion needs it
    return {int(wc): (f"IBV_WC_{wc.name}", *WC_TEXT[wc.name]) for wc in WC if wc is not WC.SUCCESS}


_COMPLETION = re.compile(r"Completion with error at (?P<side>client|server)")
_FAILED_STATUS = re.compile(
    r"Failed status(?: (?P<code>\d+)|-(?P<text>[^\n]*?) \((?P<code2>\d+)\)): wr_id (?P<wr_id>-?\d+)"
    r" syndrom (?P<syndrome>0x[0-9a-fA-F]+)")
_COUNTS = re.compile(r"scnt=(?P<scnt>\d+), ccnt=(?P<ccnt>\d+)|rcnt=(?P<rcnt>\d+)")


@dataclass(frozen=True)
class CompletionError:
    """One "Completion with error" report of perftest, as printed."""

    side: str                     #: "client" (send side) or "server" (receive side), as printed
    status: int | None            #: the ibv_wc_status code; None when the line was not printed
    name: str | None              #: IBV_WC_... (None for an unknown code)
    description: str | None       #: ibv_wc_status_str() text (as printed by newer releases)
    wr_id: int | None
    syndrome: str | None          #: vendor syndrome, e.g. "0x81"
    posted: int | None = None     #: scnt
    completed: int | None = None  #: ccnt
    received: int | None = None   #: rcnt (receive side)


def completion_errors(text: str) -> list[CompletionError]:
    """Every "Completion with error" report in a perftest log, in order."""
    out: list[CompletionError] = []
    marks = list(_COMPLETION.finditer(text))
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        chunk = text[m.end():end]
        st = _FAILED_STATUS.search(chunk)
        code = name = desc = wr_id = syndrome = None
        counts = None
        if st:
            code = int(st.group("code") or st.group("code2"))
            known = wc_status_table().get(code)
            name = known[0] if known else None
            desc = st.group("text") or (known[1] if known else None)
            wr_id, syndrome = int(st.group("wr_id")), st.group("syndrome")
            counts = _COUNTS.search(chunk, st.end())
        else:
            counts = _COUNTS.search(chunk)

        def num(group: str) -> int | None:
            return int(counts.group(group)) if counts and counts.group(group) else None

        out.append(CompletionError(side=m.group("side"), status=code, name=name, description=desc,
                                   wr_id=wr_id, syndrome=syndrome, posted=num("scnt"),
                                   completed=num("ccnt"), received=num("rcnt")))
    return out


def _completion_failure(text: str, returncode: int | None, host: str,
                        tool: str) -> ToolError | None:
    errs = completion_errors(text)
    if not errs:
        return None
    # The first error is the cause; flush errors after it are its consequence.
    first = next((e for e in errs if e.status not in (None, 5)), errs[0])
    more = f" (the first of {len(errs)} reports)" if len(errs) > 1 else ""
    if first.status is None:
        detail = (f"a work completion failed at the {first.side}, status not printed{more}")
        check = ("perftest stops at the first failed completion; read the full log of both "
                 "sides for the 'Failed status' line")
    else:
        known = wc_status_table().get(first.status)
        name = first.name or f"unknown ibv_wc_status {first.status}"
        desc = f', "{first.description}"' if first.description else ""
        counts = ""
        if first.posted is not None:
            counts = f", after {first.posted} posted / {first.completed} completed"
        elif first.received is not None:
            counts = f", after {first.received} received"
        detail = (f"a work completion failed at the {first.side}: {name} (status {first.status}"
                  f"{desc}), wr_id {first.wr_id}, vendor syndrome {first.syndrome}{counts}{more}")
        check = (known[2] if known else "look the status up in ibv_poll_cq(3)") + (
            "; perftest stops at the first failed completion, the peer's log shows its side")
    return ToolError(host=host, tool=tool, kind="completion_error", returncode=returncode,
                     detail=detail, check=check)


#: perftest's failure to calibrate its cycle counter (its timestamp samples fit a line with r^2 below
#: 0.9, so it knows no CPU frequency and prints "Can't produce a report"): a property of a loaded or
#: emulated clock, not of the transfer; a rerun may pass (the point runner retries these).
CLOCK_CALIBRATION = "clock_calibration"

_FAILURES: list[tuple[str, re.Pattern[str], str, str]] = [
    (CLOCK_CALIBRATION, re.compile(r"Correlation coefficient r\^2: [0-9.eE+-]+ < 0\.9"),
     "could not calibrate its cycle counter (perftest said '{said}'), so it printed no report",
     "perftest measures the CPU frequency from timestamp samples and gives up when they scatter: "
     "a loaded or emulated CPU; rerun it on a quiet host (the point runner runs it up to 3 times, 8 on emulated hosts)"),
    ("resource_error", re.compile(r"Failed to allocate hugepages[^\n]*|Failed to allocate hugepage region"),
     "cannot allocate the hugepage buffer (perftest said '{said}')",
     "--use_hugepages needs free hugepages (HugePages_Free in /proc/meminfo) and, one SysV "
     "segment per buffer, kernel.shmmni above the number of buffers (--mr_per_qp: one per QP)"),
    ("resource_error", re.compile(r"Couldn't allocate MR[^\n]*|[Ff]ailed to create MR|"
                                  r"Couldn't allocate PD|Couldn't create CQ"),
     "cannot register the test buffer (perftest said '{said}')",
     "memory registration failed: check the locked-memory limit (`ulimit -l`, unlimited for "
     "RDMA; containers need IPC_LOCK), and with --use_cuda that GPUDirect RDMA is available "
     "(nvidia-peermem loaded, or --use_cuda_dmabuf); very large -s / -a sizes need as much "
     "pinnable memory"),
    ("resource_error", re.compile(r"Unable to create QP\.?|Failed to create QP\.?|"
                                  r"Couldn't create IB resources"),
     "cannot create the queue pair (perftest said '{said}')",
     "ibv_create_qp rejected the QP attributes: the inline size (-I, default 220 for writes "
     "and sends; some devices allow less), the queue depths (-t / -r) or the connection type "
     "(-c) may exceed what the device supports: compare with `ibv_devinfo -v` (max_qp_wr, "
     "max_sge) and retry with -I 0 or smaller depths"),
    ("unknown_option", re.compile(r"unrecognized option '?([^'\n]*)'?|invalid option -- '?(\w)'?|"
                                  r"Invalid Command or flag|"
                                  r"Duration mode currently doesn't support running on all sizes|"
                                  r"please check that DURATION > 2\*MARGIN"),
     "perftest rejected its command line ({said})",
     "the option, or this combination of options, may not exist in this perftest release: "
     "compare `{tool} --help` on that host with the command, and keep both sides on the same "
     "perftest version"),
    ("no_device", re.compile(r"Port number \d+ state is Down"),
     "the RDMA port is down (perftest said '{said}')",
     "check `ibv_devinfo -d <dev>` there: the port must be PORT_ACTIVE (cable and link up; on "
     "InfiniBand a subnet manager must be running), or pick the active port with -i"),
    ("no_device", re.compile(r"Did not detect devices|No IB devices found|IB device \S+ not found|"
                             r"Unable to find the Infiniband/RoCE device|"
                             r"Couldn't get context for the device"),
     "no RDMA device (perftest said '{said}')",
     "check `ibv_devices` and `ibv_devinfo -d <dev>` there, the -d device name, and that the "
     "driver (e.g. mlx5_ib) is loaded"),
    ("port_in_use", re.compile(r"Address already in use|Failed to bind socket|"
                               r"Couldn't listen to port \d+|rdma_bind_addr failed"),
     "cannot listen on the TCP port (perftest said '{said}')",
     "another perftest server may still hold it: `ss -ltnp` there, end the stale process or "
     "use another -p port on both sides"),
    ("cannot_connect", re.compile(r"Couldn't connect to \S+|Unable to connect \(retries|"
                                  r"Failed to connect RDMA CM|Problem in resolving basic address|"
                                  r"Unable to perform rdma_client function"),
     "cannot connect to the server (perftest said '{said}')",
     "check that the server was started first and is still listening, that both sides use "
     "the same -p port, and that the address is reachable from this host"),
    ("cannot_connect", re.compile(r"Failed to modify QP[^\n]*?to RT[RS]|"
                                  r"Unable to Connect the HCA's through the link"),
     "the queue pairs could not be connected (perftest said '{said}')",
     "moving the QP to RTR/RTS failed on the exchanged address: for RoCE check the GID index "
     "(-x) on both sides (an all-zero GID in the printed local/remote address means that "
     "index holds no address), the RoCE version, and the MTU (-m) against the port's active "
     "MTU; for InfiniBand check that the port is ACTIVE with a LID (subnet manager)"),
    ("cannot_connect", re.compile(r"Couldn't read remote address|"
                                  r"Failed to exchange data between server and clients|"
                                  r"Unable to read to socket/rdam?_cm"),
     "the peer ended the out-of-band exchange (perftest said '{said}')",
     "the other side failed or exited first: read its log for its error (a client-side "
     "completion or resource error shows up on the server as this), and check that both "
     "sides run the same test with the same options"),
    ("below_limit", re.compile(r"BW result is below bw limit|Msg rate\s+is below msg_rate limit"),
     "the result is below the -w/-y verifier limit ({said})",
     "compare the printed average with the limit and with the testbed reference; check link "
     "rate, MTU and NUMA binding"),
]

_ZERO_GID = re.compile(r"^\s*GID: 00(?::00){15}\s*$", re.MULTILINE)


def classify_failure(text: str, returncode: int | None, host: str, tool: str) -> ToolError | None:
    """The ToolError a perftest run's output and exit status show, or None when it succeeded."""
    if returncode == 127 or re.search(rf"{re.escape(tool)}: (command )?not found", text):
        return ToolError(host=host, tool=tool, kind="not_installed",
                         detail=f"{tool} is not installed", returncode=returncode,
                         check="install perftest there (Debian/Ubuntu: apt-get install perftest; "
                               "RHEL: dnf install perftest)")
    err = _completion_failure(text, returncode, host, tool)
    if err is not None:
        return err
    for kind, pattern, detail, check in _FAILURES:
        m = pattern.search(text)
        if m:
            check = check.format(tool=tool)
            if "GID index (-x)" in check and _ZERO_GID.search(text):
                check += "; this output shows an all-zero GID"
            return ToolError(host=host, tool=tool, kind=kind, returncode=returncode,
                             detail=detail.format(said=m.group(0).strip()), check=check)
    if returncode in (0, None):
        return None
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    said = lines[-1] if lines else "(no output)"
    return ToolError(host=host, tool=tool, kind="failed", returncode=returncode,
                     detail=f"exited with an unrecognised failure (last line: '{said}')",
                     check="read the full server and client logs of this run")

