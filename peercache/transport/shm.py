"""shm transport: a consumer on the producer's host maps its pool read-only.

The producer's pool is a memfd; its endpoint info names it by pid and fd
(``/proc/<pid>/fd/<fd>``) together with the host's identity (boot id,
hostname, pid namespace), so a consumer elsewhere refuses clearly instead of
mapping some other process's file. Copies run in the native module with the
same slot-tag check as every transport; the producer's liveness is checked
per batch (a pidfd), so a producer that exited reads as PEER_GONE, never as
its last bytes forever.
"""
from __future__ import annotations

import logging
import os
import socket
from typing import Any

from ..errors import TransportError, TransportUnavailable
from .base import Transport, native_module
from .handles import NativeReads, PeerHandles

log = logging.getLogger(__name__)


def boot_id() -> str:
    """This kernel's boot id (differs between hosts and across reboots)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def pid_namespace() -> str:
    """Identity of this process's pid namespace (pids mean nothing outside it)."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def start_time(pid: int) -> int:
    """Start time of ``pid`` in clock ticks since boot (field 22 of /proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        text = f.read()
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    return int(text.rsplit(")", 1)[1].split()[19])


def host_identity() -> dict[str, str]:
    """What must match between producer and consumer for shm to work."""
    return {"hostname": socket.gethostname(), "boot_id": boot_id(), "pidns": pid_namespace()}


#: How copies of 64 KiB or more are made (``_native.copy_way``): ``glibc`` (memcpy through the cache) or
#: ``stream`` (stores past it); the default is stream on AMD CPUs, glibc elsewhere (docs/performance.md).
COPY_WAYS = ("glibc", "stream")
COPY_WAY_ENV = "PEERCACHE_SHM_COPY"


def copy_way_from_env(mod) -> None:
    """Apply $PEERCACHE_SHM_COPY (when set) to this process's shm copies."""
    raw = os.environ.get(COPY_WAY_ENV)
    if not raw:
        return
    if raw not in COPY_WAYS:
        raise TransportError(f"{COPY_WAY_ENV}={raw!r}: one of {', '.join(COPY_WAYS)} (glibc: memcpy through "
                             "the cache; stream: stores past it; unset: stream on AMD CPUs, glibc elsewhere)")
    mod.copy_way(raw)


class ShmTransport(NativeReads, Transport):
    """Same-host transport: read-only mapping of the producer's memfd pool."""

    name = "shm"
    native = True

    def __init__(self, max_channels: int = 1, **_ignored: Any):
        mod, why = native_module()
        if mod is None:
            raise TransportUnavailable(f"--protocol shm needs the native module: {why}")
        copy_way_from_env(mod)
        self._mod = mod
        self._regions: list[tuple[int, int, int, int]] = []   # (id, rkey, fd, size)
        self.handles = PeerHandles(self._connect, "shm")

    # -- producer ----------------------------------------------------------------------
    def expose(self, region_id: int, buffer, rkey: int, **info: Any) -> None:
        fd, size = info.get("fd"), info.get("size")
        if fd is None or size is None:
            raise TransportError(f"shm can only expose a memfd-backed region (region {region_id} has "
                                 "no fd); use a peercache Pool or --protocol tcp")
        self._regions.append((int(region_id), int(rkey), int(fd), int(size)))

    def start(self, bind_host: str) -> dict[str, Any]:
        pid = os.getpid()
        return {"pid": pid, "start_time": start_time(pid), **host_identity(),
                "regions": [list(r) for r in self._regions]}

    # -- consumer ----------------------------------------------------------------------
    def native_peer(self, peer: str, info: dict[str, Any]):
        return self.handles.get(peer, info)

    def _connect(self, peer: str, info: dict[str, Any]):
        mine = host_identity()
        for field in ("boot_id", "hostname", "pidns"):
            if info.get(field) != mine[field]:
                raise TransportError(
                    f"shm peer {peer} runs on another host or pid namespace ({field} "
                    f"{info.get(field)!r}, here {mine[field]!r}); shm works only between processes "
                    "of one host: use --protocol tcp (or rdma) for this pair")
        try:
            regions = [(rid, rkey, f"/proc/{int(info['pid'])}/fd/{fd}", size)
                       for rid, rkey, fd, size in info["regions"]]
            return self._mod.shm_connect(int(info["pid"]), int(info["start_time"]), regions)
        except (KeyError, TypeError, ValueError) as e:
            raise TransportError(f"shm endpoint info of {peer} is incomplete ({e}); is the producer "
                                 "running a PeerCache with --protocol shm?") from e
        except ConnectionError as e:
            raise TransportError(f"cannot attach to the shm pool of {peer}: {e}") from e
