"""The parent of a drive: it starts the driver processes, waits for them to be ready (then says drive's ready
words), places each point's shared window, collects every process's result within the point's deadline,
ends every process it started, and tells serve it is done."""
from __future__ import annotations

import logging
import multiprocessing as mp
import os
import sys
import time

from ...address import host_of, is_loopback
from ...config import NodeConfig
from ...directory.client import connect_directory, is_redis
from ...errors import PeerCacheError
from ...node import Node
from ...transport.tcp import batch_wire
from .. import meta, options, producer
from ..document import DRIVE_READY_WORDS, DriveDocument, DriveMeta
from ..processes import end_all, exit_text, recv
from .aggregate import aggregate
from .bounds import CLEAN_END_S, END_GRACE_S, IO_TIMEOUT_S, POINT_GRACE_S
from .config import DriveConfig, safe_directory
from .stats import ThreadStats
from .worker import Worker, worker_main

log = logging.getLogger("peercache.bench.drive")


def run(args, worker: type | None = None) -> tuple[int, dict]:
    """Run every concurrency point; returns (exit status, result document).

    ``worker`` (a subclass of :class:`.worker.Worker`) is what each driver
    process runs instead of drive's own reader (hicache_drive's HiCacheWorker).
    """
    say = (lambda *a: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    options.check_flags(args, "drive")
    drivers = Drivers(args.processes)
    try:
        cfg, doc = _prepare(args, worker, say)
    except BaseException:
        drivers.end(0.0)
        raise
    procs, conns, lives = drivers.procs, drivers.conns, drivers.lives
    try:
        drivers.configure(cfg)
        for i, c in enumerate(conns):
            msg = recv(c, args.ready_timeout + 30, f"driver process {i} did not get ready")
            if msg[0] == "error":
                raise PeerCacheError(msg[1])
            doc.meta.gpu_registration = msg[1]
            if msg[2]:
                doc.meta.metrics.append(msg[2])
                print(f"drive: metrics of driver process {i} at {msg[2]}", file=sys.stderr, flush=True)
        if args.start_file is not None or not args.quiet:     # with --start-file a runner waits for it
            print(f"drive: {args.processes} {DRIVE_READY_WORDS} {safe_directory(cfg.directory)}",
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
            if cfg.metrics_scrapes:
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
        # After a fault the processes are not waited on for long: leaving the cluster may be a
        # call to the very directory that failed (see END_GRACE_S).
        failed = doc.status != "ok" or any(p.status != "ok" for p in doc.points)
        drivers.end(END_GRACE_S if failed else CLEAN_END_S)
    doc.meta.end = meta.now_iso()
    if any(p.status != "ok" for p in doc.points) or not doc.points:
        doc.status = "failed"
        doc.error = doc.error or next((p.reason for p in doc.points if p.reason), "errors during the run")
    out = doc.to_dict()
    tell_serve(args, out)
    return (0 if doc.status == "ok" else 1), out


def _prepare(args, worker: type | None, say) -> tuple[DriveConfig, DriveDocument]:
    """What the driver processes are given, and the document's head: the producer's geometry learned, the
    flags checked, the prerequisites there (ConfigError/PeerCacheError before any point)."""
    # the geometry flags not given: the producer's (ConfigError if one given differs)
    producer.learn(args, say, IO_TIMEOUT_S * args.time_scale)
    options.validate(args, "drive")
    check_prerequisites(args)
    if getattr(args, "metrics_addr", None):
        from ... import metrics   # opt-in (--metrics-addr): prometheus-client only when asked for
        metrics.for_process(args.metrics_addr, args.processes - 1, args.processes)   # the ports fit
        if not is_loopback(host_of(args.metrics_addr)):
            log.warning(metrics.open_warning(args.metrics_addr))
    # The driver processes' settings; the node's secret goes to them only, never into the document.
    cfg = DriveConfig.from_args(args, worker or Worker)
    start = meta.now_iso()
    doc = DriveDocument(meta=DriveMeta(
        **meta.host_block(), command=meta.command_line(), start=start, end=None,
        discovery_addr=args.discovery_addr, protocol=args.protocol,
        directory=safe_directory(cfg.directory),
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
        metrics=[], metrics_scrapes=cfg.metrics_scrapes,
        versions=meta.versions(), git_revision=meta.git_revision(),
        key_prefixes=list(cfg.key_prefixes) or None, zipf_s=cfg.zipf_s,
        timeline_ms=cfg.timeline_ms or None, faults_expected=cfg.faults_expected or None))
    return cfg, doc


class Drivers:
    """The driver processes, forked before this process opens any connection or starts any thread: each is
    a copy of this interpreter with drive's modules imported, waiting for its settings
    (:meth:`configure`). A fresh interpreter (multiprocessing's spawn) imported them again in every driver:
    under emulation that was 30-40 s of each drive's start (the two-machine pair at x16-25)."""

    def __init__(self, n: int):
        ctx = mp.get_context("fork")
        self.procs, self.conns, self.lives = [], [], []
        try:
            for i in range(n):
                parent, child = ctx.Pipe()
                # No lock: a driver killed while holding it would hang every later read of it.
                live = ctx.Value("d", 0.0, lock=False)
                # The earlier drivers' pipe ends go along with the fork; the new driver closes them.
                p = ctx.Process(target=worker_main, args=(child, i, live, os.getpid(), list(self.conns)), daemon=True)
                p.start()
                child.close()   # only the worker holds its end now: its death reads as EOF here
                self.procs.append(p), self.conns.append(parent), self.lives.append(live)
        except BaseException:
            self.end(0.0)
            raise

    def configure(self, cfg: DriveConfig) -> None:
        """Give every driver the run's settings; each then builds its node and reports ready."""
        for c in self.conns:
            c.send(("config", cfg))

    def stop(self) -> None:
        """Ask every driver to end (one already gone is skipped)."""
        for c in self.conns:
            try:
                c.send(("stop", None))
            except (OSError, BrokenPipeError):
                pass

    def end(self, grace: float) -> None:
        """Ask every driver to end and wait up to ``grace`` s before ending those still running."""
        self.stop()
        end_all(self.procs, grace)


def check_prerequisites(args) -> None:
    """Fail before any process starts when --gpu or --protocol rdma cannot work here, or a Redis
    directory does not answer (an error naming its URL, within its connect timeout)."""
    spec = options.directory(args)
    if is_redis(spec):
        connect_directory(spec, timeout=IO_TIMEOUT_S).close()
    if args.gpu:
        from ... import gpu   # only a --gpu run loads the GPU module
        gpu.require()
    if args.protocol == "rdma":
        from ...rdma import devices   # only an rdma run loads the rdma package
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
                                      f"threads={conc} ({exit_text(procs[i])}); the point has only "
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


def tell_serve(args, doc: dict) -> None:
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
