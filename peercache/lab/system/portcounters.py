"""InfiniBand/RoCE port counters as an independent check of the bytes a tool reports.

``/sys/class/infiniband/<dev>/ports/<port>/counters/port_{rcv,xmit}_data``
count payload+header octets divided by 4, so bytes = value * 4. Sampling
them before and after a run gives the bytes the port really moved;
:func:`check` compares a tool's figure with those bytes and with the port's
line rate (``ports/<port>/rate``, e.g. "400 Gb/sec (4X NDR)") and returns
explicit flags: a check that could not be made is a flag too, never a silent
pass. This module is pure (samples in, verdict out); the samples are read
on the host that ran a point by :mod:`peercache.lab.system.crosscheck`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Sequence

#: port_*_data count units of 4 bytes (IBA "PortXmitData": octets / 4).
COUNTER_UNIT_BYTES = 4
#: A legacy 32-bit PortXmitData/PortRcvData stops (saturates) here.
SATURATED_32 = 2**32 - 1
#: Headers and retransmits make the counters exceed the payload, and they span the whole run
#: (warm-up and set-up included), so they bound a figure's bytes from above; a figure may
#: claim at most this fraction more than the counters saw before it is flagged.
DEFAULT_TOLERANCE = 0.02

_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec\b")


@dataclass
class PortSample:
    """Raw counter values of one port at one moment (None with ``reason`` when unreadable)."""

    device: str
    port: int
    rcv_data: int | None        #: 4-byte units
    xmit_data: int | None       #: 4-byte units
    time: float                 #: epoch s
    reason: str | None = None
    #: Bytes per counter unit: 4 for port_*_data; 1 where the port has no data counters (Soft-RoCE)
    #: and the bytes of its netdev (``statistics/{rx,tx}_bytes``) stand in, headers included.
    unit_bytes: int = COUNTER_UNIT_BYTES
    source: str = "port_counters"   #: port_counters | netdev:<name>


@dataclass
class PortDelta:
    """Bytes one port moved between two samples."""

    device: str
    port: int
    rcv_bytes: int | None
    xmit_bytes: int | None
    seconds: float
    flags: list[str] = field(default_factory=list)   #: counter problems (saturated, went backwards, unreadable)
    source: str = "port_counters"                    #: where the bytes were read (see PortSample.source)


def _counter_delta(name: str, before: int | None, after: int | None,
                   flags: list[str], unit_bytes: int = COUNTER_UNIT_BYTES) -> int | None:
    if before is None or after is None:
        flags.append(f"{name}_unreadable")
        return None
    if after == SATURATED_32 or before == SATURATED_32:
        # A saturated 32-bit counter no longer counts; the delta would be low.
        flags.append(f"{name}_saturated")
        return None
    if after < before:
        flags.append(f"{name}_went_backwards")  # reset or wrap during the run
        return None
    return (after - before) * unit_bytes


def delta(before: PortSample, after: PortSample) -> PortDelta:
    """Bytes moved between two samples of the same port, with counter problems flagged."""
    if (before.device, before.port) != (after.device, after.port):
        raise ValueError(f"samples of different ports: {before.device}/{before.port} "
                         f"and {after.device}/{after.port}")
    flags: list[str] = []
    if (before.unit_bytes, before.source) != (after.unit_bytes, after.source):
        flags.append("counter_source_changed")
        return PortDelta(before.device, before.port, None, None, after.time - before.time, flags)
    rcv = _counter_delta("port_rcv_data", before.rcv_data, after.rcv_data, flags, before.unit_bytes)
    xmit = _counter_delta("port_xmit_data", before.xmit_data, after.xmit_data, flags, before.unit_bytes)
    return PortDelta(before.device, before.port, rcv, xmit, after.time - before.time, flags, before.source)


def deltas(before: dict, after: dict) -> list[PortDelta]:
    """:func:`delta` for every port sampled in both ``before`` and ``after``."""
    return [delta(before[k], after[k]) for k in before if k in after]


def parse_rate(text: str) -> float:
    """Bits per second from a sysfs rate string such as ``"400 Gb/sec (4X NDR)"``."""
    m = _RATE_RE.match(text or "")
    if not m:
        raise ValueError(f"rate {text!r} not in the sysfs form '<N> Gb/sec (...)'")
    return float(m.group(1)) * 1e9




@dataclass
class PortCheck:
    """The counter window of one point and what it says about one figure.

    ``flags`` is empty only when every check ran and passed; a check that could not run
    (no figure, unknown line rate, unusable counters) is a flag too.
    """

    deltas: list[PortDelta]
    line_rate_Bps: float | None
    flags: list[str] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.flags

    def as_extra(self) -> dict[str, Any]:
        """JSON-able summary kept in the bandwidth row's ``extra``."""
        return {"port_counters": {d.device: {"rcv_bytes": d.rcv_bytes, "xmit_bytes": d.xmit_bytes,
                                             "seconds": d.seconds, "flags": d.flags, "source": d.source}
                                  for d in self.deltas},
                "line_rate_Bps": self.line_rate_Bps, "crosscheck_flags": self.flags,
                "crosscheck": self.messages}


def check(ds: Sequence[PortDelta], line_rate_Bps: float | None, figure_Bps: float | None,
          window_s: float | None, direction: str = "rcv", tolerance: float = DEFAULT_TOLERANCE) -> PortCheck:
    """The one port-counter check of a figure: the rate against the summed line rate of the ports
    it used, and the bytes it claims in its window (``figure_Bps * window_s``) against the bytes
    the ports moved over the whole run (``direction``: "rcv" or "xmit" counters)."""
    if direction not in ("rcv", "xmit"):
        raise ValueError(f"direction {direction!r} must be 'rcv' or 'xmit'")
    pc = PortCheck(list(ds), line_rate_Bps)
    if figure_Bps is None:
        pc.flags.append("no_figure")
        pc.messages.append("no figure to check")
        return pc
    if not line_rate_Bps or line_rate_Bps <= 0:
        pc.flags.append("line_rate_unknown")
        pc.messages.append("line rate of a port unknown (ports/<p>/rate in sysfs): figure not checked against it")
    elif figure_Bps > line_rate_Bps:
        pc.flags.append("above_line_rate")
        pc.messages.append(f"{figure_Bps / 1e9:.3f} GB/s is above the summed line rate "
                           f"{line_rate_Bps / 1e9:.3f} GB/s: the window or the byte count is wrong")
    key = "rcv_bytes" if direction == "rcv" else "xmit_bytes"
    vals = [getattr(d, key) for d in pc.deltas]
    if not pc.deltas or any(v is None for v in vals):
        pc.flags.append("counters_unusable")
        pc.messages.append("port counters unreadable or unusable: " +
                           ("; ".join(f"{d.device}: {','.join(d.flags)}" for d in pc.deltas if d.flags)
                            or "none sampled"))
        return pc
    moved = float(sum(vals))
    if window_s:
        claimed = figure_Bps * window_s
        if claimed > moved * (1 + tolerance):
            pc.flags.append("counter_disagreement")
            pc.messages.append(f"figure implies {claimed:.0f} B in its window but the ports moved only "
                               f"{moved:.0f} B over the whole run (tolerance {tolerance:.0%}): wrong "
                               "device/port, or the traffic took another path")
    return pc
