"""Which raw measurement bounds a PeerCache figure: the one rule, used by charts, attribution and the report.

A raw limit is a limit only when it was measured the way the PeerCache point
moves its bytes. On RDMA testbeds that is the published convention: the
single-NIC ``ib_read_bw`` figure bounds each NIC, so a figure over n NICs is
compared with n of them; where the run also has an ``ib_read_bw`` of a one-NIC
point's own shape (as many QPs as the point has reader threads, messages of its
page size: the engines scenario measures one per cell), that one is its limit,
so a 4 KiB point is not held to the 1 MiB figure. Over tcp and shm the raw tools run with the point's
own shape. Over tcp that is what drive's document says its client did with each
batch (``tcp_wire``, from peercache.transport.tcp.batch_wire): the same number
of connections (iperf3 client processes x streams; a PeerCache reader holds one
data connection per batch, so processes x threads x groups), the same request
size (iperf3 ``-l`` = the most one request asks for: the client cuts a batch
into requests of at most 1 MiB, so a batch of 32 pages of 128 KiB is not one
4 MiB request), the same depth (iperf3 ``-w`` = the bytes the connection
carries at once: its requests in flight, bounded by the data server's socket
send buffer) and the same direction (``-R``: the producer sends). shm: memcpy
with as many threads and the same page size. Where no raw run has that shape
there is no limit and no percentage, and :func:`why_none` says what was missing.

A limit is the most the path gave: the best of the run's repetitions of that
shape (and of each one's back-to-back rounds, kept in its row), never their
mean, and its label says how many runs it is the best of.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import pandas as pd

from peercache.lab.analysis.references import convert, row_devices, row_extra
from peercache.lab.tools.iperf3 import MAX_LENGTH as IPERF3_MAX_LENGTH

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
    #: e.g. "iperf3 -R, 4 connection(s), 1 MiB requests, 256 KiB in flight, best of 3 runs" or "2 x ib_read_bw"
    label: str
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
    for unit, f in (("MiB", 2**20), ("KiB", 2**10)):
        if n >= f:
            return f"{n} B (~{n / f:.1f} {unit})"
    return f"{n} B"


#: A measurement's shape: (protocol, connections, request bytes, bytes in flight per connection). Per NIC
#: (ib_read_bw): (protocol, None, None, None); without a depth (a copy): in flight None.
Shape = tuple[str, int | None, int | None, int | None]


def raw_shape(r) -> Shape:
    """The shape a raw row was measured with: iperf3's connections, -l and -w (as iperf3 reported it; None where
    the kernel autotuned its buffers), memcpy's threads and size."""
    tool = r["tool"]
    proto = next((p for p, tools in RAW_FOR_PROTOCOL.items() if tool in tools), "")
    if tool in PER_NIC_TOOLS:
        return proto, None, None, None
    return _own_shape(r, tool, proto)


def _own_shape(r, tool: str, proto: str) -> Shape:
    """A raw row's own shape, for a per-NIC tool too: its QPs and message size."""
    if tool in PER_NIC_TOOLS:
        return proto, _int(r.get("qps")) or 1, _int(r.get("size_bytes")), None
    if tool == "iperf3":
        conns = (_int(r.get("processes")) or 1) * (_int(r.get("qps")) or 1)
        return proto, conns, _int(r.get("size_bytes")), _int(row_extra(r).get("window"))
    # memcpy: one copy thread per reader
    return proto, _int(r.get("threads")) or 1, _int(r.get("size_bytes")), None


def point_shape(r) -> Shape:
    """The shape of a PeerCache row: one connection per reader thread; over tcp the request size and bytes in
    flight drive's client moved each batch with (its ``tcp_wire``; None where the row does not record it)."""
    ex = row_extra(r)
    groups = _int(ex.get("groups")) or 1
    procs, threads = _int(r.get("processes")), _int(r.get("threads"))
    conns = None if procs is None or threads is None else procs * threads
    if conns is not None and r.get("side") == "aggregate" and groups > 1 and procs * threads < groups:
        conns *= groups       # an aggregate row whose processes are per group
    proto = str(r.get("protocol") or "")
    if proto == "tcp":
        wire = ex.get("tcp_wire") or {}
        return proto, conns, _int(wire.get("request_bytes")), _int(wire.get("in_flight_bytes"))
    return proto, conns, _int(r.get("size_bytes")), None


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


def raw_limits(rows: pd.DataFrame, scenario: str = "single_nic") -> dict[Shape, RawLimit]:
    """The run's raw single-NIC limits by shape: the best GB/s over repetitions (and their rounds), with their runs
    (the raw runs of ``scenario``: single_nic's, or a scenario that measures its own, as engines does)."""
    raw = rows[(rows["scenario"] == scenario) & rows["tool"].isin(RAW_TOOLS)
               & rows["metric"].isin(BW_METRICS) & (rows["status"] == "ok") & rows["value"].notna()]
    acc: dict[tuple, dict[str, Any]] = {}
    for _, r in raw.iterrows():
        # -R only where the row records it
        tool = r["tool"] + (" -R" if row_extra(r).get("reverse") else "")
        gbs = convert(float(r["value"]), str(r["unit"]), "GB/s")
        # a per-NIC tool's row counts for the NIC and for its own shape (QPs, size)
        keys = dict.fromkeys((raw_shape(r), _own_shape(r, r["tool"], raw_shape(r)[0])))
        for key in keys:
            a = acc.setdefault(key, {"tool": tool, "gbs": None, "busiest": None, "retrans": None, "cores": (), "n": 0,
                                     "runs": []})
            a["n"] += _samples(r)
            a["runs"].append(r["run_id"])
            if a["gbs"] is None or gbs > a["gbs"]:
                a.update(tool=tool, gbs=gbs, busiest=_busiest(r), retrans=row_extra(r).get("retransmits"),
                         cores=_cores(r))
    out = {}
    for key, a in acc.items():
        tool = a["tool"]
        label = tool if key[1] is None else f"{tool}, {shape_text(key)}"
        if a["n"] > 1:
            label += f", best of {a['n']} runs"
        out[key] = RawLimit(a["gbs"], tool.split()[0], label, tuple(dict.fromkeys(a["runs"])),
                            a["busiest"], a["retrans"], a["cores"])
    return out


def shape_text(shape: Shape) -> str:
    """A shape in words: "4 connection(s), 1 MiB requests, 256 KiB in flight" (threads for a copy)."""
    proto, conns, size, in_flight = shape
    what = {"tcp": "connection(s)", "rdma": "QP(s)"}.get(proto, "thread(s)")
    text = f"{conns} {what}, {_size_text(size)} requests"
    if proto == "tcp":
        text += f", {_size_text(in_flight)} in flight" if in_flight is not None else ", in flight unbounded (autotuned)"
    return text


def nics_of(r) -> int:
    """How many NICs a row's figure spans (groups of a whole-machine run, else its devices)."""
    return _int(row_extra(r).get("groups")) or max(1, len(row_devices(r)))


def raw_for(r, limits: dict[Shape, RawLimit]) -> RawLimit | None:
    """The raw limit measured the same way as PeerCache row ``r``, or None (then no percentage)."""
    if r.get("tool") in RAW_TOOLS:
        return None
    shape = point_shape(r)
    n = nics_of(r)
    if shape[1] is not None and shape[2] is not None:
        exact = limits.get(shape)
        # a per-NIC tool's own shape is one NIC's: it bounds a one-NIC point only
        if exact is not None and (exact.tool not in PER_NIC_TOOLS or n == 1):
            return exact
    per_nic = limits.get((shape[0], None, None, None))
    if per_nic is None:
        return None
    if n == 1:
        return per_nic
    return RawLimit(per_nic.gbs * n, per_nic.tool, f"{n} x {per_nic.tool}", per_nic.runs, per_nic.busiest_thread,
                    per_nic.retransmits)


def pct_text(pct: float, of: str = "", digits: int = 0, lowest: float | None = None) -> str:
    """A figure's percentage of its raw limit as every table, figure and overview writes it (the one rule):
    "109% of memcpy (above raw)" -- the flag wherever the figure is above its limit; for a point measured
    several times (``lowest``: its lowest run's percentage) only where every run is, else "(within the spread
    of raw)"."""
    flag = ""
    if pct > 100:
        flag = " (above raw)" if lowest is None or lowest > 100 else " (within the spread of raw)"
    return f"{pct:.{digits}f}%" + (f" of {of}" if of else "") + flag


def scenario_limits(rows: pd.DataFrame, scenario: str) -> dict[Shape, RawLimit]:
    """The raw limits a row of ``scenario`` is measured against, the one rule for them: the scenario's own raw
    runs where it measures some at a shape (engines does), else the run's single_nic ones."""
    base = raw_limits(rows)
    return base if scenario == "single_nic" else {**base, **raw_limits(rows, scenario=scenario)}


def limits_by_scenario(rows: pd.DataFrame) -> Callable[[Any], RawLimit | None]:
    """Each row's raw limit (:func:`scenario_limits` of its scenario, :func:`raw_for`): the attribution's
    "% of raw" and a section's table read the same one, so the two never disagree."""
    own: dict[str, dict[Shape, RawLimit]] = {}

    def limit(r) -> RawLimit | None:
        s = str(r.get("scenario"))
        if s not in own:
            own[s] = scenario_limits(rows, s)
        return raw_for(r, own[s])
    return limit


def why_none(r, limits: dict[Shape, RawLimit]) -> str:
    """Why :func:`raw_for` found no limit for ``r``: what a matching raw run would need."""
    shape = point_shape(r)
    proto, conns, size, _ = shape
    tools = "/".join(RAW_FOR_PROTOCOL.get(proto, ("a raw tool",)))
    if proto == "tcp" and size is None:
        return ("the row does not say how drive's tcp client moved each batch (no tcp_wire in its drive document: "
                "a result from before drive recorded it), so no iperf3 run can be matched to it; run the point again")
    have = [k for k in limits if k[0] == proto]
    if not have:
        return f"no {tools} run in this run's single_nic scenario"
    shapes = "; ".join(shape_text(k) for k in sorted(have, key=lambda k: tuple(v or 0 for v in k[1:])))
    why = f"no {tools} run with {shape_text(shape)} (measured: {shapes})"
    if proto == "tcp" and size > IPERF3_MAX_LENGTH:
        why += f"; iperf3 writes at most {_size_text(IPERF3_MAX_LENGTH)} at a time, so none can be"
    return why


def percent_of_raw(r, limits: dict[Shape, RawLimit]) -> float | None:
    """The row's figure as a percentage of its raw limit, or None where no raw run matches."""
    lim = raw_for(r, limits)
    if lim is None or not lim.gbs:
        return None
    return 100.0 * convert(float(r["value"]), str(r["unit"]), "GB/s") / lim.gbs
