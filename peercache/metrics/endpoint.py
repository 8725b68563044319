"""A process's metrics endpoint: ``GET /metrics`` (Prometheus text) on the address ``--metrics-addr`` names.

prometheus-client's own exposition (``make_wsgi_app``: the text or OpenMetrics format the scraper asks for,
gzip) on a registry of this process's collectors alone, never the library's global one,
served by :class:`~.server.BoundedWSGIServer`: one thread, at most :data:`MAX_CONNECTIONS` connections, each
closed :data:`TIMEOUT` seconds after it opened and past :data:`MAX_HEADER_BYTES` of request headers.
prometheus-client's own server took a thread and a descriptor per connection and kept whatever headers a
client sent, so idle or slowloris clients could take a process's descriptors (the data server's) and memory.
Bounded, the endpoint holds at most :data:`FDS` descriptors, inside the 256 that ``transport.tcp.fds_needed``
keeps beside the data server's connections, and a few hundred KiB.

Loopback is the default; an address others can reach works but logs who can then read the metrics
(:func:`open_warning`): the endpoint has no authentication.
"""
from __future__ import annotations

import logging
import threading
from typing import Iterable

from prometheus_client import generate_latest, make_wsgi_app
from prometheus_client.registry import Collector

from ..address import Address, is_loopback, join
from ..auth import who_can_reach
from ..errors import ConfigError
from .collector import registry
from .server import OVERHEAD_FDS, BoundedWSGIServer

log = logging.getLogger(__name__)

#: The address examples give (9464: the port OpenTelemetry's Prometheus exporter uses by default).
EXAMPLE = "127.0.0.1:9464"
#: connections open at once: a scraper or two, a person with curl; past it the oldest still sending its
#: request is closed
MAX_CONNECTIONS = 16
#: seconds a connection may take to send its request and take the answer (a scrape takes milliseconds)
TIMEOUT = 5.0
#: bytes of request line and headers (a scraper's are a few hundred)
MAX_HEADER_BYTES = 8192
#: the most descriptors the endpoint holds
FDS = MAX_CONNECTIONS + OVERHEAD_FDS


def open_warning(addr: str, label: str = "--metrics-addr") -> str:
    """What listening on ``addr`` (not loopback) exposes, to whom, and how to keep it on this machine."""
    host = Address.parse(addr).host
    return (f"{label} {addr}: the metrics endpoint is not on loopback: {who_can_reach(host)} can read this "
            "process's metrics, without authentication (node names, key and byte counts, rails and their "
            f"states, directory sizes). Give {label} 127.0.0.1:PORT and scrape through a tunnel "
            "(ssh -L PORT:127.0.0.1:PORT HOST), or keep the port behind a firewall")


def for_process(addr: str, index: int, count: int, label: str = "--metrics-addr",
                what: str = "driver processes") -> str:
    """The address of process ``index`` of ``count`` (drive's driver processes, a HiCache model's ranks) given
    one address for all: HOST:PORT+index (port 0: any free port, each)."""
    a = Address.parse(addr)
    host, port = a.host, a.port
    if port == 0:
        return addr
    if port + count - 1 > 65535:
        raise ConfigError(f"{label} {addr} with {count} {what} needs ports {port}..{port + count - 1} "
                          "(one each), beyond 65535; give a lower port, or port 0 for any free ones")
    return join(host, port + index)


class Endpoint:
    """``/metrics`` of ``collectors`` served on ``addr`` until :meth:`close` (``label``: how errors and the
    warning name the address: a flag or an extra-config key)."""

    def __init__(self, addr: str, collectors: Iterable[Collector], *, label: str = "--metrics-addr",
                 warn: bool = True, max_connections: int = MAX_CONNECTIONS, timeout: float = TIMEOUT,
                 max_header_bytes: int = MAX_HEADER_BYTES):
        a = Address.parse(addr)
        host, port = a.host, a.port
        self.registry = registry(*collectors)
        try:
            self._server = BoundedWSGIServer(host, port, make_wsgi_app(self.registry),
                                             max_connections=max_connections, timeout=timeout,
                                             max_header_bytes=max_header_bytes)
        except OSError as e:
            raise ConfigError(f"{label} {addr}: cannot listen there ({e.strerror or e}); give a free port of an "
                              f"address of this machine (e.g. {EXAMPLE}, or port 0 for any free port)") from e
        bound = self._server.server_address
        self.address = join(bound[0], bound[1])
        if warn and not is_loopback(host):
            log.warning(open_warning(addr, label))
        self._closed = threading.Event()

    @property
    def url(self) -> str:
        """Where a scraper reads the metrics."""
        return f"http://{self.address}/metrics"

    def text(self) -> str:
        """What ``GET /metrics`` answers now (Prometheus text format 0.0.4, the same bytes as a scrape)."""
        return generate_latest(self.registry).decode()

    def close(self) -> None:
        """Stop serving and free the port (idempotent)."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._server.close()

    def __enter__(self) -> "Endpoint":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
