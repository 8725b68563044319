"""A stopped (SIGSTOP) producer: a read has the client's timeout in all, every step included, and
says what ran out of time instead of reading as misses; a directory that was stopped keeps its
members when it runs again (issue 36, finding 8).

Each producer is a subprocess (started by the ``procs`` fixture, killed at teardown) and is
always continued (SIGCONT) in a ``finally``, whatever the test's outcome.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time

import numpy as np
import pytest

import peercache
from conftest import scaled
from peercache.errors import DeadlineExceeded, DiscoveryUnreachable
from peercache.node import Get, Node
from peercache.rpc import RpcClient

PAGE = 4096
KEYS = [b"k%d" % i for i in range(32)]
#: What a read may take beyond its timeout: the steps between the blocking ones, on a loaded machine.
SLACK_S = 0.6

PRODUCER = r"""
import sys, time
from peercache.node import Node
addr, host, hb_timeout = sys.argv[1], sys.argv[2] == "host", float(sys.argv[3])
keys = [b"k%d" % i for i in range(32)]
node = Node(addr, host_discovery=host, pool_slots=64, slot_capacity=4096, heartbeat_interval=0.2,
            heartbeat_timeout=hb_timeout)
node.put_batch(keys, [bytes([i + 1]) * 100 for i in range(len(keys))])
print("READY", node.node_id, flush=True)
time.sleep(300)
"""


def _producer(procs, addr: str, hosts: bool, hb_timeout: float = 5.0):
    p = procs.start([sys.executable, "-c", PRODUCER, addr, "host" if hosts else "join", str(hb_timeout)])
    line = procs.wait_line(p, "READY")
    return p, line.split("READY", 1)[1].split()[0]


def _state(pid: int) -> str:
    """The process's state letter in /proc (T: stopped)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


class _Stopped:
    """The process stopped for the block, always continued after it."""

    def __init__(self, pid: int):
        self.pid = pid

    def __enter__(self):
        os.kill(self.pid, signal.SIGSTOP)
        # The signal is delivered asynchronously: wait until the kernel shows it stopped (state T),
        # or a read right after may still be answered.
        end = time.monotonic() + 5
        while _state(self.pid) != "T" and time.monotonic() < end:
            time.sleep(0.005)
        assert _state(self.pid) == "T", f"process {self.pid} did not stop"
        return self

    def __exit__(self, *exc):
        os.kill(self.pid, signal.SIGCONT)


def _bounded(timeout: float) -> float:
    return timeout + scaled(SLACK_S)


def _read(node: Node, keys=KEYS):
    dest = np.zeros(len(keys) * PAGE, np.uint8)
    t = time.monotonic()
    r = node.get_batch_into(keys, dest, np.arange(len(keys), dtype=np.uint64) * PAGE, [PAGE] * len(keys))
    return r, time.monotonic() - t


@pytest.mark.parametrize("timeout", [1.0, 2.0])
def test_a_stopped_producer_that_hosts_the_directory_ends_a_read_within_the_timeout(procs, port, timeout):
    """The producer hosts the directory and its table: the table read and the lookup RPC both wait
    on it. Before: each waited its own 5 s / timeout (6 s at timeout=1), and the error named only
    the lookup RPC."""
    addr = f"127.0.0.1:{port}"
    prod, prod_id = _producer(procs, addr, hosts=True)
    with peercache.Client(addr, timeout=timeout, page_size=PAGE) as c:
        assert c.get_batch(KEYS)[0] == b"\x01" * 100
        try:
            with _Stopped(prod.pid):
                t = time.monotonic()
                with pytest.raises(DeadlineExceeded) as e:
                    c.get_batch(KEYS)
                took = time.monotonic() - t
                print(f"get_batch of a stopped producer (timeout {timeout:g} s): {took:.2f} s: {e.value}")
                assert took <= _bounded(timeout), f"{took:.2f} s for a {timeout:g} s timeout"
                msg = str(e.value)
                assert f"the directory table read from node {prod_id}" in msg and "timed out" in msg
                assert f"{timeout:g} s in all" in msg and "not a miss" in msg

                r, took = _read(c.node)
                assert took <= _bounded(timeout)
                assert r.timed_out.tolist() == list(range(len(KEYS)))
                assert (r.status == Get.ERROR).all() and r.hits == 0 and "timed out" in r.error

                t = time.monotonic()
                with pytest.raises(DeadlineExceeded):      # the single-key path too
                    c.get(KEYS[3])
                assert time.monotonic() - t <= _bounded(timeout)

                t = time.monotonic()
                with pytest.raises(DeadlineExceeded, match="exists_batch timed out"):
                    c.exists_batch(KEYS)
                assert time.monotonic() - t <= _bounded(timeout)
        finally:
            os.kill(prod.pid, signal.SIGCONT)
        assert c.get_batch(KEYS)[5] == b"\x06" * 100      # running again: read as before


def test_a_stopped_producer_behind_a_live_directory_ends_a_read_within_the_timeout(procs, port):
    """The directory (and its table) is this process's; only the data read waits on the stopped
    producer. Before: the data read waited the transport's own 5 s whatever the client's timeout."""
    addr = f"127.0.0.1:{port}"
    timeout = 1.0
    with peercache.Client(addr, host_discovery=True, timeout=timeout, page_size=PAGE) as c:
        prod, prod_id = _producer(procs, addr, hosts=False)
        assert c.get_batch(KEYS)[1] == b"\x02" * 100
        try:
            with _Stopped(prod.pid):
                t = time.monotonic()
                with pytest.raises(DeadlineExceeded) as e:
                    c.get_batch(KEYS)
                took = time.monotonic() - t
                print(f"get_batch of a stopped producer, live directory: {took:.2f} s: {e.value}")
                assert took <= _bounded(timeout), f"{took:.2f} s for a {timeout:g} s timeout"
                assert "the data read failed" in str(e.value) and "timed out" in str(e.value)
                assert prod_id in str(e.value)
        finally:
            os.kill(prod.pid, signal.SIGCONT)
        deadline = time.monotonic() + scaled(10)
        while time.monotonic() < deadline:                 # a fresh data connection, then hits again
            try:
                if c.get_batch(KEYS) == [bytes([i + 1]) * 100 for i in range(len(KEYS))]:
                    break
            except peercache.errors.PeerCacheError:
                pass
            time.sleep(0.1)
        else:
            pytest.fail("the producer's pages were not read again after it was continued")


def test_outs_share_one_bound(procs, port):
    """get_batch with output buffers reads key by key: one bound for them all, not one each."""
    addr = f"127.0.0.1:{port}"
    prod, _ = _producer(procs, addr, hosts=True)
    with peercache.Client(addr, timeout=1.0, page_size=PAGE) as c:
        outs = [bytearray(PAGE) for _ in range(4)]
        assert c.get_batch(KEYS[:4], outs) == [100] * 4
        try:
            with _Stopped(prod.pid):
                t = time.monotonic()
                with pytest.raises(DeadlineExceeded):
                    c.get_batch(KEYS[:4], outs)
                assert time.monotonic() - t <= _bounded(1.0)
        finally:
            os.kill(prod.pid, signal.SIGCONT)


def test_a_directory_that_was_stopped_keeps_its_members(procs, port):
    """Stopped longer than the heartbeat timeout, the directory's host must not drop every member
    when it runs again: none of their heartbeats could arrive. Before, its reaper woke first and
    dropped them all (with their entries): reads right after were all misses, with no error."""
    addr = f"127.0.0.1:{port}"
    prod, prod_id = _producer(procs, addr, hosts=True, hb_timeout=1.0)
    cons = Node(addr, heartbeat_interval=0.2, heartbeat_timeout=1.0, rpc_timeout=1.0)
    try:
        r, _ = _read(cons)
        assert r.hits == len(KEYS)
        epoch = cons.directory.members().epoch
        try:
            with _Stopped(prod.pid):
                time.sleep(3.0)
        finally:
            os.kill(prod.pid, signal.SIGCONT)
        end = time.monotonic() + scaled(2.0)
        reads = 0
        while time.monotonic() < end:
            try:
                r, _ = _read(cons)
            except DiscoveryUnreachable:       # its RPC server catching up right after SIGCONT
                continue
            reads += 1
            misses = int((r.status == Get.MISS).sum())
            assert misses == 0, f"{misses} of {len(KEYS)} keys read as misses after the directory ran again"
        assert reads
        m = cons.directory.members()
        assert m.epoch == epoch and set(m.nodes) == {prod_id, cons.node_id}, "members were dropped"
    finally:
        cons.close()
        os.kill(prod.pid, signal.SIGCONT)


def test_a_call_queued_behind_another_waits_only_its_own_timeout(port):
    """Two threads share one RPC client to a server that never answers: the second call's wait for
    the connection counts against its timeout (before: its timeout came after the first's)."""
    cli = RpcClient(f"127.0.0.1:{port}", timeout=1.0, what="discovery")
    try:
        first = threading.Thread(target=lambda: pytest.raises(DiscoveryUnreachable, cli.call, "lookup"))
        first.start()
        time.sleep(0.3)
        t = time.monotonic()
        with pytest.raises(DiscoveryUnreachable, match="within 1.0 s"):
            cli.call("lookup", timeout=1.0)
        took = time.monotonic() - t
        first.join(5)
        assert took <= 1.0 + scaled(0.3), f"{took:.2f} s"
    finally:
        cli.close()
