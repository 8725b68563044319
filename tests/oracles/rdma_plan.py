"""Test oracle of the RDMA read planner: ops -> units -> rails -> channels -> WRs -> chains.

The verbs backend plans in C (``native/verbs_plan.c``, ``peercache._verbs.plan``);
this is the same rules in Python: tests/engine/transport/test_rdma_plan.py checks them here, and
tests/engine/transport/test_rdma_verbs.py compares the native planner with this one on random
batches. No production path uses it. Everything here is pure: no device, no
memory registration.

1. *Units*: consecutive ops that must stay on one QP, in order. A slot read
   is header, payload, trailer (or header, trailer for an empty object); the
   seqlock check is only sound if the trailer is read after the payload, and
   READs are ordered only within one QP. An op joins the current unit when it
   is on the same region, starts at or after the end of the op before, and
   either continues that op remotely or lands locally right after the unit's
   *anchor* (the tag scratch layout: header then trailer). The anchor is the
   unit's first op, and moves to an op that continues the op before it
   remotely in the same local buffer as both: the header of a slot that lies
   right after the previous one in the region (capacity + 40 a multiple of
   64) joins that slot's unit, and its trailer must then join too, not start
   a unit of its own that another rail or channel may read before the payload.
2. *Work requests*: remote-contiguous ops of a unit share one READ with one
   scatter entry per op, up to ``max_sge`` (a full slot is one READ with three
   entries: tag scratch, destination, tag scratch; a partial slot is a
   header+payload READ with two entries and a trailer READ). Every READ of a
   unit after its first is *fenced* (IBV_SEND_FENCE): it starts only once the
   READs before it completed, so the trailer is read after the payload even
   when the responder would serve pipelined READs in parallel.
3. *Rails*: only rails that are up carry reads (a rail whose port left
   ACTIVE, or that failed on this connection, is out of the plan). Each unit
   goes to an up rail on the NUMA node of its destination buffer (all up
   rails when none is local or the node is unknown), then to the one with
   the least outstanding bytes, counting what this plan already gave it. A
   unit no rail can carry is refused: Status.CONNECTION for each of its ops.
4. *Channels*: units of a rail go round-robin over the channels (QPs) the
   batch holds on that rail.
5. *Chains*: the WRs of one channel are cut into chains of at most
   :func:`chain_length` WRs, each posted with one ``ibv_post_send``; every
   k-th WR (:func:`signal_cadence`) and the last of each chain is signalled.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

#: Bits of a wr_id: channel epoch above, WR index of the plan below.
WR_INDEX_BITS = 48
EPOCH_BITS = 16
#: Largest single READ the planner issues (RC messages are limited to 2 GiB).
MAX_READ_BYTES = 1 << 31


@dataclass(frozen=True)
class Limits:
    """Queue and device limits that shape chains and signalling."""

    sq_depth: int = 256        #: send queue slots of one QP (max_send_wr)
    max_rd_atom: int = 16      #: READs one QP may have outstanding (device max_qp_rd_atom)
    max_sge: int = 3           #: scatter entries per WR (the tag scheme needs 3)
    signal_every: int = 16     #: requested signalling cadence k
    max_chain: int = 64        #: most WRs posted with one ibv_post_send


def signal_cadence(lim: Limits) -> int:
    """k: signal every k-th WR; at most max_rd_atom and half the send queue.

    A completion every <= max_rd_atom READs retires slots as fast as the
    responder can serve them; at most half the queue keeps two signalled
    groups in flight so posting never waits for the one just signalled.
    """
    return max(1, min(lim.signal_every, lim.max_rd_atom, lim.sq_depth // 2))


def chain_length(lim: Limits) -> int:
    """WRs per post: a multiple of k, at most max_chain and half the send queue."""
    k = signal_cadence(lim)
    cap = min(lim.max_chain, max(1, lim.sq_depth // 2))
    return max(k, cap // k * k)


@dataclass(frozen=True)
class Sge:
    """One scatter entry: ``length`` bytes of op ``op`` into a local buffer."""

    op: int
    local: int
    local_offset: int
    length: int


@dataclass(frozen=True)
class WorkRequest:
    """One RDMA READ: a remote range scattered over ``sges``."""

    index: int
    rail: int
    channel: int
    region: int
    remote_offset: int
    sges: tuple[Sge, ...]
    signaled: bool
    chain: int
    fence: bool = False    #: wait for the unit's earlier READs (seqlock order)

    @property
    def length(self) -> int:
        return sum(s.length for s in self.sges)

    @property
    def ops(self) -> tuple[int, ...]:
        return tuple(s.op for s in self.sges)


@dataclass(frozen=True)
class Chain:
    """WRs posted with one ``ibv_post_send`` on one (rail, channel)."""

    index: int
    rail: int
    channel: int
    wrs: tuple[int, ...]


@dataclass
class Plan:
    """The WRs, chains and per-rail load of one batch."""

    wrs: list[WorkRequest] = field(default_factory=list)
    chains: list[Chain] = field(default_factory=list)
    load: list[int] = field(default_factory=list)        #: bytes per rail after the plan
    refused: dict[int, int] = field(default_factory=dict)  #: op -> Status, never issued

    def channel_wrs(self, rail: int, channel: int) -> list[WorkRequest]:
        """WRs of one channel in posting order."""
        return [w for w in self.wrs if w.rail == rail and w.channel == channel]


def _field(ops: np.ndarray, name: str) -> list[int]:
    return ops[name].tolist()


def units(ops: np.ndarray) -> list[list[int]]:
    """Op indices grouped into units that stay on one QP, in order."""
    region, off, length = _field(ops, "region"), _field(ops, "remote_offset"), _field(ops, "length")
    local, loff = _field(ops, "local_region"), _field(ops, "local_offset")
    out: list[list[int]] = []
    a = 0   # the current unit's anchor (see the module docstring)
    for i in range(len(ops)):
        if out:
            u, p = out[-1], out[-1][-1]
            if region[i] == region[p] and off[i] >= off[p] + length[p]:
                if off[i] == off[p] + length[p]:
                    u.append(i)
                    if local[i] == local[p] == local[a]:
                        a = i      # the next slot's header: its trailer lands after it
                    continue
                if local[i] == local[a] and loff[i] == loff[a] + length[a]:
                    u.append(i)
                    continue
        out.append([i])
        a = i
    return out


def work_requests(ops: np.ndarray, unit: list[int], max_sge: int) -> list[list[int]]:
    """The ops of one unit grouped into READs (remote-contiguous, <= max_sge entries)."""
    off, length = _field(ops, "remote_offset"), _field(ops, "length")
    groups: list[list[int]] = []
    for i in unit:
        if groups:
            g = groups[-1]
            p = g[-1]
            if (off[i] == off[p] + length[p] and len(g) < max_sge
                    and sum(length[j] for j in g) + length[i] <= MAX_READ_BYTES):
                g.append(i)
                continue
        groups.append([i])
    return groups


def choose_rail(dest_numa: int, rail_numa: list[int], load: list[int], up: list[bool] | None = None) -> int | None:
    """Rail for a destination on ``dest_numa``: among the rails that are up, local ones first, then
    least load; None when no rail is up."""
    live = [r for r in range(len(rail_numa)) if up is None or up[r]]
    cands = [r for r in live if dest_numa >= 0 and rail_numa[r] == dest_numa] or live
    return min(cands, key=lambda r: (load[r], r)) if cands else None


def plan_reads(ops: np.ndarray, rail_numa: list[int], local_numa: list[int],
               lim: Limits = Limits(), *, outstanding: list[int] | None = None,
               channels: int = 1, up: list[bool] | None = None) -> Plan:
    """Plan one batch: ``ops`` (OP_DTYPE) over rails on ``rail_numa`` nodes.

    ``local_numa[j]`` is the NUMA node of local buffer ``j`` (-1 unknown);
    ``outstanding`` the bytes each rail already has in flight; ``up[r]`` whether rail ``r`` may
    carry reads (None: all may).
    """
    from peercache.transport.base import Status

    if not rail_numa:
        raise ValueError("a plan needs at least one rail")
    if channels < 1:
        raise ValueError(f"channels must be >= 1, got {channels}")
    if lim.max_sge < 1:
        raise ValueError(f"max_sge must be >= 1, got {lim.max_sge}")
    plan = Plan(load=list(outstanding) if outstanding is not None else [0] * len(rail_numa))
    length, local = _field(ops, "length"), _field(ops, "local_region")
    region, off, loff = _field(ops, "region"), _field(ops, "remote_offset"), _field(ops, "local_offset")
    for i, n in enumerate(length):
        if n == 0:
            plan.refused[i] = int(Status.ZERO_LENGTH)
        elif n > MAX_READ_BYTES:
            plan.refused[i] = int(Status.TOO_LARGE)
    keep = np.ones(len(ops), dtype=bool)
    keep[list(plan.refused)] = False
    k, cmax = signal_cadence(lim), chain_length(lim)
    rr = [0] * len(rail_numa)
    per_channel: dict[tuple[int, int], list[tuple[list[int], bool]]] = {}
    order: list[tuple[int, int]] = []
    for u in units(ops):
        u = [i for i in u if keep[i]]
        if not u:
            continue
        # The destination that decides: the unit's largest op (the payload, not the tag).
        big = max(u, key=lambda i: length[i])
        numa = local_numa[local[big]] if local[big] < len(local_numa) else -1
        rail = choose_rail(numa, rail_numa, plan.load, up)
        if rail is None:
            plan.refused.update({i: int(Status.CONNECTION) for i in u})
            continue
        ch = rr[rail] % channels
        rr[rail] += 1
        plan.load[rail] += sum(length[i] for i in u)
        key = (rail, ch)
        if key not in per_channel:
            per_channel[key] = []
            order.append(key)
        per_channel[key].extend((g, j > 0) for j, g in enumerate(work_requests(ops, u, lim.max_sge)))
    for rail, ch in order:
        groups = per_channel[(rail, ch)]
        for start in range(0, len(groups), cmax):
            chunk = groups[start:start + cmax]
            cid = len(plan.chains)
            ids = []
            for pos, (g, fence) in enumerate(chunk):
                sig = (pos + 1) % k == 0 or pos == len(chunk) - 1
                w = WorkRequest(index=len(plan.wrs), rail=rail, channel=ch, region=region[g[0]],
                                remote_offset=off[g[0]],
                                sges=tuple(Sge(i, local[i], loff[i], length[i]) for i in g),
                                signaled=sig, chain=cid, fence=fence)
                plan.wrs.append(w)
                ids.append(w.index)
            plan.chains.append(Chain(cid, rail, ch, tuple(ids)))
    return plan


def encode_wr_id(epoch: int, index: int) -> int:
    """wr_id of WR ``index`` posted in channel epoch ``epoch``."""
    if not 0 <= index < (1 << WR_INDEX_BITS):
        raise ValueError(f"WR index {index} does not fit {WR_INDEX_BITS} bits")
    return ((epoch & ((1 << EPOCH_BITS) - 1)) << WR_INDEX_BITS) | index


def decode_wr_id(wr_id: int) -> tuple[int, int]:
    """(epoch, WR index) of a wr_id."""
    return wr_id >> WR_INDEX_BITS, wr_id & ((1 << WR_INDEX_BITS) - 1)
