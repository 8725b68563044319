"""Shared fixtures: free ports, subprocesses that are always cleaned up."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

BENCH = [sys.executable, "-m", "peercache.bench.cli"]

#: Real redis-server fixtures (`redis_server`, `redis_cluster`) for every test: tests/redis_fixtures.py.
pytest_plugins = ["redis_fixtures"]

#: How much slower this machine runs than the one the timeouts were written on: the Soft-RoCE
#: guest (emulated CPU) measures it at boot and exports it; 1 elsewhere.
SLOWNESS = max(1.0, float(os.environ.get("PEERCACHE_SLOWNESS") or 1))


def scaled(seconds: float) -> float:
    """A timeout for this machine: ``seconds`` times the measured slowness (a real hang still fails)."""
    return seconds * SLOWNESS


def rdma_sides() -> tuple[list[str], list[str]]:
    """(producer devices, consumer devices) usable for rdma here, or a skip that says why not.

    In the Soft-RoCE guest the two hosts' devices come from the guest's
    topology (PEERCACHE_RDMA_PRODUCER / _CONSUMER: one rxe device per rail on
    each end of a veth pair), and a missing device fails the test instead of
    skipping it (PEERCACHE_REQUIRE_RDMA=1, set by `make test-rdma`). On other
    machines both sides use the devices discovery finds.
    """
    from peercache.errors import TransportUnavailable
    from peercache.rdma import devices

    prod = [d for d in os.environ.get("PEERCACHE_RDMA_PRODUCER", "").split(",") if d]
    cons = [d for d in os.environ.get("PEERCACHE_RDMA_CONSUMER", "").split(",") if d]
    try:
        pv = devices.load_pyverbs()
        devices.load_verbs()
        usable = [s.device for s in devices.discover(prod + cons or devices.list_devices(pv))]
    except TransportUnavailable as e:
        if os.environ.get("PEERCACHE_REQUIRE_RDMA"):
            pytest.fail(f"PEERCACHE_REQUIRE_RDMA is set but rdma cannot run: {e}")
        pytest.skip(str(e))
    if prod and cons:
        return prod, cons
    return usable, usable


#: What a run of the pipeline needs of the checkout (tests run it in a copy: its outputs stay there).
PIPELINE_FILES = ("Snakefile", "rules", "envs", "profiles", "notebooks", "experiments", "make_charts.py",
                  "tests/fixtures/pipeline", "data/reference")


def pipeline_copy(work) -> None:
    """Copy what the pipeline needs from this checkout into the folder ``work``."""
    import shutil
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    for name in PIPELINE_FILES:
        src, dst = root / name, Path(work) / name
        if src.is_dir():
            shutil.copytree(src, dst)
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, dst)


def recv_for(s: socket.socket, seconds: float, got: bytearray | None = None) -> bytes:
    """What ``s`` receives until it closes or ``seconds`` pass (also appended to ``got`` as it comes)."""
    mine, end = bytearray(), time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        s.settimeout(left)
        try:
            k = s.recv(65536)
        except OSError:
            break
        if not k:
            break
        mine += k
        if got is not None:
            got += k
    return bytes(mine)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def port() -> int:
    return free_port()


class Procs:
    """Processes started by a test; all killed (whole group) at teardown."""

    def __init__(self):
        self.procs: list[subprocess.Popen] = []

    def start(self, argv, **kw) -> subprocess.Popen:
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True, **kw)
        self.procs.append(p)
        return p

    def wait_line(self, p: subprocess.Popen, needle: str, timeout: float = 20.0) -> str:
        """Read p's stdout until a line containing ``needle`` (bounded)."""
        lines: list[str] = []
        found = threading.Event()

        def pump():
            try:
                for line in p.stdout:
                    lines.append(line)
                    if needle in line:
                        found.set()
            except ValueError:          # the test ended and closed the pipe while this thread still read it
                pass
            found.set()

        threading.Thread(target=pump, daemon=True).start()
        found.wait(scaled(timeout))
        out = "".join(lines)
        if needle not in out:
            raise AssertionError(f"{needle!r} not seen within {scaled(timeout):.0f}s; rc={p.poll()} out={out!r}")
        return out

    def cleanup(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            for f in (p.stdout, p.stderr):
                if f is not None:
                    f.close()


@pytest.fixture
def procs():
    pr = Procs()
    yield pr
    pr.cleanup()


def pytest_collection_modifyitems(config, items):
    """On a slow machine (the Soft-RoCE guest) the per-test timeout stretches by the measured slowness."""
    if SLOWNESS <= 1:
        return
    base = float(config.getini("timeout") or 300)
    for item in items:
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(base * SLOWNESS))


def pytest_configure(config):
    """Ctrl-C behaves the same however the suite was started. A shell that starts ``make test`` as a
    background job sets SIGINT to 'ignore', and an ignored signal stays ignored across fork and exec:
    every process a test starts (serve, drive, a pair's sides) would shrug off the SIGINT the lab's
    runners send to stop them, and ``_thread.interrupt_main`` would do nothing. A handler, unlike
    'ignore', is reset to the default at exec, so children start as from an interactive shell."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
