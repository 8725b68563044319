"""The point-kind registry: typed knobs, grids, names, the generated schemas and every list derived from them."""
import re
from pathlib import Path

import pytest
import yaml

from peercache.lab import tidy
from peercache.lab.pipeline import experiments, kinds
from peercache.lab.pipeline.plan import Plan

ROOT = Path(__file__).resolve().parents[3]
GOLDEN = Path(__file__).resolve().parents[1] / "point_names.txt"


def _names(tb: str, scenarios=None) -> list[str]:
    sc = experiments.load_scenarios(scenarios) if scenarios else experiments.load_scenarios()
    # the example roce-8x-cx7.yaml plans with its <placeholders> standing in for the hosts
    t = experiments.load_testbed(ROOT / tb, sc, allow_placeholders=True)
    return [f"{p.scenario} {p.name}" for p in experiments.expand(t, sc)]


def test_point_names_are_those_of_the_tidy_data_and_charts():
    # The golden list was written by the hand-written expansion this registry replaced.
    want: dict[str, list[str]] = {}
    for line in GOLDEN.read_text().splitlines():
        tb, sc, name = line.split()
        want.setdefault(tb, []).append(f"{sc} {name}")
    for tb in ("local", "roce-8x-cx7", "softroce"):
        assert _names(f"experiments/testbeds/{tb}.yaml") == want[tb], tb
    assert _names("tests/fixtures/pipeline/tiny.yaml", ROOT / "tests/fixtures/pipeline/tiny-scenarios.yaml") \
        == want["tiny"]


def test_every_kind_declares_typed_knobs_metrics_in_known_units_and_a_runner():
    assert set(kinds.KINDS) == {"perftest", "iperf3", "memcpy", "peercache", "group", "node_api", "sockperf", "hicache",
                                 "dirlookup", "redis_benchmark", "mooncake_te", "peercache_pypi", "nixl",
                                 "hicache_suite", "cluster", "growth", "directory_faults", "get_trace"}
    for name, k in kinds.KINDS.items():
        # one module per kind: its declaration, its run, its sanity check and its metric extraction
        assert k.__module__ == f"peercache.lab.pipeline.points.{name}", name
        assert k.run.__func__ is not kinds.Kind.run.__func__, name
        assert k.primary in k.metrics and all(u in tidy.UNITS for u in k.metrics.values()), name
        for knob in k.knobs.values():
            assert knob.doc and "type" in knob.schema or "enum" in knob.schema, (name, knob.name)


def test_a_registered_kind_must_say_how_it_runs():
    with pytest.raises(TypeError, match="kind warp: define run"):
        class Warp(kinds.Timed):
            name = "warp"
            metrics = {"bw": "B/s"}
            primary = "bw"

            @classmethod
            def point_name(cls, one):
                return "warp"

            @classmethod
            def row_tool(cls, params):
                return "warp"
    assert "warp" not in kinds.KINDS


def test_a_grid_is_the_product_of_its_parameters_in_declaration_order():
    part = {"kind": "peercache", "protocol": "tcp", "layout": "mla", "page_size": [4096, 8192],
            "batch_size": [8], "processes_x_threads": [[1, 1], [1, 2]]}
    pts = experiments.expand_part("s", "p", part, [])
    assert [p.name for p in pts] == ["pc_tcp_p1x1_s4K_b8", "pc_tcp_p1x2_s4K_b8", "pc_tcp_p1x1_s8K_b8",
                                     "pc_tcp_p1x2_s8K_b8"]
    assert all(p.part == "p" and p.kind == "peercache" and not p.skipped for p in pts)
    # a variable that differs from its default shows in the name, so two such parts never collide
    tagged = experiments.expand_part("s", "p", dict(part, verify=False, working_set=64, integrity=True), [])
    assert tagged[0].name == "pc_tcp_p1x1_s4K_b8_ws64_noverify_integrity"
    assert tagged[0].params["verify"] is False and tagged[0].params["integrity"] is True
    metrics = experiments.expand_part("s", "p", dict(part, metrics_endpoint=True), [])
    assert metrics[0].name == "pc_tcp_p1x1_s4K_b8_metrics" and metrics[0].params["metrics_endpoint"] is True


def test_point_kind_must_be_registered():
    with pytest.raises(ValueError, match="kind 'warp' is not one of"):
        experiments.Point("s", "n", "warp")


@pytest.mark.parametrize("edit, field", [
    (lambda d: d["single_nic"]["rdma"]["raw"].update(qsp=[1]), "single_nic.rdma.raw.qsp"),
    (lambda d: d["single_nic"]["rdma"]["raw"].update(qps=16), "single_nic.rdma.raw.qps"),
    (lambda d: d["single_nic"]["rdma"]["raw"].update(kind="perfect"), "single_nic.rdma.raw.kind"),
    (lambda d: d["multi_rail"]["local"]["peercache"].pop("layout"), "multi_rail.local.peercache"),
    (lambda d: d["msgsize_sweep"].pop("local"), "msgsize_sweep"),
    (lambda d: d["whole_machine"]["rdma"]["group"].update(protocol="udp"), "whole_machine.rdma.group.protocol"),
])
def test_a_scenario_typo_names_the_file_and_the_field(tmp_path, edit, field):
    doc = yaml.safe_load(experiments.SCENARIOS_FILE.read_text())
    edit(doc)
    bad = tmp_path / "scenarios.yaml"
    bad.write_text(yaml.safe_dump(doc))
    with pytest.raises(experiments.DefinitionError) as e:
        experiments.load_scenarios(bad)
    assert str(bad) in str(e.value) and f"field '{field}'" in str(e.value), str(e.value)


def test_the_testbed_scenario_enum_and_the_wildcard_come_from_the_scenario_file(tmp_path):
    names = experiments.scenario_names()
    assert names == tuple(yaml.safe_load(experiments.SCENARIOS_FILE.read_text()))
    schema = experiments.testbed_schema()
    assert schema["properties"]["scenarios"]["items"]["enum"] == list(names)
    assert set(schema["properties"]["grid_overrides"]["properties"]) == set(names)
    # nothing in the hand-written files lists the scenarios any more
    for f in ("experiments/testbed.schema.yaml", "Snakefile"):
        assert not re.search(r"multi_rail|whole_machine|msgsize_sweep", (ROOT / f).read_text()), f
    assert Plan("experiments/testbeds/local.yaml").scenario_names() == "|".join(names)
    # a scenario added to the file is a valid testbed scenario at once
    doc = yaml.safe_load(experiments.SCENARIOS_FILE.read_text())
    doc["warp_drive"] = doc["single_nic"]
    sc_file = tmp_path / "sc.yaml"
    sc_file.write_text(yaml.safe_dump(doc))
    tb = yaml.safe_load((ROOT / "experiments/testbeds/local.yaml").read_text())
    tb["scenarios"] = ["warp_drive"]
    tb_file = tmp_path / "tb.yaml"
    tb_file.write_text(yaml.safe_dump(tb))
    sc = experiments.load_scenarios(sc_file)
    assert {p.scenario for p in experiments.expand(experiments.load_testbed(tb_file, sc), sc)} == {"warp_drive"}


def test_a_grid_override_is_checked_against_the_kind(tmp_path):
    tb = yaml.safe_load((ROOT / "experiments/testbeds/softroce.yaml").read_text())
    tb["grid_overrides"] = {"single_nic": {"peercache": {"processes_x_threads": [[1]]}}}
    f = tmp_path / "tb.yaml"
    f.write_text(yaml.safe_dump(tb))
    with pytest.raises(experiments.DefinitionError, match=r"field 'grid_overrides.single_nic.peercache'"):
        experiments.expand(experiments.load_testbed(f))


def test_charts_and_report_read_the_scenarios_from_the_registry():
    from peercache.lab.analysis import charts
    from peercache.lab.analysis.scenarios.declare import GET_SCENARIOS
    assert charts.SCENARIOS == experiments.scenario_names()
    # GET scenarios: those with a PeerCache kind; the raw-only sweep is not one
    assert "msgsize_sweep" not in GET_SCENARIOS and "single_nic" in GET_SCENARIOS


def test_skipped_points_keep_their_kind_and_the_skip_row_says_its_tool(tmp_path):
    from peercache.lab.pipeline.runpoint import PointRun
    plan = Plan("experiments/testbeds/local.yaml")
    gpu = [p for p in plan.points if p.scenario == "gpudirect"]
    assert gpu and all(p.skipped and p.kind == "peercache" for p in gpu)
    pr = PointRun(plan.testbed, gpu[0], 0, tmp_path)
    pr.skip()
    (row,) = pr.rows
    assert (row.tool, row.metric, row.unit, row.status) == ("peercache-bench", "get_throughput", "GB/s", "skipped")
