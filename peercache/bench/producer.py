"""What drive learns of the producer it reads: serve's geometry (page size, layout, working set, key
scheme), from the directory where serve registered it (:mod:`peercache.node.geometry`).

drive's --page-size, --layout and --working-set default to the producer's; one given that differs is
one ConfigError naming both values (:func:`peercache.node.geometry.settle`). A producer that publishes
no geometry (an older serve) leaves drive with its flags and their defaults, as before.
"""
from __future__ import annotations

import time
from typing import Callable, Mapping, Optional

from ..auth import curve_keys
from ..directory.client import connect_directory
from ..directory.redis.url import is_redis, parse_url
from ..errors import ConfigError, DeadlineExceeded, PeerCacheError
from ..node.geometry import Geometry, Surface, mismatch, producer_text, published, settle
from . import options

#: How drive names the geometry's settings in its messages: its flags.
SURFACE = Surface("drive", options.geometry_flags(), " ", "drop {}")
#: Seconds between two reads of the members while drive waits for a producer to register.
POLL_S = 0.2


def choose(nodes: Mapping, prefixes: tuple) -> tuple[Optional[Geometry], str]:
    """The geometry drive reads by, and 'the producer at ...' for messages: that of the producers of its
    --key-prefix's (none given: of the producer without a prefix); (None, '') when none publishes one.
    ConfigError when those producers serve different geometries (drive reads one)."""
    want = set(prefixes) or {None}
    mine = {n: g for n, g in published(nodes).items() if g.key_prefix in want}
    if not mine:
        return None, ""
    first, g0 = next(iter(mine.items()))
    for n, g in mine.items():
        if (g.page_size, g.layout, g.working_set) != (g0.page_size, g0.layout, g0.working_set):
            raise ConfigError(f"the producers drive reads serve different geometries: {producer_text(nodes[first])} "
                              f"serves {g0.describe()}, {producer_text(nodes[n])} {g.describe()}; drive reads one "
                              "page size, layout and working set: start every serve with the same ones")
    return g0, producer_text(nodes[first])


def older_producer(nodes: Mapping) -> bool:
    """Whether a member publishes pages (registered regions) but no geometry: an older serve."""
    served = published(nodes)
    return any(isinstance(info, Mapping) and info.get("regions") and n not in served for n, info in nodes.items())


def apply(args, nodes: Mapping) -> Optional[Geometry]:
    """Set drive's geometry flags (``args``, in place) from the producer's among ``nodes`` (a ``members``
    reply): each not given takes the producer's, else its default; one given that differs is a ConfigError
    naming both values. Returns the producer's geometry (None: none published)."""
    served, who = choose(nodes, options.key_prefixes(args))
    for attr, value in settle(options.geometry_given(args), served, SURFACE, who, options.geometry_defaults()).items():
        setattr(args, attr, value)
    return served


def learn(args, say: Callable[[str], None], timeout: float) -> Optional[Geometry]:
    """Read the producer's geometry from drive's directory (each read bounded by ``timeout`` s) and
    :func:`apply` it. While a flag is left to the producer and the directory answers but no producer has
    registered there, wait for one (every POLL_S, up to --ready-timeout). A directory that does not answer
    leaves the flags and their defaults, as before: the driver processes then report it."""
    need = any(v is None for v in options.geometry_given(args).values())
    spec = options.directory(args)
    where = parse_url(spec).safe if is_redis(spec) else spec
    deadline = time.monotonic() + args.ready_timeout
    nodes = None
    try:
        directory = connect_directory(spec, timeout=timeout, auth=curve_keys(options.auth_secret(args)))
    except ConfigError:
        raise
    except PeerCacheError:
        return None
    try:
        while True:
            try:
                nodes = directory.members().nodes or {}
            except PeerCacheError:
                return None
            if not need or choose(nodes, options.key_prefixes(args))[0] is not None or older_producer(nodes) \
                    or time.monotonic() >= deadline:
                break
            time.sleep(POLL_S)
    finally:
        directory.close()
    prefixes = options.key_prefixes(args)
    served, who = choose(nodes, prefixes)
    if need and served is None and not older_producer(nodes):
        of = f" of --key-prefix {','.join(prefixes)}" if prefixes else ""
        raise PeerCacheError(f"no producer{of} registered at {where} within {args.ready_timeout:.0f} s, so drive "
                             "has no --page-size/--layout/--working-set to read; start `peercache-bench serve` "
                             f"there{' with that --key-prefix' if prefixes else ''}, or give all three flags")
    apply(args, nodes)
    reading = f"reading with --layout {args.layout} --page-size {args.page_size} --working-set {args.working_set}"
    if served is not None and need:
        say(f"drive: {who} serves {served.describe()}; {reading}")
    elif served is None and need:
        say(f"drive: the producer at {where} publishes no geometry (an older serve); {reading}")
    return served


def page_size_mismatch(page_size: int, size: int, key: bytes) -> str:
    """drive's --page-size against the size of an object it read (a producer that published no geometry)."""
    return mismatch(SURFACE, "page_size", page_size, Geometry(size), f"the producer of {key!r}")


def await_published(exists_batch: Callable[[list], list], keys: list, timeout: float) -> tuple[list, str]:
    """Ask ``exists_batch(keys)`` every :data:`POLL_S` until every key is published or ``timeout`` s have
    passed; (the last answer, why it is not all there: '' or the last call's timeout).

    A call that timed out is asked again, not the end of the wait: a reader's first calls set up its
    connections to the directory (over rdma, its table's queue pairs), and on a loaded or emulated host
    those can take longer than one call's bound. Every other error is raised."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            present, why = list(exists_batch(keys)), ""
        except DeadlineExceeded as e:
            present, why = [False] * len(keys), f"the last lookup timed out: {e}"
        if all(present) or time.monotonic() > deadline:
            return present, why
        time.sleep(POLL_S)
