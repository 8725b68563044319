"""perftest.jsonout: the --out_json file in both dialects (real 6.06 files, the standard JSON of
later releases, a public latency file), cross-checked with the text report of the same run."""
from __future__ import annotations

import json

import pytest

from lab.tools.perftest.captures import LAT_JSON, load, parse_real, public, real
from peercache.lab.errors import ParseError
from peercache.lab.tools import perftest as pt


# --- both dialects, cross-checked with the text of the same run -------------------------------

@pytest.mark.parametrize("json_text, report, unit, qps, gid", [
    # real perftest 6.06: the pre-standard dialect (unquoted keys, trailing commas)
    (lambda: real("read_s131072_q1_json.client.json"),
     lambda: real("read_s131072_q1_json.client.stdout"), "MB/sec", 1, 1),
    # reconstructed: the standard JSON of later releases
    (lambda: load("read_bw_q16.json"), lambda: load("read_bw_q16_mib.txt"), "MiB/sec", 16, 3),
], ids=["legacy-real", "standard"])
def test_json_file_both_dialects_cross_check(json_text, report, unit, qps, gid):
    j = pt.parse_json(json_text())
    assert j.rows[0].raw_unit is None and j.rows[0].bw_average_Bps is None  # unit not in file
    with pytest.raises(ValueError, match="unit unknown"):
        pt.to_rows(j)
    t = pt.parse_output(report())
    assert pt.cross_check(t, j) == []
    assert j.rows[0].raw_unit == unit  # taken from the text of the same run
    assert j.info["qps"] == qps and j.info["gid_index"] == gid and j.info["tool"] == "ib_read_bw"


def test_json_cross_check_reports_mismatch():
    j = pt.parse_json(load("read_bw_q16.json").replace('"n_iterations": 1000', '"n_iterations": 999'),
                      "MiB/sec")
    t = pt.parse_output(load("read_bw_q16_mib.txt"))
    assert any("iterations" in p for p in pt.cross_check(t, j))


@pytest.mark.parametrize("mutate, where", [
    (lambda s: s.replace("BW_average: ", "BW_avg: "), "BW_average"),
    (lambda s: s.replace("MsgRate: 0.000315,", "MsgRate: fast,"), "MsgRate"),
    (lambda s: s[: s.index("results")], "truncated"),
    (lambda s: s.replace("Mtu: 1024,", "Mtu 1024"), "line 14"),
])
def test_json_corrupt(mutate, where):
    text = real("read_s131072_q1_json.client.json")
    assert mutate(text) != text
    with pytest.raises(ParseError, match=where):
        pt.parse_json(mutate(text), "Gb/sec", source="x.json")


@pytest.mark.parametrize("stem, side, device, unit", [
    ("read_s131072_q1_json", "client", "rxe_b0", "MB/sec"),
    ("read_s131072_q1_json", "server", "rxe_a0", "MB/sec"),
    ("write_d2_q4_gbits_cpu_json", "client", "rxe_b0", "Gb/sec"),
    ("write_d2_q4_gbits_cpu_json", "server", "rxe_a0", "Gb/sec"),
])
def test_out_json_real_files(stem, side, device, unit):
    raw = real(f"{stem}.{side}.json")
    with pytest.raises(json.JSONDecodeError):
        json.loads(raw)  # perftest 6.06 writes unquoted keys and trailing commas
    j = pt.parse_json(raw, source=f"{stem}.{side}.json")
    assert j.rows[0].raw_unit is None  # the file does not say
    t = parse_real(f"{stem}.{side}.stdout")
    assert pt.cross_check(t, j) == []
    assert j.rows[0].raw_unit == unit  # taken from the text of the same run
    assert j.info["device"] == device and j.info["gid_index"] == 1 and j.info["mtu_bytes"] == 1024
    assert j.info["tx_depth"] == (128 if side == "client" else None)
    assert j.notes == []
    [row] = j.rows
    if stem.startswith("read"):
        assert j.info["tool"] == "ib_read_bw" and j.info["qps"] == 1 and j.info["outstand_reads"] == 128
        assert (row.size_bytes, row.iterations, row.bw_peak_raw, row.bw_average_raw, row.msg_rate_mpps) == (
            131072, 200, 39.51, 39.38, 0.000315)
        assert row.cpu_util_pct is None
    else:
        assert j.info["tool"] == "ib_write_bw" and j.info["qps"] == 4 and j.info["max_inline_bytes"] == 0
        assert (row.size_bytes, row.iterations, row.bw_peak_raw, row.bw_average_raw, row.msg_rate_mpps) == (
            131072, 64, None, 0.033497, 0.000032)
        assert row.cpu_util_pct == 0.0


# --- latency ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(LAT_JSON))
def test_public_latency_json(name):
    exp = LAT_JSON[name]
    r = pt.parse_latency_json(public(name), name)
    assert r.test == exp["test"] and r.tool == exp["tool"] and r.fmt == "json"
    for key, value in exp["info"].items():
        assert r.info[key] == value, key
    [row] = r.rows
    assert (row.size_bytes, row.iterations, row.t_min_us, row.t_max_us, row.t_typical_us,
            row.t_avg_us, row.t_stdev_us, row.p99_us, row.p999_us) == exp["row"]
    with pytest.raises(ParseError, match="latency test; use parse_latency_json"):
        pt.parse_json(public(name), "Gb/sec", source=name)
    rows = pt.to_rows(r, experiment="e", scenario="s", run_id="r")
    assert {x.metric: x.value for x in rows}["latency_p999"] == 4.03
