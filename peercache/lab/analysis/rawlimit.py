"""Which raw measurement bounds a PeerCache figure: the one rule, used by charts, attribution and the report.

A raw limit is a limit only when it was measured the way the PeerCache point
moves its bytes. On RDMA testbeds that is the published convention: the
single-NIC ``ib_read_bw`` figure bounds each NIC, so a figure over n NICs is
compared with n of them. Over tcp and shm the raw tools run with the point's
own shape: the same number of connections (iperf3 client processes x streams;
a PeerCache reader holds one data connection per batch, so processes x threads
x groups), the same request size (iperf3 ``-l`` = the page size) and the same
direction (``-R``: the producer sends); memcpy with as many threads and the
same page size. Where no raw run has that shape there is no limit and no
percentage, and :func:`why_none` says what was missing.

A limit is the most the path gave: the best of the run's repetitions of that
shape (and of each one's back-to-back rounds, kept in its row), never their
mean, and its label says how many runs it is the best of.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from peercache.lab.analysis.references import convert, row_devices, row_extra

RAW_TOOLS = ("ib_read_bw", "ib_write_bw", "iperf3", "memcpy")
#: The raw tool a PeerCache GET over each protocol is compared with: RDMA READ for rdma,
#: iperf3 on the same path for tcp, memcpy for shm.
RAW_FOR_PROTOCOL = {"rdma": ("ib_read_bw",), "tcp": ("iperf3",), "shm": ("memcpy",)}
BW_METRICS = ("bw", "get_throughput")
#: Tools whose one figure stands for a whole NIC, whatever the point's shape (the published convention).
PER_NIC_TOOLS = ("ib_read_bw",)


@dataclass(frozen=True)
class RawLimit:
    """A raw limit: GB/s, how it was measured, and the runs it came from."""

    gbs: float
    tool: str
    label: str                #: e.g. "iperf3 -R, 4 connection(s), 128 KiB requests, best of 3 runs" or "2 x ib_read_bw"
    runs: tuple[str, ...]
    #: the raw run's busiest thread (either side), CPU s per s, where its row recorded it
    busiest_thread: float | None = None
    #: TCP segments the raw run retransmitted (count), where its row recorded them
    retransmits: float | None = None
    #: the raw run's CPU by side ("consumer"/"producer" -> CPU s per s of its process tree), where recorded
    cores: tuple[tuple[str, float], ...] = ()

    @property
    def bps(self) -> float:
        """The limit in bytes per second."""
        return self.gbs * 1e9


def _int(v: Any) -> int | None:
    try:
        return None if v is None or pd.isna(v) else int(v)
    except (TypeError, ValueError):
        return None


def _size_text(n: int | None) -> str:
    if n is None:
        return "? B"
    for unit, f in (("MiB", 2**20), ("KiB", 2**10)):
        if n >= f and n % f == 0:
            return f"{n // f} {unit}"
    return f"{n} B"


def raw_shape(r) -> tuple[str, int | None, int | None]:
    """(protocol, connections, request bytes) a raw row was measured with; (protocol, None, None) per NIC."""
    tool = r["tool"]
    proto = next((p for p, tools in RAW_FOR_PROTOCOL.items() if tool in tools), "")
    if tool in PER_NIC_TOOLS:
        return proto, None, None
    if tool == "iperf3":
        conns = (_int(r.get("processes")) or 1) * (_int(r.get("qps")) or 1)
    else:  # memcpy: one copy thread per reader
        conns = _int(r.get("threads")) or 1
    return proto, conns, _int(r.get("size_bytes"))


def point_shape(r) -> tuple[str, int | None, int | None]:
    """(protocol, connections, request bytes) of a PeerCache row: one connection per reader thread."""
    ex = row_extra(r)
    groups = _int(ex.get("groups")) or 1
    procs, threads = _int(r.get("processes")), _int(r.get("threads"))
    conns = None if procs is None or threads is None else procs * threads
    if conns is not None and r.get("side") == "aggregate" and groups > 1 and procs * threads < groups:
        conns *= groups       # an aggregate row whose processes are per group
    return str(r.get("protocol") or ""), conns, _int(r.get("size_bytes"))


def _busiest(r) -> float | None:
    """The busiest thread of either side of a raw row's run (CPU s per s), or None where not recorded."""
    cpu = row_extra(r).get("cpu") or {}
    got = [float(u["busiest_thread"]) for u in (cpu.get(s) or {} for s in ("consumer", "producer"))
           if isinstance(u, dict) and u.get("busiest_thread") is not None]
    return max(got) if got else None


def _cores(r) -> tuple[tuple[str, float], ...]:
    """(side, CPU s per s) of each side of a raw row's run that recorded its CPU."""
    cpu = row_extra(r).get("cpu") or {}
    return tuple((s, float(u["cores"])) for s, u in cpu.items() if isinstance(u, dict) and u.get("cores") is not None)


def _samples(r) -> int:
    """How many runs a raw row's figure is the best of (its back-to-back rounds; 1 when it records none)."""
    return len(row_extra(r).get("rounds_Bps") or ()) or 1


def raw_limits(rows: pd.DataFrame) -> dict[tuple[str, int | None, int | None], RawLimit]:
    """The run's raw single-NIC limits by shape: the best GB/s over repetitions (and their rounds), with their runs."""
    raw = rows[(rows["scenario"] == "single_nic") & rows["tool"].isin(RAW_TOOLS)
               & rows["metric"].isin(BW_METRICS) & (rows["status"] == "ok") & rows["value"].notna()]
    acc: dict[tuple, dict[str, Any]] = {}
    for _, r in raw.iterrows():
        key = raw_shape(r)
        # -R only where the row records it
        tool = r["tool"] + (" -R" if row_extra(r).get("reverse") else "")
        gbs = convert(float(r["value"]), str(r["unit"]), "GB/s")
        a = acc.setdefault(key, {"tool": tool, "gbs": None, "busiest": None, "retrans": None, "cores": (), "n": 0,
                                 "runs": []})
        a["n"] += _samples(r)
        a["runs"].append(r["run_id"])
        if a["gbs"] is None or gbs > a["gbs"]:
            a.update(tool=tool, gbs=gbs, busiest=_busiest(r), retrans=row_extra(r).get("retransmits"), cores=_cores(r))
    out = {}
    for (proto, conns, size), a in acc.items():
        tool = a["tool"]
        if conns is None:
            label = tool
        else:
            what = "connection(s)" if tool.startswith("iperf3") else "thread(s)"
            label = f"{tool}, {conns} {what}, {_size_text(size)} requests"
        if a["n"] > 1:
            label += f", best of {a['n']} runs"
        out[(proto, conns, size)] = RawLimit(a["gbs"], tool.split()[0], label, tuple(dict.fromkeys(a["runs"])),
                                             a["busiest"], a["retrans"], a["cores"])
    return out


def nics_of(r) -> int:
    """How many NICs a row's figure spans (groups of a whole-machine run, else its devices)."""
    return _int(row_extra(r).get("groups")) or max(1, len(row_devices(r)))


def raw_for(r, limits: dict[tuple, RawLimit]) -> RawLimit | None:
    """The raw limit measured the same way as PeerCache row ``r``, or None (then no percentage)."""
    if r.get("tool") in RAW_TOOLS:
        return None
    proto, conns, size = point_shape(r)
    exact = limits.get((proto, conns, size))
    if exact is not None:
        return exact
    per_nic = limits.get((proto, None, None))
    if per_nic is None:
        return None
    n = nics_of(r)
    if n == 1:
        return per_nic
    return RawLimit(per_nic.gbs * n, per_nic.tool, f"{n} x {per_nic.tool}", per_nic.runs, per_nic.busiest_thread,
                    per_nic.retransmits)


def why_none(r, limits: dict[tuple, RawLimit]) -> str:
    """Why :func:`raw_for` found no limit for ``r``: what a matching raw run would need."""
    proto, conns, size = point_shape(r)
    tools = "/".join(RAW_FOR_PROTOCOL.get(proto, ("a raw tool",)))
    have = [k for k in limits if k[0] == proto]
    if not have:
        return f"no {tools} run in this run's single_nic scenario"
    shapes = ", ".join(f"{c} conn. x {_size_text(s)}" for _, c, s in sorted(have, key=lambda k: (k[1] or 0, k[2] or 0)))
    return (f"no {tools} run with {conns} connection(s) and {_size_text(size)} requests "
            f"(measured: {shapes})")


def percent_of_raw(r, limits: dict[tuple, RawLimit]) -> float | None:
    """The row's figure as a percentage of its raw limit, or None where no raw run matches."""
    lim = raw_for(r, limits)
    if lim is None or not lim.gbs:
        return None
    return 100.0 * convert(float(r["value"]), str(r["unit"]), "GB/s") / lim.gbs
