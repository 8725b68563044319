"""Every fault ends a drive within 5 s with a clear error: a stopped (SIGSTOP) Redis directory, a
killed (SIGKILL) producer, a stopped producer; over tcp and shm.

Each test starts serve and drive on loopback, waits until drive measures, injects the fault,
and times drive's exit from that moment; the measured seconds are printed (``pytest -s``, or
the captured output of a failure). Every wait is bounded; every process is started by the
``procs`` / ``redis_server`` fixtures and ended by them (a stopped process is continued first).
"""
from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from conftest import BENCH, scaled
from peercache.bench.serve import READY_LINE

SMALL = ["--working-set", "64", "--page-size", "16384"]
#: The bound drive promises: every fault ends a drive within this many seconds.
BOUND_S = 5.0


class _Stderr:
    """drive's stderr, read in a thread (its progress lines say when it measures)."""

    def __init__(self, pipe):
        self.lines: list[str] = []
        self._t = threading.Thread(target=lambda: self.lines.extend(pipe), daemon=True)
        self._t.start()

    def wait_measuring(self, proc, timeout: float) -> None:
        end = time.monotonic() + scaled(timeout)
        while time.monotonic() < end and proc.poll() is None:
            if any("measure" in ln for ln in list(self.lines)):
                return
            time.sleep(0.05)
        raise AssertionError(f"drive did not reach its measurement (rc {proc.poll()}): {''.join(self.lines)!r}")

    def text(self) -> str:
        self._t.join(timeout=5)
        return "".join(self.lines)


def _run(procs, tmp_path, where: list[str], protocol: str, fault) -> tuple[float, dict, str]:
    """serve + a 60 s drive; ``fault(serve)`` once drive measures; (seconds to drive's exit, its
    result document, its stderr)."""
    serve = procs.start([*BENCH, "serve", *where, *SMALL, "--protocol", protocol, "--readers", "1"])
    procs.wait_line(serve, READY_LINE)
    out = tmp_path / "d.json"
    drive = procs.start([*BENCH, "drive", *where, *SMALL, "--protocol", protocol, "--batch-size", "8",
                         "--warmup", "0", "--duration", "60", "--ready-timeout", "10", "--out", str(out)])
    err = _Stderr(drive.stderr)
    err.wait_measuring(drive, 30)
    time.sleep(0.5)                       # a few batches and heartbeats into the window
    t = time.monotonic()
    fault(serve)
    try:
        drive.wait(timeout=scaled(30))
    finally:
        took = time.monotonic() - t
    stderr = err.text()
    return took, json.loads(out.read_text()), stderr


def _check(what: str, took: float, doc: dict, stderr: str, *reasons: tuple[str, ...]) -> None:
    """The drive failed within BOUND_S, without a traceback, and its error holds every word of one
    of ``reasons`` (when given)."""
    print(f"{what}: drive exited {took:.2f} s after the fault: {doc['error']}")
    assert doc["status"] == "failed" and doc["error"], doc
    assert "Traceback" not in stderr, stderr
    if reasons:
        assert any(all(w in doc["error"] for w in words) for words in reasons), (reasons, doc["error"])
    assert took <= scaled(BOUND_S), f"{what}: {took:.2f} s"


#: The error of a point ended by a silent directory.
SILENT = ("unreachable", "answered no heartbeat")
#: The error of a tcp read whose connection made no progress for drive.DATA_TIMEOUT_S.
DATA_TIMED_OUT = ("data connection failed", "timed out")


def test_a_stopped_redis_ends_drive_within_5s(procs, redis_server, tmp_path):
    pid = redis_server.pid
    try:
        took, doc, stderr = _run(procs, tmp_path, ["--directory", redis_server.url], "tcp",
                                 lambda serve: os.kill(pid, signal.SIGSTOP))
    finally:
        os.kill(pid, signal.SIGCONT)      # so the fixture can stop it
    _check("redis stopped", took, doc, stderr, (redis_server.url, "unreachable"))


@pytest.mark.parametrize("protocol", ["tcp", "shm"])
def test_a_killed_producer_ends_drive_within_5s(procs, port, tmp_path, protocol):
    took, doc, stderr = _run(procs, tmp_path, ["--discovery-addr", f"127.0.0.1:{port}"], protocol,
                             lambda serve: os.kill(serve.pid, signal.SIGKILL))
    _check(f"producer killed ({protocol})", took, doc, stderr)


@pytest.mark.parametrize("protocol", ["tcp", "shm"])
def test_a_stopped_producer_ends_drive_within_5s(procs, port, tmp_path, protocol):
    """The producer hosts the directory (the default): its silence ends the point, even over shm,
    whose one-sided reads of the stopped producer's pages still succeed (over tcp a read that makes
    no progress may end it first)."""
    addr = f"127.0.0.1:{port}"
    took, doc, stderr = _run(procs, tmp_path, ["--discovery-addr", addr], protocol,
                             lambda serve: os.kill(serve.pid, signal.SIGSTOP))
    reasons = [(addr, *SILENT)] + ([DATA_TIMED_OUT] if protocol == "tcp" else [])
    _check(f"producer stopped ({protocol})", took, doc, stderr, *reasons)


def test_a_stopped_producer_with_a_redis_directory_ends_drive_within_5s(procs, redis_server, tmp_path):
    """The directory answers; the tcp data connection's bounded wait ends the read."""
    took, doc, stderr = _run(procs, tmp_path, ["--directory", redis_server.url], "tcp",
                             lambda serve: os.kill(serve.pid, signal.SIGSTOP))
    _check("producer stopped (tcp, redis directory)", took, doc, stderr, DATA_TIMED_OUT)
