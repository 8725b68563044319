"""The directory: which node holds a key's page, and where in its pool.

One interface, two backends:

- :mod:`.client` -- :func:`connect_directory` and the :class:`DirectoryClient` protocol
  a :class:`~peercache.node.Node` uses, whatever answers it;
- the embedded backend: :mod:`.service` (membership and the ZeroMQ handlers, hosted by the
  discovery node or ``peercache-bench meta``), :mod:`.store` (the key -> location map) and
  :mod:`.table` (its one-sided view, read by consumers like a page);
- :mod:`.ops` -- :class:`~.ops.DirectoryOps`, the ops as typed methods both backends inherit,
  and their replies (:class:`~.ops.LookupResult`, :class:`~.ops.Registration`...);
- the Redis backend, the subpackage :mod:`.redis`: :mod:`.redis.backend` (Redis / Redis Cluster:
  publish, unpublish, lookup, composed of :mod:`.redis.connection`, :mod:`.redis.scripts` (the Lua
  scripts), :mod:`.redis.membership`, :mod:`.redis.leases`, :mod:`.redis.lookup` (the hand-written
  lookup request path) and :mod:`.redis.remote_ops`), and :mod:`.redis.url` (the URL, parsed
  without importing redis-py);
- :mod:`.location` -- a location and its stored record; :mod:`.cache` -- the consumer's TTL cache.

Importing the package is light: the backends load when first used.
"""
from __future__ import annotations

from .location import Location
from .redis.url import is_redis

__all__ = ["Location", "is_redis", "connect_directory", "DirectoryClient"]


def __getattr__(name: str):
    if name in ("connect_directory", "DirectoryClient"):
        # here, not at the top: importing the package stays light (the client brings the RPC layer)
        from . import client
        return getattr(client, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
