"""Remote hosts run PeerCache with their own interpreter (the host's ``python`` field): argv of every
lab command, the testbed schema, ssh config files (``-F``, PEERCACHE_SSH_CONFIG), and a real hostinfo
capture over the test sshd."""
from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from peercache.lab.launch.hosts import SSH_CONFIG_ENV, LocalHost, NetnsHost, SshHost, parse_host
from peercache.lab.pipeline import __main__ as pipeline_cli
from peercache.lab.pipeline import experiments
from peercache.lab.pipeline import runpoint
from peercache.lab.pipeline.runpoint import PointRun, _python_tool, host_python

from lab.launch.test_hosts import procs_with
from lab.sshd_helper import sshd  # noqa: F401 (the fixture)

ROOT = Path(__file__).resolve().parents[3]


def test_on_this_machine():
    assert LocalHost().on_this_machine and NetnsHost("x").on_this_machine
    assert not SshHost("h").on_this_machine


def test_only_this_namespace_reaches_a_server_on_our_loopback():
    # What a host is, it says itself: the redis-server of a dirlookup point listens on this 127.0.0.1.
    assert LocalHost().shares_our_loopback
    assert not NetnsHost("x").shares_our_loopback and not SshHost("h").shares_our_loopback


def test_what_a_check_needs_of_a_host_the_host_says():
    # The preflight asks these, never a host's class: only a namespace is made for each point, only ssh logs in.
    assert NetnsHost("x").created_per_point
    assert not LocalHost().created_per_point and not SshHost("h").created_per_point
    assert SshHost("h").reached_over_ssh
    assert not LocalHost().reached_over_ssh and not NetnsHost("x").reached_over_ssh


def test_host_python_resolution():
    ssh = SshHost("root@h")
    assert host_python(ssh, {}) == ["python3"]                                     # default
    assert host_python(ssh, {"python": "/opt/pc/bin/python"}) == ["/opt/pc/bin/python"]
    assert host_python(ssh, {"python": ".venv/bin/python"}) == [str(ROOT / ".venv/bin/python")]  # shared install
    assert host_python(ssh, {"python": "python3.12"}) == ["python3.12"]            # a name: the host's PATH
    for h in (LocalHost(), NetnsHost("pcx")):                                      # this machine: this interpreter
        assert host_python(h, {"python": "/opt/pc/bin/python"}) == [sys.executable]


def _th(bench_command=None) -> runpoint.TestbedHosts:
    prod, cons = LocalHost(), SshHost("root@consumer")
    return runpoint.TestbedHosts(prod, cons, "10.0.0.1", "10.0.0.2", None,
                        python={"producer": host_python(prod, {}), "consumer": ["/srv/pc/.venv/bin/python"]},
                        bench_command=bench_command)


def test_python_tool_per_role_and_bench_command_precedence():
    th = _th()
    assert _python_tool(th, "producer", "peercache.lab.cli") == [sys.executable, "-m", "peercache.lab.cli"]
    assert _python_tool(th, "consumer", "peercache.bench.cli") == ["/srv/pc/.venv/bin/python", "-m",
                                                                    "peercache.bench.cli"]
    assert _python_tool(th, "consumer", "peercache.lab.tools.nodeloop")[0] == "/srv/pc/.venv/bin/python"
    th = _th(bench_command=["/opt/bin/peercache-bench"])
    assert _python_tool(th, "consumer", "peercache.bench.cli") == ["/opt/bin/peercache-bench"]     # wins remotely
    assert _python_tool(th, "consumer", "peercache.bench.dirbench")[0] == "/srv/pc/.venv/bin/python"
    assert _python_tool(th, "producer", "peercache.bench.cli")[0] == sys.executable                # not here
    with pytest.raises(ValueError):
        _python_tool(th, "client", "peercache.lab.cli")


def _testbed(tmp_path: Path, consumer: dict, **extra) -> experiments.Testbed:
    doc = {"name": "rp", "hosts": {"producer": {"host": "local", "address": "127.0.0.1"},
                                   "consumer": {"address": "127.0.0.1", **consumer}},
           "capabilities": {"rdma": False, "gpu": False}, "devices": [], "form": "local", "duration": 1,
           "warmup": 0.1, "repetitions": 1, "results": str(tmp_path / "raw" / "rp"), "scenarios": ["single_nic"],
           **extra}
    path = tmp_path / "rp.yaml"
    path.write_text(yaml.safe_dump(doc))
    return experiments.load_testbed(path)


def test_schema_takes_a_python_per_host(tmp_path):
    tb = _testbed(tmp_path, {"host": "ssh:root@consumer", "python": ".venv/bin/python"})
    assert tb["hosts"]["consumer"]["python"] == ".venv/bin/python"
    with pytest.raises(experiments.DefinitionError, match="field 'hosts.consumer.python'"):
        _testbed(tmp_path, {"host": "ssh:root@consumer", "python": "my python"})


def test_testbed_hosts_carry_the_python_and_close_the_ssh_hosts(tmp_path):
    tb = _testbed(tmp_path, {"host": "ssh:root@consumer", "python": ".venv/bin/python"},
                  bench_command=["peercache-bench"])
    with runpoint.testbed_hosts(tb) as th:
        assert th.python == {"producer": [sys.executable], "consumer": [str(ROOT / ".venv/bin/python")]}
        assert th.bench_command == ["peercache-bench"]
        control = Path(th.consumer.control_path).parent
        assert control.is_dir()
        # the CPU sampler of a command on the consumer runs under the consumer's python
        pt = next(p for p in experiments.expand(tb) if not p.skipped)
        pr = PointRun(tb, pt, 0, tmp_path)
        argv = pr.cpu_wrap("g0/consumer", th, "consumer", ["iperf3", "-c", "x"])
        assert argv[:3] == [str(ROOT / ".venv/bin/python"), "-m", "peercache.lab.system.cpusample"]
        assert pr.cpu_files["g0/consumer"][0] is th.consumer
        assert pr.cpu_wrap("p", th, "producer", ["true"])[0] == sys.executable
    assert not control.exists()                        # closed on leaving


def test_ssh_config_file_goes_to_every_ssh(monkeypatch, tmp_path):
    cfg = tmp_path / "cfg"
    h = SshHost("box", config=cfg)
    try:
        for argv in (h.wrap(["true"]), h.ssh_argv(["true"])):
            assert argv[1:3] == ["-F", str(cfg)], argv
        assert h._options()[:2] == ["-F", str(cfg)]      # the master and close use the same options
    finally:
        h.close()
    monkeypatch.setenv(SSH_CONFIG_ENV, str(cfg))
    h = parse_host("ssh:box")
    assert h.config == str(cfg) and "-F" in h.wrap(["true"])
    h.close()
    h = parse_host("ssh:box", config="")              # an explicit empty one: no file
    assert h.config is None and "-F" not in h.wrap(["true"])
    h.close()
    monkeypatch.delenv(SSH_CONFIG_ENV)
    h = parse_host("ssh:box")
    assert h.config is None and "-F" not in h.wrap(["true"])
    h.close()


@pytest.fixture
def alias(sshd, tmp_path, monkeypatch):
    port, key, kh = sshd
    name = f"pc-remote-{uuid.uuid4().hex[:8]}"
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host {name}\n  HostName 127.0.0.1\n  Port {port}\n  User root\n  IdentityFile {key}\n"
                   f"  IdentitiesOnly yes\n  UserKnownHostsFile {kh}\n")
    monkeypatch.setenv(SSH_CONFIG_ENV, str(cfg))
    yield name
    assert procs_with(name) == [], "an ssh process was left running"


def test_capture_over_ssh_runs_the_hosts_python(alias, tmp_path, capsys):
    """hostinfo on an ssh host (named by its ssh-config alias) with the shared install's interpreter; the default
    python3 (sshd's PATH: the system Python, no PeerCache) fails saying which field to set."""
    tb = _testbed(tmp_path, {"host": f"ssh:{alias}", "python": ".venv/bin/python"})
    out = tmp_path / "consumer.json"
    assert pipeline_cli.capture(str(tb.path), "consumer", str(out)) == 0, capsys.readouterr()
    doc = json.loads(out.read_text())
    assert f"ssh:{alias}" in doc["host_spec"] and doc["summary"].get("host")
    tb = _testbed(tmp_path, {"host": f"ssh:{alias}"})
    rc = pipeline_cli.capture(str(tb.path), "consumer", str(tmp_path / "c2.json"))
    err = capsys.readouterr().err
    if rc == 0:
        pytest.skip("the system python3 here has PeerCache")
    assert "`python3 -m peercache.lab.cli hostinfo` exited" in err and "hosts.consumer.python" in err
