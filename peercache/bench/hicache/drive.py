"""``python -m peercache.bench.hicache_drive drive``: drive's processes, threads, window and document, each batch
read through SGLang's HiCache v1 path (``PeerCacheStore.batch_get_v1`` into a page_first host KV pool)."""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

import numpy as np

from ... import tags
from ...errors import ConfigError
from ...node import Get
from .. import options
from ..document import HICACHE_DRIVE_MODE, DriveDocument
from ..drive import DriveConfig, Worker, run as drive_run
from ..drive.bounds import IO_TIMEOUT_S
from .store import PAGE_TOKENS, SERVE_GENERATION, BenchStore, HostPagePool, StorageConfig


#: no indices (shared, read-only)
_NONE = np.empty(0, np.intp)
_NONE.flags.writeable = False


def _fixed(fill: int, dtype) -> Callable[[int], np.ndarray]:
    """n -> a read-only array of n ``fill`` values, made once per n (every batch of a run has one size)."""
    made: dict[int, np.ndarray] = {}

    def of(n: int) -> np.ndarray:
        a = made.get(n)
        if a is None:
            a = made[n] = np.full(n, fill, dtype)
            a.flags.writeable = False
        return a
    return of


class _BatchResult:
    __slots__ = ("status", "error", "generations", "content_mismatch", "redirected", "miss_reason", "lengths",
                 "too_big")


class _V1Reader:
    """What drive's loop calls on its node, answered by the store's v1 path."""

    def __init__(self, worker: "HiCacheWorker"):
        self.w = worker

    def exists_batch(self, keys):
        """The store's node's exists_batch (drive's wait for serve and its exists op)."""
        return self.w.store.node.exists_batch(keys)

    def directory_silence(self) -> float:
        """Seconds since the store's node last heard from the directory."""
        return self.w.store.node.directory_silence()

    def get_batch_into(self, keys, dest, offsets, caps, check_pattern=False):
        """One batch of drive's loop as one batch_get_v1 into the thread's host pages, answered as a node's
        batch result."""
        w = self.w
        objs, n = w.objs, len(keys) // w.objs
        tid = int(offsets[0]) // w.slice_bytes            # drive's thread slice -> its host pages
        hashes = keys[::objs] if objs > 1 else keys       # each object's page hash (HiCacheWorker.keys_arr)
        got, res = w.store.read_v1(hashes, w.tokens_of(tid, n))
        r = _BatchResult()
        r.redirected = res.redirected if res is not None else _NONE
        r.miss_reason = res.miss_reason if res is not None else None
        if all(got):
            ok = None
            r.status = w.all_hit(len(keys))
        else:
            ok = np.asarray(got, dtype=bool)
            r.status = np.where(np.repeat(ok, objs), int(Get.HIT), int(Get.MISS)).astype(np.int8)
        r.error = None
        r.generations = w.serve_generations(len(keys))
        r.content_mismatch = _NONE
        # the store reports no object's size: each is its room (a page of the host pool), none too big
        r.lengths, r.too_big = np.asarray(caps, np.uint64), _NONE
        if check_pattern and (ok is None or ok.any()):
            hit = np.repeat(ok if ok is not None else np.ones(n, dtype=bool), objs)
            rows = w.host.object_views(np.arange(tid * w.batch, tid * w.batch + n))[hit]
            okeys = w.store.object_keys(hashes, objs)
            kh = np.fromiter((tags.key_hash(k) for k in okeys), np.uint64, len(okeys))[hit]
            good = tags.verify_patterns(rows, kh, r.generations[hit])
            r.content_mismatch = np.flatnonzero(hit)[~good]
        return r


class HiCacheWorker(Worker):
    """A driver process whose batches go through PeerCacheStore.batch_get_v1 into a host KV pool."""

    def __init__(self, cfg: DriveConfig, pidx: int, live):
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
            from ...metrics import for_process   # opt-in (--metrics-addr): prometheus-client only when asked for
            addr = for_process(node.metrics_addr, pidx, cfg.processes)
        # the store's calls get drive's directory bound, not stretched by --time-scale (as before the split)
        extra = replace(node, pool_bytes=0, timeout=IO_TIMEOUT_S, metrics_addr=addr or None).extra_config()
        self.store = BenchStore(StorageConfig(mla, extra), cfg.layout)
        # drive's loop passes its node the names of a batch's objects: here each object's page hash (the
        # page number, as SGLang passes hashes), which the store maps onto serve's keys itself
        hashes = [str(i) for i in range(cfg.working_set)]
        self.keys_arr = np.empty(len(self.keys), dtype=object)
        self.keys_arr[:] = [h for h in hashes for _ in range(self.objs)]
        try:
            self.host = HostPagePool(pages, cfg.page_size, mla)
            self.store.register_mem_pool_host(self.host)
            self.token_indices = (np.arange(pages, dtype=np.int64)[:, None] * PAGE_TOKENS
                                  + np.arange(PAGE_TOKENS)).reshape(pages, PAGE_TOKENS)
            self._tokens: dict = {}
            #: a batch's statuses when every page hit, and serve's generation per object (built once per size)
            self.all_hit, self.serve_generations = _fixed(int(Get.HIT), np.int8), _fixed(SERVE_GENERATION, np.uint64)
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
        """Close the store (its node leaves the cluster)."""
        self.store.close()


def run(args) -> tuple[int, dict]:
    """drive's run with HiCache workers; returns (exit status, result document)."""
    if args.gpu:
        raise ConfigError("--gpu: hicache_drive reads into SGLang's host KV pool (host memory); drop --gpu")
    if options.key_prefixes(args):
        raise ConfigError("--key-prefix: hicache_drive's store maps its pages onto serve's unprefixed keys "
                          "(pc/<i>); read prefixed working sets with peercache-bench drive, or drop --key-prefix")
    rc, out = drive_run(args, worker=HiCacheWorker)
    doc = DriveDocument.from_dict(out)      # drive's document, under its own mode and with its read path
    doc.mode = HICACHE_DRIVE_MODE
    doc.meta.read_path = "PeerCacheStore.batch_get_v1 into a page_first host KV pool"
    return rc, doc.to_dict()
