"""shm transport: torn or reused slots never read as hits; a gone producer fails cleanly."""
from __future__ import annotations

import os
import signal
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from peercache import tags
from peercache.errors import TransportError
from peercache.node import Get, Node
from peercache.pool import Pool
from peercache.transport.base import LOC_DTYPE, Status, make_ops, native_module
from peercache.transport.shm import ShmTransport, host_identity, start_time

from conftest import free_port

mod, why = native_module()
pytestmark = pytest.mark.skipif(mod is None, reason=str(why))


def _fill(view, ref):
    tags.fill_pattern(view, ref.key_hash, ref.generation)


def test_slot_rewritten_during_reads_is_never_a_hit():
    """A writer thread rewrites one slot with new generations while reads race with it."""
    page = 64 * 1024  # big enough that a read and a write overlap often
    pool = Pool(1, page)
    prod = ShmTransport()
    prod.expose(1, pool.mm, pool.rkey, fd=pool.fd, size=pool.size)
    peer = ShmTransport().native_peer("self", prod.start("-"))
    key = b"hot"
    khash = tags.key_hash(key)
    ref, _ = pool.put(key, None, _fill)
    stop = threading.Event()
    writes = [0]

    def writer():
        deadline = time.monotonic() + 3.0
        while not stop.is_set() and time.monotonic() < deadline and writes[0] < 100000:
            pool.put(key, None, _fill)  # same slot, next generation, seqlock order
            writes[0] += 1

    w = threading.Thread(target=writer)
    w.start()
    dest = np.zeros(page, np.uint8)
    args = [np.empty(1, t) for t in (np.int8, np.uint64, np.uint64, np.int32)]
    want = np.array([khash], np.uint64)     # the hash of the key asked for
    hits = stale = wrong = 0
    try:
        deadline = time.monotonic() + 2.0
        for _ in range(200000):
            if time.monotonic() > deadline:
                break
            # The location a reader got earlier: any generation within the last few.
            gen = pool.ref(key).generation - (hits + stale) % 3
            locs = np.zeros(1, LOC_DTYPE)
            locs[0] = (0, 1, pool.rkey, ref.offset, page, page, gen, khash)
            h, s, _, e, *_ = mod.read_slots([peer], locs, want, dest, np.zeros(1, np.uint64), None, *args)
            assert e == 0
            if h:
                hits += 1
                if not tags.verify_patterns(dest.reshape(1, -1), np.array([khash], np.uint64),
                                            np.array([gen], np.uint64))[0]:
                    wrong += 1
            stale += s
    finally:
        stop.set()
        w.join(timeout=10)
        pool.close()
    assert wrong == 0, f"{wrong} of {hits} hits returned bytes of another generation or a torn write"
    assert hits > 0 and writes[0] > 0


WRITER = textwrap.dedent("""
    import sys, time, numpy as np
    from peercache import tags
    from peercache.node import Node
    addr, seconds = sys.argv[1], float(sys.argv[2])
    fill = lambda v, ref: tags.fill_pattern(v, ref.key_hash, ref.generation)
    node = Node(addr, protocol="shm", pool_slots=16, slot_capacity=8192, name="writer")
    keys = [f"k{i}".encode() for i in range(48)]
    node.put_batch(keys[:16], fill=fill)
    print("writer ready", flush=True)
    rng = np.random.default_rng(1)
    deadline = time.monotonic() + seconds
    n = 0
    while time.monotonic() < deadline and n < 100000:
        node.put_batch([keys[i] for i in rng.choice(48, 4, replace=False)], fill=fill)  # evicts and reuses slots
        n += 1
    print("writer done", n, flush=True)
    node.close()
""")


def test_evicted_and_reused_slots_are_never_returned_as_hits(procs):
    """Writer process keeps evicting and reusing slots; every hit the reader gets is verified."""
    addr = f"127.0.0.1:{free_port()}"
    disco = Node(addr, protocol="shm", host_discovery=True, name="disco")
    cons = Node(addr, protocol="shm", dir_cache_ttl=60.0, name="reader")  # cached, so often stale
    w = procs.start([sys.executable, "-c", WRITER, addr, "3"])
    try:
        procs.wait_line(w, "writer ready")
        keys = [f"k{i}".encode() for i in range(48)]
        khash = np.array([tags.key_hash(k) for k in keys], np.uint64)
        dest = np.zeros(8 * 8192, np.uint8)
        rng = np.random.default_rng(2)
        hits = misses = wrong = 0
        deadline = time.monotonic() + 2.5
        for _ in range(20000):
            if time.monotonic() > deadline:
                break
            idx = rng.choice(48, 8, replace=False)
            r = cons.get_batch_into([keys[i] for i in idx], dest, np.arange(8, dtype=np.uint64) * 8192)
            assert r.errors == 0, r.error
            hit = r.status == Get.HIT
            ok = tags.verify_patterns(dest.reshape(8, 8192)[hit], khash[idx][hit], r.generations[hit])
            wrong += int((~ok).sum())
            hits += int(hit.sum())
            misses += int((~hit).sum())
        assert wrong == 0, f"{wrong} of {hits} hits had the bytes of another object or generation"
        assert hits > 0 and misses > 0
    finally:
        cons.close()
        disco.close()


PRODUCER = textwrap.dedent("""
    import sys, time
    from peercache import tags
    from peercache.node import Node
    node = Node(sys.argv[1], protocol="shm", pool_slots=8, slot_capacity=4096, name="producer",
                heartbeat_interval=0.5)
    node.put_batch([f"p{i}".encode() for i in range(8)],
                   fill=lambda v, ref: tags.fill_pattern(v, ref.key_hash, ref.generation))
    print("producer ready", flush=True)
    time.sleep(60)
""")


@pytest.mark.parametrize("ttl", [0.0, 60.0])
def test_producer_exit_makes_the_consumer_fail_cleanly(procs, ttl):
    addr = f"127.0.0.1:{free_port()}"
    disco = Node(addr, protocol="shm", host_discovery=True, heartbeat_timeout=30.0, name="disco")
    cons = Node(addr, protocol="shm", dir_cache_ttl=ttl, name="consumer")
    p = procs.start([sys.executable, "-c", PRODUCER, addr])
    try:
        procs.wait_line(p, "producer ready")
        keys = [f"p{i}".encode() for i in range(8)]
        dest = np.zeros(8 * 4096, np.uint8)
        offs = np.arange(8, dtype=np.uint64) * 4096
        assert cons.get_batch_into(keys, dest, offs).hits == 8
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=10)
        # The directory still lists the producer (heartbeat timeout not reached): reads must fail.
        for _ in range(3):
            r = cons.get_batch_into(keys, dest, offs)
            assert (r.status == Get.ERROR).all(), r.status
            assert "exited" in r.error or "not running" in r.error, r.error
    finally:
        cons.close()
        disco.close()


def test_peer_handle_reports_peer_gone_after_exit(procs):
    """Low level: a mapped pool outlives its producer, the handle does not."""
    code = textwrap.dedent("""
        import json, time
        from peercache.pool import Pool
        from peercache.transport.shm import ShmTransport
        pool = Pool(2, 128)
        t = ShmTransport(); t.expose(1, pool.mm, pool.rkey, fd=pool.fd, size=pool.size)
        print(json.dumps(t.start("-")), flush=True)
        time.sleep(60)
    """)
    p = procs.start([sys.executable, "-c", code])
    import json
    info = json.loads(p.stdout.readline())
    cons = ShmTransport()
    peer = cons.native_peer("prod", info)
    ops = make_ops(2)
    ops[0] = (1, 0, info["regions"][0][1], 0, 32, 0)
    ops[1] = (1, 0, info["regions"][0][1], 32, 32, 32)
    status = np.zeros(2, np.int32)
    assert peer.read_batch(ops, [np.zeros(64, np.uint8)], status) is None and (status == 0).all()
    os.killpg(p.pid, signal.SIGKILL)
    p.wait(timeout=10)
    err = peer.read_batch(ops, [np.zeros(64, np.uint8)], status)
    assert (status == Status.PEER_GONE).all() and "exited" in err
    assert not peer.alive()
    with pytest.raises(TransportError, match="not running|exited|replaced"):
        cons.forget("prod")
        cons.native_peer("prod", info)


def test_consumer_on_another_host_refuses_clearly():
    pool = Pool(1, 64)
    t = ShmTransport()
    t.expose(1, pool.mm, pool.rkey, fd=pool.fd, size=pool.size)
    info = dict(t.start("-"), boot_id="00000000-other-host")
    try:
        with pytest.raises(TransportError, match="another host.*--protocol tcp"):
            ShmTransport().native_peer("far", info)
    finally:
        pool.close()


def test_reused_pid_is_not_taken_for_the_producer():
    pool = Pool(1, 64)
    t = ShmTransport()
    t.expose(1, pool.mm, pool.rkey, fd=pool.fd, size=pool.size)
    info = t.start("-")
    info["start_time"] = start_time(os.getpid()) + 1  # as if this pid were a newer process
    try:
        with pytest.raises(TransportError, match="replaced"):
            ShmTransport().native_peer("p", info)
    finally:
        pool.close()


def test_endpoint_info_names_the_pool_and_the_host():
    pool = Pool(1, 64)
    t = ShmTransport()
    t.expose(1, pool.mm, pool.rkey, fd=pool.fd, size=pool.size)
    info = t.start("-")
    try:
        assert info["pid"] == os.getpid() and info["regions"] == [[1, pool.rkey, pool.fd, pool.size]]
        assert {k: info[k] for k in ("hostname", "boot_id", "pidns")} == host_identity()
    finally:
        pool.close()


def test_shm_refuses_a_region_without_a_memfd():
    with pytest.raises(TransportError, match="memfd"):
        ShmTransport().expose(1, bytearray(64), 5)
