"""The join of gettrace's client trace with serve's (peercache.lab.tools.gettrace.timelines)."""
from __future__ import annotations

import numpy as np
import pytest

from peercache.transport.base import native_module

pytestmark = pytest.mark.skipif(native_module()[0] is None, reason="native module not built")


def _doc(points: list[tuple[str, int, int]], **extra) -> dict:
    from peercache import trace
    recs = np.zeros(len(points), dtype=trace.TRACE_DTYPE)
    for i, (name, ns, req) in enumerate(points):
        recs[i] = (ns, req, trace.POINTS.index(name), 1)
    return trace.document(recs, 0, **extra)


def test_a_request_id_seen_again_joins_only_the_server_points_within_its_own_call():
    from peercache.lab.tools import gettrace
    client = {"trace": _doc([("send_begin", 1_100, 7), ("reply_done", 1_900, 7)]),
              "calls": {"start": [1_000], "end": [2_000]}}
    # request 7 also served long before this call (another connection's, or a warm-up call's)
    server = _doc([("srv_wake", 200, 7), ("srv_head", 250, 7), ("srv_wake", 1_300, 7), ("srv_head", 1_400, 7)])
    [line] = gettrace.timelines(client, server)
    assert line == [("call", 1_000), ("send_begin", 1_100), ("srv_wake", 1_300), ("srv_head", 1_400),
                    ("reply_done", 1_900), ("return", 2_000)]
