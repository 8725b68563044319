"""A host's CPUs (a testbed host block's ``cpus``): the CPU list's form, every command started there runs on
them (and only on them), a definition's bad list names its field, and a host of this machine asking for CPUs
it lacks runs unpinned with a note."""
from __future__ import annotations

import os
import sys

import pytest
import yaml

from peercache.lab.launch.hosts import HostError, LocalHost, check_cpu_list, cpu_list
from peercache.lab import ratios
from peercache.lab.pipeline import experiments, runpoint

AFFINITY = [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"]


@pytest.mark.parametrize("text,cpus", [("0", {0}), ("1-3", {1, 2, 3}), ("0,2-3", {0, 2, 3}), ("7,7", {7})])
def test_a_cpu_list_reads_as_taskset_writes_it(text, cpus):
    assert cpu_list(text) == cpus


@pytest.mark.parametrize("text,says", [("", "not understood"), ("0-", "not understood"), ("a", "not understood"),
                                       ("0; rm -rf /", "not understood"), ("-1", "not understood"),
                                       ("3-1", "runs backwards; write it 1-3"), (0, "not understood")])
def test_a_bad_cpu_list_is_refused_saying_the_form(text, says):
    with pytest.raises(HostError, match=says):
        check_cpu_list(text)


def test_every_command_on_a_pinned_host_runs_on_its_cpus_only():
    mine = sorted(os.sched_getaffinity(0))
    if len(mine) < 2:
        pytest.skip(f"this process may run on CPU {mine[0]} only: pinning to one of two cannot show")
    free = LocalHost().run(AFFINITY, timeout=30)
    assert free.rc == 0 and free.stdout.strip() == str(mine), free.stderr
    pinned = LocalHost().pin(str(mine[-1]))
    c = pinned.run(AFFINITY, timeout=30)
    assert c.rc == 0 and c.stdout.strip() == str([mine[-1]]), c.stderr
    assert c.argv[:3] == ["taskset", "--cpu-list", str(mine[-1])]
    h = pinned.start([sys.executable, "-c", "import os, sys; print(sorted(os.sched_getaffinity(0))); "
                      "sys.stdout.flush()"])
    h.wait(30)
    assert h.stdout.strip() == str([mine[-1]])
    assert LocalHost().pin(None).run(AFFINITY, timeout=30).stdout.strip() == str(mine)


def _testbed(tmp_path, cpus: dict[str, str]):
    doc = yaml.safe_load((experiments.EXPERIMENTS_DIR / "testbeds" / "local.yaml").read_text())
    for role, c in cpus.items():
        doc["hosts"][role]["cpus"] = c
    p = tmp_path / "tb.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def test_a_testbeds_cpus_name_their_field_when_wrong(tmp_path):
    with pytest.raises(experiments.DefinitionError, match=r"field 'hosts.consumer.cpus': .*runs backwards"):
        experiments.load_testbed(_testbed(tmp_path, {"consumer": "3-1"}))
    with pytest.raises(experiments.DefinitionError, match=r"field 'hosts.producer.cpus'.*CPU list"):
        experiments.load_testbed(_testbed(tmp_path, {"producer": "0 && touch /tmp/x"}))
    tb = experiments.load_testbed(_testbed(tmp_path, {"producer": "0", "consumer": "0"}))
    assert tb["hosts"]["producer"]["cpus"] == "0"


def test_the_hosts_of_a_testbed_run_on_their_cpus_or_unpinned_with_a_note(tmp_path):
    mine = sorted(os.sched_getaffinity(0))
    absent = max(mine) + 1
    tb = experiments.load_testbed(_testbed(tmp_path, {"producer": str(mine[0]), "consumer": f"{mine[0]},{absent}"}))
    with runpoint.testbed_hosts(tb) as hosts:
        assert hosts.producer.run(AFFINITY, timeout=30).stdout.strip() == str([mine[0]])
        assert hosts.consumer.cpus is None
        assert hosts.consumer.run(AFFINITY, timeout=30).stdout.strip() == str(mine)
        assert f"CPUs {mine[0]},{absent} asked for" in hosts.note and f"CPU {absent} missing" in hosts.note
        assert "unpinned" in hosts.note


def test_the_bench_testbed_gives_each_side_its_own_cpu():
    tb = ratios.plan(1, 1.0, 0.0).testbed
    p, c = (cpu_list(tb["hosts"][r]["cpus"]) for r in ("producer", "consumer"))
    assert p and c and not p & c
