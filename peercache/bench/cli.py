"""``peercache-bench``: serve | drive | meta."""
from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from .. import metrics
from ..auth import curve_keys
from ..directory import is_redis
from ..directory.service import MetaService
from ..errors import ConfigError, PeerCacheError
from ..rpc import RpcServer
from ..timeouts import DEFAULT as TIMEOUTS
from . import drive, meta, options, serve


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="peercache-bench", description=__doc__)
    sub = p.add_subparsers(dest="mode", required=True)
    options.serve_parser(sub.add_parser("serve", help="host discovery and publish the working set"))
    options.drive_parser(sub.add_parser("drive", help="GET the working set and report throughput"))
    m = sub.add_parser("meta", help="standalone discovery + directory process")
    options.meta_parser(m)
    return p


def _stop_on_signals() -> threading.Event:
    """An event SIGTERM and SIGINT set: installed before meta says it is ready, so a signal sent once it
    is ready always ends it cleanly (one sent between the line and the handlers killed it: exit -15)."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def _meta_redis(args) -> int:
    """With a Redis directory there is nothing to host: meta checks Redis and reaps expired nodes."""
    from ..directory.redis.backend import RedisDirectory   # redis-py only for a redis:// directory

    options.check_directory(args)
    d = RedisDirectory(args.directory, timeout=TIMEOUTS.directory_s, heartbeat_timeout=args.heartbeat_timeout)
    try:
        endpoint = _meta_metrics(args, None, None)
    except PeerCacheError:
        d.close()
        raise
    stop = _stop_on_signals()
    kind = "Redis Cluster" if d.cluster else "Redis through Sentinel" if d.cfg.sentinels else "Redis"
    print(f"peercache-bench meta: ready on {d.address} ({kind}; reaping expired nodes)", flush=True)
    period = max(0.05, min(1.0, args.heartbeat_timeout / 4))
    try:
        while not stop.wait(period):
            try:
                d.reap()
            except PeerCacheError as e:
                logging.getLogger("peercache.bench.meta").warning("reaping: %s", e)
    finally:
        if endpoint is not None:
            endpoint.close()
        d.close()
    return 0


def _meta_metrics(args, server, service):
    """meta's metrics endpoint (--metrics-addr; None when off): the directory it hosts, and its RPC server."""
    if not args.metrics_addr:
        return None
    endpoint = metrics.serve_service(args.metrics_addr, server, service)
    print(f"peercache-bench meta: metrics at {endpoint.url}", flush=True)
    return endpoint


def _meta(args) -> int:
    options.validate_meta(args)
    if is_redis(args.directory):
        return _meta_redis(args)
    if args.directory:
        options.check_addr(args.directory, "--directory")
        args.discovery_addr = args.directory
    keys = curve_keys(options.auth_secret(args))
    svc = MetaService(args.heartbeat_timeout)
    try:
        srv = RpcServer(args.discovery_addr, svc.handlers(), auth=keys, limits=svc.limits,
                        deferred_ops=("members",), warn_open=True).start()
    except PeerCacheError:
        svc.stop()
        raise
    try:
        endpoint = _meta_metrics(args, srv, svc)
    except PeerCacheError:
        srv.stop()
        svc.stop()
        raise
    stop = _stop_on_signals()
    print(f"peercache-bench meta: ready on {args.discovery_addr}", flush=True)
    stop.wait()
    if endpoint is not None:
        endpoint.close()
    srv.stop()
    svc.stop()
    return 0


def main(argv=None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        if args.mode == "serve":
            return serve.run(args)
        if args.mode == "meta":
            return _meta(args)
        rc, doc = drive.run(args)
        print(drive.format_table(doc))
        if doc["error"]:
            print(f"drive: FAILED: {doc['error']}", file=sys.stderr)
        if args.out:
            meta.write_document(args.out, doc)
        return rc
    except ConfigError as e:
        print(f"peercache-bench {args.mode}: invalid options: {e}", file=sys.stderr)
        return 2
    except PeerCacheError as e:
        print(f"peercache-bench {args.mode}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
