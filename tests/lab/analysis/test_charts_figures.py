"""make_charts.py on fixture tidy data and on the published reference data."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

from peercache.lab.analysis import charts, collect
from peercache.lab.analysis.format import display, fmt_number, fmt_size
from peercache.lab.analysis.scenarios.declare import Chart
from peercache.lab.analysis.scenarios.draw import PEERCACHE_COLOR, RAW_COLOR
from peercache.lab.analysis.scenarios.msgsize_sweep import COUNTERS

ROOT = Path(__file__).resolve().parents[3]
FIX = ROOT / "tests" / "fixtures" / "tidy"
TB = "fixture-2x-cx7"
sys.path.insert(0, str(ROOT))
import make_charts  # noqa: E402

FIXTURE_CHARTS = ["msgsize_sweep_bw", "msgsize_sweep_counters", "multi_rail", "single_nic", "whole_machine"]


@pytest.fixture(scope="module")
def tidy_dir(tmp_path_factory):
    """The fixture testbed as the pipeline leaves it: raw result.json -> collect -> Parquet."""
    base = tmp_path_factory.mktemp("lab")
    rows, runs = collect.load_tidy(FIX / TB)
    collect.write_raw_from_tidy(rows, runs, base / "raw", TB)
    collect.collect_testbed(base / "raw", base / "tidy", TB)
    return base / "tidy"


def _run(tmp_path, tidy_dir, *extra):
    return make_charts.main(["--tidy-dir", str(tidy_dir), "--reference-dir", str(tmp_path / "no-refs"),
                             "--references", str(FIX / "references.yaml"), "--out", str(tmp_path / "fig"),
                             *extra])


def test_writes_exactly_the_expected_files(tmp_path, tidy_dir, capsys):
    assert _run(tmp_path, tidy_dir) == 0
    files = sorted(p.relative_to(tmp_path / "fig").as_posix() for p in (tmp_path / "fig").rglob("*"))
    assert files == sorted([TB, f"{TB}/index.md"] + [f"{TB}/{c}.{ext}" for c in FIXTURE_CHARTS
                                                      for ext in ("md", "png", "svg")])
    index = (tmp_path / "fig" / TB / "index.md").read_text()
    assert "gpudirect: not drawn:" in index and "(single_nic.md)" in index
    out = capsys.readouterr().out
    # gpudirect was skipped in the fixture: not drawn, and the reason is printed.
    assert re.search(r"gpudirect: not drawn: .*skipped: no GPU on node-b", out)
    assert "[1/1] fixture-2x-cx7" in out


def test_from_scratch_and_png_only(tmp_path, tidy_dir):
    stale = tmp_path / "fig" / TB / "gpudirect.png"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"old")
    assert _run(tmp_path, tidy_dir, "--format", "png") == 0
    files = sorted(p.name for p in (tmp_path / "fig" / TB).iterdir())
    assert files == sorted([f"{c}.png" for c in FIXTURE_CHARTS] + [f"{c}.md" for c in FIXTURE_CHARTS]
                           + ["index.md"])


def _md_table(path):
    lines = [l for l in path.read_text().splitlines() if l.startswith("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(head, (c.strip() for c in l.strip("|").split("|")))) for l in lines[2:]]


def test_markdown_numbers_equal_the_data(tmp_path, tidy_dir):
    assert _run(tmp_path, tidy_dir) == 0
    rows, _ = collect.load_tidy(tidy_dir / TB)
    d = tmp_path / "fig" / TB
    single = {r["run"]: r for r in _md_table(d / "single_nic.md")}
    for _, r in rows[rows["scenario"] == "single_nic"].iterrows():
        # Shown in GB/s with 4 significant figures; the tidy data keeps the exact value and unit.
        value, unit = display(r["value"], r["unit"])
        assert single[r["run_id"]]["value"] == fmt_number(value) and unit == "GB/s"
        assert single[r["run_id"]]["unit"] == unit
    raw_gbs = 385.6 / 8  # the fixture's ib_read_bw row in Gbit/s
    assert single["single_nic-peercache_p8_t4-rep0"]["% of raw"] == f"{100 * 45.3 / raw_gbs:.1f}%"
    multi = _md_table(d / "multi_rail.md")
    mr = rows[rows["scenario"] == "multi_rail"]
    assert sorted(float(r["value"]) for r in multi) == sorted(float(fmt_number(v)) for v in mr["value"])
    assert {(r["page size"], int(r["threads"])) for r in multi} == \
        {(fmt_size(s), int(t)) for s, t in zip(mr["size_bytes"], mr["threads"])}
    whole = {r["NIC / figure"]: r for r in _md_table(d / "whole_machine.md")}
    assert whole["mlx5_1"]["value"] == "52.5" and whole["mlx5_1"]["verdict"] == "above_line_rate"
    assert whole["mlx5_0"]["verdict"] == "unchecked" and whole["mlx5_0"]["line rate (GB/s)"] == "50"
    ctr = {(r["QPs"], r["size"]): r for r in _md_table(d / "msgsize_sweep_counters.md")}
    sw = rows[(rows["scenario"] == "msgsize_sweep") & (rows["qps"] == 4)]
    for _, r in sw[sw["metric"].isin(list(COUNTERS))].iterrows():
        cell = ctr[("4", fmt_size(r["size_bytes"]))][r["metric"]]
        if r["status"] == "ok":
            assert float(cell) == r["value"]
        else:
            assert cell == "not_supported"   # drawn and tabled as missing, never 0
    text = (d / "msgsize_sweep_counters.md").read_text()
    assert "run msgsize_sweep-q4_s1024-rep0" in text and "revision 0123abcd" in text
    assert "node-a" in text and "ConnectX-7" in text


def test_no_data_scenario_not_drawn_and_reason_printed(tmp_path, tidy_dir, capsys):
    rows, runs = collect.load_tidy(tidy_dir / TB)
    keep = rows[rows["scenario"] != "whole_machine"]
    collect.write_tidy(tmp_path / "t2", TB, keep, runs)
    assert _run(tmp_path, tmp_path / "t2") == 0
    out = capsys.readouterr().out
    assert "whole_machine: not drawn: no rows for scenario whole_machine" in out
    assert not (tmp_path / "fig" / TB / "whole_machine.png").exists()
    assert (tmp_path / "fig" / TB / "single_nic.png").exists()


def test_reference_testbeds_redrawn_with_flags(tmp_path, capsys):
    ref = ROOT / "data" / "reference"
    rc = make_charts.main(["--tidy-dir", str(tmp_path / "none"), "--reference-dir", str(ref),
                           "--out", str(tmp_path / "fig"), "--format", "png"])
    assert rc == 0
    names = sorted(p.relative_to(tmp_path / "fig").as_posix() for p in (tmp_path / "fig").rglob("*.png"))
    assert names == ["ib-write-bw-200gbe-qp-sweep/msgsize_sweep_bw.png",
                     "ib-write-bw-200gbe-qp-sweep/msgsize_sweep_counters.png",
                     "peercache-8xcx7-roce/gpudirect.png", "peercache-8xcx7-roce/multi_rail.png",
                     "peercache-8xcx7-roce/single_nic.png", "peercache-8xcx7-roce/whole_machine.png"]
    whole = {r["NIC / figure"]: r for r in _md_table(tmp_path / "fig" / "peercache-8xcx7-roce" / "whole_machine.md")}
    assert whole["max of 8 NICs"]["value"] == "89.4" and whole["max of 8 NICs"]["verdict"] == "above_line_rate"
    counters = (tmp_path / "fig" / "ib-write-bw-200gbe-qp-sweep" / "msgsize_sweep_counters.md").read_text()
    assert "not_measured" in counters and "published as N/A" in counters


def test_unknown_testbed_and_bad_format(tmp_path, tidy_dir, capsys):
    assert _run(tmp_path, tidy_dir, "--testbed", "nope") == 2
    assert "no data for testbed(s) nope" in capsys.readouterr().err
    assert _run(tmp_path, tidy_dir, "--format", "jpg") == 2
    assert "unsupported format" in capsys.readouterr().err


@pytest.mark.parametrize("testbed", ["peercache-8xcx7-roce", "ib-write-bw-200gbe-qp-sweep"])
def test_committed_reference_figures_are_what_make_charts_draws_now(tmp_path, testbed):
    # figures/ is committed for the published baselines only: it must match the data and the chart code.
    root = Path(__file__).resolve().parents[3]
    r = subprocess.run([sys.executable, str(root / "make_charts.py"), "--testbed", testbed, "--out",
                        str(tmp_path), "--tidy-dir", str(tmp_path / "none")], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    committed = sorted(p.name for p in (root / "figures" / testbed).glob("*.md"))
    assert committed == sorted(p.name for p in (tmp_path / testbed).glob("*.md"))
    for name in committed:
        assert (tmp_path / testbed / name).read_text() == (root / "figures" / testbed / name).read_text(), \
            f"figures/{testbed}/{name} is stale: run `python make_charts.py --testbed {testbed}` and commit"


def test_each_chart_caption_says_what_limited_its_figures():
    root = Path(__file__).resolve().parents[3]
    text = (root / "figures" / "peercache-8xcx7-roce" / "whole_machine.md").read_text()
    assert "*limited by: " in text and "not a valid measurement" in text


def _text_outside_canvas(fig) -> list[str]:
    """Every visible text artist whose drawn extent leaves the canvas (cut off in the saved image)."""
    import matplotlib.text
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    w, h = fig.bbox.width, fig.bbox.height
    bad = []
    for t in fig.findobj(matplotlib.text.Text):
        if not t.get_visible() or not t.get_text().strip():
            continue
        bb = t.get_window_extent(renderer)
        if bb.x0 < -0.5 or bb.y0 < -0.5 or bb.x1 > w + 0.5 or bb.y1 > h + 0.5:
            bad.append(f"{t.get_text()[:60]!r} at x {bb.x0:.0f}..{bb.x1:.0f} of {w:.0f}, "
                       f"y {bb.y0:.0f}..{bb.y1:.0f} of {h:.0f}")
    return bad


def _stamped(tb_dir: Path, testbed: str, refs_path: Path):
    from peercache.lab.analysis.references import load_references
    rows, runs = collect.load_tidy(tb_dir)
    refs = load_references(refs_path)
    rows = charts.judge(rows, runs, refs, testbed)
    for chart in charts.build_charts(rows, runs, refs.get(testbed)):
        if isinstance(chart, Chart):
            yield chart.name, charts.finish(chart, testbed)


@pytest.mark.parametrize("tb_dir, testbed, refs", [
    (FIX / TB, TB, FIX / "references.yaml"),
    (ROOT / "data" / "reference" / "peercache-8xcx7-roce", "peercache-8xcx7-roce",
     ROOT / "data" / "reference" / "references.yaml"),
    (ROOT / "data" / "reference" / "ib-write-bw-200gbe-qp-sweep", "ib-write-bw-200gbe-qp-sweep",
     ROOT / "data" / "reference" / "references.yaml"),
])
def test_no_text_is_cut_off_at_the_canvas_edge(tb_dir, testbed, refs):
    seen = 0
    for name, fig in _stamped(tb_dir, testbed, refs):
        seen += 1
        bad = _text_outside_canvas(fig)
        charts.plt.close(fig)
        assert not bad, f"{testbed}/{name}: text outside the canvas: {bad[:4]}"
    assert seen >= 2


def test_integer_quantities_get_integer_ticks_and_colours_say_raw_or_peercache():
    from matplotlib.colors import to_hex
    rows, runs = collect.load_tidy(FIX / TB)
    rows = charts.judge(rows, runs, {}, TB)
    built = {c.name: c for c in charts.build_charts(rows, runs, None) if isinstance(c, Chart)}
    ax = built["multi_rail"].fig.axes[0]
    assert all(float(t).is_integer() for t in ax.get_xticks())        # threads: no 1.5-thread ticks
    single = built["single_nic"].fig.axes[0]
    colours = {to_hex(p.get_facecolor()) for p in single.patches if p.get_height() > 0}
    labels = [t.get_text() for t in single.get_xticklabels()]
    assert colours == {RAW_COLOR, PEERCACHE_COLOR}
    assert all(len(line) <= 20 for lab in labels for line in lab.splitlines()), labels   # knobs go in the table
    for c in built.values():
        charts.plt.close(c.fig)


def test_a_caption_names_each_cause_once_with_how_many_points_it_limited():
    from peercache.lab.analysis.charts import limit_summary
    got = limit_summary(["CPU: 2.0 of 2 busy", "the raw pattern's links: 90% of 3 GB/s", "CPU: 1.9 of 2 busy",
                         "CPU: 2.0 of 2 busy", "unknown (1.2 CPUs busy)"])
    assert got == ["CPU (3 points; e.g. 2.0 of 2 busy)", "the raw pattern's links: 90% of 3 GB/s",
                   "unknown (1.2 CPUs busy)"]
    assert limit_summary(["memcpy: 95%", "memcpy: 95%"]) == ["memcpy: 95%"]
