"""The cluster scenario's report from rows the cluster kind makes (its pure row builders, from reconstructed
drive documents and windows: tests/lab/pipeline/points/test_cluster.py says which fields): a figure per
pattern, a table row per point with its evidence, a row per pattern in the overview, and where scaling
stopped."""
import pandas as pd
import pytest

from peercache.lab.analysis import charts, collect
from peercache.lab.analysis.scenarios import REPORTS
from peercache.lab.launch.runners import WindowBytes, aggregate_window
from peercache.lab.pipeline.points import cluster, cluster_raw

HOSTS = [("h1", ("producer", "consumer", "directory"))] + [(f"h{i}", ("producer", "consumer")) for i in range(2, 9)]


def point_rows(pattern: str, n: int, per_host_gbs: float, raw_gbs: float, cpu_cores: float,
               directory: str = "embedded", protocol: str = "tcp") -> list[dict]:
    """One point's rows: every consumer moved ``per_host_gbs`` over [0, 1] s; the raw pattern ``raw_gbs`` in all
    (with the protocol's raw tool)."""
    pl = cluster.place(pattern, HOSTS, n)
    run = f"lc/cluster/cluster_{pattern}_h{n}/rep0"
    ctx = {"experiment": "lc", "testbed": "lc", "scenario": "cluster", "run_id": run, "repetition": 0,
           "tool": "peercache-bench", "protocol": protocol, "layout": "mla", "size_bytes": 131072, "batch": 16,
           "threads": 1, "processes": 1, "extra": {"pattern": pattern, "hosts": n, "zipf_s": None,
                                                   "directory": directory}}
    b = per_host_gbs * 1e9
    docs = {c: {"points": [{"status": "ok", "bytes": b, "keys": 10, "hit_rate": 1.0, "verify_failures": 0,
                            "verified": True, "latency_us": {"p50": 50.0, "p99": 200.0},
                            "bytes_by_prefix": {p: b / len(pl.reads[c]) for p in pl.reads[c]}}]} for c in pl.consumers}
    agg = aggregate_window({c: WindowBytes(b, 0.0, 1.0) for c in pl.consumers})
    cpu = {f"{h}/consumer": {"cores": cpu_cores / n, "seconds": 1.0} for h in pl.hosts}
    rows = cluster.peercache_rows(pl, docs, agg, cpu, {h: f"netns:{h}" for h in pl.hosts}, ctx, machine_cpus=2)
    flows = {f"raw{i}": f for i, f in enumerate(pl.flows)}
    ragg = aggregate_window({k: WindowBytes(raw_gbs * 1e9 / len(flows), 0.0, 1.0) for k in flows})
    rows += cluster_raw.raw_rows(pl, flows, ragg, {h: h for h in pl.hosts},
                                 dict(ctx, tool=cluster_raw.RAW_FORMS[protocol].tool))
    return [r.to_dict() for r in rows]


@pytest.fixture
def rows() -> pd.DataFrame:
    recs = (point_rows("pairwise", 2, 1.0, 2.0, 0.6) + point_rows("pairwise", 4, 1.0, 4.0, 1.2)
            + point_rows("incast", 2, 1.0, 2.0, 0.6) + point_rows("incast", 4, 1.2, 2.0, 1.9))
    return collect.normalize_rows(pd.DataFrame(recs))


def test_a_figure_per_pattern_with_a_table_row_per_point(rows):
    built = charts.build_scenario("cluster", rows, pd.DataFrame(columns=["run_id"]), None)
    drawn = {c.name: c for c in built if hasattr(c, "fig")}
    assert set(drawn) == {"cluster_pairwise", "cluster_incast"}
    assert {c.name for c in built} >= {"cluster_fanout", "cluster_shared"}     # not drawn, with the reason
    table = drawn["cluster_pairwise"].table
    assert [(t["hosts"], t["aggregate (GB/s)"], t["raw (GB/s)"], t["% of raw"]) for t in table] == [
        (2, "1", "2", "50%"), (4, "2", "4", "50%")]


def test_an_rdma_points_ib_read_bw_pairs_are_its_raw_and_the_note_says_what_ran(rows):
    rdma = collect.normalize_rows(pd.DataFrame(point_rows("fanout", 3, 0.5, 3.0, 0.6, protocol="rdma")))
    built = {c.name: c for c in charts.build_scenario("cluster", rdma, pd.DataFrame(columns=["run_id"]), None)}
    chart = built["cluster_fanout"]
    assert [(t["raw (GB/s)"], t["% of raw"]) for t in chart.table] == [("3", "33%")]
    assert chart.notes[0].startswith("raw: ib_read_bw, one pair per link of the pattern")
    assert "iperf3" not in chart.notes[0]
    tcp = {c.name: c for c in charts.build_scenario("cluster", rows, pd.DataFrame(columns=["run_id"]), None)}
    assert tcp["cluster_pairwise"].notes[0].startswith("raw: iperf3 -R, one TCP flow per link of the pattern")


def test_what_limited_each_point_and_where_scaling_stopped(rows):
    rep = REPORTS["cluster"]
    recs = rep.tables(rows, {})[0][1]
    incast4 = next(r for r in recs if r["pattern"] == "incast" and r["hosts"] == 4)
    assert incast4["limited by"].startswith("CPU: 1.9 of the machine's 2 logical CPUs busy")
    text = " ".join(c.text for c in rep.conclusions(rows, {}))
    assert "pairwise: from 2 to 4 hosts the aggregate went from" in text and "kept scaling" in text
    assert "incast: from 2 to 4 hosts" in text and "stopped scaling" in text and "CPU" in text


def test_the_overview_has_a_row_per_pattern_against_its_raw_pattern(rows):
    bw = rows[(rows["status"] == "ok") & rows["metric"].isin(["get_throughput", "bw"])]
    over = REPORTS["cluster"].overview("cluster", rows, rows, bw, {})
    assert [o["scenario"] for o in over] == ["cluster: pairwise at 4 hosts", "cluster: incast at 4 hosts"]
    assert over[0]["% of single-NIC raw limit"] == "50% of the raw pattern"
    assert "2.00x the 2-host aggregate" in over[0]["notes"] and "0 wrong pages" in over[0]["notes"]


def churn_rows_fixture() -> pd.DataFrame:
    """A churn run's rows from reconstructed timelines: 1.0, a leave at 2 s down to 0.8, a crash at 4 s down
    to 0.5, a join at 6 s back to 0.8 (two consumers, 100 ms buckets)."""
    pl = cluster.place("churn", HOSTS, 4)
    level = [(0, 1.0), (2.0, 0.8), (4.0, 0.5), (6.0, 0.8)]
    def tl():
        return {"bucket_ms": 100, "start": 0.0, "max_stall_s": 0.2, "fault_bound_s": 3.0,
                "buckets": [{"t": i / 10, "keys": 100, "hits": int(100 * next(v for t, v in reversed(level) if t <= i / 10)),
                             "misses": 0, "errors": 0, "verify_failures": 0, "bytes": 0} for i in range(80)]}
    docs = {c: {"points": [{"status": "ok", "bytes": 1e9, "keys": 10, "hit_rate": 0.8, "verify_failures": 0,
                            "errors": 7, "verified": True, "latency_us": {"p50": 1.0, "p99": 2.0}, "timeline": tl()}]}
            for c in pl.consumers}
    agg = aggregate_window({c: WindowBytes(1e9, 0.0, 8.0) for c in pl.consumers})
    ctx = {"experiment": "lc", "testbed": "lc", "scenario": "cluster", "run_id": "lc/cluster/churn/rep0", "repetition": 0,
           "tool": "peercache-bench", "protocol": "tcp", "layout": "mla", "size_bytes": 131072, "batch": 16,
           "threads": 1, "processes": 1, "extra": {"pattern": "churn", "hosts": 4, "zipf_s": 0.8}}
    events = [{"event": e, "t": t} for e, t in (("leave", 2.0), ("crash", 4.0), ("join", 6.0), ("ready", 6.3))]
    rows = cluster.peercache_rows(pl, docs, agg, {}, {h: h for h in pl.hosts}, ctx)
    rows += cluster.churn_rows(pl, docs, agg, events, ctx, 8.0)
    return collect.normalize_rows(pd.DataFrame([r.to_dict() for r in rows]))


def test_churn_has_its_figure_table_and_conclusion():
    rows = churn_rows_fixture()
    built = {c.name: c for c in charts.build_scenario("cluster", rows, pd.DataFrame(columns=["run_id"]), None)}
    chart = built["cluster_churn"]
    assert hasattr(chart, "fig"), chart
    assert [t["phase"] for t in chart.table] == ["before any event", "h3 leaves (SIGTERM)", "h2 crashes (SIGKILL)",
                                                 "h4 joins with h2's pages"]
    assert [t["settled hit rate"] for t in chart.table] == ["1.000", "0.800", "0.500", "0.800"]
    assert "0 wrong pages, 21 read errors" in chart.notes[0]
    text = " ".join(c.text for c in REPORTS["cluster"].conclusions(rows, {}))
    assert "after a crash the hit rate dipped by 0.30, then settled at 0.50" in text and "0 wrong pages" in text and "(its bound 3 s)" in text


def lookup_point_rows(directory: str, n: int, keys_per_host: float, dir_cores: float) -> list[dict]:
    """One op: exists point of fan-out on ``n`` hosts: each client looked ``keys_per_host`` keys up over [0, 1] s."""
    pl = cluster.place("fanout", HOSTS, n)
    run = f"lc/cluster/cluster_fanout_h{n}_{directory}_exists/rep0"
    ctx = {"experiment": "lc", "testbed": "lc", "scenario": "cluster", "run_id": run, "repetition": 0,
           "tool": "peercache-bench", "protocol": "tcp", "layout": "mla", "size_bytes": 131072, "batch": 16,
           "threads": 1, "processes": 1,
           "extra": {"pattern": "fanout", "hosts": n, "zipf_s": None, "directory": directory, "op": "exists"}}
    docs = {c: {"points": [{"status": "ok", "bytes": 0, "keys": keys_per_host, "threads": 1, "hit_rate": 1.0,
                            "latency_us": {"p50": 100.0, "p99": 300.0 * n}}]} for c in pl.consumers}
    agg = aggregate_window({c: WindowBytes(keys_per_host, 0.0, 1.0) for c in pl.consumers})
    cpu = {f"{pl.directory}/directory": {"cores": dir_cores, "seconds": 1.0}}
    rows = cluster.lookup_rows(pl, docs, agg, cpu, {h: h for h in pl.hosts}, ctx, [f"{pl.directory}/directory"],
                               machine_cpus=2, machine_busy=1.0)
    return [r.to_dict() for r in rows]


def test_the_directory_section_says_which_directory_limits_uncached_reads_from_how_many_hosts():
    # fan-out GETs read 1 GB/s per consumer host (7629 keys/s of 128 KiB each)
    gets = point_rows("fanout", 2, 1.0, 2.0, 0.6, "redis") + point_rows("fanout", 4, 1.0, 4.0, 1.2, "redis")
    looks = lookup_point_rows("redis", 2, 20000, 0.5) + lookup_point_rows("redis", 4, 5000, 0.95)
    rows = collect.normalize_rows(pd.DataFrame(gets + looks))
    built = {c.name: c for c in charts.build_scenario("cluster", rows, pd.DataFrame(columns=["run_id"]), None)}
    fig = built["cluster_directory"]
    assert hasattr(fig, "fig"), getattr(fig, "reason", fig)
    by_hosts = {t["hosts"]: t for t in fig.table}
    assert by_hosts[2]["lookups/s (keys)"] == "2e+04" and by_hosts[2]["clients"] == 1
    assert by_hosts[4]["lookups/s (keys)"] == "1.5e+04" and by_hosts[4]["clients"] == 3
    assert by_hosts[4]["limited by"] == "the directory: its process directory at 0.95 of a core"
    assert by_hosts[2]["GET keys/s, same pattern"].endswith("(262% covered)")
    text = " ".join(c.text for c in REPORTS["cluster"].conclusions(rows, {}))
    assert "Directory redis under fanout: from 4 hosts on it would limit reads that miss the location cache" in text
    # lookup points add no GET figure of their own
    assert [t["hosts"] for t in built["cluster_fanout"].table] == [2, 4]
