"""``peercache-bench serve``: host discovery, publish the working set, wait for readers.

serve registers its geometry (page size, layout, working set, key scheme: :mod:`peercache.node.geometry`)
with its node, so drive and the library read it from the directory instead of being told.

With ``--directory redis://...`` serve hosts no discovery: it registers and
publishes in Redis, and drivers' ``reader_done`` reaches it through Redis.

With ``--join`` serve hosts nothing either: it registers with, and publishes into, the embedded
directory another process hosts at ``--discovery-addr`` (``peercache-bench meta``), beside other
serves (each its own ``--key-prefix``). Drivers' ``reader_done`` then reaches the directory's host,
not serve, so serve takes ``--readers 0`` and serves until SIGTERM/SIGINT or ``--max-wait``; on
either signal it leaves the directory before it exits.
"""
from __future__ import annotations

import dataclasses
import signal
import sys
import threading
import time

from .. import fdlimit, metrics, tags, trace
from ..address import split
from ..node import Geometry, Node
from ..transport.tcp import fds_needed
from . import meta, options
from .document import ServeDocument, ServeMeta

PUBLISH_BATCH = 512
READY_LINE = "peercache-bench serve: ready"
#: The control op a registered reader sends to read serve's metrics text (drive --metrics-scrapes, at its
#: window edges): what serve's endpoint answers, over the authenticated control plane, so nobody needs to
#: reach serve's endpoint on its host's loopback.
METRICS_TEXT_OP = "metrics_text"


def fill_page(view, ref) -> None:
    """Bench content: derived from (key, generation) so drive can verify it."""
    tags.fill_pattern(view, ref.key_hash, ref.generation)


def metrics_reply(endpoint) -> dict:
    """The answer to METRICS_TEXT_OP: the endpoint's text now and when it was read, or why there is none."""
    if endpoint is None:
        return {"text": None, "why": "serve runs without --metrics-addr; give it --metrics-addr 127.0.0.1:0"}
    t = time.time()
    return {"text": endpoint.text(), "time": t, "url": endpoint.url}


def run(args) -> int:
    """Serve until --readers drivers said they are done (or --max-wait passed)."""
    options.validate(args, "serve")
    before, soft, _ = fdlimit.raise_to_hard()
    low = fdlimit.shortfall(fds_needed())
    if low:
        print(f"serve: {low}" + (f" (raised from {before})" if soft != before else ""), file=sys.stderr,
              flush=True)
    prefix = options.key_prefixes(args)[0] if options.key_prefixes(args) else ""
    keys = options.page_keys(args.working_set, args.layout, prefix)
    bind = args.bind or split(args.discovery_addr)[0]     # --join checked it: given, or the directory's loopback
    joined = bool(getattr(args, "join", False))
    start = meta.now_iso()
    done = threading.Event()
    readers_done: list[dict] = []
    lock = threading.Lock()

    def reader_done(msg: dict) -> dict:
        # Only a registered node, with its token, gets here (add_handler is owner-only), each counts once,
        # and with --readers 0 nothing stops serve but a signal.
        with lock:
            if args.readers == 0:
                return {"readers_done": 0, "ignored": "serve runs with --readers 0 until interrupted"}
            if all(r["node_id"] != msg["node_id"] for r in readers_done):
                readers_done.append({"node_id": msg["node_id"], "summary": msg.get("summary")})
            if len(readers_done) >= args.readers:
                done.set()
            return {"readers_done": len(readers_done)}

    # the node of the flags, hosting discovery (unless it joins another's), with a pool of one slot per object
    cfg = dataclasses.replace(options.node_config(args), bind=bind, host_discovery=not joined,
                              pool_bytes=len(keys) * options.slot_bytes(args.page_size))
    # what it serves, registered with it: drive and the library read it instead of being told (node.geometry)
    geometry = Geometry(args.page_size, args.layout, args.working_set, options.key_scheme(args.layout, prefix),
                        prefix or None)
    node = Node(**cfg.node_kwargs(name="serve"), geometry=geometry)
    endpoint = None
    try:
        if cfg.metrics_addr:
            endpoint = metrics.serve_node(cfg.metrics_addr, node)
            print(f"serve: metrics at {endpoint.url}", flush=True)
        if joined:
            # the directory's host answers the control ops: drivers' reader_done and metrics requests go there
            print(f"serve: joined the directory at {node.directory_addr} as node {node.node_id}; data on "
                  f"{bind}", flush=True)
        else:
            node.add_handler("reader_done", reader_done)
            node.add_handler(METRICS_TEXT_OP, lambda msg: metrics_reply(endpoint))
        t0 = time.monotonic()
        for i in range(0, len(keys), PUBLISH_BATCH):
            node.put_batch(keys[i:i + PUBLISH_BATCH], fill=fill_page)
        pub_s = time.monotonic() - t0
        total = len(keys) * args.page_size
        if args.trace:
            trace.start()
        # before the ready line: a signal sent as soon as it shows ends serve in order
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: done.set())
        print(f"{READY_LINE} on {node.discovery.address} protocol={args.protocol} layout={args.layout} "
              f"objects={len(keys)} page_size={args.page_size} B integrity={'on' if args.integrity else 'off'} "
              + (f"key_prefix={prefix} " if prefix else "") +
              f"({total / 2**20:.1f} MiB, "
              f"published in {pub_s:.2f} s)", flush=True)
        if args.readers == 0:
            print("serve: --readers 0, serving until interrupted", flush=True)
        deadline = time.monotonic() + args.max_wait
        while not done.wait(1.0):
            if time.monotonic() > deadline:
                print(f"serve: --max-wait {args.max_wait:.0f} s passed with {len(readers_done)} of "
                      f"{args.readers} readers done; exiting", file=sys.stderr, flush=True)
                break
        summary = ServeDocument(
            meta=ServeMeta(**meta.host_block(), command=meta.command_line(), start=start,
                           end=meta.now_iso(), protocol=args.protocol, layout=args.layout,
                           page_size=args.page_size, objects=len(keys), integrity=args.integrity,
                           devices=options.devices(args), versions=meta.versions(),
                           rails=(node.transport.rail_info()
                                  if hasattr(node.transport, "rail_info") else None),
                           metrics=endpoint.url if endpoint is not None else None,
                           git_revision=meta.git_revision(), key_prefix=prefix or None,
                           joined=node.directory_addr if joined else None),
            readers_done=readers_done,
            refused_ops=getattr(node.transport, "refused", None),
            data_server=node.transport.server_stats() or None)
        if args.out:
            meta.write_document(args.out, summary.to_dict())
        served = summary.data_server.get("served") if summary.data_server else None
        print(f"serve: {len(readers_done)} of {args.readers} readers done"
              + (f", {served} data requests served" if served is not None else "") + "; exiting", flush=True)
        return 0 if len(readers_done) >= args.readers else 1
    finally:
        if endpoint is not None:
            endpoint.close()
        node.close()
        if args.trace:
            trace.write(args.trace, side="server")
