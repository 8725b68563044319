"""The library API: a small client for ad-hoc puts and reads.

    import peercache
    with peercache.connect("127.0.0.1:31998") as pc:     # or connect(directory="redis://HOST:PORT/0")
        page = pc.get("layer0/page17")              # bytes, or None on a miss
        buf = bytearray(131072)
        n = pc.get("layer0/page17", out=buf)        # read straight into buf

A client with ``pool_bytes`` is also a producer: ``put`` writes into its
own pool and publishes the keys, and other peers read them one-sided.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from . import tags
from .config import NodeConfig
from .errors import ConfigError, DeadlineExceeded, InvalidLocation, TransportError
from .node import Get, Node
from .node.deadline import Deadline
from .node.geometry import Geometry, Surface, mismatch, producer_text, published, settle

DEFAULT_DISCOVERY = NodeConfig.options()["discovery_addr"].default
#: The client's own spelling of a NodeConfig field (each field's own name is taken too).
KEYWORDS = {"page_size": "page_bytes"}
#: The page size of a client whose config names none: the one peercache-bench's --page-size has.
DEFAULT_PAGE_SIZE = NodeConfig.options()["page_bytes"].flag_default
#: How the library names its settings in a message about the producer's geometry.
SURFACE = Surface("peercache.connect", {"page_size": "page_size"}, "=", "leave {} unset")


class Client:
    """Connect to a PeerCache cluster through its discovery address."""

    def __init__(self, config: NodeConfig | str | None = None, **options: Any):
        """A client with the options of ``config`` (a :class:`~peercache.config.NodeConfig`), or of the
        keywords ``options`` over its defaults: ``Client("127.0.0.1:31998", pool_bytes=..., page_size=...)``.
        The keywords are NodeConfig's fields (``page_size`` is ``page_bytes``).

        ``page_size``: the most bytes one object read takes. A client without a pool (a consumer) that
        is given none takes the largest page size the producers publish (``peercache-bench serve``
        does, see :mod:`peercache.node.geometry`), else :data:`DEFAULT_PAGE_SIZE`; one given smaller
        than a producer's is a ConfigError naming both sizes. A producer (``pool_bytes``) without one
        has :data:`DEFAULT_PAGE_SIZE`.

        ``directory``: None (the embedded directory at ``discovery_addr``), HOST:PORT, or a Redis
        URL, ``redis://[:PASSWORD@]HOST:PORT/DB`` / ``rediss://...`` (password also from
        $PEERCACHE_REDIS_PASSWORD); ``discovery_addr`` may be such a URL itself.

        ``auth_key``: the cluster secret (None: $PEERCACHE_AUTH_KEY if set, else no authentication).

        ``integrity``: pages this client puts carry a checksum of their payload, and a page it
        gets is a hit only if its payload matches its checksum (a producer without integrity
        writes none: its pages are then misses). Off by default: without it, a payload that
        changed without its slot tag (a bug, a bit flip, a wrong DMA) is not detected."""
        c = NodeConfig.of(config, options, who="Client", spellings=KEYWORDS)
        given = c.page_bytes
        page_size = DEFAULT_PAGE_SIZE if given is None else given
        if page_size <= 0:
            raise ConfigError(f"page_size must be positive, got {page_size}")
        c = dataclasses.replace(c, page_bytes=page_size)
        slots = c.pool_slots(page_size)
        if c.pool_bytes and slots == 0:
            raise ConfigError(f"pool_bytes={c.pool_bytes} holds no {page_size} byte page; raise it")
        self.page_size = page_size
        self.node = Node(c)
        if not c.pool_bytes:
            try:
                self.page_size = self._learn_page_size(given)
            except BaseException:
                self.node.close()
                raise

    def _learn_page_size(self, given: int | None) -> int:
        """The page size of a consumer: ``given``, else the largest the producers publish, else the default
        (ConfigError when ``given`` is smaller than a producer's)."""
        nodes = self.node.members() or {}
        served = published(nodes)
        if not served:
            return self.page_size
        node_id = max(served, key=lambda n: served[n].page_size)
        return settle({"page_size": given}, served[node_id], SURFACE, producer_text(nodes.get(node_id)),
                      {"page_size": DEFAULT_PAGE_SIZE}, at_least=("page_size",))["page_size"]

    # -- writes -------------------------------------------------------------------
    def put(self, key: str | bytes, data) -> None:
        """Store ``data`` (bytes-like, at most page_size bytes) under ``key``."""
        self.put_batch([key], [data])

    def put_batch(self, keys: Sequence[str | bytes], values: Sequence) -> None:
        """Store several objects with one directory round trip."""
        if len(keys) != len(values):
            raise ConfigError(f"put_batch: {len(keys)} keys but {len(values)} values")
        self.node.put_batch([tags.key_bytes(k) for k in keys], [memoryview(v).cast("B") for v in values])

    def remove(self, key: str | bytes) -> bool:
        """Remove ``key`` from this client's pool and the directory."""
        return self.node.remove_batch([tags.key_bytes(key)]) == 1

    # -- reads ------------------------------------------------------------------------
    def exists(self, key: str | bytes) -> bool:
        """Whether the directory knows ``key``."""
        return self.exists_batch([key])[0]

    def exists_batch(self, keys: Sequence[str | bytes]) -> list[bool]:
        """Directory membership of several keys in one lookup."""
        return self.node.exists_batch([tags.key_bytes(k) for k in keys])

    def get(self, key: str | bytes, out=None):
        """Read ``key``: bytes (or None on a miss); with ``out``, the length read into it."""
        return self.get_batch([key], None if out is None else [out])[0]

    def get_batch(self, keys: Sequence[str | bytes], outs: Sequence | None = None) -> list:
        """Read several keys in one batch.

        Without ``outs`` each result is ``bytes`` or None (miss). With
        ``outs`` (one writable buffer per key) each object lands directly in
        its buffer and the result is its length or None.

        The call has the client's ``timeout`` in all; a key it could not locate or read in that
        time raises :class:`~peercache.errors.DeadlineExceeded` naming the step that used it
        (a stopped producer or directory), never a miss.
        """
        bkeys = [tags.key_bytes(k) for k in keys]
        n = len(bkeys)
        if outs is not None:
            if len(outs) != n:
                raise ConfigError(f"get_batch: {n} keys but {len(outs)} output buffers")
            results: list = []
            deadline = Deadline(self.node.reader.timeout)     # one bound for the whole call
            for k, out in zip(bkeys, outs):  # one region per caller buffer
                view = memoryview(out).cast("B")
                if view.readonly:
                    raise ConfigError("output buffer is read-only; pass a bytearray or writable array")
                r = self.node.get_batch_into([k], view, [0], capacities=[len(view)], deadline=deadline)
                results.append(self._outcome(r, 0, k, len(view), buffer=True))
            return results
        dest = np.empty(n * self.page_size, dtype=np.uint8)
        r = self.node.get_batch_into(bkeys, dest, np.arange(n, dtype=np.uint64) * self.page_size,
                                     capacities=[self.page_size] * n)
        out = []
        for i in range(n):
            ln = self._outcome(r, i, bkeys[i], self.page_size)
            out.append(None if ln is None else dest[i * self.page_size: i * self.page_size + ln].tobytes())
        return out

    @staticmethod
    def _outcome(r, i: int, key: bytes, room: int, buffer: bool = False):
        if r.status[i] == Get.HIT:
            return int(r.lengths[i])
        if r.status[i] == Get.MISS:
            return None
        if i in r.too_big:
            size = int(r.lengths[i])
            if buffer:
                raise ConfigError(f"reading {key!r}: the object is {size} bytes, larger than the output buffer "
                                  f"({room} bytes); pass a buffer of {size} bytes or more")
            raise ConfigError(f"reading {key!r}: " + mismatch(SURFACE, "page_size", room, Geometry(size),
                                                               f"the producer of {key!r}"))
        if len(r.timed_out) and i in r.timed_out:
            raise DeadlineExceeded(f"reading {key!r} {r.error}")
        if i in r.invalid:
            raise InvalidLocation(f"reading {key!r} failed: {r.error}")
        if r.error:
            raise TransportError(f"reading {key!r} failed: {r.error}")
        raise ConfigError(f"reading {key!r} failed: object larger than the output buffer ({room} bytes)")

    def close(self) -> None:
        """Leave the cluster and free the pool."""
        self.node.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def connect(discovery_addr: str | None = None, **options) -> Client:
    """A :class:`Client` connected to ``discovery_addr`` (default: NodeConfig's; or to ``directory=``
    "redis://...")."""
    return Client(discovery_addr, **options)
