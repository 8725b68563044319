"""The other engines the lab runs beside PeerCache: Mooncake's transfer_engine_bench and the published
PeerCache 0.8.4 (NIXL's own tests: test_nixl.py). Builders, strict parsers over real captures
(tests/fixtures/lab/engines/README.md), the skip of a point whose engine venv is missing, and the
``engines`` scenario with every engine."""
import json
import re
from pathlib import Path

import pandas as pd
import pytest

from peercache.lab.errors import ParseError, ToolError
from peercache.lab.launch.hosts import LocalHost
from peercache.lab.launch.runners import fill_placeholders
from peercache.lab.pipeline import experiments, runpoint
from peercache.lab.pipeline.points import engines as engine_venv
from peercache.lab.tools import mooncake_te as te
from peercache.lab.tools import nixl as nx
from peercache.lab.tools import peercache_pypi as pypi

ROOT = Path(__file__).resolve().parents[4]
FIX = ROOT / "tests/fixtures/lab/engines"


def _read(name: str) -> str:
    return (FIX / name).read_text()


# -- Mooncake transfer_engine_bench ------------------------------------------------------------------

def test_te_commands_p2p_handshake_and_matched_geometry():
    t = te.target_command("/x/te", "tcp", "198.18.77.1", 131072, 32, 2, 8 << 20)
    i = te.initiator_command("/x/te", "tcp", "198.18.77.2", "198.18.77.1:{te_port}", 131072, 32, 2, 8 << 20, 3)
    assert t[:2] == ["/x/te", "--mode=target"]
    for argv in (t, i):
        assert "--metadata_server=P2PHANDSHAKE" in argv and "--protocol=tcp" in argv
        assert {"--block_size=131072", "--batch_size=32", "--threads=2", "--buffer_size=8388608"} <= set(argv)
        assert "--logtostderr" in argv and not any(a.startswith("--device_name") for a in argv)
    assert {"--mode=initiator", "--operation=read", "--segment_id=198.18.77.1:{te_port}", "--duration=3"} <= set(i)
    assert "--local_server_name=198.18.77.2" in i and "--local_server_name=198.18.77.1" in t


def test_te_rdma_takes_the_device_and_gid_index():
    t = te.target_command("/x/te", "rdma", "198.18.0.1", 4096, 32, 1, 1 << 20, device="rxe_a0", gid_index=1)
    assert t[:2] == ["env", "MC_GID_INDEX=1"] and "--device_name=rxe_a0" in t and "--protocol=rdma" in t
    with pytest.raises(ValueError, match="needs the RDMA device"):
        te.target_command("/x/te", "rdma", "198.18.0.1", 4096, 32, 1, 1 << 20)


def test_te_refuses_a_buffer_smaller_than_what_the_threads_touch():
    assert te.buffer_bytes(131072, 32, 2) == 8 << 20 and te.buffer_bytes(4096, 32, 1, 256 << 20) == 256 << 20
    with pytest.raises(ValueError, match="smaller than block x batch x threads"):
        te.target_command("/x/te", "tcp", "h", 131072, 32, 2, 4 << 20)
    with pytest.raises(ValueError, match="protocol"):
        te.target_command("/x/te", "shm", "h", 131072, 32, 1, 4 << 20)


def test_te_ready_pattern_gives_the_port_its_handshake_picked():
    m = re.search(te.TARGET_READY, _read("te_target_netns_tcp_s128K.log"), re.M)
    assert m and m["te_port"] == "15584" and m["te_host"] == "198.18.77.1"
    # not ready before the buffer is being set up
    assert not re.search(te.TARGET_READY, _read("te_target_netns_tcp_s128K.log").split("DRAM")[0], re.M)
    assert fill_placeholders(["--segment_id=198.18.77.1:{te_port}", '{"a": 1}'], {"te_port": "16390"}) == \
        ["--segment_id=198.18.77.1:16390", '{"a": 1}']


def test_te_parse_netns_capture():
    r = te.parse_log(_read("te_initiator_netns_tcp_t1_s128K_b32.log"), 131072, 32, 1)
    assert (r.duration_s, r.batches, r.printed_rate, r.printed_unit) == (2.15, 31, 60.414, "MB")
    assert r.bytes == 31 * 32 * 131072
    assert r.gb_per_s == pytest.approx(31 * 32 * 131072 / 2.15 / 1e9)
    rows = te.to_rows(r, experiment="local", scenario="engines", run_id="x", tool=te.TOOL)
    tp = next(x for x in rows if x.metric == "get_throughput")
    assert tp.extra["verified"] is False and tp.extra["verification"].startswith("unverified")
    assert (tp.size_bytes, tp.batch, tp.threads, tp.unit) == (131072, 32, 1, "GB/s")


def test_te_parse_loopback_capture_in_the_tools_default_unit():
    r = te.parse_log(_read("te_initiator_loopback_tcp_t1_s128K_b32.log"), 131072, 32, 1)
    assert (r.batches, r.printed_rate, r.printed_unit) == (871, 1.82, "GB")
    assert r.gb_per_s == pytest.approx(1.8175, abs=1e-3)


@pytest.mark.parametrize("size, name, want", [
    (131072, "te_initiator_rxe_rdma_t1_s128K_b32.log", (5.64, 7, 5.202)),
    (4096, "te_initiator_rxe_rdma_t1_s4K_b32.log", (5.05, 48, 1.245)),
])
def test_te_parse_rdma_captures_over_soft_roce(size, name, want):
    # the softroce testbed's engines points: initiator on rxe_b0, target on rxe_a0, GID index 1
    r = te.parse_log(_read(name), size, 32, 1, device="rxe_b0")
    assert (r.duration_s, r.batches, r.printed_rate, r.printed_unit) == (*want, "MB")
    assert r.gb_per_s == pytest.approx(want[1] * 32 * size / want[0] / 1e9)
    # a figure is never one of another device than the one asked for
    with pytest.raises(ParseError, match="never says it opened RDMA device rxe_b1 [(]it opened rxe_b0[)]"):
        te.parse_log(_read(name), size, 32, 1, device="rxe_b1")
    with pytest.raises(ParseError, match="opened none"):
        te.parse_log(_read("te_initiator_netns_tcp_t1_s128K_b32.log"), 131072, 32, 1, device="rxe_b0")
    m = re.search(te.TARGET_READY, _read(f"te_target_rxe_rdma_s{size // 1024}K.log"), re.M)
    assert m and m["te_host"] == "198.18.0.1"


def test_te_parse_refuses_a_geometry_the_tool_did_not_run():
    with pytest.raises(ParseError, match="disagrees"):
        te.parse_log(_read("te_initiator_netns_tcp_t1_s128K_b32.log"), 131072, 64, 1)


def test_te_parse_names_a_failure_and_refuses_a_cut_log():
    with pytest.raises(ToolError) as e:
        te.parse_log(_read("te_initiator_no_target.log"), 131072, 32, 1)
    assert e.value.kind == "cannot_connect" and "Unable to get target segment ID" in str(e.value)
    cut = "\n".join(ln for ln in _read("te_initiator_netns_tcp_t1_s128K_b32.log").splitlines()
                    if "Test completed" not in ln)
    with pytest.raises(ParseError, match="no 'Test completed"):
        te.parse_log(cut, 131072, 32, 1)
    twice = _read("te_initiator_netns_tcp_t1_s128K_b32.log") * 2
    with pytest.raises(ParseError, match="second result line"):
        te.parse_log(twice, 131072, 32, 1)


# -- the published PeerCache 0.8.4 ---------------------------------------------------------------

def test_pypi_commands():
    s = pypi.serve_command("/v/peercache-bench", "tcp", "198.18.77.1:42000", "198.18.77.1", "mla", 131072, 256)
    d = pypi.drive_command("/v/peercache-bench", "tcp", "198.18.77.1:42000", "198.18.77.2", "mla", 131072, 256,
                           32, 2, 2.0, 0.5, "/tmp/o", dir_cache_ttl=5)
    assert s[:2] == ["/v/peercache-bench", "serve"] and s[s.index("--readers") + 1] == "1"
    assert d[:2] == ["/v/peercache-bench", "drive"]
    flag = {d[k]: d[k + 1] for k in range(2, len(d) - 1) if d[k].startswith("--")}
    assert flag["--concurrencies"] == "2" and flag["--batch-size"] == "32" and flag["--op"] == "get"
    assert flag["--dir-cache-ttl"] == "5" and flag["--out-dir"] == "/tmp/o" and flag["--local-host"] == "198.18.77.2"
    r = pypi.serve_command("/v/p", "rdma", "a:1", "a", "mla", 4096, 256, device="rxe_a0", gid_index=1)
    assert r[r.index("--device-name") + 1] == "rxe_a0" and r[r.index("--gid-index") + 1] == "1"
    with pytest.raises(ValueError):
        pypi.serve_command("/v/p", "shm", "a:1", "a", "mla", 4096, 256)


def test_pypi_ready_line_and_report_path_from_real_logs():
    assert re.search(pypi.SERVE_READY, _read("pcpypi_serve_netns_tcp_s128K.log"), re.M)
    assert pypi.report_path(_read("pcpypi_drive_netns_tcp_t1_s128K_b32.log")).endswith(".json")
    with pytest.raises(ParseError, match="one 'wrote PATH.json'"):
        pypi.report_path(_read("pcpypi_drive_no_serve.log"))
    e = pypi.failure(_read("pcpypi_drive_no_serve.log"), "")
    assert e is not None and e.kind == "cannot_connect"


@pytest.mark.parametrize("name", ["pcpypi_drive_netns_tcp_t1_s128K_b32.json",
                                  "pcpypi_drive_loopback_tcp_t1_s128K_b32.json"])
def test_pypi_parse_real_reports(name):
    doc = json.loads(_read(name))
    r = pypi.parse_report(_read(name))
    want = doc["results"][0]
    assert r.gb_per_s == pytest.approx(want["bytes_total"] / want["duration_s"] / 1e9)
    assert (r.block_size, r.batch_size, r.threads, r.hit_rate) == (131072, 32, 1, 1.0)
    assert r.latency_us["latency_p50"] == want["lat_us_p50"] and r.latency_us["latency_p99"] == want["lat_us_p99"]
    rows = pypi.to_rows(r, experiment="local", scenario="engines", run_id="x", tool=pypi.TOOL)
    assert {x.metric for x in rows} == {"get_throughput", "pages_per_s", "hit_rate", "latency_p50", "latency_p99",
                                        "latency_p999"}
    assert all(x.extra["verified"] is False for x in rows)


@pytest.mark.parametrize("change, match", [
    (lambda d: d["results"].append(dict(d["results"][0])), "2 results"),
    (lambda d: d["results"][0].update(ok=False), "ok=false"),
    (lambda d: d["results"][0].pop("bytes_total"), "no 'bytes_total'"),
    (lambda d: d["results"][0].update(throughput_gbps=d["results"][0]["throughput_gbps"] * 2), "disagrees"),
    (lambda d: d["meta"].update(op="exists"), "not a drive of get"),
    (lambda d: d["results"][0].update(hit_rate=1.5), "not a ratio"),
])
def test_pypi_parse_refuses_what_is_not_one_consistent_get_point(change, match):
    doc = json.loads(_read("pcpypi_drive_netns_tcp_t1_s128K_b32.json"))
    change(doc)
    with pytest.raises(ParseError, match=match):
        pypi.parse_report(json.dumps(doc))


# -- a missing engine venv -------------------------------------------------------------------------

@pytest.mark.parametrize("point, venv", [("mc_tcp_t1_s128K_b32", ".venv-mooncake"),
                                         ("pcpypi_tcp_t1_s128K_b32_ws256", ".venv-peercache-pypi"),
                                         ("nixl_tcp_t1_s128K_b32_ws256", ".venv-nixl")])
def test_a_point_whose_engine_venv_is_missing_is_skipped_saying_so(point, venv, tmp_path, monkeypatch, capsys):
    sc = experiments.load_scenarios()
    tb = experiments.load_testbed(ROOT / "experiments/testbeds/local.yaml", sc)
    pt = experiments.find_point(experiments.expand(tb, sc), "engines", point)
    monkeypatch.setattr(engine_venv, "engine_path", lambda rel: str(tmp_path / rel))   # nothing there
    th = runpoint.TestbedHosts(LocalHost(), LocalHost(), "127.0.0.1", "127.0.0.1", None)
    rows = runpoint.run_point(tb, pt, 0, tmp_path / "out" / "result.json", hosts=th)
    assert len(rows) == 1 and rows[0].status == "skipped"
    assert rows[0].reason.startswith(f"engine venv {venv} missing: ") and "run `make engines`" in rows[0].reason
    assert str(tmp_path / venv) in rows[0].reason and "producer" in rows[0].reason and "consumer" in rows[0].reason
    assert f"skipped: engine venv {venv} missing" in capsys.readouterr().err


# -- the scenario -------------------------------------------------------------------------------

def _engines(testbed: str) -> list:
    sc = experiments.load_scenarios()
    tb = experiments.load_testbed(ROOT / testbed, sc)
    tb.doc["scenarios"] = ["engines"]
    return experiments.expand(tb, sc)


def test_engines_scenario_matches_every_engine_to_peercaches_shapes():
    pts = _engines("experiments/testbeds/local.yaml")
    cells = {}
    for p in pts:
        if p.kind in ("peercache", "mooncake_te", "peercache_pypi", "nixl"):
            cells.setdefault(p.kind, set()).add((p.params["page_size"], p.params["batch_size"], p.params["threads"]))
            assert p.params["protocol"] == "tcp"
    # local: the 4 KiB and 128 KiB cells at one thread, three repetitions each (test_run_order.py)
    assert cells["peercache"] == cells["mooncake_te"] == cells["peercache_pypi"] == cells["nixl"] == \
        {(s, 32, 1) for s in (4096, 131072)}
    raw = [p for p in pts if p.kind == "iperf3"]
    assert {(p.params["processes"], p.params["length"], p.params["window"]) for p in raw} == \
        {(1, 133376, 133376), (1, 1 << 20, 256 << 10)}
    assert all(p.params["reverse"] and p.params["omit_warmup"] for p in raw)
    rdma = _engines("experiments/testbeds/softroce.yaml")
    mc = [p for p in rdma if p.kind == "mooncake_te"]
    assert mc and all(p.params["protocol"] == "rdma" and p.params["devices"] == ["rxe_b0"] for p in mc)
    nixl = [p for p in rdma if p.kind == "nixl"]
    assert nixl and all(p.params["protocol"] == "rdma" and p.params["working_set"] == 256 for p in nixl)
    assert all(p.params["working_set"] == 256 for p in pts if p.kind == "nixl")


def test_softroce_runs_the_engines_at_the_cells_an_emulated_guest_can_run_with_the_raw_limit_of_each():
    tb = experiments.load_testbed(ROOT / "experiments/testbeds/softroce.yaml", experiments.load_scenarios())
    assert "engines" in tb["scenarios"]
    pts = [p for p in experiments.expand(tb) if p.scenario == "engines"]
    cells = {}
    for p in pts:
        if p.kind in ("peercache", "mooncake_te", "peercache_pypi", "nixl"):
            cells.setdefault(p.kind, set()).add((p.params["page_size"], p.params["batch_size"],
                                                 p.params["processes"] * p.params["threads"]))
            assert p.params["protocol"] == "rdma" and p.params["devices"] == ["rxe_b0"] and not p.skip_reason
    assert cells["peercache"] == cells["mooncake_te"] == cells["peercache_pypi"] == cells["nixl"] == {(131072, 32, 1)}
    raw = [p for p in pts if p.kind == "perftest"]
    # one QP (one reader thread) at the page size, the batch's 32 READs in flight
    assert [(p.params["tool"], p.params["qps"], p.params["size"], p.params["tx_depth"]) for p in raw] == \
        [("ib_read_bw", 1, 131072, 32)]


def test_raw_4k_limit_is_the_shape_of_peercaches_4k_batch():
    from peercache.transport.tcp import batch_wire
    w = batch_wire(4096, 32)
    assert (w["request_bytes"], w["in_flight_bytes"]) == (133376, 133376)
    for size in (131072, 1048576):
        w = batch_wire(size, 32)
        assert (w["request_bytes"], w["in_flight_bytes"]) == (1 << 20, 256 << 10)


def test_an_engine_part_with_an_unknown_protocol_is_refused(tmp_path):
    bad = tmp_path / "s.yaml"
    bad.write_text("e:\n  description: x\n  rdma: {m: {kind: mooncake_te, protocol: shm, page_size: [4096], "
                   "batch_size: [32], threads: [1]}}\n  local: {m: {kind: mooncake_te, protocol: tcp, "
                   "page_size: [4096], batch_size: [32], threads: [1]}}\n")
    with pytest.raises(experiments.DefinitionError, match="rdma.m"):
        experiments.load_scenarios(bad)


# -- the report's table ------------------------------------------------------------------------------

def _frame():
    from peercache.lab.analysis import collect
    from peercache.lab.tidy import Row
    wire = {"request_bytes": 1 << 20, "in_flight_bytes": 256 << 10}

    def row(scenario, tool, metric, value, unit, run, **kw):
        return Row(experiment="local", scenario=scenario, run_id=f"local/{scenario}/{run}/rep0", metric=metric,
                   value=value, unit=unit, tool=tool, protocol="tcp", **kw)
    rows = [
        row("single_nic", "iperf3", "bw", 2e9, "B/s", "iperf3_P1", size_bytes=1 << 20, qps=1, processes=1,
            extra={"reverse": True, "window": 256 << 10}),
        row("engines", "peercache-bench", "get_throughput", 1.5, "GB/s", "pc1", size_bytes=131072, batch=32,
            threads=1, processes=1, extra={"tcp_wire": wire, "verified": True}),
        row("engines", "peercache-bench", "latency_p50", 2000.0, "us", "pc1", size_bytes=131072, threads=1,
            processes=1),
        row("engines", "transfer_engine_bench", "get_throughput", 0.5, "GB/s", "mc1", size_bytes=131072, batch=32,
            threads=1, processes=1, extra={"verified": False, "verification": "unverified: never checks"}),
        row("engines", "peercache-bench==0.8.4", "get_throughput", 1.0, "GB/s", "pp1", size_bytes=131072,
            batch=32, threads=1, processes=1, extra={"verified": False, "verification": "unverified: counts hits"}),
        row("engines", "peercache-bench==0.8.4", "latency_p99", 9000.0, "us", "pp1", size_bytes=131072,
            threads=1, processes=1),
        row("engines", "nixl_driver", "get_throughput", 0.3, "GB/s", "nx1", size_bytes=131072, batch=32,
            threads=1, processes=1, extra={"verified": True, "verification": "verified: 99 pages checked"}),
        row("engines", "nixl_driver", "latency_p50", 13000.0, "us", "nx1", size_bytes=131072, threads=1,
            processes=1),
        # a 4 KiB cell without a raw run of its shape
        row("engines", "peercache-bench", "get_throughput", 0.2, "GB/s", "pc4", size_bytes=4096, batch=32,
            threads=1, processes=1, extra={"tcp_wire": {"request_bytes": 133376, "in_flight_bytes": 133376},
                                           "verified": True}),
        Row(experiment="local", scenario="engines", run_id="local/engines/mc4/rep0", metric="get_throughput",
            value=None, unit="GB/s", status="skipped", tool="transfer_engine_bench",
            reason="engine venv .venv-mooncake missing: ...; run `make engines`"),
    ]
    return collect.rows_frame(rows)


def test_engines_table_compares_every_engine_of_a_cell_with_the_cells_raw_limit():
    from peercache.lab.analysis.scenarios import engines
    recs = engines.table(_frame())
    by = {(r["page"], r["engine"]): r for r in recs}
    assert by[(131072, "raw limit")]["GB/s"] == pytest.approx(2.0)
    assert by[(131072, "PeerCache")]["% of raw"] == pytest.approx(75.0)
    assert by[(131072, "Mooncake TE")]["% of raw"] == pytest.approx(25.0)
    assert by[(131072, "PeerCache 0.8.4 (PyPI)")]["% of raw"] == pytest.approx(50.0)
    assert by[(131072, "NIXL (UCX)")]["% of raw"] == pytest.approx(15.0)
    assert by[(131072, "NIXL (UCX)")]["p50"] == "1.3e+04 µs" and by[(131072, "NIXL (UCX)")]["p99"] == "not reported"
    assert by[(131072, "NIXL (UCX)")]["verification"].startswith("verified")
    assert [r["engine"] for r in recs if r["page"] == 131072] == ["PeerCache", "Mooncake TE", "NIXL (UCX)",
                                                                 "PeerCache 0.8.4 (PyPI)", "raw limit"]
    assert by[(131072, "PeerCache")]["p50"] == "2000 µs" and by[(131072, "Mooncake TE")]["p50"] == "not reported"
    assert by[(131072, "PeerCache 0.8.4 (PyPI)")]["p99"] == "9000 µs"
    assert by[(131072, "PeerCache")]["verification"].startswith("verified")
    assert by[(131072, "Mooncake TE")]["verification"] == "unverified: never checks"
    assert by[(131072, "PeerCache 0.8.4 (PyPI)")]["verification"] == "unverified: counts hits"
    four = by[(4096, "PeerCache")]
    assert four["% of raw"] is None and four["raw limit"].startswith("none: no iperf3 run with 1 connection(s)")
    assert (4096, "raw limit") not in by
    assert engines.skipped(_frame()) == ["Mooncake TE mc4: skipped: engine venv .venv-mooncake missing: ...; "
                                         "run `make engines`"]


def test_engines_chart_and_report_table_are_drawn_from_the_rows():
    from peercache.lab.analysis import report
    from peercache.lab.analysis.scenarios import engines
    from peercache.lab.analysis.scenarios.declare import Chart
    from peercache.lab.analysis.scenarios.draw import plt
    rows = _frame()
    chart = engines.figure(rows, pd.DataFrame(columns=["run_id"]), None)
    assert isinstance(chart, Chart) and chart.name == "engines"
    assert {t["engine"] for t in chart.table} == {"PeerCache", "Mooncake TE", "NIXL (UCX)", "PeerCache 0.8.4 (PyPI)",
                                                  "raw limit"}
    assert any("venv .venv-mooncake missing" in n for n in chart.notes)
    plt.close(chart.fig)
    [(title, recs)] = report.compact_tables("engines", rows, {})
    assert {r["engine"] for r in recs} == {"PeerCache", "Mooncake TE", "NIXL (UCX)", "PeerCache 0.8.4 (PyPI)"}
    assert next(r for r in recs if r["engine"] == "Mooncake TE")["% of raw"] == "25%"


def test_overview_gives_each_engine_its_best_cell_not_the_raw_run():
    from peercache.lab.analysis import report
    ov = report.overview_table(_frame())
    eng = ov[ov["scenario"].str.startswith("engines")].to_dict("records")
    assert [r["scenario"] for r in eng] == [
        "engines: PeerCache, best cell 128 KiB 1 thr", "engines: Mooncake TE, best cell 128 KiB 1 thr",
        "engines: NIXL (UCX), best cell 128 KiB 1 thr", "engines: PeerCache 0.8.4 (PyPI), best cell 128 KiB 1 thr"]
    assert eng[0]["GET throughput"].startswith("1.5\u00a0GB/s") and eng[0]["% of single-NIC raw limit"].startswith("75% of iperf3")
    assert eng[1]["notes"] == "unverified: never checks; measured once" and eng[0]["notes"].startswith("verified")


def test_make_engines_makes_the_venvs_the_kinds_run_from_and_make_run_needs_them():
    mk = (ROOT / "Makefile").read_text()
    assert re.search(rf"^MOONCAKE_VENV\s*\?=\s*{re.escape(te.VENV)}$", mk, re.M)
    assert re.search(rf"^PCPYPI_VENV\s*\?=\s*{re.escape(pypi.VENV)}$", mk, re.M)
    assert re.search(r"^PCPYPI_VERSION\s*\?=\s*" + re.escape(pypi.VERSION) + "$", mk, re.M)
    assert te.BINARY == f"{te.VENV}/bin/transfer_engine_bench-native" and "transfer_engine_bench-native" in mk
    assert re.search(rf"^NIXL_VENV\s*\?=\s*{re.escape(nx.VENV)}$", mk, re.M) and nx.BINARY == f"{nx.VENV}/bin/python"
    assert re.search(r"pip install -q --no-deps nixl-cu12==\$\(NIXL_VERSION\) numpy$", mk, re.M)
    assert re.search(r"^engines: \$\(MOONCAKE_VENV\)/\.installed \$\(PCPYPI_VENV\)/\.installed "
                     r"\$\(NIXL_VENV\)/\.installed$", mk, re.M)
    # the engines scenario is in the local testbed's default plan, so make run (and make bench) make them first
    assert "engines" in experiments.load_testbed(ROOT / "experiments/testbeds/local.yaml")["scenarios"]
    assert re.search(r"^run: setup engines$", mk, re.M) and re.search(r"^bench: setup engines$", mk, re.M)
    ignored = (ROOT / ".gitignore").read_text().split()
    assert f"{te.VENV}/" in ignored and f"{pypi.VENV}/" in ignored and f"{nx.VENV}/" in ignored


def test_pair_runner_gives_the_client_what_the_servers_ready_line_named(tmp_path):
    from peercache.lab.launch.runners import PairRunner, Readiness, SideSpec
    h = LocalHost()
    server = SideSpec(h, ["sh", "-c", "echo 'listening on 127.0.0.1:40123'; sleep 30"], numactl=False)
    client = SideSpec(h, ["echo", "segment=127.0.0.1:{te_port}", "{kept}"], numactl=False)
    res = PairRunner(server, client, Readiness(pattern=r"listening on [\d.]+:(?P<te_port>\d+)", timeout=10),
                     server_exits=False, log_dir=tmp_path, grace=0.5).run()
    assert res.client.stdout.split() == ["segment=127.0.0.1:40123", "{kept}"]
    assert res.client.command[1] == "segment=127.0.0.1:40123"       # what ran is what the result records


def test_the_unverified_caption_says_the_other_engines_check_nothing():
    from peercache.lab.analysis import charts
    note = charts.unverified_note(_frame())
    # NIXL's row is verified (our driver checks every page): not counted
    assert note == ("unverified: 2 of 5 GET figure(s) ran without checking page contents (other engines, which "
                    "never check the bytes they read)")


def test_a_cell_measured_three_times_shows_its_median_spread_and_each_sides_cpu_per_gib():
    """Issue 40: the median with min–max over the repetitions, % of raw of the median, CPU-seconds per GiB of
    both sides; one measurement says so."""
    from peercache.lab.analysis import collect
    from peercache.lab.analysis.scenarios import engines
    from peercache.lab.tidy import Row

    def rep(k, gbs, consumer, producer):
        cpu = {"consumer": {"cores": consumer}, "producer": {"cores": producer}}
        return Row(experiment="local", scenario="engines", run_id=f"local/engines/mc1/rep{k}", metric="get_throughput",
                   value=gbs, unit="GB/s", tool="transfer_engine_bench", protocol="tcp", size_bytes=131072, batch=32,
                   threads=1, processes=1, extra={"cpu": cpu})
    frame = _frame()
    frame = frame[frame["tool"] != "transfer_engine_bench"]
    more = collect.rows_frame([rep(0, 0.5, 1.0, 0.5), rep(1, 0.9, 1.0, 0.6), rep(2, 0.6, 1.2, 0.5)])
    recs = engines.table(pd.concat([frame, more], ignore_index=True))
    mc = next(r for r in recs if r["engine"] == "Mooncake TE")
    assert mc["spread"] == {"median": 0.6, "min": 0.5, "max": 0.9, "n": 3}
    assert mc["% of raw"] == pytest.approx(100 * 0.6 / 2.0)
    # the median run (rep2, 0.6 GB/s) gives the CPU: its cores over its GiB/s
    gib = 0.6e9 / 2**30
    assert mc["cpu_s_per_gib"] == pytest.approx({"consumer": 1.2 / gib, "producer": 0.5 / gib})
    shown = engines.shown(mc)
    assert shown["GB/s"] == "0.6 (0.5–0.9, 3 runs)" and shown["CPU per GiB"].endswith(" s/GiB")
    ours = next(r for r in recs if (r["engine"], r["page"]) == ("PeerCache", 131072))
    assert engines.shown(ours)["GB/s"] == "1.5 (measured once)"


def test_the_figure_says_how_each_engine_was_windowed_from_its_runs():
    """Issue 40: the method is said in the caption; a tool without warm-up says so, from its own rows."""
    import json
    from peercache.lab.analysis.scenarios import engines
    rows = _frame()
    runs = pd.DataFrame([{"run_id": rid, "params": json.dumps({"duration": 2.0, "warmup": 0.5})}
                         for rid in rows["run_id"].unique()])
    mc = rows["tool"] == "transfer_engine_bench"
    none = "none (the tool has none)"
    rows.loc[mc, "extra"] = rows.loc[mc, "extra"].map(
        lambda e: json.dumps(dict(json.loads(e) if isinstance(e, str) else (e or {}), warmup=none)))
    said = engines.window_method(rows, runs)
    assert said.startswith("windows: ") and "Mooncake TE 2 s, warm-up none (the tool has none)" in said
    assert "PeerCache, NIXL (UCX), PeerCache 0.8.4 (PyPI) 2 s after 0.5 s of warm-up" in said
    chart = engines.figure(rows, runs, None)
    assert said in chart.notes
