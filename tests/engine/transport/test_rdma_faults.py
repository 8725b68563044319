"""What a real verbs stack finds: faults, races and limits of the rdma path on a device.

Run on a device (the Soft-RoCE guest of `make test-rdma`, or a NIC): a
producer restarting under a consumer that still caches its locations and
connection, QP errors in the middle of a batch, slots rewritten while they
are read (the seqlock tag over RDMA), more outstanding READs than the
device's max_qp_rd_atom, ports with different MTUs (and an MTU lowered under
a live connection), and the scatter-list slot reads at sizes around the MTU
and the page size on both rails. Every check is on exact bytes and statuses.
Only the planner invariant at the end runs without a device.
"""
from __future__ import annotations

import glob
import os
import subprocess
import threading
import time

import numpy as np
import pytest

from conftest import free_port, rdma_sides, scaled
from peercache import tags
from peercache.node import Get, Node
from peercache.transport.base import OP_DTYPE, Status, slot_ops

pytestmark = pytest.mark.rdma

OK, BAD, OOR, ZERO, CONN = (int(Status.OK), int(Status.BAD_REGION), int(Status.OUT_OF_RANGE),
                            int(Status.ZERO_LENGTH), int(Status.CONNECTION))
QPS_RTS = 3          # enum ibv_qp_state
MTU_ENUM = {256: 1, 512: 2, 1024: 3, 2048: 4, 4096: 5}


# ------------------------------------------------------------------------------ helpers
def _node(addr, devs, **kw) -> Node:
    opts = kw.pop("transport_options", {})
    # A read has rpc_timeout in all, every step included: in the guest (an emulated CPU, a writer
    # thread beside the reads) that bound stretches with the measured slowness, as every wait here does.
    kw.setdefault("rpc_timeout", scaled(5.0))
    return Node(addr, protocol="rdma", transport_options={"devices": list(devs), **opts}, **kw)


def _pattern(i: int, v: int, n: int) -> bytes:
    """n bytes of 8-byte words (key index << 32 | version): a torn copy mixes two words."""
    words = np.full((n + 7) // 8, (i << 32) | v, dtype=np.uint64)
    return words.view(np.uint8)[:n].tobytes()


def netdev_of(rdma_dev: str) -> str:
    """The netdev under an rxe (RoCE) device: sysfs gid_attrs, else the guest's naming rule."""
    for p in sorted(glob.glob(f"/sys/class/infiniband/{rdma_dev}/ports/1/gid_attrs/ndevs/*")):
        try:
            with open(p) as f:
                name = f.read().strip()
        except OSError:
            continue
        if name:
            return name
    if rdma_dev.startswith("rxe_") and len(rdma_dev) == 6:      # rxe_b1 -> pcg1b
        return f"pcg{rdma_dev[5]}{rdma_dev[4]}"
    pytest.skip(f"cannot tell the netdev of {rdma_dev}")


def rx_bytes(netdev: str) -> int:
    with open(f"/sys/class/net/{netdev}/statistics/rx_bytes") as f:
        return int(f.read())


def netdev_mtu(netdev: str) -> int:
    with open(f"/sys/class/net/{netdev}/mtu") as f:
        return int(f.read())


def set_mtu(netdev: str, mtu: int) -> None:
    r = subprocess.run(["ip", "link", "set", netdev, "mtu", str(mtu)], capture_output=True, text=True)
    assert r.returncode == 0, f"ip link set {netdev} mtu {mtu}: {r.stderr}"


def port_mtu(rdma_dev: str) -> int:
    """Active MTU (enum ibv_mtu) of port 1 as the device reports it now."""
    from pyverbs.device import Context
    ctx = Context(name=rdma_dev)
    try:
        return int(ctx.query_port(1).active_mtu)
    finally:
        ctx.close()


def wait_port_mtu(rdma_dev: str, want: int) -> None:
    deadline = time.monotonic() + scaled(5)
    while (got := port_mtu(rdma_dev)) != want:
        assert time.monotonic() < deadline, f"{rdma_dev}: active MTU {got}, expected {want}"
        time.sleep(0.05)


def count_stale(node: Node) -> list[int]:
    """Wrap the node's native read so every tag mismatch (torn or stale slot) is counted."""
    seen = [0]
    orig = node.reader.read_native

    def counting(*a):
        err, stale, other = orig(*a)
        seen[0] += len(stale)
        return err, stale, other

    node.reader.read_native = counting
    return seen


def _read_ops(locs, region=None) -> np.ndarray:
    """Payload ops of ``locs`` (one per key, into 8 KiB destination strides)."""
    ops = np.zeros(len(locs), dtype=OP_DTYPE)
    for i, l in enumerate(locs):
        ops[i] = (l.region if region is None else region, 1, l.rkey, l.offset + tags.HEADER_BYTES,
                  l.length, i * 8192)
    return ops


#: Discovery expires a node that stopped heartbeating after this long (its default).
HEARTBEAT_TIMEOUT_S = 5.0


# ------------------------------------------------ 1. producer restart: stale keys, stale QPs
@pytest.mark.parametrize("leave", [True, False], ids=["left", "vanished"])
def test_producer_restart_under_cached_locations_never_returns_stale_bytes(leave):
    """The consumer keeps the old producer's locations (TTL) and connection; the new one has new
    MRs, rkeys and capability keys but the very same slots, generations and lengths."""
    prod_devs, cons_devs = rdma_sides()
    addr = f"127.0.0.1:{free_port()}"
    cons = _node(addr, cons_devs[:1], host_discovery=True, dir_cache_ttl=600, name="cons", max_channels=2)
    p1 = p2 = None
    try:
        p1 = _node(addr, prod_devs[:1], pool_slots=16, slot_capacity=8192, name="prod1")
        rng = np.random.default_rng(1)
        sizes = [8192, 1, 100, 4096, 8191, 0, 5000, 1024]
        keys = [f"r{i}".encode() for i in range(len(sizes))]
        v1 = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in sizes]
        v2 = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in sizes]
        assert all(a != b for a, b in zip(v1, v2) if a)
        p1.put_batch(keys, v1)
        dest = np.zeros(len(keys) * 8192, dtype=np.uint8)
        offs = np.arange(len(keys), dtype=np.uint64) * 8192
        r = cons.get_batch_into(keys, dest, offs)
        assert (r.status == Get.HIT).all(), r.error
        assert all(bytes(dest[i * 8192: i * 8192 + len(v)]) == v for i, v in enumerate(v1))
        old_id, old_rkey = p1.node_id, p1.pool.rkey
        p1.close(leave=leave)
        p1 = None
        p2 = _node(addr, prod_devs[:1], pool_slots=16, slot_capacity=8192, name="prod2")
        refs = p2.put_batch(keys, v2)
        assert p2.node_id != old_id and p2.pool.rkey != old_rkey
        assert [x.generation for x in refs] == [1] * len(keys)      # same tags as before the restart
        rounds = []
        # A producer that left gives its keys up at once. One that vanished still owns them until
        # discovery expires it (only an entry's owner may overwrite it); the new producer's refused
        # publishes are retried on its heartbeats, so the GETs recover after that, never with old bytes.
        deadline = time.monotonic() + (0 if leave else scaled(3 * HEARTBEAT_TIMEOUT_S))
        while True:
            dest[:] = 0xEE
            t0 = time.monotonic()
            r = cons.get_batch_into(keys, dest, offs)
            took = time.monotonic() - t0
            assert took < scaled(10), f"a GET took {took:.1f}s after the restart"
            rounds.append([Get(s).name for s in r.status])
            for i, v in enumerate(v2):
                if r.status[i] == Get.HIT:
                    got = bytes(dest[i * 8192: i * 8192 + len(v)])
                    assert got != v1[i] or not v, f"key {i}: the old producer's bytes after the restart"
                    assert got == v and r.lengths[i] == len(v), f"key {i}: wrong bytes"
            if (r.status == Get.HIT).all() or (len(rounds) >= 4 and time.monotonic() > deadline):
                break
            if not leave:
                time.sleep(0.5)
        assert rounds[-1] == ["HIT"] * len(keys), rounds
        if leave:
            assert len(rounds) <= 2, f"took {len(rounds)} GETs to recover: {rounds}"
        assert r.error is None, r.error
        # The new connection is to the new producer, with its keys.
        info = cons.transport.connection_info(p2.node_id)
        assert info and all(q["state"] == QPS_RTS for q in info)
    finally:
        for n in (cons, p1, p2):
            if n is not None:
                n.close()


# --------------------------------------------------------------- 2. QP errors mid-batch
@pytest.fixture
def pair2():
    """A producer (hosting discovery) and a consumer on the first rail."""
    prod_devs, cons_devs = rdma_sides()
    addr = f"127.0.0.1:{free_port()}"
    prod = _node(addr, prod_devs[:1], host_discovery=True, pool_slots=32, slot_capacity=8192, name="prod")
    cons = None
    try:
        cons = _node(addr, cons_devs[:1], name="cons", max_channels=2)
        yield prod, cons
    finally:
        if cons is not None:
            cons.close()
        prod.close()


def _fill(prod, n, size=4000):
    rng = np.random.default_rng(n)
    keys = [f"m{i}".encode() for i in range(n)]
    vals = [rng.integers(0, 256, size, dtype=np.uint8).tobytes() for _ in keys]
    prod.put_batch(keys, vals)
    return keys, vals


def _fault_peer(cons, prod, regions, tag):
    info = cons.peer_infos.data_endpoint(prod.node_id)
    return cons.transport._connect(prod.node_id, info, regions=regions, tag=tag)


def _run(cons, peer, ops, nbytes):
    dest = np.full(nbytes, 0xEE, dtype=np.uint8)
    cons.transport.prepare_local(dest)
    status = np.full(len(ops), -1, dtype=np.int32)
    t0 = time.monotonic()
    err = peer.read_batch(ops, [np.zeros(64, np.uint8), dest], status)
    assert time.monotonic() - t0 < scaled(10), "a failing batch must end within the poll timeout"
    return err, status, dest


@pytest.mark.parametrize("fault", ["bad-rkey", "beyond-mr"])
def test_qp_error_mid_batch_exact_statuses_then_reset(pair2, fault):
    """Op 5 of 12 fails in the NIC (a wrong hardware rkey, or a range past the end of the MR that the
    connection's region table wrongly allows): 0-4 read exactly, 5 is BAD_REGION, 6-11 flushed."""
    prod, cons = pair2
    keys, vals = _fill(prod, 12)
    locs = cons.lookup(keys)

    def regions(regs):
        rid, cap, size, keys_ = regs[0]
        if fault == "bad-rkey":
            return regs + [(9, cap, size, [(a, rk ^ 0x5A5A00) for a, rk in keys_])]
        return regs + [(9, cap, size + (1 << 20), keys_)]     # claims 1 MiB the MR does not have

    peer = _fault_peer(cons, prod, regions, f"fault-{fault}")
    ops = _read_ops(locs)
    ops[5]["region"] = 9
    if fault == "beyond-mr":
        ops[5]["remote_offset"] = prod.pool.size + 4096
    err, status, dest = _run(cons, peer, ops, 12 * 8192)
    assert err and "remote access error" in err.lower(), err
    assert status.tolist() == [OK] * 5 + [BAD] + [CONN] * 6
    for i in range(5):
        assert bytes(dest[i * 8192: i * 8192 + 4000]) == vals[i]
    assert not peer.alive()
    status[:] = -1
    assert peer.read_batch(ops, [np.zeros(64, np.uint8), dest], status)    # refused fast
    assert (status == CONN).all()
    peer.close()
    # The node's own connection was never touched (another consumer id at the producer): exact.
    dest2 = np.zeros(12 * 8192, dtype=np.uint8)
    r = cons.get_batch_into(keys, dest2, np.arange(12, dtype=np.uint64) * 8192)
    assert r.error is None and (r.status == Get.HIT).all()
    assert all(bytes(dest2[i * 8192: i * 8192 + 4000]) == v for i, v in enumerate(vals))


def test_refused_ops_mid_batch_leave_the_connection_up(pair2):
    """Ops the connection refuses before posting (wrong capability key, range outside the region,
    zero length) fail alone: the QP sees only the good ones, and stays usable."""
    prod, cons = pair2
    keys, vals = _fill(prod, 12)
    locs = cons.lookup(keys)
    peer = _fault_peer(cons, prod, None, "refused")
    ops = _read_ops(locs)
    ops[3]["rkey"] ^= 1
    ops[7]["remote_offset"] = prod.pool.size - 100        # 4000 bytes from 100 before the end
    ops[9]["length"] = 0
    want = [OK] * 12
    want[3], want[7], want[9] = BAD, OOR, ZERO
    for _ in range(2):
        err, status, dest = _run(cons, peer, ops, 12 * 8192)
        assert status.tolist() == want, err
        for i in (0, 1, 2, 4, 5, 6, 8, 10, 11):
            assert bytes(dest[i * 8192: i * 8192 + 4000]) == vals[i]
        assert peer.alive()
    peer.close()


def test_qp_error_on_one_rail_mid_batch_keeps_the_other_rail_exact():
    prod_devs, cons_devs = rdma_sides()
    if len(prod_devs) < 2 or len(cons_devs) < 2:
        pytest.skip("needs 2 RDMA devices per side")
    addr = f"127.0.0.1:{free_port()}"
    prod = _node(addr, prod_devs[:2], host_discovery=True, pool_slots=32, slot_capacity=8192, name="prod")
    cons = None
    try:
        cons = _node(addr, cons_devs[:2], name="cons")
        keys, vals = _fill(prod, 16)
        locs = cons.lookup(keys)

        def regions(regs):
            rid, cap, size, keys_ = regs[0]
            return regs + [(9, cap, size, [(a, rk ^ 0x5A5A00) for a, rk in keys_])]

        peer = _fault_peer(cons, prod, regions, "fault-2rails")
        ops = _read_ops(locs)
        ops[7]["region"] = 9
        err, status, dest = _run(cons, peer, ops, 16 * 8192)
        st = status.tolist()
        assert err and "remote access error" in err.lower(), err
        # Everything before the bad op succeeded on its rail; after it, the failing rail's ops are
        # flushed and the other rail's read fine. A status OK always means exact bytes.
        assert st[:7] == [OK] * 7 and st[7] == BAD, st
        assert set(st[8:]) == {OK, CONN}, st
        for i, s in enumerate(st):
            if s == OK:
                assert bytes(dest[i * 8192: i * 8192 + 4000]) == vals[i], i
        assert not peer.alive()
        peer.close()
        r = cons.get_batch_into(keys, dest, np.arange(16, dtype=np.uint64) * 8192)
        assert r.error is None and (r.status == Get.HIT).all()
    finally:
        if cons is not None:
            cons.close()
        prod.close()


# --------------------------------------------------- 3. slots rewritten while read (seqlock)
def _check_hit(dest, i, stride, n, lens_of_version):
    page = dest[i * stride: i * stride + n]
    words = page[: n // 8 * 8].view(np.uint64)
    assert n >= 8, n
    w0 = int(words[0])
    key, v = w0 >> 32, w0 & 0xFFFFFFFF
    ok = key == i and (words == w0).all() and bytes(page) == _pattern(i, v, n) and n == lens_of_version(i, v)
    return ok, v


def test_slots_rewritten_in_place_while_read_over_both_rails():
    """Adjacent slots (capacity + TAG_BYTES a multiple of 64, so one slot's trailer touches the next
    header), partial objects, two rails: a writer rewrites every key in place while the consumer
    reads them; every HIT is exactly one complete version, and the one its generation names."""
    prod_devs, cons_devs = rdma_sides()
    nr = min(2, len(prod_devs), len(cons_devs))
    cap, n = 4096 - tags.TAG_BYTES, 8
    assert tags.slot_stride(cap) == tags.HEADER_BYTES + cap + tags.TRAILER_BYTES
    lens = [4000, 3000, cap, 2040]

    def length(i, v):
        return lens[(i + v) % len(lens)]

    addr = f"127.0.0.1:{free_port()}"
    prod = _node(addr, prod_devs[:nr], host_discovery=True, pool_slots=n, slot_capacity=cap, name="prod")
    cons = None
    stop = threading.Event()
    versions: dict[tuple[int, int], int] = {}
    failure: list[BaseException] = []
    try:
        cons = _node(addr, cons_devs[:nr], name="cons", max_channels=2)
        keys = [f"t{i}".encode() for i in range(n)]
        refs = prod.put_batch(keys, [_pattern(i, 0, length(i, 0)) for i in range(n)])
        assert [x.slot for x in refs] == list(range(n))   # batch order = slot order: adjacent reads
        for i, x in enumerate(refs):
            versions[(i, x.generation)] = 0

        def writer():
            v = 0
            try:
                while not stop.is_set():
                    v += 1
                    out = prod.put_batch(keys, [_pattern(i, v, length(i, v)) for i in range(n)])
                    for i, x in enumerate(out):
                        versions[(i, x.generation)] = v
            except BaseException as e:   # surfaced below
                failure.append(e)

        stale = count_stale(cons)
        th = threading.Thread(target=writer, daemon=True)
        th.start()
        dest = np.zeros(n * cap, dtype=np.uint8)
        offs = np.arange(n, dtype=np.uint64) * cap
        hits = misses = 0
        wrong: list[str] = []
        seen: list[tuple[int, int, int]] = []
        deadline = time.monotonic() + scaled(1.2)   # ~1000 batches in the guest: the old planner tore ~1 in 300
        loops = 0
        while time.monotonic() < deadline and loops < 3000:
            loops += 1
            r = cons.get_batch_into(keys, dest, offs)
            assert r.errors == 0, r.error
            for i in range(n):
                if r.status[i] != Get.HIT:
                    misses += 1
                    continue
                hits += 1
                ok, v = _check_hit(dest, i, cap, int(r.lengths[i]), length)
                if not ok:
                    wrong.append(f"loop {loops} key {i}: torn/foreign bytes (first word {dest[i*cap:i*cap+8].view(np.uint64)[0]:#x}, "
                                 f"length {int(r.lengths[i])})")
                seen.append((i, int(r.generations[i]), v))
        stop.set()
        th.join(scaled(10))
        assert not failure, failure
        assert not wrong, f"{len(wrong)} wrong HITs of {hits} (stale tags caught: {stale[0]}): {wrong[:5]}"
        assert all(versions[(i, g)] == v for i, g, v in seen), "a HIT's bytes are not its generation's"
        assert hits > 0, f"no HIT in {loops} batches ({misses} misses, {stale[0]} tag mismatches)"
        kicks = sum(r["doorbell_kicks"] for r in cons.transport.rail_info())
        print(f"rewrites: {loops} batches, {hits} hits, {misses} misses, {stale[0]} tag mismatches caught, "
              f"{kicks} Soft-RoCE doorbells")
    finally:
        stop.set()
        if cons is not None:
            cons.close()
        prod.close()


def test_slots_evicted_and_removed_while_read():
    """More keys than slots: a writer puts random keys (evicting others into their slots) and
    removes some, while the consumer (with a location cache) reads all of them; a HIT is always
    the pattern of exactly that key and generation."""
    prod_devs, cons_devs = rdma_sides()
    nr = min(2, len(prod_devs), len(cons_devs))
    cap, nslots, nkeys = 2048, 8, 12
    addr = f"127.0.0.1:{free_port()}"
    prod = _node(addr, prod_devs[:nr], host_discovery=True, pool_slots=nslots, slot_capacity=cap, name="prod")
    cons = None
    stop = threading.Event()
    failure: list[BaseException] = []

    def fill(view, ref):
        tags.fill_pattern(view, ref.key_hash, ref.generation)

    try:
        cons = _node(addr, cons_devs[:nr], name="cons", dir_cache_ttl=30)
        keys = [f"e{i}".encode() for i in range(nkeys)]
        prod.put_batch(keys[:nslots], fill=fill)

        def writer():
            rng = np.random.default_rng(7)
            try:
                while not stop.is_set():
                    pick = [keys[int(j)] for j in rng.choice(nkeys, 3, replace=False)]
                    prod.put_batch(pick, fill=fill)
                    if rng.random() < 0.2:
                        prod.remove_batch([keys[int(rng.integers(nkeys))]])
            except BaseException as e:
                failure.append(e)

        stale = count_stale(cons)
        th = threading.Thread(target=writer, daemon=True)
        th.start()
        khash = np.array([tags.key_hash(k) for k in keys], dtype=np.uint64)
        dest = np.zeros(nkeys * cap, dtype=np.uint8)
        offs = np.arange(nkeys, dtype=np.uint64) * cap
        hits = misses = wrong = loops = 0
        deadline = time.monotonic() + scaled(0.8)
        while time.monotonic() < deadline and loops < 3000:
            loops += 1
            r = cons.get_batch_into(keys, dest, offs)
            assert r.errors == 0, r.error
            hit = np.flatnonzero(r.status == Get.HIT)
            misses += nkeys - len(hit)
            hits += len(hit)
            assert (r.lengths[hit] == cap).all()
            good = tags.verify_patterns(dest.reshape(nkeys, cap)[hit], khash[hit], r.generations[hit])
            wrong += int((~good).sum())
        stop.set()
        th.join(scaled(10))
        assert not failure, failure
        assert wrong == 0, f"{wrong} wrong HITs of {hits} ({stale[0]} tag mismatches caught)"
        assert hits > 0 and misses + stale[0] > 0, (hits, misses, stale[0])
        print(f"evictions: {loops} batches, {hits} hits, {misses} misses, {stale[0]} tag mismatches caught")
    finally:
        stop.set()
        if cons is not None:
            cons.close()
        prod.close()


# ---------------------------------------------------------------- 4. max_qp_rd_atom
def test_many_more_outstanding_reads_than_max_qp_rd_atom():
    from pyverbs.device import Context
    prod_devs, cons_devs = rdma_sides()
    addr = f"127.0.0.1:{free_port()}"
    ctx = Context(name=cons_devs[0])
    try:
        dev = ctx.query_device()
        rd, init_rd = int(dev.max_qp_rd_atom), int(dev.max_qp_init_rd_atom)
    finally:
        ctx.close()
    n = 512
    prod = _node(addr, prod_devs[:1], host_discovery=True, pool_slots=n, slot_capacity=64, name="prod")
    cons = None
    try:
        cons = _node(addr, cons_devs[:1], name="cons", max_channels=1, transport_options={"sq_depth": 1024})
        info = cons.transport.rail_info()[0]
        assert (info["max_qp_rd_atom"], info["max_qp_init_rd_atom"]) == (rd, init_rd)
        keys = [f"q{i}".encode() for i in range(n)]
        # Full slots are one READ each, partial ones two (header+payload, then the trailer).
        vals = [_pattern(i, 1, 64 if i % 2 else 40) for i in range(n)]
        prod.put_batch(keys, vals)
        dest = np.zeros(n * 64, dtype=np.uint8)
        offs = np.arange(n, dtype=np.uint64) * 64
        for rnd in range(2):
            dest[:] = 0
            r = cons.get_batch_into(keys, dest, offs)
            assert r.error is None and (r.status == Get.HIT).all(), (rnd, r.error)
            for i, v in enumerate(vals):
                assert bytes(dest[i * 64: i * 64 + len(v)]) == v, i
            if rnd == 0:
                h = cons.transport.handles._handles[prod.node_id]
        assert cons.transport.handles._handles[prod.node_id] is h and h.alive()   # no reset
        qps = cons.transport.connection_info(prod.node_id)
        assert len(qps) == 1 and qps[0]["state"] == QPS_RTS
        q = qps[0]
        assert 1 <= q["max_rd_atomic"] <= init_rd, q
        # One QP, 768 READs, a send queue of >= 1024: far more posted than the QP may have out.
        assert q["max_send_wr"] >= 1024 and 768 >= 4 * q["max_rd_atomic"], q
        acc = [qs for c, qs in prod.transport.accepted_info().items()]
        assert acc and all(1 <= x["max_dest_rd_atomic"] <= rd for qs in acc for x in qs), acc
        assert q["max_rd_atomic"] <= min(x["max_dest_rd_atomic"] for x in acc[-1])
    finally:
        if cons is not None:
            cons.close()
        prod.close()


# ------------------------------------------------------------------------- 5. MTU
def _last_rail():
    prod_devs, cons_devs = rdma_sides()
    pa, cb = prod_devs[-1], cons_devs[-1]
    return pa, cb, netdev_of(pa), netdev_of(cb)


@pytest.fixture
def mtu_guard():
    """The last rail's netdevs, their MTUs restored afterwards (rxe's MTU follows the netdev)."""
    pa, cb, na, nb = _last_rail()
    if os.geteuid() != 0:
        pytest.skip("changing a netdev's MTU needs root")
    orig = {na: netdev_mtu(na), nb: netdev_mtu(nb)}
    try:
        yield pa, cb, na, nb
    finally:
        for dev, m in orig.items():
            set_mtu(dev, m)


def _mtu_pages():
    rng = np.random.default_rng(5)
    sizes = [16384, 5000, 4097, 1025, 4096, 1024, 9000]
    return sizes, [rng.integers(0, 256, s, dtype=np.uint8).tobytes() for s in sizes]


def _read_exact(cons, keys, vals, stride=16384):
    dest = np.full(len(keys) * stride, 0xEE, dtype=np.uint8)
    r = cons.get_batch_into(keys, dest, np.arange(len(keys), dtype=np.uint64) * stride)
    for i, v in enumerate(vals):
        if r.status[i] == Get.HIT:
            assert bytes(dest[i * stride: i * stride + len(v)]) == v, i
    return r


@pytest.mark.parametrize("mtus", [(4200, 1500), (1500, 4200)], ids=["producer-4096", "consumer-4096"])
def test_ports_with_different_mtus_use_the_smaller(mtu_guard, mtus):
    pa, cb, na, nb = mtu_guard
    set_mtu(na, mtus[0])
    set_mtu(nb, mtus[1])
    wait_port_mtu(pa, MTU_ENUM[4096] if mtus[0] == 4200 else MTU_ENUM[1024])
    wait_port_mtu(cb, MTU_ENUM[4096] if mtus[1] == 4200 else MTU_ENUM[1024])
    addr = f"127.0.0.1:{free_port()}"
    prod = _node(addr, [pa], host_discovery=True, pool_slots=8, slot_capacity=16384, name="prod")
    cons = None
    try:
        cons = _node(addr, [cb], name="cons")
        sizes, vals = _mtu_pages()
        keys = [f"u{i}".encode() for i in range(len(sizes))]
        prod.put_batch(keys, vals)
        before = rx_bytes(nb)
        r = _read_exact(cons, keys, vals)
        assert r.error is None and (r.status == Get.HIT).all(), r.error
        assert rx_bytes(nb) - before >= sum(sizes)
        qps = cons.transport.connection_info(prod.node_id)
        assert qps and {q["path_mtu_bytes"] for q in qps} == {1024}, qps
        acc = prod.transport.accepted_info()
        assert acc and {q["path_mtu_bytes"] for qs in acc.values() for q in qs} == {1024}, acc
    finally:
        if cons is not None:
            cons.close()
        prod.close()


def test_mtu_lowered_under_a_live_connection_recovers_at_the_new_mtu(mtu_guard):
    """Both ends at 4096, connected; then the consumer's netdev drops to 1500 (rxe: 1024). The
    connection made at 4096 fails (its responses no longer fit the link); the reconnection must
    negotiate the MTU the ports have now, not the one cached when the rail was opened."""
    pa, cb, na, nb = mtu_guard
    set_mtu(na, 4200)
    set_mtu(nb, 4200)
    wait_port_mtu(pa, MTU_ENUM[4096])
    wait_port_mtu(cb, MTU_ENUM[4096])
    addr = f"127.0.0.1:{free_port()}"
    prod = _node(addr, [pa], host_discovery=True, pool_slots=8, slot_capacity=16384, name="prod",
                 transport_options={"timeout_s": 3.0})
    cons = None
    try:
        cons = _node(addr, [cb], name="cons", transport_options={"timeout_s": 3.0})
        sizes, vals = _mtu_pages()
        keys = [f"w{i}".encode() for i in range(len(sizes))]
        prod.put_batch(keys, vals)
        r = _read_exact(cons, keys, vals)
        assert r.error is None and (r.status == Get.HIT).all(), r.error
        assert {q["path_mtu_bytes"] for q in cons.transport.connection_info(prod.node_id)} == {4096}
        set_mtu(nb, 1500)
        wait_port_mtu(cb, MTU_ENUM[1024])
        rail = cons.transport.rail_info()[0]
        assert (rail["mtu"], rail["mtu_bytes"]) == (MTU_ENUM[1024], 1024), rail
        rounds = []
        for _ in range(3):
            t0 = time.monotonic()
            r = _read_exact(cons, keys, vals)
            assert time.monotonic() - t0 < scaled(10)
            rounds.append([Get(s).name for s in r.status])
            if (r.status == Get.HIT).all():
                break
        assert rounds[-1] == ["HIT"] * len(keys) and len(rounds) <= 2, rounds
        assert {q["path_mtu_bytes"] for q in cons.transport.connection_info(prod.node_id)} == {1024}
    finally:
        if cons is not None:
            cons.close()
        prod.close()


# ------------------------------------------- 6. slot reads as scatter lists, sizes, both rails
@pytest.mark.parametrize("cap", [16384, 4096 - tags.TAG_BYTES], ids=["cap16k", "cap-adjacent"])   # + tags = 4 KiB
def test_slot_reads_at_sizes_around_mtu_and_page_on_both_rails(cap):
    prod_devs, cons_devs = rdma_sides()
    nr = min(2, len(prod_devs), len(cons_devs))
    sizes = sorted({s for s in [0, 1, 7, 8, 9, 31, 32, 33, 63, 64, 65, 991, 992, 1023, 1024, 1025, 2047, 2048,
                                2049, 4023, 4024, 4047, 4048, 4055, 4056, 4063, 4064, 4095, 4096, 4097, 8191, 8192,
                                8193, 12288,
                                cap - 1, cap] if s <= cap})
    n = len(sizes)
    addr = f"127.0.0.1:{free_port()}"
    prod = _node(addr, prod_devs[:nr], host_discovery=True, pool_slots=n, slot_capacity=cap, name="prod")
    cons = None
    try:
        cons = _node(addr, cons_devs[:nr], name="cons", max_channels=2)
        rng = np.random.default_rng(cap)
        keys = [f"s{i}".encode() for i in range(n)]
        vals = [rng.integers(0, 256, s, dtype=np.uint8).tobytes() for s in sizes]
        prod.put_batch(keys, vals)
        netdevs = [netdev_of(d) for d in cons_devs[:nr]]
        rx0 = [rx_bytes(d) for d in netdevs]
        # Unaligned, packed destinations: nothing may be written outside each object's bytes.
        span = cap + 13
        offs = np.array([i * span + (i * 7) % 13 for i in range(n)], dtype=np.uint64)
        orders = [np.arange(n), np.arange(n)[::-1], rng.permutation(n), rng.permutation(n)]
        for order in orders:
            k = [keys[i] for i in order]
            dest = np.full(n * span + 64, 0xEE, dtype=np.uint8)
            want = dest.copy()
            for j, i in enumerate(order):
                want[offs[j]: offs[j] + sizes[i]] = np.frombuffer(vals[i], dtype=np.uint8)
            r = cons.get_batch_into(k, dest, offs)
            assert r.error is None and (r.status == Get.HIT).all(), (r.error, r.status)
            assert r.lengths.tolist() == [sizes[i] for i in order]
            bad = [sizes[i] for j, i in enumerate(order)
                   if not np.array_equal(dest[offs[j]: offs[j] + sizes[i] + 13], want[offs[j]: offs[j] + sizes[i] + 13])]
            assert not bad, f"wrong bytes for sizes {bad}"
            assert np.array_equal(dest, want)
        total = len(orders) * sum(sizes)
        moved = [rx_bytes(d) - b for d, b in zip(netdevs, rx0)]
        assert sum(moved) >= total, (moved, total)
        if nr == 2:
            # Both rails really carried READ responses (the planner balances bytes).
            assert min(moved) >= total // 5, f"rx bytes per rail {dict(zip(netdevs, moved))} of {total}"
    finally:
        if cons is not None:
            cons.close()
        prod.close()


# ------------------------------------------- 7. payload checks after the READ (integrity, bench pattern)
def test_integrity_and_pattern_checks_run_after_the_read_over_rdma():
    """Over rdma the bytes land by DMA; the checksum and the bench pattern are checked in the same
    native pass as the tag, after the READ completes: a payload changed under its tag is a miss with
    integrity, a reported content mismatch with the pattern check, and a plain hit with neither."""
    prod_devs, cons_devs = rdma_sides()
    addr = f"127.0.0.1:{free_port()}"
    prod = _node(addr, prod_devs[:1], host_discovery=True, pool_slots=8, slot_capacity=8192, name="prod",
                 integrity=True)
    cons = plain = None
    try:
        cons = _node(addr, cons_devs[:1], name="cons", integrity=True)
        plain = _node(addr, cons_devs[:1], name="plain")
        keys = [f"i{i}".encode() for i in range(6)]

        def fill(view, ref):
            tags.fill_pattern(view, ref.key_hash, ref.generation)

        prod.put_batch(keys, fill=fill)
        dest = np.zeros(6 * 8192, np.uint8)
        offs = np.arange(6, dtype=np.uint64) * 8192
        r = cons.get_batch_into(keys, dest, offs, check_pattern=True)
        assert (r.status == Get.HIT).all() and r.content_mismatch.tolist() == [], (r.status, r.error)
        ref = prod.pool.ref(keys[3])
        prod.pool.bytes[ref.offset + tags.HEADER_BYTES + 5000] ^= 0x10      # under the tag: seq untouched
        r = cons.get_batch_into(keys, dest, offs, check_pattern=True)
        assert r.status.tolist() == [Get.HIT] * 3 + [Get.MISS] + [Get.HIT] * 2
        assert cons.integrity_failures == 1
        r = plain.get_batch_into(keys, dest, offs, check_pattern=True)    # integrity off: only the pattern sees it
        assert (r.status == Get.HIT).all() and r.content_mismatch.tolist() == [3]
        r = plain.get_batch_into(keys, dest, offs)
        assert (r.status == Get.HIT).all() and r.content_mismatch.tolist() == []
    finally:
        for n in (plain, cons):
            if n is not None:
                n.close()
        prod.close()


# ------------------------------------------- the planner invariant behind the seqlock (no device)
@pytest.mark.parametrize("cap", [4096 - tags.TAG_BYTES, 4096, 8192 - tags.TAG_BYTES, 24])   # adjacent slots
def test_every_trailer_is_read_after_its_payload_on_the_same_qp(cap):
    """The native planner on the ops read_slots issues for slots in ascending order: each slot's
    trailer READ is on the QP of its payload, posted after it and fenced (or in the same READ)."""
    verbs = pytest.importorskip("peercache._verbs")
    stride = tags.slot_stride(cap)
    rng = np.random.default_rng(cap)
    for trial in range(40):
        n = int(rng.integers(1, 24))
        lens = [int(rng.choice([0, 1, cap // 2, cap - 1, cap])) for _ in range(n)]
        first = int(rng.integers(0, 4))
        ii = np.arange(n, dtype=np.uint64)
        ops, key = slot_ops(np.full(n, 1), np.full(n, 7), (first + ii) * np.uint64(stride),
                            np.array(lens, dtype=np.uint64), np.full(n, cap), ii * tags.TAG_BYTES,
                            ii * np.uint64(cap))
        starts = np.searchsorted(key, np.arange(n))
        ends = np.searchsorted(key, np.arange(n), side="right")
        # a slot's ops are header, payload (none when empty: the header stands in for it), trailer
        payload = {i: int(starts[i]) + (1 if lens[i] else 0) for i in range(n)}
        trailer = {i: int(ends[i]) - 1 for i in range(n)}
        nr, ch = int(rng.integers(1, 4)), int(rng.integers(1, 3))
        wrs, refused, _ = verbs.plan(ops, [-1, -1], [-1] * nr, [0] * nr, (256, 16, 3, 16, 64), ch)
        where = {}
        for w, (rail, chan, _r, _o, _l, _s, _c, wops, fence) in enumerate(wrs):
            for o in wops:
                where[o] = (rail, chan, w, bool(fence), len(wops))
        for i in range(n):
            p, t = where[payload[i]], where[trailer[i]]
            assert p[:2] == t[:2], f"trial {trial} cap {cap}: slot {i}'s trailer on rail/channel {t[:2]}, payload on {p[:2]}"
            assert t[2] > p[2] and t[3] or t[2] == p[2], f"trial {trial}: slot {i}'s trailer not after its payload"
