"""Read planner and completion accounting of the RDMA path (pure: no device needed), in their Python
oracles (tests/oracles: the rules of native/verbs_plan.c and native/verbs.c)."""
from __future__ import annotations

import numpy as np
import pytest

from peercache import tags
from peercache.rdma.completion import WC, wc_name, wc_status
from peercache.transport import base
from peercache.transport.base import OP_DTYPE, Status

from oracles import rdma_plan as P
from oracles.rdma_completion import account_channel, account_plan, op_statuses

H, T = tags.HEADER_BYTES, tags.TRAILER_BYTES


def slot_ops(slots):
    """Ops read_slots issues: per key (slot offset, length, capacity, dest offset)."""
    off, length, cap, dest = (np.array(c, dtype=np.uint64) for c in zip(*slots))
    ops, _ = base.slot_ops(np.full(len(slots), 1), np.full(len(slots), 7), off, length, cap,
                           np.arange(len(slots), dtype=np.uint64) * tags.TAG_BYTES, dest)
    return ops


def ops_of(rows):
    return np.array(rows, dtype=OP_DTYPE)


STRIDE = tags.slot_stride(4096)


# -------------------------------------------------------------------- units and scatter lists
def test_full_slot_is_one_read_with_three_entries():
    ops = slot_ops([(0, 4096, 4096, 0)])
    plan = P.plan_reads(ops, [0], [0, 0])
    assert len(plan.wrs) == 1
    w = plan.wrs[0]
    assert w.remote_offset == 0 and w.length == H + 4096 + T
    assert [(s.local, s.local_offset, s.length) for s in w.sges] == [(0, 0, H), (1, 0, 4096), (0, H, T)]
    assert w.signaled and not w.fence


def test_partial_slot_is_header_payload_read_then_trailer_read_on_one_channel():
    ops = slot_ops([(0, 1000, 4096, 0)])
    plan = P.plan_reads(ops, [0, 0], [0, 0])
    assert [len(w.sges) for w in plan.wrs] == [2, 1]
    hp, tr = plan.wrs
    assert hp.remote_offset == 0 and hp.length == H + 1000
    assert tr.remote_offset == H + 4096 and tr.length == T
    # The trailer must be read after the payload: same rail, same channel, later, fenced.
    assert (hp.rail, hp.channel) == (tr.rail, tr.channel) and hp.index < tr.index
    assert not hp.fence and tr.fence


def test_empty_object_is_header_and_trailer_in_one_unit():
    ops = slot_ops([(0, 0, 4096, 0), (STRIDE, 4096, 4096, 4096)])
    us = P.units(ops)
    assert us == [[0, 1], [2, 3, 4]]


def test_units_split_between_keys_even_when_slots_are_adjacent_and_ascending():
    ops = slot_ops([(k * STRIDE, 100, 4096, k * 4096) for k in range(4)])
    assert [len(u) for u in P.units(ops)] == [3, 3, 3, 3]


def test_descending_ops_start_new_units():
    ops = ops_of([(1, 1, 0, 1000, 10, 0), (1, 1, 0, 500, 10, 10), (1, 1, 0, 510, 10, 20)])
    assert P.units(ops) == [[0], [1, 2]]


def test_other_region_starts_new_unit():
    ops = ops_of([(1, 1, 0, 0, 10, 0), (2, 1, 0, 10, 10, 10)])
    assert P.units(ops) == [[0], [1]]


def test_scatter_list_is_capped_at_max_sge():
    ops = slot_ops([(0, 4096, 4096, 0)])
    plan = P.plan_reads(ops, [0], [0, 0], P.Limits(max_sge=2))
    assert [len(w.sges) for w in plan.wrs] == [2, 1]
    assert plan.wrs[1].remote_offset == H + 4096
    plan1 = P.plan_reads(ops, [0], [0, 0], P.Limits(max_sge=1))
    assert [w.length for w in plan1.wrs] == [H, 4096, T]


def test_zero_length_and_oversized_ops_are_refused_not_planned():
    ops = ops_of([(1, 1, 0, 0, 0, 0), (1, 1, 0, 0, P.MAX_READ_BYTES + 1, 0), (1, 1, 0, 64, 8, 0)])
    plan = P.plan_reads(ops, [0], [0, 0])
    assert plan.refused == {0: Status.ZERO_LENGTH, 1: Status.TOO_LARGE}
    assert [w.ops for w in plan.wrs] == [(2,)]


# ---------------------------------------------------------------------------------- rails
def test_rail_follows_numa_of_destination():
    ops = slot_ops([(k * STRIDE, 4096, 4096, k * 4096) for k in range(6)])
    plan = P.plan_reads(ops, rail_numa=[0, 0, 1, 1], local_numa=[0, 1])
    # The payload lands in buffer 1 on node 1: only rails 2 and 3 are used, balanced.
    assert {w.rail for w in plan.wrs} == {2, 3}
    assert [w.rail for w in plan.wrs].count(2) == 3


def test_rail_falls_back_to_all_when_none_is_local_or_numa_unknown():
    ops = slot_ops([(k * STRIDE, 4096, 4096, k * 4096) for k in range(4)])
    assert {w.rail for w in P.plan_reads(ops, [0, 0], [1, 1]).wrs} == {0, 1}
    assert {w.rail for w in P.plan_reads(ops, [0, 1], [-1, -1]).wrs} == {0, 1}


def test_rail_choice_prefers_least_outstanding_load():
    ops = slot_ops([(0, 4096, 4096, 0)])
    plan = P.plan_reads(ops, [0, 0, 0], [0, 0], outstanding=[10, 5, 7])
    assert plan.wrs[0].rail == 1
    assert plan.load == [10, 5 + H + 4096 + T, 7]


def test_load_balance_is_by_bytes_not_by_count():
    # One big and several small units: the small ones all go to the other rail.
    ops = ops_of([(1, 1, 0, 0, 1 << 20, 0)] + [(1, 1, 0, (2 << 20) + i * 4096, 64, 0) for i in range(5)])
    plan = P.plan_reads(ops, [0, 0], [0, 0])
    assert [w.rail for w in plan.wrs] == [0, 1, 1, 1, 1, 1]


def test_numa_then_load_tie_breaks_on_lowest_rail():
    assert P.choose_rail(1, [0, 1, 1], [0, 3, 3]) == 1
    assert P.choose_rail(1, [0, 1, 1], [0, 4, 3]) == 2
    assert P.choose_rail(-1, [0, 1], [5, 5]) == 0


def test_a_rail_that_is_down_carries_nothing_and_numa_falls_back_to_the_rails_up():
    ops = slot_ops([(k * STRIDE, 4096, 4096, k * 4096) for k in range(6)])
    plan = P.plan_reads(ops, [0, 0], [0, 0], up=[True, False])
    assert {w.rail for w in plan.wrs} == {0} and not plan.refused
    assert plan.load[1] == 0
    # The destination's NUMA node has only the rail that is down: the other node's rail takes it.
    assert P.choose_rail(1, [0, 1], [0, 0], [True, False]) == 0
    assert P.choose_rail(1, [0, 1, 1], [0, 9, 3], [True, True, False]) == 1
    assert P.choose_rail(0, [0, 1], [0, 0], [False, False]) is None


def test_no_rail_up_refuses_every_op_with_connection_and_plans_nothing():
    ops = slot_ops([(0, 1000, 4096, 0), (STRIDE, 0, 4096, 4096)])
    plan = P.plan_reads(ops, [0, 1], [0, 0], up=[False, False])
    assert plan.wrs == [] and plan.load == [0, 0]
    assert plan.refused == {i: Status.CONNECTION for i in range(len(ops))}


def test_channels_round_robin_per_rail():
    ops = slot_ops([(k * STRIDE, 4096, 4096, k * 4096) for k in range(4)])
    plan = P.plan_reads(ops, [0], [0, 0], channels=2)
    by_first_op = sorted((w.ops[0], w.channel) for w in plan.wrs)
    assert [c for _, c in by_first_op] == [0, 1, 0, 1]
    # WRs are numbered channel by channel: each channel's WRs are one posting sequence.
    assert [w.channel for w in plan.wrs] == [0, 0, 1, 1]


def test_plan_rejects_bad_arguments():
    ops = slot_ops([(0, 1, 8, 0)])
    with pytest.raises(ValueError, match="at least one rail"):
        P.plan_reads(ops, [], [0, 0])
    with pytest.raises(ValueError, match="channels"):
        P.plan_reads(ops, [0], [0, 0], channels=0)


# ------------------------------------------------------------------ chains and signalling
@pytest.mark.parametrize("lim,k,chain", [
    (P.Limits(sq_depth=256, max_rd_atom=16, signal_every=16, max_chain=64), 16, 64),
    (P.Limits(sq_depth=256, max_rd_atom=4, signal_every=16, max_chain=64), 4, 64),
    (P.Limits(sq_depth=16, max_rd_atom=16, signal_every=16, max_chain=64), 8, 8),
    (P.Limits(sq_depth=256, max_rd_atom=16, signal_every=5, max_chain=64), 5, 60),
    (P.Limits(sq_depth=2, max_rd_atom=1, signal_every=1, max_chain=64), 1, 1),
    (P.Limits(sq_depth=1, max_rd_atom=16, signal_every=16, max_chain=64), 1, 1),
])
def test_cadence_and_chain_length_bounded_by_queue_and_rd_atom(lim, k, chain):
    assert P.signal_cadence(lim) == k
    assert P.chain_length(lim) == chain
    assert P.chain_length(lim) % P.signal_cadence(lim) == 0


def test_chains_split_at_chain_length_and_signal_every_kth_and_last():
    lim = P.Limits(sq_depth=16, max_rd_atom=4, signal_every=16, max_chain=64)   # k=4, chain=8
    ops = ops_of([(1, 1, 0, i * 100, 10, i * 10) for i in range(19)])   # 19 single-op units
    plan = P.plan_reads(ops, [0], [0, 0], lim)
    assert [len(c.wrs) for c in plan.chains] == [8, 8, 3]
    sig = [w.signaled for w in plan.wrs]
    expect = [(p + 1) % 4 == 0 or p == len(c.wrs) - 1 for c in plan.chains for p in range(len(c.wrs))]
    assert sig == expect
    assert sum(sig) == 2 + 2 + 1
    # Never more unsignalled WRs in a row than the cadence allows.
    run = 0
    for s in sig:
        run = 0 if s else run + 1
        assert run < 4


def test_chains_are_per_channel_and_keep_posting_order():
    ops = slot_ops([(k * STRIDE, 100, 4096, k * 4096) for k in range(10)])
    plan = P.plan_reads(ops, [0, 0], [0, 0], P.Limits(sq_depth=8, max_rd_atom=2, max_chain=4), channels=2)
    for c in plan.chains:
        rails = {(plan.wrs[i].rail, plan.wrs[i].channel) for i in c.wrs}
        assert rails == {(c.rail, c.channel)}
        assert list(c.wrs) == sorted(c.wrs)
        assert plan.wrs[c.wrs[-1]].signaled
    # Every op is read exactly once.
    ops_read = sorted(op for w in plan.wrs for op in w.ops)
    assert ops_read == list(range(len(ops)))


# ---------------------------------------------------------------------------------- wr_id
@pytest.mark.parametrize("epoch,index", [(0, 0), (1, 5), (65535, (1 << 48) - 1), (70000, 12)])
def test_wr_id_round_trip(epoch, index):
    e, i = P.decode_wr_id(P.encode_wr_id(epoch, index))
    assert (e, i) == (epoch & 0xFFFF, index)
    assert P.encode_wr_id(epoch, index) < 1 << 64


def test_wr_id_refuses_index_overflow():
    with pytest.raises(ValueError):
        P.encode_wr_id(0, 1 << 48)


# ------------------------------------------------------------------- completion accounting
def C(idx, wc=WC.SUCCESS, epoch=3):
    return (P.encode_wr_id(epoch, idx), int(wc))


def test_signalled_success_retires_every_earlier_wr():
    r = account_channel([0, 1, 2, 3], [C(1), C(3)], epoch=3)
    assert r.status == [Status.OK] * 4 and not r.reset and r.reason is None


def test_missing_completion_is_a_timeout_and_resets_the_channel():
    r = account_channel([0, 1, 2, 3], [C(1)], epoch=3)
    assert r.status == [Status.OK, Status.OK, Status.CONNECTION, Status.CONNECTION]
    assert r.reset and "poll timeout" in r.reason


def test_remote_access_error_marks_that_wr_and_flushes_the_rest():
    r = account_channel([10, 11, 12, 13], [C(12, WC.REM_ACCESS_ERR), C(13, WC.WR_FLUSH_ERR)], epoch=3)
    assert r.status == [Status.OK, Status.OK, Status.BAD_REGION, Status.CONNECTION]
    assert r.reset and "IBV_WC_REM_ACCESS_ERR on WR 12" in r.reason
    assert r.ignored == 1


def test_retry_exceeded_is_connection():
    r = account_channel([0, 1], [C(0, WC.RETRY_EXC_ERR)], epoch=3)
    assert r.status == [Status.CONNECTION, Status.CONNECTION] and r.reset


def test_flush_without_prior_error_fails_unsignalled_wrs_before_it():
    r = account_channel([0, 1, 2, 3], [C(1), C(3, WC.WR_FLUSH_ERR)], epoch=3)
    assert r.status == [Status.OK, Status.OK, Status.CONNECTION, Status.CONNECTION]


def test_stale_epoch_and_duplicate_completions_are_ignored():
    r = account_channel([0, 1], [C(1, WC.REM_ACCESS_ERR, epoch=2), C(1), C(0)], epoch=3)
    assert r.status == [Status.OK, Status.OK] and not r.reset and r.ignored == 2


@pytest.mark.parametrize("wc,status", [
    (WC.SUCCESS, Status.OK), (WC.REM_ACCESS_ERR, Status.BAD_REGION),
    (WC.RETRY_EXC_ERR, Status.CONNECTION), (WC.RNR_RETRY_EXC_ERR, Status.CONNECTION),
    (WC.WR_FLUSH_ERR, Status.CONNECTION), (WC.LOC_PROT_ERR, Status.LOCAL_RANGE),
    (WC.LOC_LEN_ERR, Status.LOCAL_RANGE), (WC.REM_INV_REQ_ERR, Status.REFUSED),
    (WC.GENERAL_ERR, Status.CONNECTION), (99, Status.CONNECTION),
])
def test_error_mapping(wc, status):
    assert wc_status(wc) == status


def test_wc_names():
    assert wc_name(12) == "IBV_WC_RETRY_EXC_ERR" and wc_name(99) == "ibv_wc_status 99"


def test_op_statuses_take_the_failing_wr_of_each_op():
    ops = slot_ops([(0, 4096, 4096, 0), (STRIDE, 100, 4096, 4096)])
    plan = P.plan_reads(ops, [0], [0, 0])
    assert [w.ops for w in plan.wrs] == [(0, 1, 2), (3, 4), (5,)]
    st = op_statuses(plan, {0: Status.OK, 1: Status.OK, 2: Status.BAD_REGION}, len(ops))
    assert st == [Status.OK] * 5 + [Status.BAD_REGION]


def test_account_plan_over_two_rails_resets_only_the_failed_channel():
    ops = slot_ops([(k * STRIDE, 4096, 4096, k * 4096) for k in range(4)])
    plan = P.plan_reads(ops, [0, 0], [0, 0])
    by_ch = {}
    for w in plan.wrs:
        by_ch.setdefault((w.rail, w.channel), []).append(w.index)
    (a, wa), (b, wb) = sorted(by_ch.items())
    comps = {a: [C(wa[-1], epoch=9)], b: [C(wb[0], WC.REM_ACCESS_ERR, epoch=9)]}
    st, resets, reason = account_plan(plan, comps, 9, len(ops))
    assert resets == {b}
    bad = {op for i in wb for op in plan.wrs[i].ops}
    first_bad = set(plan.wrs[wb[0]].ops)
    for op in range(len(ops)):
        if op in first_bad:
            assert st[op] == Status.BAD_REGION
        elif op in bad:
            assert st[op] == Status.CONNECTION
        else:
            assert st[op] == Status.OK
    assert reason.startswith(f"rail {b[0]} channel {b[1]}")


def test_random_batches_read_every_op_once_in_ascending_order_per_unit():
    rng = np.random.default_rng(5)
    for trial in range(50):
        n = int(rng.integers(1, 40))
        caps = rng.choice([64, 4096], n)
        lens = [int(rng.integers(0, c + 1)) for c in caps]
        slots = rng.permutation(64)[:n]
        ops = slot_ops([(int(s) * tags.slot_stride(4096), l, int(c), i * 4096)
                        for i, (s, l, c) in enumerate(zip(slots, lens, caps))])
        lim = P.Limits(sq_depth=int(rng.integers(1, 64)), max_rd_atom=int(rng.integers(1, 17)),
                       max_sge=int(rng.integers(1, 4)), signal_every=int(rng.integers(1, 20)),
                       max_chain=int(rng.integers(1, 70)))
        plan = P.plan_reads(ops, [0, 1, 0], [int(rng.integers(-1, 2)), int(rng.integers(-1, 2))], lim,
                            channels=int(rng.integers(1, 4)))
        got = sorted(op for w in plan.wrs for op in w.ops)
        assert got == list(range(len(ops))), trial
        for u in P.units(ops):
            mine = [w for w in plan.wrs if set(w.ops) & set(u)]
            assert len({(w.rail, w.channel) for w in mine}) == 1
            # Only the first READ of a unit starts unfenced.
            assert [w.fence for w in mine] == [False] + [True] * (len(mine) - 1)
        for c in plan.chains:
            assert 1 <= len(c.wrs) <= P.chain_length(lim) and plan.wrs[c.wrs[-1]].signaled
        for w in plan.wrs:
            assert 1 <= len(w.sges) <= lim.max_sge
            # The scatter list covers one remote-contiguous range.
            assert w.remote_offset == int(ops["remote_offset"][w.ops[0]])
            assert sum(int(ops["length"][o]) for o in w.ops) == w.length
