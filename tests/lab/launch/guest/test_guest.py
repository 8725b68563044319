"""The Soft-RoCE guest runner: its pure builders, what it says when it cannot run, and real boots."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from peercache.lab.launch.guest import kernel as K
from peercache.lab.launch.guest import runner as R
from peercache.lab.launch.guest import topology as T
from peercache.lab.launch.guest.errors import GuestTimeout, GuestUnavailable

GUEST = [sys.executable, "-m", "peercache.lab.launch.guest"]
MISSING = R.missing()
needs_guest = pytest.mark.skipif(bool(MISSING), reason="the Soft-RoCE guest cannot run here: " + "; ".join(MISSING))


# --- pure parts ------------------------------------------------------------------------------

def test_image_package_is_read_from_apt_cache_depends():
    text = "linux-image-amd64\n  Depends: linux-image-6.1.0-57-amd64\n"
    assert K.parse_image_dependency(text) == "linux-image-6.1.0-57-amd64"
    assert K.release_of("linux-image-6.1.0-57-amd64") == "6.1.0-57-amd64"
    with pytest.raises(GuestUnavailable, match="apt-get update"):
        K.parse_image_dependency("linux-image-amd64\n")
    with pytest.raises(GuestUnavailable, match="not a linux-image"):
        K.release_of("linux-headers-6.1.0-57-amd64")


def test_module_closure_puts_dependencies_first():
    deps = {"rdma_rxe": ["ib_uverbs", "ib_core", "udp_tunnel"], "ib_uverbs": ["ib_core"], "ib_core": [],
            "udp_tunnel": [], "veth": []}
    order = K.module_closure(("rdma_rxe", "veth"), deps)
    assert sorted(order) == sorted(deps)
    for mod, needs in deps.items():
        assert all(order.index(n) < order.index(mod) for n in needs), order
    with pytest.raises(GuestUnavailable, match="'nope' .* is not in the kernel package"):
        K.module_closure(("veth", "nope"), deps)
    with pytest.raises(GuestUnavailable, match="cycle: a -> b -> a"):
        K.module_closure(("a",), {"a": ["b"], "b": ["a"]})


def test_qemu_command_has_no_nic_and_a_read_only_root(tmp_path):
    kern = K.GuestKernel("6.1.0-57-amd64", tmp_path / "vmlinuz", tmp_path / "initrd.cpio", ())
    argv = R.qemu_argv(kern, R.GuestSpec(cpus=2, memory_mib=4096), "tcg", tmp_path / "ctl", tmp_path / "work")
    joined = " ".join(argv)
    assert argv[argv.index("-nic") + 1] == "none" and "-nodefaults" in argv and "-netdev" not in argv
    assert argv[argv.index("-cpu") + 1] == "max" and argv[argv.index("-accel") + 1] == "tcg"
    assert "local,path=/,mount_tag=host,security_model=none,readonly=on" in joined
    assert f"local,path={tmp_path / 'work'},mount_tag=work" in joined
    assert "tsc=reliable" in argv[argv.index("-append") + 1].split()
    kvm = R.qemu_argv(kern, R.GuestSpec(), "kvm", tmp_path, None)
    assert kvm[kvm.index("-cpu") + 1] == "host" and "mount_tag=work" not in " ".join(kvm)


def test_the_venv_and_package_inside_the_work_folder_are_read_through_the_cached_root(tmp_path):
    work = tmp_path / "checkout"
    (work / ".venv").mkdir(parents=True)
    (work / "peercache").mkdir()
    assert R.cached_folders(work, work / ".venv", work / "peercache") == [".venv", "peercache"]
    # a venv elsewhere is not the work folder's to show; nor is the work folder itself, or no work folder
    assert R.cached_folders(work, tmp_path / "other-venv", work / "peercache") == ["peercache"]
    assert R.cached_folders(work, work, work) == []
    assert R.cached_folders(None, work / ".venv", work / "peercache") == []
    # a name the stage-2 shell would split or expand is left on the work share
    (work / "my venv").mkdir()
    assert R.cached_folders(work, work / "my venv", work / "peercache") == ["peercache"]
    # the stage-2 script mounts each one it is given over the work share
    stage2 = R.STAGE2.read_text()
    assert 'mount --bind "/run/pcg-root$PCG_WORK/$d" "$PCG_WORK/$d"' in stage2


def test_topology_script_builds_both_ends_of_every_rail():
    t = T.Topology(rails=2, mtu=9000, consumer_mtu=1500)
    script = T.setup_script(t)
    for i in range(2):
        assert f"rdma link add rxe_a{i} type rxe netdev pcg{i}a" in script
        assert f"rdma link add rxe_b{i} type rxe netdev pcg{i}b" in script
        assert f"ip route add 198.18.{i}.2 dev pcg{i}a src 198.18.{i}.1" in script
    assert "ip link add pcg0a mtu 9000 type veth peer name pcg0b mtu 1500" in script
    # The local rule goes behind the per-device rules, or RoCE would take the lo shortcut.
    assert script.index("ip rule add pref 1000 lookup local") < script.index("ip rule del pref 0 lookup local")
    assert T.environment(t)["PEERCACHE_RDMA_PRODUCER"] == "rxe_a0,rxe_a1"
    assert T.environment(t)["PEERCACHE_RDMA_CONSUMER"] == "rxe_b0,rxe_b1"
    assert T.setup_script(T.Topology(rails=0)) == "set -e\n" and T.environment(T.Topology(rails=0)) == {}
    with pytest.raises(ValueError, match="rails=9 outside 0..8"):
        T.Topology(rails=9)
    with pytest.raises(ValueError, match="MTU 100 outside"):
        T.Topology(mtu=100)


def test_topology_script_puts_a_clusters_hosts_on_one_bridge_each_with_its_rxe_device():
    t = T.Topology(rails=0, cluster_hosts=3)
    script = T.setup_script(t)
    assert "ip link add pcbr type bridge" in script and "ip rule del pref 0 lookup local" in script
    for i in (1, 2, 3):
        assert f"ip link set pcp{i} master pcbr" in script
        assert f"rdma link add rxe_h{i} type rxe netdev pch{i}" in script
        assert f"ip rule add pref {200 + i} oif pch{i} lookup {200 + i}" in script
        for j in {1, 2, 3} - {i}:     # a route and a static neighbour to every other host, from this host's end
            assert f"ip route add 198.18.100.{j} dev pch{i} src 198.18.100.{i} table {200 + i}" in script
    assert T.environment(t) == {"PEERCACHE_CLUSTER_HOSTS": "rxe_h1@198.18.100.1,rxe_h2@198.18.100.2,rxe_h3@198.18.100.3"}
    both = T.environment(T.Topology(rails=2, cluster_hosts=3))
    assert both["PEERCACHE_RDMA_PRODUCER"] == "rxe_a0,rxe_a1" and "PEERCACHE_CLUSTER_HOSTS" in both
    with pytest.raises(ValueError, match="cluster_hosts=1 is neither 0 nor in 2..16"):
        T.Topology(cluster_hosts=1)


# --- when it cannot run ----------------------------------------------------------------------

def test_missing_qemu_and_not_root_are_named(monkeypatch):
    monkeypatch.setattr(R.shutil, "which", lambda name: None if name == R.QEMU else f"/usr/bin/{name}")
    monkeypatch.setattr(R.os, "geteuid", lambda: 1000)
    problems = R.missing()
    assert any("needs root" in p for p in problems)
    assert any("apt-get install qemu-system-x86" in p for p in problems)
    with pytest.raises(GuestUnavailable, match="cannot run here: .*apt-get install qemu-system-x86"):
        R.run("true")


def test_cli_says_what_is_missing_and_if_available_passes(monkeypatch, capsys):
    from peercache.lab.launch.guest import __main__ as cli
    monkeypatch.setattr(R.shutil, "which", lambda name: None if name == R.QEMU else f"/usr/bin/{name}")
    assert cli.main(["--", "true"]) == cli.EXIT_UNAVAILABLE
    err = capsys.readouterr().err
    assert "apt-get install qemu-system-x86" in err
    assert cli.main(["--if-available", "--", "true"]) == 0
    assert "stage skipped" in capsys.readouterr().err


# --- real boots ------------------------------------------------------------------------------

def _qemu_pids() -> set[int]:
    r = subprocess.run(["pgrep", "-f", "pcguest-ctl-"], capture_output=True, text=True)
    return {int(x) for x in r.stdout.split()}


@needs_guest
def test_guest_runs_a_command_with_rdma_devices_and_returns_its_status(tmp_path, monkeypatch):
    before = _qemu_pids()
    lines: list[str] = []
    # a read-mostly folder of the work folder (as its venv would be), under /tmp as a fresh clone's is
    (tmp_path / "ro").mkdir()
    (tmp_path / "ro" / "file").write_text("from the host\n")
    monkeypatch.setattr(R, "cached_folders", lambda work: ["ro"])
    res = R.run("ls /sys/class/infiniband; cat /sys/class/infiniband/rxe_b1/ports/1/state; "
                "echo $PEERCACHE_RDMA_CONSUMER > out.txt; cat ro/file; echo guest > ro/written; exit 7",
                cwd=tmp_path, topology=T.Topology(rails=2), stream=lines.append, timeout=300)
    assert res.returncode == 7
    out = "".join(lines)
    assert all(d in out for d in ("rxe_a0", "rxe_a1", "rxe_b0", "rxe_b1")) and "ACTIVE" in out
    assert (tmp_path / "out.txt").read_text().strip() == "rxe_b0,rxe_b1"   # the work folder is shared
    # ro/ came from the cached root: read as the host wrote it, and what the guest wrote there stayed in it
    assert "pcguest: ro read through the cached root" in out and "from the host" in out
    assert not (tmp_path / "ro" / "written").exists()
    assert res.kernel and res.accel in ("kvm", "tcg") and res.boot_s > 0
    assert _qemu_pids() <= before


@needs_guest
def test_a_hung_guest_is_killed_at_its_timeout_and_named():
    before = _qemu_pids()
    t0 = time.monotonic()
    r = subprocess.run([*GUEST, "--rails", "0", "--timeout", "8", "--", "sleep", "600"],
                       capture_output=True, text=True, timeout=120)
    took = time.monotonic() - t0
    assert r.returncode == 124, r.stderr
    assert "still running after 8 s" in r.stderr and "killed" in r.stderr and "sleep 600" in r.stderr
    assert took < 60
    assert _qemu_pids() <= before
    with pytest.raises(GuestTimeout):
        R.run("sleep 600", topology=T.Topology(rails=0), timeout=5)
    assert _qemu_pids() <= before


@needs_guest
def test_kernel_is_fetched_once_then_served_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PEERCACHE_GUEST_CACHE", str(tmp_path / "cache"))
    said: list[str] = []
    kern = K.prepare(progress=said.append)
    assert any("apt-get download; nothing is installed" in s for s in said)
    assert kern.vmlinuz.stat().st_size > 1 << 20 and kern.initrd.stat().st_size > 1 << 20
    assert "rdma_rxe" in kern.modules and kern.modules.index("ib_core") < kern.modules.index("rdma_rxe")
    assert not any(p.is_dir() for p in (tmp_path / "cache").glob("pcguest-kernel-*"))   # no leftovers

    def no_apt(*a, **k):
        raise AssertionError("a cached kernel must not ask apt anything")

    monkeypatch.setattr(K, "_run", no_apt)
    t0 = time.monotonic()
    again = K.prepare(progress=said.append)
    assert again == kern and time.monotonic() - t0 < 5
