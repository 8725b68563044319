"""The node each side of a point binds to (runpoint.numa_choice: the testbed's numa map, else each host's
hostinfo capture), the binding evidence attached to the point's numa_binding and flagged in its notes, and
the report's line per flagged point."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from peercache.lab.system import hostinfo as hi

from lab.system.test_numa_evidence import TWO, RXE2, FIX, _need_numactl, _sampled, on_two_nodes


def _testbed(tmp_path: Path, producer_devices=None):
    from peercache.lab.pipeline import experiments

    results = tmp_path / "raw" / "numa2"
    (results / "testbed").mkdir(parents=True)
    swapped = tmp_path / "swapped"          # the producer machine: rxe0 on eth2 (node 1), rxe1 on eth1 (node 0)
    shutil.copytree(RXE2, swapped, symlinks=True)
    (swapped / "sys/devices/virtual/infiniband/rxe0/parent").write_text("eth2\n")
    (swapped / "sys/devices/virtual/infiniband/rxe1/parent").write_text("eth1\n")
    for role, root in (("producer", swapped), ("consumer", RXE2)):
        doc = hi.capture(root)
        (results / "testbed" / f"{role}.json").write_text(json.dumps(
            {"role": role, "host_spec": "local", "summary": hi.summary(doc), "capture": doc}))
    hosts = {"producer": {"host": "local", "address": "127.0.0.1"},
             "consumer": {"host": "local", "address": "127.0.0.1"}}
    if producer_devices:
        hosts["producer"]["devices"] = producer_devices
    return experiments.Testbed(tmp_path / "numa2.yaml", {
        "name": "numa2", "hosts": hosts, "devices": ["rxe0", "rxe1"], "form": "rdma", "duration": 2,
        "warmup": 0.5, "repetitions": 1, "results": str(results), "capabilities": {"rdma": True}})


def test_each_side_binds_to_its_own_hosts_nic_node(tmp_path):
    from peercache.lab.pipeline import runpoint

    tb = _testbed(tmp_path)
    assert runpoint.numa_choice(tb, ["rxe0"], "consumer")[0] == 0
    node, src = runpoint.numa_choice(tb, ["rxe0"], "producer")
    assert node == 1 and "producer.json" in src and "eth2 (rxe parent)" in src
    assert runpoint._numa_of(tb, ["rxe0"]) == 0 and runpoint._numa_of(tb, ["rxe0", "rxe1"]) is None
    assert runpoint.numa_choice(tb, ["rxe0", "rxe1"])[1].startswith("devices on different nodes")
    assert runpoint.numa_choice(tb, [])[0] is None
    # the testbed's numa map wins; a device it has no entry for comes from the capture
    tb.doc["numa"] = {"rxe0": 1}
    assert runpoint._numa_of(tb, ["rxe0"]) == 1 and runpoint._numa_of(tb, ["rxe1"]) == 1
    assert "testbed numa map" in runpoint.numa_choice(tb, ["rxe0"])[1]
    # names differ per role: the producer calls the consumer's rxe0 peer "rxe1"
    tb = _testbed(tmp_path / "b", producer_devices=["rxe1", "rxe0"])
    assert runpoint._numa_of(tb, ["rxe0"], "producer") == 0 and runpoint._numa_of(tb, ["rxe0"]) == 0


def test_whole_machine_binds_each_groups_serve_and_drive_to_its_nics_node(tmp_path, monkeypatch):
    from peercache.lab.launch.hosts import LocalHost
    from peercache.lab.launch.runners import GroupFailed, GroupRunResult
    from peercache.lab.pipeline import experiments, runpoint
    from peercache.lab.pipeline.points import group

    tb = _testbed(tmp_path)
    seen = {}

    class Runner:
        def __init__(self, specs, **kw):
            seen.update({s.name: s for s in specs})

        def run(self):
            raise GroupFailed("not run in this test", GroupRunResult({}, None, False, "not run", 0.0, 0.0))

    monkeypatch.setattr(group, "GroupRunner", Runner)
    monkeypatch.setattr(runpoint, "_python_tool", lambda *a, **k: ["python3", "-m", a[-1]])
    point = experiments.Point("whole_machine", "g", "group", {
        "protocol": "rdma", "layout": "mla", "page_size": 4096, "batch_size": 8, "groups": ["rxe0", "rxe1"],
        "readers": 1, "threads": 1, "per_device": True})
    pr = runpoint.PointRun(tb, point, 0, tmp_path)
    th = runpoint.TestbedHosts(LocalHost(), LocalHost(), "127.0.0.1", "127.0.0.1", None)
    group.PeerCacheGroupRun.run(pr, th)
    # consumer: rxe0 on node 0, rxe1 on node 1; producer (swapped parents): rxe0 on 1, rxe1 on 0
    assert {g: (s.clients[0].numa_node, s.server.numa_node) for g, s in seen.items()} == {
        "rxe0": (0, 1), "rxe1": (1, 0)}
    assert seen["rxe0"].clients[0].device == "rxe0" and seen["rxe0"].server.device == "rxe0"


def _samples_text(tmp_path: Path, prefix: list[str]) -> str:
    return "\n".join(json.dumps(s) for s in _sampled(tmp_path, prefix)) + "\n"


def test_evidence_lands_in_numa_binding_and_a_binding_that_missed_is_flagged(tmp_path):
    from peercache.lab.launch.hosts import LocalHost
    from peercache.lab.pipeline import experiments, runpoint

    _need_numactl()
    tb = _testbed(tmp_path)
    point = experiments.Point("single_nic", "p", "peercache", {})
    text = _samples_text(tmp_path, ["numactl", "--cpunodebind=0", "--membind=0"])
    host = LocalHost()
    pr = runpoint.PointRun(tb, point, 0, tmp_path)
    pr.numa = {"client": {"node": 0, "prefix": ["numactl", "--cpunodebind=0", "--membind=0"]}}
    pr.numa_evidence("consumer", host, text)
    ev = pr.numa["client"]["evidence"]
    assert ev["judged"]["verdict"] == "bound" and ev["judged"]["node"] == 0
    # the node CPU list is the capture's of the host the process ran on (host_spec "local")
    assert ev["node_cpus_source"] == "hostinfo capture producer.json of local"
    assert all(p["cpus_allowed_list"] and p["mems_allowed_list"] for p in ev["processes"])
    assert not [n for n in pr.notes if "flagged" in n]
    # meant for node 1 of the (captured) 2-node host, found on node 0: flagged wrong node
    pr = runpoint.PointRun(tb, point, 0, tmp_path)
    pr.numa = {"client": {"node": 1, "prefix": ["numactl", "--cpunodebind=1", "--membind=1"]}}
    pr.numa_evidence("consumer", host, text)
    assert pr.numa["client"]["evidence"]["judged"]["verdict"] == "wrong_node"
    assert any("flagged numa_wrong_node" in n and "node 1" in n for n in pr.notes)


def test_an_unbound_process_where_numactl_was_asked_is_flagged(tmp_path):
    from peercache.lab.launch.hosts import LocalHost
    from peercache.lab.pipeline import experiments, runpoint

    tb = _testbed(tmp_path)
    point = experiments.Point("single_nic", "p", "peercache", {})
    # CONSTRUCTED samples: the process on the 2-node guest, CPUs and memory everywhere
    r = dict(on_two_nodes("unbound", cpus="0-3", mems="0-1", own_node=0), at="settled")
    text = json.dumps({"t": 1.0, "host": {"nodes": TWO}}) + "\n" + json.dumps({"t": 2.0, "binding": r}) + "\n"
    pr = runpoint.PointRun(tb, point, 0, tmp_path)
    pr.numa = {"server": {"node": 1, "prefix": ["numactl", "--cpunodebind=1", "--membind=1"]},
               "client": {"node": None, "reason": "numactl not installed"}}
    pr._numa_choices = {"client": (1, "rxe0: capture")}
    pr.numa_evidence("producer", host := LocalHost(), text)
    assert pr.numa["server"]["evidence"]["judged"]["verdict"] == "unbound"
    assert any(n.startswith("numa_binding server (local): flagged numa_unbound") for n in pr.notes)
    # no numactl on the host: unbound is what the record already says, not a flag
    pr.notes.clear()
    pr.numa_evidence("consumer", host, text)
    assert pr.numa["client"]["evidence"]["judged"]["verdict"] == "unbound" and not pr.notes


def test_report_shows_each_flagged_point_in_its_scenarios_section(tmp_path):
    from peercache.lab.analysis import collect, report

    tb = "fixture-2x-cx7"
    rows, runs = collect.load_tidy(FIX.parent / "tidy" / tb)
    rid = rows[rows["scenario"] == "whole_machine"]["run_id"].iloc[0]
    flag = "numa_binding rxe0/server (local): flagged numa_unbound: numactl did not take effect: ..."
    i = runs.index[runs["run_id"] == rid][0]
    params = collect.run_field(runs.loc[i], "params")
    runs.at[i, "params"] = json.dumps(dict(params, notes=[*(params.get("notes") or []), flag, "not a flag"]))
    collect.write_tidy(tmp_path / "tidy", tb, rows, runs)
    rep = report.build_report(tmp_path / "tidy", tmp_path / "fig", tb, make_missing_figures=False)
    secs = {s.scenario: s for s in rep.sections}
    assert f"{rid}: {flag}" in secs["whole_machine"].notes
    assert not [n for s in rep.sections if s.scenario != "whole_machine" for n in s.notes if "numa_" in n]
    assert f"- {rid}: {flag}" in report.report_markdown(rep)
