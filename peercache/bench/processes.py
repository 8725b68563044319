"""Child-process plumbing of the bench's multi-process tools (drive, churn, dirbench): a child that ends
with its parent, a reply waited for in bounded time, and how a child ended, in words."""
from __future__ import annotations

import ctypes
import os
import signal
import threading
import time

from ..errors import PeerCacheError

PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int | None) -> None:
    """Make this child process end at once when its parent dies (even by SIGKILL).

    Linux: PR_SET_PDEATHSIG (the kernel sends SIGKILL when the parent exits);
    elsewhere, or if prctl is refused, a thread that watches the parent pid.
    """
    if parent_pid is None:
        return
    armed = False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        armed = libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:   # the parent died before the signal was armed
        os._exit(1)
    if armed:
        return

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.2)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def recv(conn, timeout: float, what: str):
    """The next message on a child's pipe within ``timeout`` s; PeerCacheError saying ``what`` did not
    happen when none came or the child exited."""
    if not conn.poll(timeout):
        raise PeerCacheError(f"{what} within {timeout:.0f} s")
    try:
        return conn.recv()
    except EOFError:
        raise PeerCacheError(f"{what}: the process exited")


def end_all(procs, grace: float, *, terminate: bool = True, last: float = 2.0) -> None:
    """Wait up to ``grace`` seconds in all for the child processes ``procs`` to exit on their own; then
    SIGTERM those still running (``terminate``), give each ``last`` seconds, and SIGKILL any left."""
    until = time.monotonic() + grace
    for p in procs:
        p.join(timeout=max(0.0, until - time.monotonic()))
    if terminate:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=last)
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(timeout=last)


def exit_text(p) -> str:
    """How a child process ended, for messages."""
    p.join(timeout=0.5)
    code = p.exitcode
    if code is None:
        return "its pipe closed while it still runs"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"
