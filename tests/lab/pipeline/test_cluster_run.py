"""The cluster scenario end to end on four network-namespace hosts on one bridge (local-cluster's first four):
each pattern once, a second's window, every page verified, the raw pattern measured in the same point.
This is make test's reduced cluster run; `make run TESTBED=experiments/testbeds/local-cluster.yaml` runs the
whole grid (2, 4 and 8 hosts)."""
import json
from pathlib import Path

import pytest
import yaml
from cluster_testbeds import local_cluster_copy

from peercache.lab.launch import netns
from peercache.lab.pipeline import experiments, runpoint
from peercache.lab.pipeline.points import cluster

ROOT = Path(__file__).resolve().parents[3]
ok, why = netns.available()
pytestmark = pytest.mark.skipif(not ok, reason=f"the cluster's hosts are network namespaces: {why}")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Run one reduced point of a pattern on the four hosts (one bridge set for the module)."""
    sc = experiments.load_scenarios()
    tb = experiments.load_testbed(ROOT / "experiments/testbeds/local-cluster.yaml", sc)
    out = tmp_path_factory.mktemp("cluster")
    with runpoint.testbed_hosts(tb) as th:
        def one(pattern: str, duration: float = 1, directory: str = "embedded", op: str = "get"):
            part = {"kind": "cluster", "protocol": "tcp", "pattern": [pattern], "hosts": [4], "zipf_s": [0.8],
                    "working_set": 64, "batch_size": 8, "duration": duration, "warmup": 0.3,
                    "directory": [directory], "op": [op]}
            pt, = experiments.expand_part("cluster", "patterns", part, [])
            rows = runpoint.run_point(tb, pt, 0, out / pt.name / "result.json", hosts=th, quiet=True)
            return pt, rows, out / pt.name
        yield one


@pytest.mark.parametrize("pattern,directory", [*((p, "embedded") for p in cluster.PATTERNS if p != "churn"),
                                               ("incast", "redis-cluster")])
def test_each_pattern_on_four_hosts_is_verified_and_has_its_raw_pattern_beside_it(run, pattern, directory):
    """Each pattern with the embedded directory (meta), and incast with a Redis Cluster of 3 masters."""
    pt, rows, folder = run(pattern, directory=directory)
    failed = [f"{r.tool} {r.metric}: {r.reason}" for r in rows if r.status == "failed"]
    assert not failed, failed
    pl = cluster.place(pattern, [(f"pcclu{i}", ("producer", "consumer")) for i in range(1, 5)], 4)
    got = {(r.tool, r.metric, r.side, r.devices): r for r in rows}
    agg = next(r for r in rows if (r.tool, r.metric, r.side) == ("peercache-bench", "get_throughput", "aggregate"))
    assert agg.value > 0 and agg.extra["verified"] and agg.extra["consumers"] == len(pl.consumers)
    assert got[("peercache-bench", "verify_failures", "aggregate", agg.devices)].value == 0
    assert got[("peercache-bench", "hit_rate", "aggregate", agg.devices)].value == 1.0
    per = [r for r in rows if (r.tool, r.metric, r.side) == ("peercache-bench", "get_throughput", "per_host")]
    assert sorted(r.devices for r in per) == sorted(pl.consumers) and all(r.value > 0 for r in per)
    # every producer served bytes, counted by its prefix (incast and shared read several at once)
    assert all(v and v > 0 for v in agg.extra["served_bytes"].values()), agg.extra["served_bytes"]
    jain = got[("peercache-bench", "jain_index", "aggregate", agg.devices)].value
    assert 1 / len(pl.consumers) <= jain <= 1.0
    raw = next(r for r in rows if (r.tool, r.metric, r.side) == ("iperf3", "bw", "aggregate"))
    assert raw.value > 0 and raw.extra["flows"] == len(pl.flows)
    cpu = [r for r in rows if r.metric == "cpu_s_per_gib" and r.side == "per_host"]
    assert sorted(r.devices for r in cpu) == [f"pcclu{i}" for i in range(1, 5)]
    assert any(r.status == "ok" and r.value > 0 for r in cpu)
    # every host's drive document and the directory's logs are kept
    assert all((folder / c / "drive.json").exists() for c in pl.consumers)
    if directory == "embedded":
        assert (folder / "directory.log").exists()
    else:     # three masters, and the cluster's creation, on the directory host
        assert [f.name for f in sorted(folder.glob("directory*.log"))] == [
            "directory-create.log", "directory0.log", "directory1.log", "directory2.log"]
        assert "redis cluster: ready" in (folder / "directory-create.log").read_text()


def test_churn_on_four_hosts_reads_through_a_leave_a_crash_and_a_join_without_a_wrong_page(run):
    """Hosts 1-3 read each other's pages; host 3 leaves, host 2 crashes, host 4 joins with host 2's pages."""
    pt, rows, folder = run("churn", duration=5)
    failed = [f"{r.tool} {r.metric}: {r.reason}" for r in rows if r.status == "failed"]
    assert not failed, failed
    by = {(r.metric, r.side): r for r in rows if r.side != "per_host"}
    assert by[("verify_failures", "aggregate")].value == 0
    assert [s for m, s in by if m == "hit_rate" and s.startswith("phase:")] == [
        "phase:steady", "phase:after_leave", "phase:after_crash", "phase:after_join"]
    assert by[("hit_rate", "phase:steady")].value > 0.9
    # the crash took pages away: the hit rate dipped, as errors or misses
    assert by[("hit_rate_dip", "event:crash")].value > 0
    ev = by[("errors", "aggregate")].extra["events"]
    assert 0 < ev["leave"] < ev["crash"] < ev["join"] < 5
    stalls = [r for r in rows if r.metric == "max_stall_s"]
    assert len(stalls) == 3 and all(r.extra["within_bound"] for r in stalls), [(r.value, r.extra) for r in stalls]
    assert (folder / "pcclu4" / "server.log").exists()          # the joiner's log is kept


def test_lookups_under_fanout_measure_the_directory_from_every_client(run):
    """op: exists over fan-out: three clients only ask a redis-server directory; lookups/s per client and
    in all, batch lookup latency, every key found, the directory's CPU; no pages, so no raw pattern."""
    pt, rows, folder = run("fanout", directory="redis", op="exists")
    failed = [f"{r.tool} {r.metric}: {r.reason}" for r in rows if r.status == "failed"]
    assert not failed, failed
    assert pt.name.endswith("_redis_exists")
    agg = next(r for r in rows if (r.metric, r.side) == ("lookup_rate", "aggregate"))
    per = [r for r in rows if (r.metric, r.side) == ("lookup_rate", "per_host")]
    assert sorted(r.devices for r in per) == ["pcclu2", "pcclu3", "pcclu4"] and all(r.value > 0 for r in per)
    assert agg.value == pytest.approx(sum(r.value for r in per), rel=0.25)
    assert agg.extra["clients"] == 3 and agg.extra["directory_cores"] > 0
    assert next(r for r in rows if (r.metric, r.side) == ("hit_rate", "aggregate")).value == 1.0
    assert all(r.value > 0 for r in rows if r.metric == "latency_p99")
    assert not any(r.tool == "iperf3" or r.metric == "get_throughput" for r in rows)


def test_every_cluster_hosts_processes_are_bound_to_its_nics_node(tmp_path):
    """A copy of local-cluster whose hosts name a NIC each, placed on node 0 by the testbed's numa map: the
    directory, every serve and every drive run under numactl on node 0, and their CPU sampler shows it."""
    # its own bridge (the module's run fixture may hold local-cluster's for the other tests)
    path = local_cluster_copy(tmp_path, "pccln", 76, hosts=3)
    doc = yaml.safe_load(path.read_text())
    doc["hosts"] = [dict(h, devices=[f"nic-{h['name']}"]) for h in doc["hosts"]]
    doc.update(devices=["nic"], numa={f"nic-{h['name']}": 0 for h in doc["hosts"]})
    path.write_text(yaml.safe_dump(doc))
    tb = experiments.load_testbed(path, experiments.load_scenarios())
    part = {"kind": "cluster", "protocol": "tcp", "pattern": ["fanout"], "hosts": [3], "working_set": 64,
            "batch_size": 8, "duration": 1, "warmup": 0.3, "op": ["exists"]}
    pt, = experiments.expand_part("cluster", "numa", part, [])
    with runpoint.testbed_hosts(tb) as th:
        rows = runpoint.run_point(tb, pt, 0, tmp_path / "out" / "result.json", hosts=th, quiet=True)
    failed = [f"{r.tool} {r.metric}: {r.reason}" for r in rows if r.status == "failed"]
    assert not failed, failed
    numa = json.loads((tmp_path / "out" / "result.json").read_text())["meta"]["numa_binding"]
    sides = ["pccln1/directory", "pccln1/server", "pccln2/client", "pccln3/client"]
    for side in sides:
        rec = numa[side]
        assert rec["node"] == 0 and rec["prefix"][:1] == ["numactl"], (side, rec)
        assert "testbed numa map" in rec["node_source"], (side, rec)
        # on a one-node machine every process is on node 0 bound or not: the memory policy numactl set
        # (bind:0 on its mappings) is what shows the binding reached the process
        judged = rec["evidence"]["judged"]
        assert judged["verdict"] == "bound" and judged["explicit"] is True, (side, judged)
