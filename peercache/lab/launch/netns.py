"""Test hosts on one machine: network namespaces joined by a veth pair (:class:`NetnsPair`) or, for a
testbed of more than two hosts, each joined by a veth to one Linux bridge (:class:`NetnsBridge`).

Addresses come from 198.18.0.0/15, the range RFC 2544 reserves for network
benchmarking; they exist only inside the namespaces this module creates, so
no traffic can leave the machine. Needs root and iproute2.

A set (a pair or a bridge) is held with an exclusive lock on
``/run/peercache/netns-<tag>.lock`` for as long as it exists, so a second run
asking for the same set (two ``make bench`` at once) is refused, naming the
holder, instead of removing the namespaces under the first one. The lock goes
with its process, so a set left by a killed run is replaced.
"""
from __future__ import annotations

import fcntl
import ipaddress
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

BENCH_NET_PREFIX = "198.18"
#: The RFC 2544 benchmarking range: every address this module gives an interface lies inside it.
BENCH_NET = ipaddress.ip_network("198.18.0.0/15")
#: where the locks of the sets in use live
LOCK_DIR = Path("/run/peercache")
#: The kernel's limit on an interface name (IFNAMSIZ - 1).
IFNAME_MAX = 15
#: br_netfilter's switch: 1 sends IPv4 frames crossing a bridge through this namespace's iptables/nftables.
BRIDGE_NF_CALL_IPTABLES = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")


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


def check_index(index: int) -> None:
    """NetnsError unless ``index`` picks a /24 of 198.18.0.0/16 (0..255)."""
    if not isinstance(index, int) or not 0 <= index <= 255:
        raise NetnsError(f"netns index {index!r} outside 0..255 (it picks the /24 {BENCH_NET_PREFIX}.<index>.0/24)")


def check_bench_address(address: str, index: int | None = None) -> ipaddress.IPv4Address:
    """``address`` as an IPv4 address inside :data:`BENCH_NET` (and, ``index`` given, inside
    198.18.<index>.0/24, neither its network nor its broadcast address); NetnsError saying why not."""
    try:
        a = ipaddress.ip_address(address)
    except ValueError:
        raise NetnsError(f"address {address!r} is not an IP address") from None
    if a not in BENCH_NET:
        raise NetnsError(f"address {address} is outside {BENCH_NET} (the RFC 2544 benchmarking range that "
                         "namespace hosts use, so no test traffic can reach a real network)")
    if index is not None:
        net = ipaddress.ip_network(f"{BENCH_NET_PREFIX}.{index}.0/24")
        if a not in net or a in (net.network_address, net.broadcast_address):
            raise NetnsError(f"address {address} is not a host address of {net}, the /24 that index {index} picks")
    return a


def check_ifname(name: str) -> str:
    """``name`` when the kernel takes it as an interface name, else NetnsError."""
    if not 0 < len(name) <= IFNAME_MAX:
        raise NetnsError(f"interface name {name!r} is {len(name)} characters; the kernel's limit is {IFNAME_MAX} "
                         "(use a shorter tag)")
    return name


class _Locked:
    """The exclusive lock of a namespace set named ``tag`` (``/run/peercache/netns-<tag>.lock``).

    The lock file holds the holder's pid; a second holder is refused with it. Subclasses name what they
    are and the testbed field that chose the tag (for the refusal's fix)."""

    tag: str
    _lock: int | None = None
    _what = "network-namespace set"
    _field = "tag"

    def _acquire(self) -> None:
        """Hold the set's lock, or say which process holds it."""
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
            raise NetnsError(f"the {self._what} {self.tag!r} is in use by process {holder} "
                             f"(another benchmark or pipeline run, lock {path}); wait for it to finish, "
                             f"or give this run's testbed another {self._field}") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock = fd

    def _release(self) -> None:
        if self._lock is not None:
            os.close(self._lock)          # closing drops the flock
            self._lock = None

    def remove(self) -> None:
        """Remove everything the set made (idempotent: its ``_remove``); release the lock.

        A set another live process holds is left alone (:class:`NetnsError`).
        """
        self._acquire()
        try:
            self._remove()
        finally:
            self._release()

    def _remove(self) -> None:
        raise NotImplementedError


def _quiet_ip(*args: str) -> None:
    """``ip ARGS`` whose failure is expected (removing what may not exist)."""
    subprocess.run(["ip", *args], capture_output=True, timeout=30)


@dataclass
class NetnsPair(_Locked):
    """Namespaces ``<tag>a`` and ``<tag>b`` with addresses ``addr_a``/``addr_b``.

    ``index`` (0..255) picks the /24 inside 198.18.0.0/16 so several pairs
    can exist at once. Use as a context manager; exiting removes both
    namespaces (which removes the veth pair too).
    """

    tag: str
    index: int = 0
    _lock: int | None = field(default=None, init=False, repr=False, compare=False)
    _what = "network-namespace pair"
    _field = "netns_pair tag"

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
        check_index(self.index)
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


def bridge_nf_call_iptables() -> bool | None:
    """Whether br_netfilter hands IPv4 frames crossing a bridge of this namespace to iptables/nftables
    (None: br_netfilter is not loaded, nothing filters bridged frames)."""
    try:
        return BRIDGE_NF_CALL_IPTABLES.read_text().strip() == "1"
    except OSError:
        return None


@dataclass
class NetnsBridge(_Locked):
    """One namespace per member, each joined by a veth to the bridge ``<tag>br`` in this (the root) namespace.

    ``members`` is ``[(namespace, address), ...]``: each namespace gets its veth end ``<tag>n<i>`` with
    ``address/24`` and its loopback up; the other end ``<tag>p<i>`` is a port of the bridge. Every
    address is a host address of 198.18.<index>.0/24 (inside the RFC 2544 range), and every namespace
    name starts with ``tag``, so the tag's lock guards everything the set creates and removes.

    Nothing leaves the set: the bridge and its ports have no address (no IPv6 link-local either), its
    only ports are the set's veths, and the namespaces have no route but their /24. When br_netfilter
    passes bridged frames to this namespace's iptables (``net.bridge.bridge-nf-call-iptables`` = 1),
    :meth:`create` checks with one ping that they still cross the bridge, and fails saying why when
    not; it changes no global setting. Use as a context manager; exiting removes the bridge, every
    veth and every namespace.
    """

    tag: str
    index: int
    members: list[tuple[str, str]]
    _lock: int | None = field(default=None, init=False, repr=False, compare=False)
    _what = "network-namespace bridge"
    _field = "netns_bridge tag"

    def __post_init__(self) -> None:
        self.members = [(str(ns), str(addr)) for ns, addr in self.members]

    @property
    def bridge(self) -> str:
        return f"{self.tag}br"

    def veth(self, i: int) -> tuple[str, str]:
        """(namespace end, bridge port) of member ``i`` (0-based)."""
        return f"{self.tag}n{i + 1}", f"{self.tag}p{i + 1}"

    @property
    def namespaces(self) -> list[str]:
        return [ns for ns, _ in self.members]

    def check(self) -> None:
        """NetnsError unless the set can be made as asked (names, addresses); creates nothing."""
        check_index(self.index)
        if not self.members:
            raise NetnsError(f"netns bridge {self.tag!r} has no member")
        check_ifname(self.bridge)
        for i, (ns, addr) in enumerate(self.members):
            for name in self.veth(i):
                check_ifname(name)
            if not ns.startswith(self.tag):
                raise NetnsError(f"namespace {ns!r} of netns bridge {self.tag!r} must start with the tag "
                                 f"{self.tag!r} (the tag's lock guards what the set removes)")
            check_bench_address(addr, self.index)
        for what, vals in (("namespace", self.namespaces), ("address", [a for _, a in self.members])):
            dup = sorted({v for v in vals if vals.count(v) > 1})
            if dup:
                raise NetnsError(f"netns bridge {self.tag!r}: {what} {', '.join(dup)} given twice")

    def create(self) -> "NetnsBridge":
        """Create the bridge, the namespaces, their veths, addresses and loopbacks (a stale set is removed first)."""
        self.check()
        self._acquire()
        self._remove()  # a stale set from a killed run would block us
        try:
            br = self.bridge
            _ip("link", "add", "name", br, "type", "bridge")
            _ip("link", "set", br, "addrgenmode", "none")      # no IPv6 link-local: the bridge has no address
            _ip("link", "set", br, "up")
            for i, (ns, addr) in enumerate(self.members):
                inner, port = self.veth(i)
                _ip("netns", "add", ns)
                _ip("link", "add", inner, "type", "veth", "peer", "name", port)
                _ip("link", "set", inner, "netns", ns)
                _ip("link", "set", port, "addrgenmode", "none")
                _ip("link", "set", port, "master", br, "up")
                _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", inner)
                _ip("-n", ns, "link", "set", inner, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
            self._check_isolated()
            self._check_netfilter()
        except BaseException:
            self.remove()
            raise
        return self

    def _check_isolated(self) -> None:
        """NetnsError when the bridge has an address or a port that is not the set's (it would reach out)."""
        r = subprocess.run(["ip", "-o", "addr", "show", "dev", self.bridge], capture_output=True, text=True, timeout=30)
        if r.stdout.strip():
            raise NetnsError(f"bridge {self.bridge} has an address ({r.stdout.split()[3]}); it must have none, "
                             "so nothing routes between the set and this machine")
        r = subprocess.run(["ip", "-o", "link", "show", "master", self.bridge], capture_output=True, text=True,
                           timeout=30)
        ports = {line.split(":")[1].strip().split("@")[0] for line in r.stdout.splitlines() if ":" in line}
        extra = ports - {self.veth(i)[1] for i in range(len(self.members))}
        if extra:
            raise NetnsError(f"bridge {self.bridge} has ports that are not the set's: {', '.join(sorted(extra))}")

    def _check_netfilter(self) -> None:
        """With bridge-nf-call-iptables = 1, one ping from the first member to the second must cross the bridge."""
        if len(self.members) < 2 or not bridge_nf_call_iptables() or shutil.which("ping") is None:
            return
        (ns, _), (_, addr) = self.members[:2]
        r = subprocess.run(["ip", "netns", "exec", ns, "ping", "-c", "1", "-W", "1", addr],
                           capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise NetnsError(
                f"frames across bridge {self.bridge} are dropped: {BRIDGE_NF_CALL_IPTABLES} is 1 (br_netfilter), "
                "so they pass this machine's iptables/nftables FORWARD rules, which drop them (ping "
                f"{ns} -> {addr} failed). Accept them for this bridge (iptables -I FORWARD -m physdev "
                f"--physdev-is-bridged -i {self.bridge} -j ACCEPT, or the nftables equivalent) or set "
                "net.bridge.bridge-nf-call-iptables=0 for the run; the lab changes neither")

    def _remove(self) -> None:
        # The veths go first and explicitly: deleting a namespace frees its interfaces only later, in
        # the kernel's own time, and a run killed between `link add` and `link set netns` leaves both
        # ends here.
        for i in range(len(self.members)):
            inner, port = self.veth(i)
            _quiet_ip("link", "del", port)
            _quiet_ip("link", "del", inner)
        _quiet_ip("link", "del", self.bridge)
        for ns in self.namespaces:
            _quiet_ip("netns", "del", ns)

    def exec_prefix(self, namespace: str) -> list[str]:
        """argv prefix that runs a command inside member ``namespace``."""
        if namespace not in self.namespaces:
            raise NetnsError(f"{namespace!r} is no namespace of netns bridge {self.tag!r}")
        return ["ip", "netns", "exec", namespace]

    def __enter__(self) -> "NetnsBridge":
        return self.create()

    def __exit__(self, *exc) -> None:
        self.remove()
