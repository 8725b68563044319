"""The metric families of a node, and of a standalone directory, read from their own counters at scrape time.

Nothing here runs per operation: each counter is one the engine already keeps (the cache's hits, the
table's resolved keys, the pool's evictions, the data server's native counters, the rails' counters of
:meth:`~peercache.transport.base.Transport.rail_stats`); a scrape reads them and builds the families.
Every family is yielded on every scrape, with no samples where its source is absent (a node without a
pool, a transport without rails, a node not created yet), so the names a process exports never depend
on its state (:func:`exported_names`).
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Iterable, Iterator, Optional

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from .batches import BatchStats, BatchTotals

log = logging.getLogger(__name__)

PREFIX = "peercache_"
#: The data server's refusals that are not authentication (those are peercache_auth_refusals_total).
DATA_REFUSALS = ("ops_bad_region", "ops_out_of_range", "ops_zero_length", "req_bad_magic", "req_too_many_ops",
                 "req_no_ops", "req_too_large", "req_busy", "conn_over_limit")
#: The data server's authentication refusals: stats key -> reason label.
DATA_AUTH_REFUSALS = {"conn_no_token": "no_token", "conn_bad_token": "bad_token"}


def _counter(name: str, doc: str, labels: Iterable[str] = ()) -> CounterMetricFamily:
    return CounterMetricFamily(PREFIX + name, doc, labels=list(labels))


def _gauge(name: str, doc: str, labels: Iterable[str] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(PREFIX + name, doc, labels=list(labels))


def _read(what: str, fn: Callable[[], Any], default: Any) -> Any:
    """``fn()``, or ``default`` when it fails (a part closing under the scrape): one scrape never fails whole."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - a scrape reports what it can
        log.debug("metrics: %s not read (%s: %s)", what, type(e).__name__, e)
        return default


# -- families, one function per source ----------------------------------------------------------------
def rail_families(rails: list[dict]) -> Iterator[Metric]:
    """Per rail, from ``transport.rail_stats()`` (cumulative counters and the state now)."""
    nbytes = _counter("read_bytes", "Bytes read one-sided (RDMA READ) over each rail, slot tags included", ["rail"])
    reads = _counter("reads", "RDMA READ work requests completed on each rail", ["rail"])
    errors = _counter("completion_errors", "Work completions with an error status on each rail, by ibv_wc_status",
                      ["rail", "status"])
    resets = _counter("qp_resets", "Queue pairs reset on each rail (after an error, or when the rail came back)",
                      ["rail"])
    up = _gauge("rail_up", "1 while the rail is planned for reads, 0 while it is down", ["rail"])
    moves = _counter("rail_transitions", "Times each rail went down (to=down) or came back (to=up)", ["rail", "to"])
    for r in rails:
        rail = str(r.get("rail", "?"))
        nbytes.add_metric([rail], r.get("bytes_read", 0))
        reads.add_metric([rail], r.get("reads", 0))
        for status, n in sorted((r.get("completion_errors") or {}).items()):
            errors.add_metric([rail, str(status)], n)
        resets.add_metric([rail], r.get("qp_resets", 0))
        up.add_metric([rail], 1 if r.get("state") == "up" else 0)
        moves.add_metric([rail, "down"], r.get("downs", 0))
        moves.add_metric([rail, "up"], r.get("ups", 0))
    yield from (nbytes, reads, errors, resets, up, moves)


def lookup_family(tiers: list[tuple[str, int, int]]) -> Iterator[Metric]:
    """Directory lookups by tier: ``(tier, hits, misses)`` each."""
    f = _counter("directory_lookups",
                 "Keys looked up, by tier. cache (the client cache) and table (the directory's one-sided table): "
                 "hit = answered there, miss = passed on to the next tier; rpc (the embedded directory's lookup "
                 "op) and redis (the Redis backend): hit = the directory holds the key, miss = it does not",
                 ["tier", "result"])
    for tier, hits, misses in tiers:
        f.add_metric([tier, "hit"], hits)
        f.add_metric([tier, "miss"], misses)
    yield f


def batch_families(totals: Optional[BatchTotals]) -> Iterator[Metric]:
    """The GET batch calls: latency histogram, keys, hits, bytes."""
    h = HistogramMetricFamily(PREFIX + "get_batch_duration_seconds",
                              "Seconds of each get_batch_into call (one batch, however many keys), lookups and "
                              "stale retries included")
    keys = _counter("get_keys", "Keys asked in GET batches")
    hits = _counter("get_hits", "Keys of GET batches read whole (hits)")
    nbytes = _counter("get_bytes", "Payload bytes of the hits of GET batches")
    if totals is not None:
        cum, buckets = 0, []
        for le, n in zip([*(floatToGoString(b) for b in totals.buckets), "+Inf"], totals.counts):
            cum += n
            buckets.append((le, cum))
        h.add_metric([], buckets, sum_value=totals.seconds)
        keys.add_metric([], totals.keys)
        hits.add_metric([], totals.hits)
        nbytes.add_metric([], totals.bytes)
    yield from (h, keys, hits, nbytes)


def reader_families(reader) -> Iterator[Metric]:
    """What the reader refused or retried (its own counters)."""
    stale = _counter("stale_locations", "Keys whose location no longer matched the slot's tag and were looked "
                                        "up again")
    integrity = _counter("integrity_refusals", "Hits refused by the payload checksum (integrity on): mismatch, or "
                                               "missing (the producer writes none)", ["reason"])
    redirected = _counter("redirected_entries", "Reads refused because the directory's entry pointed at another "
                                                "key's slot (each a miss)")
    if reader is not None:
        stale.add_metric([], reader.stale_locations)
        integrity.add_metric(["mismatch"], reader.integrity_failures)
        integrity.add_metric(["missing"], reader.integrity_missing)
        redirected.add_metric([], reader.redirected_entries)
    yield from (stale, integrity, redirected)


def pool_families(pool, publisher) -> Iterator[Metric]:
    """The published pool: its slots, and the keys published and evicted."""
    slots = _gauge("pool_slots", "Slots of the published pool")
    used = _gauge("pool_slots_used", "Slots of the published pool holding an object")
    published = _counter("pool_publishes", "Keys the directory took from this node (publishes, republishes, retries)")
    evicted = _counter("pool_evictions", "Objects evicted from the pool (least recently used) to make room")
    refused = _counter("publish_refused", "Keys whose publish the directory refused: another node owns the entry")
    if pool is not None:
        slots.add_metric([], pool.slots)
        used.add_metric([], len(pool))
        evicted.add_metric([], pool.evictions)
    if publisher is not None and pool is not None:
        published.add_metric([], publisher.published_total)
        refused.add_metric([], publisher.refused_total)
    yield from (slots, used, published, evicted, refused)


def directory_service_families(service) -> Iterator[Metric]:
    """The directory this process hosts (serve, meta): its members and entries now."""
    members = _gauge("directory_members", "Nodes registered with the directory this process hosts")
    entries = _gauge("directory_entries", "Keys in the directory this process hosts")
    if service is not None:
        members.add_metric([], len(service.membership))
        entries.add_metric([], len(service.directory))
    yield from (members, entries)


def control_families(servers: dict[str, Any], data_stats: dict) -> Iterator[Metric]:
    """The control endpoints (``servers``: role -> RpcServer) and the refusals of peers without the secret,
    on the control plane (ZAP) and on the data server's handshake (``data_stats``)."""
    requests = _counter("control_requests", "Requests received by this process's control endpoints "
                                            "(directory: discovery and the directory; control: rdma set-up)",
                        ["server"])
    auth = _counter("auth_refusals", "Peers refused for lacking the cluster secret: control (a CURVE key not "
                                     "derived from it) and data (a connection without the token, or a wrong one)",
                    ["plane", "reason"])
    refused_control = 0
    for role, srv in servers.items():
        stats = srv.stats
        requests.add_metric([role], stats.get("requests", 0))
        refused_control += stats.get("auth_refused", 0)
    if servers:
        auth.add_metric(["control", "bad_key"], refused_control)
    for key, reason in DATA_AUTH_REFUSALS.items():
        if key in data_stats:
            auth.add_metric(["data", reason], data_stats[key])
    yield from (requests, auth)


def data_server_families(stats: dict) -> Iterator[Metric]:
    """The data server (``transport.server_stats()``; tcp's native server): connections, requests, refusals."""
    conns = _gauge("data_connections", "Data connections open now")
    accepted = _counter("data_connections_accepted", "Data connections accepted")
    served = _counter("data_requests", "Read requests the data server answered")
    refused = _counter("data_refusals", "Ops, requests and connections the data server refused, by reason "
                                        "(authentication apart: peercache_auth_refusals_total)", ["reason"])
    if stats:
        conns.add_metric([], stats.get("connections", 0))
        accepted.add_metric([], stats.get("accepted", 0))
        served.add_metric([], stats.get("served", 0))
        for reason in DATA_REFUSALS:
            if reason in stats:
                refused.add_metric([reason], stats[reason])
    yield from (conns, accepted, served, refused)


def info_family(name: Optional[str], protocol: Optional[str]) -> Iterator[Metric]:
    """Which node this process is (1 while it exists)."""
    f = _gauge("node_info", "The node of this process: its name and data transport", ["node", "protocol"])
    if name is not None:
        f.add_metric([name, str(protocol)], 1)
    yield f


# -- collectors -----------------------------------------------------------------------------------------
class NodeCollector(Collector):
    """The metrics of one node (``node_of()``: the node, or None before it exists or after it closed) and of
    its GET batches (``batches``, which the collector hands to each node it watches)."""

    def __init__(self, node_of: Callable[[], Any], batches: Optional[BatchStats] = None):
        self.node_of = node_of
        self.batches = batches if batches is not None else BatchStats()
        self._readers: list = []

    def watch(self, node) -> None:
        """Record ``node``'s GET batches from now on."""
        if node is not None and node.reader is not None:
            node.reader.batches = self.batches
            self._readers.append(node.reader)

    def unwatch(self) -> None:
        """Stop recording the batches of every node watched (the endpoint closed: nobody reads them)."""
        readers, self._readers = self._readers, []
        for reader in readers:
            if reader.batches is self.batches:
                reader.batches = None

    def collect(self) -> Iterator[Metric]:
        node = self.node_of()
        transport = getattr(node, "transport", None)
        rails = _read("rail_stats()", transport.rail_stats, []) if transport is not None else []
        data = _read("server_stats()", transport.server_stats, {}) if transport is not None else {}
        yield from info_family(getattr(node, "name", None), getattr(node, "protocol", None))
        yield from rail_families(rails)
        yield from lookup_family(_read("lookup counters", lambda: _tiers(node), []))
        yield from batch_families(self.batches.snapshot())
        yield from reader_families(getattr(node, "reader", None))
        yield from pool_families(getattr(node, "pool", None), getattr(node, "publisher", None))
        yield from directory_service_families(getattr(node, "hosted_directory", None))
        servers = {role: srv for role, srv in (("directory", getattr(node, "directory_server", None)),
                                               ("control", getattr(node, "control", None))) if srv is not None}
        yield from control_families(servers, data)
        yield from data_server_families(data)


def _tiers(node) -> list[tuple[str, int, int]]:
    """(tier, hits, misses) of each lookup tier of ``node`` (none before it exists)."""
    if node is None or node.resolver is None:
        return []
    cache, table, resolver = node.cache, node.table_reader, node.resolver
    asked, found = resolver.directory_asked, resolver.directory_found
    return [("cache", cache.hits, cache.misses), ("table", table.resolved, table.forwarded),
            (resolver.tier, found, asked - found)]


class ServiceCollector(Collector):
    """The metrics of a standalone directory (``peercache-bench meta``): its RPC server and the service."""

    def __init__(self, server=None, service=None):
        self.server, self.service = server, service

    def collect(self) -> Iterator[Metric]:
        yield from directory_service_families(self.service)
        yield from control_families({"directory": self.server} if self.server is not None else {}, {})


def registry(*collectors: Collector) -> CollectorRegistry:
    """A registry of ``collectors`` and this process's CPU, memory and file counters (process_*)."""
    reg = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=reg)
    for c in collectors:
        reg.register(c)
    return reg


_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}


def exported_names() -> set[str]:
    """Every sample name a metrics endpoint of this code can export, from the collectors themselves (a
    node's and a standalone directory's, with no source: every family, no samples)."""
    names = set()
    for fam in registry(NodeCollector(lambda: None), ServiceCollector()).collect():
        for suffix in _SUFFIXES.get(fam.type, ("",)):
            names.add(fam.name + suffix)
        names.update(s.name for s in fam.samples)
    return names
