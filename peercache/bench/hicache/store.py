"""The store and host KV pool both HiCache benches use: PeerCacheStore over serve's working-set keys, and a
host pool in SGLang's ``page_first`` layout, with the fields of SGLang's storage config the store reads."""
from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

import numpy as np

from ...hicache import SGLANG_MISSING, PeerCacheStore
from .. import options

#: Tokens per SGLang page of the bench's host pool (any value works: keys are per page).
PAGE_TOKENS = 64
#: serve writes each working-set object once, into its own slot
SERVE_GENERATION = 1


class HostPagePool:
    """A host KV pool in SGLang's ``page_first`` layout over one numpy buffer, with its
    ``get_page_buffer_meta(indices) -> (ptr_list, size_list)``."""

    layout = "page_first"

    def __init__(self, pages: int, obj_bytes: int, mla: bool, page_tokens: int = PAGE_TOKENS):
        self.page_size, self.pages, self.obj_bytes, self.mla = page_tokens, pages, obj_bytes, mla
        self.kv_buffer = np.zeros(pages * obj_bytes * (1 if mla else 2), dtype=np.uint8)
        self._base = int(self.kv_buffer.ctypes.data)

    def get_page_buffer_meta(self, indices):
        """Each object's address and size for the pages of ``indices`` (SGLang's host pool call)."""
        idx = indices if isinstance(indices, np.ndarray) else np.asarray(indices, dtype=np.int64)
        k = self._base + (idx[:: self.page_size] // self.page_size) * self.obj_bytes
        ptrs = k if self.mla else np.stack([k, k + self.pages * self.obj_bytes], axis=1).reshape(-1)
        return ptrs.tolist(), [self.obj_bytes] * len(ptrs)

    def object_views(self, pages: np.ndarray) -> np.ndarray:
        """Rows of the objects of ``pages``, in the store's key order (page, then K/V)."""
        o = self.obj_bytes
        k = self.kv_buffer[: self.pages * o].reshape(self.pages, o)[pages]
        if self.mla:
            return k
        v = self.kv_buffer[self.pages * o:].reshape(self.pages, o)[pages]
        return np.stack([k, v], axis=1).reshape(-1, o)


class BenchStore(PeerCacheStore):
    """PeerCacheStore whose v1 object keys are serve's working-set keys: page hash ``i`` (the page number)
    is object ``pc/<i>`` (MLA) or ``pc/<i>/k`` and ``pc/<i>/v`` (MHA), made by the store's own
    :meth:`~peercache.hicache.PeerCacheStore.object_keys` with serve's prefix and suffixes, so the bench
    runs the path SGLang's calls run."""

    def __init__(self, storage_config, layout: str):
        super().__init__(storage_config, {})
        self.prefix = options.KEY_ROOT      # serve's keys without --key-prefix: pc/<i>
        self._serve_suffixes = list(options.LAYOUTS[layout])

    def _suffixes(self, objs: int) -> list[str]:
        return self._serve_suffixes if objs == len(self._serve_suffixes) else super()._suffixes(objs)


def is_storage_writer(mla: bool, tp_rank: int) -> bool:
    """SGLang's HiCacheStorageConfig.is_storage_writer (no DCP): every rank with MHA, rank 0 with MLA."""
    return not mla or tp_rank == 0


class StorageConfig:
    """The fields of SGLang's HiCacheStorageConfig the store reads, for rank ``tp_rank`` of ``tp_size``."""

    def __init__(self, mla: bool, extra: dict, tp_rank: int = 0, tp_size: int = 1):
        self.tp_rank, self.tp_size, self.pp_rank, self.pp_size = tp_rank, tp_size, 0, 1
        self.is_mla_model, self.model_name, self.extra_config = mla, "bench", extra
        self.is_storage_writer = is_storage_writer(mla, tp_rank)


def store_base() -> str:
    """Which HiCacheStorage the store derives from here: SGLang's own (with its version), or the stand-in."""
    if SGLANG_MISSING is not None:
        return "peercache stand-in (SGLang not importable here)"
    try:
        return f"sglang {version('sglang')} HiCacheStorage"
    except PackageNotFoundError:
        return "sglang HiCacheStorage"
