"""Run-vs-run comparison: the library and ``peercache-lab compare`` (exit 0 / 1 / 2).

Fixtures: tests/fixtures/tidy/fixture-2x-cx7 (run A) and fixture-2x-cx7-slowed (the same testbed a week
later: one point 20 % slower, one sweep point at half, one point failed, one 2 % slower (inside a 5 %
tolerance) and one 7.5 % faster; its README lists them).
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from peercache.lab import cli
from peercache.lab.analysis import collect, compare, explore

ROOT = Path(__file__).resolve().parents[3]
FIX = ROOT / "tests" / "fixtures" / "tidy"
REFS = FIX / "references.yaml"
A, B = FIX / "fixture-2x-cx7", FIX / "fixture-2x-cx7-slowed"


def _load(path):
    return explore.load_run(path, [FIX], REFS)


@pytest.fixture(scope="module")
def runs():
    return _load(A), _load(B)


def test_identical_runs_have_no_regression(runs):
    a, _ = runs
    c = compare.compare_runs(a, a)
    assert len(c.table) == 50 and not c.only_a and not c.only_b
    assert c.regressions.empty and c.improvements.empty and c.verdict_changes.empty
    ok = c.table[c.table["ratio"].notna()]
    assert (ok["ratio"] == 1.0).all()


def test_slowed_run_lists_its_regressed_points_with_units_and_runs(runs):
    a, b = runs
    c = compare.compare_runs(a, b, tolerance=0.05)
    reg = {(r["point"], r["metric"]): r for r in c.regressions.to_dict("records")}
    assert set(reg) == {("page131072_b32_t4", "get_throughput"), ("q4_s1024", "bw"),
                        ("page1048576_b128_t4", "get_throughput")}
    slow = reg[("page131072_b32_t4", "get_throughput")]
    assert slow["ratio"] == pytest.approx(0.8) and slow["unit"] == "GB/s"
    assert slow["value_a"] == pytest.approx(40.2) and slow["value_b"] == pytest.approx(32.16)
    assert slow["runs_a"] == slow["runs_b"] == ["multi_rail-page131072_b32_t4-rep0"]
    assert (slow["verdict_a"], slow["verdict_b"]) == ("ok", "low")
    assert "worse by 20.0 %" in slow["why"]
    assert reg[("q4_s1024", "bw")]["unit"] == "Gbit/s" and reg[("q4_s1024", "bw")]["ratio"] == pytest.approx(0.5)
    assert reg[("page1048576_b128_t4", "get_throughput")]["why"].startswith("measured in A, failed in B")
    # 2 % slower is inside the tolerance; 7.5 % faster is an improvement, not a regression
    inside = c.table[c.table["point"] == "peercache_p8_t4"].iloc[0]
    assert inside["ratio"] == pytest.approx(0.98) and not inside["regressed"]
    assert list(c.improvements["point"]) == ["page131072_b32_t8"]
    # a wider tolerance lets the 20 % one through but never the failed point
    wide = compare.compare_runs(a, b, tolerance=0.6)
    assert list(wide.regressions["point"]) == ["page1048576_b128_t4"]


def test_direction_of_metrics():
    assert compare.direction("get_throughput", "GB/s") == "higher"
    assert compare.direction("pages_per_s", "pages/s") == "higher"
    assert compare.direction("latency_p99", "us") == "lower"
    assert compare.direction("verify_failures", "count") == "lower"
    assert compare.direction("hit_rate", "ratio") == "higher"
    assert compare.direction("bytes_sent", "B") == "neutral"
    assert compare.direction("llc_load_misses", "count") == "neutral"


def test_runs_without_common_points_are_a_clear_error(runs, tmp_path):
    a, _ = runs
    rows, metas = collect.load_tidy(A)
    keep = rows["scenario"] == "msgsize_sweep"
    collect.write_tidy(tmp_path, "sweep-only", rows[keep], metas[metas["scenario"] == "msgsize_sweep"])
    collect.write_tidy(tmp_path, "no-sweep", rows[~keep], metas[metas["scenario"] != "msgsize_sweep"])
    x, y = (explore.load_run(tmp_path / n, [tmp_path], REFS) for n in ("sweep-only", "no-sweep"))
    with pytest.raises(compare.NoCommonPoints, match=r"share no point.*A has scenarios \['msgsize_sweep'\]"):
        compare.compare_runs(x, y)
    with pytest.raises(ValueError, match=r"tolerance 1.5 must be a fraction in \[0, 1\)"):
        compare.compare_runs(a, a, tolerance=1.5)


def test_markdown_and_json_say_every_number_with_its_unit_and_run(runs):
    a, b = runs
    c = compare.compare_runs(a, b)
    md = compare.comparison_markdown(c)
    assert md.index("## Regressed beyond the tolerance") < md.index("## Verdict changes")
    assert "| 40.2 GB/s | 32.16 GB/s | 0.800 x |" in md
    assert "revision 0123abcd" in md and "revision 4567cdef" in md and "tolerance 5 %" in md
    doc = json.loads(compare.dumps(c))
    assert doc["counts"]["regressed"] == 3 and doc["tolerance"] == {"value": 0.05, "unit": "fraction"}
    p = next(p for p in doc["regressed"] if p["key"]["point"] == "page131072_b32_t4")
    assert p["a"]["value"] == pytest.approx(40.2) and p["a"]["unit"] == "GB/s" and p["ratio"]["unit"] == "B/A"
    assert p["b"]["runs"] == ["multi_rail-page131072_b32_t4-rep0"] and doc["b"]["revision"] == "4567cdef"
    fig = compare.comparison_chart(c)
    assert "3 regressed" in fig.axes[0].get_title()


def test_cli_exit_status_identical_0_slowed_1_disjoint_2(capsys, tmp_path):
    base = ["compare", "--references", str(REFS), "--roots", str(FIX)]
    assert cli.main([*base, str(A), "fixture-2x-cx7"]) == 0
    out = capsys.readouterr()
    assert "0 regressed beyond the tolerance" in out.out and "0 regressed" in out.err
    assert cli.main([*base, "--format", "json", "fixture-2x-cx7", "fixture-2x-cx7-slowed"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert {p["key"]["point"] for p in doc["regressed"]} == {"page131072_b32_t4", "q4_s1024", "page1048576_b128_t4"}
    assert cli.main([*base, "--tolerance", "0.6", "fixture-2x-cx7", "fixture-2x-cx7-slowed"]) == 1
    rows, metas = collect.load_tidy(A)
    collect.write_tidy(tmp_path, "sweep-only", rows[rows["scenario"] == "msgsize_sweep"],
                       metas[metas["scenario"] == "msgsize_sweep"])
    collect.write_tidy(tmp_path, "gpu-only", rows[rows["scenario"] == "gpudirect"], metas[metas["scenario"] == "gpudirect"])
    assert cli.main([*base, str(tmp_path / "sweep-only"), str(tmp_path / "gpu-only")]) == 2
    err = capsys.readouterr().err
    assert "share no point" in err and "compare runs of the same scenarios" in err
    assert cli.main([*base, "no-such-run", "fixture-2x-cx7"]) == 2
    assert "no run 'no-such-run'" in capsys.readouterr().err


def test_console_script_exits_1_on_a_regression(tmp_path):
    out = tmp_path / "cmp.md"
    r = subprocess.run([sys.executable, "-m", "peercache.lab.cli", "compare", str(A), str(B), "--references",
                        str(REFS), "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stderr
    assert "3 regressed beyond the tolerance" in r.stderr and "measured in A, failed in B" in out.read_text()
