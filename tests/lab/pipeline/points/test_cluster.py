"""The cluster kind's pure parts: where each pattern puts its hosts, Jain's index, and its rows.

The drive documents here are reconstructed (the fields the kind reads, as drive writes them), not captures:
the end-to-end run on namespace hosts is tests/lab/pipeline/test_cluster_run.py.
"""
from pathlib import Path

import pytest

from peercache.lab.launch.runners import GroupResult, SideResult, aggregate_window, WindowBytes
from peercache.lab.pipeline import kinds
from peercache.lab.pipeline.points import churn, cluster, cluster_raw
from peercache.lab.tools import perftest as pt

FIX = Path(__file__).resolve().parents[3] / "fixtures" / "lab"

BOTH = ("producer", "consumer")
HOSTS = [("h1", BOTH + ("directory",))] + [(f"h{i}", BOTH) for i in range(2, 9)]


def test_pairwise_pairs_each_reader_with_the_host_before_it():
    pl = cluster.place("pairwise", HOSTS, 4)
    assert pl.producers == ("h1", "h3") and pl.reads == {"h2": ("h1",), "h4": ("h3",)}
    assert pl.flows == (("h1", "h2"), ("h3", "h4")) and pl.directory == "h1"


def test_incast_fanout_and_shared():
    inc = cluster.place("incast", HOSTS, 4)
    assert inc.reads == {"h1": ("h2", "h3", "h4")} and inc.flows == (("h2", "h1"), ("h3", "h1"), ("h4", "h1"))
    fan = cluster.place("fanout", HOSTS, 3)
    assert fan.producers == ("h1",) and fan.reads == {"h2": ("h1",), "h3": ("h1",)}
    sh = cluster.place("shared", HOSTS, 3)
    assert sh.reads == {"h1": ("h2", "h3"), "h2": ("h1", "h3"), "h3": ("h1", "h2")}
    assert sh.flows == (("h1", "h2"), ("h2", "h3"), ("h3", "h1"))         # a ring


def test_the_directory_is_the_first_host_with_its_role_even_outside_the_hosts_used():
    hosts = [("a", BOTH), ("b", BOTH), ("dir", ("directory",))]
    assert cluster.place("pairwise", hosts, 2).directory == "dir"
    assert cluster.place("pairwise", hosts[:2], 2).directory == "a"


@pytest.mark.parametrize("pattern,hosts,n,words", [
    ("incast", HOSTS, 9, "needs 9 hosts; the testbed has 8"),
    ("fanout", [("a", ("consumer",)), ("b", BOTH)], 2, "host a serves pages"),
    ("incast", [("a", ("producer",)), ("b", BOTH)], 2, "host a reads pages"),
    ("ring", HOSTS, 2, "not one of"),
])
def test_a_pattern_that_does_not_fit_says_why(pattern, hosts, n, words):
    with pytest.raises(cluster.PlacementError, match=words):
        cluster.place(pattern, hosts, n)


def test_jain_index():
    assert cluster.jain([1.0, 1.0, 1.0, 1.0]) == pytest.approx(1.0)
    assert cluster.jain([4.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)
    assert cluster.jain([2.0, 1.0]) == pytest.approx(0.9)
    assert cluster.jain([0.0, 0.0]) is None


def test_points_per_pattern_host_count_and_zipf_exponent():
    pts = kinds.kind_of("cluster").expand("cluster", {"kind": "cluster", "protocol": "tcp", "hosts": [2, 4],
                                                      "pattern": ["incast", "shared"], "zipf_s": [0.8, 1.2]}, [])
    assert [p.name for p in pts] == ["cluster_incast_h2_tcp_s128K_b16", "cluster_incast_h4_tcp_s128K_b16",
                                     "cluster_shared_z0.8_h2_tcp_s128K_b16", "cluster_shared_z0.8_h4_tcp_s128K_b16",
                                     "cluster_shared_z1.2_h2_tcp_s128K_b16", "cluster_shared_z1.2_h4_tcp_s128K_b16"]
    assert pts[3].params["zipf_s"] == 0.8 and "zipf_s" not in pts[0].params
    assert kinds.kind_of("cluster").hosts_needed(pts[1].params) == 4
    redis = kinds.kind_of("cluster").expand("cluster", {"kind": "cluster", "protocol": "tcp", "hosts": [2],
                                                        "pattern": ["fanout"],
                                                        "directory": ["embedded", "redis", "redis-cluster"]}, [])
    assert [(p.name, p.params["directory"]) for p in redis] == [
        ("cluster_fanout_h2_tcp_s128K_b16", "embedded"), ("cluster_fanout_h2_tcp_s128K_b16_redis", "redis"),
        ("cluster_fanout_h2_tcp_s128K_b16_rediscluster", "redis-cluster")]


def drive_doc(nbytes, start, end, by_prefix=None, wrong=0):
    pt = {"status": "ok", "bytes": nbytes, "window_start": start, "window_end": end, "keys": 100,
          "hit_rate": 1.0, "verify_failures": wrong, "verified": True, "latency_us": {"p50": 90.0, "p99": 400.0}}
    if by_prefix is not None:
        pt["bytes_by_prefix"] = by_prefix
    return {"points": [pt]}


CTX = {"experiment": "t", "testbed": "t", "scenario": "cluster", "run_id": "t/cluster/p/rep0", "repetition": 0,
       "tool": "peercache-bench", "protocol": "tcp", "layout": "mla", "size_bytes": 131072, "batch": 16,
       "threads": 1, "processes": 1, "extra": {"pattern": "incast", "hosts": 3, "zipf_s": None}}


def test_incast_rows_count_each_producer_by_its_prefix_and_cpu_per_gib_per_host():
    pl = cluster.place("incast", HOSTS, 3)
    docs = {"h1": drive_doc(3 << 30, 10.0, 12.0, {"h2": 2 << 30, "h3": 1 << 30})}
    agg = aggregate_window({"h1": WindowBytes(3 << 30, 10.0, 12.0)})
    cpu = {"h1/consumer": {"cores": 1.0, "seconds": 2.0}, "h1/directory": {"cores": 0.5, "seconds": 2.0},
           "h2/producer": {"cores": 0.5, "seconds": 2.0}, "h3/producer": {"reason": "fewer than two CPU samples"}}
    rows = cluster.peercache_rows(pl, docs, agg, cpu, {h: f"netns:{h}" for h in pl.hosts}, CTX, machine_cpus=2)
    by = {(r.metric, r.side, r.devices): r for r in rows}
    assert by[("get_throughput", "aggregate", "h1")].value == pytest.approx(3 * 2**30 / 2 / 1e9)
    assert by[("get_throughput", "aggregate", "h1")].extra["machine_cpus"] == 2
    assert by[("get_throughput", "per_host", "h1")].peer == "h2+h3"
    assert by[("cpu_s_per_gib", "per_host", "h1")].value == pytest.approx(3.0 / 3)      # 3 CPU s over 3 GiB read
    assert by[("cpu_s_per_gib", "per_host", "h2")].value == pytest.approx(1.0 / 2)      # 1 CPU s over 2 GiB served
    assert by[("cpu_s_per_gib", "per_host", "h3")].status == "not_measured"
    assert by[("jain_index", "aggregate", "h1")].value == pytest.approx(1.0)
    assert by[("verify_failures", "aggregate", "h1")].value == 0


def test_without_bytes_per_prefix_a_producer_several_read_from_is_not_guessed():
    pl = cluster.place("incast", HOSTS, 3)
    served = cluster.served_bytes(pl, {"h1": drive_doc(100, 0.0, 1.0)})
    assert served == {"h2": None, "h3": None}
    fan = cluster.place("fanout", HOSTS, 3)
    assert cluster.served_bytes(fan, {"h2": drive_doc(100, 0.0, 1.0), "h3": drive_doc(50, 0.0, 1.0)}) == {"h1": 150.0}


def test_fairness_and_wrong_pages_over_consumers():
    pl = cluster.place("fanout", HOSTS, 3)
    docs = {"h2": drive_doc(2000, 0.0, 1.0), "h3": drive_doc(1000, 0.0, 1.0, wrong=2)}
    agg = aggregate_window({c: WindowBytes(d["points"][0]["bytes"], 0.0, 1.0) for c, d in docs.items()})
    rows = cluster.peercache_rows(pl, docs, agg, {}, {h: h for h in pl.hosts}, CTX)
    by = {(r.metric, r.side): r for r in rows if r.side == "aggregate"}
    assert by[("jain_index", "aggregate")].value == pytest.approx(0.9)
    assert by[("verify_failures", "aggregate")].value == 2
    assert by[("cpu_s_per_gib", "aggregate")].status == "not_measured"


def test_raw_rows_sum_each_consumers_flows_over_the_shared_window():
    pl = cluster.place("incast", HOSTS, 3)
    flows = {"raw0_h2_to_h1": ("h2", "h1"), "raw1_h3_to_h1": ("h3", "h1")}
    agg = aggregate_window({"raw0_h2_to_h1": WindowBytes(1e9, 0.0, 1.0), "raw1_h3_to_h1": WindowBytes(3e9, 0.0, 1.0)})
    rows = cluster_raw.raw_rows(pl, flows, agg, {h: h for h in pl.hosts}, dict(CTX, tool="iperf3"))
    assert [(r.side, r.devices, r.value) for r in rows] == [("per_host", "h1", 4e9), ("aggregate", "h1", 4e9)]
    assert rows[1].extra["flows"] == 2


# -- the raw pattern over rdma: ib_read_bw pairs ---------------------------------------------------------

def test_ib_read_bw_rows_have_the_shape_of_iperf3s():
    pl = cluster.place("fanout", HOSTS, 3)
    flows = cluster_raw.flow_names(pl)
    assert flows == {"raw0_h1_to_h2": ("h1", "h2"), "raw1_h1_to_h3": ("h1", "h3")}
    agg = aggregate_window({"raw0_h1_to_h2": WindowBytes(1e9, 0.0, 2.0), "raw1_h1_to_h3": WindowBytes(2e9, 0.1, 2.1)},
                           tolerance_s=0.5)
    ctx = dict(CTX, tool="ib_read_bw", protocol="rdma", size_bytes=131072, qps=1, batch=None)
    rows = cluster_raw.raw_rows(pl, flows, agg, {h: h for h in pl.hosts}, ctx)
    assert [(r.side, r.devices, r.peer, r.tool, r.protocol) for r in rows] == [
        ("per_host", "h2", "h1", "ib_read_bw", "rdma"), ("per_host", "h3", "h1", "ib_read_bw", "rdma"),
        ("aggregate", "h2,h3", "h1", "ib_read_bw", "rdma")]
    assert [r.value for r in rows] == pytest.approx([1e9 / 2.1, 2e9 / 2.1, 3e9 / 2.1])
    assert rows[2].extra["start_skew_s"] == pytest.approx(0.1) and rows[2].size_bytes == 131072


def test_every_pair_runs_one_qp_a_page_a_message_its_warm_up_as_perftests_margin():
    p = cluster_raw.raw_perftest_params(131072, duration=2, warmup=0.5, gid_index=1, qp_timeout=None)
    assert (p.tool, p.qps, p.size, p.duration, p.margin, p.gid_index) == ("ib_read_bw", 1, 131072, 4, 1, 1)
    assert pt.sample_window(p) == (1, 2)                      # the sample is the point's duration
    # whole seconds, as -D and -f take them; no warm-up: no margin
    assert pt.sample_window(cluster_raw.raw_perftest_params(4096, 2.5, 0, None, 20)) == (0, 3)


READ_D2 = (FIX / "perftest/softroce/read_d2_q1.client.stdout").read_text()


def arrived(at: dict[int, float]):
    """A stdout's line -> arrival time, as a line-buffered client's pipe gives it (the lines not named: None)."""
    return lambda line_no: at.get(line_no)


def test_a_pairs_window_counts_its_reads_over_its_alarm_timed_sample_from_its_loops_start():
    # real: ib_read_bw -s 131072 -q 1 -D 2 over rxe (perftest 4.5+0.17; margin 2 // 4 = 0): 496 READs; its
    # table header (line 23, printed as the loop starts) and its row (line 24, as it ends)
    result = pt.parse_output(READ_D2)
    assert result.rows[0].line_no == 24 and READ_D2.splitlines()[22].lstrip().startswith("#bytes")
    params = pt.PerftestParams(size=131072, duration=2)
    w = cluster_raw.perftest_window(result, params, READ_D2, arrived({23: 100.0, 24: 102.05}), "t")
    assert w.bytes == 496 * 131072 and (w.start, w.end) == pytest.approx((100.0, 102.0))
    # perftest's own average (its cycle counter) agrees with the alarm-timed 2 s within 0.5 %
    assert w.bytes / (w.end - w.start) == pytest.approx(result.rows[0].bw_average_Bps, rel=5e-3)
    # with a margin the sample starts that far into the loop and lasts duration - 2 x margin
    w = cluster_raw.perftest_window(result, pt.PerftestParams(size=131072, duration=4, margin=1), READ_D2,
                                    arrived({23: 100.0, 24: 104.1}), "t")
    assert (w.start, w.end) == pytest.approx((101.0, 103.0))


def test_a_pair_that_measured_nothing_or_whose_lines_came_together_says_so():
    params = pt.PerftestParams(size=131072, duration=2)
    # block-buffered (no stdbuf): every line arrives at the exit, in one read
    with pytest.raises(ValueError, match="not line-buffered; check that stdbuf"):
        cluster_raw.perftest_window(pt.parse_output(READ_D2), params, READ_D2, arrived({23: 103.0, 24: 103.0}), "t")
    zero = READ_D2.replace(" 496 ", " 0 ")
    with pytest.raises(ValueError, match="0 READs"):
        cluster_raw.perftest_window(pt.parse_output(zero), params, zero, arrived({23: 100.0, 24: 102.0}), "t")


def side(role: str, text: str, rc: int | None, stopped: bool = False) -> SideResult:
    return SideResult(role=role, host="local", command=[], argv=[], numa_binding={}, stderr=text, rc=rc,
                      stopped=stopped)


#: real: the two-machine testbed's ib_read_bw client that could not calibrate its clock; a real Soft-RoCE client
#: given a device that does not exist; what a server whose client went away says
CALIBRATION = (FIX / "twohost/ib_read_bw_q4_s128K.terminated.client.log").read_text()
NO_DEVICE = (FIX / "perftest/softroce/err_no_device_client.client.stderr").read_text()
PEER_GONE = " Failed to exchange data between server and clients\n"


def test_a_raw_runs_failure_is_a_clients_own_words_before_its_servers():
    gone = {"raw0": GroupResult("raw0", side("server", PEER_GONE, 1), [side("client", NO_DEVICE, 1)]),
            "raw1": GroupResult("raw1", side("server", "", -15, True), [side("client", "", -15, True)])}
    te = cluster_raw.raw_failure(gone, "ib_read_bw")
    assert te.kind == "no_device" and "raw0's client" in str(te)             # not the server's consequence
    # a client the runner stopped (its server's exit seen first) counts by what it had said, not its signal
    raced = {"raw0": GroupResult("raw0", side("server", PEER_GONE, 1), [side("client", NO_DEVICE, -15, True)])}
    assert cluster_raw.raw_failure(raced, "ib_read_bw").kind == "no_device"
    # no client said anything: the server's words
    quiet = {"raw0": GroupResult("raw0", side("server", PEER_GONE, 1), [side("client", "", -15, True)])}
    assert cluster_raw.raw_failure(quiet, "ib_read_bw").kind == "cannot_connect"
    # a client that exited 0 did not fail, whatever it printed (-F: a calibration failure is only a line)
    fine = {"raw0": GroupResult("raw0", None, [side("client", CALIBRATION, 0)])}
    assert cluster_raw.raw_failure(fine, "ib_read_bw") is None


# -- churn -------------------------------------------------------------------------------------------

def test_churn_places_a_shared_read_over_all_but_the_last_host_which_joins_for_the_crashed_one():
    pl = cluster.place("churn", HOSTS, 5)
    assert pl.producers == ("h1", "h2", "h3", "h4") and "h5" not in pl.reads
    assert pl.reads["h1"] == ("h2", "h3", "h4") and pl.flows == ()
    assert (pl.churn.leaves, pl.churn.crashes, pl.churn.joins, pl.churn.prefix) == ("h4", "h3", "h5", "h3")
    with pytest.raises(cluster.PlacementError, match="at least 4 hosts"):
        cluster.place("churn", HOSTS, 3)


def bucket(t, hits, keys=100):
    return {"t": t, "keys": keys, "hits": hits, "misses": keys - hits, "errors": 0, "verify_failures": 0,
            "bytes": hits}


def test_churn_phases_dips_and_recovery_times():
    # 1.0 until the leave at 2 s; a dip to 0.4 that recovers to 0.8 by 3 s; the crash at 4 s drops to 0.5
    # for good; the join at 6 s brings it back to 0.8 by 7 s
    level = [(0, 1.0), (2.0, 0.4), (2.5, 0.6), (3.0, 0.8), (4.0, 0.5), (6.0, 0.6), (7.0, 0.8)]
    buckets = [bucket(i / 10, int(100 * next(v for t, v in reversed(level) if t <= i / 10))) for i in range(80)]
    ph = churn.analyse(buckets, {"leave": 2.0, "crash": 4.0, "join": 6.0}, 8.0)
    assert list(ph) == ["steady", "after_leave", "after_crash", "after_join"]
    assert ph["steady"]["settled_hit_rate"] == pytest.approx(1.0)
    assert ph["after_leave"]["dip"] == pytest.approx(0.6) and ph["after_leave"]["settled_hit_rate"] == pytest.approx(0.8)
    assert ph["after_leave"]["recovery_s"] == pytest.approx(1.2)     # 3.0 s + two buckets of the running mean
    assert ph["after_crash"]["dip"] == pytest.approx(0.3) and ph["after_crash"]["recovery_s"] == 0.0   # a step: settled at once
    assert ph["after_join"]["settled_hit_rate"] == pytest.approx(0.8) and ph["after_join"]["recovery_s"] == pytest.approx(1.2)


def test_a_phase_that_never_settles_has_no_recovery_time():
    buckets = [bucket(i / 10, 100 if i < 20 else (20 if i % 2 else 90)) for i in range(40)]
    ph = churn.analyse(buckets, {"leave": 2.0}, 4.0)
    assert ph["after_leave"]["recovery_s"] is None and ph["after_leave"]["dip"] == pytest.approx(0.8)


def test_the_consumers_timelines_are_summed_bucket_by_bucket():
    a = {"buckets": [bucket(0.0, 10, 10), bucket(0.1, 5, 10)]}
    b = {"buckets": [bucket(0.0, 0, 10), bucket(0.1, 5, 10), bucket(0.2, 1, 1)]}
    s = churn.summed([a, b])
    assert [(x["t"], x["hits"], x["keys"]) for x in s] == [(0.0, 10, 20), (0.1, 10, 20)]


def test_busy_cores_count_everything_but_idle_between_two_readings():
    from collections import namedtuple
    T = namedtuple("T", "user system idle iowait softirq")
    assert cluster.busy_cores(T(10, 5, 100, 1, 0), T(13, 6, 101, 2, 2), 2.0) == {"busy_cores": 3.0}


def test_exists_points_are_named_apart_and_never_churn():
    pts = kinds.kind_of("cluster").expand("cluster", {"kind": "cluster", "protocol": "tcp", "hosts": [4],
                                                      "pattern": ["fanout"], "op": ["get", "exists"],
                                                      "directory": ["embedded", "redis"]}, [])
    assert [(p.name, p.params["op"]) for p in pts] == [
        ("cluster_fanout_h4_tcp_s128K_b16", "get"), ("cluster_fanout_h4_tcp_s128K_b16_exists", "exists"),
        ("cluster_fanout_h4_tcp_s128K_b16_redis", "get"), ("cluster_fanout_h4_tcp_s128K_b16_redis_exists", "exists")]


def test_lookup_rows_give_each_client_its_rate_and_the_directory_its_cpu():
    pl = cluster.place("fanout", HOSTS, 3)
    docs = {c: {"points": [dict(drive_doc(0, 0.0, 2.0)["points"][0], keys=k, threads=2, batch_size=16)]}
            for c, k in (("h2", 40000), ("h3", 20000))}
    # the keys stand in for bytes: the shared window's rate is lookups/s
    agg = aggregate_window({c: WindowBytes(d["points"][0]["keys"], 0.0, 2.0) for c, d in docs.items()})
    cpu = {"h1/directory": {"cores": 0.75, "seconds": 2.0}, "h2/consumer": {"cores": 1.0, "seconds": 2.0}}
    rows = cluster.lookup_rows(pl, docs, agg, cpu, {h: h for h in pl.hosts}, CTX, ["h1/directory"])
    by = {(r.metric, r.side, r.devices): r for r in rows}
    total = by[("lookup_rate", "aggregate", "h2,h3")]
    assert total.value == pytest.approx(30000.0) and total.unit == "ops/s"
    assert total.extra["clients"] == 4 and total.extra["directory_cores"] == 0.75
    assert total.extra["directory_host"] == "h1" and "directory" not in total.extra   # the kind stays the ctx's
    assert by[("lookup_rate", "per_host", "h3")].value == pytest.approx(10000.0)
    assert by[("jain_index", "aggregate", "h2,h3")].value == pytest.approx(0.9)
    assert by[("latency_p99", "per_host", "h2")].value == 400.0
    assert not any(r.metric in ("get_throughput", "verify_failures") for r in rows)
