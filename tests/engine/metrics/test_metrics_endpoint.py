"""peercache.metrics on real nodes in this process: /metrics over HTTP, counters that match what was done,
the address checks, the warning beyond loopback, and the port freed on close."""
import logging
import socket
import struct
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import zmq
from prometheus_client.parser import text_string_to_metric_families

from conftest import free_port
from oracles.tcp_client import HEAD, REQ_MAGIC, hello
from peercache import metrics
from peercache.auth import curve_keys
from peercache.config import NodeConfig
from peercache.errors import ConfigError
from peercache.node import Get, Node
from peercache.rpc import pack

PAGE = 4096
SECRET = b"metrics-test-secret-0123456789abcdef"


def scrape(url: str) -> dict:
    """{(sample name, sorted labels): value} of one GET of ``url``."""
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


@pytest.fixture
def producer(port):
    addr = f"127.0.0.1:{port}"
    node = Node(addr, host_discovery=True, pool_slots=64, slot_capacity=PAGE, name="producer")
    keys = [f"page/{i}".encode() for i in range(64)]
    node.put_batch(keys, [bytes([i]) * PAGE for i in range(64)])
    yield addr, node, keys
    node.close()


def test_each_batch_is_one_observation_and_the_counters_match_what_was_read(producer):
    addr, prod, keys = producer
    cons = Node(addr, name="consumer", dir_cache_ttl=60.0)
    ep = metrics.serve_node("127.0.0.1:0", cons)
    try:
        dest = np.zeros(8 * PAGE, np.uint8)
        offsets = np.arange(8, dtype=np.uint64) * PAGE
        batches = 0
        for rnd in range(2):                       # the second round is served by the cache
            for b in range(4):
                r = cons.get_batch_into(keys[b * 8:(b + 1) * 8], dest, offsets)
                assert (r.status == Get.HIT).all()
                batches += 1
        r = cons.get_batch_into([b"no such page"], dest, [0])
        assert r.status[0] == Get.MISS
        batches += 1
        s = scrape(ep.url)
        assert s[("peercache_get_batch_duration_seconds_count", ())] == batches
        assert s[("peercache_get_batch_duration_seconds_bucket", (("le", "+Inf"),))] == batches
        assert 0 < s[("peercache_get_batch_duration_seconds_sum", ())] < 60
        assert s[("peercache_get_keys_total", ())] == 65 and s[("peercache_get_hits_total", ())] == 64
        assert s[("peercache_get_bytes_total", ())] == 64 * PAGE
        look = lambda tier, res: s[("peercache_directory_lookups_total", (("result", res), ("tier", tier)))]
        assert look("cache", "hit") == 32 and look("cache", "miss") == 33
        # the producer hosts the directory's table: it answers every key the cache did not (found or absent)
        assert look("table", "hit") == 33 and look("table", "miss") == 0
        assert look("rpc", "hit") + look("rpc", "miss") == 0
        assert s[("peercache_node_info", (("node", "consumer"), ("protocol", "tcp")))] == 1
        assert ("peercache_pool_slots", ()) not in s             # a reader has no pool
        assert cons.reader.batches is ep.collector.batches
        ep.close()
        assert cons.reader.batches is None                     # closed: the reader records nothing more
    finally:
        ep.close()
        cons.close()


def test_without_the_table_the_lookup_rpc_counts_found_and_absent_keys(port):
    addr = f"127.0.0.1:{port}"
    prod = Node(addr, host_discovery=True, pool_slots=8, slot_capacity=PAGE, dir_table_entries=0)
    cons = Node(addr)
    ep = metrics.serve_node("127.0.0.1:0", cons)
    try:
        prod.put_batch([b"a", b"b"], [b"x" * 10, b"y" * 10])
        cons.get_batch_into([b"a", b"b", b"c"], np.zeros(3 * PAGE, np.uint8), np.arange(3, dtype=np.uint64) * PAGE)
        s = scrape(ep.url)
        look = lambda res: s[("peercache_directory_lookups_total", (("result", res), ("tier", "rpc")))]
        assert (look("hit"), look("miss")) == (2, 1)
    finally:
        ep.close()
        cons.close()
        prod.close()


def test_the_producer_exports_its_pool_directory_and_data_server(port):
    addr = f"127.0.0.1:{port}"
    prod = Node(addr, host_discovery=True, pool_slots=4, slot_capacity=PAGE)
    ep = metrics.serve_node("127.0.0.1:0", prod)
    cons = Node(addr)
    try:
        prod.put_batch([f"k{i}".encode() for i in range(6)], [b"z" * 100] * 6)   # 6 keys into 4 slots
        cons.get_batch_into([b"k5"], np.zeros(PAGE, np.uint8), [0])
        s = scrape(ep.url)
        assert s[("peercache_pool_slots", ())] == 4 and s[("peercache_pool_slots_used", ())] == 4
        assert s[("peercache_pool_evictions_total", ())] == 2 and s[("peercache_pool_publishes_total", ())] == 4
        assert s[("peercache_directory_members", ())] == 2 and s[("peercache_directory_entries", ())] == 4
        assert s[("peercache_data_connections_accepted_total", ())] >= 1
        assert s[("peercache_data_requests_total", ())] >= 1
        assert s[("peercache_control_requests_total", (("server", "directory"),))] >= 3
    finally:
        cons.close()
        ep.close()
        prod.close()


def test_refusals_of_peers_without_the_secret_are_counted_on_both_planes(port):
    addr = f"127.0.0.1:{port}"
    prod = Node(addr, host_discovery=True, pool_slots=4, slot_capacity=PAGE, auth_key=SECRET)
    ep = metrics.serve_node("127.0.0.1:0", prod)
    try:
        # control plane: the server's public key, but a client key not derived from the secret (ZAP says no)
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.curve_serverkey = curve_keys(SECRET).server_public
        sock.curve_publickey, sock.curve_secretkey = zmq.curve_keypair()
        # a DEALER's send blocks while no connection can queue it, as here between ZeroMQ's refused
        # handshakes: bounded, and nothing queued is fine (the refusal is what is counted)
        sock.setsockopt(zmq.SNDTIMEO, 2000)
        sock.connect(f"tcp://{addr}")
        try:
            sock.send_multipart([b"", b"1", pack({"op": "members"})])
        except zmq.Again:
            pass
        assert not sock.poll(500)
        sock.close(0)
        # data plane: a request without the hello that carries the token, and a hello with a wrong token
        data = prod.info["data"]
        request = HEAD.pack(REQ_MAGIC, 0, 1, 1) + struct.pack("<IIQQQ", 1, 0, 0, 0, 64)
        for first in (request, hello(bytes(32))):
            with socket.create_connection((data["host"], data["port"]), timeout=5) as raw:
                raw.sendall(first)
                raw.recv(4096)
        deadline = time.monotonic() + 15      # counted by the node's threads: generous for a loaded machine
        while True:
            s = scrape(ep.url)
            refused = {k[1][1][1]: v for k, v in s.items() if k[0] == "peercache_auth_refusals_total"}
            if (refused["bad_key"] and refused["no_token"] and refused["bad_token"]) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert refused["bad_key"] >= 1 and refused["no_token"] == 1 and refused["bad_token"] == 1
    finally:
        ep.close()
        prod.close()


def test_close_frees_the_port_and_a_taken_port_is_named():
    addr = f"127.0.0.1:{free_port()}"
    ep = metrics.serve_node(addr, None)
    assert ep.url == f"http://{addr}/metrics"
    assert b"peercache_node_info" in urllib.request.urlopen(ep.url, timeout=5).read()
    with pytest.raises(ConfigError, match=rf"--metrics-addr {addr}: cannot listen there \(.*in use\); give a "
                                          "free port"):
        metrics.serve_node(addr, None)
    ep.close()
    ep.close()                                      # idempotent
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(ep.url, timeout=2)
    metrics.serve_node(addr, None).close()          # the port is free again


def test_an_address_of_no_host_here_is_named_with_its_option():
    with pytest.raises(ConfigError, match=r"extra config 'metrics_addr' no-such-host\.invalid:9464: cannot listen"):
        metrics.serve_node("no-such-host.invalid:9464", None, label="extra config 'metrics_addr'")


@pytest.mark.parametrize("value", ["9464", "127.0.0.1", "127.0.0.1:65536", "http://127.0.0.1:9464", ":9464",
                                   "127.0.0.1:-1", "a b:1", 9464])
def test_a_bad_address_is_refused_naming_the_flag_and_the_fix(value):
    with pytest.raises(ConfigError, match=r"--metrics-addr .* is not HOST:PORT for the metrics endpoint; give "
                                          r"e\.g\. 127\.0\.0\.1:9464"):
        NodeConfig.check("metrics_addr", value)


def test_beyond_loopback_warns_who_can_read_the_metrics(caplog):
    with caplog.at_level(logging.WARNING, logger="peercache.metrics"):
        ep = metrics.serve_node("0.0.0.0:0", None)
        ep.close()
        lo = metrics.serve_node("127.0.0.1:0", None)
        lo.close()
    warned = [r.getMessage() for r in caplog.records if r.name.startswith("peercache.metrics")]
    assert len(warned) == 1, warned
    assert warned[0].startswith("--metrics-addr 0.0.0.0:0: the metrics endpoint is not on loopback: any host that "
                                "can reach any address of this machine")
    assert "without authentication" in warned[0] and "127.0.0.1:PORT" in warned[0]


def test_driver_processes_get_one_port_each():
    assert [metrics.for_process("127.0.0.1:9464", i, 3) for i in range(3)] == \
        ["127.0.0.1:9464", "127.0.0.1:9465", "127.0.0.1:9466"]
    assert metrics.for_process("127.0.0.1:0", 2, 3) == "127.0.0.1:0"
    with pytest.raises(ConfigError, match="needs ports 65535..65536"):
        metrics.for_process("127.0.0.1:65535", 0, 2)
