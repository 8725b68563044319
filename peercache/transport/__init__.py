"""Data-path transports: one interface, three implementations (tcp, shm, rdma)."""
from __future__ import annotations

from ..errors import ConfigError, TransportUnavailable
from .base import OP_DTYPE, Status, Transport

PROTOCOLS = ("tcp", "shm", "rdma")


def make_transport(protocol: str, **options) -> Transport:
    """The transport for ``protocol``, or a ConfigError naming what is available."""
    if protocol == "tcp":
        from .tcp import TcpTransport
        return TcpTransport(**options)
    if protocol in ("shm", "rdma"):
        raise TransportUnavailable(
            f"--protocol {protocol} is not available in this build yet; use --protocol tcp")
    raise ConfigError(f"unknown protocol {protocol!r}; choose one of {', '.join(PROTOCOLS)}")


__all__ = ["OP_DTYPE", "Status", "Transport", "make_transport", "PROTOCOLS"]
