"""The latency trace of this process (``native/trace.h``): timestamps at fixed points of the read
path (the directory cache, the table read, ``read_slots``, each tcp request's send and reply) and
of the tcp data server (its wake-up, a request read, its reply sent), off unless started.

Both sides stamp CLOCK_MONOTONIC, which every process of one kernel shares (network namespaces
included), and a tcp request's id is on the wire, so a consumer's trace and its producer's join
into one timeline per GET: :func:`peercache.lab.tools.gettrace.breakdown` does that, and
``python -m peercache.lab.ratios --only latency_breakdown`` prints the table. ``time.monotonic_ns()``
reads the same clock, so Python's own stamps line up with these.
"""
from __future__ import annotations

import json

import numpy as np

from . import _native, atomic

#: one record: ns on CLOCK_MONOTONIC, the tcp request id (0: none), the point, the thread's kernel id
TRACE_DTYPE = np.dtype([("ns", "<u8"), ("req", "<u8"), ("point", "<u4"), ("tid", "<u4")])
#: the points' names, by number (native/trace.h's order)
POINTS: tuple[str, ...] = tuple(_native.TRACE_POINTS)
#: records kept by default: about 40 000 GETs of a tcp read (24 MiB)
DEFAULT_CAPACITY = 1 << 20

assert TRACE_DTYPE.itemsize == _native.TRACE_RECORD_BYTES


def start(capacity: int = DEFAULT_CAPACITY) -> None:
    """Record from now on (the records of an earlier run are dropped); a full trace drops new records."""
    _native.trace_start(capacity)


def stop() -> tuple[np.ndarray, int]:
    """Stop recording: (the records as a TRACE_DTYPE array, how many found no room)."""
    raw, dropped = _native.trace_stop()
    return np.frombuffer(raw, dtype=TRACE_DTYPE).copy(), int(dropped)


def document(records: np.ndarray, dropped: int, **extra) -> dict:
    """A trace as a JSON-ready document: the point names and one list per field."""
    return {"points": list(POINTS), "dropped": dropped, **extra,
            **{f: records[f].tolist() for f in TRACE_DTYPE.names}}


def records_of(doc: dict) -> np.ndarray:
    """The records of a :func:`document` (its point numbers mapped onto this build's names)."""
    ours = {name: i for i, name in enumerate(POINTS)}
    unknown = sorted(set(doc["points"]) - set(ours))
    if unknown:
        raise ValueError(f"the trace names points this build does not have: {unknown}; trace both sides "
                         "with one revision")
    recs = np.zeros(len(doc["ns"]), dtype=TRACE_DTYPE)
    for f in TRACE_DTYPE.names:
        recs[f] = doc[f]
    recs["point"] = np.asarray([ours[doc["points"][p]] for p in doc["point"]], dtype=np.uint32)
    return recs


def write(path: str, **extra) -> int:
    """Stop, and write the records to ``path`` as a :func:`document`; the number written."""
    recs, dropped = stop()
    atomic.write_text(path, json.dumps(document(recs, dropped, **extra)))
    return len(recs)
