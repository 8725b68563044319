"""The native verbs backend: it builds here, and its planner and error map match the Python ones."""
from __future__ import annotations

import importlib
import os

import numpy as np
import pytest

from peercache import tags
from peercache.rdma.completion import WC, wc_status
from peercache.transport.base import OP_DTYPE, Status, slot_ops

from oracles import rdma_plan as P

pytestmark = pytest.mark.rdma    # also run in the Soft-RoCE guest by `make test-rdma`

HEADERS = os.path.exists("/usr/include/infiniband/verbs.h")


def verbs():
    if not HEADERS:
        pytest.skip("rdma-core headers absent (/usr/include/infiniband/verbs.h): the verbs backend "
                    "is not built; install libibverbs-dev and rebuild")
    try:
        return importlib.import_module("peercache._verbs")
    except ImportError as e:
        pytest.fail(f"infiniband/verbs.h is installed but peercache._verbs did not build/import: {e}; "
                    "run `pip install -e .` and read the compiler output")


def test_verbs_backend_builds_and_imports():
    v = verbs()
    assert v.OP_ITEMSIZE == OP_DTYPE.itemsize
    assert v.MAX_RAILS >= 8 and v.WR_INDEX_BITS == P.WR_INDEX_BITS
    native = importlib.import_module("peercache._native")
    assert hasattr(native, "adopt") and v.HANDOFF_CAPSULE == "peercache.backend_conn"


def test_native_status_map_matches_completion_accounting():
    v = verbs()
    assert v.wc_statuses() == [int(wc_status(code)) for code in range(WC.GENERAL_ERR + 1)]


@pytest.mark.parametrize("lim", [(256, 16, 3, 16, 64), (16, 4, 3, 16, 64), (2, 1, 1, 1, 64), (1, 16, 3, 16, 64),
                                 (256, 16, 3, 5, 64), (64, 8, 2, 3, 7)])
def test_native_cadence_and_chain_length_match(lim):
    v = verbs()
    L = P.Limits(*lim)
    assert v.limits(*lim) == (P.signal_cadence(L), P.chain_length(L))


def _slot_ops(rng, n):
    caps = rng.choice([64, 4096], n).astype(np.uint64)
    stride = tags.slot_stride(4096)
    slots = rng.permutation(max(n, 64))[:n].astype(np.uint64)
    lengths = np.array([int(rng.integers(0, int(c) + 1)) for c in caps], dtype=np.uint64)
    ii = np.arange(n, dtype=np.uint64)
    ops, _ = slot_ops(np.full(n, 1), np.full(n, 7), slots * np.uint64(stride), lengths, caps,
                      ii * tags.TAG_BYTES, ii * 4096)
    rows = ops.tolist()
    if rng.random() < 0.3:   # some arbitrary ops too: other regions, zero lengths, descending
        for _ in range(int(rng.integers(1, 6))):
            rows.append((int(rng.integers(1, 3)), int(rng.integers(0, 2)), 7, int(rng.integers(0, 1 << 20)),
                         int(rng.choice([0, 8, 100, 5000])), int(rng.integers(0, 1 << 16))))
    return np.array(rows, dtype=OP_DTYPE)


def test_native_planner_matches_python_planner_on_random_batches():
    v = verbs()
    rng = np.random.default_rng(11)
    for trial in range(300):
        ops = _slot_ops(rng, int(rng.integers(1, 48)))
        nr = int(rng.integers(1, 5))
        rail_numa = [int(x) for x in rng.integers(0, 2, nr)]
        local_numa = [int(x) for x in rng.integers(-1, 2, 2)]
        load = [int(x) for x in rng.integers(0, 10000, nr)]
        lim = P.Limits(int(rng.integers(1, 64)), int(rng.integers(1, 17)), int(rng.integers(1, 4)),
                       int(rng.integers(1, 20)), int(rng.integers(1, 70)))
        ch = int(rng.integers(1, 4))
        # Some rails down (every one of them, now and then): the failover's plans.
        up = None if trial % 3 == 0 else [bool(x) for x in rng.random(nr) < 0.6]
        want = P.plan_reads(ops, rail_numa, local_numa, lim, outstanding=load, channels=ch, up=up)
        wrs, refused, new_load = v.plan(ops, local_numa, rail_numa, load,
                                        (lim.sq_depth, lim.max_rd_atom, lim.max_sge, lim.signal_every,
                                         lim.max_chain), ch, up)
        got = [(w[0], w[1], w[2], w[3], w[4], bool(w[5]), w[6], tuple(w[7]), bool(w[8])) for w in wrs]
        exp = [(w.rail, w.channel, w.region, w.remote_offset, w.length, w.signaled, w.chain, w.ops, w.fence)
               for w in want.wrs]
        assert got == exp, f"trial {trial}: {lim} channels={ch} up={up}"
        assert new_load == want.load
        assert {i: r for i, r in enumerate(refused) if r >= 0} == want.refused


def test_native_planner_never_plans_onto_a_rail_that_is_down():
    v = verbs()
    rng = np.random.default_rng(3)
    lim = (256, 16, 3, 16, 64)
    seen = set()
    for trial in range(100):
        ops = _slot_ops(rng, int(rng.integers(1, 40)))
        nr = int(rng.integers(2, 5))
        up = [bool(x) for x in rng.random(nr) < 0.5]
        wrs, refused, load = v.plan(ops, [0, 1], [int(x) for x in rng.integers(0, 2, nr)], [0] * nr, lim, 2, up)
        used = {w[0] for w in wrs}
        assert used <= {r for r in range(nr) if up[r]}, (trial, up, used)
        assert all(load[r] == 0 for r in range(nr) if not up[r])
        conn = {i for i, s in enumerate(refused) if s == int(Status.CONNECTION)}
        planned = {o for w in wrs for o in w[7]}
        if any(up):
            assert not conn, (trial, up)
        else:
            assert not wrs and conn == {i for i in range(len(ops)) if ops["length"][i]}   # zero lengths: their own status
        seen.add(any(up))
        assert not (planned & conn)
    assert seen == {True, False}


def test_native_units_match_the_oracle():
    v = verbs()
    rng = np.random.default_rng(5)
    for trial in range(200):
        ops = _slot_ops(rng, int(rng.integers(1, 30)))
        want = [0] * len(ops)
        for k, u in enumerate(P.units(ops)):
            for i in u:
                want[i] = k
        assert v.units(ops) == want, trial


def test_opening_a_rail_without_a_device_names_what_is_missing():
    v = verbs()
    names, why = v.devices()
    if names:
        pytest.skip(f"this host has RDMA devices ({', '.join(names)}); the missing-device path is not reachable")
    with pytest.raises(OSError, match="no RDMA device: ibv_get_device_list returned 0 devices"):
        v.Rail("mlx5_0")
