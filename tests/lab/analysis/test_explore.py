"""The exploration library and notebook: runs listed and loaded with verdicts, one-call plots, ad-hoc reads
against a real serve, and explore.ipynb executed by papermill (two fixture runs) and exported to HTML.

Fixtures: tests/fixtures/tidy/fixture-2x-cx7 (the report tests' testbed) and fixture-2x-cx7-slowed (the
same testbed a week later with five rows changed; its README lists them).
"""
import json
import shutil
from pathlib import Path

import pytest

from conftest import BENCH
from peercache.bench.serve import READY_LINE
from peercache.lab.analysis import collect, explore, papermill_run

ROOT = Path(__file__).resolve().parents[3]
FIX = ROOT / "tests" / "fixtures" / "tidy"
REFS = FIX / "references.yaml"
A, B = "fixture-2x-cx7", "fixture-2x-cx7-slowed"


@pytest.fixture(scope="module")
def runs_root(tmp_path_factory):
    """Run A as the pipeline writes it (tidy Parquet) and run B as a text run folder, under one root."""
    root = tmp_path_factory.mktemp("runs")
    rows, runs = collect.load_tidy(FIX / A)
    collect.write_tidy(root, A, rows, runs)
    shutil.copytree(FIX / B, root / B)
    return root


def test_list_runs_names_each_run_with_kind_dates_and_revision(runs_root):
    listing = explore.list_runs([runs_root])
    by = {r["name"]: r for r in listing.to_dict("records")}
    assert set(by) == {A, B}
    assert by[A]["kind"] == "tidy" and by[B]["kind"] == "reference"
    assert by[A]["testbed"] == by[B]["testbed"] == A
    assert by[A]["revision"] == "0123abcd" and by[B]["revision"] == "4567cdef"
    assert by[B]["start"].startswith("2025-01-17") and by[A]["points"] == 20
    assert explore.default_run(listing) == B            # the newest


def test_find_run_by_name_or_path_and_a_clear_error(runs_root):
    assert explore.find_run(A, [runs_root]) == runs_root / A
    assert explore.find_run(str(FIX / B), [runs_root]) == FIX / B
    with pytest.raises(LookupError, match=r"no run 'nope'.*runs there: fixture-2x-cx7, fixture-2x-cx7-slowed"):
        explore.find_run("nope", [runs_root])


def test_overview_has_verdicts_and_limited_by(runs_root):
    run = explore.load_run(A, [runs_root], REFS)
    ov = explore.overview(run)
    assert ov.verdict_counts["above_line_rate"] == 1 and ov.verdict_counts["low"] == 1
    assert "limited by" in ov.headline.columns
    pts = ov.points.set_index("point")
    assert pts.loc["peercache_p8_t4", "verdict"] == "ok"
    said = run.rows[(run.rows["point"] == "peercache_p8_t4") & (run.rows["metric"] == "get_throughput")]
    assert pts.loc["peercache_p8_t4", "limited by"] == said["limited_by"].iloc[0] != "—"
    assert said["limit"].iloc[0]                          # a rule of the attribution file fired
    md = explore.overview_markdown(ov)
    assert "revision 0123abcd" in md and "Throughput points" in md


def test_plot_metric_against_a_knob_holds_the_data_and_names_the_run(runs_root):
    run = explore.load_run(A, [runs_root], REFS)
    p = explore.plot_metric(run, "get_throughput", "threads", facet="protocol", where={"scenario": "multi_rail"})
    t = p.table
    assert set(t["facet"]) == {"rdma"} and set(t["series"]) == {"1 MiB batch 128", "128 KiB batch 32"}
    got = {(r["series"], int(r["threads"])): r["value"] for r in t.to_dict("records")}
    assert got[("128 KiB batch 32", 4)] == pytest.approx(40.2) and got[("1 MiB batch 128", 2)] == pytest.approx(88.9)
    assert set(t["unit"]) == {"GB/s"} and (t["n"] == 1).all()
    assert p.fig._suptitle.get_text() == f"get_throughput vs threads (concurrency), run {A}"
    assert any(f"run {A}" in x.get_text() for x in p.fig.texts)
    assert explore.png(p.fig).startswith(b"\x89PNG")
    # size on a log2 axis, faceted by scenario: the sweep's two QP counts are two lines
    p = explore.plot_metric(run, "bw", "size", facet="scenario", where={"tool": "ib_write_bw"})
    assert set(p.table["series"]) == {"q1", "q4"} and set(p.table["unit"]) == {"GB/s"}
    with pytest.raises(ValueError, match="unknown knob 'colour'"):
        explore.plot_metric(run, "bw", "colour")
    with pytest.raises(ValueError, match="has no metric 'nope'; its metrics: "):
        explore.plot_metric(run, "nope", "size")


def test_adhoc_reads_against_a_real_serve(procs, port):
    addr = f"127.0.0.1:{port}"
    serve = procs.start([*BENCH, "serve", "--discovery-addr", addr, "--working-set", "64", "--page-size", "16384",
                         "--readers", "0", "--max-wait", "120"])
    procs.wait_line(serve, READY_LINE)
    reads = explore.adhoc_reads(addr, page_size=16384, working_set=64, batch=16, batches=50, max_seconds=20)
    assert reads.first_len == 16384 and reads.hits == 50 * 16 and reads.misses == 0
    s = reads.summary()
    assert s["batches"] == 50 and s["stopped_by"] == "count" and 0 < s["p50_us"] <= s["p99_us"] <= s["max_us"]
    # the time bound ends the loop too
    quick = explore.adhoc_reads(addr, page_size=16384, batches=10**9, max_seconds=0.3)
    assert quick.stopped_by == "time" and len(quick.latencies_us) < 10**9
    md = explore.reads_markdown(reads)
    assert f"serve {addr}" in md and "returned 16384 B" in md and "p99_us" in md
    assert explore.latency_figure(reads).axes[0].get_title().startswith(f"ad-hoc reads from serve {addr}")


def test_explore_link_names_the_run():
    md = explore.explore_link("local", "data/tidy")
    assert "notebooks/explore.ipynb" in md and 'run = "data/tidy/local"' in md
    assert "peercache-lab compare data/tidy/local" in md


def test_source_notebook_is_parameterised_clean_and_on_the_lab_kernel():
    nb = json.loads((ROOT / "notebooks" / "explore.ipynb").read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    params = [c for c in code if "parameters" in c["metadata"].get("tags", [])]
    assert len(params) == 1 and all(c["outputs"] == [] and c["execution_count"] is None for c in code)
    for name in ("roots", "run", "other", "tolerance", "metric", "knob", "facet", "serve"):
        assert f"\n{name} = " in "\n" + "".join(params[0]["source"]), name
    assert nb["metadata"]["kernelspec"]["name"] == "peercache-lab"


def test_explore_notebook_executes_with_papermill_and_exports_html(runs_root, procs, port, tmp_path):
    addr = f"127.0.0.1:{port}"
    serve = procs.start([*BENCH, "serve", "--discovery-addr", addr, "--working-set", "64", "--page-size", "16384",
                         "--readers", "0", "--max-wait", "300"])
    procs.wait_line(serve, READY_LINE)
    params = dict(roots=[str(runs_root)], run=A, other=B, references=str(REFS), metric="get_throughput",
                  knob="threads", facet="protocol", where={"scenario": "multi_rail"}, serve=addr,
                  serve_page_size=16384, serve_batch=16, serve_batches=40, serve_max_seconds=20.0)
    ipynb, html = papermill_run.run_notebook(ROOT / "notebooks" / "explore.ipynb", tmp_path, params)
    text = html.read_text()
    assert "explore.load_run(" not in text and "explore.load_run(" in ipynb.read_text()   # code hidden, kept
    for needle in (f"Run {A}", "% of single-NIC raw limit", "limited by", "above_line_rate",   # overview
                   "128 KiB batch 32",                                                          # the plot's table
                   "3 regressed beyond the tolerance", "ok → low", "measured in A, failed in B",  # comparison
                   f"Ad-hoc reads from serve {addr}", "returned 16384 B", "p99_us"):            # reads
        assert needle in text, needle
    assert text.count("data:image/png;base64") >= 3     # plot, comparison chart, latency histogram


def test_report_notebook_links_to_the_exploration_notebook_for_its_run():
    nb = json.loads((ROOT / "notebooks" / "report.ipynb").read_text())
    src = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    assert any("explore.explore_link(testbed, tidy_dir)" in s for s in src)


def test_explore_notebook_without_serve_or_second_run_says_so_and_skips_them(runs_root, tmp_path):
    params = dict(roots=[str(runs_root)], run="", references=str(REFS), metric="bw", knob="size", facet="scenario")
    _, html = papermill_run.run_notebook(ROOT / "notebooks" / "explore.ipynb", tmp_path, params)
    text = html.read_text()
    assert f"Run {B}" in text                                  # "" picks the newest run
    assert "No second run named" in text and "No serve named (parameter <code>serve</code> is empty)" in text
    assert "Ad-hoc reads from serve" not in text and "Run comparison" not in text


def test_list_parameters_take_a_list_or_its_string_forms():
    for given in (["a", "b"], "[a, b]", "a,b", " a , b ", ("a", "b")):
        assert explore.as_list(given, "roots") == ["a", "b"], given
    assert explore.as_list("", "roots") == [] and explore.as_list("data/reference", "roots") == ["data/reference"]
    with pytest.raises(ValueError, match=r'roots: .* is not a list .*-y "roots: \[a, b\]"'):
        explore.as_list("[a, b", "roots")
    assert explore.as_mapping('{scenario: multi_rail}') == {"scenario": "multi_rail"} and explore.as_mapping("") == {}
    with pytest.raises(ValueError, match="where: .* is not a mapping"):
        explore.as_mapping("[1, 2]")


def test_roots_that_hold_no_run_say_where_they_looked(tmp_path):
    (tmp_path / "empty").mkdir()
    roots = f"{tmp_path / 'empty'},{tmp_path / 'missing'}"          # the string form -p roots a,b
    listing = explore.list_runs(roots)
    assert listing.empty
    with pytest.raises(LookupError) as e:
        explore.runs_markdown(listing, roots)
    said = str(e.value)
    assert f"{tmp_path / 'missing'}: no such folder" in said
    assert f"{tmp_path / 'empty'}: 0 run(s): no folder in {tmp_path / 'empty'} holds rows.parquet or rows.csv" in said


def test_the_published_baselines_side_by_side_table_and_figure():
    sbs = explore.side_by_side()                                   # the defaults: both published baselines
    t = sbs.table
    assert [r.name for r in sbs.runs] == list(explore.DEFAULT_BASELINES)
    assert set(t["baseline"]) == set(explore.DEFAULT_BASELINES)
    ib = t[(t["scenario"] == "single_nic") & (t["tool"] == "ib_read_bw")].iloc[0]
    assert (ib["value"], ib["unit"], ib["Gb/s"], ib["% of line rate"]) == ("49", "GB/s", "392", "98")
    sweep = t[t["baseline"] == "ib-write-bw-200gbe-qp-sweep"]
    assert len(sweep) == 16 and set(sweep["knobs"]) >= {"1 KiB q1", "1 MiB q4"}
    assert "per_device 128 KiB 8 proc max" not in set(t["knobs"]) and "128 KiB 8 proc max" in set(t["knobs"])
    assert [ax.get_title().split("\n")[0] for ax in sbs.fig.axes] == list(explore.DEFAULT_BASELINES)
    assert "line rate of one NIC, 200 Gb/s" in [x.get_text() for x in sbs.fig.axes[1].get_legend().get_texts()]
    assert "### peercache-8xcx7-roce | ib-write-bw-200gbe-qp-sweep" in sbs.markdown().replace("\\|", "|")
    with pytest.raises(LookupError, match="no run 'nope'"):
        explore.side_by_side("peercache-8xcx7-roce,nope")


def test_explore_notebook_defaults_show_the_baselines_and_plot_the_run(tmp_path):
    # a fresh clone: only data/reference holds runs
    _, html = papermill_run.run_notebook(ROOT / "notebooks" / "explore.ipynb", tmp_path,
                                         dict(roots="data/reference", run="ib-write-bw-200gbe-qp-sweep"))
    text = html.read_text()
    assert "Published baselines side by side" in text and "line rate (98% of 400 Gb/s)" in text
    assert "metric bw (parameter <code>metric</code> was empty" in text and "Not plotted" not in text
    assert text.count("data:image/png;base64") >= 2                 # the baselines, the run's plot
