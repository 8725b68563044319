"""Data-path transports: one interface, three implementations (tcp, shm, rdma)."""
from __future__ import annotations

from ..errors import ConfigError, TransportUnavailable
from .base import LOC_DTYPE, OP_DTYPE, Status, Transport, native_module

PROTOCOLS = ("tcp", "shm", "rdma")


def make_transport(protocol: str, **options) -> Transport:
    """The transport for ``protocol``, or a ConfigError naming what is available.

    tcp and shm need the native module (TransportUnavailable, saying how to build it, when it is
    missing); the tcp client is the native one (tests/oracles/tcp_client.py holds its Python twin,
    for the tests only).
    """
    # Each transport is imported here, when asked for, not at the top: a process loads only the one
    # it uses (rdma brings the verbs extension and its control plane).
    if protocol == "tcp":
        from .tcp import TcpTransport     # on demand, as said above
        mod, why = native_module()
        if mod is None:
            raise TransportUnavailable(f"the tcp transport needs the native module: {why}")
        return TcpTransport(**options)
    if protocol == "shm":
        from .shm import ShmTransport     # on demand
        return ShmTransport(**options)
    if protocol == "rdma":
        from .rdma import RdmaTransport   # on demand: the verbs extension and its control plane
        return RdmaTransport(**options)
    raise ConfigError(f"unknown protocol {protocol!r}; choose one of {', '.join(PROTOCOLS)}")


__all__ = ["LOC_DTYPE", "OP_DTYPE", "Status", "Transport", "make_transport", "native_module", "PROTOCOLS"]
