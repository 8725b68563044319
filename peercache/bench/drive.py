"""``peercache-bench drive``: GET (or exists) load against a serving node.

Every driver process runs the same threads against the same absolute
measurement window ``[t0 + warmup, t0 + warmup + duration]`` (one host, one
clock), so the aggregate is total bytes over that one window, never a sum
of rates measured over different windows.
"""
from __future__ import annotations

import ctypes
import importlib
import logging
import multiprocessing as mp
import os
import random
import signal
import sys
import threading
import time
from dataclasses import dataclass, field, replace

import numpy as np

from .. import tags
from ..address import host_of, is_loopback
from ..config import NodeConfig
from ..directory.client import connect_directory
from ..directory.redis.url import is_redis, parse_url
from ..errors import PeerCacheError
from ..node import Get, Node
from ..transport.base import Transport
from ..transport.tcp import batch_wire
from . import meta, options
from .document import DRIVE_READY_WORDS, DriveDocument, DriveMeta, DrivePoint
from .serve import METRICS_TEXT_OP

log = logging.getLogger(__name__)

#: How long a point may overrun its window before the driver gives up on it.
POINT_GRACE_S = 20.0
#: Every fault ends a drive within 5 s. Each wait of a driver is bounded by one of these: its
#: directory calls (lookups, heartbeats) give up after IO_TIMEOUT_S without an answer (over rdma
#: IO_TIMEOUT_S + RDMA_COMPLETION_S, a GET's whole bound: see Driver), its tcp
#: data connection after DATA_TIMEOUT_S without progress; a point ends once the directory has
#: answered none of the node's heartbeats (one a second) for DIRECTORY_SILENCE_S, which also
#: catches a stopped producer hosting the directory whose pages one-sided reads still reach
#: (shm, rdma); threads still inside a read are then given STUCK_GRACE_S and left behind, and
#: after a failed run the driver processes are given END_GRACE_S before they are ended.
IO_TIMEOUT_S = 3.0
DATA_TIMEOUT_S = 2.0
DIRECTORY_SILENCE_S = 3.0
#: The rdma transport's connection setup bound drive gives it.
RDMA_CONNECT_S = 5.0
#: The rdma transport's completion bound drive gives it: a READ with no completion for this long is a
#: path fault, failed over to another rail (not stretched by --time-scale: see Driver).
RDMA_COMPLETION_S = 5.0
#: --time-scale multiplies POINT_GRACE_S, IO_TIMEOUT_S, DATA_TIMEOUT_S, DIRECTORY_SILENCE_S and
#: RDMA_CONNECT_S (emulated hosts); STUCK_GRACE_S and END_GRACE_S stay.
STUCK_GRACE_S = 0.2
END_GRACE_S = 1.0
#: How long process 0 waits for serve's metrics text at a window edge (--metrics-scrapes).
SCRAPE_TIMEOUT_S = 3.0
#: How often a driver process checks on its point's threads and its directory.
WATCH_S = 0.1
#: Per-batch latencies one driver thread keeps for the percentiles: beyond this many, a uniform
#: sample of the window's batches (reservoir sampling), so memory stays bounded on long points.
LATENCY_SAMPLES = 100_000


@dataclass
class ThreadStats:
    """Counters of one driver thread inside the measurement window."""

    bytes: int = 0
    keys: int = 0
    hits: int = 0
    misses: int = 0
    errors: int = 0
    verify_failures: int = 0
    #: misses whose directory entry pointed at another key's slot (BatchResult.redirected)
    redirected: int = 0
    batches: int = 0
    latencies: list = field(default_factory=list)
    #: batches whose latency was offered to ``latencies`` (more than it holds once it is full)
    latency_seen: int = 0
    #: reason of the first batch with errors (the point's reason when nothing aborted)
    first_error: str | None = None
    #: why the first redirected entry was a miss, in or out of the window (it fails the point)
    first_redirect: str | None = None

    def add(self, other: "ThreadStats") -> None:
        for f in ("bytes", "keys", "hits", "misses", "errors", "verify_failures", "redirected", "batches",
                  "latency_seen"):
            setattr(self, f, getattr(self, f) + getattr(other, f))
        self.latencies.extend(other.latencies)
        self.first_error = self.first_error or other.first_error
        self.first_redirect = self.first_redirect or other.first_redirect

    def sample_latency(self, seconds: float, rnd: random.Random) -> None:
        """Keep one batch's latency: all of the first LATENCY_SAMPLES, then a uniform sample of them all."""
        self.latency_seen += 1
        if len(self.latencies) < LATENCY_SAMPLES:
            self.latencies.append(seconds)
        else:
            j = rnd.randrange(self.latency_seen)
            if j < LATENCY_SAMPLES:
                self.latencies[j] = seconds


class _Worker:
    """One driver process: a node, a receive buffer and the thread loop."""

    def __init__(self, cfg: dict, pidx: int, live):
        self.cfg, self.pidx, self.live = cfg, pidx, live
        self.live_lock = threading.Lock()
        self.objs = options.objects_per_page(cfg["layout"])
        self.keys = options.page_keys(cfg["working_set"], cfg["layout"])
        self.keys_arr = np.empty(len(self.keys), dtype=object)
        self.keys_arr[:] = self.keys
        self.khash = np.fromiter((tags.key_hash(k) for k in self.keys), np.uint64, len(self.keys))
        scale = cfg.get("time_scale", 1.0)
        # A GET has the node's timeout in all, every step included. Over rdma a READ that gets no
        # completion within RDMA_COMPLETION_S is a path fault that the read fails over (another rail,
        # fresh QPs), and the directory's one-sided table read waits it too: a GET's bound holds one
        # such wait beside the directory's, or a rail going down fails the GETs under way instead of
        # moving them (test_twohost's rail-down test: 'the call has 3 s in all ... the directory table
        # read failed after 5.06 s').
        get_bound = IO_TIMEOUT_S * scale + (RDMA_COMPLETION_S if cfg["node"].protocol == "rdma" else 0.0)
        node = replace(cfg["node"], timeout=get_bound)
        # rdma's completion bound stays: a READ with no completion for it is a path fault (failover),
        # and stretched by 40 on the loaded emulated pair it held a thread past its window for minutes
        bounds = {"tcp": {"io_timeout": DATA_TIMEOUT_S * scale},
                  "rdma": {"connect_timeout": RDMA_CONNECT_S * scale, "timeout_s": RDMA_COMPLETION_S}}
        self.node = Node(**node.node_kwargs(name=f"drive-{pidx}", transport_options=bounds.get(node.protocol)))
        #: this process's metrics endpoint (--metrics-addr, the port plus the process's index), or None
        self.metrics = None
        if node.metrics_addr:
            from .. import metrics
            try:
                self.metrics = metrics.serve_node(metrics.for_process(node.metrics_addr, pidx, cfg["processes"]),
                                                  self.node, warn=False)   # drive warned once
            except BaseException:
                self.node.close()
                raise
        #: the bench pattern is checked in the native batch, on the bytes it just landed (host memory);
        #: GPU memory is checked here after a download instead
        self.fused_verify = bool(cfg["verify"]) and not cfg.get("gpu")
        per_batch = cfg["batch_size"] * self.objs * cfg["page_size"]
        self.slice_bytes = per_batch
        total = per_batch * max(cfg["concurrencies"])
        self.gpu, self.gpu_method = None, None
        if cfg.get("gpu"):
            self._setup_gpu(total)
        else:
            self.recv = np.zeros(total, dtype=np.uint8)
            self.dest = self.recv

    def _setup_gpu(self, total: int) -> None:
        """GPU receive buffer: GPUDirect with rdma, pinned host staging with tcp and shm."""
        from .. import gpu
        self.gpu = gpu.GpuBuffer(total, self.cfg.get("gpu_device", 0))
        if self.cfg["protocol"] == "rdma":
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
        deadline = time.monotonic() + self.cfg["ready_timeout"]
        while True:
            present = self.node.exists_batch(self.keys[:: max(1, len(self.keys) // 256)] + self.keys[-1:])
            if all(present):
                return
            if time.monotonic() > deadline:
                raise PeerCacheError(
                    f"the working set ({len(self.keys)} objects) is not published at "
                    f"{self.node.discovery.address} after {self.cfg['ready_timeout']:.0f} s; start "
                    "`peercache-bench serve` with the same --working-set/--layout/--page-size")
            time.sleep(0.2)

    def rail_stats(self) -> list[dict]:
        """The rails' cumulative counters (Transport.rail_stats; [] for tcp and shm)."""
        return self.node.transport.rail_stats()

    def run_point(self, conc: int, t0: float) -> dict:
        cfg = self.cfg
        win_start = t0 + cfg["warmup"]
        win_end = win_start + cfg["duration"]
        stop = threading.Event()
        abort: list[str] = []
        stats = [ThreadStats() for _ in range(conc)]
        threads = [threading.Thread(target=self._loop, args=(i, t0, win_start, win_end, stop, abort, stats[i]),
                                    daemon=True) for i in range(conc)]
        # The rails' counters when the window opens and after its threads stopped: what each carried;
        # with --metrics-scrapes, the metrics text at the same two moments.
        at_start: list = []
        scrapes: list[dict] = []
        scraping = bool(cfg.get("metrics_scrapes"))

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
        """Wait for the point's threads; end the point early when the directory falls silent, and
        leave behind threads still stuck in a read (bounded: see DIRECTORY_SILENCE_S)."""
        ended_at = None
        silence_of = getattr(self.node, "directory_silence", lambda: 0.0)
        while any(t.is_alive() for t in threads):
            next(t for t in threads if t.is_alive()).join(timeout=WATCH_S)
            if stop.is_set():
                ended_at = ended_at or time.monotonic()
                if time.monotonic() - ended_at >= STUCK_GRACE_S:
                    break
                continue
            silence = silence_of()
            if silence > DIRECTORY_SILENCE_S * self.cfg.get("time_scale", 1.0):
                self.abandon = True      # leaving would be one more call to the silent directory
                where = _safe_directory(self.cfg.get("directory") or self.cfg["discovery_addr"])
                abort.append(f"the directory at {where} is unreachable: it has answered no heartbeat for "
                             f"{silence:.1f} s (it, or the node hosting it, is stopped, hung or out of reach)")
                stop.set()
            elif time.time() > win_end + POINT_GRACE_S * self.cfg.get("time_scale", 1.0):
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

    def _loop(self, tid: int, t0: float, win_start: float, win_end: float, stop, abort, st: ThreadStats):
        try:
            self._run_loop(tid, t0, win_start, win_end, stop, abort, st)
        except Exception as e:  # a dead thread must fail the point, not leave it "ok" with 0 batches
            abort.append(f"driver thread {tid} of process {self.pidx} failed: {type(e).__name__}: {e}")
            stop.set()

    def _run_loop(self, tid: int, t0: float, win_start: float, win_end: float, stop, abort, st: ThreadStats):
        cfg = self.cfg
        ws, batch, objs, page = cfg["working_set"], cfg["batch_size"], self.objs, cfg["page_size"]
        rng = np.random.default_rng(cfg["seed"] * 7919 + self.pidx * 131 + tid)
        rnd = random.Random(cfg["seed"] * 7919 + self.pidx * 131 + tid)
        base = tid * self.slice_bytes
        offsets = base + np.arange(batch * objs, dtype=np.uint64) * page
        caps = np.full(batch * objs, page, dtype=np.uint64)
        seq = (tid * batch * 977) % ws
        get = cfg["op"] == "get"
        # Per-batch Python work is the driver's own overhead, not PeerCache's:
        # page indices come from pre-drawn blocks and keys from an object array.
        keys_arr = self.keys_arr
        obj_off = np.arange(objs)
        block, bi = None, 0
        pending, next_flush = 0, 0.0
        while time.time() < t0 and not stop.is_set():
            time.sleep(min(0.01, max(0.0, t0 - time.time())))
        while not stop.is_set():
            now = time.time()
            if now >= win_end:
                self._add_live(pending)
                return
            if cfg["access"] == "random":
                if block is None or bi == len(block):
                    block, bi = rng.integers(0, ws, (256, batch)), 0
                pages = block[bi]
                bi += 1
            else:
                pages = (seq + np.arange(batch)) % ws
                seq = (seq + batch) % ws
            idx = pages if objs == 1 else (pages[:, None] * objs + obj_off).reshape(-1)
            keys = keys_arr[idx].tolist()
            t_s = time.perf_counter()
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
            except PeerCacheError as e:
                abort.append(str(e))
                stop.set()
                return
            lat = time.perf_counter() - t_s
            done = time.time()
            hits = status == Get.HIT
            n_hit = int(np.count_nonzero(hits))
            n_err = 0 if n_hit == len(keys) else int(np.count_nonzero(status == Get.ERROR))
            vfail = 0
            if get and self.fused_verify:
                vfail = len(r.content_mismatch)
            elif get and cfg["verify"] and n_hit:
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
                st.sample_latency(lat, rnd)
                pending += b if get else n_hit
                if done >= next_flush:   # progress counter: a few lock takes a second, not one per batch
                    self._add_live(pending)
                    pending, next_flush = 0, done + 0.25
            if n_err and st.first_error is None:
                st.first_error = err or f"{n_err} key(s) of a batch failed"
            if red and st.first_redirect is None:
                st.first_redirect = r.miss_reason
            if n_err and err and ("unreachable" in err or "connection" in err or "no endpoint" in err):
                abort.append(err)
                stop.set()
                return
            if vfail:
                abort.append(f"{vfail} page(s) read as hits had wrong contents")

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
        self.node.close()


PR_SET_PDEATHSIG = 1


def _die_with_parent(parent_pid: int | None) -> None:
    """Make this driver process end at once when the drive parent dies (even by SIGKILL).

    Linux: PR_SET_PDEATHSIG (the kernel sends SIGKILL when the parent exits);
    elsewhere, or if prctl is refused, a thread that watches the parent pid.
    """
    if parent_pid is None:
        return
    armed = False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        armed = libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:   # the parent died before the signal was armed
        os._exit(1)
    if armed:
        return

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.2)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _worker_class(cfg: dict) -> type:
    """The worker class a driver process runs: drive's own, or ``cfg["worker"]`` ("module:Class")."""
    spec = cfg.get("worker")
    if not spec:
        return _Worker
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def _worker_main(conn, cfg: dict, pidx: int, live, parent_pid: int | None = None) -> None:
    _die_with_parent(parent_pid)
    worker = None
    try:
        worker = _worker_class(cfg)(cfg, pidx, live)
        worker.wait_ready()
        conn.send(("ready", worker.gpu_method, worker.metrics_url))
        while True:
            if not conn.poll(cfg["ready_timeout"] + cfg["warmup"] + cfg["duration"] + 120):
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


def rail_delta(before: list[dict], after: list[dict]) -> list[dict]:
    """Per rail, what its counters (Transport.rail_stats) grew by between two readings, and its state
    at the second."""
    old = {r["rail"]: r for r in before}
    out = []
    for r in after:
        o = old.get(r["rail"], {})
        errs = {k: n - o.get("completion_errors", {}).get(k, 0) for k, n in r["completion_errors"].items()}
        out.append({"rail": r["rail"], "state": r["state"],
                    **{k: r[k] - o.get(k, 0) for k in Transport.RAIL_COUNTS},
                    "completion_errors": {k: n for k, n in errs.items() if n}})
    return out


def merge_rails(per_process: list[list[dict]]) -> list[dict]:
    """The rails of one point over all driver processes (by device name): counts summed, ``state`` "up"
    only where every process saw it up, ``share`` each rail's part of all bytes read."""
    merged: dict[str, dict] = {}
    for rails in per_process:
        for r in rails:
            m = merged.setdefault(r["rail"], {"rail": r["rail"], "state": "up", "share": None,
                                              **dict.fromkeys(Transport.RAIL_COUNTS, 0), "completion_errors": {}})
            for k in Transport.RAIL_COUNTS:
                m[k] += r[k]
            for k, n in r["completion_errors"].items():
                m["completion_errors"][k] = m["completion_errors"].get(k, 0) + n
            if r["state"] != "up":
                m["state"] = "down"
    total = sum(m["bytes_read"] for m in merged.values())
    for m in merged.values():
        m["share"] = round(m["bytes_read"] / total, 4) if total else None
    return list(merged.values())


def _percentiles(lat: list) -> dict:
    if not lat:
        return {"p50": None, "p99": None, "p999": None}
    a = np.asarray(lat) * 1e6
    p = np.percentile(a, [50, 99, 99.9])
    return {"p50": round(float(p[0]), 1), "p99": round(float(p[1]), 1), "p999": round(float(p[2]), 1)}


def aggregate(conc: int, cfg: dict, results: list[dict]) -> DrivePoint:
    """One point from the per-process results of one shared window (its window is placed by run)."""
    total = ThreadStats()
    aborts = []
    for r in results:
        total.add(ThreadStats(**r["stats"]))
        aborts += r["abort"]
    dur = cfg["duration"]
    objs = options.objects_per_page(cfg["layout"])
    get = cfg["op"] == "get"
    # A directory entry that points at another key's slot is a miss, never those bytes; but the
    # directory is corrupt (or written by someone who should not), so nothing it measured stands.
    failed = bool(aborts) or total.errors > 0 or total.verify_failures > 0 or total.batches == 0 \
        or total.first_redirect is not None
    reason = aborts[0] if aborts else total.first_error
    if reason is None and total.verify_failures:
        reason = f"{total.verify_failures} page(s) read as hits had wrong contents"
    if reason is None and total.first_redirect is not None:
        reason = total.first_redirect
    if reason is None and total.batches == 0:
        reason = (f"no batch completed inside the {dur:g} s measurement window; nothing was measured "
                  "(is a batch slower than the window? see the driver log)")
    return DrivePoint(
        concurrency=conc, processes=cfg["processes"], threads=conc * cfg["processes"],
        batch_size=cfg["batch_size"], page_size=cfg["page_size"], duration_s=dur,
        bytes=total.bytes, batches=total.batches,
        gb_per_s=round(total.bytes / dur / 1e9, 4) if get else None,
        pages_per_s=round(total.hits / objs / dur, 1),
        objects_per_s=round(total.hits / dur, 1),
        latency_us=_percentiles(total.latencies),
        latency_samples=len(total.latencies), latency_batches=total.latency_seen,
        hit_rate=round(total.hits / total.keys, 6) if total.keys else None,
        keys=total.keys, errors=total.errors, verify_failures=total.verify_failures,
        redirected=total.redirected,
        verified=bool(cfg["verify"] and get),
        # per rail over the window (rdma; [] otherwise): bytes and share, READs, errors, downs and ups
        rails=merge_rails([r.get("rails", []) for r in results]),
        status="failed" if failed else "ok", reason=reason if failed else None,
    )


def format_table(doc: dict) -> str:
    """The readable console table with its host + meta line."""
    m = doc["meta"]
    lines = [f"# {m['host']} ({m['cpu']}), kernel {m['kernel']}, rev {m['git_revision']}",
             f"# protocol={m['protocol']} devices={','.join(m['devices']) or '-'} layout={m['layout']} "
             f"page={m['page_size']} B batch={m['batch_size']} processes={m['processes']} "
             f"op={m['op']} verify={'on' if m['verify'] else 'off'} "
             f"integrity={'on' if m.get('integrity') else 'off'} dir-cache-ttl={m['dir_cache_ttl']} s"
             + (f" tcp-poll={m['tcp_poll_us']} us" if m.get("tcp_poll_us") is not None else ""),
             f"{'threads':>7} {'GB/s':>8} {'pages/s':>11} {'p50 us':>9} {'p99 us':>9} {'p999 us':>9} "
             f"{'hit %':>7} {'errors':>6}  status"]
    for p in doc["points"]:
        lat = p["latency_us"]
        gbs = "-" if p["gb_per_s"] is None else f"{p['gb_per_s']:.3f}"
        hit = "-" if p["hit_rate"] is None else f"{100 * p['hit_rate']:.2f}"
        fmt = lambda v: "-" if v is None else f"{v:.1f}"
        lines.append(f"{p['threads']:>7} {gbs:>8} {p['pages_per_s']:>11.0f} {fmt(lat['p50']):>9} "
                     f"{fmt(lat['p99']):>9} {fmt(lat['p999']):>9} {hit:>7} {p['errors']:>6}  "
                     f"{p['status']}{' (' + p['reason'] + ')' if p['reason'] else ''}")
        if p.get("rails"):
            lines.append(f"{'':>7} rails: " + ", ".join(_rail_text(r) for r in p["rails"]))
    return "\n".join(lines)


def _rail_text(r: dict) -> str:
    """One rail of a point, for the table: bytes, share, and what happened to it."""
    share = "-" if r["share"] is None else f"{100 * r['share']:.0f} %"
    extra = [f"{r[k]} {k[:-1]}" for k in ("downs", "ups") if r[k]]
    extra += [f"{n} {k}" for k, n in r["completion_errors"].items()]
    if r["state"] != "up":
        extra.append("down now")
    return f"{r['rail']} {r['bytes_read'] / 1e9:.3f} GB ({share}{', ' + ', '.join(extra) if extra else ''})"


def run(args, worker: str | None = None) -> tuple[int, dict]:
    """Run every concurrency point; returns (exit status, result document).

    ``worker`` ("module:Class", a subclass of drive's worker) is what each
    driver process runs instead of drive's own reader (hicache_drive's).
    """
    options.validate(args, "drive")
    check_prerequisites(args)
    if getattr(args, "metrics_addr", None):
        from .. import metrics
        metrics.for_process(args.metrics_addr, args.processes - 1, args.processes)   # the ports fit
        if not is_loopback(host_of(args.metrics_addr)):
            log.warning(metrics.open_warning(args.metrics_addr))
    cfg = {k: getattr(args, k) for k in (
        "discovery_addr", "protocol", "layout", "page_size", "working_set",
        "batch_size", "concurrencies", "processes", "duration", "warmup",
        "op", "verify", "access", "seed", "ready_timeout", "gpu", "gpu_device", "time_scale")}
    cfg["directory"] = options.directory(args)
    cfg["worker"] = worker
    cfg["metrics_scrapes"] = bool(getattr(args, "metrics_scrapes", False))
    # The driver processes' node options; its secret goes to them only, never into the document.
    cfg["node"] = replace(options.node_config(args), directory=cfg["directory"], auth_key=options.auth_secret(args))
    start = meta.now_iso()
    doc = DriveDocument(meta=DriveMeta(
        **meta.host_block(), command=meta.command_line(), start=start, end=None,
        discovery_addr=args.discovery_addr, protocol=args.protocol,
        directory=_safe_directory(cfg["directory"]),
        devices=options.devices(args), layout=args.layout,
        objects_per_page=options.objects_per_page(args.layout),
        page_size=args.page_size, batch_size=args.batch_size,
        concurrencies=args.concurrencies, processes=args.processes,
        working_set=args.working_set, max_channels=args.max_channels,
        tcp_poll_us=options.tcp_poll_us(args),
        # how the tcp client moves each batch (request size, depth, socket buffer): what a raw
        # TCP limit must reproduce to bound these figures
        tcp_wire=batch_wire(args.page_size, options.objects_per_page(args.layout) * args.batch_size)
        if args.protocol == "tcp" else None,
        dir_cache_ttl=args.dir_cache_ttl, duration=args.duration, warmup=args.warmup,
        op=args.op, verify=args.verify, integrity=args.integrity, access=args.access,
        gpu=args.gpu, gpu_registration=None,
        ib_port=args.ib_port if args.protocol == "rdma" else None,
        gid_index=args.gid_index if args.protocol == "rdma" else None,
        metrics=[], metrics_scrapes=cfg["metrics_scrapes"],
        versions=meta.versions(), git_revision=meta.git_revision()))
    ctx = mp.get_context("spawn")
    procs, conns, lives = [], [], []
    say = (lambda *a: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    try:
        for i in range(args.processes):
            parent, child = ctx.Pipe()
            # No lock: a driver killed while holding it would hang every later read of it.
            live = ctx.Value("d", 0.0, lock=False)
            p = ctx.Process(target=_worker_main, args=(child, cfg, i, live, os.getpid()), daemon=True)
            p.start()
            child.close()   # only the worker holds its end now: its death reads as EOF here
            procs.append(p), conns.append(parent), lives.append(live)
        for i, c in enumerate(conns):
            msg = _recv(c, args.ready_timeout + 30, f"driver process {i} did not get ready")
            if msg[0] == "error":
                raise PeerCacheError(msg[1])
            doc.meta.gpu_registration = msg[1]
            if msg[2]:
                doc.meta.metrics.append(msg[2])
                print(f"drive: metrics of driver process {i} at {msg[2]}", file=sys.stderr, flush=True)
        if args.start_file is not None or not args.quiet:     # with --start-file a runner waits for it
            print(f"drive: {args.processes} {DRIVE_READY_WORDS} {_safe_directory(cfg['directory'])}",
                  file=sys.stderr, flush=True)
        for k, conc in enumerate(args.concurrencies):
            t0 = time.time() + 0.3
            start = None if k else args.start_at if args.start_file is None else \
                await_start_file(args.start_file, args.ready_timeout)
            if start is not None:
                if start < time.time():
                    given = f"--start-at {start:.3f}" if args.start_file is None else \
                        f"the start time {start:.3f} in {args.start_file}"
                    raise PeerCacheError(
                        f"{given} passed {time.time() - start:.2f} s before the drivers were ready; "
                        "give a later start time")
                t0 = start
            for lv in lives:
                lv.value = 0.0
            for c in conns:
                c.send(("point", conc, t0))
            results = _collect(conns, procs, lives, t0, conc, k, args, say)
            point = aggregate(conc, cfg, results)
            if cfg["metrics_scrapes"]:
                # every process's metrics text (and serve's) at the window's start and end, as they read them
                point.metrics_scrapes = [x for r in results for x in r.get("scrapes", [])]
            point.window_start = round(t0 + args.warmup, 6)
            point.window_end = round(t0 + args.warmup + args.duration, 6)
            doc.points.append(point)
            lost = [r["abort"][0] for r in results if r.get("lost")]
            if lost:
                # A driver process is gone: the later points could not measure what they say.
                doc.status, doc.error = "failed", lost[0]
                break
            if point.reason and any(w in point.reason for w in ("unreachable", "connection", "discovery")):
                doc.status, doc.error = "failed", point.reason
                break
    except PeerCacheError as e:
        doc.status, doc.error = "failed", str(e)
    except Exception as e:  # still write the document and release serve
        doc.status, doc.error = "failed", f"drive failed: {type(e).__name__}: {e}"
    except KeyboardInterrupt:
        doc.status, doc.error = "failed", "interrupted"
    finally:
        for c in conns:
            try:
                c.send(("stop", None))
            except (OSError, BrokenPipeError):
                pass
        # After a fault the processes are not waited on for long: leaving the cluster may be a
        # call to the very directory that failed (see END_GRACE_S).
        failed = doc.status != "ok" or any(p.status != "ok" for p in doc.points)
        grace = END_GRACE_S if failed else 5.0
        until = time.monotonic() + grace
        for p in procs:
            p.join(timeout=max(0.0, until - time.monotonic()))
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=2)
            if p.is_alive():
                p.kill()
                p.join(timeout=2)
    doc.meta.end = meta.now_iso()
    if any(p.status != "ok" for p in doc.points) or not doc.points:
        doc.status = "failed"
        doc.error = doc.error or next((p.reason for p in doc.points if p.reason), "errors during the run")
    out = doc.to_dict()
    _tell_serve(args, out)
    return (0 if doc.status == "ok" else 1), out


def _safe_directory(spec: str) -> str:
    """The directory spec for documents and messages (a Redis URL's password masked)."""
    return parse_url(spec).safe if is_redis(spec) else spec


def check_prerequisites(args) -> None:
    """Fail before any process starts when --gpu or --protocol rdma cannot work here, or a Redis
    directory does not answer (an error naming its URL, within its connect timeout)."""
    spec = options.directory(args)
    if is_redis(spec):
        connect_directory(spec, timeout=3.0).close()
    if args.gpu:
        from .. import gpu
        gpu.require()
    if args.protocol == "rdma":
        from ..rdma import devices
        devices.discover(options.devices(args), args.ib_port, args.gid_index)


def await_start_file(path: str, timeout: float) -> float:
    """The epoch a runner writes into ``path`` once every driver it started is ready (polled every 20 ms,
    up to ``timeout`` s; the runner writes it whole, by a rename)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            text = open(path).read().strip()
        except FileNotFoundError:
            text = ""
        if text:
            try:
                return float(text)
            except ValueError:
                raise PeerCacheError(f"--start-file {path} holds {text[:40]!r}, not an epoch in seconds; "
                                     "the runner must write the start time as one number") from None
        if time.monotonic() >= deadline:
            raise PeerCacheError(f"no start time appeared in --start-file {path} within {timeout:.0f} s of the "
                                 "drivers being ready: the runner that started this drive never released it "
                                 "(raise --ready-timeout, or check that runner's log)")
        time.sleep(0.02)


def _recv(conn, timeout: float, what: str):
    if not conn.poll(timeout):
        raise PeerCacheError(f"{what} within {timeout:.0f} s")
    try:
        return conn.recv()
    except EOFError:
        raise PeerCacheError(f"{what}: the process exited")


def _exit_text(p) -> str:
    """How a driver process ended, for messages."""
    p.join(timeout=0.5)
    code = p.exitcode
    if code is None:
        return "its pipe closed while it still runs"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def _lost(i: int, why: str) -> dict:
    """The result of a driver process that reported no point: nothing measured, and why."""
    return {"stats": ThreadStats().__dict__, "abort": [why], "lost": True}


def _collect(conns, procs, lives, t0, conc, k, args, say) -> list[dict]:
    """Every process's result of one point; a process that died or failed counts as lost, with why."""
    end = t0 + args.warmup + args.duration
    results: list = [None] * len(conns)
    last = 0.0
    while any(r is None for r in results):
        for i, c in enumerate(conns):
            if results[i] is not None:
                continue
            alive = procs[i].is_alive()   # sampled first: a dead process's last message is in the pipe
            try:
                msg = c.recv() if c.poll(0.05) else None
            except (EOFError, OSError):
                msg = None
                alive = False
            if msg is not None and msg[0] == "error":
                results[i] = _lost(i, msg[1])
            elif msg is not None:
                results[i] = msg[1]
            elif not alive:
                results[i] = _lost(i, f"driver process {i} (pid {procs[i].pid}) exited during point "
                                      f"threads={conc} ({_exit_text(procs[i])}); the point has only "
                                      "what the other processes measured")
        now = time.time()
        if now - last >= 1.0 and now < end:
            last = now
            elapsed = now - t0
            phase = "warmup" if elapsed < args.warmup else "measure"
            moved = sum(lv.value for lv in lives)
            rate = moved / max(1e-9, elapsed - args.warmup) / 1e9 if phase == "measure" else 0.0
            unit = "GB/s" if args.op == "get" else "G keys/s"
            say(f"drive: point {k + 1}/{len(args.concurrencies)} threads={conc} "
                f"{max(0.0, elapsed):5.1f}/{args.warmup + args.duration:.1f} s {phase}"
                + (f" {rate:.3f} {unit}" if phase == "measure" else ""))
        if now > end + POINT_GRACE_S + 10:
            for i, r in enumerate(results):
                if r is None:
                    results[i] = _lost(i, f"driver process {i} did not report point threads={conc} "
                                          f"within {POINT_GRACE_S + 10:.0f} s after its window")
    return results


def _tell_serve(args, doc: dict) -> None:
    """Tell serve this reader is done (bounded: nothing to tell a directory that just failed)."""
    ok = doc["status"] == "ok"
    if not ok and "unreachable" in (doc["error"] or ""):
        return
    try:
        # reader_done is accepted only in a registered node's name: register, tell, leave.
        node = NodeConfig(discovery_addr=args.discovery_addr, directory=options.directory(args),
                          timeout=2.0 if ok else 0.5, auth_key=options.auth_secret(args))
        cli = Node(**node.node_kwargs(name="drive"))
        try:
            cli.call("reader_done", summary={"status": doc["status"], "points": len(doc["points"])})
        finally:
            cli.close()
    except PeerCacheError:
        pass  # serve is gone or is a plain meta node: nothing to tell
