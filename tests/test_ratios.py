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


def test_every_ratio_has_a_target():
    assert set(ratios.TARGETS) == {"shm_vs_memcpy_128k", "tcp_vs_iperf3_128k", "pages_per_s_64b"}
