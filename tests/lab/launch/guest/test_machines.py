"""The two-machine Soft-RoCE testbed's pure builders (qemu command line, boot script, ssh config) and
the make-run launcher's Snakemake command. Real boots: tests/lab/test_twohost.py (make test-2host)."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from peercache.lab.launch.guest import kernel as K
from peercache.lab.launch.guest import machines as M
from peercache.lab.pipeline import experiments
from peercache.lab.pipeline import run as R

PORTS = M.Ports(ssh={"producer": 40022, "consumer": 40023}, rails=(41000, 41001))


def argv(role: str, tmp_path: Path, spec: M.MachinesSpec = M.MachinesSpec()) -> list[str]:
    kern = K.GuestKernel("6.1.0-57-amd64", tmp_path / "vmlinuz", tmp_path / "initrd.cpio", ())
    return M.qemu_argv(kern, spec, "tcg", role, tmp_path / role, PORTS)


def values(a: list[str], flag: str) -> list[str]:
    return [a[i + 1] for i, x in enumerate(a) if x == flag]


def test_each_rail_is_one_wire_the_producer_listens_on_and_the_consumer_connects_to(tmp_path):
    prod, cons = argv("producer", tmp_path), argv("consumer", tmp_path)
    assert [n for n in values(prod, "-netdev") if n.startswith("socket")] == [
        "socket,id=rail0,listen=127.0.0.1:41000", "socket,id=rail1,listen=127.0.0.1:41001"]
    assert [n for n in values(cons, "-netdev") if n.startswith("socket")] == [
        "socket,id=rail0,connect=127.0.0.1:41000", "socket,id=rail1,connect=127.0.0.1:41001"]


def test_both_machines_boot_keeping_time_on_the_tsc(tmp_path):
    for role in M.ROLES:
        a = argv(role, tmp_path)
        assert "tsc=reliable" in a[a.index("-append") + 1].split()


def test_ssh_is_the_only_way_in_and_only_from_loopback(tmp_path):
    for role in M.ROLES:
        users = [n for n in values(argv(role, tmp_path), "-netdev") if n.startswith("user")]
        assert len(users) == 1 and "restrict=on" in users[0]
        assert users[0].endswith(f"hostfwd=tcp:127.0.0.1:{PORTS.ssh[role]}-{M.MGMT_ADDR}:22")


def test_two_numa_nodes_with_one_rail_nic_behind_each(tmp_path):
    a = argv("producer", tmp_path)
    numa = values(a, "-numa")
    assert numa == ["node,nodeid=0,memdev=mem0,cpus=0", "node,nodeid=1,memdev=mem1,cpus=1"]
    devs = values(a, "-device")
    assert "pxb,id=pxb0,bus_nr=32,numa_node=0,bus=pci.0" in devs and "pxb,id=pxb1,bus_nr=64,numa_node=1,bus=pci.0" in devs
    rails = [d for d in devs if "netdev=rail" in d]
    assert "bus=node0" in rails[0] and "bus=node1" in rails[1]
    assert M.MachinesSpec(rails=3).rail_node(2) == 0


def test_root_is_shared_read_only_and_no_work_folder(tmp_path):
    shares = values(argv("consumer", tmp_path), "-virtfs")
    assert shares[0].startswith("local,path=/,") and "readonly=on" in shares[0]
    assert len(shares) == 2 and f"path={tmp_path / 'consumer'}," in shares[1]   # the control share only


def test_boot_script_names_nics_by_mac_adds_rxe_and_starts_sshd_on_the_management_address():
    s = M.setup_script(M.MachinesSpec(rails=2, mtu=4200), "consumer")
    assert s.startswith("set -e\n")
    for i in range(2):
        assert M.nic_mac("consumer", i + 1) in s and f"name rail{i}" in s
        assert f"ip addr add 198.18.{i}.2/24 dev rail{i}" in s and f"ip link set rail{i} mtu 4200" in s
        assert f"rdma link add rxe{i} type rxe netdev rail{i}" in s
    assert f"ListenAddress {M.MGMT_ADDR}" in s and "PasswordAuthentication no" in s
    assert s.index("ACTIVE") < s.index("/usr/sbin/sshd")     # ports up before anyone can log in


def test_every_ssh_session_is_told_the_checkouts_revision_and_only_one_of_git_revisions_form():
    rev = "15ec0ca6f1f8eb45481eabe8c3dbb9b3defc173f-dirty"
    s = M.setup_script(M.MachinesSpec(), "producer", rev)
    assert f"SetEnv PEERCACHE_GIT_REVISION={rev}\n" in s and s.index("SetEnv") < s.index("/usr/sbin/sshd")
    for odd in (None, "", "abc def", "15ec0ca\nPermitEmptyPasswords yes", "HEAD"):
        assert "SetEnv" not in M.sshd_config(odd), odd


def test_ssh_config_pins_this_runs_key_and_host_keys(tmp_path):
    text = M.ssh_config(PORTS.ssh, tmp_path / "id", tmp_path / "known_hosts")
    assert "Host pc-producer\n  HostName 127.0.0.1\n  Port 40022" in text
    assert "Host pc-consumer\n  HostName 127.0.0.1\n  Port 40023" in text
    assert text.count("StrictHostKeyChecking yes") == 2 and text.count("BatchMode yes") == 2
    assert text.count(f"IdentityFile {tmp_path / 'id'}") == 2


def test_bad_specs_are_refused():
    for kw, what in (({"rails": 0}, "rails"), ({"numa_nodes": 3, "cpus": 2}, "numa_nodes"),
                     ({"memory_mib": 600}, "memory_mib"), ({"mtu": 100}, "MTU")):
        with pytest.raises(ValueError, match=what):
            M.MachinesSpec(**kw)


def test_make_run_goes_through_the_ssh_profile_for_ssh_testbeds():
    two = experiments.load_testbed("experiments/testbeds/softroce-2host.yaml").doc
    local = experiments.load_testbed("experiments/testbeds/local.yaml").doc
    a = R.snakemake_argv("experiments/testbeds/softroce-2host.yaml", two, 2, [])
    assert a[-4:] == ["--profile", "profiles/ssh-testbed", "--config",
                      "testbed=experiments/testbeds/softroce-2host.yaml"]
    assert "--profile" not in R.snakemake_argv("experiments/testbeds/local.yaml", local, 2, ["-n"])
    assert R.machines_spec(two) == M.MachinesSpec(rails=2, mtu=4200, cpus=2, numa_nodes=2, memory_mib=2048)
    assert R.machines_spec(local) is None


def test_the_monitor_listens_beside_the_control_share_not_in_it(tmp_path):
    a = argv("consumer", tmp_path)
    assert values(a, "-monitor") == [f"unix:{tmp_path / 'consumer.monitor'},server=on,wait=off"]


def test_a_monitor_that_does_not_answer_is_said_so(tmp_path):
    import socket
    path = tmp_path / "m.sock"
    with socket.socket(socket.AF_UNIX) as srv:      # accepts, never speaks: a stuck main loop
        srv.bind(str(path))
        srv.listen(1)
        assert "no answer within 1 s" in M.ask_monitor(path, "info status", timeout=1.0)
    assert "no answer" in M.ask_monitor(tmp_path / "absent.sock", "info status", timeout=1.0)


def test_process_threads_names_each_thread_with_its_state():
    import threading
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, name="pc-waiter")
    t.start()
    try:
        lines = M.process_threads(os.getpid()).splitlines()
    finally:
        stop.set()
        t.join()
    assert len(lines) >= 2, lines
    assert all(re.fullmatch(r"\d+ '.*' state [RSDZTtIWXP] wchan \S+ cpu \d+ ticks", ln) for ln in lines), lines
    assert "unreadable" in M.process_threads(2 ** 22 + 12345)


def test_a_machine_is_stalled_when_qemu_runs_and_its_health_file_went_quiet(tmp_path):
    import subprocess
    import time
    pair = M.MachinePair()
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        m = M._Machine("consumer", tmp_path, [], tmp_path / "console.log", proc=sleeper)
        pair.machines["consumer"] = m
        assert pair.silent_for("consumer") is None and not pair.stalled("consumer")   # not written yet
        health = tmp_path / M.HEALTH_FILE
        health.write_text("12:00:00 up 10 s\n")
        assert pair.silent_for("consumer") < 5 and not pair.stalled("consumer")
        old = time.time() - M.STALL_S - 5
        os.utime(health, (old, old))
        assert pair.stalled("consumer")
        text = pair.describe("consumer")
        assert f"qemu's threads (pid {sleeper.pid})" in text and "health file last changed" in text, text
        sleeper.kill()
        sleeper.wait()
        assert not pair.stalled("consumer")        # qemu gone: exited, not stalled
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()


def test_make_run_stops_the_pipeline_when_a_machine_stalls():
    import subprocess
    import time
    asked = []

    def stalled():
        asked.append(time.monotonic())
        return "pc-consumer (running; ...)" if len(asked) >= 2 else None

    t0 = time.monotonic()
    with pytest.raises(R._Stalled, match="pc-consumer"):
        R._run(["sleep", "60"], dict(os.environ), stalled)
    assert len(asked) == 2 and time.monotonic() - t0 < 20
    # the child got SIGINT and is gone: nothing named sleep 60 of ours is left
    left = subprocess.run(["pgrep", "-f", "-P", str(os.getpid()), "sleep 60"], capture_output=True, text=True)
    assert left.stdout.strip() == "", left.stdout
    assert R._run(["true"], dict(os.environ), stalled) == 0


class _StallingPair:
    """A pair whose consumer stalls during the first ``stalls`` runs: what make run's retry sees."""

    def __init__(self, stalls: int):
        self.stalls, self.restarts, self.asked = stalls, 0, 0

    def environment(self):
        return {"PEERCACHE_SLOWNESS": "1.0"}

    def stalled(self, role):
        self.asked += 1
        return role == "consumer" and self.restarts < self.stalls

    def describe(self, role):
        return f"pc-{role} (running; health silent)"

    def restart(self):
        self.restarts += 1
        return self


@pytest.mark.parametrize("stalls, retries, rc, restarts", [(1, 1, 0, 1), (2, 1, 4, 1), (1, 0, 4, 0)])
def test_make_run_reboots_a_stalled_pair_and_goes_on_once(capfd, stalls, retries, rc, restarts):
    """A stall stops the run and prints the machine's description; with a retry left, the pair is
    rebooted and the same command runs again (Snakemake keeps finished points); else exit 4."""
    import sys
    pair = _StallingPair(stalls)
    cmd = [sys.executable, "-c", "import time; time.sleep(7)"]
    assert R._run_on_pair(pair, "pairtest", cmd, retries) == rc
    assert pair.restarts == restarts
    err = capfd.readouterr().err
    assert err.count("a machine stopped answering") == min(stalls, retries + 1)
    assert "pc-consumer (running; health silent)" in err
    assert ("the machines stopped" in err) == (rc == 4)


FIX = Path(__file__).resolve().parents[3] / "fixtures" / "lab" / "guest"


def test_vcpu_addresses_are_read_from_info_registers_and_named_from_kallsyms():
    regs = (FIX / "info-registers-a.txt").read_text()
    rips = M.vcpu_addresses(regs)
    assert rips == [0xffffffff81a592eb, 0xffffffff81a592eb]          # both vCPUs idle
    kallsyms = (FIX / "kallsyms-excerpt.txt").read_text()
    assert M.symbolize(rips, kallsyms) == ["0xffffffff81a592eb native_safe_halt+0xb"] * 2
    requester = next(int(ln.split()[0], 16) for ln in kallsyms.splitlines() if ln.split()[2] == "rxe_requester")
    assert M.symbolize([requester + 0x40], kallsyms) == [f"{requester + 0x40:#x} rxe_requester+0x40 [rdma_rxe]"]
    assert M.symbolize([0x1000], kallsyms) == ["0x1000"]
    assert M.vcpu_addresses("no answer within 10 s") == []


def test_the_guest_leaves_its_kernel_symbols_in_the_control_share():
    assert f"/proc/kallsyms > /mnt/pcguest/{M.KALLSYMS_FILE}" in M.WAIT_COMMAND
