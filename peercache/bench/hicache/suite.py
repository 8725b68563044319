"""``python -m peercache.bench.hicache_drive suite``: PeerCacheStore driven as SGLang's HiCache controller drives it.

SGLang's cache controller (0.5.x, ``managers/cache_controller.py``) calls its storage backend in
batches of at most 128 pages (``STORAGE_BATCH_SIZE``), each page ``page_tokens`` tokens of the host
KV pool, with the page's token indices:

- ``exists``: the prefetch's hit query, ``batch_exists(page hashes)`` -> the consecutive prefix found;
- ``get``: the prefetch's transfer, ``batch_get_v1(page hashes, host token indices)`` straight into
  the host pool's pages (the pages of serve's working set, verified against the bench pattern);
- ``set``: the backup (write/offload) path, ``batch_set_v1(page hashes, host token indices)`` of new
  pages, each batch under fresh hashes, into the store's own published pool. The controller skips
  the call when ``storage_config.is_storage_writer`` is false (``backup_skip``): with MLA only rank 0
  writes (``--tp-rank``/``--tp-size``), and a non-writer rank's set rows say so and write nothing.

Each op is swept over ``--concurrencies`` (threads calling the one store of this rank, as the
controller's prefetch and backup threads do), every point bounded in time (``--warmup`` +
``--duration``) and in count (``--max-calls`` per thread), with a PEAK row per op (the point of the
most pages/s). Figures per point: pages/s, tokens/s, GB/s, and p50/p99/p999 of one batch call.
With verification on, every set point ends with a round trip: once its threads stopped, each writes
one more batch, read back through ``batch_get_v1`` into other host pages and compared byte for byte
with what was written.
"""
from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from dataclasses import dataclass, replace
from typing import Optional

import numpy as np

from ... import config, tags
from ...config import Flag, option
from ...errors import ConfigError, PeerCacheError
from ...hicache import DEFAULT_DIR_CACHE_TTL
from ...node import Get
from .. import meta, options, producer
from ..document import SuiteDocument, SuiteMeta
from ..drive import ThreadStats, check_prerequisites, percentiles, safe_directory, tell_serve
from ..drive.bounds import IO_TIMEOUT_S, POINT_GRACE_S
from .store import SERVE_GENERATION, BenchStore, HostPagePool, StorageConfig, is_storage_writer, store_base

#: The calls of one rank's controller, as SGLang names them.
OPS = ("get", "set", "exists")
CALL_OF = {"get": "batch_get_v1", "set": "batch_set_v1", "exists": "batch_exists"}
#: SGLang's STORAGE_BATCH_SIZE: pages per storage call (the suite's default batch).
SGLANG_BATCH = 128
#: Bounds of the knobs (a typo, not a benchmark, beyond them).
MAX_PAGE_TOKENS = 1 << 16
MAX_TP = 1024
MAX_CALLS = 1 << 40
#: Seconds between progress lines of a point.
PROGRESS_S = 1.0
#: Batches per thread a set point reads back for its round trip.
ROUNDTRIP_BATCHES = 1


def _ops(label: str, v) -> tuple:
    items = v.split(",") if isinstance(v, str) else list(v) if isinstance(v, (list, tuple)) else None
    if items is None:
        raise ConfigError(f"{label} must be a comma-separated list of {', '.join(OPS)}, got {v!r}")
    ops = tuple(x.strip() for x in items if str(x).strip())
    bad = [x for x in ops if x not in OPS]
    if not ops or bad:
        raise ConfigError(f"{label}: {', '.join(map(repr, bad)) or 'nothing'} is not an op; give some of "
                          f"{', '.join(OPS)} (e.g. {label} get,set,exists)")
    if len(set(ops)) != len(ops):
        raise ConfigError(f"{label}: {v!r} names an op twice")
    return ops


@dataclass(frozen=True)
class SuiteOptions:
    """The suite's own options (the rest are drive's: :class:`options.BenchOptions` and NodeConfig)."""

    ops: tuple = option(OPS, "operations, each swept over --concurrencies: get (batch_get_v1), set "
                        "(batch_set_v1), exists (batch_exists)", check=_ops,
                        flag=Flag("--ops", default="get,set,exists", type=str))
    page_tokens: int = option(64, "tokens per SGLang page (tokens/s = pages/s x this; --page-size is the bytes "
                              "of one page object)", unit="tokens",
                              check=config.whole(1, MAX_PAGE_TOKENS, least="positive"), flag=Flag("--page-tokens"))
    tp_size: int = option(1, "tensor-parallel ranks of the modelled server", unit="ranks",
                          check=config.whole(1, MAX_TP, least="positive"), flag=Flag("--tp-size"))
    tp_rank: int = option(0, "the rank this suite runs as (MLA: only the storage writer, rank 0, writes)",
                          check=config.whole(0, MAX_TP - 1), flag=Flag("--tp-rank"))
    max_calls: int = option(1_000_000, "batch calls per thread in a point's window, and again in its warmup (the "
                            "count bound; --warmup + --duration is the time bound)", unit="calls",
                            check=config.whole(1, MAX_CALLS, least="positive"), flag=Flag("--max-calls"))


SUITE_FLAGS = config.options(SuiteOptions)
#: drive's flags the suite takes, besides the common ones (options.add_common)
DRIVE_FLAGS = ("batch_size", "concurrencies", "dir_cache_ttl", "duration", "warmup", "verify", "seed",
               "ready_timeout", "out")


def add_flags(p) -> None:
    """The suite's flags: drive's common and loop flags (declared in options/NodeConfig) and its own."""
    options.add_common(p)
    for name in DRIVE_FLAGS:
        config.add_flag(p, options.FLAGS[name])
    for o in SUITE_FLAGS.values():
        config.add_flag(p, o)
    # SGLang's batch, and the directory cache TTL the store has by default (drive's is 0)
    p.set_defaults(batch_size=SGLANG_BATCH, dir_cache_ttl=DEFAULT_DIR_CACHE_TTL)


def validate(args) -> tuple:
    """Check every flag by its declaration and the rules between them; returns the ops (ConfigError names
    the flag)."""
    if getattr(args, "gpu", False):
        raise ConfigError("--gpu: the suite reads into SGLang's host KV pool (host memory); drop --gpu")
    options.check_directory(args)
    options.node_config(args)
    config.checked(config.options(options.BenchOptions), args)
    vals = config.checked(SUITE_FLAGS, args)
    if args.tp_rank >= args.tp_size:
        raise ConfigError(f"--tp-rank {args.tp_rank} is not a rank of --tp-size {args.tp_size} (0..{args.tp_size - 1})")
    ops = vals["ops"]
    if args.batch_size > args.working_set and set(ops) & {"get", "exists"}:
        raise ConfigError(f"--batch-size {args.batch_size} is larger than --working-set {args.working_set}; "
                          "a get or exists batch would repeat pages")
    objs = options.objects_per_page(args.layout)
    need = (args.batch_size * (max(args.concurrencies) + ROUNDTRIP_BATCHES) * objs * args.page_size
            + ("set" in ops) * pool_bytes(args))
    options._fits(need, f"a host pool of --batch-size {args.batch_size} x {max(args.concurrencies)} threads x "
                  f"--page-size {args.page_size} x {objs} object(s) and, with set, a pool as large",
                  "lower --batch-size, --concurrencies or --page-size")
    return ops


def pool_bytes(args) -> int:
    """The published pool of the set op: every thread's batch twice over, and the working set's pages."""
    objs = options.objects_per_page(args.layout)
    pages = max(args.working_set, 2 * args.batch_size * max(args.concurrencies))
    return pages * objs * options.slot_bytes(args.page_size)


class Rank:
    """One rank's store and host KV pool, and the loop of each op (what its controller's threads call)."""

    def __init__(self, args, ops: tuple):
        self.args, self.ops = args, ops
        self.mla = args.layout == "mla"
        self.objs = options.objects_per_page(args.layout)
        self.batch, self.page_tokens, self.obj = args.batch_size, args.page_tokens, args.page_size
        self.writer = is_storage_writer(self.mla, args.tp_rank)
        self.slices = max(args.concurrencies) + ROUNDTRIP_BATCHES
        pages = self.batch * self.slices
        node = replace(options.node_config(args), directory=options.directory(args),
                       auth_key=options.auth_secret(args), timeout=IO_TIMEOUT_S,
                       pool_bytes=pool_bytes(args) if "set" in ops else 0)   # every rank: one extra config
        self.store = BenchStore(StorageConfig(self.mla, node.extra_config(), args.tp_rank, args.tp_size),
                                args.layout)
        try:
            self.host = HostPagePool(pages, self.obj, self.mla, self.page_tokens)
            # distinct bytes in every host page, so a set that lands the wrong page is seen in its round trip
            self.host.kv_buffer[:] = np.random.default_rng(args.seed).integers(0, 256, self.host.kv_buffer.size,
                                                                               dtype=np.uint8)
            self.store.register_mem_pool_host(self.host)
            self.serve_keys = options.page_keys(args.working_set, args.layout)
            self.khash = np.fromiter((tags.key_hash(k) for k in self.serve_keys), np.uint64, len(self.serve_keys))
            self.serial = 0
            self.serial_lock = threading.Lock()
            #: why the round trip's first failed read failed (the node's reason), for the point's reason
            self.roundtrip_why: dict[str, str] = {}
        except BaseException:
            self.store.close()
            raise

    def tokens(self, slot: int, n: int) -> np.ndarray:
        """The host token indices of the first ``n`` pages of slice ``slot`` (SGLang's host_indices)."""
        first = slot * self.batch
        pages = np.arange(first, first + n, dtype=np.int64)
        return (pages[:, None] * self.page_tokens + np.arange(self.page_tokens)).reshape(-1)

    def wait_ready(self) -> None:
        """Wait (bounded by --ready-timeout) until serve's working set is published."""
        keys = self.serve_keys[:: max(1, len(self.serve_keys) // 256)] + self.serve_keys[-1:]
        present, why = producer.await_published(self.store.node.exists_batch, keys, self.args.ready_timeout)
        if not all(present):
            raise PeerCacheError(
                f"the working set ({len(self.serve_keys)} objects) is not published at {self.args.discovery_addr} "
                f"after {self.args.ready_timeout:.0f} s" + (f" ({why})" if why else "")
                + "; start `peercache-bench serve` with the same --working-set/--layout/--page-size")

    def new_hashes(self, n: int) -> list[str]:
        """Page hashes never written before (SGLang backs up new pages: each set batch is fresh)."""
        with self.serial_lock:
            s, self.serial = self.serial, self.serial + n
        return [f"w{self.args.tp_rank}-{i}" for i in range(s, s + n)]

    # -- one batch call of each op: (pages done, misses, errors, verify failures) ------------------
    def call_get(self, tid: int, pages: np.ndarray, verify: bool) -> tuple:
        hashes = [str(p) for p in pages.tolist()]
        got, res = self.store.read_v1(hashes, self.tokens(tid, len(hashes)))
        ok = np.asarray(got, dtype=bool)
        hits = int(ok.sum())
        vfail = 0
        if verify and hits:
            rows = self.host.object_views(np.arange(tid * self.batch, tid * self.batch + len(hashes)))
            idx = pages if self.objs == 1 else (pages[:, None] * self.objs + np.arange(self.objs)).reshape(-1)
            hit = np.repeat(ok, self.objs)
            good = tags.verify_patterns(rows[hit], self.khash[idx][hit],
                                        np.full(int(hit.sum()), SERVE_GENERATION, np.uint64))
            vfail = int((~good).sum())
        n = len(hashes)
        if res is None:   # the store caught a failed batch: every page failed
            errors = n - hits
        elif hits == n:
            errors = 0
        else:
            errors = int((res.status == int(Get.ERROR)).reshape(n, self.objs).any(axis=1).sum())
        return hits, len(hashes) - hits - errors, errors, vfail

    def call_exists(self, tid: int, pages: np.ndarray, verify: bool) -> tuple:
        n = self.store.batch_exists([str(p) for p in pages.tolist()])
        return n, len(pages) - n, 0, 0

    def call_set(self, tid: int, hashes: list[str]) -> tuple:
        ok = self.store.batch_set_v1(hashes, self.tokens(tid, len(hashes)))
        done = sum(ok)
        return done, 0, len(hashes) - done, 0

    def roundtrip(self, written: list[tuple[int, list[str]]]) -> dict:
        """Each thread that wrote writes one more batch of its slice, once every thread has stopped, and it is
        read back into the spare slice and compared byte for byte. The batches written in the window are not
        the ones read: the pool holds ``2 x batch x threads`` pages first in, first out, so a thread's last
        batch of the window is gone once the others wrote that many after it (under load one thread lagged
        that far behind, and the round trip read back 32 of 64 pages)."""
        spare = self.slices - 1
        out = {"pages": 0, "arrived": 0, "mismatched": 0}
        for tid, _ in written:
            hashes = self.new_hashes(self.batch)
            stored = np.asarray(self.store.batch_set_v1(hashes, self.tokens(tid, len(hashes))), dtype=bool)
            got, res = self.store.read_v1(hashes, self.tokens(spare, len(hashes)))
            ok = np.asarray(got, dtype=bool) & stored
            if not ok.all() and "why" not in self.roundtrip_why:
                self.roundtrip_why["why"] = (f"{int((~stored).sum())} page(s) of the batch were not stored"
                                             if not stored.all() else "the read failed as a whole" if res is None
                                             else res.error or res.miss_reason or "misses without a reason")
            src = self.host.object_views(np.arange(tid * self.batch, tid * self.batch + len(hashes)))
            dst = self.host.object_views(np.arange(spare * self.batch, spare * self.batch + len(hashes)))
            same = (src == dst).all(axis=1).reshape(len(hashes), self.objs).all(axis=1)
            out["pages"] += len(hashes)
            out["arrived"] += int(ok.sum())
            out["mismatched"] += int((ok & ~same).sum())
        return out

    def writer_probe(self) -> dict:
        """A non-writer rank's evidence that nothing is written: the controller skips the call
        (``backup_skip``); the store, called anyway, stores nothing and publishes nothing."""
        hashes = self.new_hashes(self.batch)
        returned = self.store.batch_set_v1(hashes, self.tokens(0, self.batch))
        return {"is_storage_writer": False, "probe_pages": len(hashes), "store_returned_true": int(sum(returned)),
                "published": self.store.batch_exists(hashes),
                "pages_written": self.store.get_stats()["pages_written"]}

    def close(self) -> None:
        self.store.close()


class _Thread:
    """The counters of one thread of one point."""

    def __init__(self):
        self.stats = ThreadStats()
        self.calls = 0
        self.last_done = 0.0
        self.written: Optional[tuple[int, list[str]]] = None


def run_point(rank: Rank, op: str, conc: int, say, label: str) -> dict:
    """One point: ``conc`` threads calling ``op`` over one shared window; the point's row."""
    a = rank.args
    t0 = time.time() + 0.1
    win_start, win_end = t0 + a.warmup, t0 + a.warmup + a.duration
    stop = threading.Event()
    abort: list[str] = []
    threads = [_Thread() for _ in range(conc)]
    page_bytes = rank.obj * rank.objs
    live = [0] * conc

    def loop(tid: int) -> None:
        th = threads[tid]
        st = th.stats
        rng = np.random.default_rng(a.seed * 7919 + tid)
        rnd = random.Random(a.seed * 7919 + tid)
        seq = (tid * rank.batch * 977) % a.working_set
        try:
            warm = 0
            while not stop.is_set() and st.batches < a.max_calls and time.time() < win_end:
                if warm >= a.max_calls and time.time() < win_start:   # the warmup's count bound: wait for the window
                    stop.wait(max(0.0, win_start - time.time()))
                    continue
                if op == "set":
                    hashes = rank.new_hashes(rank.batch)
                elif op == "get":
                    pages = rng.choice(a.working_set, rank.batch, replace=False)
                else:   # a prefetch's hit query: consecutive pages of one sequence
                    pages = (seq + np.arange(rank.batch)) % a.working_set
                    seq = (seq + rank.batch) % a.working_set
                t_s = time.perf_counter()
                if op == "set":
                    done, miss, err, vfail = rank.call_set(tid, hashes)
                    th.written = (tid, hashes)
                elif op == "get":
                    done, miss, err, vfail = rank.call_get(tid, pages, a.verify)
                else:
                    done, miss, err, vfail = rank.call_exists(tid, pages, a.verify)
                lat = time.perf_counter() - t_s
                now = time.time()
                th.calls += 1
                if now < win_start:
                    warm += 1
                if win_start <= now <= win_end:
                    st.batches += 1
                    st.keys += rank.batch
                    st.hits += done
                    st.misses += miss
                    st.errors += err
                    st.verify_failures += vfail
                    st.bytes += done * page_bytes if op != "exists" else 0
                    st.sample_latency(lat, rnd)
                    th.last_done = now
                    live[tid] = st.hits
                if err and st.first_error is None:
                    st.first_error = f"{err} page(s) of a {CALL_OF[op]} call failed"
                if vfail:
                    abort.append(f"{vfail} page(s) read as hits had wrong contents")
                    stop.set()
        except Exception as e:   # a dead thread fails the point, never leaves it "ok"
            abort.append(f"thread {tid} failed in {CALL_OF[op]}: {type(e).__name__}: {e}")
            stop.set()

    workers = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(conc)]
    for w in workers:
        w.start()
    last = time.time()
    deadline = win_end + POINT_GRACE_S
    while any(w.is_alive() for w in workers):
        next(w for w in workers if w.is_alive()).join(timeout=0.1)
        now = time.time()
        if now - last >= PROGRESS_S and now < win_end:
            last = now
            phase = "warmup" if now < win_start else "measure"
            say(f"hicache suite: {label} {op} threads={conc} {now - t0:4.1f}/{a.warmup + a.duration:.1f} s "
                f"{phase}" + (f" {sum(live)} pages" if phase == "measure" else ""))
        if now > deadline:
            abort.append(f"{CALL_OF[op]} threads did not finish within the point's window + "
                         f"{POINT_GRACE_S:.0f} s")
            stop.set()
            break
    row = point_row(rank, op, conc, threads, win_start, a.duration, abort)
    if op == "set" and a.verify and row["status"] == "ok":
        row["roundtrip"] = rank.roundtrip([th.written for th in threads if th.written][:conc])
        rt = row["roundtrip"]
        if rt["arrived"] != rt["pages"] or rt["mismatched"]:
            row["status"] = "failed"
            row["reason"] = (f"round trip: {rt['pages']} page(s) written, {rt['arrived']} read back, "
                             f"{rt['mismatched']} with other bytes than written"
                             + (f" (first failed read: {rank.roundtrip_why['why']})" if rank.roundtrip_why else ""))
    return row


def point_row(rank: Rank, op: str, conc: int, threads: list, win_start: float, duration: float,
              abort: list) -> dict:
    """The row of one point from its threads' counters (rates over the measured span of the window)."""
    total = ThreadStats()
    for th in threads:
        total.add(th.stats)
    calls = sum(th.calls for th in threads)
    # a count-bounded point may end before its window does: its rates are over the time it measured
    ended = max((th.last_done for th in threads), default=0.0)
    span = min(duration, max(0.0, ended - win_start)) if total.batches else duration
    span = span or duration
    a = rank.args
    failed = bool(abort) or total.errors > 0 or total.verify_failures > 0 or total.batches == 0
    reason = abort[0] if abort else total.first_error
    if reason is None and total.batches == 0:
        reason = (f"no {CALL_OF[op]} call completed inside the {duration:g} s window; nothing was measured "
                  "(is one call slower than --duration?)")
    pages = total.hits
    return {
        "op": op, "call": CALL_OF[op], "threads": conc, "batch_size": rank.batch, "page_tokens": rank.page_tokens,
        "object_bytes": rank.obj, "objects_per_page": rank.objs, "calls": total.batches,
        "calls_total": calls, "seconds": round(span, 6), "pages": pages, "tokens": pages * rank.page_tokens,
        # the measured span (epoch s): what a CPU sampler's readings are cut to for this point
        "window_start": round(win_start, 6), "window_end": round(win_start + span, 6),
        "bytes": total.bytes,
        "pages_per_s": round(pages / span, 1), "tokens_per_s": round(pages * rank.page_tokens / span, 1),
        "gb_per_s": None if op == "exists" else round(total.bytes / span / 1e9, 4),
        "latency_us": percentiles(total.latencies), "latency_samples": len(total.latencies),
        "misses": total.misses, "errors": total.errors, "verify_failures": total.verify_failures,
        "verified": bool(a.verify and op != "exists"),
        "status": "failed" if failed else "ok", "reason": reason if failed else None,
    }


def skipped_row(rank: Rank, conc: int, probe: dict) -> dict:
    """A set point on a rank that is not the storage writer: nothing written, and the evidence."""
    a = rank.args
    failed = probe["published"] != 0 or probe["pages_written"] != 0
    why = (f"rank {a.tp_rank} of {a.tp_size} is not the storage writer (MLA: rank 0 writes; SGLang's "
           "backup_skip), so the controller makes no batch_set_v1 call")
    return {"op": "set", "call": CALL_OF["set"], "threads": conc, "batch_size": rank.batch,
            "page_tokens": rank.page_tokens, "object_bytes": rank.obj, "objects_per_page": rank.objs,
            "calls": 0, "calls_total": 0, "seconds": 0.0, "pages": 0, "tokens": 0, "bytes": 0,
            "window_start": None, "window_end": None,
            "pages_per_s": 0.0, "tokens_per_s": 0.0, "gb_per_s": 0.0,
            "latency_us": {"p50": None, "p99": None, "p999": None}, "latency_samples": 0,
            "misses": 0, "errors": 0, "verify_failures": 0, "verified": False, "writer_probe": probe,
            "status": "failed" if failed else "skipped",
            "reason": (f"a non-writer rank's batch_set_v1 stored {probe['pages_written']} page(s) and "
                       f"published {probe['published']}") if failed else why}


def peak(points: list[dict]) -> Optional[dict]:
    """The PEAK row of one op: its ok point with the most pages/s (None when none is ok)."""
    ok = [p for p in points if p["status"] == "ok"]
    if not ok:
        return None
    best = max(ok, key=lambda p: p["pages_per_s"])
    return {**{k: best[k] for k in ("op", "call", "pages_per_s", "tokens_per_s", "gb_per_s", "latency_us")},
            "threads": best["threads"], "peak": True}


def run(args) -> tuple[int, dict]:
    """Every op's sweep against a running serve; returns (exit status, result document)."""
    ops = validate(args)
    check_prerequisites(argparse.Namespace(**{**vars(args), "gpu": False}))   # no --gpu here
    say = (lambda *a: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    objs = options.objects_per_page(args.layout)
    mla = args.layout == "mla"
    doc = SuiteDocument(meta=SuiteMeta(
        **meta.host_block(), command=meta.command_line(), start=meta.now_iso(), end=None,
        discovery_addr=args.discovery_addr, directory=safe_directory(options.directory(args)),
        protocol=args.protocol, devices=options.devices(args), layout=args.layout,
        objects_per_page=objs, object_bytes=args.page_size, page_bytes=args.page_size * objs,
        page_tokens=args.page_tokens, bytes_per_token=args.page_size * objs / args.page_tokens,
        batch_size=args.batch_size, concurrencies=list(args.concurrencies), ops=list(ops),
        tp_rank=args.tp_rank, tp_size=args.tp_size,
        is_storage_writer=is_storage_writer(mla, args.tp_rank),
        working_set=args.working_set, duration=args.duration, warmup=args.warmup,
        max_calls=args.max_calls, verify=args.verify, dir_cache_ttl=args.dir_cache_ttl,
        integrity=args.integrity, host_pool="page_first",
        calls={op: CALL_OF[op] for op in ops}, store_base=store_base(),
        versions=meta.versions(), git_revision=meta.git_revision()))
    rank = None
    n_points, k = len(ops) * len(args.concurrencies), 0
    try:
        rank = Rank(args, ops)
        rank.wait_ready()
        say(f"hicache suite: rank {args.tp_rank} of {args.tp_size} ready against {args.discovery_addr} "
            f"({'storage writer' if rank.writer else 'not the storage writer'})")
        for op in ops:
            rows = []
            probe = rank.writer_probe() if op == "set" and not rank.writer else None
            for conc in args.concurrencies:
                k += 1
                label = f"point {k}/{n_points}"
                row = skipped_row(rank, conc, probe) if probe else run_point(rank, op, conc, say, label)
                rows.append(row)
                doc.points.append(row)
                say(f"hicache suite: {label} {op} threads={conc}: {row['pages_per_s']:.0f} pages/s {row['status']}")
            doc.ops[op] = {"points": rows, "peak": peak(rows)}
    except PeerCacheError as e:
        doc.status, doc.error = "failed", str(e)
    except KeyboardInterrupt:
        doc.status, doc.error = "failed", "interrupted"
    finally:
        if rank is not None:
            rank.close()
    doc.meta.end = meta.now_iso()
    bad = next((p for p in doc.points if p["status"] not in ("ok", "skipped")), None)
    if doc.status == "ok" and (bad is not None or not doc.points):
        doc.status = "failed"
        doc.error = (f"{bad['op']} threads={bad['threads']}: {bad['reason']}" if bad else "nothing was measured")
    out = doc.to_dict()
    tell_serve(args, out)
    return (0 if doc.status == "ok" else 1), out


def format_table(doc: dict) -> str:
    """The readable table: one row per point, a PEAK row per op, with units."""
    m = doc["meta"]
    lines = [meta.host_line(m),
             f"# PeerCacheStore as SGLang's HiCache controller calls it: protocol={m['protocol']} layout={m['layout']} "
             f"page={m['page_tokens']} tokens = {m['objects_per_page']} x {m['object_bytes']} B, "
             f"batch={m['batch_size']} pages/call, rank {m['tp_rank']} of {m['tp_size']}"
             f"{' (storage writer)' if m['is_storage_writer'] else ' (not the storage writer)'}, "
             f"verify={'on' if m['verify'] else 'off'}, dir-cache-ttl={m['dir_cache_ttl']:g} s, "
             f"window {m['warmup']:g}+{m['duration']:g} s",
             f"{'op':<7}{'call':<14}{'threads':>7} {'calls':>8} {'pages/s':>11} {'tokens/s':>12} {'GB/s':>8} "
             f"{'p50 us':>9} {'p99 us':>9} {'p999 us':>9} {'miss':>6} {'err':>5}  status"]
    fmt = lambda v, spec: "-" if v is None else format(v, spec)
    for op, block in doc["ops"].items():
        rows = list(block["points"]) + ([{**block["peak"], "calls": None, "misses": None, "errors": None,
                                          "status": f"PEAK (threads={block['peak']['threads']})", "reason": None}]
                                        if block["peak"] else [])
        for p in rows:
            lat = p["latency_us"]
            th = "PEAK" if p.get("peak") else str(p["threads"])
            lines.append(
                f"{op:<7}{p['call']:<14}{th:>7} {fmt(p['calls'], 'd'):>8} {p['pages_per_s']:>11.0f} "
                f"{p['tokens_per_s']:>12.0f} {fmt(p['gb_per_s'], '.3f'):>8} {fmt(lat['p50'], '.1f'):>9} "
                f"{fmt(lat['p99'], '.1f'):>9} {fmt(lat['p999'], '.1f'):>9} {fmt(p['misses'], 'd'):>6} "
                f"{fmt(p['errors'], 'd'):>5}  {p['status']}"
                + (f" ({p['reason']})" if p.get("reason") else "")
                + (f"; round trip {p['roundtrip']['arrived']}/{p['roundtrip']['pages']} pages, "
                   f"{p['roundtrip']['mismatched']} mismatched" if p.get("roundtrip") else ""))
    return "\n".join(lines)
