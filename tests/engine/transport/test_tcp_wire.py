"""How the native tcp client moves a batch (batch_wire): the constants are the native module's,
exported from native/pc.h, and the requests it counts are the requests the data server serves."""
import re
import time
import types
from pathlib import Path

import numpy as np
import pytest

import peercache.transport.base as base
from peercache.errors import TransportUnavailable
from peercache.tags import HEADER_BYTES, TRAILER_BYTES
from peercache.transport.base import SLOT_DEST, SLOT_TAGS, Status, native_module, slot_ops
from peercache.transport.tcp import TcpTransport, batch_wire, request_window

PC_H = Path(__file__).resolve().parents[3] / "native" / "pc.h"


def _define(name: str) -> int:
    m = re.search(rf"^#define {name} (.+?)\s*(/\*.*)?$", PC_H.read_text(), re.M)
    assert m, f"native/pc.h defines no {name}"
    return int(eval(m.group(1).replace("u", "")))     # "(1u << 20)", "256", "8"


def test_the_native_module_exports_the_clients_request_window():
    mod, why = native_module()
    assert mod is not None, why
    exported = (mod.REQ_BYTES, mod.REQ_OPS, mod.WINDOW)
    assert exported == (_define("PC_TCP_REQ_BYTES"), _define("PC_TCP_REQ_OPS"), _define("PC_TCP_WINDOW"))
    assert exported == (1 << 20, 256, 8)            # what the wire was measured with (pc.h says how)
    assert request_window() == exported


def test_without_the_native_module_the_request_window_says_how_to_build_it(monkeypatch):
    def missing(name):
        raise ImportError(f"No module named {name!r}")

    monkeypatch.setattr(base, "_native_cache", [])
    monkeypatch.setattr(base, "importlib", types.SimpleNamespace(import_module=missing))
    with pytest.raises(TransportUnavailable, match=r"peercache\._native is unavailable .*run `make setup`"):
        batch_wire(131072, 32)


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
    # tiny objects: REQ_OPS ops (85 slots) make the request, not the byte cap
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
    cons = TcpTransport(max_channels=1)
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
