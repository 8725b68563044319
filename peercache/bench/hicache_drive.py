"""``python -m peercache.bench.hicache_drive drive ...``: ``drive`` through SGLang's HiCache v1 path.

The same flags, processes, threads, measurement window, result document and table as
``peercache-bench drive`` (it is drive's machinery: only the read of each batch differs),
against the same ``peercache-bench serve``. Each batch is one
``PeerCacheStore.batch_get_v1(page hashes, host token indices)`` into a host KV pool
shaped as SGLang's ``page_first`` pool (MLA: one object per page; MHA: K pages, then V
pages), exactly what SGLang's cache controller calls per prefetch batch: page-buffer
metadata from the host pool, object keys, one native batch read straight into the pool's
pages (its buffer registered once, at ``register_mem_pool_host``), and the store's counters.

The store's page keys are mapped onto serve's working-set keys (``pc/<page>``,
``pc/<page>/k|v``) so both tools read the very same published objects; nothing else of
the store is changed. With verification on, the host pages of each hit are checked against
the bench pattern after the batch (serve writes every object once: generation 1).

``python -m peercache.bench.hicache_drive suite ...`` is the HiCache workload suite
(:mod:`peercache.bench.hicache_suite`): get, set and exists sweeps with PEAK rows, as SGLang's
cache controller calls the store.
"""
from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import replace

import numpy as np

from .. import tags
from ..errors import ConfigError, PeerCacheError
from ..hicache import PeerCacheStore
from ..node import Get
from . import drive, meta, options
from .drive.bounds import IO_TIMEOUT_S
from .document import HICACHE_DRIVE_MODE, DriveDocument

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
    """PeerCacheStore whose page keys are serve's working-set keys (page hash = page number)."""

    def __init__(self, storage_config, layout: str, working_set: int):
        sfx = options.LAYOUTS[layout]
        #: page hash -> serve's object keys of that page (built once: the loop only looks them up)
        self._one = len(sfx) == 1
        self._keys_of = {str(i): ([f"pc/{i}{s}".encode() for s in sfx] if len(sfx) > 1 else f"pc/{i}".encode())
                         for i in range(working_set)}
        super().__init__(storage_config, {})

    def object_keys(self, keys, objs):
        of = self._keys_of
        try:
            return [of[h] for h in keys] if self._one else [k for h in keys for k in of[h]]
        except KeyError:   # pages not of serve's working set (the suite's set): the store's own keys
            return super().object_keys(keys, objs)


class _Config:
    """The fields of SGLang's HiCacheStorageConfig the store reads (rank 0 of one)."""

    def __init__(self, mla: bool, extra: dict):
        self.tp_rank, self.tp_size, self.pp_rank, self.pp_size = 0, 1, 0, 1
        self.is_mla_model, self.model_name, self.extra_config = mla, "bench", extra
        self.is_storage_writer = True


class _BatchResult:
    __slots__ = ("status", "error", "generations", "content_mismatch", "redirected", "miss_reason")


class _V1Reader:
    """What drive's loop calls on its node, answered by the store's v1 path."""

    def __init__(self, worker: "HiCacheWorker"):
        self.w = worker

    def exists_batch(self, keys):
        return self.w.store.node.exists_batch(keys)

    def directory_silence(self) -> float:
        return self.w.store.node.directory_silence()

    def get_batch_into(self, keys, dest, offsets, caps, check_pattern=False):
        w = self.w
        objs, n = w.objs, len(keys) // w.objs
        tid = int(offsets[0]) // w.slice_bytes            # drive's thread slice -> its host pages
        pages = np.arange(tid * w.batch, tid * w.batch + n)
        hashes = [w.hash_of[k] for k in keys[::objs]]
        got, res = w.store.read_v1(hashes, w.tokens_of(tid, n))
        r = _BatchResult()
        r.redirected = res.redirected if res is not None else np.empty(0, np.intp)
        r.miss_reason = res.miss_reason if res is not None else None
        if all(got):
            ok = np.ones(n, dtype=bool)
            r.status = np.full(len(keys), int(Get.HIT), np.int8)
        else:
            ok = np.asarray(got, dtype=bool)
            r.status = np.where(np.repeat(ok, objs), int(Get.HIT), int(Get.MISS)).astype(np.int8)
        r.error = None
        r.generations = np.full(len(keys), SERVE_GENERATION, np.uint64)
        r.content_mismatch = np.empty(0, np.intp)
        if check_pattern and ok.any():
            hit = np.repeat(ok, objs)
            rows = w.host.object_views(pages)[hit]
            kh = np.fromiter((tags.key_hash(k) for k in keys), np.uint64, len(keys))[hit]
            good = tags.verify_patterns(rows, kh, r.generations[hit])
            r.content_mismatch = np.flatnonzero(hit)[~good]
        return r


class HiCacheWorker(drive.Worker):
    """A driver process whose batches go through PeerCacheStore.batch_get_v1 into a host KV pool."""

    def __init__(self, cfg: drive.DriveConfig, pidx: int, live):
        self._take_settings(cfg, pidx, live)
        if cfg.gpu:
            raise ConfigError("hicache_drive reads into SGLang's host KV pool: --gpu does not apply")
        self.fused_verify = bool(cfg.verify)
        self.batch = cfg.batch_size
        self.slice_bytes = self.batch * self.objs * cfg.page_size
        pages = self.batch * max(cfg.concurrencies)
        mla = cfg.layout == "mla"
        # drive's node options, as SGLang would give them: the store's extra config (the metrics endpoint
        # of each driver process on its own port, as drive's)
        node = cfg.node
        addr = None
        if node.metrics_addr:
            from ..metrics import for_process   # opt-in (--metrics-addr): prometheus-client only when asked for
            addr = for_process(node.metrics_addr, pidx, cfg.processes)
        # the store's calls get drive's directory bound, not stretched by --time-scale (as before the split)
        extra = replace(node, pool_bytes=0, timeout=IO_TIMEOUT_S, metrics_addr=addr or None).extra_config()
        #: serve's first object key of each page -> its page hash (the page number)
        self.hash_of = {k: str(i) for i, k in enumerate(self.keys[:: self.objs])}
        self.store = BenchStore(_Config(mla, extra), cfg.layout, cfg.working_set)
        try:
            self.host = HostPagePool(pages, cfg.page_size, mla)
            self.store.register_mem_pool_host(self.host)
            self.token_indices = (np.arange(pages, dtype=np.int64)[:, None] * PAGE_TOKENS
                                  + np.arange(PAGE_TOKENS)).reshape(pages, PAGE_TOKENS)
            self._tokens: dict = {}
            self.node = _V1Reader(self)
            self.gpu, self.gpu_method = None, None
            self.recv = self.dest = self.host.kv_buffer
        except BaseException:
            self.store.close()
            raise

    def tokens_of(self, tid: int, n: int) -> np.ndarray:
        """Token indices of thread ``tid``'s first ``n`` host pages (its slice of the pool; the same every batch)."""
        t = self._tokens.get((tid, n))
        if t is None:
            t = self._tokens[(tid, n)] = self.token_indices[tid * self.batch: tid * self.batch + n].reshape(-1)
        return t

    def rail_stats(self) -> list[dict]:
        """The rails' counters as the store reports them (PeerCacheStore.get_stats()["rails"])."""
        return self.store.get_stats()["rails"]

    @property
    def metrics_url(self) -> str | None:
        """Where this process's metrics are read (the store's endpoint; None without --metrics-addr)."""
        return self.store.metrics_url

    def close(self) -> None:
        self.store.close()


def run(args) -> tuple[int, dict]:
    """drive.run with HiCache workers; returns (exit status, result document)."""
    if args.gpu:
        raise ConfigError("--gpu: hicache_drive reads into SGLang's host KV pool (host memory); drop --gpu")
    rc, out = drive.run(args, worker=HiCacheWorker)
    doc = DriveDocument.from_dict(out)      # drive's document, under its own mode and with its read path
    doc.mode = HICACHE_DRIVE_MODE
    doc.meta.read_path = "PeerCacheStore.batch_get_v1 into a page_first host KV pool"
    return rc, doc.to_dict()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m peercache.bench.hicache_drive", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="mode", required=True)
    options.drive_parser(sub.add_parser("drive", help="GET serve's working set through batch_get_v1"))
    from . import hicache_suite
    hicache_suite.add_flags(sub.add_parser(
        "suite", help="get/set/exists sweeps as SGLang's HiCache controller calls the store, with PEAK rows",
        description=hicache_suite.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter))
    return p


def main(argv=None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    from . import hicache_suite
    suite = args.mode == "suite"
    try:
        rc, doc = hicache_suite.run(args) if suite else run(args)
    except ConfigError as e:
        print(f"hicache_drive: invalid options: {e}", file=sys.stderr)
        return 2
    except PeerCacheError as e:
        print(f"hicache_drive: {e}", file=sys.stderr)
        return 1
    print(hicache_suite.format_table(doc) if suite else drive.format_table(doc))
    if doc["error"]:
        print(f"hicache_drive: FAILED: {doc['error']}", file=sys.stderr)
    if args.out:
        meta.write_document(args.out, doc)
    return rc


if __name__ == "__main__":
    # The driver processes find their worker in this module by its name, not as __main__.
    from peercache.bench.hicache_drive import main as _main
    sys.exit(_main())
