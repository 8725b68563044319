"""Hardening of drive, the library read path, put_batch and the CLI.

Each test pins one defect that was seen: a poisoned directory entry, a killed
driver process, a batch that evicts its own keys, and option values that used
to start something impossible.
"""
from __future__ import annotations

import contextlib
import dataclasses

import json
import os
import resource
import signal
import subprocess
import threading
import time

import numpy as np
import pytest

import peercache
from peercache import tags
from conftest import BENCH, scaled
from peercache.bench import drive, options
from peercache.bench.cli import build_parser
from peercache.bench.drive import bounds, worker
from peercache.bench.serve import READY_LINE
from peercache.errors import InvalidLocation, PeerCacheError
from peercache.bench.serve import fill_page
from peercache.node import Get, Node

SMALL = ["--working-set", "64", "--page-size", "16384"]


def drive_argv(addr, out, *extra):
    return [*BENCH, "drive", "--discovery-addr", addr, *SMALL, "--batch-size", "8",
            "--duration", "1", "--warmup", "0.3", "--out", str(out), "--ready-timeout", "10", *extra]


def poison(host: Node, key: bytes, field: int, value) -> None:
    """Replace one field of ``key``'s entry in the directory ``host`` serves.

    Discovery refuses such a publish over the wire now, so the entry is
    written through the directory's own API -- what a buggy or hostile
    directory service (or an older one) would hand out.
    """
    directory = host.meta.directory
    loc = list(directory.lookup([key])[0])
    loc[field] = value
    directory.publish(loc[0], [key], [loc])


# ---------------------------------------------------------------- 1: poisoned directory entries
# Location fields: node_id, region, rkey, offset, length, capacity, generation, key_hash.
BAD_FIELDS = [
    pytest.param(3, -5, id="negative-offset"),
    pytest.param(3, (1 << 64) - 1, id="offset-overflows-the-slot-range"),
    pytest.param(1, 1 << 40, id="region-beyond-u32"),
    pytest.param(4, "abc", id="length-not-an-integer"),
    pytest.param(4, None, id="length-none"),
    pytest.param(4, 1 << 63, id="length-beyond-capacity"),
    pytest.param(6, 2.5, id="generation-a-float"),
    pytest.param(7, -1, id="negative-key-hash"),
]


@pytest.fixture
def pair(port):
    addr = f"127.0.0.1:{port}"
    prod = peercache.Client(addr, host_discovery=True, pool_bytes=16 * 4160, page_size=4096)
    yield addr, prod
    prod.close()


@pytest.mark.parametrize("path", ["native", "python"])
@pytest.mark.parametrize("ttl", [0.0, 30.0])
@pytest.mark.parametrize("field, value", BAD_FIELDS)
def test_poisoned_location_is_a_peercache_error_never_a_raw_exception(pair, field, value, ttl, path):
    addr, prod = pair
    prod.put_batch(["good", "bad"], [b"g" * 100, b"b" * 100])
    poison(prod.node, b"bad", field, value)
    with peercache.Client(addr, page_size=4096, dir_cache_ttl=ttl) as cons:
        if path == "python":
            cons.node.reader.native = None          # the reference (pure-Python) read path
        for _ in range(2):   # the second round would use a cached location when ttl > 0
            with pytest.raises(InvalidLocation, match="invalid"):
                cons.get("bad")
            with pytest.raises(InvalidLocation):
                cons.get_batch(["good", "bad"])
            with pytest.raises(InvalidLocation):
                cons.get("bad", out=bytearray(4096))
            assert cons.get("good") == b"g" * 100
            assert cons.exists_batch(["good", "bad", "nope"]) == [True, True, False]
            dest = np.zeros(2 * 4096, dtype=np.uint8)
            r = cons.node.get_batch_into([b"bad", b"good"], dest, [0, 4096], [4096, 4096])
            assert r.status.tolist() == [Get.ERROR, Get.HIT]
            assert "invalid" in r.error and "b'bad'" in r.error
        assert cons.node.bad_locations >= 2


def test_invalid_location_is_a_peercache_error():
    assert issubclass(InvalidLocation, PeerCacheError)
    assert not issubclass(InvalidLocation, ValueError)


def _base_cfg(*argv, **kw):
    """drive's settings of ``peercache-bench drive *argv`` (its defaults otherwise), with ``kw`` in place."""
    defaults = {"duration": 1.0, "layout": "mla", "op": "get", "processes": 1, "batch_size": 8,
                "page_size": 4096, "verify": True}
    cfg = drive.DriveConfig.from_args(build_parser().parse_args(["drive", *argv]), drive.Worker)
    return dataclasses.replace(cfg, **(defaults | kw))


def test_a_point_that_completed_no_batch_is_failed():
    p = drive.aggregate(1, _base_cfg(), [{"stats": drive.ThreadStats().__dict__, "abort": []}])
    assert p.status == "failed" and p.batches == 0
    assert "no batch" in p.reason


def test_driver_thread_exception_fails_the_point_with_its_reason(monkeypatch):
    """A thread that dies on an unexpected exception is reported, not a silent 0-batch 'ok'."""
    w = drive.Worker.__new__(drive.Worker)
    w.cfg = _base_cfg(working_set=8, batch_size=2, page_size=64, seed=1, op="get", verify=True, access="random",
                      warmup=0.0, duration=0.3)
    w.pidx, w.objs, w.slice_bytes, w.gpu, w.recv, w.fused_verify = 0, 1, 128, None, None, True
    w.keys_arr = np.array([f"k{i}".encode() for i in range(8)], dtype=object)

    class Rails:                      # a tcp node's transport: no rails
        def rail_stats(self):
            return []

    class Boom:
        transport = Rails()

        def get_batch_into(self, *a, **k):
            raise OverflowError("Python integer -5 out of bounds for uint64")

    w.node, w.dest = Boom(), np.zeros(128, np.uint8)
    w.live, w.live_lock = type("V", (), {"value": 0.0})(), threading.Lock()
    res = w.run_point(1, time.time())
    p = drive.aggregate(1, w.cfg, [res])
    assert p.status == "failed"
    assert "OverflowError" in p.reason


@pytest.mark.parametrize("scale, aborted", [(1.0, True), (2.0, False)])
def test_time_scale_stretches_the_directory_silence_bound(scale, aborted):
    """A directory silent for 4 s ends the point at --time-scale 1 (bound 3 s), not at 2 (bound 6 s)."""
    w = drive.Worker.__new__(drive.Worker)
    w.cfg = _base_cfg(time_scale=scale, discovery_addr="127.0.0.1:1", directory="")
    w.node = type("Silent", (), {"directory_silence": lambda self: 4.0})()
    stop, abort = threading.Event(), []
    t = threading.Thread(target=stop.wait, args=(1.0,))
    t.start()
    w._watch([t], time.time() + 60, stop, abort)
    t.join()
    assert bool(abort) == aborted, abort
    assert not aborted or "answered no heartbeat for 4.0 s" in abort[0]


@pytest.mark.parametrize("scale, aborted", [(1.0, True), (2.0, False)])
def test_time_scale_stretches_a_points_overrun_grace(monkeypatch, scale, aborted):
    """A thread still reading 1.5 s past its window end: over the 1 s grace at --time-scale 1, not at 2."""
    monkeypatch.setattr(worker, "POINT_GRACE_S", 1.0)
    w = drive.Worker.__new__(drive.Worker)
    w.cfg = _base_cfg(time_scale=scale, discovery_addr="127.0.0.1:1", directory="")
    w.node = type("Quiet", (), {"directory_silence": lambda self: 0.0})()
    stop, abort = threading.Event(), []
    t = threading.Thread(target=stop.wait, args=(1.5,))
    t.start()
    w._watch([t], time.time(), stop, abort)
    t.join()
    assert bool(abort) == aborted, abort
    assert not aborted or "did not finish within the point's window + grace" in abort[0]


@pytest.mark.parametrize("protocol, expected, get_bound", [
    ("tcp", {"io_timeout": bounds.DATA_TIMEOUT_S * 4}, bounds.IO_TIMEOUT_S * 4),
    # rdma's completion bound is not stretched (a path fault fails over), and a GET's bound holds one
    ("rdma", {"connect_timeout": bounds.RDMA_CONNECT_S * 4, "timeout_s": bounds.RDMA_COMPLETION_S},
     bounds.IO_TIMEOUT_S * 4 + bounds.RDMA_COMPLETION_S)])
def test_time_scale_stretches_the_nodes_bounds(monkeypatch, protocol, expected, get_bound):
    """--time-scale 4: the driver's node gets its directory timeout and its transport's bounds x 4."""
    from peercache.bench.cli import build_parser
    args = build_parser().parse_args(["drive", "--protocol", protocol, "--time-scale", "4", *SMALL])
    seen = {}

    class Stop(Exception):
        pass

    def node(**kw):
        seen.update(kw)
        raise Stop

    monkeypatch.setattr(worker, "Node", node)
    cfg = drive.DriveConfig.from_args(args, drive.Worker)
    with pytest.raises(Stop):
        drive.Worker(cfg, 0, None)
    assert seen["transport_options"] == {**options.node_config(args).transport_options(), **expected}
    assert seen["rpc_timeout"] == get_bound


def test_drive_with_a_poisoned_entry_exits_1_with_the_reason(port, tmp_path):
    addr = f"127.0.0.1:{port}"
    keys = options.page_keys(64, "mla")
    done = []
    # serve's part in this process, so the test can reach its directory
    with Node(addr, host_discovery=True, pool_slots=len(keys), slot_capacity=16384, name="serve") as host:
        host.add_handler("reader_done", lambda msg: done.append(msg) or {"readers_done": len(done)})
        host.put_batch(keys, fill=fill_page)
        poison(host, b"pc/0", 3, -5)
        out = tmp_path / "d.json"
        r = subprocess.run(drive_argv(addr, out, "--dir-cache-ttl", "0"), capture_output=True, text=True,
                           timeout=scaled(60))
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    doc = json.loads(out.read_text())
    assert doc["status"] == "failed" and "invalid" in doc["error"]
    p = doc["points"][0]
    assert p["status"] == "failed" and p["errors"] > 0 and "invalid" in p["reason"]
    assert "FAILED" in r.stderr and "invalid" in r.stderr
    assert len(done) == 1 and done[0]["summary"]["status"] == "failed"     # serve was told


# ---------------------------------------------------------------- 2: killed driver processes
def _children(pid: int) -> list[int]:
    """Driver worker processes of drive ``pid``: its children forked from it (its own command line)."""
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        own = f.read()
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid and cmd == own:
            out.append(int(d))
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class _Lines:
    """Collects a pipe's lines in a thread; wait() for a needle (bounded)."""

    def __init__(self, pipe):
        self.lines: list[str] = []
        self._t = threading.Thread(target=self._pump, args=(pipe,), daemon=True)
        self._t.start()

    def _pump(self, pipe):
        for line in pipe:
            self.lines.append(line)

    def wait(self, needle: str, timeout: float) -> None:
        end = time.monotonic() + scaled(timeout)
        while time.monotonic() < end:
            if any(needle in l for l in self.lines):
                return
            time.sleep(0.05)
        raise AssertionError(f"{needle!r} not seen: {''.join(self.lines)!r}")

    def text(self) -> str:
        self._t.join(timeout=5)
        return "".join(self.lines)


def test_a_killed_driver_process_is_reported_and_serve_released(procs, port, tmp_path):
    addr = f"127.0.0.1:{port}"
    serve = procs.start([*BENCH, "serve", "--discovery-addr", addr, *SMALL, "--readers", "1"])
    procs.wait_line(serve, READY_LINE)
    out = tmp_path / "d.json"
    d = procs.start(drive_argv(addr, out, "--processes", "2", "--duration", "4"))
    err = _Lines(d.stderr)
    err.wait("measure", 30)
    workers = _children(d.pid)
    assert len(workers) == 2, workers
    os.kill(workers[1], signal.SIGKILL)
    rc = d.wait(timeout=scaled(40))
    stdout = d.stdout.read()
    stderr = err.text()
    assert rc == 1, stderr
    assert "EOFError" not in stderr and "Traceback" not in stderr, stderr
    assert "GB/s" in stdout                                  # the table is printed
    doc = json.loads(out.read_text())
    assert doc["status"] == "failed" and "driver process 1" in doc["error"]
    p = doc["points"][0]
    assert p["status"] == "failed" and "driver process 1" in p["reason"]
    assert p["bytes"] > 0 and p["batches"] > 0               # what the surviving process measured
    assert serve.wait(timeout=scaled(10)) == 0               # serve was told the reader is done


def test_drivers_forked_before_the_producer_is_known_end_with_a_drive_that_finds_none(procs, port, tmp_path):
    """drive forks its driver processes first (before any connection: they need not import anything again),
    then waits for a producer's geometry; when none comes, drive fails saying so and its drivers go with it."""
    addr = f"127.0.0.1:{port}"
    meta = procs.start([*BENCH, "meta", "--discovery-addr", addr])
    procs.wait_line(meta, "peercache-bench meta: ready")
    d = procs.start([*BENCH, "drive", "--discovery-addr", addr, "--processes", "2", "--duration", "1",
                     "--ready-timeout", str(scaled(4)), "--out", str(tmp_path / "d.json")])
    end = time.monotonic() + scaled(3)
    workers = _children(d.pid)
    while len(workers) < 2 and time.monotonic() < end and d.poll() is None:
        time.sleep(0.02)
        workers = _children(d.pid)
    assert len(workers) == 2, workers          # forked while drive still waits for a producer
    assert d.wait(timeout=scaled(30)) != 0
    assert "no producer registered" in d.stderr.read()
    assert not [w for w in workers if _alive(w)]


def test_workers_of_a_killed_drive_parent_stop_at_once(procs, port, tmp_path):
    addr = f"127.0.0.1:{port}"
    serve = procs.start([*BENCH, "serve", "--discovery-addr", addr, *SMALL, "--readers", "1"])
    procs.wait_line(serve, READY_LINE)
    d = procs.start(drive_argv(addr, tmp_path / "d.json", "--processes", "2", "--duration", "60"))
    err = _Lines(d.stderr)
    err.wait("measure", 30)
    workers = _children(d.pid)
    assert len(workers) == 2, workers
    os.kill(d.pid, signal.SIGKILL)
    d.wait(timeout=10)
    end = time.monotonic() + scaled(3)
    while time.monotonic() < end and any(_alive(w) for w in workers):
        time.sleep(0.05)
    alive = [w for w in workers if _alive(w)]
    for w in alive:
        os.kill(w, signal.SIGKILL)
    assert not alive, "driver processes outlived their killed parent"


# ---------------------------------------------------------------- 3: put_batch evicting its own keys
def _assert_directory_matches_pool(prod, cons, keys, values):
    pool = prod.node.pool
    in_pool = [pool.ref(k.encode()) is not None for k in keys]
    assert sum(in_pool) == min(len(set(keys)), pool.slots)
    assert cons.exists_batch(keys) == in_pool
    for k, v, there in zip(keys, values, in_pool):
        assert cons.get(k) == (v if there else None), k


def test_put_batch_that_evicts_within_the_batch_leaves_exactly_the_pool_in_the_directory(port):
    addr = f"127.0.0.1:{port}"
    with peercache.Client(addr, host_discovery=True, pool_bytes=4 * tags.slot_stride(4096), page_size=4096) as prod, \
            peercache.Client(addr, page_size=4096) as cons:
        assert prod.node.pool.slots == 4
        keys = [f"k{i}" for i in range(6)]
        vals = [bytes([i]) * 64 for i in range(6)]
        prod.put_batch(keys, vals)
        _assert_directory_matches_pool(prod, cons, keys, vals)
        assert cons.exists_batch(["k0", "k1"]) == [False, False]
        # again, with keys already there, a repeated key and more keys than slots
        keys2 = ["k5", "a", "b", "k5", "c", "d", "e"]
        vals2 = [bytes([100 + i]) * 32 for i in range(len(keys2))]
        prod.put_batch(keys2, vals2)
        last = {k: v for k, v in zip(keys2, vals2)}
        ks = list(dict.fromkeys([*last, *keys]))
        _assert_directory_matches_pool(prod, cons, ks, [last.get(k, b"") for k in ks])


# ---------------------------------------------------------------- 4: CLI edges
def _limited():
    # A refusal must come before any allocation: a regression fails fast instead of eating the host.
    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))


BAD_DRIVE = [
    (["--duration", "nan"], "--duration"),
    (["--duration", "inf"], "--duration"),
    (["--warmup", "nan"], "--warmup"),
    (["--ready-timeout", "-1"], "--ready-timeout"),
    (["--ready-timeout", "nan"], "--ready-timeout"),
    (["--dir-cache-ttl", "nan"], "--dir-cache-ttl"),
    (["--start-at", "nan"], "--start-at"),
    (["--start-at", "1700000000", "--start-file", "/tmp/x"], "--start-file"),
    (["--time-scale", "0.5"], "--time-scale"),
    (["--time-scale", "nan"], "--time-scale"),
    (["--seed", "-1"], "--seed"),
    (["--processes", "100000"], "--processes"),
    (["--concurrencies", "1,100000", "--recv-buffer", str(1 << 60)], "--concurrencies"),
    (["--working-set", str(10 ** 12)], "--working-set"),
    (["--page-size", str(1 << 40), "--batch-size", "1", "--recv-buffer", str(1 << 50)], "--page-size"),
]


@pytest.mark.parametrize("flags, option", BAD_DRIVE, ids=[" ".join(f) for f, _ in BAD_DRIVE])
def test_drive_refuses_impossible_values_with_exit_2(flags, option, port):
    t = time.monotonic()
    r = subprocess.run([*BENCH, "drive", "--discovery-addr", f"127.0.0.1:{port}", *flags],
                       capture_output=True, text=True, timeout=30, preexec_fn=_limited)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "invalid options" in r.stderr and option in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert time.monotonic() - t < 20


BAD_SERVE = [
    (["--working-set", str(10 ** 12)], "--working-set", "this host has"),
    (["--page-size", str(1 << 40)], "--page-size", "this host has"),
    # fits this host with one object per page, not with two (mha)
    (["--working-set", str(int((options.host_memory() or 1 << 34)
                               / (1.5 * (options.slot_bytes(131072) + options.SERVE_BYTES_PER_OBJECT)))),
      "--page-size", "131072", "--layout", "mha"], "--layout mha", "this host has"),
    (["--heartbeat-timeout", "nan"], "--heartbeat-timeout", "nan"),
    (["--heartbeat-timeout", "0"], "--heartbeat-timeout", "> 0"),
    (["--max-wait", "nan"], "--max-wait", "nan"),
    (["--max-wait", "-1"], "--max-wait", ">= 0"),
]


@pytest.mark.parametrize("flags, option, text", BAD_SERVE, ids=[" ".join(f) for f, _, _ in BAD_SERVE])
def test_serve_refuses_impossible_values_with_exit_2(flags, option, text, port):
    r = subprocess.run([*BENCH, "serve", "--discovery-addr", f"127.0.0.1:{port}", "--max-wait", "5", *flags],
                       capture_output=True, text=True, timeout=30, preexec_fn=_limited)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "invalid options" in r.stderr and option in r.stderr and text in r.stderr, r.stderr


def test_memory_refusal_says_what_it_needs_and_what_the_host_has(port):
    r = subprocess.run([*BENCH, "serve", "--discovery-addr", f"127.0.0.1:{port}", "--working-set",
                        str(10 ** 12)], capture_output=True, text=True, timeout=30, preexec_fn=_limited)
    assert r.returncode == 2
    assert "--working-set 1000000000000" in r.stderr and "needs" in r.stderr and "this host has" in r.stderr
    assert "iB" in r.stderr


@pytest.mark.parametrize("mode", ["serve", "drive"])
@pytest.mark.parametrize("addr", ["127.0.0.1:70000", "127.0.0.1:0", "127.0.0.1:-1", "127.0.0.1", "127.0.0.1:x"])
def test_discovery_port_out_of_range_refused(mode, addr):
    r = subprocess.run([*BENCH, mode, "--discovery-addr", addr, "--max-wait", "5"] if mode == "serve"
                       else [*BENCH, mode, "--discovery-addr", addr, "--ready-timeout", "2"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "--discovery-addr" in r.stderr, r.stderr


def test_validate_accepts_the_defaults_and_the_test_sizes():
    from peercache.bench.cli import build_parser
    for argv in (["serve"], ["drive"], ["drive", *SMALL, "--processes", "2", "--concurrencies", "1,2"],
                 ["serve", "--discovery-addr", "[::1]:31998"], ["drive", "--start-at", "1700000000+5"]):
        args = build_parser().parse_args(argv)
        options.validate(args, argv[0])


@contextlib.contextmanager
def _consumer(addr: str, path: str):
    """A consumer with locations cached for 30 s, on the native or the pure-Python read path."""
    with peercache.Client(addr, page_size=4096, dir_cache_ttl=30.0) as cons:
        if path == "python":
            cons.node.reader.native = None
        yield cons


@pytest.mark.parametrize("path", ["native", "python"])
def test_a_stale_cached_location_is_looked_up_once_more_and_read(pair, path):
    """Both read paths share one stale retry: a tag mismatch, one uncached lookup, the new bytes."""
    addr, prod = pair
    prod.put_batch(["a", "b"], [b"a" * 100, b"b" * 100])
    with _consumer(addr, path) as cons:
        assert cons.get_batch(["a", "b"]) == [b"a" * 100, b"b" * 100]   # both locations cached
        prod.put("b", b"B" * 300)                                       # b's cached location is stale
        dest = np.zeros(2 * 4096, dtype=np.uint8)
        r = cons.node.get_batch_into([b"a", b"b"], dest, [0, 4096], [4096, 4096])
        assert r.status.tolist() == [Get.HIT, Get.HIT] and r.lengths.tolist() == [100, 300]
        assert dest[4096:4396].tobytes() == b"B" * 300 and cons.node.stale_locations == 1
        prod.remove("b")                                                # stale again, and gone
        r = cons.node.get_batch_into([b"b", b"a"], dest, [0, 4096], [4096, 4096])
        assert r.status.tolist() == [Get.MISS, Get.HIT] and cons.node.stale_locations == 2


@pytest.mark.parametrize("path", ["native", "python"])
def test_stale_cached_location_whose_fresh_entry_is_invalid_is_an_error(pair, path):
    """The retry after a tag mismatch looks the key up again; an invalid answer there is an error too."""
    addr, prod = pair
    prod.put_batch(["good", "bad"], [b"g" * 100, b"b" * 100])
    with _consumer(addr, path) as cons:
        assert cons.get("bad") == b"b" * 100           # location cached for 30 s
        prod.put("bad", b"B" * 100)                      # the cached location is stale now
        poison(prod.node, b"bad", 3, -5)
        dest = np.zeros(2 * 4096, dtype=np.uint8)
        r = cons.node.get_batch_into([b"good", b"bad"], dest, [0, 4096], [4096, 4096])
        assert r.status.tolist() == [Get.HIT, Get.ERROR] and r.invalid == {1}
        assert "invalid" in r.error and cons.node.stale_locations >= 1
        with pytest.raises(InvalidLocation):
            cons.get("bad")
