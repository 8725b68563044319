"""InfiniBand/RoCE port counters as an independent check of the bytes a tool reports.

``/sys/class/infiniband/<dev>/ports/<port>/counters/port_{rcv,xmit}_data``
count payload+header octets divided by 4, so bytes = value * 4. Sampling
them before and after a run gives the bytes the port really moved;
:func:`check_figure` compares a tool's figure with those bytes and with the
port's line rate (``ports/<port>/rate``, e.g. "400 Gb/sec (4X NDR)") and
returns explicit flags: a check that could not be made is a flag too, never
a silent pass. All reads go through :func:`peercache.sysfs.sysfs_path`
so tests can use a fixture tree.
"""
from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from peercache.sysfs import read_attr, sysfs_path

#: port_*_data count units of 4 bytes (IBA "PortXmitData": octets / 4).
COUNTER_UNIT_BYTES = 4
#: A legacy 32-bit PortXmitData/PortRcvData stops (saturates) here.
SATURATED_32 = 2**32 - 1

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


@dataclass
class Flag:
    """One thing wrong with (or unverifiable about) a figure."""

    code: str                   #: above_line_rate, counter_disagreement, counters_unavailable, line_rate_unknown, ...
    message: str


@dataclass
class CrossCheck:
    """Verdict on one figure: ``ok`` only when every check ran and passed."""

    ok: bool
    flags: list[Flag]
    figure_bytes: float | None
    figure_Bps: float | None
    counter_bytes: float | None
    line_rate_Bps: float | None
    tolerance: float            #: allowed relative difference between figure and counters

    @property
    def codes(self) -> list[str]:
        return [f.code for f in self.flags]


def _read_int(path) -> tuple[int | None, str | None]:
    text, why = read_attr(path)
    if text is None:
        return None, why
    try:
        return int(text), None
    except ValueError:
        return None, f"{path}: {text!r} is not an integer"


def read_port(device: str, port: int = 1, root: str | os.PathLike | None = None) -> PortSample:
    """Read ``port_rcv_data`` / ``port_xmit_data`` of one port now."""
    base = ("class", "infiniband", device, "ports", str(port), "counters")
    rcv, why_r = _read_int(sysfs_path(*base, "port_rcv_data", root=root))
    xmit, why_x = _read_int(sysfs_path(*base, "port_xmit_data", root=root))
    reason = "; ".join(w for w in (why_r, why_x) if w) or None
    return PortSample(device, port, rcv, xmit, time.time(), reason)


def sample(ports: Iterable[tuple[str, int]], root: str | os.PathLike | None = None
           ) -> dict[tuple[str, int], PortSample]:
    """Samples of several (device, port) pairs, taken back to back."""
    return {(d, p): read_port(d, p, root) for d, p in ports}


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


def line_rate_Bps(device: str, port: int = 1, root: str | os.PathLike | None = None
                  ) -> tuple[float | None, str | None]:
    """(line rate in bytes/s, None) of one port, or (None, why it is unknown)."""
    path = sysfs_path("class", "infiniband", device, "ports", str(port), "rate", root=root)
    text, why = read_attr(path)
    if text is None:
        return None, why
    try:
        return parse_rate(text) / 8, None
    except ValueError as e:
        return None, f"{path}: {e}"


def check_figure(figure_bytes: float | None, seconds: float | None,
                 counters: Sequence[PortDelta] | None, direction: str,
                 line_rate: float | None, *, reported_Bps: float | None = None,
                 tolerance: float = 0.05) -> CrossCheck:
    """Check a tool's bytes (and rate) against port counters and line rate; flags say what failed.

    ``direction`` is "rcv" or "xmit": which counter of ``counters`` (summed
    over the ports the figure used) to compare with. ``line_rate`` is the
    summed line rate of those ports in bytes/s. ``tolerance`` is the allowed
    relative difference |figure - counters| / counters; counters include
    headers, so a tolerance of a few percent is expected.
    """
    if direction not in ("rcv", "xmit"):
        raise ValueError(f"direction {direction!r} must be 'rcv' or 'xmit'")
    flags: list[Flag] = []
    rate = None
    if figure_bytes is not None and seconds:
        rate = figure_bytes / seconds
    rates = [(n, r) for n, r in (("figure", rate), ("reported rate", reported_Bps)) if r is not None]
    if not rates:
        flags.append(Flag("no_figure", "no bytes/seconds or reported rate to check"))
    if line_rate is None or line_rate <= 0:
        flags.append(Flag("line_rate_unknown",
                          "line rate of the port(s) unknown; cannot check the figure against it "
                          "(read ports/<p>/rate in sysfs)"))
    else:
        for name, r in rates:
            if r > line_rate:
                flags.append(Flag("above_line_rate",
                                  f"{name} {r / 1e9:.3f} GB/s is above the line rate "
                                  f"{line_rate / 1e9:.3f} GB/s: the window or byte count is wrong"))
    counter_bytes = None
    if not counters:
        flags.append(Flag("counters_unavailable",
                          "no port counters sampled; bytes not cross-checked"))
    else:
        key = "rcv_bytes" if direction == "rcv" else "xmit_bytes"
        values = [getattr(d, key) for d in counters]
        problems = [f"{d.device}/{d.port}: {f}" for d in counters for f in d.flags
                    if f.startswith(f"port_{direction}_data")]
        if problems or any(v is None for v in values):
            flags.append(Flag("counters_unusable",
                              "port counters could not be used: " + ", ".join(problems or ["unreadable"])))
        else:
            counter_bytes = float(sum(values))
            if figure_bytes is None:
                pass  # already flagged as no_figure when there is nothing at all
            elif counter_bytes == 0:
                if figure_bytes > 0:
                    flags.append(Flag("counter_disagreement",
                                      f"tool reports {figure_bytes:.0f} B but the counters moved 0 B: "
                                      "wrong device/port, or the traffic took another path"))
            else:
                diff = abs(figure_bytes - counter_bytes) / counter_bytes
                if diff > tolerance:
                    flags.append(Flag("counter_disagreement",
                                      f"tool reports {figure_bytes:.0f} B, counters {counter_bytes:.0f} B "
                                      f"({diff:.1%} apart, tolerance {tolerance:.1%})"))
    return CrossCheck(ok=not flags, flags=flags, figure_bytes=figure_bytes, figure_Bps=rate,
                      counter_bytes=counter_bytes, line_rate_Bps=line_rate, tolerance=tolerance)
