"""numa: numactl prefix and the binding record kept in the run's meta block."""
from __future__ import annotations

import shutil

import pytest

from peercache.lab.launch.hosts import LocalHost
from peercache.lab.system.numa import bind, numa_binding
from peercache.lab.tidy import RunMeta


def test_binds_cpus_and_memory_to_the_node():
    prefix, rec = numa_binding(1, True, device="mlx5_3")
    assert prefix == ["numactl", "--cpunodebind=1", "--membind=1"]
    assert rec["node"] == rec["cpunodebind"] == rec["membind"] == 1 and rec["device"] == "mlx5_3"
    assert "reason" not in rec


@pytest.mark.parametrize("node", [None, -1, True, "0"])
def test_unknown_node_is_not_bound_and_says_why(node):
    prefix, rec = numa_binding(node, True, device="mlx5_0")
    assert prefix == [] and rec["node"] is None and "unknown" in rec["reason"]


def test_missing_numactl_is_not_bound_and_says_what_to_install():
    prefix, rec = numa_binding(0, False)
    assert prefix == [] and rec["node"] is None and "apt-get install numactl" in rec["reason"]


def test_record_fits_the_meta_block():
    argv, rec = bind(["ib_read_bw", "-d", "mlx5_0"], 0, True, device="mlx5_0")
    assert argv[:3] == ["numactl", "--cpunodebind=0", "--membind=0"] and argv[3] == "ib_read_bw"
    meta = RunMeta(run_id="r", testbed="t", experiment="e", scenario="s", point="p", repetition=0,
                   hosts={}, commands={"client": argv}, start="", end="", git_revision=None,
                   numa_binding={"client": rec, "server": numa_binding(-1, True)[1]})
    d = meta.to_dict()
    assert d["numa_binding"]["client"]["node"] == 0 and d["numa_binding"]["server"]["reason"]


@pytest.mark.skipif(shutil.which("numactl") is None, reason="numactl not installed")
def test_bound_command_really_runs_on_node_zero():
    argv, _ = bind(["numactl", "--show"], 0, True)
    c = LocalHost().run(argv, timeout=10)
    if c.rc != 0 and "set_mempolicy" in c.stderr:
        pytest.skip(f"numactl cannot set a memory policy here: {c.stderr.strip()}")
    assert c.rc == 0, c.stderr
    assert "membind: 0" in c.stdout and "cpubind: 0" in c.stdout
