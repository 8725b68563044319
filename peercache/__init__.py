"""PeerCache: a peer-to-peer KV-cache page store with one-sided reads.

``Client`` and ``connect`` load the engine (numpy, ZeroMQ, the transports) on first use, so the
lab's small remote tools (``python -m peercache.lab.cli hostinfo``, cpusample) start without it:
on an emulated host each of those imports costs seconds.
"""
from .errors import (ConfigError, DeadlineExceeded, DiscoveryUnreachable, HostNotFound, InvalidArgument,
                     InvalidLocation, PeerCacheError, RpcError, TransportError, TransportUnavailable)

__version__ = "0.1.0"

__all__ = ["Client", "connect", "PeerCacheError", "ConfigError", "DeadlineExceeded", "DiscoveryUnreachable",
           "HostNotFound", "InvalidArgument", "InvalidLocation", "RpcError", "TransportError",
           "TransportUnavailable", "__version__"]

_LAZY = {"Client", "connect"}


def __getattr__(name: str):
    if name in _LAZY:
        from . import client   # on first use: `import peercache` stays light (no numpy, zmq or node yet)
        return getattr(client, name)
    raise AttributeError(f"module 'peercache' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _LAZY)
