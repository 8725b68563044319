"""`make bench` driver: argument bounds and the memcpy baseline (no timing assertions)."""
import pytest

from peercache.lab import ratios
from peercache.transport.base import native_module


@pytest.mark.parametrize("argv", [["--rounds", "9"], ["--duration", "0"], ["--duration", "60"],
                                  ["--warmup", "-1"]])
def test_unbounded_runs_are_refused(argv, capsys):
    with pytest.raises(SystemExit) as e:
        ratios.main(argv)
    assert e.value.code == 2
    assert "must be" in capsys.readouterr().err


@pytest.mark.skipif(native_module()[0] is None, reason="native module not built")
def test_memcpy_baseline_reports_a_positive_rate():
    from peercache.lab.tools import memcpy
    assert memcpy.measure(4096, 64, 8, 0.05)["bytes_per_s"] > 0


def test_the_bench_is_a_scenario_of_point_kinds_in_paired_rounds():
    bp = ratios.plan(rounds=2, duration=1.5, warmup=0.5)
    assert bp.testbed["duration"] == 1.5 and bp.testbed.name == "bench"
    kinds = {part: p.kind for part, p in bp.points.items()}
    assert kinds["memcpy_128k"] == "memcpy" and kinds["iperf3_tcp_128k"] == "iperf3"
    assert kinds["node_api_pages_per_s_64b"] == "node_api" and kinds["peercache_tcp_128k"] == "peercache"
    order = [(p.part, k) for p, k in bp.schedule]
    # each round: the baseline, then the PeerCache figure just after it
    i = order.index(("memcpy_128k", 1))
    assert order[i + 1] == ("peercache_shm_128k", 1) and order[i - 1] == ("peercache_shm_integrity_128k", 0)
    # the verified and integrity twins right after the unverified run of the same round (over tcp, after
    # the metrics-on twin)
    assert order[i + 2:i + 4] == [("peercache_shm_verified_128k", 1), ("peercache_shm_integrity_128k", 1)]
    j = order.index(("peercache_tcp_128k", 0))
    assert order[j + 2:j + 4] == [("peercache_tcp_verified_128k", 0), ("peercache_tcp_integrity_128k", 0)]
    # checks, the 64 B drive and the two traced GETs once; in each of the 2 rounds: the shm four, the tcp seven,
    # the node loop, the library's two batch reads, drive and HiCache, the six latency points, the six lookup points
    assert order.count(("drive_pages_per_s_64b", 0)) == 1 and len(order) == 3 + 2 + 2 * (4 + 7 + 1 + 2 + 2 + 6 + 6)
    # the latency breakdown last, alone: nothing else runs while its GETs are traced
    assert order[-2:] == [("trace_tcp_4k_cached", 0), ("trace_tcp_4k_uncached", 0)]
    assert {bp.points[p].kind for p in ratios.BREAKDOWNS.values()} == {"get_trace"}
    assert (bp.points["trace_tcp_4k_cached"].params["dir_cache_ttl"],
            bp.points["trace_tcp_4k_uncached"].params["dir_cache_ttl"]) == (3600, 0)
    # Mooncake, then NIXL first in each tcp round, at the tcp drive's shape
    assert order[j - 3:j] == [("mooncake_tcp_128k", 0), ("nixl_tcp_128k", 0), ("iperf3_tcp_128k", 0)]
    nx = bp.points["nixl_tcp_128k"]
    assert nx.kind == "nixl" and not nx.loopback and nx.params["verify"] is False
    assert (nx.params["page_size"], nx.params["batch_size"], nx.params["threads"], nx.params["protocol"],
            nx.params["working_set"]) == (131072, 32, 1, "tcp", 256)
    assert ratios.RATIOS["ours_vs_nixl_tcp_128k"] == ("peercache_tcp_128k", "nixl_tcp_128k")
    mc = bp.points["mooncake_tcp_128k"]
    assert mc.kind == "mooncake_te" and not mc.loopback
    assert (mc.params["page_size"], mc.params["batch_size"], mc.params["threads"], mc.params["protocol"]) == \
        (131072, 32, 1, "tcp")
    assert ratios.RATIOS["ours_vs_mooncake_tcp_128k"] == ("peercache_tcp_128k", "mooncake_tcp_128k")
    # the metrics-on twins right after the run without them
    assert order[j + 1] == ("peercache_tcp_metrics_128k", 0)
    assert bp.points["peercache_tcp_metrics_128k"].params["metrics_endpoint"] is True
    assert order[order.index(("peercache_tcp_4k_cached", 1)) + 1] == ("peercache_tcp_4k_cached_metrics", 1)
    # the 4 KiB GETs: both sockperf baselines first, the GET that sleeps at once measured as well
    k = order.index(("sockperf_tcp_4k", 1))
    assert order[k + 1] == ("sockperf_tcp_4k_busy", 1) and order[k + 5] == ("peercache_tcp_4k_cached_sleep", 1)
    assert bp.points["sockperf_tcp_4k_busy"].params["busy_poll"] is True
    assert "busy_poll" not in bp.points["sockperf_tcp_4k"].params
    assert bp.points["peercache_tcp_4k_cached_sleep"].params["tcp_poll_us"] == 0
    assert "tcp_poll_us" not in bp.points["peercache_tcp_4k_cached"].params
    # same-host shm figures on loopback; the tcp pair on the testbed's network namespaces
    assert bp.points["peercache_shm_128k"].loopback and not bp.points["peercache_tcp_128k"].loopback
    assert bp.points["iperf3_tcp_128k"].params["reverse"] is True
    assert bp.points["shm_128k_check"].params.get("verify", True) is True        # verified: the default
    assert bp.points["peercache_shm_128k"].params["verify"] is False           # the unverified baseline
    assert bp.points["peercache_tcp_integrity_128k"].params["integrity"] is True


def test_a_bench_without_a_measured_part_names_it(tmp_path):
    import yaml
    doc = yaml.safe_load(ratios.SCENARIOS_FILE.read_text())
    del doc["bench"]["local"]["memcpy_128k"]
    bad = tmp_path / "bench.yaml"
    bad.write_text(yaml.safe_dump(doc))
    from peercache.lab.pipeline.experiments import DefinitionError
    with pytest.raises(DefinitionError, match=r"no part\(s\) \['memcpy_128k'\]"):
        ratios.plan(1, 1.0, 0.5, scenarios_file=bad)


def test_figures_check_lines_and_ratio_verdicts_come_from_tidy_rows():
    from peercache.lab.tidy import Row
    ctx = dict(experiment="bench", scenario="bench", run_id="r")
    rows = [Row(metric="bw", value=2e10, unit="B/s", numa_node=0, **ctx),
            Row(metric="bw", value=1e10, unit="B/s", numa_node=1, **ctx)]
    assert ratios.figure(rows, "memcpy_128k") == 20.0                  # GB/s, the best NUMA node
    with pytest.raises(ratios.BenchError, match="peercache_shm_128k: no get_throughput measured: boom"):
        ratios.figure([Row(metric="get_throughput", value=None, unit="GB/s", status="failed", reason="boom",
                           **ctx)], "peercache_shm_128k")
    chk = [Row(metric=m, value=v, unit=u, **ctx) for m, v, u in
           (("keys", 10.0, "count"), ("hit_rate", 1.0, "ratio"), ("errors", 0.0, "count"),
            ("verify_failures", 0.0, "count"))]
    assert ratios.check_line("shm_128k", chk) == ("check shm_128k verify=on keys=10 hit_rate=1.0 errors=0 "
                                                  "verify_failures=0 status=ok")
    chk[-1].value = 2.0
    assert ratios.check_line("shm_128k", chk).endswith("verify_failures=2 status=failed")
    res = {"ratios": {"shm_vs_memcpy_128k": {"median": 0.8, "min": 0.7, "max": 0.9, "rounds": 3}}}
    df = ratios.ratio_rows(res, "bench/x/ratios", {"shm_vs_memcpy_128k": 0.9})
    assert list(df["verdict"]) == ["low"] and "0.8 < target 0.9" in df["verdict_reason"][0]


def test_every_ratio_has_a_target_in_the_references_data():
    from peercache.lab.analysis.references import load_bench_targets
    t = load_bench_targets()
    assert t == {"shm_vs_memcpy_128k": 0.9, "tcp_vs_iperf3_128k": 0.9, "pages_per_s_64b": 1e7, "ours_vs_mooncake_tcp_128k": 1.5,
                 "ours_vs_nixl_tcp_128k": 1.2,
                 "verify_vs_noverify_tcp_128k": 0.9, "verify_vs_noverify_shm_128k": 0.95,
                 "integrity_vs_off_128k": 0.85, "hicache_v1_vs_drive_128k": 0.95, "metrics_on_vs_off_tcp_128k": 0.95,
                 "dir_lookups_embedded_128": 2e6, "dir_lookups_redis_vs_mget_128": 0.8,
                 "dir_lookups_embedded_rpc_16384": 5e5, "get_batch_outs_vs_copy_4k": 1.0}
    most = load_bench_targets(bound="at_most")
    assert most["latency_4k_cached_vs_busy_rtt"] == 1.3 and most["latency_4k_uncached_vs_busy_rtt"] == 2.2
    # every ratio the bench prints has one, but the shm integrity figure (shown for what it costs there), the
    # GET that sleeps at once, and the figures shown beside their targeted twins
    assert set(ratios.RATIOS) - set(t) - set(most) == {
        "integrity_vs_off_shm_128k", "latency_4k_cached_sleep_vs_rtt", "dir_lookups_redis_vs_mget_fixed_128",
        "dir_lookups_embedded_rpc_128"}


def test_a_million_lookups_in_2_s_is_a_bench_bound_of_the_lookup_op_with_big_requests():
    """The bound a unit test held (a consumer's uncached lookup of 1e6 keys within 2 s) is make bench's:
    dirbench's lookup op alone, each request every published key, >= 5e5 keys/s."""
    from peercache.lab.analysis.references import load_bench_targets
    from peercache.rpc import Limits
    bp = ratios.plan(rounds=2, duration=1.5, warmup=0.5)
    big = bp.points["dirlookup_embedded_rpc_16384"]
    assert big.kind == "dirlookup" and big.loopback and "path" not in big.params         # --path rpc
    assert (big.params["directory"], big.params["clients"]) == ("embedded", 1)
    # one request per batch, of every published key
    assert big.params["batch"] == big.params["keys"] == 16384 <= Limits().max_keys_per_request
    assert ratios.RATIOS["dir_lookups_embedded_rpc_16384"] == ("dirlookup_embedded_rpc_16384", None)
    assert ratios.FIGURES["dirlookup_embedded_rpc_16384"] == ("keys_per_s", "ops/s")
    assert load_bench_targets()["dir_lookups_embedded_rpc_16384"] == 1e6 / 2.0
    order = [(p.part, k) for p, k in bp.schedule]
    assert all(order.index(("dirlookup_embedded_rpc_16384", k)) == order.index(("dirlookup_embedded_rpc_128", k)) + 1
               for k in range(2))
    # its verdict is the bound's: 4.9e5 keys/s is low, 5e5 is ok
    for median, verdict in ((4.9e5, "low"), (5e5, "ok")):
        res = {"ratios": {"dir_lookups_embedded_rpc_16384": {"median": median, "min": median, "max": median,
                                                             "rounds": 3}}}
        df = ratios.ratio_rows(res, "bench/x/ratios", load_bench_targets())
        assert list(df["verdict"]) == [verdict] and list(df["unit"]) == ["ops/s"]


def test_ratios_are_medians_of_paired_rounds():
    # PeerCache 9, 10, 20 against baselines 10, 10, 10: per-round 0.9, 1.0, 2.0 -> median 1.0, not best/best 2.0
    res = {"raw": {}, "ratios": {}, "rounds": {"pc": [9.0, 10.0, 20.0], "base": [10.0, 10.0, 10.0]}}
    ratios.paired(res, "x", "pc", "base")
    assert res["ratios"]["x"]["median"] == 1.0 and res["ratios"]["x"]["min"] == 0.9
    assert res["ratios"]["x"]["max"] == 2.0 and res["ratios"]["x"]["rounds"] == 3
    assert res["raw"] == {"base": 10.0, "pc": 10.0}
    with pytest.raises(ratios.BenchError, match="measured 0 in every round"):
        ratios.paired({"raw": {}, "ratios": {}, "rounds": {"pc": [1.0], "base": [0.0]}}, "y", "pc", "base")


def test_a_malformed_target_names_itself(tmp_path):
    from peercache.lab.analysis.references import load_bench_targets
    p = tmp_path / "refs.yaml"
    p.write_text("schema_version: 1\nbench_targets:\n  shm: 0.9\n")
    with pytest.raises(ValueError, match="bench_targets.shm must be"):
        load_bench_targets(p)


def test_the_librarys_two_batch_reads_are_points_of_the_rounds_each_measured_against_a_serve(tmp_path):
    """get_batch_outs_vs_copy_4k: the zero-copy Client.get_batch(keys, outs) over the copying get_batch(keys),
    two node_api points run back to back in each round, by the same harness as every other figure."""
    from peercache.lab.launch.hosts import LocalHost
    from peercache.lab.pipeline import runpoint
    assert ratios.RATIOS["get_batch_outs_vs_copy_4k"] == ("get_batch_outs_4k", "get_batch_copy_4k")
    bp = ratios.plan(rounds=2, duration=0.5, warmup=0.2, only=["get_batch_outs_vs_copy_4k"])
    assert [(pt.part, k) for pt, k in bp.schedule] == [("get_batch_copy_4k", 0), ("get_batch_outs_4k", 0),
                                                      ("get_batch_copy_4k", 1), ("get_batch_outs_4k", 1)]
    th = runpoint.TestbedHosts(LocalHost(), LocalHost(), "127.0.0.1", "127.0.0.1", None)
    point_rows = {}
    for pt, k in bp.schedule[:2]:
        assert pt.kind == "node_api" and pt.params["api"] in ("client", "client_outs")
        rows = runpoint.run_point(bp.testbed, pt, k, tmp_path / pt.name / "result.json", hosts=th, quiet=True)
        got = {r.metric: r for r in rows}
        assert got["pages_per_s"].status == "ok" and got["pages_per_s"].value > 0, rows
        assert got["pages_per_s"].extra["api"] == pt.params["api"]
        assert got["verify_failures"].value == 0 and got["verified_keys"].value > 0
        point_rows[(pt.part, k)] = rows
    res = {"raw": {}, "ratios": {}, "rounds": {}, "checks": []}
    ratios.summarise(res, point_rows, 1, only=["get_batch_outs_vs_copy_4k"])
    r = res["ratios"]["get_batch_outs_vs_copy_4k"]
    want = ratios.figure(point_rows[("get_batch_outs_4k", 0)], "get_batch_outs_4k") / \
        ratios.figure(point_rows[("get_batch_copy_4k", 0)], "get_batch_copy_4k")
    assert r["median"] == pytest.approx(want, rel=1e-3)


@pytest.mark.skipif(native_module()[0] is None, reason="native module not built")
def test_the_latency_breakdown_joins_both_sides_of_each_traced_get(tmp_path):
    """--only latency_breakdown: the two get_trace points, run by the same harness; each GET's timeline holds
    the client's points and the server's (joined by request id), and the uncached one its table read too."""
    from peercache.lab.launch.hosts import LocalHost
    from peercache.lab.pipeline import runpoint
    bp = ratios.plan(rounds=3, duration=0.5, warmup=0.2, only=[ratios.ONLY_BREAKDOWN])
    assert [(pt.part, k) for pt, k in bp.schedule] == [("trace_tcp_4k_cached", 0), ("trace_tcp_4k_uncached", 0)]
    th = runpoint.TestbedHosts(LocalHost(), LocalHost(), "127.0.0.1", "127.0.0.1", None)
    point_rows = {}
    for pt, k in bp.schedule:
        pt.params["gets"] = 300
        out = tmp_path / pt.name / "result.json"
        point_rows[(pt.part, k)] = runpoint.run_point(bp.testbed, pt, k, out, hosts=th, quiet=True)
        assert (out.parent / "breakdown.json").exists() and (out.parent / "trace.server.json").exists()
    res = {"raw": {}, "ratios": {}, "rounds": {}, "checks": []}
    ratios.summarise(res, point_rows, 1, only=[ratios.ONLY_BREAKDOWN])
    for name, b in res["breakdowns"].items():
        assert b["untraced_p50_us"] > 0 and b["traced_p50_us"] > 0 and b["joined"] >= 150, b
        segs = [p["segment"] for p in b["parts"]]
        assert segs[0].startswith("call -> ") and segs[-1].endswith(" -> return")
        # the server's handling of the data read is inside the client's timeline
        assert any(s.endswith("srv_body -> reply_head") for s in segs), segs
        assert all(p["p50_us"] >= 0 for p in b["parts"])
        assert sum(p["share"] for p in b["parts"] if p["share"] is not None) == pytest.approx(1)
        # the two send calls, off the path, within the segment they fall in
        assert [p["label"] for p in b["parts"] if p["share"] is None][-2:] == [
            "of which the client's send call", "of which the server's sendmsg"], b["parts"]
        lines = ratios.breakdown_lines(name, b)
        assert lines[0].startswith(f"breakdown {name}: p50 ") and len(lines) == 1 + len(b["parts"])
    cached, uncached = (res["breakdowns"][n]["parts"] for n in ("tcp_4k_cached", "tcp_4k_uncached"))
    assert not any(p["label"].startswith("table read:") for p in cached)
    assert any(p["label"] == "table read: server: the request read and checked" for p in uncached), uncached


def test_the_bench_says_where_its_tcp_parts_ran_and_on_which_cpus():
    from peercache.lab.launch.hosts import LocalHost, NetnsHost
    from peercache.lab.pipeline import runpoint
    pinned = runpoint.TestbedHosts(NetnsHost("pcbencha").pin("0"), NetnsHost("pcbenchb").pin("1"),
                                   "198.18.78.1", "198.18.78.2", None)
    assert ratios.path_notes(pinned) == ["tcp path: netns pcbencha (198.18.78.1) -> pcbenchb (198.18.78.2) over "
                                         "veth; producer on CPU 0, consumer on CPU 1"]
    lacking = runpoint.TestbedHosts(NetnsHost("pcbencha").pin("0"), NetnsHost("pcbenchb"), "198.18.78.1",
                                    "198.18.78.2", "netns:pcbenchb: CPUs 1 asked for, ... runs unpinned")
    assert ratios.path_notes(lacking) == [
        "tcp path: netns pcbencha (198.18.78.1) -> pcbenchb (198.18.78.2) over veth; producer on CPU 0, "
        "consumer unpinned", "netns:pcbenchb: CPUs 1 asked for, ... runs unpinned"]
    fallback = runpoint.TestbedHosts(LocalHost(), LocalHost(), "127.0.0.1", "127.0.0.1", "no root")
    assert ratios.path_notes(fallback) == ["tcp over loopback 127.0.0.1, not netns: no root"]
