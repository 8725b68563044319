"""Errors of the lab tool wrappers: a parse error names the line, a tool error the host.

``ParseError`` means a tool's output was not what its parser expects (corrupt,
truncated, or a format this code does not know); it never carries a partial
result, so no caller can chart a number that was not read. ``ToolError`` means
the tool itself failed (no device, cannot connect, ...); ``kind`` is a short
machine-readable class and the message says what to check.
"""
from __future__ import annotations

#: Allowed values of ``ToolError.kind``.
TOOL_ERROR_KINDS = (
    "no_device",        # the RDMA device (or any device) is missing
    "cannot_connect",   # client could not reach the server
    "port_in_use",      # server could not bind / listen
    "below_limit",      # perftest -w / -y verifier limit not reached
    "clock_calibration",  # the tool could not calibrate its cycle counter (a loaded or emulated CPU)
    "unknown_option",   # the tool rejected its command line
    "completion_error", # a work completion came back with an error status (ibv_wc_status)
    "resource_error",   # the tool could not create its verbs resources (MR, QP, CQ, hugepages)
    "not_installed",    # the executable is not on PATH
    "failed",           # anything else: non-zero exit without a known cause
)


class ParseError(ValueError):
    """A tool's output could not be parsed; names the tool, the source, the line and its text."""

    def __init__(self, tool: str, message: str, *, source: str = "<text>",
                 line_no: int | None = None, line: str | None = None) -> None:
        self.tool = tool
        self.source = source
        self.line_no = line_no
        self.line = line
        self.reason = message
        where = source if line_no is None else f"{source}, line {line_no}"
        text = f"{tool} output ({where}): {message}"
        if line is not None:
            text += f": {line.rstrip()!r}"
        super().__init__(text)


class ToolError(RuntimeError):
    """A tool run failed for a known reason; says on which host and what to check."""

    def __init__(self, *, host: str, tool: str, kind: str, detail: str,
                 check: str, returncode: int | None = None) -> None:
        if kind not in TOOL_ERROR_KINDS:
            raise ValueError(f"ToolError kind {kind!r} is not one of {TOOL_ERROR_KINDS}")
        self.host = host
        self.tool = tool
        self.kind = kind
        self.detail = detail
        self.check = check
        self.returncode = returncode
        host_txt = f" on host {host}" if host else ""
        rc_txt = f", exit status {returncode}" if returncode is not None else ""
        super().__init__(f"{tool}{host_txt}: {detail}{rc_txt}; {check}")

    def to_dict(self) -> dict:
        """Plain dict for logs and result files."""
        return {"host": self.host, "tool": self.tool, "kind": self.kind,
                "detail": self.detail, "check": self.check,
                "returncode": self.returncode, "message": str(self)}
