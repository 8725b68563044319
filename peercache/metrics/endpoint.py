"""A process's metrics endpoint: ``GET /metrics`` (Prometheus text) on the address ``--metrics-addr`` names.

prometheus-client's own HTTP server (a thread per scrape, daemon threads) on a registry of this process's
collectors alone, never the library's global one. Loopback is the default; an address others can reach
works but logs who can then read the metrics (:func:`open_warning`): the endpoint has no authentication.
"""
from __future__ import annotations

import logging
import threading
from typing import Iterable

from prometheus_client import generate_latest, start_http_server
from prometheus_client.registry import Collector

from ..auth import is_loopback, who_can_reach
from ..errors import ConfigError
from .collector import registry

log = logging.getLogger(__name__)

#: The address examples give (9464: the port OpenTelemetry's Prometheus exporter uses by default).
EXAMPLE = "127.0.0.1:9464"


def split(addr: str) -> tuple[str, int]:
    """(host, port) of HOST:PORT (brackets of an IPv6 host dropped); the address was checked before."""
    host, _, port = addr.rpartition(":")
    return host.strip("[]"), int(port)


def open_warning(addr: str, label: str = "--metrics-addr") -> str:
    """What listening on ``addr`` (not loopback) exposes, to whom, and how to keep it on this machine."""
    host, _ = split(addr)
    return (f"{label} {addr}: the metrics endpoint is not on loopback: {who_can_reach(host)} can read this "
            "process's metrics, without authentication (node names, key and byte counts, rails and their "
            f"states, directory sizes). Give {label} 127.0.0.1:PORT and scrape through a tunnel "
            "(ssh -L PORT:127.0.0.1:PORT HOST), or keep the port behind a firewall")


def for_process(addr: str, index: int, count: int, label: str = "--metrics-addr") -> str:
    """The address of driver process ``index`` of ``count``: HOST:PORT+index (port 0: any free port, each)."""
    host, port = addr.rpartition(":")[0], split(addr)[1]
    if port == 0:
        return addr
    if port + count - 1 > 65535:
        raise ConfigError(f"{label} {addr} with {count} driver processes needs ports {port}..{port + count - 1} "
                          "(one per process), beyond 65535; give a lower port, or port 0 for any free ones")
    return f"{host}:{port + index}"


class Endpoint:
    """``/metrics`` of ``collectors`` served on ``addr`` until :meth:`close` (``label``: how errors and the
    warning name the address: a flag or an extra-config key)."""

    def __init__(self, addr: str, collectors: Iterable[Collector], *, label: str = "--metrics-addr",
                 warn: bool = True):
        host, port = split(addr)
        self.registry = registry(*collectors)
        try:
            self._server, self._thread = start_http_server(port, host, self.registry)
        except OSError as e:
            raise ConfigError(f"{label} {addr}: cannot listen there ({e.strerror or e}); give a free port of an "
                              f"address of this machine (e.g. {EXAMPLE}, or port 0 for any free port)") from e
        bound = self._server.server_address
        self.address = f"[{bound[0]}]:{bound[1]}" if ":" in bound[0] else f"{bound[0]}:{bound[1]}"
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
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> "Endpoint":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
