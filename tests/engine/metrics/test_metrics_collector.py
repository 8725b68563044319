"""peercache.metrics.collector: the families a scrape builds from a node's own counters (fakes here; a real
node in test_metrics_endpoint.py, real processes in tests/engine/bench/test_metrics_e2e.py)."""
import collections
from types import SimpleNamespace

import numpy as np
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from peercache.metrics import BatchStats, NodeCollector, ServiceCollector, exported_names
from peercache.metrics.collector import registry
from peercache.node import Get

#: What the rdma transport's rail_stats() gives (its interface: one dict per rail, cumulative).
RAILS = [
    {"rail": "rxe0", "state": "up", "bytes_read": 1 << 30, "reads": 8192,
     "completion_errors": {}, "qp_resets": 0, "downs": 0, "ups": 0},
    {"rail": "rxe1", "state": "down", "bytes_read": 123456, "reads": 42,
     "completion_errors": {"IBV_WC_RETRY_EXC_ERR": 3, "IBV_WC_WR_FLUSH_ERR": 17}, "qp_resets": 2,
     "downs": 1, "ups": 0},
]


class FakeTransport:
    def __init__(self, rails=(), server=None, fail=False):
        self.rails, self.server, self.fail = list(rails), server or {}, fail

    def rail_stats(self):
        if self.fail:
            raise RuntimeError("device closed under the scrape")
        return self.rails

    def server_stats(self):
        return self.server


class Sized(SimpleNamespace):
    def __len__(self):
        return self.n


def fake_node(transport, **over):
    node = SimpleNamespace(
        name="drive-0", protocol="rdma", transport=transport,
        cache=SimpleNamespace(hits=7, misses=93), table_reader=SimpleNamespace(resolved=90, forwarded=3),
        resolver=SimpleNamespace(tier="rpc", directory_asked=3, directory_found=2),
        reader=SimpleNamespace(stale_locations=5, integrity_failures=1, integrity_missing=0,
                               redirected_entries=0, batches=None),
        pool=Sized(n=10, slots=64, evictions=4), publisher=SimpleNamespace(published_total=14, refused_total=1),
        hosted_directory=SimpleNamespace(membership=Sized(n=3), directory=Sized(n=10)),
        directory_server=SimpleNamespace(stats=collections.Counter(requests=50, auth_refused=2)), control=None)
    for k, v in over.items():
        setattr(node, k, v)
    return node


def scrape(*collectors) -> dict:
    """{(sample name, sorted labels): value} of one scrape, through the text format and its parser."""
    text = generate_latest(registry(*collectors)).decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_per_rail_counters_and_state_from_rail_stats():
    s = scrape(NodeCollector(lambda: fake_node(FakeTransport(RAILS))))
    assert s[("peercache_read_bytes_total", (("rail", "rxe0"),))] == 1 << 30
    assert s[("peercache_reads_total", (("rail", "rxe1"),))] == 42
    assert s[("peercache_completion_errors_total", (("rail", "rxe1"), ("status", "IBV_WC_RETRY_EXC_ERR")))] == 3
    assert s[("peercache_completion_errors_total", (("rail", "rxe1"), ("status", "IBV_WC_WR_FLUSH_ERR")))] == 17
    assert not [k for k in s if k[0] == "peercache_completion_errors_total" and ("rail", "rxe0") in k[1]]
    assert s[("peercache_qp_resets_total", (("rail", "rxe1"),))] == 2
    assert s[("peercache_rail_up", (("rail", "rxe0"),))] == 1 and s[("peercache_rail_up", (("rail", "rxe1"),))] == 0
    assert s[("peercache_rail_transitions_total", (("rail", "rxe1"), ("to", "down")))] == 1
    assert s[("peercache_rail_transitions_total", (("rail", "rxe1"), ("to", "up")))] == 0


def test_a_rail_that_comes_back_shows_in_the_next_scrape():
    rails = [dict(r) for r in RAILS]
    collector = NodeCollector(lambda: fake_node(FakeTransport(rails)))
    assert scrape(collector)[("peercache_rail_up", (("rail", "rxe1"),))] == 0
    rails[1].update(state="up", ups=1, qp_resets=3)
    s = scrape(collector)
    assert s[("peercache_rail_up", (("rail", "rxe1"),))] == 1
    assert s[("peercache_rail_transitions_total", (("rail", "rxe1"), ("to", "up")))] == 1
    assert s[("peercache_qp_resets_total", (("rail", "rxe1"),))] == 3


def test_lookups_by_tier_pool_directory_control_and_data_server():
    data = {"connections": 2, "accepted": 9, "served": 1000, "req_busy": 4, "conn_no_token": 1, "conn_bad_token": 6}
    s = scrape(NodeCollector(lambda: fake_node(FakeTransport(server=data), protocol="tcp")))
    look = lambda tier, res: s[("peercache_directory_lookups_total", (("result", res), ("tier", tier)))]
    assert (look("cache", "hit"), look("cache", "miss")) == (7, 93)
    assert (look("table", "hit"), look("table", "miss")) == (90, 3)
    assert (look("rpc", "hit"), look("rpc", "miss")) == (2, 1)
    assert ("peercache_directory_lookups_total", (("result", "hit"), ("tier", "redis"))) not in s
    assert s[("peercache_pool_slots", ())] == 64 and s[("peercache_pool_slots_used", ())] == 10
    assert s[("peercache_pool_publishes_total", ())] == 14 and s[("peercache_pool_evictions_total", ())] == 4
    assert s[("peercache_publish_refused_total", ())] == 1
    assert s[("peercache_directory_members", ())] == 3 and s[("peercache_directory_entries", ())] == 10
    assert s[("peercache_control_requests_total", (("server", "directory"),))] == 50
    assert s[("peercache_auth_refusals_total", (("plane", "control"), ("reason", "bad_key")))] == 2
    assert s[("peercache_auth_refusals_total", (("plane", "data"), ("reason", "no_token")))] == 1
    assert s[("peercache_auth_refusals_total", (("plane", "data"), ("reason", "bad_token")))] == 6
    assert s[("peercache_data_connections", ())] == 2 and s[("peercache_data_connections_accepted_total", ())] == 9
    assert s[("peercache_data_requests_total", ())] == 1000
    assert s[("peercache_data_refusals_total", (("reason", "req_busy"),))] == 4
    assert s[("peercache_stale_locations_total", ())] == 5
    assert s[("peercache_integrity_refusals_total", (("reason", "mismatch"),))] == 1
    assert s[("peercache_node_info", (("node", "drive-0"), ("protocol", "tcp")))] == 1


def test_the_batch_histogram_is_cumulative_and_counts_batches():
    batches = BatchStats()
    for seconds in (2e-5, 2e-5, 3e-4, 4.0):
        batches.record(seconds, np.zeros(4, np.int8), np.full(4, 1024, np.uint64))
    batches.record(1e-3, np.array([int(Get.MISS)], np.int8), np.zeros(1, np.uint64))
    s = scrape(NodeCollector(lambda: None, batches))
    bucket = lambda le: s[("peercache_get_batch_duration_seconds_bucket", (("le", le),))]
    assert bucket("2.5e-05") == 2 and bucket("0.0005") == 3 and bucket("0.001") == 4 and bucket("+Inf") == 5
    assert s[("peercache_get_batch_duration_seconds_count", ())] == 5
    assert abs(s[("peercache_get_batch_duration_seconds_sum", ())] - (4e-5 + 3e-4 + 4.0 + 1e-3)) < 1e-9
    assert s[("peercache_get_keys_total", ())] == 17 and s[("peercache_get_hits_total", ())] == 16
    assert s[("peercache_get_bytes_total", ())] == 16 * 1024


def test_a_source_failing_under_the_scrape_leaves_the_rest_of_it():
    s = scrape(NodeCollector(lambda: fake_node(FakeTransport(RAILS, fail=True))))
    assert not [k for k in s if k[0] == "peercache_read_bytes_total"]
    assert s[("peercache_pool_slots", ())] == 64


def test_watch_hands_the_batch_stats_to_the_node_reader():
    node = fake_node(FakeTransport())
    c = NodeCollector(lambda: node)
    c.watch(node)
    assert node.reader.batches is c.batches


def test_no_node_yet_exports_every_family_without_samples():
    text = generate_latest(registry(NodeCollector(lambda: None))).decode()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    assert {"peercache_read_bytes", "peercache_rail_up", "peercache_directory_lookups", "peercache_pool_slots",
            "peercache_get_batch_duration_seconds"} <= set(fams)
    assert not fams["peercache_read_bytes"].samples and not fams["peercache_pool_slots"].samples


def test_a_standalone_directory_exports_its_members_entries_and_refusals():
    svc = SimpleNamespace(membership=Sized(n=2), directory=Sized(n=5))
    srv = SimpleNamespace(stats=collections.Counter(requests=9, auth_refused=1))
    s = scrape(ServiceCollector(srv, svc))
    assert s[("peercache_directory_members", ())] == 2 and s[("peercache_directory_entries", ())] == 5
    assert s[("peercache_auth_refusals_total", (("plane", "control"), ("reason", "bad_key")))] == 1


def test_exported_names_are_the_collectors_sample_names():
    names = exported_names()
    for n in ("peercache_read_bytes_total", "peercache_rail_up", "peercache_rail_transitions_total",
              "peercache_get_batch_duration_seconds_bucket", "peercache_get_batch_duration_seconds_count",
              "peercache_directory_lookups_total", "peercache_pool_slots_used", "peercache_auth_refusals_total",
              "peercache_data_connections", "process_cpu_seconds_total"):
        assert n in names
    assert "peercache_read_bytes" not in names and "peercache_rail_up_total" not in names


def test_docs_metrics_md_names_every_family_the_code_exports():
    from pathlib import Path
    import re
    text = (Path(__file__).resolve().parents[3] / "docs" / "metrics.md").read_text()
    documented = set(re.findall(r"`(peercache_[a-z_]+)`", text))
    # a histogram is documented by its family name, its samples (_bucket, _count, _sum) with it
    families = {re.sub(r"_(bucket|count|sum)$", "", n) for n in exported_names() if n.startswith("peercache_")}
    assert families - documented == set(), f"not in docs/metrics.md: {sorted(families - documented)}"
    assert documented - families == set(), f"docs/metrics.md names what no collector exports: {sorted(documented - families)}"
