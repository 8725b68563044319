"""Data-path transports: one interface, three implementations (tcp, shm, rdma)."""
from __future__ import annotations

from ..errors import ConfigError, TransportUnavailable
from .base import LOC_DTYPE, OP_DTYPE, Status, Transport, native_module

PROTOCOLS = ("tcp", "shm", "rdma")


def make_transport(protocol: str, native: bool | None = None, **options) -> Transport:
    """The transport for ``protocol``, or a ConfigError naming what is available.

    ``native`` (tcp only): None or True = the native client (TransportUnavailable,
    saying how to build it, when the extension is missing); False = the pure-Python
    client (the reference the native one is compared with).
    """
    if protocol == "tcp":
        from .tcp import NativeTcpTransport, TcpTransport
        mod, why = native_module()
        if native is False:
            return TcpTransport(**options)
        if mod is None:
            raise TransportUnavailable(f"the tcp transport needs the native module: {why}")
        return NativeTcpTransport(**options)
    if protocol == "shm":
        from .shm import ShmTransport
        return ShmTransport(**options)
    if protocol == "rdma":
        from .rdma import RdmaTransport
        return RdmaTransport(**options)
    raise ConfigError(f"unknown protocol {protocol!r}; choose one of {', '.join(PROTOCOLS)}")


__all__ = ["LOC_DTYPE", "OP_DTYPE", "Status", "Transport", "make_transport", "native_module", "PROTOCOLS"]
