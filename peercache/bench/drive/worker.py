"""One driver process of ``peercache-bench drive``: its node, its receive buffer, and the loop of each of its threads.

Every driver process runs the same threads against the same absolute measurement window
``[t0 + warmup, t0 + warmup + duration]`` (one host, one clock); the supervisor sends it each point and
gets back its counters (:mod:`.supervisor`).
"""
from __future__ import annotations

import os
import random
import threading
import time
from dataclasses import replace

import numpy as np

from ... import tags
from ...errors import ConfigError, PeerCacheError
from ...node import Get, Node
from .. import options, producer
from ..processes import die_with_parent
from ..serve import METRICS_TEXT_OP
from .access import ZipfPages
from .bounds import (DATA_TIMEOUT_S, DIRECTORY_SILENCE_S, IO_TIMEOUT_S, POINT_GRACE_S, RDMA_COMPLETION_S,
                     RDMA_CONNECT_S, SCRAPE_TIMEOUT_S, STUCK_GRACE_S, WATCH_S)
from .config import DriveConfig, safe_directory
from .stats import ThreadStats, rail_delta
from .timeline import ThreadTimeline


class Worker:
    """One driver process: a node, a receive buffer and the thread loop (HiCacheWorker reads through the store)."""

    def __init__(self, cfg: DriveConfig, pidx: int, live):
        self._take_settings(cfg, pidx, live)
        scale = cfg.time_scale
        # A GET has the node's timeout in all, every step included. Over rdma a READ that gets no
        # completion within RDMA_COMPLETION_S is a path fault that the read fails over (another rail,
        # fresh QPs), and the directory's one-sided table read waits it too: a GET's bound holds one
        # such wait beside the directory's, or a rail going down fails the GETs under way instead of
        # moving them (test_twohost's rail-down test: 'the call has 3 s in all ... the directory table
        # read failed after 5.06 s').
        get_bound = IO_TIMEOUT_S * scale + (RDMA_COMPLETION_S if cfg.node.protocol == "rdma" else 0.0)  # as aggregate.get_bound
        node = replace(cfg.node, timeout=get_bound)
        # rdma's completion bound stays: a READ with no completion for it is a path fault (failover),
        # and stretched by 40 on the loaded emulated pair it held a thread past its window for minutes
        bounds = {"tcp": {"io_timeout": DATA_TIMEOUT_S * scale},
                  "rdma": {"connect_timeout": RDMA_CONNECT_S * scale, "timeout_s": RDMA_COMPLETION_S}}
        self.node = Node(**node.node_kwargs(name=f"drive-{pidx}", transport_options=bounds.get(node.protocol)))
        #: this process's metrics endpoint (--metrics-addr, the port plus the process's index), or None
        self.metrics = None
        if node.metrics_addr:
            from ... import metrics   # opt-in (--metrics-addr): prometheus-client only when asked for
            try:
                self.metrics = metrics.serve_node(metrics.for_process(node.metrics_addr, pidx, cfg.processes),
                                                  self.node, warn=False)   # drive warned once
            except BaseException:
                self.node.close()
                raise
        #: the bench pattern is checked in the native batch, on the bytes it just landed (host memory);
        #: GPU memory is checked here after a download instead
        self.fused_verify = bool(cfg.verify) and not cfg.gpu
        per_batch = cfg.batch_size * self.objs * cfg.page_size
        self.slice_bytes = per_batch
        total = per_batch * max(cfg.concurrencies)
        self.gpu, self.gpu_method = None, None
        if cfg.gpu:
            self._setup_gpu(total)
        else:
            self.recv = np.zeros(total, dtype=np.uint8)
            self.dest = self.recv

    def _take_settings(self, cfg: DriveConfig, pidx: int, live) -> None:
        """What every driver process keeps, whatever it reads through: its settings, progress counter and keys."""
        self.cfg, self.pidx, self.live = cfg, pidx, live
        self.live_lock = threading.Lock()
        self.objs = options.objects_per_page(cfg.layout)
        self.keys = options.page_keys(cfg.working_set, cfg.layout, cfg.key_prefixes)
        #: --access zipf: the popularity of the pages (built once per process, shared by its threads)
        self.zipf = ZipfPages(cfg.pages, cfg.zipf_s, cfg.seed) if cfg.access == "zipf" else None
        self.keys_arr = np.empty(len(self.keys), dtype=object)
        self.keys_arr[:] = self.keys
        self.khash = np.fromiter((tags.key_hash(k) for k in self.keys), np.uint64, len(self.keys))

    def _setup_gpu(self, total: int) -> None:
        """GPU receive buffer: GPUDirect with rdma, pinned host staging with tcp and shm."""
        from ... import gpu   # only a --gpu run loads the GPU module
        self.gpu = gpu.GpuBuffer(total, self.cfg.gpu_device)
        if self.cfg.protocol == "rdma":
            self.gpu_method = gpu.register_for_rdma(self.node.transport, self.gpu)
            self.recv = None
            self.dest = self.gpu.dest()
        else:
            self.gpu_method = "pinned-staging"
            self.recv = self.gpu.pinned(total)
            self.dest = self.recv

    @property
    def metrics_url(self) -> str | None:
        """Where this process's metrics are read (None without --metrics-addr)."""
        return self.metrics.url if self.metrics is not None else None

    def wait_ready(self) -> None:
        """Wait (bounded by --ready-timeout) until serve's working set (each prefix's) is published."""
        per = len(self.keys) // max(1, len(self.cfg.key_prefixes))
        # a sample of every prefix's keys and the last of each: each producer must have published
        sample = self.keys[:: max(1, len(self.keys) // 256)] + self.keys[per - 1:: per]
        present, why = producer.await_published(self.node.exists_batch, sample, self.cfg.ready_timeout)
        if all(present):
            return
        missing = sorted({self._prefix_of(k) for k, ok in zip(sample, present) if not ok})
        raise PeerCacheError(
            f"the working set ({len(self.keys)} objects) is not published at "
            f"{self.node.discovery.address} after {self.cfg.ready_timeout:.0f} s"
            + (f" (none or part of prefix {', '.join(missing)})" if self.cfg.key_prefixes else "")
            + (f" ({why})" if why else "")
            + "; start `peercache-bench serve` with the same --working-set/--layout/--page-size"
            + ("/--key-prefix" if self.cfg.key_prefixes else ""))

    @staticmethod
    def _prefix_of(key: bytes) -> str:
        """The prefix of a prefixed working-set key (pc/P/<i>...)."""
        return key.decode().split("/")[1]

    def rail_stats(self) -> list[dict]:
        """The rails' cumulative counters (Transport.rail_stats; [] for tcp and shm)."""
        return self.node.transport.rail_stats()

    def run_point(self, conc: int, t0: float) -> dict:
        """One point: ``conc`` threads over the window that opens at ``t0`` + warmup; this process's counters."""
        cfg = self.cfg
        win_start = t0 + cfg.warmup
        win_end = win_start + cfg.duration
        stop = threading.Event()
        abort: list[str] = []
        stats = [ThreadStats() for _ in range(conc)]
        # --timeline-ms: each thread's counters per bucket of the window, allocated here, once
        prefixes = len(cfg.key_prefixes)
        timelines = [ThreadTimeline(win_start, cfg.timeline_ms, cfg.duration, prefixes) if cfg.timeline_ms
                     else None for _ in range(conc)]
        threads = [threading.Thread(target=self._loop,
                                    args=(i, t0, win_start, win_end, stop, abort, stats[i], timelines[i]),
                                    daemon=True) for i in range(conc)]
        # The rails' counters when the window opens and after its threads stopped: what each carried;
        # with --metrics-scrapes, the metrics text at the same two moments.
        at_start: list = []
        scrapes: list[dict] = []
        scraping = bool(cfg.metrics_scrapes)

        def window_opens() -> None:
            at_start.append(self.rail_stats())
            if scraping:
                scrapes.extend(self.scrape("start"))
        timer = threading.Timer(max(0.0, win_start - time.time()), window_opens)
        timer.daemon = True
        timer.start()
        for t in threads:
            t.start()
        self._watch(threads, win_end, stop, abort)
        timer.cancel()      # a point that ended before its window opened has no rail figures
        timer.join(1.0)
        rails = rail_delta(at_start[0], self.rail_stats()) if at_start else []
        if scraping and at_start:
            scrapes.extend(self.scrape("end"))
        for s, tl in zip(stats, timelines):
            if tl is not None:
                tl.completed(min(time.time(), win_end))   # a thread stopped inside a batch: its stall so far
                s.timeline = tl.part()
        total = ThreadStats()
        for s in stats:
            total.add(s)
        return {"stats": total.__dict__, "abort": abort[:1], "rails": rails,
                **({"scrapes": scrapes} if scraping else {})}

    def scrape(self, edge: str) -> list[dict]:
        """What this process's metrics endpoint answers now and, asked by process 0 over the control plane,
        serve's: one record each (``source``, ``process``, ``edge``, ``time``, ``url``, ``text``; ``error``
        in place of the text when there is none)."""
        out = [self._own_scrape(edge)]
        if self.pidx == 0:
            out.append(self._serve_scrape(edge))
        return out

    def _own_scrape(self, edge: str) -> dict:
        rec = {"source": "drive", "process": self.pidx, "edge": edge}
        endpoint = getattr(self, "metrics", None)     # HiCacheWorker's store serves its own
        if endpoint is None:
            return dict(rec, error=f"driver process {self.pidx} serves no metrics endpoint of its own")
        t = time.time()
        return dict(rec, time=t, url=endpoint.url, text=endpoint.text())

    def _serve_scrape(self, edge: str) -> dict:
        rec = {"source": "serve", "process": None, "edge": edge}
        try:
            reply = self.node.call(METRICS_TEXT_OP, timeout=SCRAPE_TIMEOUT_S)
        except Exception as e:   # a meta node, an older serve, or none: the point goes on without it
            return dict(rec, error=f"serve's metrics could not be read over the control plane ({e}); "
                                   "serve must be peercache-bench serve with --metrics-addr")
        if not reply.get("text"):
            return dict(rec, error=reply.get("why") or "serve answered no metrics text")
        return dict(rec, time=reply.get("time"), url=reply.get("url"), text=reply["text"])

    def _watch(self, threads: list, win_end: float, stop, abort: list) -> None:
        """Wait for the point's threads; end the point early when the directory falls silent (unless
        faults are expected: then the directory may go away and come back, and its lookups, each
        bounded, fail meanwhile as errors), and leave behind threads still stuck in a read (bounded:
        see DIRECTORY_SILENCE_S)."""
        ended_at = None
        silence_of = (lambda: 0.0) if self.cfg.faults_expected else \
            getattr(self.node, "directory_silence", lambda: 0.0)
        while any(t.is_alive() for t in threads):
            next(t for t in threads if t.is_alive()).join(timeout=WATCH_S)
            if stop.is_set():
                ended_at = ended_at or time.monotonic()
                if time.monotonic() - ended_at >= STUCK_GRACE_S:
                    break
                continue
            silence = silence_of()
            if silence > DIRECTORY_SILENCE_S * self.cfg.time_scale:
                self.abandon = True      # leaving would be one more call to the silent directory
                where = safe_directory(self.cfg.directory or self.cfg.discovery_addr)
                abort.append(f"the directory at {where} is unreachable: it has answered no heartbeat for "
                             f"{silence:.1f} s (it, or the node hosting it, is stopped, hung or out of reach)")
                stop.set()
            elif time.time() > win_end + POINT_GRACE_S * self.cfg.time_scale:
                abort.append("driver threads did not finish within the point's window + grace")
                stop.set()
        # A point stopped by an error (its threads stop only on those) ends this process without
        # leaving: the fault may be the directory, or a producer whose connections would linger.
        self.abandon = getattr(self, "abandon", False) or any(t.is_alive() for t in threads) \
            or (stop.is_set() and bool(abort))

    def _add_live(self, n: float) -> None:
        """Progress counter shared with the parent (a plain double: the parent only reads it)."""
        with self.live_lock:
            self.live.value += n

    def _loop(self, tid: int, t0: float, win_start: float, win_end: float, stop, abort, st: ThreadStats,
              tl: ThreadTimeline | None = None):
        try:
            self._run_loop(tid, t0, win_start, win_end, stop, abort, st, tl)
        except Exception as e:  # a dead thread must fail the point, not leave it "ok" with 0 batches
            abort.append(f"driver thread {tid} of process {self.pidx} failed: {type(e).__name__}: {e}")
            stop.set()

    def _run_loop(self, tid: int, t0: float, win_start: float, win_end: float, stop, abort, st: ThreadStats,
                  tl: ThreadTimeline | None = None):
        cfg = self.cfg
        # --faults-expected: a read error (a producer gone) is counted for its keys, and the thread goes on
        tolerate = cfg.faults_expected
        ws, batch, objs, page = cfg.pages, cfg.batch_size, self.objs, cfg.page_size
        rng = np.random.default_rng(cfg.seed * 7919 + self.pidx * 131 + tid)
        rnd = random.Random(cfg.seed * 7919 + self.pidx * 131 + tid)
        base = tid * self.slice_bytes
        offsets = base + np.arange(batch * objs, dtype=np.uint64) * page
        caps = np.full(batch * objs, page, dtype=np.uint64)
        seq = (tid * batch * 977) % ws
        get = cfg.op == "get"
        # Per-batch Python work is the driver's own overhead, not PeerCache's:
        # page indices come from pre-drawn blocks and keys from an object array.
        keys_arr = self.keys_arr
        # objects per prefix of a union of --key-prefix's (0: one working set, nothing to count apart)
        per_prefix = 0
        if len(cfg.key_prefixes) > 1:
            per_prefix = len(self.keys) // len(cfg.key_prefixes)
            st.bytes_by_prefix = [0] * len(cfg.key_prefixes)
        zipf = self.zipf if cfg.access == "zipf" else None
        obj_off = np.arange(objs)
        block, bi = None, 0
        pending, next_flush = 0, 0.0
        checked_size = None      # the page size the first hits were found to have (objects of --page-size)
        while time.time() < t0 and not stop.is_set():
            time.sleep(min(0.01, max(0.0, t0 - time.time())))
        while not stop.is_set():
            now = time.time()
            if now >= win_end:
                self._add_live(pending)
                return
            if cfg.access != "sequential":
                # random: uniform; zipf: by popularity. Both draw independently (a batch may repeat a page).
                if block is None or bi == len(block):
                    block, bi = (rng.integers(0, ws, (256, batch)) if zipf is None
                                 else zipf.draw(rng, (256, batch))), 0
                pages = block[bi]
                bi += 1
            else:
                pages = (seq + np.arange(batch)) % ws
                seq = (seq + batch) % ws
            idx = pages if objs == 1 else (pages[:, None] * objs + obj_off).reshape(-1)
            keys = keys_arr[idx].tolist()
            t_s = time.perf_counter()
            r = None
            try:
                if get:
                    r = self.node.get_batch_into(keys, self.dest, offsets, caps,
                                                 check_pattern=self.fused_verify)
                    status, err, red = r.status, r.error, len(r.redirected)
                    if self.gpu is not None and self.recv is not None:
                        # tcp/shm into GPU memory: staged in pinned host memory, then copied.
                        self.gpu.upload(self.recv[base: base + len(keys) * page], base)
                else:
                    present = self.node.exists_batch(keys)
                    status = np.where(present, int(Get.HIT), int(Get.MISS)).astype(np.int8)
                    err, red = None, 0
            except ConfigError as e:     # a mistake, not a fault: never tolerated
                abort.append(str(e))
                stop.set()
                return
            except PeerCacheError as e:
                if not tolerate:
                    abort.append(str(e))
                    stop.set()
                    return
                # the whole batch failed (a transport or directory error): each of its keys is an error
                status = np.full(len(keys), int(Get.ERROR), dtype=np.int8)
                err, red = f"{type(e).__name__}: {e}", 0
            lat = time.perf_counter() - t_s
            done = time.time()
            if tl is not None:
                tl.completed(done)
            hits = status == Get.HIT
            n_hit = int(np.count_nonzero(hits))
            if get and r is not None and (len(r.too_big) or (checked_size is None and n_hit)):
                # --page-size against the objects' size (a producer that published none): a mistake, said once
                wrong = r.too_big if len(r.too_big) else np.flatnonzero(hits & (r.lengths != page))
                if len(wrong):
                    i = int(wrong[0])
                    abort.append(producer.page_size_mismatch(page, int(r.lengths[i]), keys[i]))
                    stop.set()
                    return
                checked_size = page
            n_err = 0 if n_hit == len(keys) else int(np.count_nonzero(status == Get.ERROR))
            vfail = 0
            if get and self.fused_verify and r is not None:
                vfail = len(r.content_mismatch)
            elif get and cfg.verify and n_hit:
                if self.gpu is not None:
                    view = self.gpu.download(base, len(keys) * page).reshape(len(keys), page)
                else:
                    view = self.recv[base: base + len(keys) * page].reshape(len(keys), page)
                ok = tags.verify_patterns(view[hits], self.khash[idx][hits], r.generations[hits])
                vfail = int((~ok).sum())
            if win_start <= done <= win_end:
                st.batches += 1
                st.keys += len(keys)
                st.hits += n_hit
                st.misses += len(keys) - n_hit - n_err
                st.errors += n_err
                st.verify_failures += vfail
                st.redirected += red
                b = n_hit * page if get else 0
                st.bytes += b
                counts = None
                if get and per_prefix:      # which producer each hit came from: its key's prefix
                    counts = np.bincount(idx[hits] // per_prefix, minlength=len(st.bytes_by_prefix))
                    st.bytes_by_prefix = [x + int(c) * page for x, c in zip(st.bytes_by_prefix, counts)]
                if tl is not None:      # --timeline-ms: the same counts, in the bucket of this moment
                    if per_prefix and n_hit and counts is None:     # --op exists: hits by prefix here only
                        counts = np.bincount(idx[hits] // per_prefix, minlength=len(cfg.key_prefixes))
                    tl.add(done, len(keys), n_hit, len(keys) - n_hit - n_err, n_err, vfail, b,
                           counts if n_hit else None)
                st.sample_latency(lat, rnd)
                pending += b if get else n_hit
                if done >= next_flush:   # progress counter: a few lock takes a second, not one per batch
                    self._add_live(pending)
                    pending, next_flush = 0, done + 0.25
            if n_err and st.first_error is None:
                st.first_error = err or f"{n_err} key(s) of a batch failed"
            if red and st.first_redirect is None:
                st.first_redirect = r.miss_reason
            if n_err and err and not tolerate and ("unreachable" in err or "connection" in err
                                                   or "no endpoint" in err):
                abort.append(err)
                stop.set()
                return
            if vfail:
                abort.append(f"{vfail} page(s) read as hits had wrong contents")

    def close(self) -> None:
        """Stop the metrics endpoint and leave the cluster."""
        if self.metrics is not None:
            self.metrics.close()
        self.node.close()


def worker_main(conn, pidx: int, live, parent_pid: int | None = None, inherited=()) -> None:
    """A driver process's life: wait for the run's settings (a :class:`.config.DriveConfig`), build its
    ``worker``, report ready, run each point the supervisor sends, end. ``inherited``: the pipe ends of the
    drivers forked before this one, which this one closes."""
    die_with_parent(parent_pid)
    for c in inherited:
        c.close()
    try:
        msg = conn.recv()
    except (EOFError, OSError):
        return      # the supervisor ended before it had settings to give
    if msg[0] != "config":
        return
    cfg: DriveConfig = msg[1]
    worker = None
    try:
        worker = cfg.worker(cfg, pidx, live)
        worker.wait_ready()
        conn.send(("ready", worker.gpu_method, worker.metrics_url))
        while True:
            if not conn.poll(cfg.ready_timeout + cfg.warmup + cfg.duration + 120):
                return  # the parent went away
            msg = conn.recv()
            if msg[0] == "point":
                conn.send(("result", worker.run_point(msg[1], msg[2])))
            else:
                return
    except PeerCacheError as e:
        conn.send(("error", str(e)))
    except Exception as e:  # report, don't hang the parent
        conn.send(("error", f"driver process {pidx} failed: {type(e).__name__}: {e}"))
    finally:
        if worker is not None and getattr(worker, "abandon", False):
            # A thread is still inside a read on the node's connections (closing them under it is
            # not safe), or a point was stopped by a fault (leaving would wait on the directory,
            # which may be the fault): the process ends now, and its memory and sockets go with it.
            os._exit(1)
        if worker is not None:
            worker.close()

