"""The preflight (``validate --connect``, the pipeline's first rule): its builders and parsers on
captured text, and the whole check against a real sshd on 127.0.0.1 (a missing interpreter, a
wrong RDMA device read from a fixture sysfs tree, both at once) and on the built-in local testbed."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from peercache.bench import meta as bench_meta
from peercache.lab.launch.hosts import SSH_CONFIG_ENV
from peercache.lab.pipeline import __main__ as pipeline_cli
from peercache.lab.pipeline import preflight
from peercache.lab.pipeline.preflight import (Expect, gid_ipv4, parse_pings, parse_probe, ping_script,
                                              probe_findings, probe_script)

from lab.launch.test_hosts import procs_with
from lab.sshd_helper import sshd  # noqa: F401 (the fixture)

ROOT = Path(__file__).resolve().parents[3]
GID_LO = "0000:0000:0000:0000:0000:ffff:7f00:0001"      # ::ffff:127.0.0.1

# What probe_script printed on a host with two rxe rails (captured, then trimmed).
CAPTURED = f"""\
@tool ib_read_bw /usr/bin/ib_read_bw
@tool ib_write_bw /usr/bin/ib_write_bw
@tool numactl /usr/bin/numactl
@tool perf
@have rxe0 rxe1
@dev rxe0 state 4: ACTIVE
@dev rxe0 link_layer Ethernet
@dev rxe0 sysfs_mtu
@dev rxe0 gid 0000:0000:0000:0000:0000:ffff:c612:0001
@dev rxe0 gid_type RoCE v2
@dev rxe0 ndev veth0
@dev rxe0 ndev_mtu 1500
@dev rxe0 verbs_mtu 1024 (3)
@dev rxe9 missing
@pyrc 0
@py @pyjson {{"executable": "/usr/bin/python3", "version": "3.11.2", "peercache": "/srv/pc/peercache/__init__.py", \
"revision": "abc", "modules": {{"peercache.lab.cli": null}}}}
"""


def expect(**kw) -> Expect:
    base = dict(role="consumer", spec="ssh:pc-consumer", tools=("ib_read_bw", "ib_write_bw", "numactl", "perf"),
                devices=("rxe0", "rxe9"), port=1, gid_index=1, python="/srv/pc/.venv/bin/python", revision="abc")
    base.update(kw)
    return Expect(**base)


# --- builders and parsers on captured text -----------------------------------------------------

def test_parse_probe_and_its_findings():
    p = parse_probe(CAPTURED)
    assert p.tools == {"ib_read_bw": "/usr/bin/ib_read_bw", "ib_write_bw": "/usr/bin/ib_write_bw",
                       "numactl": "/usr/bin/numactl", "perf": None}
    assert p.have == ["rxe0", "rxe1"] and p.devices["rxe9"] == {"missing": ""}
    assert p.devices["rxe0"]["state"] == "4: ACTIVE" and p.devices["rxe0"]["gid_type"] == "RoCE v2"
    assert p.python_rc == 0 and p.python["revision"] == "abc"
    fail, notes, summary = probe_findings(expect(), p)
    assert fail == [
        "consumer (ssh:pc-consumer): perf is not on the PATH there; install linux-perf (Debian) / "
        "linux-tools-$(uname -r) (Ubuntu)",
        "consumer (ssh:pc-consumer): RDMA device rxe9 not found (have: rxe0, rxe1); fix the testbed's devices"]
    dev = summary["devices"][0]
    assert (dev["device"], dev["state"], dev["ipv4"], dev["gid_type"]) == ("rxe0", "4: ACTIVE", "198.18.0.1", "RoCE v2")
    assert dev["mtu"] == "1024 (3)"                              # ibv_devinfo's, when sysfs has none
    assert summary["python"]["revision"] == "abc" and notes == []


def test_device_port_and_gid_problems_each_give_their_line():
    text = ("@have mlx5_0 mlx5_1 mlx5_2\n"
            "@dev mlx5_0 state 1: DOWN\n@dev mlx5_0 gid 0000:0000:0000:0000:0000:ffff:0a00:0101\n"
            "@dev mlx5_0 gid_type RoCE v2\n@dev mlx5_0 ndev ens1f0\n"
            "@dev mlx5_1 state 4: ACTIVE\n@dev mlx5_1 gid fe80:0000:0000:0000:ba3f:d2ff:fe01:1a2c\n"
            "@dev mlx5_1 gid_type RoCE v2\n"
            "@dev mlx5_2 state 4: ACTIVE\n@dev mlx5_2 gid 0000:0000:0000:0000:0000:ffff:0a00:0301\n"
            "@dev mlx5_2 gid_type IB/RoCE v1\n@dev mlx5_2 ndev ens3\n@dev mlx5_2 ndev_mtu 9000\n")
    e = expect(devices=("mlx5_0", "mlx5_1", "mlx5_2"), tools=(), python=None, gid_index=3,
               devices_field="hosts.consumer.devices")
    fail, _, summary = probe_findings(e, parse_probe(text))
    assert len(fail) == 3
    assert "RDMA device mlx5_0 port 1 is 1: DOWN, not ACTIVE; bring its link up (ip link set ens1f0 up" in fail[0]
    assert "GID 3 of mlx5_1 is fe80:0000:0000:0000:ba3f:d2ff:fe01:1a2c, not an IPv4-mapped" in fail[1]
    assert "GID 3 of mlx5_2 (10.0.3.1) is of type 'IB/RoCE v1', not RoCE v2" in fail[2]
    # no MTU from sysfs or ibv_devinfo: derived from the netdev's by the kernel's rule
    assert summary["devices"][2]["mtu"] == "4096 (5), derived from ens3 MTU 9000"
    e = expect(devices=("mlx5_9",), tools=(), python=None, devices_field="hosts.consumer.devices")
    assert probe_findings(e, parse_probe(text))[0] == [
        "consumer (ssh:pc-consumer): RDMA device mlx5_9 was not reported by the probe; check the host's shell"]
    fail = probe_findings(e, parse_probe("@have\n@dev mlx5_9 missing\n"))[0]
    assert fail == ["consumer (ssh:pc-consumer): RDMA device mlx5_9 not found (have: none); fix the testbed's "
                    "hosts.consumer.devices"]


@pytest.mark.parametrize("text, line", [
    ("@pyrc 127\n@py sh: 1: /opt/none/python: not found\n",
     "python /opt/none/python not found there (sh: 1: /opt/none/python: not found); set hosts.consumer.python"),
    ("@pyrc 126\n@py sh: 1: /opt/none/python: Permission denied\n", "python /opt/none/python is not executable there"),
    ('@pyrc 0\n@py @pyjson {"version": "3.11.2", "error": "ModuleNotFoundError: No module named \'peercache\'"}\n',
     "python /opt/none/python (3.11.2) cannot import peercache (ModuleNotFoundError: No module named 'peercache'); "
     "install PeerCache there"),
    ('@pyrc 0\n@py @pyjson {"version": "3.11.2", "peercache": "/x/peercache/__init__.py", "revision": "abc", '
     '"modules": {"peercache.lab.cli": "ModuleNotFoundError: No module named \'yaml\'"}}\n',
     "imports peercache but not peercache.lab.cli (ModuleNotFoundError: No module named 'yaml')"),
    ('@pyrc 0\n@py @pyjson {"version": "3.11.2", "peercache": "/x/peercache/__init__.py", "revision": "def-dirty", '
     '"modules": {}}\n', "PeerCache there is at revision def-dirty, this checkout at abc; bring the host's checkout"),
    ('@pyrc 0\n@py @pyjson {"version": "3.11.2", "peercache": "/x/peercache/__init__.py", "revision": null, '
     '"revision_error": "fatal: detected dubious ownership in repository at \'/x\'", "modules": {}}\n',
     "(/x/peercache/__init__.py) has no git revision (git: fatal: detected dubious ownership in repository at '/x'), "
     "so it cannot be compared with this checkout's abc"),
    ("@pyrc 1\n@py   File \"<string>\", line 1\n@py SyntaxError: invalid syntax\n",
     "python /opt/none/python could not run the check (rc 1: File \"<string>\", line 1 SyntaxError: invalid syntax)"),
])
def test_python_problems_are_one_line_each(text, line):
    fail = probe_findings(expect(tools=(), devices=(), python="/opt/none/python"), parse_probe(text))[0]
    assert len(fail) == 1 and fail[0].startswith("consumer (ssh:pc-consumer): ") and line in fail[0], fail


def test_probe_and_ping_scripts_quote_and_parse():
    s = probe_script(["numactl"], ["rxe0", "a b"], 2, 1, "/opt/my py/python", "/tmp/fx")
    assert "S=/tmp/fx/sys/class/infiniband" in s and "'a b'" in s and "ports/2" in s and "gids/1" in s
    assert "'/opt/my py/python' -c" in s and "ibv_devinfo" not in s    # a fixture root: no live query
    assert "ibv_devinfo" in probe_script([], ["rxe0"], 1, None, None, "/") and "@pyrc" not in probe_script(["x"])
    assert "'x;y'" in ping_script(["10.0.0.1", "x;y"]) and "ping -c 1 -W 2" in ping_script(["a"])
    present, res = parse_pings("@ping 10.0.0.1 0 rtt min/avg/max/mdev = 0.1/0.1/0.1/0.0 ms\n"
                               "@ping 10.0.0.2 1 1 packets transmitted, 0 received, 100% packet loss, time 0ms\n"
                               "@ping nohost 2 ping: nohost: Name or service not known\n")
    assert present and res["10.0.0.1"][0] == 0 and res["10.0.0.2"][0] == 1
    assert res["nohost"] == (2, "ping: nohost: Name or service not known")
    assert parse_pings("@noping\n") == (False, {})


def test_gid_ipv4():
    assert gid_ipv4("0000:0000:0000:0000:0000:ffff:c612:0001") == "198.18.0.1"
    assert gid_ipv4("::ffff:10.0.0.7") == "10.0.0.7"
    assert gid_ipv4("fe80:0000:0000:0000:ba3f:d2ff:fe01:1a2c") is None and gid_ipv4("") is None


def test_probe_script_runs_here_on_a_fixture_tree(tmp_path):
    """The script itself (sh, cat, sed) on a fixture sysfs tree: what the parser reads is what it prints."""
    fake_sysfs(tmp_path, ["rxe0", "rxe1"])
    r = subprocess.run(preflight.probe_argv(["sh", "pclab-no-such-tool"], ["rxe1", "rxe7"], 1, 1, sys.executable,
                                            tmp_path), capture_output=True, text=True, timeout=60)
    p = parse_probe(r.stdout)
    assert p.tools["sh"] and p.tools["pclab-no-such-tool"] is None and p.have == ["rxe0", "rxe1"]
    assert p.devices["rxe7"] == {"missing": ""} and p.devices["rxe1"]["gid"] == GID_LO
    assert p.devices["rxe1"]["gid_type"] == "RoCE v2" and p.devices["rxe1"]["ndev"] == "lo"
    assert p.python_rc == 0 and p.python["revision"] == bench_meta.git_revision()
    assert p.python["modules"] == {m: None for m in preflight.REMOTE_MODULES}


# --- against a real sshd ----------------------------------------------------------------------

def fake_sysfs(root: Path, devices: list[str], gid: str = GID_LO) -> Path:
    """A sysfs tree with RoCE devices whose port 1 is ACTIVE and GID 1 is RoCE v2 ``gid`` on lo."""
    for d in devices:
        port = root / "sys/class/infiniband" / d / "ports/1"
        for rel, text in (("state", "4: ACTIVE"), ("link_layer", "Ethernet"), ("gids/0", "fe80:0000:0000:0000:"
                          "0000:0000:0000:0001"), ("gids/1", gid), ("gid_attrs/types/0", "RoCE v2"),
                          ("gid_attrs/types/1", "RoCE v2"), ("gid_attrs/ndevs/1", "lo")):
            (port / rel).parent.mkdir(parents=True, exist_ok=True)
            (port / rel).write_text(text + "\n")
    (root / "sys/class/net/lo").mkdir(parents=True, exist_ok=True)
    (root / "sys/class/net/lo/mtu").write_text("65536\n")
    return root


@pytest.fixture
def ssh_alias(sshd, tmp_path, monkeypatch):
    """A Host alias for the test sshd in an ssh config file exported as PEERCACHE_SSH_CONFIG."""
    port, key, kh = sshd
    alias = f"pc-consumer-{uuid.uuid4().hex[:8]}"
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host {alias}\n  HostName 127.0.0.1\n  Port {port}\n  User root\n  IdentityFile {key}\n"
                   f"  IdentitiesOnly yes\n  UserKnownHostsFile {kh}\n")
    monkeypatch.setenv(SSH_CONFIG_ENV, str(cfg))
    yield alias
    assert procs_with(alias) == [], "an ssh process (master?) was left running"


def make_testbed(tmp_path: Path, consumer: dict, *, rdma: bool = False, devices=(), producer_devices=None,
            name: str = "pf") -> Path:
    prod = {"host": "local", "address": "127.0.0.1"}
    if producer_devices:
        prod["devices"] = list(producer_devices)
    doc = {"name": name, "hosts": {"producer": prod, "consumer": {"address": "127.0.0.1", **consumer}},
           "capabilities": {"rdma": rdma, "gpu": False}, "devices": list(devices), "gid_index": 1 if rdma else None,
           "form": "rdma" if rdma else "local", "duration": 1, "warmup": 0.1, "repetitions": 1,
           "results": str(tmp_path / "raw" / name), "scenarios": ["single_nic"]}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def validate(tb: Path, capsys, root: Path | None = None) -> tuple[int, list[str], list[str]]:
    """``validate --connect`` in this process (sysfs read under ``root``): (rc, failure lines, all lines)."""
    capsys.readouterr()
    argv = ["validate", "--testbed", str(tb), "--connect", "--out", str(tb.parent / "preflight.json")]
    if root is None:
        rc = pipeline_cli.main(argv)
    else:
        from peercache import sysfs
        with sysfs.using_root(root):
            rc = pipeline_cli.main(argv)
    out = capsys.readouterr()
    lines = (out.out + out.err).splitlines()
    return rc, [ln for ln in out.err.splitlines() if not ln.startswith("preflight of testbed")], lines


def test_a_missing_interpreter_is_one_clear_line(ssh_alias, tmp_path):
    """(a) through the real CLI: the consumer's python does not exist there."""
    tb = make_testbed(tmp_path, {"host": f"ssh:{ssh_alias}", "python": "/nonexistent/bin/python3"})
    r = subprocess.run([sys.executable, "-m", "peercache.lab.pipeline", "validate", "--testbed", str(tb), "--connect"],
                       capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert r.returncode == 1, r.stdout + r.stderr
    err = r.stderr.splitlines()
    assert err[-1] == "preflight of testbed pf: 1 problem(s); nothing was started"
    assert len(err) == 2 and re.fullmatch(
        rf"consumer \(ssh:{ssh_alias}\): python /nonexistent/bin/python3 not found there \(.*not found\); "
        r"set hosts\.consumer\.python in the testbed to the interpreter that has PeerCache installed there .*", err[0]), err


def test_the_default_python3_without_peercache_says_so(ssh_alias, tmp_path, capsys):
    """No `python` field: python3 there, which (sshd's PATH, the system Python) has no PeerCache."""
    r = subprocess.run(["ssh", "-F", os.environ[SSH_CONFIG_ENV], "-o", "BatchMode=yes", ssh_alias,
                        "python3 -c 'import peercache'"], capture_output=True, text=True, timeout=60)
    if r.returncode == 0:
        pytest.skip("the system python3 imports peercache here")
    rc, fail, _ = validate(make_testbed(tmp_path, {"host": f"ssh:{ssh_alias}"}), capsys)
    assert rc == 1 and len(fail) == 1 and "python python3 (" in fail[0] and "cannot import peercache" in fail[0], fail


def test_b_a_wrong_device_name_on_an_rdma_testbed(ssh_alias, tmp_path, capsys):
    """(b) the consumer (ssh; a shared install: python relative to this checkout) names rxe9, which it lacks."""
    root = fake_sysfs(tmp_path / "fx", ["rxe0", "rxe1"])
    tb = make_testbed(tmp_path, {"host": f"ssh:{ssh_alias}", "python": ".venv/bin/python"}, rdma=True,
                 devices=["rxe0", "rxe9"], producer_devices=["rxe0", "rxe1"])
    rc, fail, lines = validate(tb, capsys, root)
    assert rc == 1
    assert fail == [f"consumer (ssh:{ssh_alias}): RDMA device rxe9 not found (have: rxe0, rxe1); fix the testbed's "
                    "devices"], lines
    doc = json.loads((tmp_path / "preflight.json").read_text())
    assert not doc["ok"] and doc["hosts"]["consumer"]["python"]["revision"] == bench_meta.git_revision()
    # the rails that exist were checked both ways (their GIDs are 127.0.0.1 here)
    assert any(r["what"].startswith("rail 0 (rxe0 -> rxe0)") for r in doc["hosts"]["consumer"]["reach"])
    # and the same testbed with the right names passes, with the OK summary
    tb = make_testbed(tmp_path, {"host": f"ssh:{ssh_alias}", "python": ".venv/bin/python"}, rdma=True,
                 devices=["rxe0", "rxe1"], producer_devices=["rxe1", "rxe0"])
    rc, fail, lines = validate(tb, capsys, root)
    assert rc == 0 and fail == [], lines
    assert lines[-1] == "preflight of testbed pf: all checks passed"
    assert any(ln.startswith(f"consumer (ssh:{ssh_alias}): OK: python {ROOT}/.venv/bin/python ") for ln in lines)
    assert "  rail 1: rxe1 port 1 4: ACTIVE, MTU 4096 (5), derived from lo MTU 65536, GID 1 127.0.0.1 (RoCE v2 " \
           "on lo)" in lines


def test_c_both_failures_two_lines_and_nothing_started(ssh_alias, tmp_path, capsys):
    """(c) the consumer's python is missing and the producer names a device it lacks: two lines, no process."""
    root = fake_sysfs(tmp_path / "fx", ["rxe0", "rxe1"])
    tb = make_testbed(tmp_path, {"host": f"ssh:{ssh_alias}", "python": "/nonexistent/bin/python3"}, rdma=True,
                 devices=["rxe0", "rxe1"], producer_devices=["rxe0", "rxe8"])
    rc, fail, lines = validate(tb, capsys, root)
    assert rc == 1 and len(fail) == 2, lines
    assert fail[0] == "producer (local): RDMA device rxe8 not found (have: rxe0, rxe1); fix the testbed's " \
                      "hosts.producer.devices"
    assert fail[1].startswith(f"consumer (ssh:{ssh_alias}): python /nonexistent/bin/python3 not found there")
    assert not (tmp_path / "raw").exists()           # no capture, no point: nothing wrote a result
    assert procs_with(ssh_alias) == []               # no ssh master (or anything over it) left


def test_an_unreachable_host_is_one_line(tmp_path, capsys):
    """A host SSH cannot log in to: one line, and the other host's pings to it are still checked."""
    tb = make_testbed(tmp_path, {"host": "ssh:root@127.0.0.1:1"})
    rc, fail, lines = validate(tb, capsys)
    assert rc == 1 and len(fail) == 1, lines
    assert fail[0].startswith("consumer (ssh:root@127.0.0.1:1): cannot log in over SSH with BatchMode: connection "
                              "refused: nothing listens for ssh on 127.0.0.1 port 1"), fail
    assert "start sshd on that host" in fail[0] and "identity=" not in fail[0]


def test_the_local_testbed_passes_validate_connect():
    r = subprocess.run([sys.executable, "-m", "peercache.lab.pipeline", "validate", "--testbed",
                        "experiments/testbeds/local.yaml", "--connect"],
                       capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[-1] == "preflight of testbed local: all checks passed"
    assert any(ln.startswith("producer (netns:pclaba): OK: python ") for ln in lines)
    assert "  reachability: skipped: network-namespace hosts are created for each point" in r.stdout


def test_a_guest_testbed_has_nothing_to_check_here(tmp_path):
    from peercache.lab.pipeline.plan import Plan
    p = Plan("experiments/testbeds/softroce.yaml")
    rep = preflight.check(p.testbed, p.points)
    assert rep.ok and "inside its Soft-RoCE guest" in rep.notes[0]


@pytest.mark.timeout(600)
def test_the_pipeline_stops_at_a_failing_preflight(ssh_alias, tmp_path):
    """snakemake on a testbed whose consumer has no interpreter: the preflight rule fails with the line,
    and no capture (nor anything after it) starts."""
    tb = make_testbed(tmp_path, {"host": f"ssh:{ssh_alias}", "python": "/nonexistent/bin/python3"})
    raw = tmp_path / "raw" / "pf"
    r = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "-d", str(tmp_path / "w"),
                        "--cores", "1", str(raw / "testbed" / "consumer.json"), "--config", f"testbed={tb}"],
                       capture_output=True, text=True, timeout=500)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out[-3000:]
    assert f"consumer (ssh:{ssh_alias}): python /nonexistent/bin/python3 not found there" in out
    assert "rule preflight" in out and "rule capture_host" not in out
    assert "python /nonexistent/bin/python3 not found there" in (raw / "testbed/preflight.log").read_text()
    assert not (raw / "testbed/consumer.json").exists() and not (raw / "testbed/consumer.log").exists()
    assert not (raw / "testbed/preflight.json").exists()    # a failed check leaves no output to go on from


def test_revisions_compare_commits_and_local_changes_unless_git_status_could_not_answer():
    from peercache.lab.pipeline.preflight import revisions_match
    a = "c5d1b9e2637e012fd40a86bd4f40544e3ef01081"
    b = "2974b7a90d5e34938673b378b195ca0ad43a70a9"
    assert revisions_match(a, a) == (True, None)
    assert revisions_match(b, a)[0] is False
    assert revisions_match(a + "-dirty", a)[0] is False and revisions_match(a, a + "-dirty")[0] is False
    # seen on the two-machine testbed: git status over the guest's 9p root ran past its timeout
    same, note = revisions_match(a + "-status-unknown", a)
    assert same and "unknown" in note and a in note
    assert revisions_match(b + "-status-unknown", a)[0] is False
    assert revisions_match(None, a)[0] is False and revisions_match(a, None) == (True, None)
