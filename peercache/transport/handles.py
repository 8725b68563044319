"""Connected native peer handles, shared by the transports whose data path is native.

tcp, shm and rdma differ in how they connect to a peer; once connected,
each holds a ``peercache._native.Peer`` per peer, hands it to the native
batch path, reconnects it when it died, and drops it when the peer left.
That bookkeeping lives here once.
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable

import numpy as np

from ..errors import TransportError
from .base import OP_DTYPE, Status

log = logging.getLogger(__name__)


class PeerHandles:
    """Native handles by peer id; ``connect(peer, info)`` makes a new one."""

    def __init__(self, connect: Callable[[str, dict[str, Any]], Any], what: str):
        self._connect = connect
        self.what = what                    #: transport name, for messages
        self._handles: dict[str, Any] = {}
        self._lock = threading.Lock()
        # One connect at a time: two threads must not both set up QPs/channels to one peer.
        self._connecting = threading.Lock()

    def get(self, peer: str, info: dict[str, Any]):
        """The live handle of ``peer``, connecting (again) when there is none."""
        with self._lock:
            h = self._handles.get(peer)
        if h is not None and h.alive():
            return h
        with self._connecting:
            with self._lock:
                h = self._handles.get(peer)
            if h is not None and h.alive():
                return h
            h = self._connect(peer, info)
            with self._lock:
                self._handles[peer] = h
            return h

    def read(self, peer: str, info: dict[str, Any], ops: np.ndarray, local: list) -> np.ndarray:
        """One batch through the native handle: a status per op, never an exception."""
        ops = np.ascontiguousarray(ops, dtype=OP_DTYPE)
        status = np.zeros(len(ops), dtype=np.int32)
        try:
            h = self.get(peer, info)
        except TransportError as e:
            log.warning("%s", e)
            status[:] = Status.PEER_GONE
            return status
        err = h.read_batch(ops, local, status)
        if err:
            log.warning("%s read from %s failed: %s", self.what, peer, err)
            if not h.alive():
                self.drop(peer)
        return status

    def drop(self, peer: str) -> None:
        """Forget ``peer``'s handle (it left, restarted or died)."""
        with self._lock:
            h = self._handles.pop(peer, None)
        if h is not None:
            h.close()

    def close(self) -> None:
        """Close every handle."""
        with self._lock:
            handles, self._handles = list(self._handles.values()), {}
        for h in handles:
            h.close()


class NativeReads:
    """The read side of a transport whose data path is its ``handles`` (a :class:`PeerHandles`): reads,
    forgetting a peer and closing are the handles' own. Listed before :class:`Transport` in its bases."""

    handles: PeerHandles

    def read_batch(self, peer: str, info: dict[str, Any], ops: np.ndarray, local: list) -> np.ndarray:
        return self.handles.read(peer, info, ops, local)

    def forget(self, peer: str) -> None:
        self.handles.drop(peer)

    def close(self) -> None:
        self.handles.close()
