"""Data-path transports: one interface, three implementations (tcp, shm, rdma)."""
from __future__ import annotations

import logging

from ..errors import ConfigError, TransportUnavailable
from .base import LOC_DTYPE, OP_DTYPE, Status, Transport, native_module

log = logging.getLogger(__name__)

PROTOCOLS = ("tcp", "shm", "rdma")
_warned: list[bool] = []


def make_transport(protocol: str, native: bool | None = None, **options) -> Transport:
    """The transport for ``protocol``, or a ConfigError naming what is available.

    ``native`` (tcp only): None = the native client when it is built, else
    the pure-Python one with a warning; False = pure Python (the reference);
    True = native or TransportUnavailable.
    """
    if protocol == "tcp":
        from .tcp import NativeTcpTransport, TcpTransport
        mod, why = native_module()
        if native is False:
            return TcpTransport(**options)
        if mod is None:
            if native:
                raise TransportUnavailable(f"native tcp client requested: {why}")
            if not _warned:
                _warned.append(True)
                log.warning("using the slow pure-Python tcp client: %s", why)
            return TcpTransport(**options)
        return NativeTcpTransport(**options)
    if protocol == "shm":
        from .shm import ShmTransport
        return ShmTransport(**options)
    if protocol == "rdma":
        from .rdma import RdmaTransport
        return RdmaTransport(**options)
    raise ConfigError(f"unknown protocol {protocol!r}; choose one of {', '.join(PROTOCOLS)}")


__all__ = ["LOC_DTYPE", "OP_DTYPE", "Status", "Transport", "make_transport", "native_module", "PROTOCOLS"]
