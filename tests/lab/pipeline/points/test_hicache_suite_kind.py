"""The ``hicache_suite`` kind: the suite's strict parser over real documents (tests/fixtures/lab/hicache_suite/
README.md), the command lines the kind builds, the ``hicache`` scenario, and the report's section and figure
over a collected frame."""
import json
from pathlib import Path

import pytest

from peercache.lab.errors import ParseError
from peercache.lab.launch.hosts import LocalHost
from peercache.lab.pipeline import experiments, runpoint
from peercache.lab.pipeline.points.hicache_suite import HiCacheSuiteRun
from peercache.lab.tidy import RunMeta, write_result
from peercache.lab.tools import hicache_suite as suite

ROOT = Path(__file__).resolve().parents[4]
FIX = ROOT / "tests/fixtures/lab/hicache_suite"
MLA, MHA = "suite_netns_tcp_mla_s128K_b128_c1-2.json", "suite_netns_tcp_mha_s128K_b128_c1-2.json"
RANK1 = "suite_loopback_tcp_mla_rank1of2_get-set.json"


def _read(name: str) -> str:
    return (FIX / name).read_text()


# -- the parser ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, layout, objs, peaks", [(MLA, "mla", 1, {"get": 1, "set": 1, "exists": 1}),
                                                       (MHA, "mha", 2, {"get": 2, "set": 1, "exists": 1})])
def test_parse_a_real_suite_document(name, layout, objs, peaks):
    res = suite.parse_document(_read(name), source=name)
    assert (res.layout, res.objects_per_page, res.object_bytes, res.page_tokens, res.batch_size) == \
        (layout, objs, 131072, 64, 128)
    assert res.status == "ok" and res.error is None and res.is_storage_writer
    assert [(p.op, p.threads) for p in res.points] == [(o, t) for o in ("get", "set", "exists") for t in (1, 2)]
    assert {p.op: p.threads for p in res.points if p.peak} == peaks
    doc = json.loads(_read(name))
    for p, raw in zip(res.points, doc["points"]):
        assert p.pages_per_s == raw["pages_per_s"] and p.latency_us == raw["latency_us"]
        assert p.status == "ok" and p.window_end > p.window_start
        assert (p.gb_per_s is None) == (p.op == "exists")
        assert (p.roundtrip is not None) == (p.op == "set")
    # the same PEAK the suite printed in its table
    if name == MLA:
        table = (FIX / "suite_netns_tcp_mla_s128K_b128_c1-2.log").read_text()
        for p in (p for p in res.points if p.peak):
            line = next(line for line in table.splitlines() if line.startswith(p.op) and " PEAK " in line)
            assert line.split()[4] == f"{p.pages_per_s:.0f}" and f"PEAK (threads={p.threads})" in line


def test_a_non_writer_ranks_set_points_are_skipped_with_sglangs_reason():
    res = suite.parse_document(_read(RANK1))
    assert not res.is_storage_writer and (res.tp_rank, res.tp_size) == (1, 2)
    sets = [p for p in res.points if p.op == "set"]
    assert sets and all(p.status == "skipped" and "not the storage writer" in p.reason and not p.peak for p in sets)
    rows = suite.to_rows(res, experiment="t", scenario="hicache", run_id="t/hicache/x/rep0", tool=suite.TOOL)
    skipped = [r for r in rows if r.extra["op"] == "set" and r.metric in suite.METRICS and r.unit != "count"]
    assert skipped and all(r.status == "skipped" and r.value is None for r in skipped)
    assert any(r.extra["peak"] and r.extra["op"] == "get" and r.threads == 2 for r in rows)


def test_rows_carry_every_figure_in_its_unit_and_exists_has_no_gb_per_s():
    res = suite.parse_document(_read(MLA))
    rows = suite.to_rows(res, experiment="t", scenario="hicache", run_id="t/hicache/x/rep0", tool=suite.TOOL,
                         protocol="tcp")
    assert len(rows) == 6 * len(suite.METRICS)
    for r in rows:
        assert r.unit == suite.METRICS[r.metric] and r.layout == "mla" and r.size_bytes == 131072 and r.batch == 128
    ex_gbs = [r for r in rows if r.extra["op"] == "exists" and r.metric == "store_throughput"]
    assert ex_gbs and all(r.status == "not_measured" and "no page bytes" in r.reason for r in ex_gbs)
    get1 = {r.metric: r.value for r in rows if r.extra["op"] == "get" and r.threads == 1}
    assert get1["store_tokens_per_s"] == pytest.approx(get1["store_pages_per_s"] * 64, rel=1e-3)


def _doc(name=MLA) -> dict:
    return json.loads(_read(name))


@pytest.mark.parametrize("change, match", [
    (lambda d: d["points"][0].update(pages_per_s=d["points"][0]["pages_per_s"] * 2), "pages_per_s .* disagrees"),
    (lambda d: d["points"][0].update(gb_per_s=d["points"][0]["gb_per_s"] + 0.1), "gb_per_s .* disagrees"),
    (lambda d: d["points"][4].update(gb_per_s=1.0), "exists moves no page bytes"),
    (lambda d: d["points"][0].update(tokens=1), "tokens is not"),
    (lambda d: d["points"][0].pop("window_start"), "no 'window_start'"),
    (lambda d: d["points"][0]["latency_us"].update(p50=1e9), "not p50 <= p99 <= p999"),
    (lambda d: d["points"][0].update(status="weird"), "status 'weird'"),
    (lambda d: d["points"][0].update(status="failed"), "without a reason"),
    (lambda d: d["ops"]["get"]["peak"].update(threads=2), "is not one ok point|not the ok point with the most"),
    (lambda d: d["ops"]["get"].update(peak=None), "no PEAK"),
    (lambda d: d["ops"].pop("set"), "no block for set"),
    (lambda d: d.update(mode="hicache-drive"), "not a hicache suite document"),
    (lambda d: d.update(status="failed"), "without an error"),
    (lambda d: d["meta"].pop("page_tokens"), "no 'page_tokens'"),
    (lambda d: d["points"][0].update(threads=True), "not <class 'int'>|not a number"),
])
def test_the_parser_refuses_what_is_not_one_consistent_suite(change, match):
    doc = _doc()
    change(doc)
    with pytest.raises(ParseError, match=match):
        suite.parse_document(json.dumps(doc), source="x.json")


def test_the_parser_refuses_text_that_is_not_json():
    with pytest.raises(ParseError, match=r"peercache-hicache-suite output \(out.json\): not JSON"):
        suite.parse_document("hicache suite: point 1/6", source="out.json")


def test_a_failed_suite_document_keeps_its_points_and_its_error():
    doc = _doc()
    doc["status"], doc["error"] = "failed", "exists threads=2: thread 0 failed in batch_exists: boom"
    doc["points"][5].update(status="failed", reason="thread 0 failed in batch_exists: boom")
    res = suite.parse_document(json.dumps(doc))
    assert res.status == "failed" and "boom" in res.error
    rows = suite.to_rows(res, experiment="t", scenario="hicache", run_id="r", tool=suite.TOOL)
    bad = [r for r in rows if r.extra["op"] == "exists" and r.threads == 2 and r.unit != "count"]
    assert bad and all(r.status == "failed" and "boom" in r.reason for r in bad)


# -- the command lines -----------------------------------------------------------------------------

def test_suite_command_is_a_pure_function_of_its_knobs():
    argv = suite.suite_command(["py", "-m", suite.MODULE], ["--protocol", "tcp"], batch=128, concurrencies=[1, 2, 4],
                               ops=["get", "set"], page_tokens=32, duration=1.5, warmup=0.3, out_path="/tmp/o.json",
                               verify=False, tp_size=2, tp_rank=1, dir_cache_ttl=0, max_calls=10, ready_timeout=90)
    assert argv[:5] == ["py", "-m", suite.MODULE, "suite", "--protocol"]
    s = " ".join(argv)
    for part in ("--batch-size 128", "--concurrencies 1,2,4", "--ops get,set", "--page-tokens 32", "--duration 1.5",
                 "--warmup 0.3", "--tp-size 2 --tp-rank 1", "--no-verify", "--dir-cache-ttl 0", "--max-calls 10",
                 "--ready-timeout 90"):
        assert part in s, part
    assert argv[-2:] == ["--out", "/tmp/o.json"] and "--integrity" not in argv


@pytest.mark.parametrize("kw, match", [({"concurrencies": []}, "concurrencies"), ({"concurrencies": [0]}, "concurrencies"),
                                       ({"ops": ["get", "get"]}, "ops"), ({"ops": ["put"]}, "ops"),
                                       ({"tp_rank": 2, "tp_size": 2}, "not a rank"), ({"duration": 0}, "duration")])
def test_suite_command_refuses_knobs_the_suite_would_refuse(kw, match):
    args = dict(batch=128, concurrencies=[1], ops=["get"], page_tokens=64, duration=1.0, warmup=0.0, out_path="o")
    with pytest.raises(ValueError, match=match):
        suite.suite_command(["py"], [], **{**args, **kw})


def _local_points():
    sc = experiments.load_scenarios()
    tb = experiments.load_testbed(ROOT / "experiments/testbeds/local.yaml", sc)
    tb.doc["scenarios"] = ["hicache"]
    return tb, experiments.expand(tb, sc)


def test_the_local_hicache_scenario_is_reduced_and_both_layouts():
    tb, pts = _local_points()
    assert [(p.kind, p.params["layout"]) for p in pts] == [("hicache_suite", "mla"), ("hicache_suite", "mha")]
    for p in pts:
        assert p.params["concurrencies"] == [1, 2] and p.params["ops"] == ["get", "set", "exists"]
        assert (p.params["duration"], p.params["warmup"], p.params["working_set"]) == (1, 0.3, 512)
        assert p.params["batch_size"] == 128 and p.params["page_tokens"] == 64 and p.params["protocol"] == "tcp"
        assert HiCacheSuiteRun.windows(p.params) == 6


def test_the_kind_builds_serve_and_the_suite_with_one_geometry(tmp_path):
    tb, pts = _local_points()
    pt = next(p for p in pts if p.params["layout"] == "mha")
    pr = runpoint.PointRun(tb, pt, 0, tmp_path)
    th = runpoint.TestbedHosts(LocalHost(), LocalHost(), "198.18.77.1", "198.18.77.2", None)
    serve, argv = HiCacheSuiteRun.command(pr, th, 42007, "/tmp/s.json")
    geometry = ["--discovery-addr", "198.18.77.1:42007", "--protocol", "tcp", "--layout", "mha", "--page-size",
                "131072", "--working-set", "512"]
    assert serve[serve.index("serve") + 1:][:len(geometry)] == geometry
    assert argv[argv.index("suite") + 1:][:len(geometry)] == geometry
    assert argv[argv.index("suite") - 2:argv.index("suite")] == ["-m", suite.MODULE]
    s = " ".join(argv)
    assert "--concurrencies 1,2 --ops get,set,exists --page-tokens 64 --duration 1 --warmup 0.3" in s
    assert argv[-2:] == ["--out", "/tmp/s.json"]
    # the harness waits for all six windows: serve's --max-wait and the client's timeout
    assert pr.timeout == pytest.approx((60 + 4 * 6 * 1.3) * pr.slow)
    assert serve[serve.index("--max-wait") + 1] == str(int(pr.timeout))


# -- the report's section and figure -----------------------------------------------------------------

def _collected(tmp_path, busiest: float):
    """Both real documents as the kind turns them into rows, written as two points' results and collected;
    each pages/s row with CPU evidence (its consumer's busiest thread at ``busiest`` of a core)."""
    from peercache.lab.analysis import collect
    raw = tmp_path / "raw"
    expected = []
    for name in (MLA, MHA):
        res = suite.parse_document(_read(name), source=name)
        point = f"hcs_tcp_{res.layout}_s128K_b128_c1-2"
        run_id = f"t/hicache/{point}/rep0"
        rows = suite.to_rows(res, experiment="t", testbed="t", scenario="hicache", run_id=run_id, tool=suite.TOOL,
                             side="client", protocol="tcp")
        for r in rows:
            if r.metric == suite.PRIMARY:
                r.extra = dict(r.extra, cpu={"consumer": {"cores": busiest, "busiest_thread": busiest},
                                             "producer": {"cores": 0.05, "busiest_thread": 0.05}})
        meta = RunMeta(run_id=run_id, testbed="t", experiment="t", scenario="hicache", point=point, repetition=0,
                       hosts={"consumer": {"host": "vm", "threads": 8}, "producer": {"host": "other", "threads": 8}},
                       commands={}, start="2026-12-02T16:00:00+00:00", end="2026-12-02T16:00:30+00:00",
                       git_revision="abc", params={"kind": "hicache_suite"})
        write_result(raw / "t" / "hicache" / point / "rep0" / "result.json", meta, rows)
        expected.append(f"hicache/{point}/rep0")
    collect.collect_testbed(raw, tmp_path / "tidy", "t", expected)
    return tmp_path / "tidy"


def test_report_section_gives_each_layouts_sweep_and_peak_with_units_run_and_limit(tmp_path):
    from peercache.lab.analysis import report
    tidy = _collected(tmp_path, busiest=0.97)
    rep = report.build_report(tidy, tmp_path / "figures", "t", captures_dir=None)
    sec = next(s for s in rep.sections if s.scenario == "hicache")
    assert [c.split(":")[0] for c, _ in sec.tables] == ["mla", "mha"]
    (cap_mla, mla), (cap_mha, mha) = sec.tables
    assert "run t/hicache/hcs_tcp_mla_s128K_b128_c1-2/rep0" in cap_mla and "2 x 128 KiB" in cap_mha
    assert list(mla[0]) == ["op", "threads", "pages/s", "tokens/s", "GB/s", "p50 (ms)", "p99 (ms)", "p999 (ms)",
                            "checked", "CPU (cores)", "limited by"]
    assert [(r["op"].split()[0], r["threads"]) for r in mla] == [
        (o, t) for o in ("get", "set", "exists") for t in ("1", "2", "PEAK (1 thr)")]
    assert [r["threads"] for r in mha if r["op"].startswith("get")] == ["1", "2", "PEAK (2 thr)"]
    doc = json.loads(_read(MLA))
    get1 = doc["points"][0]
    peak = next(r for r in mla if r["op"] == "get (batch_get_v1)" and r["threads"].startswith("PEAK"))
    assert peak["pages/s"] == f"{get1['pages_per_s']:,.0f}" and peak["tokens/s"] == f"{get1['tokens_per_s']:,.0f}"
    assert float(peak["p99 (ms)"]) == pytest.approx(get1["latency_us"]["p99"] / 1000, rel=1e-3)
    assert next(r for r in mla if r["op"].startswith("exists"))["GB/s"] == "—"
    # attribution's sentence from each point's own CPU evidence (the rules file), never a number made here
    assert all(r["limited by"] == "one core (consumer thread at 0.97 of a core)" for r in mla + mha)
    assert mla[0]["CPU (cores)"] == "consumer 0.97, producer 0.05"
    assert mla[0]["checked"] == "every page verified" and mla[3]["checked"].startswith("round trip 128/128")
    md = report.report_markdown(rep, tmp_path)
    assert "**mla: pages of 64 tokens" in md and "| get (batch_get_v1) | PEAK (1 thr) |" in md
    assert any(f.name == "hicache_suite.png" for f in sec.figures)


def test_overview_gives_each_layouts_get_peak_as_a_get_with_the_other_peaks_beside(tmp_path):
    from peercache.lab.analysis import report
    rep = report.build_report(_collected(tmp_path, busiest=0.97), tmp_path / "figures", "t")
    ov = rep.overview[rep.overview["scenario"].str.startswith("hicache")].to_dict("records")
    assert [r["scenario"] for r in ov] == ["hicache: mla get PEAK (batch_get_v1, 1 thr)",
                                           "hicache: mha get PEAK (batch_get_v1, 2 thr)"]
    get1 = json.loads(_read(MLA))["points"][0]
    assert ov[0]["GET throughput"].startswith(f"{get1['gb_per_s']:.4g}\u00a0GB/s")
    assert ov[0]["limited by"] == "one core (consumer thread at 0.97 of a core)"
    assert "set PEAK" in ov[0]["notes"] and "exists PEAK" in ov[0]["notes"] and "not_measured" not in ov[0]["notes"]
    assert ov[0]["run"] == "t/hicache/hcs_tcp_mla_s128K_b128_c1-2/rep0"


def test_without_evidence_above_a_rule_the_section_says_unknown(tmp_path):
    from peercache.lab.analysis import report
    rep = report.build_report(_collected(tmp_path, busiest=0.3), tmp_path / "figures", "t")
    _, mla = next(s for s in rep.sections if s.scenario == "hicache").tables[0]
    said = {r["limited by"] for r in mla}
    assert len(said) == 1 and next(iter(said)).startswith("unknown (nothing at its limit: ")
    assert "busiest_thread 0.30" in next(iter(said))      # what was ruled out, with its value


def test_the_figure_has_a_panel_per_op_and_stars_each_peak(tmp_path):
    from peercache.lab.analysis import charts, collect
    from peercache.lab.analysis.scenarios.declare import Chart
    rows, runs = collect.load_tidy(_collected(tmp_path, busiest=0.3) / "t")
    chart = charts.build_scenario("hicache", rows, runs, None)[0]
    assert isinstance(chart, Chart), chart
    axes = chart.fig.axes
    assert [a.get_title() for a in axes] == ["get (batch_get_v1)", "set (batch_set_v1)", "exists (batch_exists)"]
    peaks = [t.get_text() for a in axes for t in a.texts if t.get_text().startswith("PEAK")]
    assert len(peaks) == 6       # one per op and layout
    assert {r["layout"] for r in chart.table} == {"mla", "mha"} and all(r["run"].startswith("t/hicache/")
                                                                         for r in chart.table)
    charts.plt.close(chart.fig)


# -- one real point ----------------------------------------------------------------------------------

def test_a_point_runs_serve_and_the_suite_and_each_sweep_point_gets_its_own_cpu_window(tmp_path):
    """The kind end to end on this host over loopback: serve, the suite (get and exists at 1 and 2 threads),
    the document parsed into rows, each pages/s row with both sides' CPU over its own window."""
    sc = experiments.load_scenarios()
    tb = experiments.load_testbed(ROOT / "experiments/testbeds/local.yaml", sc)
    part = {"kind": "hicache_suite", "protocol": "tcp", "layout": ["mla"], "page_size": [16384], "batch_size": [32],
            "concurrencies": [1, 2], "ops": ["get", "exists"], "working_set": 128, "duration": 0.5, "warmup": 0.2}
    pt, = experiments.expand_part("hicache", "suite", part, [])
    th = runpoint.TestbedHosts(LocalHost(), LocalHost(), "127.0.0.1", "127.0.0.1", None)
    rows = runpoint.run_point(tb, pt, 0, tmp_path / "out" / "result.json", hosts=th, quiet=True)
    assert not [r for r in rows if r.status == "failed"], [r.reason for r in rows if r.status == "failed"]
    heads = [r for r in rows if r.metric == suite.PRIMARY]
    assert sorted((r.extra["op"], r.threads) for r in heads) == [("exists", 1), ("exists", 2), ("get", 1), ("get", 2)]
    assert sum(r.extra["peak"] for r in heads) == 2 and all(r.value > 0 and r.tool == suite.TOOL for r in heads)
    windows = {(r.extra["window_start"], r.extra["window_end"]) for r in heads}
    assert len(windows) == 4                                  # each point its own window ...
    for r in heads:                                           # ... and its own CPU reading over it
        cpu = r.extra["cpu"]
        assert set(cpu) == {"consumer", "producer"}
        assert all("cores" in cpu[s] or "fewer than two CPU samples" in cpu[s].get("reason", "") for s in cpu)
    assert any("cores" in r.extra["cpu"]["consumer"] for r in heads)
    assert (tmp_path / "out" / "suite.json").exists() and (tmp_path / "out" / "client.log").exists()
