"""The engine's time bounds, declared once: :class:`Timeouts`.

Each bound is one field: its value in seconds and a one-line doc of the wait it ends. A node
reads them from its :class:`~peercache.config.NodeConfig` (``config.timeouts``); code that no
config reaches (a transport or directory client made on its own) reads :data:`DEFAULT`. The
native module takes its bounds as arguments of the calls that start a client, never its own.

``NodeConfig.timeout`` (key "timeout") stays the user's knob for a directory request and a whole
read; :attr:`Timeouts.directory_s` is its default and the bound where no config reaches.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional


def bound(default: Optional[float], doc: str) -> float:
    """A field of :class:`Timeouts`: ``default`` seconds, ``doc`` the wait it ends."""
    return dataclasses.field(default=default, metadata={"doc": doc, "unit": "s"})


@dataclass(frozen=True)
class Timeouts:
    """Every wait of the engine, in seconds (see the module doc)."""

    directory_s: float = bound(
        5.0, "a directory request without an answer, or a whole read (NodeConfig.timeout's default)")
    io_s: Optional[float] = bound(
        None, "one blocking socket call of a tcp data connection (None: the whole read's bound)")
    handshake_s: float = bound(
        2.0, "a control-plane connection's ZeroMQ handshake (ZMQ_HANDSHAKE_IVL) before it is dropped")
    monitor_drain_s: float = bound(
        1.0, "how often a control-plane client reads its connection's handshake events between timeouts")
    link_check_s: float = bound(
        0.05, "how often a control-plane call waiting for its reply checks that its connection is not lost "
              "or refused")
    reconnect_s: float = bound(
        0.1, "a control-plane client's retry of a refused or lost connection (plus up to as much at random); "
             "see RpcClient")
    rdma_connect_s: float = bound(
        5.0, "an rdma connection's set-up through the peer's control endpoint (the QP exchange)")
    rdma_completion_s: float = bound(
        5.0, "an rdma READ without a completion: a path fault, failed over to another rail")
    disconnect_s: float = bound(
        3.0, "all the goodbyes an rdma transport sends its peers' control endpoints when it closes")
    leave_s: float = bound(
        1.0, "the leave call a node sends its directory when it closes")
    thread_join_s: float = bound(
        5.0, "a background thread (heartbeats, control-plane server, metrics endpoint) to end at close")

    def io(self, whole_s: float) -> float:
        """The tcp bound on one blocking socket call, for reads whose whole bound is ``whole_s`` (the
        native read takes no per-call deadline, so by default no call may wait longer than the whole)."""
        return whole_s if self.io_s is None else self.io_s

    @classmethod
    def docs(cls) -> dict[str, tuple[str, str]]:
        """(unit, doc) of each bound, by field name."""
        return {f.name: (f.metadata["unit"], f.metadata["doc"]) for f in dataclasses.fields(cls)}


#: The bounds where no config reaches.
DEFAULT = Timeouts()
