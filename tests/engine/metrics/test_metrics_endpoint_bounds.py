"""The metrics endpoint's bounds, in this process on loopback: one thread for any number of connections, at
most MAX_CONNECTIONS open (a scrape still gets through), headers cut at MAX_HEADER_BYTES, connections closed
when their time is up; and prometheus-client's exposition behind it (formats, gzip, paths, methods)."""
import gzip
import socket
import threading
import time
import urllib.request

import pytest

from conftest import scaled
from peercache import metrics
from peercache.metrics import endpoint


def connect(ep) -> socket.socket:
    host, port = ep.address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=scaled(5))


def closed_by_server(s: socket.socket, wait: float) -> bool:
    """Whether the server closed ``s`` (EOF or reset) within ``wait`` seconds; whatever it answered is read."""
    s.settimeout(wait)
    try:
        while s.recv(65536):
            pass
        return True
    except ConnectionError:
        return True
    except (socket.timeout, BlockingIOError):
        return False


def answer(s: socket.socket) -> bytes:
    """Everything the server sends on ``s`` until it closes it."""
    s.settimeout(scaled(5))
    parts = []
    while True:
        try:
            b = s.recv(65536)
        except ConnectionResetError:
            break
        if not b:
            break
        parts.append(b)
    return b"".join(parts)


def started_since(before: set) -> list:
    """The threads alive now that were not in ``before``: other tests' leftover threads that end meanwhile
    do not count (a count of all threads did, and failed in CI: 2 == 2 + 1)."""
    return [t for t in threading.enumerate() if t not in before]


def test_one_thread_holds_at_most_the_cap_and_a_scrape_still_gets_through():
    before = set(threading.enumerate())
    ep = metrics.serve_node("127.0.0.1:0", None)
    try:
        assert len(started_since(before)) == 1
        idle = [connect(ep) for _ in range(50)]
        try:
            # the server closes all but MAX_CONNECTIONS of them, at once (the oldest first)
            deadline = time.monotonic() + scaled(3)
            while True:
                gone = sum(closed_by_server(s, 0.01) for s in idle)
                if gone >= 50 - endpoint.MAX_CONNECTIONS or time.monotonic() > deadline:
                    break
            assert gone == 50 - endpoint.MAX_CONNECTIONS
            assert len(started_since(before)) == 1                   # no thread per connection
            # the cap is held by silent connections: a scrape takes the oldest one's place
            assert b"peercache_node_info" in urllib.request.urlopen(ep.url, timeout=scaled(5)).read()
            assert sum(closed_by_server(s, 0.01) for s in idle) == 50 - endpoint.MAX_CONNECTIONS + 1
        finally:
            for s in idle:
                s.close()
    finally:
        ep.close()
    assert started_since(before) == []


def test_a_request_not_sent_in_time_is_closed_unanswered():
    ep = metrics.Endpoint("127.0.0.1:0", [], timeout=0.5)
    try:
        silent, slow = connect(ep), connect(ep)
        slow.sendall(b"GET /metrics HTTP/1.1\r\n")
        t0 = time.monotonic()
        for _ in range(40):                       # a header byte every 50 ms: never done, never idle
            try:
                slow.send(b"X")
            except OSError:
                break
            time.sleep(0.05)
        assert answer(slow) == b""
        assert answer(silent) == b""
        assert 0.4 < time.monotonic() - t0 < scaled(1.5)
        # one that sends its request at once is answered as before
        assert b"peercache" not in urllib.request.urlopen(ep.url, timeout=scaled(5)).read()   # no collectors
    finally:
        ep.close()


def test_headers_past_the_limit_are_refused_with_431():
    ep = metrics.serve_node("127.0.0.1:0", None)
    try:
        s = connect(ep)
        head = b"GET /metrics HTTP/1.1\r\nX-Pad: "
        s.sendall(head + b"a" * (endpoint.MAX_HEADER_BYTES - len(head)))     # the limit, and no end in sight
        got = answer(s)
        assert got.startswith(b"HTTP/1.0 431 Request Header Fields Too Large\r\n")
        assert got.endswith(b"request headers beyond 8192 bytes\n")
        # far past it: cut off there, never buffered (the server stops reading and closes)
        s = connect(ep)
        s.sendall(b"GET /metrics HTTP/1.1\r\n")
        sent = 0
        try:
            for _ in range(256):
                sent += s.send(b"X-Pad: " + b"a" * 4000 + b"\r\n")
        except OSError:
            pass
        assert closed_by_server(s, scaled(2))
        # a request within the limit, its headers sent in pieces, is answered
        s = connect(ep)
        for piece in (b"GET /metrics HT", b"TP/1.1\r\nHost: x\r", b"\nX-Pad: " + b"a" * 6000 + b"\r\n", b"\r\n"):
            s.sendall(piece)
            time.sleep(0.02)
        got = answer(s)
        assert got.startswith(b"HTTP/1.0 200 OK\r\n") and b"peercache_node_info" in got
    finally:
        ep.close()


def get(url: str, headers: dict | None = None, method: str = "GET"):
    req = urllib.request.Request(url, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=scaled(5)) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def test_the_answers_are_prometheus_clients_exposition():
    ep = metrics.serve_node("127.0.0.1:0", None)
    try:
        status, headers, body = get(ep.url)
        assert status == 200 and headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        families = lambda text: [line for line in text.splitlines() if line.startswith(b"# TYPE")]
        assert families(body) == families(ep.text().encode()) and b"peercache_node_info" in body
        assert families(get(ep.url.replace("/metrics", "/"))[2]) == families(body)   # any path, as before
        status, headers, body = get(ep.url, {"Accept": "application/openmetrics-text; version=1.0.0"})
        assert headers["Content-Type"].startswith("application/openmetrics-text") and body.endswith(b"# EOF\n")
        status, headers, body = get(ep.url, {"Accept-Encoding": "gzip"})
        assert headers["Content-Encoding"] == "gzip" and b"peercache_node_info" in gzip.decompress(body)
        status, headers, _ = get(ep.url, method="POST")
        assert status == 405 and headers["Allow"] == "OPTIONS,GET"
        s = connect(ep)
        s.sendall(b"hello\r\n\r\n")
        assert answer(s).startswith(b"HTTP/1.0 400 Bad Request\r\n")
    finally:
        ep.close()


def test_the_endpoint_fits_in_the_descriptors_the_data_server_leaves(monkeypatch):
    from peercache.transport import tcp
    for name in ("PEERCACHE_TCP_MAX_CONNECTIONS", "PEERCACHE_TCP_MAX_GREETING"):
        monkeypatch.delenv(name, raising=False)
    beside_data = tcp.fds_needed() - tcp.DEFAULT_MAX_CONNECTIONS - tcp.DEFAULT_MAX_GREETING
    # the margin serve's open-file check keeps for the control port, files and the rest: the endpoint takes
    # a small, fixed part of it
    assert endpoint.FDS == endpoint.MAX_CONNECTIONS + 5 <= beside_data // 8


@pytest.mark.parametrize("kw", [{"max_connections": 0}, {"timeout": 0}, {"max_header_bytes": 10}])
def test_bounds_out_of_range_are_refused(kw):
    with pytest.raises(ValueError, match="bound the server; give values in range"):
        metrics.Endpoint("127.0.0.1:0", [], **kw)
