"""rdma transport: RC QPs per rail and channel, one-sided READs into registered buffers.

Producer: the pool is registered on every rail (one rkey per rail); its
endpoint info carries the rails and the per-rail keys, and its control
endpoint answers ``rdma_connect``: it creates one QP per (consumer rail,
channel), brings them to RTS against the consumer's QPs and replies with
its own QP numbers, PSNs, GIDs, LIDs and MTUs. Consumer: creates its QPs,
exchanges that information, moves them INIT -> RTR -> RTS and hands the
connection to the native batch path (``peercache._native.adopt``), which
plans, posts and polls without the GIL.

Failures (native/verbs.c, native/verbs_rail.c): a READ that fails for the
op itself (a wrong key, a range the region lacks) marks the connection
dead; the node drops it and the next batch connects again with fresh QPs on
both sides (the channel reset). A READ that fails for the path (transport
errors: retries exceeded, flushed, no completion in time) takes that rail out
of the connection's plans and its reads are read once more over the other
rails in the same batch call; a rail whose port leaves ACTIVE (the device's
async events, watched by a thread per rail) is out of every plan. A rail
comes back when its port is ACTIVE again and one probe read over it
succeeded; the connection that lost it is replaced by the next batch (fresh
QPs on it). A batch fails only when no rail can carry it, and its error
names every rail and its state. :meth:`RdmaTransport.rail_stats` has the
per-rail counters.
"""
from __future__ import annotations

import ipaddress
import logging
import threading
import time
import uuid
from collections import OrderedDict
from typing import Any

import numpy as np

from ..errors import PeerCacheError, TransportError, TransportUnavailable
from ..rdma import devices
from ..rdma.completion import wc_name
from ..rpc import RpcClient
from ..timeouts import DEFAULT as TIMEOUTS
from .base import OP_DTYPE, Transport, native_module
from .handles import PeerHandles

log = logging.getLogger(__name__)

#: Consumer connections a producer keeps QPs for (oldest dropped beyond this).
MAX_ACCEPTED = 256
#: Local buffers kept registered per process (least recently used dropped beyond this).
MAX_LOCAL_REGISTRATIONS = 64
#: Ops up to this size may land in unregistered memory (the native side bounces them).
BOUNCE_MAX = 64


def buffer_address(buf) -> tuple[int, int]:
    """(address, bytes) of a C-contiguous buffer-protocol object."""
    a = np.frombuffer(buf, dtype=np.uint8) if not isinstance(buf, np.ndarray) else buf
    return int(a.ctypes.data), int(a.nbytes)


class RdmaTransport(Transport):
    """RDMA READ transport over one or more rails (devices) in this process."""

    name = "rdma"
    native = True
    needs_registered_memory = True

    def __init__(self, max_channels: int = 4, *, devices: list[str] | None = None, device_name: str | None = None, ib_port: int = 1,
                 gid_index: int | None = None, sq_depth: int = 256, timeout_s: float = TIMEOUTS.rdma_completion_s,
                 signal_every: int = 16, max_chain: int = 64, connect_timeout: float = TIMEOUTS.rdma_connect_s,
                 **_ignored: Any):
        names = list(devices or ([device_name] if device_name else []))
        self.specs = _discover(names, ib_port, gid_index)
        mod, why = native_module()
        if mod is None:
            raise TransportUnavailable(f"--protocol rdma needs the native module: {why}")
        self._native = mod
        self._verbs = devices_module().load_verbs()
        self.channels = max(1, min(int(max_channels), self._verbs.MAX_CHANNELS))
        self.sq_depth, self.timeout_s = sq_depth, timeout_s
        self.signal_every, self.max_chain = signal_every, max_chain
        self.connect_timeout = connect_timeout
        self.id = uuid.uuid4().hex
        self.rails = []
        try:
            for s in self.specs:
                self.rails.append(self._verbs.Rail(s.device, s.port, s.gid_index, s.numa))
        except OSError as e:
            self.rails.clear()
            raise TransportUnavailable(f"--protocol rdma: {e}") from e
        self._regions: list[tuple[int, int, int, list[tuple[int, int]]]] = []
        self._accepted: OrderedDict[str, Any] = OrderedDict()
        self.handles = PeerHandles(self._connect, "rdma")
        self._ctl: dict[str, tuple[str, str]] = {}   # consumer id -> (peer, control endpoint) we connected with
        self._paths: dict[str, list[dict[str, Any]]] = {}   # peer -> its QPs as connected (qp_info)
        self._locals: OrderedDict[tuple[int, int], list] = OrderedDict()
        self._lock = threading.Lock()
        self._final_stats: list[dict[str, Any]] = []   # rail_stats() as they were at close()

    # -- description ---------------------------------------------------------------
    def rail_info(self) -> list[dict[str, Any]]:
        """Device, port, GID, MTU, NUMA node and limits of each rail (JSON-ready)."""
        out = []
        for r, s in zip(self.rails, self.specs):
            d = r.info()
            d["gid"] = str(ipaddress.IPv6Address(bytes(d["gid"])))
            # The port's MTU now (Soft-RoCE's follows its netdev), not the one seen at discovery.
            out.append(dict(d, mtu_bytes=devices.MTU_BYTES.get(int(d.get("mtu", 0)), s.mtu)))
        return out

    def rail_stats(self) -> list[dict[str, Any]]:
        """Per rail, cumulative since this transport opened it: ``rail`` (device), ``state`` ("up",
        or "down": its port is not ACTIVE, or is again but no probe read has succeeded yet),
        ``bytes_read`` and ``reads`` (READs completed), ``completion_errors`` (``IBV_WC_*`` name ->
        error completions), ``qp_resets`` (QPs taken out after an error; fresh ones replace them),
        ``downs`` and ``ups``. After :meth:`close`, the figures it closed with."""
        rails = self.rails
        if not rails:
            return [dict(d, completion_errors=dict(d["completion_errors"])) for d in self._final_stats]
        out = []
        for r in rails:
            s = r.stats()
            out.append({"rail": s["name"], "state": "up" if s["state"] == "up" else "down",
                        **{k: s[k] for k in self.RAIL_COUNTS},
                        "completion_errors": {wc_name(code): n for code, n in sorted(s["wc_errors"].items())}})
        return out

    # -- producer ------------------------------------------------------------------
    def expose(self, region_id: int, buffer, rkey: int, **info: Any) -> None:
        keys = []
        for r in self.rails:
            try:
                addr, _lkey, rk, _numa = r.register(buffer)
            except OSError as e:
                raise TransportError(f"cannot register region {region_id} for rdma: {e}") from e
            keys.append((addr, rk))
        size = buffer_address(buffer)[1]
        self._regions.append((int(region_id), int(rkey), size, keys))

    def start(self, bind_host: str) -> dict[str, Any]:
        return {"host": bind_host, "rails": [{"device": s.device, "port": s.port, "numa": s.numa,
                                              "link_layer": s.link_layer, "mtu": s.mtu} for s in self.specs],
                "regions": [[rid, cap, size, [list(k) for k in keys]] for rid, cap, size, keys in self._regions]}

    def control_handlers(self) -> dict:
        """Control ops this transport serves on the node's control endpoint."""
        return {"rdma_connect": self._accept, "rdma_disconnect": self._disconnect}

    def _accept(self, msg: dict) -> dict:
        """Create QPs for a consumer's (rail, channel) pairs and bring them to RTS."""
        consumer, nrails, nchan = str(msg["consumer"]), int(msg["rails"]), int(msg["channels"])
        qps = msg["qps"]
        if not self.rails:
            raise TransportError(f"rdma_connect from {consumer}: this node's rdma transport is closed (the node "
                                 "is leaving); connect to a node that is running")
        if not 1 <= nrails <= self._verbs.MAX_RAILS or not 1 <= nchan <= self._verbs.MAX_CHANNELS:
            raise TransportError(f"rdma_connect asks for {nrails} rails x {nchan} channels; the limits "
                                 f"are {self._verbs.MAX_RAILS} x {self._verbs.MAX_CHANNELS}")
        # Consumer rail i talks to producer rail i mod n: equal counts pair one to one.
        mine = [self.rails[i % len(self.rails)] for i in range(nrails)]
        try:
            ch = self._verbs.Channels(mine, nchan, self.sq_depth, self.timeout_s)
            ch.connect(qps)
        except (OSError, ValueError) as e:
            raise TransportError(f"rdma_connect from {consumer}: {e}") from e
        with self._lock:
            old = self._accepted.pop(consumer, None)
            self._accepted[consumer] = ch
            while len(self._accepted) > MAX_ACCEPTED:
                self._accepted.popitem(last=False)[1].close()
        if old is not None:
            old.close()
        regions = [[rid, cap, size, [list(keys[i % len(keys)]) for i in range(nrails)]]
                   for rid, cap, size, keys in self._regions]
        return {"qps": ch.local_info(), "regions": regions}

    def accepted_info(self) -> dict[str, list[dict[str, Any]]]:
        """The QPs this producer holds for each consumer, as the device reports them now."""
        with self._lock:
            accepted = list(self._accepted.items())
        out = {}
        for consumer, ch in accepted:
            try:
                out[consumer] = _qp_info(ch)
            except (OSError, ValueError):
                pass    # closed meanwhile
        return out

    def _disconnect(self, msg: dict) -> dict:
        with self._lock:
            ch = self._accepted.pop(str(msg["consumer"]), None)
        if ch is not None:
            ch.close()
        return {"closed": ch is not None}

    # -- consumer ------------------------------------------------------------------
    def native_peer(self, peer: str, info: dict[str, Any]):
        return self.handles.get(peer, info)

    def connection_info(self, peer: str) -> list[dict[str, Any]] | None:
        """The QPs of the last connection made to ``peer`` as they were at RTS (``Channels.qp_info``):
        path MTU, READ limits, QP numbers; None if never connected."""
        with self._lock:
            return self._paths.get(peer)

    def _connect(self, peer: str, info: dict[str, Any], rkey_xor: int = 0, *, regions=None,
                 tag: str | None = None):
        """A connected native Peer.

        Fault injection in tests: ``rkey_xor`` corrupts the remote keys, ``regions`` maps the
        producer's region list to the one the connection uses, and ``tag`` makes it a separate
        consumer at the producer (so it does not replace the node's own QPs there).
        """
        try:
            host, port = info["host"], int(info["control_port"])
        except (KeyError, TypeError, ValueError) as e:
            raise TransportError(f"rdma endpoint info of {peer} lacks its control endpoint ({e}); is the "
                                 "producer running PeerCache with --protocol rdma?") from e
        try:
            ch = self._verbs.Channels(self.rails, self.channels, self.sq_depth, self.timeout_s)
        except OSError as e:
            raise TransportError(f"cannot create RC QPs for {peer}: {e}") from e
        consumer = f"{self.id}/{peer}" + (f"/{tag}" if tag else "")
        cli = RpcClient(f"{host}:{port}", timeout=self.connect_timeout, what=f"control endpoint of {peer}",
                        auth=self.credentials.curve)
        try:
            reply = cli.call("rdma_connect", consumer=consumer, rails=len(self.rails),
                             channels=self.channels, qps=ch.local_info())
            ch.connect(reply["qps"], self.signal_every, self.max_chain)
            regs = [(rid, cap, size, [(addr, rk ^ rkey_xor) for addr, rk in keys])
                    for rid, cap, size, keys in reply["regions"]]
            ch.set_regions(regions(regs) if regions is not None else regs)
            qps = _qp_info(ch)
        except (PeerCacheError, OSError, ValueError, KeyError, TypeError) as e:
            ch.close()
            raise TransportError(f"rdma connection to {peer} at {host}:{port} failed: {e}") from e
        finally:
            cli.close()
        with self._lock:
            self._ctl[consumer] = (peer, f"{host}:{port}")
            if tag is None:
                self._paths[peer] = qps
        return self._native.adopt(ch.handoff())

    def prepare_local(self, buf) -> None:
        """Register a destination buffer on every rail (kept, least recently used dropped)."""
        key = buffer_address(buf)
        with self._lock:
            if key in self._locals:
                self._locals.move_to_end(key)
                return
        regs = []
        try:
            for r in self.rails:
                regs.append((r, r.register(buf)[0]))
        except OSError as e:
            for r, addr in regs:
                r.deregister(addr)
            raise TransportError(f"cannot register the receive buffer ({key[1]} bytes) for rdma: {e}") from e
        with self._lock:
            self._locals[key] = regs
            while len(self._locals) > MAX_LOCAL_REGISTRATIONS:
                for r, addr in self._locals.popitem(last=False)[1]:
                    r.deregister(addr)

    def prepare_device(self, addr: int, length: int, dmabuf_fd: int = -1, numa: int = -1) -> None:
        """Register GPU memory on every rail: by dma-buf when ``dmabuf_fd`` >= 0, else by address."""
        key = (int(addr), int(length))
        regs = []
        try:
            for r in self.rails:
                regs.append((r, r.register_device(addr, length, dmabuf_fd, 0, numa)[0]))
        except OSError:
            for r, a in regs:
                r.deregister(a)
            raise
        with self._lock:
            self._locals[key] = regs

    def read_batch(self, peer: str, info: dict[str, Any], ops: np.ndarray, local: list) -> np.ndarray:
        ops = np.ascontiguousarray(ops, dtype=OP_DTYPE)
        for j, buf in enumerate(local):
            if (ops["length"][ops["local_region"] == j] > BOUNCE_MAX).any():
                self.prepare_local(buf)
        return self.handles.read(peer, info, ops, local)

    def forget(self, peer: str) -> None:
        self.handles.drop(peer)

    def close(self) -> None:
        if self.rails:
            self._final_stats = self.rail_stats()
        self.handles.close()
        with self._lock:
            accepted, self._accepted = list(self._accepted.values()), OrderedDict()
            locals_, self._locals = list(self._locals.values()), OrderedDict()
            ctl, self._ctl = dict(self._ctl), {}
        self._tell_producers(ctl)
        for ch in accepted:
            ch.close()
        for regs in locals_:
            for r, addr in regs:
                r.deregister(addr)
        self.rails = []


    def _tell_producers(self, ctl: dict[str, tuple[str, str]]) -> None:
        """Ask producers to destroy the QPs they keep for us (bounded, best effort)."""
        deadline = time.monotonic() + TIMEOUTS.disconnect_s
        for consumer, (peer, addr) in ctl.items():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            cli = RpcClient(addr, timeout=min(0.5, left), what=f"control endpoint of {peer}",
                        auth=self.credentials.curve)
            try:
                cli.call("rdma_disconnect", consumer=consumer)
            except PeerCacheError:
                pass   # gone already: it drops our QPs when it exits
            finally:
                cli.close()


def _qp_info(ch) -> list[dict[str, Any]]:
    """``ch.qp_info()``, or [] from a verbs module without it (an older build, a stand-in)."""
    fn = getattr(ch, "qp_info", None)
    return fn() if fn is not None else []


def devices_module():
    """The device-discovery module (a seam for tests)."""
    return devices


def _discover(names: list[str], port: int, gid_index: int | None):
    if port < 1:
        raise TransportUnavailable(f"--ib-port must be >= 1, got {port}")
    return devices_module().discover(names, port, gid_index)

