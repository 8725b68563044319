"""The report's test environment: the commands that captured it, or why none are listed.

Captures are real (tests/fixtures/lab/PROVENANCE.md): `hosts/local-netns/` are the pipeline's captures of
the local testbed's two network-namespace hosts; `hosts/softroce/hostinfo_rxe.json` was captured in the
Soft-RoCE guest by an older lab, before a capture listed its sources.
"""
import json
from pathlib import Path

import pandas as pd

from peercache.lab.analysis import environment, report
from peercache.lab.pipeline.plan import Plan
from peercache.lab.system import hostinfo

ROOT = Path(__file__).resolve().parents[3]
HOSTS = ROOT / "tests" / "fixtures" / "lab" / "hosts"


def _markdown(caps, folder):
    rep = report.Report("local", pd.DataFrame(), [], {}, env_commands=environment.capture_commands(caps),
                        env_commands_why=environment.why_no_commands(caps, folder))
    return report.report_markdown(rep)


def test_local_netns_captures_list_their_commands():
    caps, why = environment.load_captures(HOSTS / "local-netns")
    assert why is None and set(caps) == {"producer", "consumer"}
    lines = environment.capture_commands(caps)
    assert "numactl --show" in lines and "ofed_info -s   # no answer" in lines
    assert "cat /proc/cpuinfo" in lines
    md = _markdown(caps, HOSTS / "local-netns")
    assert "Commands and files that captured it" in md and "\nnumactl --show\n" in md


def test_a_capture_made_before_sources_were_recorded_says_so_and_what_to_do(tmp_path):
    doc = json.loads((HOSTS / "softroce" / "hostinfo_rxe.json").read_text())
    for role in ("producer", "consumer"):      # the block the pipeline's capture step writes around it
        (tmp_path / f"{role}.json").write_text(json.dumps({"role": role, "host_spec": "local", "capture": doc}))
    caps, _ = environment.load_captures(tmp_path)
    assert environment.capture_commands(caps) == []
    why = environment.why_no_commands(caps, tmp_path)
    assert why.startswith("the producer and consumer capture(s)")
    assert f"{tmp_path}/consumer.json" in why and "hostinfo schema 1" in why
    assert f"remove {tmp_path}/ and run `make run` again" in why
    assert "_No commands listed: the producer and consumer capture(s)" in _markdown(caps, tmp_path)


def test_a_new_capture_format_is_captured_again():
    # Snakemake keeps an output whose file exists unless the rule's params change: the capture's format
    # is one of them, so captures an older lab wrote are not kept.
    assert hostinfo.SCHEMA_VERSION >= 2 and "sources" in hostinfo.capture()
    assert Plan("experiments/testbeds/local.yaml").capture_schema == hostinfo.SCHEMA_VERSION
    assert "capture_schema=PLAN.capture_schema" in (ROOT / "rules" / "capture.smk").read_text()


def test_a_cluster_testbeds_topology_lists_every_host_from_its_captures(tmp_path):
    """A cluster testbed's capture folder holds one NAME.json per listed host beside producer/consumer.json."""
    import json as _json
    import pandas as _pd
    from peercache.lab.analysis import environment as env
    summary = {"host": "vm"}
    # the pair's captures name the member they were taken on, as the pipeline writes them
    for role, name in (("producer", "c1"), ("consumer", "c2")):
        (tmp_path / f"{role}.json").write_text(_json.dumps({"role": role, "name": name, "roles": [role],
                                                            "host_spec": f"netns:{name}", "summary": summary}))
    for i, roles in ((1, ["producer", "consumer", "directory"]), (2, ["producer", "consumer"]), (3, ["consumer"])):
        (tmp_path / f"c{i}.json").write_text(_json.dumps({"role": None, "name": f"c{i}", "roles": roles,
                                                          "host_spec": f"netns:c{i}", "address": f"198.18.79.{i}",
                                                          "summary": summary}))
    caps, why = env.load_captures(tmp_path)
    members = env.cluster_members(tmp_path)
    assert [m["name"] for m in members] == ["c1", "c2", "c3"]
    topo = env.environment_fields(caps, _pd.DataFrame(), why, members)[0]
    assert topo.value.startswith("3 hosts (a cluster): c1 netns:c1 (198.18.79.1; producer, consumer, directory) / ")
    assert topo.value.endswith("; all on one machine")
    assert env.environment_fields(caps, _pd.DataFrame(), why)[0].value.startswith("2 hosts: producer netns:c1")


def test_a_two_host_testbeds_pair_is_not_called_a_cluster(tmp_path):
    """The local testbed's captures name themselves producer and consumer: the topology line is the pair's,
    not "2 hosts (a cluster)" (make run's report said so)."""
    import json as _json
    import pandas as _pd
    from peercache.lab.analysis import environment as env
    for role, addr in (("producer", "198.18.77.1"), ("consumer", "198.18.77.2")):
        (tmp_path / f"{role}.json").write_text(_json.dumps({"role": role, "name": role, "roles": [role],
                                                            "host_spec": f"netns:pclab{role[0]}", "address": addr,
                                                            "summary": {"host": "vm"}}))
    assert env.cluster_members(tmp_path) == []
    caps, why = env.load_captures(tmp_path)
    topo = env.environment_fields(caps, _pd.DataFrame(), why, env.cluster_members(tmp_path))[0]
    assert "cluster" not in topo.value and topo.value.startswith("2 hosts")
