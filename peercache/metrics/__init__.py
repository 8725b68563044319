"""Prometheus metrics of one process, opt-in: ``--metrics-addr HOST:PORT`` on ``peercache-bench serve``,
``drive`` and ``meta``, ``metrics_addr`` in HiCache's extra config.

- :mod:`.collector`: the metric families, read at scrape time from the counters the engine keeps;
- :mod:`.batches`: the one thing recorded per call, each GET batch's latency, keys, hits and bytes;
- :mod:`.endpoint`: ``/metrics`` on the given address (prometheus-client's exposition behind the bounded
  server of :mod:`.server`: one thread, capped connections, header size and time limits), loopback by default.

The names, their labels and the dashboard over them: docs/metrics.md and docs/grafana/peercache.json.
"""
from __future__ import annotations

from typing import Any, Callable, Union

from .batches import LATENCY_BUCKETS, BatchStats, BatchTotals
from .collector import NodeCollector, ServiceCollector, exported_names
from .endpoint import EXAMPLE, Endpoint, for_process, open_warning

__all__ = ["BatchStats", "BatchTotals", "EXAMPLE", "Endpoint", "LATENCY_BUCKETS", "NodeCollector", "NodeEndpoint",
           "ServiceCollector", "exported_names", "for_process", "open_warning", "serve_node", "serve_service"]


class NodeEndpoint(Endpoint):
    """The endpoint of a node's metrics; :meth:`watch` a node created after it (HiCache's, made at first use)."""

    collector: NodeCollector

    def watch(self, node) -> None:
        """Record ``node``'s GET batches from now on."""
        self.collector.watch(node)

    def close(self) -> None:
        """Stop serving, free the port, and stop recording the watched nodes' batches (idempotent)."""
        super().close()
        self.collector.unwatch()


def serve_node(addr: str, node: Union[Any, Callable[[], Any]], *, label: str = "--metrics-addr",
               warn: bool = True) -> NodeEndpoint:
    """Serve the metrics of ``node`` (a Node, or a callable that gives the node or None) on ``addr``; its GET
    batches are recorded from now on. ConfigError naming ``label`` when ``addr`` cannot be listened on."""
    node_of = node if callable(node) else (lambda: node)
    collector = NodeCollector(node_of)
    ep = NodeEndpoint(addr, [collector], label=label, warn=warn)
    ep.collector = collector
    collector.watch(node_of())
    return ep


def serve_service(addr: str, server, service, *, label: str = "--metrics-addr") -> Endpoint:
    """Serve the metrics of a standalone directory (``meta``: its RPC server and service; None with Redis)."""
    return Endpoint(addr, [ServiceCollector(server, service)], label=label)
