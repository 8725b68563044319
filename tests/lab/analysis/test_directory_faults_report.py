"""The directory_faults scenario's report from rows the kind makes (its pure row builder, from reconstructed
drive timelines, watcher samples and fault records): a figure per form with a panel per fault, a table row
per point, an overview row per form, and a conclusion per fault."""
import pandas as pd

from peercache.lab.analysis import charts, collect
from peercache.lab.analysis.scenarios import REPORTS
from peercache.lab.launch.runners import WindowBytes, aggregate_window
from peercache.lab.pipeline.points import directory_faults as df


def fault_point(form: str, fault: str, rates: list, found: list, fault_at: float = 1.0,
                record: dict | None = None, wrong: int = 0) -> list[dict]:
    """One point's rows: two consumers at ``rates`` per 100 ms bucket, the watcher's ``found`` per 100 ms, both
    from t=100 s; the fault ``fault_at`` s into the window."""
    run = f"local/directory_faults/dirfault_{form}_{fault}/rep0"
    ctx = {"experiment": "local", "testbed": "local", "scenario": "directory_faults", "run_id": run, "repetition": 0,
           "tool": "peercache-bench", "protocol": "tcp", "layout": "mla", "size_bytes": 16384, "batch": 8,
           "threads": 1, "processes": 1, "extra": {"form": form, "fault": fault, "what": df.FAULT_TEXT[(form, fault)]}}
    b = [{"t": i / 10, "keys": 0 if r is None else 100, "hits": 0 if r is None else int(100 * r), "misses": 0,
          "errors": 0 if r is None else 100 - int(100 * r), "verify_failures": 0,
          "bytes": 0 if r is None else int(100 * r) * 16384} for i, r in enumerate(rates)]
    tl = {"bucket_ms": 100, "start": 100.0, "max_stall_s": 0.3, "fault_bound_s": 3.0, "buckets": b}
    docs = {c: {"points": [{"status": "ok", "bytes": 1e8, "keys": 1000, "hit_rate": 0.9, "verify_failures": wrong,
                            "errors": 5, "verified": True, "timeline": tl}]} for c in ("consumer1", "consumer2")}
    agg = aggregate_window({c: WindowBytes(1e8, 100.0, 100.0 + len(rates) / 10) for c in docs})
    samples = [{"t": 100.0 + i / 10, **({"error": "DiscoveryUnreachable: x"} if f is None else
                                         {"found": f, "keys": 512})} for i, f in enumerate(found)]
    events = [{"event": "restart", "group": "directory", "t": 100.0 + fault_at},
              {"event": "back", "group": "directory", "t": 100.0 + fault_at + 1.2}]
    rows = df.fault_rows(docs, agg, dict(record or {}, t=100.0 + fault_at), events, samples, ctx, "consumer",
                         "producer", len(rates) / 10, {"pA": 1, "pB": 1} if fault == "restart" else {})
    return [r.to_dict() for r in rows]


def rows() -> pd.DataFrame:
    recs = (fault_point("embedded", "restart", [1.0] * 10 + [None] * 12 + [0.0] * 3 + [1.0] * 25,
                        [512] * 10 + [None] * 12 + [0] * 4 + [512] * 24)
            + fault_point("sentinel", "kill", [1.0] * 10 + [0.0] * 23 + [1.0] * 17, [512] * 10 + [None] * 23 + [512] * 17)
            + fault_point("sentinel", "stop", [1.0] * 10 + [None] * 30 + [1.0] * 10 + [0.0] * 20 + [1.0] * 10,
                          [512] * 10 + [None] * 30 + [512] * 10 + [0] * 20 + [512] * 10,
                          record={"role": "slave", "demoted_s": 10.1, "stopped_s": 3.5})
            + fault_point("sentinel", "failover", [1.0] * 50, [512] * 50))
    return collect.normalize_rows(pd.DataFrame(recs))


def test_a_figure_per_form_with_a_panel_per_fault_and_a_table_row_per_point():
    built = {c.name: c for c in charts.build_scenario("directory_faults", rows(), pd.DataFrame(columns=["run_id"]),
                                                      None)}
    assert set(built) == {"directory_faults_embedded", "directory_faults_redis", "directory_faults_sentinel",
                          "directory_faults_rediscluster"}
    assert not hasattr(built["directory_faults_redis"], "fig")            # no redis point: not drawn, saying why
    sentinel = built["directory_faults_sentinel"]
    assert len(sentinel.fig.axes) == 6                                    # 3 panels, each with its GB/s axis
    assert [t["fault"] for t in sentinel.table] == ["master SIGKILLed",
                                                    "master SIGSTOPped past the failover timeout, then SIGCONT",
                                                    "SENTINEL FAILOVER"]
    kill, stop, failover = sentinel.table
    assert (kill["unavailable (s)"], kill["recovered (s)"], kill["entries lost / republished"], kill["wrong pages"]) == (
        "2.3", "2.3", "0 / 0 of 512", 0)
    assert stop["old master's role"] == "slave after 10.1 s" and stop["unavailable (s)"] == "5.0"
    assert failover["unavailable (s)"] == "0.0" and failover["longest stall (s, bound)"] == "0.30 (3)"
    emb = built["directory_faults_embedded"].table[0]
    assert emb["entries lost / republished"] == "512 / 512 of 512" and emb["recovered (s)"] == "1.5"
    assert emb["reads"] == "tcp"      # the data path the fault was read over (tcp, shm or rdma)
    # the fault is marked in every panel
    assert all(any(line.get_linestyle() == "--" for line in ax.get_lines()) for ax in sentinel.fig.axes[:3])    # the panels; their GB/s axes follow


def test_the_overview_has_a_row_per_form():
    r = rows()
    bw = r[(r["status"] == "ok") & (r["metric"] == "get_throughput")]
    over = REPORTS["directory_faults"].overview("directory_faults", r, r, bw, {})
    assert [o["scenario"] for o in over] == ["directory_faults: embedded (peercache-bench meta)",
                                             "directory_faults: Redis Sentinel (master, replica, 3 sentinels)"]
    assert "kill (tcp): unavailable 2.3 s, back in 2.3 s, entries lost/republished 0/0, 0 wrong" in over[1]["notes"]
    assert "stop (tcp): unavailable 5.0 s" in over[1]["notes"] and over[1]["run"].count("rep0") == 3


def test_the_conclusions_say_what_each_form_survived():
    text = "\n".join(c.text for c in REPORTS["directory_faults"].conclusions(rows(), {}))
    assert ("embedded (peercache-bench meta), meta SIGKILLed, started again at the same address, pages read over "
            "tcp: reads failed or missed for 1.5 s") in text
    assert "stopped resolving 512 of 512 entries and resolved all of them again" in text
    assert "registered again and republished (pA 1x, pB 1x)" in text
    assert "in 2 stretches (1.0–4.0 s, 5.0–7.0 s into the window)" in text
    assert "the old master came back as a slave 10.1 s after SIGCONT" in text
    assert "SENTINEL FAILOVER, pages read over tcp: no read failed or missed; no entry was lost; 0 wrong pages" in text
    assert "Wrong pages: none in 4 faults of 2 forms" in text


def test_wrong_pages_are_named():
    recs = collect.normalize_rows(pd.DataFrame(fault_point("sentinel", "kill", [1.0] * 20, [512] * 20, wrong=2)))
    text = "\n".join(c.text for c in REPORTS["directory_faults"].conclusions(recs, {}))
    assert "Wrong pages: 4 in 1 faults" in text and "(in sentinel kill)" in text
