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
    assert ratios.memcpy_rate(4096, 64, 8, 0.05) > 0


def test_every_ratio_has_a_target_in_the_references_data():
    from peercache.lab.analysis.references import load_bench_targets
    t = load_bench_targets()
    assert t == {"shm_vs_memcpy_128k": 0.9, "tcp_vs_iperf3_128k": 0.9, "pages_per_s_64b": 3e6}


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
