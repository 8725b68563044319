"""Shared fixtures: free ports, subprocesses that are always cleaned up."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading

import pytest

BENCH = [sys.executable, "-m", "peercache.bench.cli"]


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
            for line in p.stdout:
                lines.append(line)
                if needle in line:
                    found.set()
            found.set()

        threading.Thread(target=pump, daemon=True).start()
        found.wait(timeout)
        out = "".join(lines)
        if needle not in out:
            raise AssertionError(f"{needle!r} not seen within {timeout}s; rc={p.poll()} out={out!r}")
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
