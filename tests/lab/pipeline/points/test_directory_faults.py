"""The directory_faults kind's pure parts: its grid, the timeline's judgement (unavailable, recovered, the
stretches), the watcher's entries around the fault, the Redis answers it picks its targets from, and the
rows of a point from reconstructed drive documents, watcher samples and events."""
from __future__ import annotations

import pytest

from peercache.lab.launch.runners import WindowBytes, aggregate_window
from peercache.lab.pipeline import experiments
from peercache.lab.pipeline.points import directory_faults as df
from peercache.lab.tools import dirwatch

CTX = {"experiment": "local", "testbed": "local", "scenario": "directory_faults", "run_id": "local/df/p/rep0",
       "repetition": 0, "tool": "peercache-bench", "protocol": "tcp", "layout": "mla", "size_bytes": 16384,
       "batch": 8, "threads": 1, "processes": 1, "extra": {"form": "sentinel", "fault": "kill", "what": "x"}}


def buckets(rates: list[float | None], keys: int = 100) -> list[dict]:
    """100 ms buckets of ``keys`` keys each at the hit rates given (None: nothing completed)."""
    return [{"t": round(i / 10, 3), "keys": 0 if r is None else keys, "hits": 0 if r is None else int(r * keys),
             "misses": 0, "errors": 0 if r is None else keys - int(r * keys), "verify_failures": 0,
             "bytes": 0 if r is None else int(r * keys) * 16384} for i, r in enumerate(rates)]


def test_each_form_runs_its_own_faults_and_names_them():
    part = {"kind": "directory_faults", "form": list(df.FORMS), "duration": 4}
    pts = experiments.expand_part("directory_faults", "p", part, [])
    assert [p.name for p in pts] == [
        "dirfault_embedded_restart_tcp_s16K_b8", "dirfault_redis_restart_tcp_s16K_b8",
        "dirfault_sentinel_kill_tcp_s16K_b8", "dirfault_sentinel_stop_tcp_s16K_b8",
        "dirfault_sentinel_failover_tcp_s16K_b8", "dirfault_rediscluster_kill_tcp_s16K_b8",
        "dirfault_rediscluster_failover_tcp_s16K_b8"]
    assert pts[0].params["duration"] == 4 and pts[0].params["consumers"] == 2
    # a fault no form of the part has gives no point
    assert experiments.expand_part("directory_faults", "p", {"kind": "directory_faults", "form": ["embedded"],
                                                             "fault": ["kill"]}, []) == []


def test_the_scenario_runs_on_the_local_testbed_with_every_form_and_fault():
    sc = experiments.load_scenarios()
    names = [p.name for part, d in sc["directory_faults"]["local"].items()
             for p in experiments.expand_part("directory_faults", part, d, [])]
    # every fault of every form read over tcp, and the restarts and kills over shm too
    tcp = {n for n in names if "_tcp_" in n}
    assert len(tcp) == 7 and {n.replace("_tcp_", "_shm_") for n in tcp if "_restart_" in n or "_kill_" in n} \
        == {n for n in names if "_shm_" in n}
    assert len(names) == len(set(names)) == 11
    tb = experiments.load_testbed("experiments/testbeds/local.yaml", sc)
    assert "directory_faults" in tb["scenarios"]


def test_an_outage_its_recovery_and_the_window_end():
    # 1.0 for 1 s, the fault at 1.0 s, nothing for 0.5 s, misses for 0.3 s, then back
    b = buckets([1.0] * 10 + [None] * 5 + [0.0] * 3 + [1.0] * 12)
    assert df.level_before(b, 1.0, 0.1) == 1.0
    j = df.judge(b, 1.0, 0.1, 1.0)
    assert j["unavailable_s"] == pytest.approx(0.8) and j["recovery_s"] == pytest.approx(0.8)
    assert j["outages"] == [[1.0, 1.8]]
    # a second outage later: two stretches, recovered only after the second
    b2 = buckets([1.0] * 10 + [0.0] * 3 + [1.0] * 5 + [0.5] * 4 + [1.0] * 8)
    j2 = df.judge(b2, 1.0, 0.1, 1.0)
    assert j2["outages"] == [[1.0, 1.3], [1.8, 2.2]] and j2["recovery_s"] == pytest.approx(1.2)
    # never back by the window's end; an empty last (partial) bucket is left out
    j3 = df.judge(buckets([1.0] * 10 + [0.0] * 10 + [None]), 1.0, 0.1, 1.0)
    assert j3["recovery_s"] is None and j3["unavailable_s"] == pytest.approx(1.0)
    # a hit rate within the tolerance of its level is not an outage
    assert df.judge(buckets([0.99] * 10 + [0.98] * 10), 1.0, 0.1, 0.99)["unavailable_s"] == 0


def test_entries_lost_and_republished_from_the_watcher():
    s = ([{"t": 10 + i / 10, "found": 512, "keys": 512} for i in range(10)]
         + [{"t": 11.05, "error": "DiscoveryUnreachable: ..."}]
         + [{"t": 11.2 + i / 10, "found": 0 if i < 3 else 256 if i < 5 else 512, "keys": 512} for i in range(10)]
         + [{"t": 30.0, "found": 0, "keys": 512}])                    # after the window: the producers left
    e = df.entries(s, 11.0, 20.0)
    assert (e["before"], e["trough"], e["end"], e["lost"], e["republished"]) == (512, 0, 512, 512, 512)
    assert e["back_s"] == pytest.approx(0.2) and e["republished_s"] == pytest.approx(0.7)
    assert e["errors_after"] == 1
    kept = df.entries([{"t": 10.0, "found": 512, "keys": 512}, {"t": 12.0, "found": 512, "keys": 512}], 11.0, 20.0)
    assert kept["lost"] == 0 and kept["republished"] == 0
    assert "after the fault" in df.entries(s[:10], 11.0, 20.0)["why"]


def test_a_producer_the_directory_forgot_lost_every_entry_though_it_republished_before_the_watcher_looked():
    """The fault CI caught: the restarted directory forgot both producers; pA republished at its heartbeat
    before the watcher's first answer from the new directory, so the watcher never saw pA's entries missing.
    pA's own word (registered again) counts them lost; pB's loss the watcher saw."""
    def s(t, a, b):
        return {"t": t, "found": a + b, "keys": 128, "by": {"pA": a, "pB": b}}
    samples = ([s(10 + i / 10, 64, 64) for i in range(10)] + [{"t": 11.05, "error": "ConnectionError"}]
               + [s(11.2, 64, 0), s(11.3, 64, 0), s(11.4, 64, 64), s(11.5, 64, 64)])
    both = df.entries(samples, 11.0, 20.0, {"pA", "pB"})
    assert (both["before"], both["survived"], both["lost"], both["republished"], both["end"]) == (128, 0, 128, 128, 128)
    assert both["lost_by"] == {"pA": 64, "pB": 64} and both["trough"] == 64
    # without the producers' word, only what the watcher saw: pB's entries
    seen = df.entries(samples, 11.0, 20.0)
    assert (seen["lost"], seen["republished"], seen["lost_by"]) == (64, 64, {"pA": 0, "pB": 64})
    # per producer: pA missing at one sample and pB at another is both lost, though no sample missed both
    apart = [s(10.0, 64, 64), s(11.1, 0, 64), s(11.2, 64, 0), s(11.3, 64, 64)]
    assert df.entries(apart, 11.0, 20.0)["lost"] == 128


def test_the_redis_answers_that_pick_a_target():
    info = {"role": "master", "connected_slaves": "1",
            "slave0": "ip=198.18.77.1,port=42004,state=online,offset=100,lag=0"}
    assert df.parse_replicas(info) == [42004]
    assert df.busiest_master({"redis1": "master", "redis2": "slave", "redis3": "master"},
                             {"redis1": 170, "redis3": 184}) == "redis3"
    assert df.busiest_master({"redis1": "slave"}, {}) is None
    assert df.registered_again("WARNING peercache.node: discovery forgot node ab; registered again as node ab\n" * 2) == 2


def test_the_watchers_command_and_output():
    argv = dirwatch.command(["python3"], "10.0.0.1:5", ["pA", "pB"], 64)
    assert argv[:3] == ["python3", "-m", "peercache.lab.tools.dirwatch"]
    assert argv[argv.index("--key-prefix") + 1] == "pA,pB" and argv[argv.index("--working-set") + 1] == "64"
    text = ('{"t": 1.0, "found": 3, "keys": 4, "s": 0.01, "by": {"pA": 2, "pB": 1}}\n'
            'peercache dirwatch: watching 4 keys at x\n'
            '{"t": 1.1, "error": "DiscoveryUnreachable: gone"}\nnot json {\n{"other": 1}\n')
    assert dirwatch.parse(text) == [{"t": 1.0, "found": 3, "keys": 4, "s": 0.01, "by": {"pA": 2, "pB": 1}},
                                    {"t": 1.1, "error": "DiscoveryUnreachable: gone"}]


def point(rates: list[float | None], fault_s: float, samples: list[dict], fault: dict | None = None,
          stall: float = 0.2, ctx: dict = CTX) -> list:
    """The rows of a point whose two consumers each read at ``rates`` (100 ms buckets from t=100 s)."""
    tl = {"bucket_ms": 100, "start": 100.0, "max_stall_s": stall, "fault_bound_s": 3.0, "buckets": buckets(rates)}
    docs = {c: {"points": [{"status": "ok", "bytes": 1e8, "keys": 1000, "hit_rate": 0.8, "verify_failures": 0,
                            "errors": 40, "verified": True, "timeline": tl,
                            "first_error": "DiscoveryUnreachable: x"}]} for c in ("consumer1", "consumer2")}
    agg = aggregate_window({c: WindowBytes(1e8, 100.0, 100.0 + len(rates) / 10) for c in docs})
    f = dict(fault or {}, t=100.0 + fault_s)
    events = [{"event": "signal", "group": "master", "signal": "SIGKILL", "t": 100.0 + fault_s}]
    return df.fault_rows(docs, agg, f, events, samples, ctx, "consumer", "producer", len(rates) / 10,
                         {"pA": 0, "pB": 1})


def test_a_points_rows():
    samples = ([{"t": 100 + i / 10, "found": 512, "keys": 512, "by": {"pA": 256, "pB": 256}} for i in range(10)]
               + [{"t": 101.5 + i / 10, "found": 256 if i < 2 else 512, "keys": 512,
                   "by": {"pA": 256, "pB": 0 if i < 2 else 256}} for i in range(10)])
    rows = point([1.0] * 10 + [0.0] * 5 + [1.0] * 15, 1.0, samples)
    by = {(r.metric, r.side, r.devices): r for r in rows}
    agg = "consumer1,consumer2"
    assert by[("verify_failures", "aggregate", agg)].value == 0
    assert by[("errors", "aggregate", agg)].value == 80
    un = by[("unavailable_s", "aggregate", agg)]
    assert un.value == pytest.approx(0.5) and un.extra["fault_s"] == 1.0 and un.extra["level_before"] == 1.0
    assert len(un.extra["timeline"]) == 30 and un.extra["timeline"][0][1] == 1.0 and un.extra["events"][0]["t"] == 1.0
    assert un.extra["watch"][0] == [0.0, 512] and un.extra["outages"] == [[1.0, 1.5]]
    assert by[("recovery_s", "aggregate", agg)].value == pytest.approx(0.5)
    assert (by[("entries_lost", "aggregate", agg)].value, by[("entries_republished", "aggregate", agg)].value) == (256, 256)
    assert by[("entries_lost", "aggregate", agg)].extra["registered_again"] == {"pA": 0, "pB": 1}
    assert by[("republished_s", "aggregate", agg)].value == pytest.approx(0.7)
    stall = by[("max_stall_s", "per_host", "consumer1")]
    assert stall.value == 0.2 and stall.extra["within_bound"] is True and stall.extra["bound_s"] == 3.0
    assert not any(r.metric == "old_master_demoted_s" for r in rows)
    assert all(r.status == "ok" for r in rows)


def test_a_stopped_masters_role_and_a_hit_rate_that_never_came_back():
    rows = point([1.0] * 10 + [None] * 20, 1.0, [], {"role": "slave", "demoted_s": 10.1, "stopped_s": 3.5},
                 stall=3.2, ctx=dict(CTX, extra={"form": "sentinel", "fault": "stop", "what": "x"}))
    by = {(r.metric, r.side): r for r in rows}
    assert by[("old_master_demoted_s", "aggregate")].value == 10.1
    assert by[("old_master_demoted_s", "aggregate")].extra["role"] == "slave"
    # nothing read after the fault: unavailable to the window's end (its empty last bucket left out)
    assert by[("unavailable_s", "aggregate")].value == pytest.approx(1.9)
    assert by[("recovery_s", "aggregate")].status == "not_measured"
    assert "did not come back" in by[("recovery_s", "aggregate")].reason
    assert by[("entries_lost", "aggregate")].status == "not_measured"
    assert by[("max_stall_s", "per_host")].extra["within_bound"] is False
    never = point([1.0] * 10 + [None] * 20, 1.0, [], {"role": "master", "demoted_s": None})
    demoted = next(r for r in never if r.metric == "old_master_demoted_s")
    assert demoted.status == "not_measured" and "'master'" in demoted.reason


def test_no_read_before_the_fault_is_said_so():
    rows = point([None] * 10 + [1.0] * 10, 0.5, [])
    un = next(r for r in rows if r.metric == "unavailable_s")
    assert un.status == "not_measured" and "before the fault" in un.reason and un.extra["timeline"]
