"""The guest's two RDMA hosts: a producer end and a consumer end of one veth pair per rail.

Each rail is a veth pair, ``pcg<i>a`` (producer, 198.18.<i>.1) and
``pcg<i>b`` (consumer, 198.18.<i>.2), with a Soft-RoCE device on each end
(``rxe_a<i>``, ``rxe_b<i>``). Addresses come from 198.18.0.0/15 (RFC 2544,
benchmarking), exist only inside the guest, and the guest has no NIC.

Why both ends stay in the guest's root namespace rather than in two network
namespaces: Debian 12's kernel (6.1) opens rxe's UDP socket and looks its
routes up in the initial namespace only (per-namespace rxe came in later
kernels), so an rxe device on a veth end moved into a namespace never gets
its packets; a READ between two such namespaces fails with a completion
error (captured in tests/fixtures/lab/perftest). In the root namespace two
local addresses would be delivered through ``lo``, skipping the veth and any
rxe device, so the script moves the ``local`` routing rule behind one rule
per veth end: a packet rxe sends out of ``pcg<i>a`` (rxe routes with the
device as output interface) really crosses the pair and arrives on
``pcg<i>b``, where ``accept_local`` lets a packet from a local address in.
Neighbours are static, so no ARP is needed. Processes of both "hosts" share
the guest's TCP/IP stack for their control traffic; RDMA traffic crosses the
veth pair, as each port's counters show.

A cluster's hosts (``cluster_hosts`` N): host i is a veth end ``pch<i>``
(198.18.100.<i>) with its own rxe device ``rxe_h<i>``, the other end on one
bridge ``pcbr``; the same rule move and one rule table per host end (a route
and a static neighbour for every other host) send what rxe sends out of
``pch<i>`` across the bridge to the host it is for.

The builder is pure: :func:`setup_script` returns the shell text the guest
runs, :func:`environment` the variables the command sees.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

NET_PREFIX = "198.18"
#: Most rails a guest gets (each takes a /24 of 198.18.0.0/16 and two rule tables).
MAX_RAILS = 8
#: Most cluster hosts a guest gets, and the /24 of 198.18.0.0/16 they share.
MAX_CLUSTER_HOSTS = 16
CLUSTER_NET = 100


@dataclass(frozen=True)
class Topology:
    """How many rails, and the netdev MTU of each end (rxe's active MTU follows from it)."""

    rails: int = 2                    #: veth pairs, each with an rxe device on both ends
    mtu: int = 1500                   #: producer-end netdev MTU (1500 gives rxe an active MTU of 1024)
    consumer_mtu: int | None = None   #: consumer-end MTU when it differs (None: same as ``mtu``)
    cluster_hosts: int = 0            #: hosts on one bridge, each with an rxe device of its own

    def __post_init__(self):
        if not 0 <= self.rails <= MAX_RAILS:
            raise ValueError(f"guest topology: rails={self.rails} outside 0..{MAX_RAILS}")
        if not (self.cluster_hosts == 0 or 2 <= self.cluster_hosts <= MAX_CLUSTER_HOSTS):
            raise ValueError(f"guest topology: cluster_hosts={self.cluster_hosts} is neither 0 nor in "
                             f"2..{MAX_CLUSTER_HOSTS}")
        for m in (self.mtu, self.consumer_mtu):
            if m is not None and not 1280 <= m <= 65535:
                raise ValueError(f"guest topology: MTU {m} outside 1280..65535")

    def producer_devices(self) -> list[str]:
        return [f"rxe_a{i}" for i in range(self.rails)]

    def consumer_devices(self) -> list[str]:
        return [f"rxe_b{i}" for i in range(self.rails)]

    def producer_addr(self, rail: int = 0) -> str:
        return f"{NET_PREFIX}.{rail}.1"

    def consumer_addr(self, rail: int = 0) -> str:
        return f"{NET_PREFIX}.{rail}.2"

    def cluster_devices(self) -> list[str]:
        return [f"rxe_h{i}" for i in range(1, self.cluster_hosts + 1)]

    def cluster_addr(self, host: int) -> str:
        """Host ``host``'s address (1-based)."""
        return f"{NET_PREFIX}.{CLUSTER_NET}.{host}"


def setup_script(t: Topology) -> str:
    """The shell commands that build ``t`` inside the guest (pure; ``set -e``: any failure stops it)."""
    lines = ["set -e"]
    if t.rails or t.cluster_hosts:
        lines += ["sysctl -qw net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0 "
                  "net.ipv4.conf.all.accept_local=1 net.ipv4.conf.default.accept_local=1",
                  "ip rule add pref 1000 lookup local", "ip rule del pref 0 lookup local"]
    for i in range(t.rails):
        a, b = f"pcg{i}a", f"pcg{i}b"
        ta, tb = 101 + 2 * i, 102 + 2 * i
        cmtu = t.consumer_mtu or t.mtu
        lines += [
            f"ip link add {a} mtu {t.mtu} type veth peer name {b} mtu {cmtu}",
            *(f"sysctl -qw net.ipv4.conf.{d}.rp_filter=0 net.ipv4.conf.{d}.accept_local=1" for d in (a, b)),
            f"ip addr add {t.producer_addr(i)}/32 dev {a}",
            f"ip addr add {t.consumer_addr(i)}/32 dev {b}",
            f"ip link set {a} up", f"ip link set {b} up",
            f"ip rule add pref {ta} oif {a} lookup {ta}",
            f"ip rule add pref {tb} oif {b} lookup {tb}",
            f"ip route add {t.consumer_addr(i)} dev {a} src {t.producer_addr(i)} table {ta}",
            f"ip route add {t.producer_addr(i)} dev {b} src {t.consumer_addr(i)} table {tb}",
            f"ip neigh replace {t.consumer_addr(i)} lladdr $(cat /sys/class/net/{b}/address) dev {a} nud permanent",
            f"ip neigh replace {t.producer_addr(i)} lladdr $(cat /sys/class/net/{a}/address) dev {b} nud permanent",
            f"rdma link add rxe_a{i} type rxe netdev {a}",
            f"rdma link add rxe_b{i} type rxe netdev {b}",
        ]
    if t.cluster_hosts:
        lines += ["ip link add pcbr type bridge", "ip link set pcbr up"]
    hosts = range(1, t.cluster_hosts + 1)
    for i in hosts:
        lines += [f"ip link add pch{i} mtu {t.mtu} type veth peer name pcp{i} mtu {t.mtu}",
                  f"ip link set pcp{i} master pcbr", f"ip link set pcp{i} up",
                  f"sysctl -qw net.ipv4.conf.pch{i}.rp_filter=0 net.ipv4.conf.pch{i}.accept_local=1",
                  f"ip addr add {t.cluster_addr(i)}/32 dev pch{i}", f"ip link set pch{i} up",
                  f"rdma link add rxe_h{i} type rxe netdev pch{i}"]
    for i in hosts:
        table = 200 + i
        lines.append(f"ip rule add pref {table} oif pch{i} lookup {table}")
        for j in hosts:
            if j != i:
                lines += [f"ip route add {t.cluster_addr(j)} dev pch{i} src {t.cluster_addr(i)} table {table}",
                          f"ip neigh replace {t.cluster_addr(j)} lladdr $(cat /sys/class/net/pch{j}/address) "
                          f"dev pch{i} nud permanent"]
    for dev in t.producer_devices() + t.consumer_devices() + t.cluster_devices():
        # The port turns ACTIVE asynchronously; wait for it (bounded) so the command never races it.
        lines.append(f"n=0; until grep -q ACTIVE /sys/class/infiniband/{dev}/ports/1/state; do "
                     f"n=$((n+1)); [ $n -lt 100 ] || {{ echo 'pcguest: {dev} port never became ACTIVE'; exit 1; }}; "
                     "sleep 0.1; done")
    if t.rails or t.cluster_hosts:
        lines.append("echo \"pcguest: RDMA devices: $(ls /sys/class/infiniband | tr '\\n' ' ')\"")
    return "\n".join(lines) + "\n"


def environment(t: Topology) -> dict[str, str]:
    """Variables the guest's command sees: which devices and addresses belong to which host
    (``PEERCACHE_CLUSTER_HOSTS``: a cluster's hosts as DEVICE@ADDRESS, comma-separated)."""
    env = ({"PEERCACHE_CLUSTER_HOSTS": ",".join(f"{d}@{t.cluster_addr(i + 1)}"
                                                for i, d in enumerate(t.cluster_devices()))}
           if t.cluster_hosts else {})
    if not t.rails:
        return env
    return {**env,
        "PEERCACHE_RDMA_PRODUCER": ",".join(t.producer_devices()),
        "PEERCACHE_RDMA_CONSUMER": ",".join(t.consumer_devices()),
        "PEERCACHE_GUEST_PRODUCER_ADDR": t.producer_addr(),
        "PEERCACHE_GUEST_CONSUMER_ADDR": t.consumer_addr(),
    }


def describe(t: Topology) -> dict:
    """The topology as a JSON-ready dict (for meta blocks), devices and addresses spelled out."""
    d = asdict(t)
    d.update(producer_devices=t.producer_devices(), consumer_devices=t.consumer_devices(),
             producer_addrs=[t.producer_addr(i) for i in range(t.rails)],
             consumer_addrs=[t.consumer_addr(i) for i in range(t.rails)],
             cluster_devices=t.cluster_devices(),
             cluster_addrs=[t.cluster_addr(i) for i in range(1, t.cluster_hosts + 1)])
    return d
