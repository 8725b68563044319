"""Test oracle of the verbs backend's completion accounting: CQ entries of one channel -> per-WR
and per-op statuses.

RC completes the WRs of one QP in order, and an error completion is always
generated even for an unsignalled WR. So a successful signalled completion
retires every earlier WR of its channel, and a non-flush error at WR p means
the WRs before p succeeded and the ones after it were flushed. A flush
completion without an error before it (the QP was moved to ERR, or an
unreported fault) says nothing about the unsignalled WRs before it: they count
as failed. A channel that saw any error, or that did not complete within the
poll timeout, must be reset before it is used again. The native backend
(``poll_run`` in native/verbs.c) implements these rules; this Python copy is
what tests/engine/transport/test_rdma_plan.py checks them with. No production path uses it (the
status codes and their map, ``peercache.rdma.completion``, stay in the engine).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from peercache.rdma.completion import WC, wc_name, wc_status
from peercache.transport.base import Status

from .rdma_plan import EPOCH_BITS, Plan, decode_wr_id


@dataclass
class ChannelResult:
    """Outcome of one channel's WRs in one batch."""

    status: list[int]          #: Status per WR of the channel, in posting order
    reset: bool                #: the channel must be reset before reuse
    reason: str | None         #: first failure, for the error text
    ignored: int = 0           #: completions of another epoch or already retired


def account_channel(wr_indices: list[int], completions: Iterable[tuple[int, int]], epoch: int,
                    ) -> ChannelResult:
    """Statuses of a channel's WRs (plan indices, posting order) from its CQ entries.

    ``completions`` are ``(wr_id, ibv_wc_status)`` in CQ order; WRs with no
    completion by the end (the poll timed out) fail with CONNECTION.
    """
    n = len(wr_indices)
    pos = {w: p for p, w in enumerate(wr_indices)}
    st: list[int] = [int(Status.CONNECTION)] * n
    retired, reset, reason, ignored = -1, False, None, 0
    want = epoch & ((1 << EPOCH_BITS) - 1)
    for wr_id, wc in completions:
        e, idx = decode_wr_id(wr_id)
        p = pos.get(idx)
        if e != want or p is None or p <= retired or reset:
            ignored += 1     # stale epoch, unknown, duplicate, or after the channel failed
            continue
        if wc == WC.SUCCESS:
            for q in range(retired + 1, p + 1):
                st[q] = int(Status.OK)
            retired = p
            continue
        if wc != WC.WR_FLUSH_ERR:
            # A real error is reported in order, so everything before it succeeded.
            for q in range(retired + 1, p):
                st[q] = int(Status.OK)
        st[p] = int(wc_status(wc))
        reset, reason = True, f"{wc_name(wc)} on WR {idx}"
        retired = n - 1   # the rest stays CONNECTION (flushed)
    if retired < n - 1:
        reset = True
        reason = reason or f"{n - 1 - retired} WR(s) without a completion before the poll timeout"
    return ChannelResult(st, reset, reason, ignored)


def op_statuses(plan: Plan, wr_status: dict[int, int], n_ops: int) -> list[int]:
    """Per-op Status: refused ops keep their code; otherwise the first failing WR's."""
    out = [int(Status.OK)] * n_ops
    seen = [False] * n_ops
    for w in plan.wrs:
        s = wr_status.get(w.index, int(Status.CONNECTION))
        for op in w.ops:
            seen[op] = True
            if out[op] == Status.OK and s != Status.OK:
                out[op] = s
    for op, code in plan.refused.items():
        out[op] = code
        seen[op] = True
    for op in range(n_ops):
        if not seen[op]:
            out[op] = int(Status.CONNECTION)   # never planned: never read
    return out


def account_plan(plan: Plan, completions: dict[tuple[int, int], list[tuple[int, int]]], epoch: int,
                 n_ops: int) -> tuple[list[int], set[tuple[int, int]], str | None]:
    """Per-op statuses of a whole plan, the channels to reset, and the first reason."""
    wr_status: dict[int, int] = {}
    resets: set[tuple[int, int]] = set()
    reason = None
    chans = sorted({(w.rail, w.channel) for w in plan.wrs})
    for rc in chans:
        idx = [w.index for w in plan.wrs if (w.rail, w.channel) == rc]
        res = account_channel(idx, completions.get(rc, []), epoch)
        wr_status.update(zip(idx, res.status))
        if res.reset:
            resets.add(rc)
            reason = reason or f"rail {rc[0]} channel {rc[1]}: {res.reason}"
    return op_statuses(plan, wr_status, n_ops), resets, reason
