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
import functools
import ipaddress
import socket
from typing import Any, Callable, Optional, ParamSpec, Sequence, TypeVar

import numpy as np

from .address import Address
from .config import NodeConfig
from .directory.redis.url import is_redis, parse_url
from .errors import (ConfigError, DeadlineExceeded, HostNotFound, InvalidArgument, InvalidLocation,
                     TransportError)
from .metrics import serve_node
from .metrics.collector import NodeCollector
from .timeouts import Timeouts
from .node import Get, Node
from .node.geometry import Geometry, Surface, mismatch, producer_text, published, settle

DEFAULT_DISCOVERY = NodeConfig.options()["discovery_addr"].default
#: The client's own spelling of a NodeConfig field (each field's own name is taken too).
KEYWORDS = {"page_size": "page_bytes"}
#: The page size of a client whose config names none: the one peercache-bench's --page-size has.
DEFAULT_PAGE_SIZE = NodeConfig.options()["page_bytes"].flag_default
#: How the library names its settings in a message about the producer's geometry.
SURFACE = Surface("peercache.connect", {"page_size": "page_size"}, "=", "leave {} unset")


def _keyword_doc(indent: str) -> str:
    """The keyword arguments of :class:`Client` as NodeConfig declares them: meaning, unit, default."""
    spelled = {field: kw for kw, field in KEYWORDS.items()}
    lines = ["Keyword arguments (each :class:`~peercache.config.NodeConfig`'s field of that name; None or "
             "left out: NodeConfig's default, or ``config``'s value):", ""]
    for name, o in NodeConfig.options().items():
        unit = f" [{o.unit}]" if o.unit else ""
        default = "" if name == "timeouts" else f" (default: {o.default!r})"
        lines.append(f"- ``{spelled.get(name, name)}``{unit}: {o.doc}{default}")
    lines.append("- ``timeouts``: the engine's other time bounds (:class:`peercache.timeouts.Timeouts`)")
    return "\n".join(indent + x if x else "" for x in lines)


class Client:
    """Connect to a PeerCache cluster through its discovery address."""

    def __init__(self, config: NodeConfig | str | None = None, *,
                 directory: Optional[str] = None, protocol: Optional[str] = None,
                 devices: Optional[tuple] = None, ib_port: Optional[int] = None,
                 gid_index: Optional[int] = None, tcp_poll_us: Optional[int] = None,
                 pool_bytes: Optional[int] = None, page_size: Optional[int] = None,
                 bind: Optional[str] = None, host_discovery: Optional[bool] = None,
                 dir_cache_ttl: Optional[float] = None, max_channels: Optional[int] = None,
                 timeout: Optional[float] = None, heartbeat_interval: Optional[float] = None,
                 heartbeat_timeout: Optional[float] = None, dir_table_entries: Optional[int] = None,
                 auth_key: Optional[bytes] = None, auth_key_file: Optional[str] = None,
                 metrics_addr: Optional[str] = None, integrity: Optional[bool] = None,
                 timeouts: Optional[Timeouts] = None, discovery_addr: Optional[str] = None,
                 **options: Any):
        """A client with the options of ``config`` (a :class:`~peercache.config.NodeConfig`, or the
        discovery address, HOST:PORT), or of the keywords over its defaults:
        ``Client("127.0.0.1:31998", pool_bytes=..., page_size=...)``. The keywords are NodeConfig's
        fields (``page_size`` is ``page_bytes``, whose own name is taken too).

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
        named = dict(directory=directory, protocol=protocol, devices=devices, ib_port=ib_port,
                     gid_index=gid_index, tcp_poll_us=tcp_poll_us, pool_bytes=pool_bytes, page_size=page_size,
                     bind=bind, host_discovery=host_discovery, dir_cache_ttl=dir_cache_ttl,
                     max_channels=max_channels, timeout=timeout, heartbeat_interval=heartbeat_interval,
                     heartbeat_timeout=heartbeat_timeout, dir_table_entries=dir_table_entries, auth_key=auth_key,
                     auth_key_file=auth_key_file, metrics_addr=metrics_addr, integrity=integrity,
                     timeouts=timeouts, discovery_addr=discovery_addr)
        given_kw = {k: v for k, v in named.items() if v is not None}
        for k, v in options.items():   # NodeConfig's own field names (page_bytes)
            if k in given_kw or k == "page_bytes" and "page_size" in given_kw:
                raise InvalidArgument(f"Client() got {k!r} twice (as {'page_size' if k == 'page_bytes' else k!r} "
                                      "too); give one of them")
            given_kw[k] = v
        c = NodeConfig.of(config, given_kw, who="Client", spellings=KEYWORDS)
        _check_resolves(c)
        given = c.page_bytes
        page_size = DEFAULT_PAGE_SIZE if given is None else given
        if page_size <= 0:
            raise ConfigError(f"page_size must be positive, got {page_size}")
        c = dataclasses.replace(c, page_bytes=page_size)
        slots = c.pool_slots(page_size)
        if c.pool_bytes and slots == 0:
            raise ConfigError(f"pool_bytes={c.pool_bytes} holds no {page_size} byte page; raise it")
        self.page_size = page_size
        self.config = c
        self.node = Node(c)
        #: the Prometheus endpoint of ``metrics_addr`` (None: off)
        self.metrics = None
        if c.metrics_addr:
            try:
                self.metrics = serve_node(c.metrics_addr, self.node, label="metrics_addr")
            except BaseException:
                self.node.close()
                raise
        #: the counters of :meth:`stats`: the metrics' own (a batch's figures recorded as the endpoint's are)
        self._collector = self.metrics.collector if self.metrics is not None else NodeCollector(lambda: self.node)
        self._collector.watch(self.node)
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
        self.node.put_batch(_keys(keys), [_value_view(v, k) for k, v in zip(keys, values)])

    def remove(self, key: str | bytes) -> bool:
        """Remove ``key`` from this client's pool and the directory."""
        return self.node.remove_batch(_keys([key])) == 1

    # -- reads ------------------------------------------------------------------------
    def exists(self, key: str | bytes) -> bool:
        """Whether the directory knows ``key``."""
        return self.exists_batch([key])[0]

    def exists_batch(self, keys: Sequence[str | bytes]) -> list[bool]:
        """Directory membership of several keys in one lookup."""
        return self.node.exists_batch(_keys(keys))

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
        bkeys = _keys(keys)
        n = len(bkeys)
        if outs is not None:
            if len(outs) != n:
                raise ConfigError(f"get_batch: {n} keys but {len(outs)} output buffers")
            views = [_out_view(out, i) for i, out in enumerate(outs)]
            rooms = [v.nbytes for v in views]
            # One native batch: each key's payload straight into its own buffer.
            r = self.node.get_batch_into(bkeys, views, np.zeros(n, dtype=np.uint64), capacities=rooms)
            return [self._outcome(r, i, bkeys[i], rooms[i], buffer=True) for i in range(n)]
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

    def stats(self) -> dict[str, float]:
        """This client's counters, the ones its Prometheus metrics show (docs/metrics.md), by sample name
        as the endpoint writes it: ``peercache_get_keys_total``, ``peercache_directory_lookups_total{tier="cache",
        result="hit"}``, ... (histogram buckets left out: their ``_count`` and ``_sum`` are in)."""
        out: dict[str, float] = {}
        for family in self._collector.collect():
            for sample in family.samples:
                if sample.name.endswith("_bucket"):
                    continue
                labels = ",".join(f'{k}="{v}"' for k, v in sample.labels.items())
                out[sample.name + (f"{{{labels}}}" if labels else "")] = sample.value
        return out

    def __repr__(self) -> str:
        c = self.config
        where = f"directory={c.directory!r}" if c.directory else f"discovery_addr={c.discovery_addr!r}"
        role = f"producer of a {c.pool_bytes}-byte pool" if c.pool_bytes else "consumer"
        state = "closed" if self.node.transport is None else f"node {self.node.node_id!r}"
        return (f"<peercache.Client {where} protocol={c.protocol!r} page_size={self.page_size} {role}, "
                f"{state}>")

    def close(self) -> None:
        """Leave the cluster and free the pool."""
        if self.metrics is not None:
            self.metrics.close()
        self._collector.unwatch()
        self.node.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


Client.__init__.__doc__ = (Client.__init__.__doc__ or "") + "\n\n" + _keyword_doc(" " * 8)

P = ParamSpec("P")
R = TypeVar("R")


def _takes_arguments_of(cls: Callable[P, R]) -> Callable[[Callable[..., R]], Callable[P, R]]:
    """A function with the signature of ``cls`` (typed for checkers, listed by ``help()``)."""
    def wrap(f: Callable[..., R]) -> Callable[P, R]:
        doc = f.__doc__
        name, qualname = f.__name__, f.__qualname__
        g = functools.wraps(cls)(f)    # __wrapped__: inspect.signature (help()) shows cls's parameters
        g.__doc__, g.__name__, g.__qualname__ = doc, name, qualname
        return g
    return wrap


@_takes_arguments_of(Client)
def connect(*args: Any, **kwargs: Any) -> Client:
    """A :class:`Client` connected to ``discovery_addr`` (the first argument, HOST:PORT; default:
    NodeConfig's) or to ``directory=`` "redis://...": ``connect("10.0.0.5:31998", page_size=131072)``."""
    return Client(*args, **kwargs)


connect.__doc__ = (connect.__doc__ or "") + "\n\n" + _keyword_doc(" " * 4)


def _keys(keys: Sequence) -> list[bytes]:
    """Keys as bytes (str is UTF-8); InvalidArgument naming any other type."""
    out = []
    for i, k in enumerate(keys):
        if isinstance(k, bytes):
            out.append(k)
        elif isinstance(k, str):
            out.append(k.encode())
        else:
            raise InvalidArgument(f"key {i} is {type(k).__name__} {k!r}: a key must be str or bytes; "
                                  f"pass str({k!r}) or its bytes")
    return out


def _value_view(value: Any, key: Any) -> memoryview:
    """A value to put as a flat byte view; InvalidArgument for str and for what is not contiguous bytes."""
    if isinstance(value, str):
        raise InvalidArgument(f"the value of key {key!r} is a str: a value must be bytes-like; pass "
                              "value.encode() (UTF-8) or bytes")
    try:
        return memoryview(value).cast("B")
    except TypeError as e:
        raise InvalidArgument(f"the value of key {key!r} ({type(value).__name__}) is not a C-contiguous "
                              f"bytes-like object ({e}); pass bytes, a bytearray or a contiguous array "
                              "(numpy.ascontiguousarray)") from None


def _out_view(out: Any, i: int) -> memoryview:
    """Output buffer ``i`` of get_batch as a flat writable byte view; InvalidArgument when it cannot be one."""
    try:
        view = memoryview(out).cast("B")
    except TypeError as e:
        raise InvalidArgument(f"output buffer {i} ({type(out).__name__}) is not a C-contiguous writable buffer "
                              f"({e}); pass a bytearray or a contiguous array (numpy.ascontiguousarray)") from None
    if view.readonly:   # a ConfigError (a ValueError), as it always was
        raise ConfigError(f"output buffer {i} ({type(out).__name__}) is read-only; pass a bytearray or a "
                              "writable array")
    return view


def _check_resolves(c: NodeConfig) -> None:
    """HostNotFound when the host of the directory (discovery address or Redis URL) has no address."""
    spec = c.directory or c.discovery_addr
    if is_redis(spec):
        try:
            host = parse_url(spec).host
        except Exception:          # noqa: BLE001 - the directory's own check names a bad URL
            return
        what = "the directory's URL"
    else:
        try:
            host = Address.parse(spec).host
        except ValueError:
            return
        what = "directory" if c.directory else "discovery_addr"
    if not host:
        return
    try:
        ipaddress.ip_address(host)
        return
    except ValueError:
        pass
    try:
        socket.getaddrinfo(host, None)
    except socket.gaierror as e:
        raise HostNotFound(f"{what} {spec!r}: the host {host!r} does not resolve ({e.strerror}); check its "
                           "spelling, /etc/hosts or DNS, or give an IP address") from None
