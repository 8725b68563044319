"""One 4 KiB GET at a time, traced: the client side of the ``get_trace`` point kind.

It attaches a consumer :class:`~peercache.node.Node` to a ``peercache-bench serve --trace FILE``
over tcp, with the directory's locations cached (``--dir-cache-ttl 3600``) or not (``0``: every
GET reads the directory's table first), reads each published key once (connections made,
locations cached), then runs ``--gets`` single-key ``Node.get_batch_into`` calls twice:

1. untraced, for the GET's p50 as the bench's latency points see it;
2. traced (``peercache.trace``): ``time.monotonic_ns()`` just before and after each call, and the
   native points inside it.

It tells serve it is done (one of serve's ``--readers``; serve then writes its trace) and prints
one JSON line: the untraced p50, each call's two stamps and this process's trace document.
:func:`breakdown` joins it with serve's by the tcp request ids (below)::

    python -m peercache.lab.tools.gettrace --discovery-addr 198.18.78.1:PORT --page-size 4096 \\
        --working-set 1024 --gets 2000 --dir-cache-ttl 3600
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter

import numpy as np

from peercache import trace
from peercache.bench import options
from peercache.node import Get, Node

#: GETs a pass at most (a trace of about 20 records a GET stays within trace.DEFAULT_CAPACITY)
MAX_GETS = 40_000


def measure(addr: str, page: int, working_set: int, gets: int, dir_cache_ttl: float,
            poll_us: int | None = None) -> dict:
    """The untraced p50 of ``gets`` single-key GETs, then as many traced (see the module's docstring)."""
    if not 1 <= gets <= MAX_GETS:
        raise ValueError(f"--gets {gets}: give 1 to {MAX_GETS}")
    keys = options.page_keys(working_set, "mla")
    rng = np.random.default_rng(3)
    order = [[keys[i]] for i in rng.integers(0, working_set, gets)]
    dest = np.zeros(page, dtype=np.uint8)
    offsets = np.zeros(1, dtype=np.uint64)
    caps = np.full(1, page, dtype=np.uint64)
    kw = {} if poll_us is None else {"tcp_poll_us": poll_us}
    node = Node(addr, protocol="tcp", dir_cache_ttl=dir_cache_ttl, name="lab-gettrace", **kw)
    try:
        for k in keys:   # connections made, the mapping warm (and, cached, every location)
            node.get_batch_into([k], dest, offsets, caps)
        lat, misses = [], 0
        for ks in order:
            t0 = time.perf_counter_ns()
            r = node.get_batch_into(ks, dest, offsets, caps)
            lat.append(time.perf_counter_ns() - t0)
            misses += int(r.status[0] != Get.HIT)
        calls = np.zeros((gets, 2), dtype=np.uint64)
        trace.start()
        try:
            for i, ks in enumerate(order):
                calls[i, 0] = time.monotonic_ns()
                r = node.get_batch_into(ks, dest, offsets, caps)
                calls[i, 1] = time.monotonic_ns()
                misses += int(r.status[0] != Get.HIT)
        finally:
            recs, dropped = trace.stop()
        # Count this process as one of serve's readers: serve exits, and writes its trace.
        node.call("reader_done", summary={"status": "ok", "points": 1})
    finally:
        node.close()
    return {"tool": "peercache-gettrace", "page_size": page, "working_set": working_set, "gets": gets,
            "dir_cache_ttl": dir_cache_ttl, "misses": misses, "p50_us": statistics.median(lat) / 1e3,
            "calls": {"start": calls[:, 0].tolist(), "end": calls[:, 1].tolist()},
            "trace": trace.document(recs, dropped, side="client")}


# -- the join: where a GET's microseconds go ------------------------------------------------------
#
# Both sides stamp CLOCK_MONOTONIC of one kernel, so the server's points of a request (joined by its
# tcp request id) fall between the client's send and its reply. Each GET becomes a sequence of points
# in time order, ``call`` first and ``return`` last: its critical path, on which a segment is the time
# between two neighbours. Two points are off that path (WITHIN): each side's send call returns while
# the other side already works on what it sent, so they are shown within the segment they fall in.
# Points of the directory's table read (between ``table_enter`` and ``table_exit``) are named
# ``table <point>``. GETs whose path came in the most common order are the ones the table is made of
# (``joined``; the rest are counted in ``other_orders``), and each segment's p50 is over them. The
# p50s of the parts do not add up to the p50 of the whole exactly: each is a median of its own.

#: what a segment between two points is, by the points' names (a table read's: prefixed, see below)
LABELS: dict[tuple[str, str], str] = {
    ("call", "dir_enter"): "the Python call, to the directory cache",
    ("call", "table_enter"): "the Python call, to the table read (nothing cached)",
    ("dir_enter", "dir_exit"): "directory cache lookup",
    ("dir_exit", "read_enter"): "Python: the located rows to read_slots",
    ("dir_exit", "table_enter"): "Python: a cache miss to the table read",
    ("table_enter", "send_begin"): "GIL release, key hash, the table's plan",
    ("reply_done", "table_exit"): "bucket checks, GIL taken back",
    ("table_exit", "read_enter"): "Python: the table's row cached, to read_slots",
    ("read_enter", "read_nogil"): "read_slots: arguments, buffers, GIL release",
    ("read_nogil", "send_begin"): "ops planned, a channel taken",
    ("send_begin", "srv_wake"): "the request's send, the server's wake-up",
    ("srv_wake", "srv_head"): "server: wake-up to the request's first bytes",
    ("srv_head", "srv_body"): "server: the request read and checked",
    ("srv_body", "reply_head"): "the reply's send, the client's wake-up",
    ("reply_head", "reply_done"): "the payload's receive",
    ("reply_done", "read_checked"): "tag check and verify",
    ("read_checked", "read_gil"): "the GIL taken back",
    ("read_gil", "read_exit"): "read_slots: result, buffers released",
    ("read_exit", "return"): "the return: statuses, BatchResult",
}
#: Points off the critical path, each within the segment that starts at its anchor: the client's send
#: call returns while the server already works on the request, and the server's sendmsg while the
#: client already receives the reply (both deliver into the other side's socket synchronously).
WITHIN: dict[str, tuple[str, str]] = {
    "send_end": ("send_begin", "of which the client's send call"),
    "srv_sent": ("srv_body", "of which the server's sendmsg"),
}
TABLE = "table "


def _base(p: str) -> str:
    """A point's name without the table read's prefix."""
    return p.removeprefix(TABLE)


def label(a: str, b: str) -> str:
    """What the segment from point ``a`` to ``b`` is."""
    text = LABELS.get((_base(a), _base(b)), f"{_base(a)} to {_base(b)}")
    return f"table read: {text}" if a.startswith(TABLE) or b.startswith(TABLE) else text


def timelines(client: dict, server: dict) -> list[list[tuple[str, int]]]:
    """One list of (point, ns) per GET, in time order, from gettrace's document and serve's trace."""
    names = trace.POINTS
    crec = trace.records_of(client["trace"])
    crec = crec[np.argsort(crec["ns"], kind="stable")]
    srec = trace.records_of(server)
    by_req: dict[int, list[tuple[str, int]]] = {}
    for r in srec[srec["req"] != 0]:
        by_req.setdefault(int(r["req"]), []).append((names[r["point"]], int(r["ns"])))
    start, end = np.asarray(client["calls"]["start"], np.uint64), np.asarray(client["calls"]["end"], np.uint64)
    lo, hi = np.searchsorted(crec["ns"], start, "left"), np.searchsorted(crec["ns"], end, "right")
    out = []
    for i in range(len(start)):
        pts = [("call", int(start[i]))]
        for r in crec[lo[i]:hi[i]]:
            pts.append((names[r["point"]], int(r["ns"])))
            if names[r["point"]] == "send_begin":
                # only the server's points within this call: a request id can recur (another
                # connection's, or a call of the warm-up pass), and its points belong to that one
                pts += [(n, ns) for n, ns in by_req.get(int(r["req"]), []) if start[i] <= ns <= end[i]]
        pts.append(("return", int(end[i])))
        pts.sort(key=lambda x: x[1])
        named, in_table = [], False
        for p, ns in pts:
            if p == "table_enter":
                in_table = True
            elif p == "table_exit":
                in_table = False
            elif in_table:
                p = TABLE + p
            named.append((p, ns))
        out.append(named)
    return out


def breakdown(client: dict, server: dict) -> dict:
    """The breakdown document: each segment's p50 (µs) and share of the critical path, over the GETs whose
    path came in the most common order, and the p50 of what runs within a segment (:data:`WITHIN`)."""
    lines = timelines(client, server)
    paths = [[(p, ns) for p, ns in tl if _base(p) not in WITHIN] for tl in lines]
    orders = Counter(tuple(p for p, _ in path) for path in paths)
    if not orders:
        raise ValueError("the trace holds no GET; was the client's pass empty?")
    order, joined = orders.most_common(1)[0]
    use = [(path, dict(tl)) for path, tl in zip(paths, lines) if tuple(p for p, _ in path) == order]
    segs = []
    for j in range(len(order) - 1):
        vals = [(path[j + 1][1] - path[j][1]) / 1e3 for path, _ in use]
        segs.append({"segment": f"{order[j]} -> {order[j + 1]}", "label": label(order[j], order[j + 1]),
                     "p50_us": statistics.median(vals)})
        # what runs within this segment, off the path
        for inner, (anchor, text) in WITHIN.items():
            if _base(order[j]) != anchor:
                continue
            name = order[j].replace(anchor, inner)
            vals = [(tl[name] - tl[order[j]]) / 1e3 for _, tl in use if name in tl]
            if vals:
                segs.append({"segment": f"{order[j]} -> {name}", "label": label(order[j], name).replace(
                    f"{anchor} to {inner}", text), "p50_us": statistics.median(vals), "within": True})
    total = sum(s["p50_us"] for s in segs if not s.get("within")) or 1.0
    for s in segs:
        s["share"] = None if s.get("within") else s["p50_us"] / total
    return {"gets": len(lines), "joined": joined, "other_orders": len(lines) - joined,
            "total_p50_us": statistics.median((tl[-1][1] - tl[0][1]) / 1e3 for tl in lines),
            "untraced_p50_us": client.get("p50_us"), "client_dropped": client["trace"]["dropped"],
            "server_dropped": server["dropped"], "segments": segs}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m peercache.lab.tools.gettrace", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--discovery-addr", required=True, help="serve's host:port")
    p.add_argument("--page-size", type=int, required=True, help="bytes per page (as serve published)")
    p.add_argument("--working-set", type=int, required=True, help="pages serve published")
    p.add_argument("--gets", type=int, default=2000, help=f"GETs per pass, 1..{MAX_GETS} [%(default)s]")
    p.add_argument("--dir-cache-ttl", type=float, default=3600.0,
                   help="seconds a location stays cached; 0: every GET reads the directory's table [%(default)s]")
    p.add_argument("--tcp-poll-us", type=int, default=None, help="the node's reply poll [the node's default]")
    a = p.parse_args(argv)
    try:
        print(json.dumps(measure(a.discovery_addr, a.page_size, a.working_set, a.gets, a.dir_cache_ttl,
                                 a.tcp_poll_us)), flush=True)
    except (ValueError, RuntimeError, OSError) as e:
        print(f"gettrace: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
