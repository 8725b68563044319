"""Testbeds that list their hosts (a cluster): the schema, the normalised producer/consumer pair, the errors
(each naming its field), the capture plan, the preflight over every host, and testbed_hosts on the built-in
local-cluster testbed (eight namespaces on one bridge; skipped without root)."""
from __future__ import annotations

import copy
import subprocess

import pytest
import yaml
from cluster_testbeds import local_cluster_copy

from peercache.lab.launch import netns
from peercache.lab.pipeline import experiments, preflight, runpoint
from peercache.lab.pipeline.plan import Plan

LOCAL_CLUSTER = experiments.EXPERIMENTS_DIR / "testbeds" / "local-cluster.yaml"

BASE = {"name": "clu", "capabilities": {"rdma": False, "gpu": False}, "form": "local", "duration": 1,
        "warmup": 0, "repetitions": 1, "results": "data/raw/clu", "scenarios": ["single_nic"]}
LISTED = [{"name": "a", "host": "local", "address": "127.0.0.1", "roles": ["consumer", "directory"]},
          {"name": "b", "host": "local", "address": "127.0.0.2", "roles": ["producer"]},
          {"name": "c", "host": "local", "address": "127.0.0.3", "roles": ["producer", "consumer"]}]


def _write(tmp_path, hosts, **more):
    p = tmp_path / "clu.yaml"
    p.write_text(yaml.safe_dump({**BASE, "hosts": hosts, **more}))
    return p


def _error(tmp_path, hosts, **more) -> str:
    with pytest.raises(experiments.DefinitionError) as e:
        experiments.load_testbed(_write(tmp_path, hosts, **more))
    return str(e.value)


def test_a_host_list_loads_and_its_pair_is_the_first_producer_and_another_consumer(tmp_path):
    tb = experiments.load_testbed(_write(tmp_path, copy.deepcopy(LISTED)))
    assert tb.is_cluster and [h.name for h in tb.cluster] == ["a", "b", "c"]
    assert tb.cluster[0] == experiments.ClusterHost("a", "local", "127.0.0.1", ("consumer", "directory"))
    # producer: b (the first with the role); consumer: a (the first other host with it)
    assert tb["hosts"] == {"producer": {"host": "local", "address": "127.0.0.2"},
                           "consumer": {"host": "local", "address": "127.0.0.1"}}
    assert [h.name for h in tb.pair] == ["b", "a"]
    # a host with both roles is the producer, the consumer is the next one with that role
    both = [dict(LISTED[2]), dict(LISTED[0]), dict(LISTED[1])]
    tb = experiments.load_testbed(_write(tmp_path, both))
    assert [h.name for h in tb.pair] == ["c", "a"]


def test_a_two_host_testbed_is_unchanged_and_its_cluster_is_the_pair():
    tb = experiments.load_testbed(experiments.EXPERIMENTS_DIR / "testbeds" / "local.yaml")
    assert not tb.is_cluster and "cluster" not in tb.doc
    assert tb["hosts"]["producer"] == {"host": "netns:pclaba", "address": "198.18.77.1"}
    assert tb.cluster == [experiments.ClusterHost("producer", "netns:pclaba", "198.18.77.1", ("producer",)),
                          experiments.ClusterHost("consumer", "netns:pclabb", "198.18.77.2", ("consumer",))]
    assert Plan(str(experiments.EXPERIMENTS_DIR / "testbeds" / "local.yaml")).capture_names() == \
        ["producer", "consumer"]


def test_errors_name_the_field(tmp_path):
    dup = copy.deepcopy(LISTED)
    dup[2]["name"] = "a"
    assert "field 'hosts.2.name': 'a' is the name of hosts.0 too" in _error(tmp_path, dup)
    dup = copy.deepcopy(LISTED)
    dup[1]["address"] = "127.0.0.1"
    assert "field 'hosts.1.address': '127.0.0.1' is the address of hosts.0 too" in _error(tmp_path, dup)
    bad = copy.deepcopy(LISTED)
    bad[1]["roles"] = ["producer", "cache"]
    assert "field 'hosts.1.roles.1': 'cache' is not one of ['producer', 'consumer', 'directory']" in \
        _error(tmp_path, bad)
    bad[1]["roles"] = []
    assert "field 'hosts.1.roles'" in _error(tmp_path, bad)
    bad = copy.deepcopy(LISTED)
    bad[0]["name"] = "Upper"
    assert "field 'hosts.0.name'" in _error(tmp_path, bad)
    lonely = [dict(LISTED[2], roles=["producer", "consumer"]), dict(LISTED[1], roles=["directory"])]
    assert "field 'hosts': no host other than c (the producer) has role consumer" in _error(tmp_path, lonely)
    assert "field 'hosts': no host has role producer" in _error(
        tmp_path, [dict(LISTED[0]), dict(LISTED[1], roles=["consumer"])])
    spec = copy.deepcopy(LISTED)
    spec[2]["host"] = "ssh:-oProxyCommand=touch"
    assert "field 'hosts.2.host'" in _error(tmp_path, spec) and "starts with '-'" in _error(tmp_path, spec)
    extra = copy.deepcopy(LISTED)
    extra[0]["rack"] = 1
    assert "field 'hosts.0.rack': not a known field here" in _error(tmp_path, extra)
    assert "field 'netns_pair'" in _error(tmp_path, copy.deepcopy(LISTED), netns_pair={"tag": "x", "index": 1})
    assert "field 'preflight'" not in _error(tmp_path, [dict(LISTED[0], name="preflight"), dict(LISTED[1])])
    assert "field 'hosts.0.name': 'preflight' is reserved" in _error(
        tmp_path, [dict(LISTED[0], name="preflight"), dict(LISTED[1])])


def test_namespace_hosts_need_a_bridge_with_benchmark_addresses(tmp_path):
    ns = [{"name": f"n{i}", "host": f"netns:pcq{i}", "address": f"198.18.9.{i}", "roles": ["producer", "consumer"]}
          for i in (1, 2, 3)]
    assert "field 'hosts.0.host': netns:pcq1 is a network-namespace host" in _error(tmp_path, copy.deepcopy(ns))
    bridge = {"tag": "pcq", "index": 9}
    assert experiments.load_testbed(_write(tmp_path, copy.deepcopy(ns), netns_bridge=bridge)).netns_bridge().members \
        == [("pcq1", "198.18.9.1"), ("pcq2", "198.18.9.2"), ("pcq3", "198.18.9.3")]
    out = copy.deepcopy(ns)
    out[2]["address"] = "10.1.2.3"
    assert "field 'hosts.2.address': address 10.1.2.3 is outside 198.18.0.0/15" in \
        _error(tmp_path, out, netns_bridge=bridge)
    assert "field 'hosts.0.address': address 198.18.9.1 is not a host address of 198.18.8.0/24" in \
        _error(tmp_path, copy.deepcopy(ns), netns_bridge={"tag": "pcq", "index": 8})
    assert "field 'hosts.0.host': namespace 'pcq1' must start with the netns_bridge tag 'pcz'" in \
        _error(tmp_path, copy.deepcopy(ns), netns_bridge={"tag": "pcz", "index": 9})
    assert "field 'netns_bridge': a bridge joins the hosts of a host list" in _error(
        tmp_path, {"producer": {"host": "local", "address": "127.0.0.1"},
                   "consumer": {"host": "local", "address": "127.0.0.1"}}, netns_bridge=bridge)


def test_the_local_cluster_testbed_and_its_captures():
    plan = Plan(str(LOCAL_CLUSTER))
    tb = plan.testbed
    assert [h.name for h in tb.cluster] == [f"pcclu{i}" for i in range(1, 9)]
    assert [h.address for h in tb.cluster] == [f"198.18.79.{i}" for i in range(1, 9)]
    assert all(set(h.roles) >= {"producer", "consumer"} for h in tb.cluster)
    assert [h.name for h in tb.cluster if "directory" in h.roles] == ["pcclu1"]
    assert tb["hosts"]["producer"]["host"] == "netns:pcclu1" and tb["hosts"]["consumer"]["host"] == "netns:pcclu2"
    assert plan.capture_names() == ["producer", "consumer", *(f"pcclu{i}" for i in range(1, 9))]
    assert plan.capture_paths()[2] == "data/raw/local-cluster/testbed/pcclu1.json"


def test_the_preflight_checks_every_listed_host_and_each_pings_every_other(tmp_path):
    tb = experiments.load_testbed(_write(tmp_path, copy.deepcopy(LISTED)))
    rep = preflight.check(tb, [])
    assert rep.ok, rep.failures
    assert list(rep.hosts) == ["a", "b", "c"]
    assert [r["address"] for r in rep.hosts["b"]["reach"]] == ["127.0.0.1", "127.0.0.3"]
    assert [r["address"] for r in rep.hosts["c"]["reach"]] == ["127.0.0.1", "127.0.0.2"]
    # an address nobody answers fails on every host that pings it, naming the host and the target
    far = copy.deepcopy(LISTED)
    far[2]["address"] = "198.18.255.254"                  # RFC 2544 range, no namespace here: no answer
    rep = preflight.check(experiments.load_testbed(_write(tmp_path, far)), [])
    assert sorted(f.split(":")[0] for f in rep.failures) == ["a (local)", "b (local)"]
    assert all("cannot reach c's address 198.18.255.254" in f for f in rep.failures)


def test_without_namespaces_every_listed_host_falls_back_to_loopback(monkeypatch):
    monkeypatch.setattr(netns, "available", lambda: (False, "no root here"))
    tb = experiments.load_testbed(LOCAL_CLUSTER)
    with runpoint.testbed_hosts(tb) as th:
        assert [str(m.host) for m in th.cluster] == ["local"] * 8
        assert {m.address for m in th.cluster} == {"127.0.0.1"}
        assert "no root here" in th.note and "all 8 hosts" in th.note
        assert th.producer_addr == th.consumer_addr == "127.0.0.1"


def test_testbed_hosts_of_the_local_cluster_opens_eight_working_members_and_cleans_up(tmp_path):
    """local-cluster on a bridge of its own (tests/lab/pipeline/test_cluster_run.py may hold pcclu meanwhile)."""
    ok, why = netns.available()
    if not ok:
        pytest.skip(why)
    tb = experiments.load_testbed(local_cluster_copy(tmp_path, "pcclt", 75))
    with runpoint.testbed_hosts(tb) as th:
        assert th.note is None and len(th.cluster) == 8
        assert [m.name for m in th.members("directory")] == ["pcclt1"]
        assert len(th.members("producer")) == len(th.members("consumer")) == 8
        assert th.producer is th.member("pcclt1").host and th.consumer is th.member("pcclt2").host
        assert (th.producer_addr, th.consumer_addr) == ("198.18.75.1", "198.18.75.2")
        for m in th.cluster:
            r = m.host.run(["ip", "-o", "-4", "addr"], timeout=10)
            assert r.rc == 0 and f"inet {m.address}/24" in r.stdout, (m.name, r.stdout)
            assert m.python and m.python[0]
        r = th.member("pcclt8").host.run(["ping", "-c1", "-W1", "198.18.75.1"], timeout=10)
        assert r.rc == 0, r.stdout + r.stderr
        with pytest.raises(ValueError, match="not one of producer, consumer, directory"):
            th.members("cache")
    left = subprocess.run("ip netns list; ip -o link", shell=True, capture_output=True, text=True).stdout
    assert "pcclt" not in left
