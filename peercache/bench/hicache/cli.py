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
(:mod:`peercache.bench.hicache.suite`): get, set and exists sweeps with PEAK rows, as SGLang's
cache controller calls the store.
"""
from __future__ import annotations

import argparse
import logging
import sys

from ...errors import ConfigError, PeerCacheError
from .. import meta, options
from ..drive import format_table as drive_table
from . import drive, suite


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``python -m peercache.bench.hicache_drive`` (subcommands drive and suite)."""
    p = argparse.ArgumentParser(prog="python -m peercache.bench.hicache_drive", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="mode", required=True)
    options.drive_parser(sub.add_parser("drive", help="GET serve's working set through batch_get_v1"))
    suite.add_flags(sub.add_parser(
        "suite", help="get/set/exists sweeps as SGLang's HiCache controller calls the store, with PEAK rows",
        description=suite.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter))
    return p


def main(argv=None) -> int:
    """Run the subcommand; the exit status (0 ok, 1 failed run, 2 invalid options)."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    in_suite = args.mode == "suite"
    try:
        rc, doc = suite.run(args) if in_suite else drive.run(args)
    except ConfigError as e:
        print(f"hicache_drive: invalid options: {e}", file=sys.stderr)
        return 2
    except PeerCacheError as e:
        print(f"hicache_drive: {e}", file=sys.stderr)
        return 1
    print(suite.format_table(doc) if in_suite else drive_table(doc))
    if doc["error"]:
        print(f"hicache_drive: FAILED: {doc['error']}", file=sys.stderr)
    if args.out:
        meta.write_document(args.out, doc)
    return rc
