"""RDMA device discovery for the engine: which rails to open, on which port and GID.

Device list and port attributes come from pyverbs (rdma-core's Python
binding); the GID table from pyverbs' ``query_gid_table`` or, where that is
missing, from sysfs. Choosing a GID and checking prerequisites are pure
functions over those records, so they are tested without a device. Every
failure names the missing piece and what to do about it.
"""
from __future__ import annotations

import importlib
import ipaddress
from dataclasses import dataclass

from .. import sysfs
from ..sysfs import gid_ipv4
from ..errors import TransportUnavailable

#: ``enum ibv_port_state`` / ``ibv_link_layer`` / ``ibv_gid_type`` values used here.
PORT_ACTIVE = 4
LINK_IB, LINK_ETHERNET = 1, 2
GID_TYPE_IB, GID_TYPE_ROCE_V1, GID_TYPE_ROCE_V2 = 0, 1, 2
MTU_BYTES = {1: 256, 2: 512, 3: 1024, 4: 2048, 5: 4096}
PORT_STATES = {0: "NOP", 1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}

PYVERBS_HINT = ("install rdma-core's binding (Debian/Ubuntu: apt-get install python3-pyverbs; MLNX_OFED "
                "ships it too) and make it visible to this Python, or from PyPI: "
                "pip install 'cython<3.1' && pip install --no-build-isolation pyverbs")
VERBS_HINT = ("the native verbs backend (peercache._verbs) is not built: install libibverbs-dev "
              "(rdma-core headers) and rebuild with `pip install -e .`")


@dataclass(frozen=True)
class GidEntry:
    """One populated GID table entry of a port."""

    index: int
    gid: str          #: colon-separated hex, as in sysfs
    gid_type: int     #: GID_TYPE_*


@dataclass(frozen=True)
class RailSpec:
    """One rail to open: a device port with its addressing and NUMA node."""

    device: str
    port: int
    gid_index: int    #: -1: no GRH (InfiniBand addressed by LID)
    numa: int         #: -1 unknown
    link_layer: int
    mtu: int          #: active MTU in bytes


def _is_zero(gid: str) -> bool:
    try:
        return int(ipaddress.IPv6Address(gid)) == 0
    except ValueError:
        return True


def pick_gid_index(entries: list[GidEntry]) -> int | None:
    """The RoCE v2 GID to use: IPv4-mapped first, then global IPv6, then link-local."""
    v2 = [e for e in entries if e.gid_type == GID_TYPE_ROCE_V2 and not _is_zero(e.gid)]

    def rank(e: GidEntry) -> tuple[int, int]:
        if gid_ipv4(e.gid):
            return (0, e.index)
        return (2 if ipaddress.IPv6Address(e.gid).is_link_local else 1, e.index)

    return min(v2, key=rank).index if v2 else None


def sysfs_gids(device: str, port: int, root: str | None = None) -> list[GidEntry]:
    """Populated GID entries of a port read from sysfs under ``root`` (types from gid_attrs/types)."""
    out = []
    for e in sysfs.gid_table(device, port, root)[0]:
        if e["type"] is None:
            continue   # unpopulated entries have no type (EINVAL on read)
        kind = e["type"].lower()
        gtype = GID_TYPE_ROCE_V2 if "v2" in kind else (GID_TYPE_ROCE_V1 if "roce" in kind else GID_TYPE_IB)
        out.append(GidEntry(e["index"], e["gid"], gtype))
    return out


def device_numa(device: str, root: str | None = None) -> int:
    """NUMA node of an RDMA device's PCI function (-1 unknown)."""
    text, _ = sysfs.read_attr(sysfs.sysfs_path("class", "infiniband", device, "device", "numa_node", root=root))
    try:
        return int(text) if text is not None else -1
    except ValueError:
        return -1


def load_pyverbs():
    """``pyverbs.device`` or TransportUnavailable naming how to install it."""
    try:
        return importlib.import_module("pyverbs.device")
    except ImportError as e:
        raise TransportUnavailable(f"--protocol rdma: no pyverbs ({e}); {PYVERBS_HINT}") from e


def load_verbs():
    """``peercache._verbs`` or TransportUnavailable saying how to build it."""
    try:
        return importlib.import_module("peercache._verbs")
    except ImportError as e:
        raise TransportUnavailable(f"--protocol rdma: {VERBS_HINT} ({e})") from e


def list_devices(pv) -> list[str]:
    """Names of the RDMA devices, or TransportUnavailable when there are none."""
    try:
        devs = pv.get_device_list()
    except Exception as e:  # pyverbs raises when ibv_get_device_list returns NULL (no kernel support)
        why = str(e)
        try:
            names, err = load_verbs().devices()
            why = err or why
        except TransportUnavailable:
            pass
        raise TransportUnavailable(
            f"--protocol rdma: no RDMA device: ibv_get_device_list returned 0 devices ({why}); load the "
            "NIC's RDMA driver (ib_uverbs), or set up Soft-RoCE for a try on one box "
            "(modprobe rdma_rxe; rdma link add rxe0 type rxe netdev eth0); check with ibv_devices") from e
    names = [d.name.decode() if isinstance(d.name, bytes) else str(d.name) for d in devs]
    if not names:
        raise TransportUnavailable(
            "--protocol rdma: no RDMA device: ibv_get_device_list returned 0 devices; load the NIC's RDMA "
            "driver or set up Soft-RoCE (modprobe rdma_rxe; rdma link add rxe0 type rxe netdev eth0)")
    return names


def choose(wanted: list[str], present: list[str]) -> list[str]:
    """The devices to open: the named ones (all must exist), else the first present."""
    if not wanted:
        return present[:1]
    missing = [d for d in wanted if d not in present]
    if missing:
        raise TransportUnavailable(
            f"--protocol rdma: device {', '.join(missing)} named in --devices/--device-name not found; "
            f"this host has {', '.join(present)} (see ibv_devices)")
    if len(set(wanted)) != len(wanted):
        raise TransportUnavailable(f"--devices lists a device twice: {','.join(wanted)}")
    return wanted


def rail_spec(device: str, port: int, port_attr, gids: list[GidEntry], gid_index: int | None,
              numa: int) -> RailSpec:
    """Check one port and pick its GID (pure: port_attr needs state/link_layer/active_mtu)."""
    state = int(port_attr.state)
    if state != PORT_ACTIVE:
        raise TransportUnavailable(
            f"--protocol rdma: port {port} of {device} is {PORT_STATES.get(state, state)}, not ACTIVE; "
            f"check the cable/link (ibv_devinfo -d {device}) or choose another --ib-port")
    link = int(port_attr.link_layer)
    if gid_index is None:
        if link == LINK_ETHERNET:
            gid_index = pick_gid_index(gids)
            if gid_index is None:
                raise TransportUnavailable(
                    f"--protocol rdma: no RoCE v2 GID on {device} port {port} (the GID table has "
                    f"{len(gids)} populated entries); give the netdev an IP address, or choose an "
                    "entry with --gid-index (show_gids / ibv_devinfo -v)")
        else:
            gid_index = -1   # InfiniBand: LID routing, no GRH
    elif gids and gid_index not in {g.index for g in gids}:
        raise TransportUnavailable(
            f"--protocol rdma: --gid-index {gid_index} is not populated on {device} port {port} "
            f"(populated: {', '.join(str(g.index) for g in gids) or 'none'})")
    return RailSpec(device, port, gid_index, numa, link, MTU_BYTES.get(int(port_attr.active_mtu), 0))


def _gid_table(ctx, pv, device: str, port: int, root: str | None) -> list[GidEntry]:
    try:
        table = ctx.query_gid_table(256)
        out = [GidEntry(int(e.gid_index), str(e.gid_str() if callable(e.gid_str) else e.gid_str),
                        int(e.gid_type)) for e in table if int(e.port_num) == port]
        return [e for e in out if not _is_zero(e.gid)]
    except Exception:  # older rdma-core: no ibv_query_gid_ex; sysfs has the same table
        return sysfs_gids(device, port, root)


def discover(devices: list[str], port: int = 1, gid_index: int | None = None,
             root: str | None = None) -> list[RailSpec]:
    """One RailSpec per rail, or TransportUnavailable naming what is missing."""
    pv = load_pyverbs()
    load_verbs()
    names = choose(devices, list_devices(pv))
    specs = []
    for name in names:
        try:
            ctx = pv.Context(name=name)
        except Exception as e:
            raise TransportUnavailable(f"--protocol rdma: cannot open {name}: {e}; check permissions on "
                                       "/dev/infiniband (root or the rdma group)") from e
        try:
            try:
                attr = ctx.query_port(port)
            except Exception as e:
                raise TransportUnavailable(f"--protocol rdma: {name} has no port {port} ({e}); "
                                           "check --ib-port") from e
            specs.append(rail_spec(name, port, attr, _gid_table(ctx, pv, name, port, root), gid_index,
                                   device_numa(name, root)))
        finally:
            ctx.close()
    return specs
