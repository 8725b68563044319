"""Mooncake Transfer Engine's ``transfer_engine_bench``: command builder and a strict parser of its log.

The tool (PyPI ``mooncake-transfer-engine-non-cuda``, run from the lab's ``.venv-mooncake``) has two
modes. The *target* registers a DRAM buffer and serves it; the *initiator* opens the target's segment
and, from ``-threads`` threads, submits batches of ``-batch_size`` READs of ``-block_size`` bytes each
for ``-duration`` whole seconds, waiting for every batch to complete before it submits the next.
With ``-metadata_server=P2PHANDSHAKE`` no etcd is needed: the target picks a free RPC port itself and
logs it ("Transfer Engine RPC using P2P handshake, listening on HOST:PORT"); the initiator names the
target by that address (``-segment_id``). :data:`TARGET_READY` captures the port, and the pair runner
puts it in the initiator's ``{te_port}`` placeholder.

What it reports (glog, ``-logtostderr``): one line "Test completed: duration D, batch count N,
throughput R UNIT/s". The bytes moved are N x batch x block (every request of a completed batch
completed; a failed one ends the tool with an error). It reports no latency, and it never checks the
bytes it read (the target's buffer is never filled with a pattern): its figures are unverified.
Over rdma it logs the device it opened ("RDMA device: NAME, LID: ..., GID: (GID_Index N) ..."); the
parser, given the device asked for, requires that line, so a figure is never one of another device.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from peercache.lab.errors import ParseError, ToolError
from peercache.lab.tidy import Row

TOOL = "transfer_engine_bench"
#: The binary inside the lab's Mooncake venv (``make engines`` links the wheel's native binary there, so
#: the pair runner signals the tool itself, not the wheel's Python wrapper).
VENV = ".venv-mooncake"
BINARY = f"{VENV}/bin/transfer_engine_bench-native"
#: The target is ready once it has logged its handshake address and started allocating its buffer
#: (registration follows at once, before any initiator can have started).
TARGET_READY = (r"Transfer Engine RPC using P2P handshake, listening on (?P<te_host>[^\s:]+):(?P<te_port>\d+)"
                r"[\s\S]*?(?:DRAM|VRAM) is used")
#: Units the tool's ``-report_unit`` may print, in bytes.
UNITS = {"GB": 1e9, "GiB": 2.0 ** 30, "Gb": 1e9 / 8, "MB": 1e6, "MiB": 2.0 ** 20, "Mb": 1e6 / 8,
         "KB": 1e3, "KiB": 2.0 ** 10, "Kb": 1e3 / 8}
PROTOCOLS = ("tcp", "rdma")

#: The device an rdma run opened (Mooncake's rdma_context.cpp logs it with its LID and GID).
_RDMA_DEVICE = re.compile(r"RDMA device: (?P<device>[^\s,]+), LID: \S+, GID: ")
_COMPLETED = re.compile(r"Test completed: duration (?P<dur>\d+(?:\.\d+)?), batch count (?P<batches>\d+), "
                        r"throughput (?P<rate>\d+(?:\.\d+)?) (?P<unit>[A-Za-z]+)/s\s*$")
#: Log lines that mean the run failed, with what to check.
_FAILURES = (
    (re.compile(r"Unable to get target segment ID|Failed to open segment|openSegment.*fail", re.I), "cannot_connect",
     "the initiator could not open the target's segment; is the target running and its handshake port reachable?"),
    (re.compile(r"No matched device found|Failed to open device|ibv_open_device|No RDMA device", re.I),
     "no_device", "the RDMA device named by -device_name is missing on this host; check `ibv_devices`"),
    (re.compile(r"unable to find available tcp port|No valid port found", re.I), "port_in_use",
     "the transfer engine found no free port for its service"),
    (re.compile(r"\bFAILED\b|Transfer failed|Check failed|LOG_ASSERT", re.I), "completion_error",
     "a transfer failed; read the initiator's log"),
)


def _check(**sizes: int) -> None:
    for k, v in sizes.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{k} {v!r} must be a positive integer")


def buffer_bytes(block: int, batch: int, threads: int, working_set: int = 0) -> int:
    """Bytes each side registers: the span the initiator's threads touch (block x batch x threads, as the
    tool lays its requests out) or ``working_set`` bytes, whichever is larger."""
    return max(block * batch * threads, working_set)


def common_flags(protocol: str, local_name: str, block: int, batch: int, threads: int, buffer: int,
                 device: str | None = None, gid_index: int | None = None) -> list[str]:
    """The flags both modes take: transport, P2P handshake, this side's address, geometry, glog to stderr."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol {protocol!r} is not one of {PROTOCOLS} (the lab runs Mooncake over these)")
    _check(block_size=block, batch_size=batch, threads=threads, buffer_size=buffer)
    if buffer < block * batch * threads:
        raise ValueError(f"buffer_size {buffer} is smaller than block x batch x threads = {block * batch * threads}; "
                         "the tool would enlarge it itself")
    argv = [f"--protocol={protocol}", "--metadata_server=P2PHANDSHAKE", f"--local_server_name={local_name}",
            f"--block_size={block}", f"--batch_size={batch}", f"--threads={threads}", f"--buffer_size={buffer}",
            "--logtostderr"]
    if protocol == "rdma":
        if not device:
            raise ValueError("protocol rdma needs the RDMA device (-device_name); the testbed names none")
        argv.append(f"--device_name={device}")
    return argv


def env_prefix(protocol: str, gid_index: int | None) -> list[str]:
    """``env MC_GID_INDEX=N`` over rdma (the tool reads its RoCE GID index from the environment only)."""
    if protocol == "rdma" and gid_index is not None:
        return ["env", f"MC_GID_INDEX={int(gid_index)}"]
    return []


def target_command(binary: str, protocol: str, host: str, block: int, batch: int, threads: int, buffer: int,
                   device: str | None = None, gid_index: int | None = None) -> list[str]:
    """argv of the target (producer): serves its registered DRAM buffer until it is signalled."""
    return [*env_prefix(protocol, gid_index), binary, "--mode=target",
            *common_flags(protocol, host, block, batch, threads, buffer, device, gid_index)]


def initiator_command(binary: str, protocol: str, host: str, target: str, block: int, batch: int, threads: int,
                      buffer: int, duration: int, device: str | None = None,
                      gid_index: int | None = None) -> list[str]:
    """argv of the initiator (consumer): READs from ``target`` (``HOST:PORT``, or ``HOST:{te_port}`` for the
    pair runner to fill) for ``duration`` whole seconds."""
    _check(duration=duration)
    if not target or target.startswith("-"):
        raise ValueError(f"target segment {target!r} is not HOST:PORT")
    return [*env_prefix(protocol, gid_index), binary, "--mode=initiator", "--operation=read",
            f"--segment_id={target}", f"--duration={duration}",
            "--report_unit=MB", "--report_precision=3",
            *common_flags(protocol, host, block, batch, threads, buffer, device, gid_index)]


@dataclass
class TeResult:
    """What one initiator run reported."""

    duration_s: float              #: seconds between starting its threads and joining them
    batches: int                   #: batches completed by all threads
    block_size: int                #: bytes per request (-block_size, from the command)
    batch_size: int                #: requests per batch (-batch_size, from the command)
    threads: int                   #: submitting threads (-threads, from the command)
    printed_rate: float            #: the rate as printed, in ``printed_unit``
    printed_unit: str
    source: str = "<log>"
    warnings: list[str] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        """Bytes read: every request of every completed batch."""
        return self.batches * self.batch_size * self.block_size

    @property
    def gb_per_s(self) -> float:
        """GB/s (10^9 bytes) over the tool's own duration."""
        return self.bytes / self.duration_s / 1e9


def parse_log(text: str, block: int, batch: int, threads: int, source: str = "<log>",
              host: str = "", device: str | None = None) -> TeResult:
    """The initiator's result from its log, or :class:`ToolError` (a failure it logged) / :class:`ParseError`
    (no result line, two of them, a printed rate that disagrees with its own counts, or, with ``device``
    (an rdma run), a log that never says it opened that device)."""
    lines = text.splitlines()
    hits = [(i, _COMPLETED.search(ln)) for i, ln in enumerate(lines, 1)]
    hits = [(i, m) for i, m in hits if m]
    if not hits:
        for rx, kind, check in _FAILURES:
            bad = next((ln for ln in lines if rx.search(ln)), None)
            if bad is not None:
                raise ToolError(host=host, tool=TOOL, kind=kind, detail=f"{source}: {bad.strip()}", check=check)
        raise ParseError(TOOL, "no 'Test completed: duration ..., batch count ..., throughput ...' line "
                               "(was the initiator run with --logtostderr, and did it finish?)", source=source)
    if len(hits) > 1:
        i, _ = hits[1]
        raise ParseError(TOOL, "a second result line (one initiator run prints one)", source=source,
                         line_no=i, line=lines[i - 1])
    i, m = hits[0]
    unit = m["unit"]
    if unit not in UNITS:
        raise ParseError(TOOL, f"unknown rate unit {unit!r} (the tool prints one of {sorted(UNITS)})",
                         source=source, line_no=i, line=lines[i - 1])
    res = TeResult(duration_s=float(m["dur"]), batches=int(m["batches"]), block_size=block, batch_size=batch,
                   threads=threads, printed_rate=float(m["rate"]), printed_unit=unit, source=source)
    if res.duration_s <= 0:
        raise ParseError(TOOL, "a duration of 0 s", source=source, line_no=i, line=lines[i - 1])
    # The printed rate is the same count over the same duration: it must agree to its printed precision
    # (duration itself is printed to 0.01 s), or the geometry given here is not the one the tool ran.
    printed = res.printed_rate * UNITS[unit]
    mine = res.bytes / res.duration_s
    if abs(printed - mine) > max(0.01 * mine, 2 * UNITS[unit] * 10 ** -_decimals(m["rate"])):
        raise ParseError(TOOL, f"printed rate {m['rate']} {unit}/s disagrees with batch count x batch "
                               f"{batch} x block {block} / duration = {mine / UNITS[unit]:.4g} {unit}/s (was the "
                               "tool run with these -batch_size / -block_size?)", source=source,
                         line_no=i, line=lines[i - 1])
    if device is not None:
        opened = [m["device"] for m in map(_RDMA_DEVICE.search, lines) if m]
        if device not in opened:
            raise ParseError(TOOL, f"the log never says it opened RDMA device {device} (it opened "
                                   f"{', '.join(opened) or 'none'}): was it run with --protocol=rdma "
                                   f"--device_name={device}?", source=source)
    res.warnings = [ln.strip() for ln in lines if ln.startswith("W")]
    return res


def _decimals(num: str) -> int:
    return len(num.split(".", 1)[1]) if "." in num else 0


def to_rows(res: TeResult, **ctx: Any) -> list[Row]:
    """The run's rows: ``get_throughput`` (GB/s) and ``batches``; unverified (the tool never checks bytes)."""
    extra = {"verified": False, "verification": "unverified: transfer_engine_bench never checks the bytes it reads",
             "duration_s": res.duration_s, "bytes": res.bytes, "printed_rate": f"{res.printed_rate} {res.printed_unit}/s",
             **({"tool_warnings": res.warnings} if res.warnings else {})}
    extra.update(ctx.pop("extra", {}) or {})
    base = dict(size_bytes=res.block_size, batch=res.batch_size, threads=res.threads, processes=1, **ctx)
    return [Row(metric="get_throughput", value=res.gb_per_s, unit="GB/s", raw_value=res.printed_rate,
                raw_unit=f"{res.printed_unit}/s", extra=extra, **base),
            Row(metric="batches", value=float(res.batches), unit="count", extra=extra, **base)]
