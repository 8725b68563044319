"""Shared parts of the HiCache storage tests (main venv and the SGLang venv).

- :class:`NumpyHostPool`: a numpy-backed stand-in for SGLang's host KV pool with the same
  ``get_page_buffer_meta`` (``page_first`` layout: MLA one buffer per page, MHA K then V),
  used because SGLang's own host pool classes need transformers and GPU kernels to build.
- :func:`cluster`: a discovery node in this process (its lookups counted) and a writer
  process holding a :class:`PeerCacheStore` with a pool, driven over a pipe; the writer is
  always ended, on every path.
"""
from __future__ import annotations

import contextlib
import multiprocessing as mp
import socket
import threading

import numpy as np

from peercache.node import Node

PAGE_TOKENS = 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class NumpyHostPool:
    """Host KV pool stand-in: ``pages`` pages of ``page_tokens`` tokens in one contiguous buffer.

    MHA (``page_first``): K of every page, then V of every page (SGLang's ``v_offset``);
    each page's K (and V) is ``layers * heads * head_dim * itemsize * page_tokens`` bytes.
    MLA: one object per page.
    """

    layout = "page_first"

    def __init__(self, pages: int, obj_bytes: int, mla: bool, page_tokens: int = PAGE_TOKENS):
        self.page_size = page_tokens
        self.pages, self.obj_bytes, self.mla = pages, obj_bytes, mla
        self.halves = 1 if mla else 2
        self.kv_buffer = np.zeros(pages * obj_bytes * self.halves, dtype=np.uint8)

    def get_page_buffer_meta(self, indices):
        idx = indices.tolist()
        assert len(idx) % self.page_size == 0
        base = int(self.kv_buffer.ctypes.data)
        v_off = self.pages * self.obj_bytes
        ptrs = []
        for i in range(0, len(idx), self.page_size):
            k = base + (int(idx[i]) // self.page_size) * self.obj_bytes
            ptrs.append(k)
            if not self.mla:
                ptrs.append(k + v_off)
        return ptrs, [self.obj_bytes] * len(ptrs)

    def page_view(self, page: int) -> list[np.ndarray]:
        """The bytes of host page ``page`` (one array per object)."""
        o = self.obj_bytes
        views = [self.kv_buffer[page * o:(page + 1) * o]]
        if not self.mla:
            v = self.pages * o
            views.append(self.kv_buffer[v + page * o: v + (page + 1) * o])
        return views


def page_bytes(key: str, obj: int, size: int) -> np.ndarray:
    """The deterministic content of object ``obj`` of page ``key`` (what a writer stores)."""
    seed = int.from_bytes(key.encode()[:16].ljust(16, b"\0"), "little") ^ (obj * 0x9E3779B97F4A7C15)
    return np.random.default_rng(seed % (1 << 63)).integers(0, 256, size, dtype=np.uint8)


def indices(pages, page_tokens: int = PAGE_TOKENS, torch_indices: bool = False):
    """SGLang-style token indices of host pages ``pages``."""
    tok = (np.asarray(pages, dtype=np.int64)[:, None] * page_tokens + np.arange(page_tokens)).reshape(-1)
    if torch_indices:
        import torch
        return torch.from_numpy(tok)
    return tok


class StorageConfig:
    """The fields of SGLang's HiCacheStorageConfig PeerCacheStore reads (for the main venv)."""

    def __init__(self, tp_rank=0, tp_size=1, is_mla_model=False, model_name="m", extra_config=None):
        self.tp_rank, self.tp_size, self.pp_rank, self.pp_size = tp_rank, tp_size, 0, 1
        self.is_mla_model, self.model_name, self.extra_config = is_mla_model, model_name, extra_config

    @property
    def is_storage_writer(self) -> bool:
        return not self.is_mla_model or self.tp_rank == 0


def make_config(sglang: bool, **kw):
    if not sglang:
        return StorageConfig(**kw)
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
    return HiCacheStorageConfig(tp_rank=kw.get("tp_rank", 0), tp_size=kw.get("tp_size", 1), pp_rank=0, pp_size=1,
                                attn_cp_rank=0, attn_cp_size=1, is_mla_model=kw.get("is_mla_model", False),
                                enable_storage_metrics=False, is_page_first_layout=True,
                                model_name=kw.get("model_name", "m"), extra_config=kw.get("extra_config"))


def make_store(sglang: bool, extra: dict, **kw):
    """A PeerCacheStore: through SGLang's StorageBackendFactory 'dynamic' loader when ``sglang``."""
    extra = {"backend_name": "peercache", "module_path": "peercache.hicache", "class_name": "PeerCacheStore",
             "interface_v1": 1, **extra}
    cfg = make_config(sglang, extra_config=extra, **kw)
    if sglang:
        from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory
        return StorageBackendFactory.create_backend("dynamic", cfg, None)
    from peercache.hicache import PeerCacheStore
    return PeerCacheStore(cfg, {})


def _writer_main(conn, sglang: bool, extra: dict, kw: dict, pages: int, obj_bytes: int) -> None:
    """The writer process: a store with a pool and a host pool, running the parent's commands."""
    store = None
    try:
        store = make_store(sglang, extra, **kw)
        pool = NumpyHostPool(pages, obj_bytes, kw.get("is_mla_model", False))
        store.register_mem_pool_host(pool)
        conn.send(("ready", None))
        while conn.poll(60):
            op, arg = conn.recv()
            if op == "set_v1":   # (keys, host pages): fill those pages with the keys' content, write them
                keys, hp = arg
                for k, p in zip(keys, hp):
                    for j, v in enumerate(pool.page_view(p)):
                        v[:] = page_bytes(k, j, obj_bytes)
                conn.send(("ok", store.batch_set_v1(keys, indices(hp, torch_indices=sglang))))
            elif op == "set":    # generic values
                keys = arg
                vals = [page_bytes(k, 0, obj_bytes) for k in keys]
                if sglang:
                    import torch
                    vals = [torch.from_numpy(v) for v in vals]
                conn.send(("ok", store.batch_set(keys, vals)))
            elif op == "stats":
                conn.send(("ok", store.get_stats()))
            elif op == "clear":
                store.clear()
                conn.send(("ok", None))
            else:
                break
    except Exception as e:  # reported to the parent, never a hang
        conn.send(("error", f"{type(e).__name__}: {e}"))
    finally:
        if store is not None:
            store.close()
        conn.close()


class Writer:
    """The parent's handle on the writer process."""

    def __init__(self, conn, proc):
        self.conn, self.proc = conn, proc

    def call(self, op: str, arg=None, timeout: float = 30.0):
        self.conn.send((op, arg))
        if not self.conn.poll(timeout):
            raise AssertionError(f"writer did not answer {op!r} within {timeout} s")
        tag, val = self.conn.recv()
        if tag == "error":
            raise AssertionError(f"writer failed on {op!r}: {val}")
        return val


class LookupCounter:
    """Counts directory lookup requests served by the discovery node (every process's)."""

    def __init__(self, node: Node):
        self.n = 0
        self._lock = threading.Lock()
        inner = node.server.handlers["lookup"]

        def counted(msg):
            with self._lock:
                self.n += 1
            return inner(msg)
        node.server.handlers["lookup"] = counted


@contextlib.contextmanager
def cluster(protocol: str, *, sglang: bool = False, mla: bool = False, pages: int = 16, obj_bytes: int = 16384,
            writer_pool_pages: int = 64, extra: dict | None = None, writer_rank: int = 0):
    """(discovery address, lookup counter, writer) with the writer process always ended."""
    port = free_port()
    addr = f"127.0.0.1:{port}"
    disc = Node(addr, host_discovery=True, name="discovery")
    counter = LookupCounter(disc)
    halves = 1 if mla else 2
    from peercache import tags
    w_extra = {"discovery_addr": addr, "protocol": protocol,
               "pool_bytes": writer_pool_pages * halves * tags.slot_stride(obj_bytes), **(extra or {})}
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_writer_main, args=(child, sglang, w_extra,
                                                   {"is_mla_model": mla, "tp_rank": writer_rank}, pages, obj_bytes),
                       daemon=True)
    try:
        proc.start()
        child.close()
        if not parent.poll(60):
            raise AssertionError("writer process did not get ready within 60 s")
        tag, val = parent.recv()
        if tag != "ready":
            raise AssertionError(f"writer process failed to start: {val}")
        yield addr, counter, Writer(parent, proc)
    finally:
        try:
            parent.send(("stop", None))
        except OSError:
            pass
        proc.join(timeout=10)
        if proc.is_alive():
            proc.terminate()
            proc.join(timeout=5)
        disc.close()
