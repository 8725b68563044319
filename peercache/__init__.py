"""PeerCache: a peer-to-peer KV-cache page store with one-sided reads."""
from .client import Client, connect
from .errors import (ConfigError, DiscoveryUnreachable, PeerCacheError, RpcError,
                     TransportError, TransportUnavailable)

__version__ = "0.1.0"

__all__ = ["Client", "connect", "PeerCacheError", "ConfigError", "DiscoveryUnreachable",
           "RpcError", "TransportError", "TransportUnavailable", "__version__"]
