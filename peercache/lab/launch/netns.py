"""Test hosts on one machine: two network namespaces joined by a veth pair.

Addresses come from 198.18.0.0/15, the range RFC 2544 reserves for network
benchmarking; they exist only inside the namespaces this module creates, so
no traffic can leave the machine. Needs root and iproute2.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

BENCH_NET_PREFIX = "198.18"


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
        self.remove()  # a stale pair from a killed run would block us
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
        """Remove both namespaces, and a veth end left in the root namespace (idempotent)."""
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
