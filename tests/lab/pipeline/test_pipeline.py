"""The Snakemake pipeline: lint, dry runs, definition errors, a real tiny run."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from peercache.lab.pipeline import experiments
from peercache.lab.pipeline.plan import Plan
from peercache.lab.pipeline.runpoint import canonical_metric

ROOT = Path(__file__).resolve().parents[3]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]
TINY = "tests/fixtures/pipeline/tiny.yaml"
TINY_SCENARIOS = "tests/fixtures/pipeline/tiny-scenarios.yaml"


def snakemake(*args, cwd=ROOT, timeout=600):
    return subprocess.run([*SNAKEMAKE, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def test_lint_is_clean():
    r = snakemake("--lint")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Congratulations" in r.stdout + r.stderr


def test_dry_run_every_scenario_on_the_rdma_testbed(tmp_path):
    # the example with its <placeholders> filled in, as a user's copy of it is
    doc = experiments.fill_placeholders(yaml.safe_load((ROOT / "experiments/testbeds/roce-8x-cx7.yaml").read_text()))
    assert doc["hosts"]["producer"]["host"] == "ssh:placeholder-1" and not experiments.placeholders(doc)
    tb = tmp_path / "roce-8x-cx7.yaml"
    tb.write_text(yaml.safe_dump(doc))
    r = snakemake("-n", "--cores", "4", "--config", f"testbed={tb}")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    plan = Plan(str(tb))
    assert [p.name for p in plan.points] == [p.name for p in Plan("experiments/testbeds/roce-8x-cx7.yaml",
                                                                  allow_placeholders=True).points]
    listed = list(plan.testbed["scenarios"])
    for sc in listed:
        assert f"wildcards: scenario={sc}, point=" in out, sc
    # every scenario of the file is in its list but growth (one host) and cluster (N hosts), each selected by a
    # testbed file of its own (local-growth, local-cluster), and directory_faults (the directory's own faults,
    # whose traffic is TCP over any data path: the local testbed runs it)
    assert set(experiments.scenario_names()) - set(listed) == {"growth", "cluster", "directory_faults"}
    assert "wildcards: scenario=growth" not in out
    assert "run_point" in out and "capture_host" in out and "report" in out
    assert len(plan.result_paths()) == len(plan.points) * 3          # repetitions: 3
    assert {p.kind for p in plan.points} == {"perftest", "peercache", "group", "mooncake_te", "peercache_pypi",
                                             "nixl", "hicache_suite"}
    assert not any(p.skipped for p in plan.points)
    assert any("ib_read_bw_q16_s128K" in p for p in plan.result_paths())


def test_softroce_testbed_runs_every_rdma_scenario_in_one_guest_job(tmp_path):
    tb = "experiments/testbeds/softroce.yaml"
    plan = Plan(tb)
    assert plan.guest and plan.guest["rails"] == 2
    kinds = {(p.scenario, p.kind) for p in plan.points if not p.skipped}
    assert {("single_nic", "perftest"), ("single_nic", "peercache"), ("multi_rail", "peercache"),
            ("whole_machine", "group"), ("msgsize_sweep", "perftest")} <= kinds
    assert all(p.skipped and p.kind == "peercache" for p in plan.points if p.scenario == "gpudirect")
    # The grid overrides cut the 8-NIC grids down to what 2 emulated CPUs can run.
    single = [p for p in plan.points if p.scenario == "single_nic" and p.kind == "peercache"]
    assert [(p.params["processes"], p.params["threads"]) for p in single] == [(1, 2)]
    multi = [p for p in plan.points if p.scenario == "multi_rail"]
    assert all(p.params["devices"] == ["rxe_b0", "rxe_b1"] for p in multi)
    # Each host names its own devices: the producer's ends are rxe_a<i>.
    assert plan.testbed.role_devices("producer", ["rxe_b1"]) == ["rxe_a1"]
    assert plan.testbed.role_devices("consumer", ["rxe_b0", "rxe_b1"]) == ["rxe_b0", "rxe_b1"]
    cmd = plan.guest_command()
    assert "-m peercache.lab.launch.guest --rails 2" in cmd and "peercache.lab.pipeline measure --testbed " + tb in cmd
    doc = yaml.safe_load((ROOT / tb).read_text())
    doc["results"] = str(tmp_path / "softroce")         # not the checkout's own data/raw/softroce
    (tmp_path / "softroce.yaml").write_text(yaml.safe_dump(doc))
    r = snakemake("-n", "--cores", "2", "--config", f"testbed={tmp_path / 'softroce.yaml'}")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "guest_measure" in out and "run_point" not in out and "capture_host" not in out


@pytest.mark.parametrize("change, message", [
    (lambda d: d.update(grid_overrides={"single_nic": {"warp": {"qps": [1]}}}),
     "field 'grid_overrides.single_nic.warp': the rdma form of single_nic has no part 'warp'"),
    (lambda d: d["hosts"]["producer"].update(devices=["rxe_a0"]),
     "field 'hosts.producer.devices': 1 names for the 2 devices"),
    (lambda d: d.update(guest={"rails": 0}), "field 'guest.rails'"),
])
def test_softroce_definition_errors_name_the_field(tmp_path, change, message):
    doc = yaml.safe_load((ROOT / "experiments/testbeds/softroce.yaml").read_text())
    change(doc)
    path = tmp_path / "softroce.yaml"
    doc["results"] = str(tmp_path / "softroce")
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(experiments.DefinitionError, match=re.escape(message)):
        Plan(str(path))


def test_local_testbed_marks_gpu_scenario_skipped_with_reason():
    plan = Plan("experiments/testbeds/local.yaml")
    gpu = [p for p in plan.points if p.scenario == "gpudirect"]
    assert gpu and all(p.skipped and "no GPU" in p.skip_reason for p in gpu)
    assert {p.kind for p in plan.points if p.scenario == "single_nic"} == {"iperf3", "peercache", "memcpy"}


@pytest.mark.parametrize("change, field", [
    (lambda d: d["hosts"]["producer"].update(host="ftp:box"), "hosts.producer.host"),
    (lambda d: d.update(duration=-1), "duration"),
    (lambda d: d.update(scenarios=["single_nic", "warp_drive"]), "scenarios.1"),
    (lambda d: d.pop("capabilities"), "(top level)"),
    # listeners in the ephemeral range collide with the hosts' own outgoing connections (a CI flake)
    (lambda d: d.update(base_port=43000), "base_port"),
])
def test_broken_testbed_fails_before_any_run_naming_the_field(tmp_path, change, field):
    doc = yaml.safe_load((ROOT / TINY).read_text())
    change(doc)
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    with pytest.raises(experiments.DefinitionError, match=re.escape(f"field '{field}'")):
        experiments.load_testbed(bad)
    r = snakemake("-n", "--config", f"testbed={bad}")
    assert r.returncode != 0 and f"field '{field}'" in r.stdout + r.stderr


def test_results_folder_must_carry_the_testbed_name(tmp_path):
    doc = yaml.safe_load((ROOT / TINY).read_text())
    doc["results"] = "data/raw/elsewhere"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    with pytest.raises(experiments.DefinitionError, match="field 'results'"):
        Plan(str(bad))


def test_canonical_metric_names():
    assert canonical_metric("L1-dcache-load-misses") == "l1_dcache_load_misses"
    assert canonical_metric("context-switches") == "context_switches"
    assert canonical_metric("cpu_core/cycles/") == "cpu_core_cycles"


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """Run the whole pipeline for real on the tiny local testbed, in a copy of the repo."""
    from conftest import pipeline_copy
    work = tmp_path_factory.mktemp("lab")
    pipeline_copy(work)
    r = snakemake("--cores", "2", "--config", f"testbed={TINY}", f"scenarios={TINY_SCENARIOS}", cwd=work)
    return work, r


def test_tiny_local_run_end_to_end(tiny_run):
    work, r = tiny_run
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert "reports/tiny/report.html" in out                       # says where the report is
    rows = pd.read_parquet(work / "data/tidy/tiny/rows.parquet")
    runs = pd.read_parquet(work / "data/tidy/tiny/runs.parquet")
    plan = Plan(str(work / TINY), str(work / TINY_SCENARIOS))
    assert set(runs["run_id"]) == {f"tiny/{p.scenario}/{p.name}/rep0" for p in plan.points}
    assert (rows["status"] == "failed").sum() == 0, rows[rows["status"] == "failed"][["run_id", "reason"]]
    gpu = rows[rows["scenario"] == "gpudirect"]
    assert len(gpu) and (gpu["status"] == "skipped").all() and gpu["reason"].str.contains("no GPU").all()
    get = rows[(rows["metric"] == "get_throughput") & (rows["status"] == "ok")]
    assert (get["value"] > 0).all() and set(get["scenario"]) == {"single_nic", "multi_rail", "whole_machine"}
    # verified by default: every GET figure says its bytes were checked, and none failed the check
    assert [json.loads(e).get("verified") for e in get["extra"]] == [True] * len(get)
    # every tcp GET row says how drive's client moved its batches: the shape its raw limit is matched on
    wires = [json.loads(e).get("tcp_wire") or {} for e in get[get["protocol"] == "tcp"]["extra"]]
    assert wires and all(w.get("request_bytes") and w.get("in_flight_bytes") for w in wires), wires
    vf = rows[rows["metric"] == "verify_failures"]
    assert len(vf) and (vf["value"] == 0).all()
    assert set(rows[rows["scenario"] == "whole_machine"]["side"]) == {"per_device", "aggregate"}
    ipc = rows[rows["metric"] == "ipc"]
    assert len(ipc) and ipc["value"].isna().all()                  # no hardware counters here: missing, not 0
    for f in ("reports/tiny/report.html", "reports/tiny/report.ipynb", "reports/tiny/collect.html",
              "figures/tiny/index.md", "figures/tiny/single_nic.png", "figures/tiny/msgsize_sweep_bw.png"):
        assert (work / f).stat().st_size > 0, f
    assert "gpudirect: not drawn" in (work / "figures/tiny/index.md").read_text()
    memcpy = rows[(rows["tool"] == "memcpy") & (rows["metric"] == "bw")]
    assert len(memcpy) >= 1 and (memcpy["status"] == "ok").all() and memcpy["numa_node"].notna().all()
    for p in (work / "data/raw/tiny").rglob("result.json"):       # both sides' logs kept beside results
        meta = json.loads(p.read_text())["meta"]
        # the package runs from this checkout (editable install): its revision, marked when dirty
        assert re.fullmatch(r"[0-9a-f]{40}(-dirty|-status-unknown)?", meta["git_revision"]), meta["git_revision"]
        assert meta["start"] <= meta["end"]


def test_benchmark_jobs_never_overlapped(tiny_run):
    work, r = tiny_run
    spans = []
    for p in (work / "data/raw/tiny").rglob("result.json"):
        meta = json.loads(p.read_text())["meta"]
        if not meta["params"].get("skip_reason"):
            spans.append((meta["start"], meta["end"]))
    spans.sort()
    assert len(spans) >= 5
    for (s0, e0), (s1, e1) in zip(spans, spans[1:]):
        assert e0 <= s1, f"runs overlapped: {(s0, e0)} and {(s1, e1)}"


def test_a_deleted_point_runs_again_and_the_report_follows(tiny_run):
    """Deleting one point's raw folder after a finished run makes Snakemake run that point (and only
    it) again, then collect, charts and report: the finished report must not hide a missing result."""
    work, r = tiny_run
    assert r.returncode == 0, (r.stdout + r.stderr)[-2000:]
    config = ("--config", f"testbed={TINY}", f"scenarios={TINY_SCENARIOS}")
    assert "Nothing to be done" in (n := snakemake("-n", "--cores", "2", *config, cwd=work)).stdout + n.stderr
    point = sorted((work / "data/raw/tiny/single_nic").iterdir())[0]
    aside = work / "aside"
    point.rename(aside)
    try:
        n = snakemake("-n", "--cores", "2", *config, cwd=work)
    finally:
        aside.rename(point)
    out = n.stdout + n.stderr
    assert n.returncode == 0, out[-2000:]
    stats = dict(re.findall(r"^(run_point|collect|charts|report)\s+(\d+)$", out, re.M))
    assert stats == {"run_point": "1", "collect": "1", "charts": "1", "report": "1"}, out[-3000:]
    assert f"point={point.name}, rep=0" in out


def test_numa_node_lists_from_sysfs():
    from peercache.lab.pipeline.runpoint import parse_nodelist
    assert parse_nodelist("0\n") == [0] and parse_nodelist("0-1") == [0, 1]
    assert parse_nodelist("0,2-3") == [0, 2, 3] and parse_nodelist("x") == [] and parse_nodelist("") == []
