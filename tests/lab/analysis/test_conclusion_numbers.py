"""A conclusion's numbers are the rows' numbers: each is recomputed here from the rows the conclusion cites
(issue 40: "peaks at 128 KiB (16.34 Gb/s), 95 % above its lowest (1 KiB, 0.83 Gb/s)", when 16.34 is 20 × 0.83)."""
import re

import pandas as pd
import pytest

from peercache.lab.analysis.scenarios.msgsize_sweep import MsgsizeSweep

#: A sweep's bandwidth in Gb/s by message size: the figures of the local report that said "95 % above".
SWEEP = {1024: 0.83, 4096: 3.1, 16384: 9.7, 131072: 16.34, 1048576: 15.9}


def _rows(sweep: dict[int, float]) -> pd.DataFrame:
    return pd.DataFrame([{"status": "ok", "metric": "bw", "value": gbps * 1e9 / 8, "unit": "B/s", "size_bytes": size,
                          "qps": 1, "run_id": f"msgsize_sweep-q1_s{size}-rep0"} for size, gbps in sweep.items()])


def test_a_sweeps_peak_is_stated_as_the_multiple_of_its_lowest_that_the_rows_give():
    rows = _rows(SWEEP)
    c, = MsgsizeSweep().conclusions(rows, {})
    m = re.search(r"peaks at (\S+ \S+) \(([\d.]+) Gb/s\), ([\d.]+) × its lowest \((\S+ \S+), ([\d.]+) Gb/s\)", c.text)
    assert m, c.text
    peak, low, times = float(m[2]), float(m[5]), float(m[3])
    by_run = rows.set_index("run_id")
    cited = sorted(by_run.loc[c.runs, "value"] * 8 / 1e9)
    assert cited == pytest.approx([low, peak], rel=0.01)
    assert times == pytest.approx(peak / low, abs=0.05)
    assert "%" not in c.text
