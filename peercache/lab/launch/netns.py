"""Test hosts on one machine: two network namespaces joined by a veth pair.

Addresses come from 198.18.0.0/15, the range RFC 2544 reserves for network
benchmarking; they exist only inside the namespaces this module creates, so
no traffic can leave the machine. Needs root and iproute2.

A pair is held with an exclusive lock on ``/run/peercache/netns-<tag>.lock``
for as long as it exists, so a second run asking for the same pair (two
``make bench`` at once) is refused, naming the holder, instead of removing
the namespaces under the first one. The lock goes with its process, so a
pair left by a killed run is replaced.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

BENCH_NET_PREFIX = "198.18"
#: where the locks of the pairs in use live
LOCK_DIR = Path("/run/peercache")


class NetnsError(RuntimeError):
    """Creating or removing a namespace failed."""


def available() -> tuple[bool, str]:
    """(True, "") when namespaces can be made here, else (False, why not)."""
    if os.geteuid() != 0:
        return False, "network namespaces need root (run the tests as root)"
    if shutil.which("ip") is None:
        return False, "iproute2 `ip` not found (apt-get install iproute2)"
    probe = f"pcprobe{os.getpid()}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return False, f"`ip netns add` failed: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return True, ""


def _ip(*args: str) -> None:
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise NetnsError(f"`ip {' '.join(args)}` failed: {r.stderr.strip()}")


@dataclass
class NetnsPair:
    """Namespaces ``<tag>a`` and ``<tag>b`` with addresses ``addr_a``/``addr_b``.

    ``index`` (0..255) picks the /24 inside 198.18.0.0/16 so several pairs
    can exist at once. Use as a context manager; exiting removes both
    namespaces (which removes the veth pair too).
    """

    tag: str
    index: int = 0
    _lock: int | None = field(default=None, init=False, repr=False, compare=False)

    def _acquire(self) -> None:
        """Hold the pair's lock, or say which process holds it."""
        if self._lock is not None:
            return
        LOCK_DIR.mkdir(parents=True, exist_ok=True)
        path = LOCK_DIR / f"netns-{self.tag}.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise NetnsError(f"the network-namespace pair {self.tag!r} is in use by process {holder} "
                             f"(another benchmark or pipeline run, lock {path}); wait for it to finish, "
                             "or give this run's testbed another netns_pair tag") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock = fd

    def _release(self) -> None:
        if self._lock is not None:
            os.close(self._lock)          # closing drops the flock
            self._lock = None

    @property
    def ns_a(self) -> str:
        return f"{self.tag}a"

    @property
    def ns_b(self) -> str:
        return f"{self.tag}b"

    @property
    def addr_a(self) -> str:
        return f"{BENCH_NET_PREFIX}.{self.index}.1"

    @property
    def addr_b(self) -> str:
        return f"{BENCH_NET_PREFIX}.{self.index}.2"

    def create(self) -> "NetnsPair":
        """Create both namespaces, the veth pair, addresses and loopbacks."""
        if not 0 <= self.index <= 255:
            raise NetnsError(f"netns pair index {self.index} outside 0..255")
        self._acquire()
        self._remove()  # a stale pair from a killed run would block us
        va, vb = self.veth
        try:
            _ip("netns", "add", self.ns_a)
            _ip("netns", "add", self.ns_b)
            _ip("link", "add", va, "type", "veth", "peer", "name", vb)
            _ip("link", "set", va, "netns", self.ns_a)
            _ip("link", "set", vb, "netns", self.ns_b)
            for ns, dev, addr in ((self.ns_a, va, self.addr_a), (self.ns_b, vb, self.addr_b)):
                _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
                _ip("-n", ns, "link", "set", dev, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
        except Exception:
            self.remove()
            raise
        return self

    @property
    def veth(self) -> tuple[str, str]:
        """Names of the two veth ends (15 characters at most, the kernel's limit)."""
        return f"{self.tag}va"[:15], f"{self.tag}vb"[:15]

    def remove(self) -> None:
        """Remove both namespaces, and a veth end left in the root namespace (idempotent); release the lock.

        A pair another live process holds is left alone (:class:`NetnsError`).
        """
        self._acquire()
        try:
            self._remove()
        finally:
            self._release()

    def _remove(self) -> None:
        for ns in (self.ns_a, self.ns_b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        # A run killed between `link add` and `link set netns` leaves the pair here.
        subprocess.run(["ip", "link", "del", self.veth[0]], capture_output=True, timeout=30)

    def exec_prefix(self, side: str) -> list[str]:
        """argv prefix that runs a command inside namespace ``a`` or ``b``."""
        ns = {"a": self.ns_a, "b": self.ns_b}[side]
        return ["ip", "netns", "exec", ns]

    def __enter__(self) -> "NetnsPair":
        return self.create()

    def __exit__(self, *exc) -> None:
        self.remove()
