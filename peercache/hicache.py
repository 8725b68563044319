"""SGLang HiCache L3 storage backend: ``peercache.hicache.PeerCacheStore``.

SGLang loads it with its ``dynamic`` storage backend::

    --enable-hierarchical-cache --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "peercache",
        "module_path": "peercache.hicache", "class_name": "PeerCacheStore",
        "interface_v1": 1, "discovery_addr": "10.0.0.1:31998", "protocol": "rdma"}'

and builds it as ``PeerCacheStore(storage_config, kwargs)``. With
``"interface_v1": 1`` SGLang calls the zero-copy path: :meth:`register_mem_pool_host`
makes the host KV pool's buffer the receive region of this node (registered
once), :meth:`batch_get_v1` reads pages one-sided straight into the host pool
pages, :meth:`batch_set_v1` copies host pool pages into the published pool in
one native copy per batch (GIL released) and publishes them with one
directory call. :meth:`batch_exists` answers SGLang's consecutive-prefix count
with one directory lookup and leaves the locations in the directory cache, so
the ``batch_get_v1`` of the same prefetch needs no second lookup.

Layouts: MLA pages are one object, written only by the storage-writer rank and
read by every rank; MHA pages are two objects (K and V) per rank, their keys
carry the rank. Keys are ``<tenant>/<model>/<page hash><suffix>``, the generic
path's ``<tenant>/<model>/g/<key>[<rank>]``: apart, whatever the names
(:func:`page_part`).

The module imports without torch or SGLang: then :class:`PeerCacheStore`
derives from a local stand-in with the same methods as SGLang's ``HiCacheStorage``.
"""
from __future__ import annotations

import ctypes
import logging
import re
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence

import numpy as np

from . import checks, metrics, tags
from .config import NodeConfig, extra_label, option, with_default
from .errors import ConfigError, PeerCacheError
from .node import BatchResult, Get, Node
from .transport.base import native_module

log = logging.getLogger(__name__)
_HIT, _ERROR = int(Get.HIT), int(Get.ERROR)
assert _HIT == 0, "batch_get_v1's fast path reads HIT as 0"

try:  # SGLang's own base class when SGLang (and torch) are importable
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage as _SGLangHiCacheStorage
except Exception as _e:  # ImportError, or a torch/CUDA import failure inside SGLang
    _SGLangHiCacheStorage = None
    SGLANG_MISSING = f"{type(_e).__name__}: {_e}"
else:
    SGLANG_MISSING = None


class _StandInHiCacheStorage(ABC):
    """The methods of SGLang's ``HiCacheStorage`` (0.5.x), for use without SGLang installed."""

    def register_mem_pool_host(self, mem_pool_host) -> None:
        self.mem_pool_host = mem_pool_host

    @abstractmethod
    def get(self, key, target_location=None, target_sizes=None): ...

    @abstractmethod
    def batch_get(self, keys, target_locations=None, target_sizes=None): ...

    @abstractmethod
    def set(self, key, value=None, target_location=None, target_sizes=None) -> bool: ...

    @abstractmethod
    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None) -> bool: ...

    @abstractmethod
    def exists(self, key) -> bool: ...

    def batch_exists(self, keys, extra_info=None) -> int:
        for i, k in enumerate(keys):
            if not self.exists(k):
                return i
        return len(keys)

    def batch_get_v1(self, keys, host_indices, extra_info=None) -> List[bool]:
        pass

    def batch_set_v1(self, keys, host_indices, extra_info=None) -> List[bool]:
        pass

    def clear(self) -> None:
        pass

    def get_stats(self):
        return None


#: The base class PeerCacheStore derives from: SGLang's when importable, else the stand-in.
HiCacheStorage = _SGLangHiCacheStorage if _SGLangHiCacheStorage is not None else _StandInHiCacheStorage

#: Extra-config keys SGLang itself reads (the dynamic loader, the v1 switch, heterogeneous TP).
SGLANG_KEYS = ("backend_name", "module_path", "class_name", "interface_v1", "tp_lcm_size")
DEFAULT_POOL_BYTES = 1 << 30
DEFAULT_DIR_CACHE_TTL = 5.0
#: Slot size of the generic path when neither a host pool nor 'page_bytes' gave one.
DEFAULT_PAGE_BYTES = 128 << 10
#: What the generic path's keys begin with after the tenant and model: its own key space, apart from v1 pages'.
GENERIC_MARK = "g/"


def _escaped(text: str, keep: "re.Pattern") -> str:
    """``text`` with each character ``keep`` does not match percent-encoded (its UTF-8 bytes). ``keep`` never
    matches '%', so that two texts never give the same result."""
    return "".join(c if keep.fullmatch(c) else "".join(f"%{b:02X}" for b in c.encode("utf-8", "surrogatepass"))
                   for c in text)


def model_part(model_name: Any) -> str:
    """The key part of a model name SGLang gives (e.g. 'org/Model-7B'): characters a name may not hold
    ('/' first of all) percent-encoded, so that two models never share a key part."""
    return _escaped(str(model_name), checks.NAME_RE) or "model"


#: what a page name (SGLang's page hash, or a generic key) keeps as it is in a key: a name's characters
#: without '_', which begins the object suffix, and without '/', which ends the generic space's mark
_PAGE_CHARS = re.compile(r"[A-Za-z0-9.:@+-]*")
_plain_page = _PAGE_CHARS.fullmatch
#: the characters of plain page names (_PAGE_CHARS) and the newline that joins a batch of them
#: (PeerCacheStore.object_keys), as bytes.translate deletes them
_PLAIN_BATCH = bytes(c for c in range(128) if _plain_page(chr(c))) + b"\n"


def page_part(name: Any) -> str:
    """The key part of a page name: unchanged when it holds only ``_PAGE_CHARS`` (SGLang's hex page hashes),
    else those characters kept and the rest percent-encoded. No result holds '_' or '/', so where a page
    name ends in a key is known, and no two names give the same part."""
    text = name if type(name) is str else str(name)
    return text if _plain_page(text) else _escaped(text, _PAGE_CHARS)


@dataclass(frozen=True)
class StoreConfig(NodeConfig):
    """What PeerCacheStore reads from SGLang's extra config, validated: the node's options
    (:class:`~peercache.config.NodeConfig`, each under its key) with HiCache's own defaults, and the
    key prefix."""

    pool_bytes: int = with_default(NodeConfig, "pool_bytes", DEFAULT_POOL_BYTES)
    dir_cache_ttl: float = with_default(NodeConfig, "dir_cache_ttl", DEFAULT_DIR_CACHE_TTL)
    tenant: str = option("default", "first part of every key: stores of one tenant share pages",
                         check=checks.name, key="tenant")
    model: Optional[str] = option(None, "second part of every key (unset: SGLang's model name, '/' encoded)",
                                  check=checks.name, key="model")

    @classmethod
    def from_extra(cls, extra: Optional[dict], *, ignore=SGLANG_KEYS) -> "StoreConfig":
        """Validate ``extra`` (SGLang's ``--hicache-storage-backend-extra-config``); ConfigError names the key."""
        return super().from_extra(extra, ignore=ignore)


@dataclass
class _Region:
    """The registered host KV pool buffer: its address range and a byte view of it."""

    base: int
    size: int
    view: np.ndarray
    owner: Any   # keeps the pool's buffer alive while the view exists


#: what is wrong, and what to do, when a batch's page lies outside the registered host pool buffer
_OUTSIDE = ("a page buffer of the host pool lies outside its registered kv_buffer; register_mem_pool_host "
            "again after the pool is reallocated")


@dataclass(frozen=True)
class _LinearPages:
    """A host pool whose page ``r``'s objects lie at ``bases + r * stride`` in its buffer (a page_first
    layout over one tensor, as SGLang's are), found by :func:`_linear_pages`: a batch's offsets are then one
    native call on its token indices, not the pool's ``get_page_buffer_meta`` (a tensor index per page in
    SGLang's pools) and the numpy calls on its lists."""

    tokens: int          # token indices per page
    stride: int          # bytes from one page to the next
    bases: np.ndarray    # each object's offset in page 0, uint64, in the pool's order
    size: int            # bytes of each object

    def offsets(self, host_indices, n: int, region_size: int, native) -> np.ndarray | None:
        """Offsets in the buffer of the objects of the ``n`` pages ``host_indices`` holds (page by page, as
        the pool lists them), in one native call; None when they are not ``n`` whole pages of int64 token
        indices (the pool's own call then answers, or says what is wrong). Raises ConfigError for a page
        past the buffer's end."""
        idx = host_indices if type(host_indices) is np.ndarray else np.asarray(host_indices)
        if idx.ndim != 1 or idx.size != n * self.tokens or idx.dtype != np.int64:
            return None
        out = np.empty(n * len(self.bases), np.uint64)
        try:
            native.page_offsets(idx, self.tokens, self.stride, self.bases, region_size - self.size, out)
        except ValueError as e:
            raise ConfigError(f"{e}: {_OUTSIDE}") from None
        return out


#: how many rows of the host pool the layout probe asks for at most (spread over the buffer)
PROBE_ROWS = 48


def _linear_pages(pool, base: int, size: int, index_array) -> _LinearPages | None:
    """The pool's layout as :class:`_LinearPages` when its ``get_page_buffer_meta`` says, for rows 0 to 3,
    the last row the buffer (``base``, ``size`` bytes) can hold at that stride and a few past it, the powers
    of two and their neighbours and a spread of others (:data:`PROBE_ROWS` in all), that every object lies at
    its row-0 offset plus the row times one stride, all of one size; None otherwise (every batch then asks
    the pool). A row the pool refuses (past its pages) is left out; rows 0 to 2 must answer.
    ``index_array``: token indices -> what the pool takes (a torch tensor where torch is installed)."""
    tokens = int(getattr(pool, "page_size", 1) or 1)

    def row(r: int) -> tuple[np.ndarray, set] | None:
        try:
            ptrs, sizes = pool.get_page_buffer_meta(index_array(np.arange(r * tokens, (r + 1) * tokens)))
        except Exception:  # noqa: BLE001 - a row past the pool's pages, or indices it does not take
            return None
        return (np.asarray(ptrs, np.int64) - base, set(sizes)) if len(ptrs) else None

    first = [row(r) for r in range(3)]
    if any(f is None for f in first) or len({len(f[0]) for f in first}) != 1:
        return None
    bases, sizes = first[0]
    stride = first[1][0] - bases
    if len(sizes) != 1 or stride[0] <= 0 or (stride != stride[0]).any():
        return None
    step, obj = int(stride[0]), next(iter(sizes))
    last = max(3, (size - obj - int(bases.max())) // step)    # the last row the buffer holds at this stride
    # rows past it too: a pool that answers for one (has that page) with a pointer off the line is not linear
    rows = [3, last, last + 1, last + 2, 2 * last + 1]
    rows += [r for k in range(2, 63) if (1 << k) < last for r in ((1 << k) - 1, 1 << k, (1 << k) + 1)]
    rows += [3 + (i * 7919) % (last - 2) for i in range(PROBE_ROWS)]
    for r in list(dict.fromkeys(rows))[:PROBE_ROWS]:
        got = row(r)
        if got is not None and (got[1] != sizes or len(got[0]) != len(bases) or (got[0] != bases + r * step).any()):
            return None
    return _LinearPages(tokens, step, bases.astype(np.uint64), obj)


def _address_and_size(buf) -> tuple[int, int]:
    """(address, bytes) of a torch tensor or anything with the buffer protocol (numpy, bytearray)."""
    if hasattr(buf, "data_ptr") and hasattr(buf, "element_size"):
        if getattr(buf, "is_cuda", False):
            raise ConfigError("the host KV pool buffer is on a GPU; HiCache's L3 tier reads into host memory")
        if not buf.is_contiguous():
            raise ConfigError("the host KV pool buffer is not contiguous; use a page_first host layout")
        return int(buf.data_ptr()), int(buf.numel() * buf.element_size())
    arr = np.asarray(memoryview(buf).cast("B") if not isinstance(buf, np.ndarray) else buf)
    if not arr.flags.c_contiguous:
        raise ConfigError("the host KV pool buffer is not contiguous; use a page_first host layout")
    return int(arr.ctypes.data), int(arr.nbytes)


def _byte_view(addr: int, size: int) -> np.ndarray:
    return np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(addr)) if size else np.empty(0, np.uint8)


def _as_bytes(value) -> np.ndarray:
    """A flat uint8 view of a tensor (torch, on CPU) or a buffer (numpy, bytes, bytearray)."""
    if hasattr(value, "data_ptr") and hasattr(value, "element_size"):
        t = value.detach()
        if getattr(t, "is_cuda", False):
            t = t.cpu()
        t = t.contiguous()
        return _byte_view(int(t.data_ptr()), int(t.numel() * t.element_size())).copy() if t.numel() else \
            np.empty(0, np.uint8)
    if isinstance(value, np.ndarray):
        return np.ascontiguousarray(value).reshape(-1).view(np.uint8)
    return np.frombuffer(memoryview(value).cast("B"), dtype=np.uint8)


def _writable_bytes(target) -> tuple[np.ndarray, int]:
    """A writable flat uint8 view of ``target`` (torch tensor or writable buffer) and its size."""
    if hasattr(target, "data_ptr") and hasattr(target, "element_size"):
        addr, size = _address_and_size(target)
        return _byte_view(addr, size), size
    if isinstance(target, np.ndarray):
        if not target.flags.writeable or not target.flags.c_contiguous:
            raise ConfigError("target location is read-only or not contiguous; pass a writable contiguous array")
        v = target.reshape(-1).view(np.uint8)
        return v, v.nbytes
    mv = memoryview(target).cast("B")
    if mv.readonly:
        raise ConfigError("target location is read-only; pass a bytearray, a writable array or a tensor")
    v = np.frombuffer(mv, dtype=np.uint8)
    return v, v.nbytes


_torch: list = []


def _new_page(data: np.ndarray):
    """What get/batch_get return without a target: a torch uint8 tensor when torch is there, else numpy."""
    if not _torch:
        try:
            import torch   # optional: SGLang has it; the store works with numpy alone
        except ImportError:
            torch = None
        _torch.append(torch)
    return data if _torch[0] is None else _torch[0].from_numpy(data)


class PeerCacheStore(HiCacheStorage):
    """SGLang HiCache storage backed by a PeerCache cluster (see the module docstring)."""

    def __init__(self, storage_config=None, kwargs: Optional[dict] = None):
        extra = getattr(storage_config, "extra_config", None) if storage_config is not None else None
        self.config = StoreConfig.from_extra(extra)
        self.storage_config = storage_config
        sc = storage_config
        self.tp_rank = int(getattr(sc, "tp_rank", 0) or 0)
        self.tp_size = int(getattr(sc, "tp_size", 1) or 1)
        self.pp_rank = int(getattr(sc, "pp_rank", 0) or 0)
        self.pp_size = int(getattr(sc, "pp_size", 1) or 1)
        #: this store's place among the model's tp_size x pp_size ranks (what its metrics port adds)
        self.rank = self.pp_rank * self.tp_size + self.tp_rank
        self.is_mla = bool(getattr(sc, "is_mla_model", False))
        writer = getattr(sc, "is_storage_writer", None)
        self.is_writer = bool(writer) if writer is not None else (not self.is_mla or self.tp_rank == 0)
        model = self.config.model or model_part(getattr(sc, "model_name", None) or "model")
        #: tenant and model hold no '/' (checks.name, model_part): one key never reads as another's
        self.prefix = f"{self.config.tenant}/{model}/"
        pp = f"_pp{self.pp_rank}" if self.pp_size > 1 else ""
        #: per-object suffixes of a v1 page (MLA: one object; MHA: K and V of this rank)
        self.rank_suffix = pp if self.is_mla else f"_{self.tp_rank}{pp}"
        self.mem_pool_host = None
        self._region: Optional[_Region] = None
        self._sizes_cache: dict = {}
        #: the host pool's layout when its pages lie at one stride (register_mem_pool_host)
        self._linear: _LinearPages | None = None
        self._node: Optional[Node] = None
        self._node_lock = threading.Lock()
        self._stats_lock = threading.Lock()
        self._closed = False
        self._native, self._native_why = native_module()
        self._reset_stats()
        #: the Prometheus endpoint of extra config 'metrics_addr' (None: off)
        self._metrics = None
        if self.config.metrics_addr:
            # SGLang gives every rank the same extra config: each rank listens on the port plus its rank
            label = extra_label("metrics_addr")
            addr = metrics.for_process(self.config.metrics_addr, self.rank, self.tp_size * self.pp_size,
                                       label=label, what="ranks (tp_size x pp_size)")
            self._metrics = metrics.serve_node(addr, lambda: self._node, label=label)
        if self.config.page_bytes is not None:
            try:
                self._ensure_node(self.config.page_bytes)
            except BaseException:
                self.close()
                raise

    # -- keys and connection ----------------------------------------------------------------
    def _suffixes(self, objs: int) -> list[str]:
        if objs == 1:
            return [f"{self.rank_suffix}_k"]
        if objs == 2:
            return [f"{self.rank_suffix}_k", f"{self.rank_suffix}_v"]
        return [f"{self.rank_suffix}_{j}" for j in range(objs)]

    def object_keys(self, keys: Sequence[str], objs: int) -> list[bytes]:
        """The PeerCache keys of SGLang page hashes ``keys`` with ``objs`` objects per page:
        ``<prefix><page>_<object>`` (the page part holds no '_', see :func:`page_part`)."""
        suf, prefix = self._suffixes(objs), self.prefix
        n = len(keys)
        # A batch of plain names (SGLang's hex hashes) is built with whole-batch string calls: the names
        # joined by newlines and checked once, then each suffix's keys made as one string, encoded and
        # split. A newline inside a name, the prefix or a suffix changes the count of parts: then the
        # loop below, as for a name with other characters or one that is not a str.
        try:
            plain = n and not "\n".join(keys).encode("ascii").translate(None, _PLAIN_BATCH)
        except (TypeError, UnicodeEncodeError):
            plain = False
        if plain:
            parts = [(prefix + (s + "\n" + prefix).join(keys) + s).encode().split(b"\n") for s in suf]
            if all(len(part) == n for part in parts):
                if objs == 1:
                    return parts[0]
                out: list = [None] * (n * objs)
                for j, part in enumerate(parts):
                    out[j::objs] = part
                return out
        return [f"{prefix}{p}{s}".encode() for p in map(page_part, keys) for s in suf]

    def generic_key(self, key: str) -> bytes:
        """The PeerCache key of ``key`` on the generic path (get/set/batch_get/batch_set):
        ``<prefix>g/<page>[<rank>]``. A page part holds no '/', so no object key of a v1 page
        (``<prefix><page>_...``) is ever one of these, whatever the names."""
        return f"{self.prefix}{GENERIC_MARK}{page_part(key)}{self.rank_suffix}".encode()

    def _ensure_node(self, page_bytes: int) -> Node:
        with self._node_lock:
            if self._closed:
                raise ConfigError("this PeerCacheStore is closed; create a new one")
            if self._node is not None:
                if page_bytes > self._node_page_bytes:
                    raise ConfigError(f"objects of {page_bytes} bytes do not fit this store's "
                                      f"{self._node_page_bytes} byte slots; set extra config 'page_bytes' "
                                      f"to {page_bytes}")
                return self._node
            c = self.config
            if c.pool_bytes and c.pool_slots(page_bytes) == 0:
                raise ConfigError(f"extra config 'pool_bytes': {c.pool_bytes} holds no {page_bytes} byte page; "
                                  "raise it (or 0: a reader that stores nothing)")
            self._node = Node(**c.node_kwargs(page_bytes=page_bytes, name=f"hicache-tp{self.tp_rank}"))
            self._node_page_bytes = page_bytes
            if self._metrics is not None:
                self._metrics.watch(self._node)
            return self._node

    @property
    def node(self) -> Node:
        """The PeerCache node (created at the first operation when 'page_bytes' is not configured)."""
        node = self._node
        if node is not None:
            return node
        return self._ensure_node(self.config.page_bytes or DEFAULT_PAGE_BYTES)

    # -- the host pool (v1) -----------------------------------------------------------------------
    def register_mem_pool_host(self, mem_pool_host) -> None:
        """Make the host KV pool's buffer this node's receive region (one registration for its life)."""
        super().register_mem_pool_host(mem_pool_host)
        buf = getattr(mem_pool_host, "kv_buffer", None)
        if buf is None or isinstance(buf, (list, tuple)):
            raise ConfigError(f"host KV pool {type(mem_pool_host).__name__} has no single kv_buffer; PeerCacheStore "
                              "needs a page_first host layout (--hicache-mem-layout page_first)")
        addr, size = _address_and_size(buf)
        self._region = _Region(addr, size, _byte_view(addr, size), buf)
        page = self._first_page_bytes(mem_pool_host)
        # with the native module (its page_offsets): else every batch asks the pool
        self._linear = (_linear_pages(mem_pool_host, addr, size, self._index_array) if self._native is not None
                        else None)
        node = self._ensure_node(self.config.page_bytes or page)
        node.transport.prepare_local(self._region.view)   # rdma: registered on every rail, once

    @staticmethod
    def _index_array(values: np.ndarray):
        """Token indices as SGLang's pools take them: a torch tensor (numpy without torch)."""
        try:
            import torch   # optional, as in _new_page
            return torch.from_numpy(np.ascontiguousarray(values, dtype=np.int64))
        except ImportError:
            return np.asarray(values, dtype=np.int64)

    @classmethod
    def _indices(cls, n: int):
        return cls._index_array(np.arange(n, dtype=np.int64))

    def _first_page_bytes(self, pool) -> int:
        page_tokens = int(getattr(pool, "page_size", 1) or 1)
        _, sizes = pool.get_page_buffer_meta(self._indices(page_tokens))
        if not sizes:
            raise ConfigError(f"host KV pool {type(pool).__name__} gave no page buffers for page 0")
        return int(max(sizes))

    def _page_meta(self, keys: Sequence[str], host_indices) -> tuple[np.ndarray, np.ndarray, int]:
        """(offsets into the region, sizes, objects per page) of the pages ``host_indices`` holds."""
        if self._region is None or self.mem_pool_host is None:
            raise ConfigError("batch_get_v1/batch_set_v1 before register_mem_pool_host; SGLang registers the "
                              "host pool at attach (set \"interface_v1\": 1 only with a host pool)")
        n = len(keys)
        r = self._region
        # As few calls a batch as can be: they run right after the last batch's copy has pushed the
        # interpreter's and numpy's own data out of the caches, where each costs several times its timeit.
        lin = self._linear
        p = lin.offsets(host_indices, n, r.size, self._native) if lin is not None and n else None   # one call
        if p is not None:
            big, uniform, sizes = lin.size, True, None
        else:
            ptrs, sizes = self.mem_pool_host.get_page_buffer_meta(host_indices)
            if n == 0 or len(ptrs) % n:
                raise ConfigError(f"{len(ptrs)} page buffers for {n} keys; the host pool's page size does not "
                                  "match the keys")
            if type(sizes) is not list:    # SGLang's pools give lists
                sizes = list(sizes)
            big = sizes[0]
            uniform = sizes.count(big) == len(sizes)      # one object size (every SGLang pool)
            if not uniform:
                big = max(sizes)
            p = np.fromiter(ptrs, np.uint64, len(ptrs))
            p -= np.uint64(r.base)      # a pointer below the base wraps to far above the region's end
            if int(p.max()) + big > r.size:
                raise ConfigError(_OUTSIDE)
        if uniform:                 # a cached array of the one size
            key = (len(p), big)
            s = self._sizes_cache.get(key)
            if s is None:
                s = self._sizes_cache[key] = np.full(len(p), big, dtype=np.uint64)
                s.flags.writeable = False
        else:
            s = np.fromiter(sizes, np.uint64, len(sizes))
        return p, s, len(p) // n

    def batch_get_v1(self, keys: List[str], host_indices, extra_info=None) -> List[bool]:
        """Read pages one-sided straight into the host pool pages; True per page that arrived whole."""
        return self.read_v1(keys, host_indices)[0]

    def read_v1(self, keys: List[str], host_indices) -> tuple[List[bool], BatchResult | None]:
        """:meth:`batch_get_v1`, with the node's result per object (None when nothing was read) for a
        caller that reports why pages missed (the bench: ``redirected``, ``miss_reason``)."""
        if not keys:
            return [], None
        offsets, sizes, objs = self._page_meta(keys, host_indices)
        okeys = self.object_keys(keys, objs)
        node = self.node
        t0 = time.perf_counter()
        try:
            r = node.get_batch_into(okeys, self._region.view, offsets, sizes)
        except PeerCacheError as e:
            log.warning("PeerCacheStore.batch_get_v1 of %d pages failed: %s", len(keys), e)
            self._count(read_errors=len(keys))
            return [False] * len(keys), None
        dt = time.perf_counter() - t0
        n = len(keys)
        # All hit, each as long as its room: all whole (the common case; two C-level compares).
        if r.hits == len(okeys) and r.lengths.tobytes() == sizes.tobytes():
            self._count_read(n, int(sizes[0]) * len(sizes), n, 0, 0, dt)
            return [True] * n, r
        whole = (r.status == _HIT) & (r.lengths == sizes)
        hit = whole.reshape(n, objs).all(axis=1)
        nhit = int(hit.sum())
        err = int((r.status == _ERROR).reshape(n, objs).any(axis=1).sum())
        if err and r.error:
            log.warning("PeerCacheStore.batch_get_v1: %d of %d pages failed: %s", err, n, r.error)
        self._count_read(nhit, int(sizes.reshape(n, objs)[hit].sum()), nhit, n - nhit - err, err, dt)
        return hit.tolist(), r

    def batch_set_v1(self, keys: List[str], host_indices, extra_info=None) -> List[bool]:
        """Copy host pool pages into the published pool (one native copy per batch) and publish them once."""
        if not keys:
            return []
        if self.is_mla and not self.is_writer:
            return [True] * len(keys)   # MLA pages are the same on every rank: the writer rank stores them
        offsets, sizes, objs = self._page_meta(keys, host_indices)
        okeys = self.object_keys(keys, objs)
        node = self.node
        if node.pool is None:
            raise ConfigError("this store has no pool to write into (extra config 'pool_bytes' is 0)")
        size = int(sizes[0])
        if not (sizes == size).all() or size != node.pool.capacity:
            raise ConfigError(f"host pool objects of {sorted(set(sizes.tolist()))} bytes, but the store's slots "
                              f"hold {node.pool.capacity}; set extra config 'page_bytes' to the object size")
        t0 = time.perf_counter()
        try:
            node.put_batch(okeys, fill=self._batch_fill(offsets, size, node))
        except PeerCacheError as e:
            log.warning("PeerCacheStore.batch_set_v1 of %d pages failed: %s", len(keys), e)
            self._count(write_errors=len(keys))
            return [False] * len(keys)
        self._count(pages_written=len(keys), bytes_written=size * len(okeys),
                    write_seconds=time.perf_counter() - t0)
        return [True] * len(keys)

    def _batch_fill(self, src_offsets: np.ndarray, size: int, node: Node):
        """A ``put_batch`` fill that copies every page with one native call when the last slot is filled.

        Each slot's tag is final before its payload arrives, which is safe: readers learn the new
        (key, generation) only from the publish that follows the copy, and a reader holding an
        older location sees another generation (a miss). With integrity on, the checksum is taken
        inside each slot's write, so each page is copied in its own fill instead.
        """
        region = self._region.view
        n = len(src_offsets)
        if node.integrity or self._native is None:
            it = iter(src_offsets.tolist())

            def fill_each(payload, ref):
                o = next(it)
                payload[:size] = region[o:o + size]
            return fill_each
        dst = np.empty(n, dtype=np.uint64)
        pool_bytes = node.pool.bytes
        seen = [0]

        def fill(payload, ref):
            i = seen[0]
            dst[i] = ref.offset + tags.HEADER_BYTES
            seen[0] = i + 1
            if i + 1 == n:
                self._native.copy_pages(region, pool_bytes, src_offsets, dst, size)
        return fill

    # -- prefix existence ------------------------------------------------------------------------
    def batch_exists(self, keys: List[str], extra_info=None) -> int:
        """Pages present from the start: one directory lookup, whose locations the next batch_get_v1 of
        these keys reads from the directory cache (a prefetch costs one directory call, not two)."""
        if not keys:
            return 0
        objs = self._objects_per_page()
        okeys = self.object_keys(keys, objs)
        node = self.node
        try:
            # Always a fresh lookup (a cached location may be of an evicted page), kept in the
            # directory cache for the batch_get_v1 of this prefetch.
            bad: list = []
            locs = node.lookup(okeys, use_cache=False, bad=bad)
            found = np.fromiter((loc is not None for loc in locs), bool, len(okeys))
            found[[i for i, _ in bad]] = True   # an invalid entry is known; reading it is an error, not a miss
            present = found.reshape(len(keys), objs).all(axis=1)
        except PeerCacheError as e:
            log.warning("PeerCacheStore.batch_exists failed: %s", e)
            return 0
        missing = np.flatnonzero(~present)
        return int(missing[0]) if len(missing) else len(keys)

    def _objects_per_page(self) -> int:
        pool = self.mem_pool_host
        if pool is None or self._region is None:
            return 1 if self.is_mla else 2
        if not hasattr(self, "_objs"):
            ptrs, _ = pool.get_page_buffer_meta(self._indices(int(getattr(pool, "page_size", 1) or 1)))
            self._objs = max(1, len(ptrs))
        return self._objs

    # -- the generic path (tensors or buffers) ---------------------------------------------------
    def set(self, key: str, value=None, target_location=None, target_sizes=None) -> bool:
        return self.batch_set([key], None if value is None else [value],
                              None if target_location is None else [target_location],
                              None if target_sizes is None else [target_sizes])

    def batch_set(self, keys: List[str], values=None, target_locations=None, target_sizes=None) -> bool:
        """Store whole values (tensors, arrays, bytes; or raw addresses with sizes) under ``keys``."""
        if not keys:
            return True
        if values is None:
            if target_locations is None or target_sizes is None:
                raise ConfigError("batch_set needs values, or target_locations with target_sizes")
            values = [_byte_view(int(a), int(s)) for a, s in zip(target_locations, target_sizes)]
        if len(values) != len(keys):
            raise ConfigError(f"batch_set: {len(keys)} keys but {len(values)} values")
        data = [_as_bytes(v) for v in values]
        node = self.node
        if node.pool is None:
            raise ConfigError("this store has no pool to write into (extra config 'pool_bytes' is 0)")
        t0 = time.perf_counter()
        try:
            node.put_batch([self.generic_key(k) for k in keys], data)
        except PeerCacheError as e:
            log.warning("PeerCacheStore.batch_set of %d values failed: %s", len(keys), e)
            self._count(write_errors=len(keys))
            return False
        self._count(pages_written=len(keys), bytes_written=sum(d.nbytes for d in data),
                    write_seconds=time.perf_counter() - t0)
        return True

    def get(self, key: str, target_location=None, target_sizes=None):
        return self.batch_get([key], None if target_location is None else [target_location],
                              None if target_sizes is None else [target_sizes])[0]

    def batch_get(self, keys: List[str], target_locations=None, target_sizes=None) -> list:
        """Values of ``keys``: read into ``target_locations`` (returned) or new uint8 pages; None on a miss."""
        if not keys:
            return []
        node = self.node
        bkeys = [self.generic_key(k) for k in keys]
        n = len(keys)
        cap = self._node_page_bytes
        t0 = time.perf_counter()
        out: list = [None] * n
        if target_locations is not None:
            if len(target_locations) != n:
                raise ConfigError(f"batch_get: {n} keys but {len(target_locations)} target locations")
            views = []
            for i, t in enumerate(target_locations):
                if isinstance(t, int):
                    if target_sizes is None:
                        raise ConfigError("batch_get: target locations given as addresses need target_sizes")
                    views.append((_byte_view(t, int(target_sizes[i])), t))
                else:
                    views.append((_writable_bytes(t)[0], t))
            # One batch when the targets lie in one buffer is not knowable here: one read per target.
            status, lengths = np.full(n, int(Get.MISS), np.int8), np.zeros(n, np.uint64)
            for i, (v, _) in enumerate(views):
                r = node.get_batch_into([bkeys[i]], v, [0], [v.nbytes])
                status[i], lengths[i] = r.status[0], r.lengths[0]
            for i in range(n):
                if status[i] == Get.HIT:
                    out[i] = views[i][1]
        else:
            dest = np.empty(n * cap, dtype=np.uint8)
            r = node.get_batch_into(bkeys, dest, np.arange(n, dtype=np.uint64) * np.uint64(cap), [cap] * n)
            status, lengths = r.status, r.lengths
            for i in range(n):
                if status[i] == Get.HIT:
                    out[i] = _new_page(dest[i * cap: i * cap + int(lengths[i])].copy())
        hits = int((status == Get.HIT).sum())
        errs = int((status == Get.ERROR).sum())
        self._count(pages_read=hits, bytes_read=int(lengths[status == Get.HIT].sum()), hits=hits,
                    misses=n - hits - errs, read_errors=errs, read_seconds=time.perf_counter() - t0)
        return out

    def exists(self, key: str) -> bool:
        """Whether ``key`` is stored: its generic value, or every object of its v1 page."""
        node = self.node
        okeys = [self.generic_key(key)] + self.object_keys([key], self._objects_per_page())
        present = node.exists_batch(okeys)
        return bool(present[0] or all(present[1:]))

    # -- housekeeping ----------------------------------------------------------------------------
    def clear(self) -> None:
        """Remove every page this store wrote (from its pool and the directory) and reset the counters."""
        node = self._node
        if node is not None and node.pool is not None:
            keys = [r.key for r in node.pool.refs()]
            if keys:
                node.remove_batch(keys)
        self._reset_stats()

    def _reset_stats(self) -> None:
        with self._stats_lock:
            self._stats = {k: 0 for k in ("pages_read", "pages_written", "bytes_read", "bytes_written", "hits",
                                          "misses", "read_errors", "write_errors")}
            self._stats.update(read_seconds=0.0, write_seconds=0.0)

    def _count_read(self, pages: int, nbytes: int, hits: int, misses: int, errors: int, seconds: float) -> None:
        with self._stats_lock:
            st = self._stats
            st["pages_read"] += pages
            st["bytes_read"] += nbytes
            st["hits"] += hits
            st["misses"] += misses
            st["read_errors"] += errors
            st["read_seconds"] += seconds

    def _count(self, **inc) -> None:
        with self._stats_lock:
            for k, v in inc.items():
                self._stats[k] += v

    def get_stats(self) -> dict:
        """Counters since the start (or the last clear), with read/write bandwidth in GB/s."""
        with self._stats_lock:
            s = dict(self._stats)
        s["read_bandwidth_GBps"] = round(s["bytes_read"] / s["read_seconds"] / 1e9, 4) if s["read_seconds"] else 0.0
        s["write_bandwidth_GBps"] = (round(s["bytes_written"] / s["write_seconds"] / 1e9, 4)
                                     if s["write_seconds"] else 0.0)
        node = self._node
        s["protocol"] = self.config.protocol
        s["stale_locations"] = node.stale_locations if node is not None else 0
        # reads whose directory entry pointed at another key's slot (misses; see Node.redirected_entries)
        s["redirected_entries"] = node.redirected_entries if node is not None else 0
        s["directory_cache_hits"] = node.cache.hits if node is not None else 0
        # per rail (rdma; [] otherwise), since the store's node opened it, not reset by clear():
        # bytes and READs it carried, completion errors, QP resets, its state and its downs and ups
        s["rails"] = node.transport.rail_stats() if node is not None else []
        return s

    @property
    def metrics_url(self) -> Optional[str]:
        """Where this store's metrics are read (extra config 'metrics_addr'; None when off)."""
        return self._metrics.url if self._metrics is not None else None

    def close(self) -> None:
        """Leave the cluster: the pool, its registration, the receive region's and every connection, and
        the metrics endpoint (idempotent)."""
        with self._node_lock:
            self._closed = True
            node, self._node = self._node, None
            endpoint, self._metrics = self._metrics, None
        if endpoint is not None:
            endpoint.close()
        if node is not None:
            node.close()
        self._region = None
        self.mem_pool_host = None

    def __enter__(self) -> "PeerCacheStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
