"""How the native tcp client moves a batch (batch_wire): the constants are native/tcp.c's, and the
requests it counts are the requests the data server serves."""
import re
import time
from pathlib import Path

import numpy as np
import pytest

from peercache.tags import HEADER_BYTES, TRAILER_BYTES
from peercache.transport.base import SLOT_DEST, SLOT_TAGS, Status, slot_ops
from peercache.transport.tcp import (REQUEST_BYTES, REQUEST_OPS, REQUESTS_IN_FLIGHT, NativeTcpTransport,
                                     TcpTransport, batch_wire)

TCP_C = Path(__file__).resolve().parents[3] / "native" / "tcp.c"


def _define(name: str) -> int:
    m = re.search(rf"^#define {name} (.+?)\s*(/\*.*)?$", TCP_C.read_text(), re.M)
    assert m, f"native/tcp.c defines no {name}"
    return int(eval(m.group(1).replace("u", "")))     # "(1u << 20)", "256", "8"


def test_the_constants_are_those_of_the_native_client():
    assert (REQUEST_BYTES, REQUEST_OPS, REQUESTS_IN_FLIGHT) == (_define("REQ_BYTES"), _define("REQ_OPS"),
                                                                _define("WINDOW"))


def test_a_batch_of_the_lab_points_is_cut_into_1_MiB_requests_and_the_send_buffer_bounds_its_depth():
    # 32 pages of 128 KiB: 7 pages (and a header) fit a 1 MiB request, so 5 requests, all in flight;
    # the data server's 256 KiB send buffer is what the connection carries at once.
    assert batch_wire(131072, 32, send_buffer=262144) == {
        "request_bytes": 1 << 20, "requests": 5, "requests_in_flight": 5,
        "outstanding_bytes": 32 * (131072 + HEADER_BYTES + TRAILER_BYTES), "send_buffer": 262144,
        "in_flight_bytes": 262144}
    # 1 MiB pages: a payload fills a request alone (the tags go in small requests between them);
    # 8 in flight at most; with the kernel's autotuning the connection carries all of it
    w = batch_wire(1 << 20, 8, send_buffer=0)
    assert (w["request_bytes"], w["requests"], w["requests_in_flight"]) == (1 << 20, 17, 8)
    assert w["in_flight_bytes"] == w["outstanding_bytes"] == 4 * (1 << 20) + 4 * (HEADER_BYTES + TRAILER_BYTES)
    # a batch below the cap is one request of its own size; an object above it is a request alone
    assert batch_wire(16384, 16, send_buffer=262144)["request_bytes"] == 16 * (16384 + HEADER_BYTES + TRAILER_BYTES)
    assert batch_wire(4 << 20, 2, send_buffer=262144)["request_bytes"] == 4 << 20
    # tiny objects: REQUEST_OPS ops (85 slots) make the request, not the byte cap
    assert batch_wire(4096, 128, send_buffer=262144)["request_bytes"] == 85 * (4096 + 72) + HEADER_BYTES
    with pytest.raises(ValueError):
        batch_wire(0, 1)


def test_the_env_send_buffer_is_the_data_servers(monkeypatch):
    monkeypatch.setenv("PEERCACHE_TCP_SEND_BUFFER", "0")
    assert batch_wire(131072, 32)["send_buffer"] == 0
    monkeypatch.delenv("PEERCACHE_TCP_SEND_BUFFER")
    assert batch_wire(131072, 32)["send_buffer"] == TcpTransport(max_channels=1).server_limits["send_buffer"]


@pytest.mark.parametrize("capacity, keys", [(131072, 32), (1 << 20, 4), (4096, 300)])
def test_the_native_client_sends_the_requests_batch_wire_counts(capacity, keys):
    slot = HEADER_BYTES + capacity + TRAILER_BYTES
    region = np.zeros(keys * slot, np.uint8)
    prod = TcpTransport()
    prod.expose(5, region, rkey=9)
    info = prod.start("127.0.0.1")
    cons = NativeTcpTransport(max_channels=1)
    try:
        i = np.arange(keys, dtype=np.uint64)
        ops, _ = slot_ops(np.full(keys, 5), np.full(keys, 9), i * slot, np.full(keys, capacity),
                          np.full(keys, capacity), i * (HEADER_BYTES + TRAILER_BYTES), i * capacity)
        local = [None, None]
        local[SLOT_TAGS] = np.zeros(keys * (HEADER_BYTES + TRAILER_BYTES), np.uint8)
        local[SLOT_DEST] = np.zeros(keys * capacity, np.uint8)
        before = prod.server_stats()["served"]
        status = cons.read_batch("p", info, ops, local)
        assert (np.asarray(status) == Status.OK).all()
        # the server counts a request once its reply's last byte left (the client may have it first)
        want, deadline = batch_wire(capacity, keys)["requests"], time.monotonic() + 2
        while prod.server_stats()["served"] - before < want and time.monotonic() < deadline:
            time.sleep(0.01)
        assert prod.server_stats()["served"] - before == want
    finally:
        cons.close()
        prod.close()
