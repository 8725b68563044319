"""The lab's waits come from one scaling point: each bound is a named constant (seconds on a plain machine)
stretched by the hosts' slowness through one rule (system.slowness.scaled, PointRun.scaled); the values
are those the lab used before they were named (rev fc2d363), so no wait changed."""
from __future__ import annotations

from pathlib import Path

import pytest

from peercache.lab.launch.hosts import LocalHost
from peercache.lab.pipeline import __main__ as pipeline_main
from peercache.lab.pipeline import experiments, runpoint
from peercache.lab.pipeline.points import bounds, dirlookup, group, mooncake_te, nixl, peercache_pypi, perftest
from peercache.lab.pipeline.points.peercache import serve_drive
from peercache.lab.system import crosscheck, slowness

SLOW = 3.5


@pytest.fixture
def emulated(monkeypatch):
    """Hosts SLOW times slower than a plain machine (as the Soft-RoCE guests export it)."""
    monkeypatch.setenv("PEERCACHE_SLOWNESS", str(SLOW))


def _point(name: str):
    tb = experiments.load_testbed("experiments/testbeds/local.yaml")
    return tb, next(p for p in experiments.expand(tb) if p.name == name)


def test_the_named_bounds_keep_the_seconds_the_lab_waited_before():
    assert (slowness.HOST_COMMAND_S, crosscheck.COUNTER_READ_S, pipeline_main.CAPTURE_S) == (30, 15, 120)
    assert (bounds.READY_S, bounds.PORT_READY_S, bounds.DRIVE_READY_S) == (60, 15, 30)
    assert (bounds.POINT_BASE_S, bounds.WINDOW_ALLOWANCE) == (60, 4)
    assert (perftest.PERFTEST_READY_S, mooncake_te.TARGET_READY_S, group.GROUP_DRIVE_READY_S) == (20, 30, 60)
    assert (nixl.CONNECT_S, nixl.BATCH_S, peercache_pypi.CONNECT_S, dirlookup.DIRBENCH_READY_S) == (30, 10, 60, 60)


def test_scaled_is_seconds_times_the_slowness(monkeypatch):
    monkeypatch.setenv("PEERCACHE_SLOWNESS", str(SLOW))
    assert slowness.scaled(slowness.HOST_COMMAND_S) == slowness.HOST_COMMAND_S * SLOW
    assert slowness.scaled(10.0, slow=2.0) == 20.0
    monkeypatch.setenv("PEERCACHE_SLOWNESS", "0.25")          # never shorter than on a plain machine
    assert slowness.scaled(bounds.READY_S) == bounds.READY_S
    monkeypatch.delenv("PEERCACHE_SLOWNESS")
    assert slowness.scaled(bounds.PORT_READY_S) == bounds.PORT_READY_S


def test_a_points_bounds_are_its_constants_times_the_slowness(emulated):
    tb, pt = _point("pc_tcp_p1x1_s128K_b32")
    pr = runpoint.PointRun(tb, pt, 0, Path("/nonexistent"))
    assert pr.slow == SLOW
    for seconds in (bounds.READY_S, bounds.PORT_READY_S, bounds.DRIVE_READY_S, slowness.HOST_COMMAND_S):
        assert pr.scaled(seconds) == seconds * SLOW
    window = pr.duration + pr.warmup
    assert pr.timeout == (bounds.POINT_BASE_S + bounds.WINDOW_ALLOWANCE * window) * SLOW
    assert pr.timeout == (60 + 4 * (tb["duration"] + tb["warmup"])) * SLOW


def test_drive_on_an_emulated_host_waits_its_scaled_bound(emulated, tmp_path):
    tb, pt = _point("pc_tcp_p1x1_s128K_b32")
    pr = runpoint.PointRun(tb, pt, 0, tmp_path)
    th = runpoint.TestbedHosts(LocalHost(), LocalHost(), "127.0.0.1", "127.0.0.1", None)
    serve, drive = serve_drive(pr, th, 42001, pt.params, 1, 1, "/tmp/d.json")
    assert drive[drive.index("--ready-timeout") + 1] == f"{bounds.DRIVE_READY_S * SLOW:.0f}"
    assert drive[drive.index("--time-scale") + 1] == f"{SLOW:.1f}"
    assert serve[serve.index("--max-wait") + 1] == str(int(pr.timeout))


def test_a_one_shot_servers_exit_is_waited_for_longer_on_slow_hosts():
    """serve leaves the directory and closes its node before it exits: on the emulated pair (slowness ~23)
    it once took longer than the runners' plain 10 s, failing whole_machine's group run."""
    from peercache.lab.pipeline.points import bounds
    from peercache.lab.system.slowness import scaled
    assert bounds.SERVER_EXIT_S == 10.0 and scaled(bounds.SERVER_EXIT_S, 23.0) > 10.0 * 20
    assert scaled(bounds.SERVER_EXIT_S, 1.0) == 10.0
