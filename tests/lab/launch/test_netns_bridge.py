"""NetnsBridge: namespaces on one Linux bridge (the hosts of a cluster testbed on one machine).

Made for real (root and iproute2; skipped with the reason otherwise): every namespace reaches every
other address across the bridge, removal leaves nothing behind, a second holder is refused naming the
first one's pid, and a set left by a killed run is replaced."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from peercache.lab.launch import netns


def _require_netns():
    ok, why = netns.available()
    if not ok:
        pytest.skip(why)


def _members(tag: str, index: int, n: int) -> list[tuple[str, str]]:
    return [(f"{tag}{i}", f"198.18.{index}.{i}") for i in range(1, n + 1)]


def _left(tag: str) -> list[str]:
    """Namespaces and interfaces of ``tag`` still on this machine."""
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split("\n")
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout.splitlines()
    names = [ln.split(":")[1].strip().split("@")[0] for ln in links if ":" in ln]
    return [n.split()[0] for n in ns if n.startswith(tag)] + [n for n in names if n.startswith(tag)]


def test_the_definition_is_checked_before_anything_is_made():
    tag = "pcbq"
    with pytest.raises(netns.NetnsError, match="outside 198.18.0.0/15"):
        netns.NetnsBridge(tag, 5, [(f"{tag}1", "10.0.0.1"), (f"{tag}2", "198.18.5.2")]).check()
    with pytest.raises(netns.NetnsError, match="198.18.5.0/24, the /24 that index 5 picks"):
        netns.NetnsBridge(tag, 5, [(f"{tag}1", "198.18.6.1"), (f"{tag}2", "198.18.5.2")]).check()
    with pytest.raises(netns.NetnsError, match="must start with the tag"):
        netns.NetnsBridge(tag, 5, [("other1", "198.18.5.1")]).check()
    with pytest.raises(netns.NetnsError, match="address 198.18.5.1 given twice"):
        netns.NetnsBridge(tag, 5, [(f"{tag}1", "198.18.5.1"), (f"{tag}2", "198.18.5.1")]).check()
    with pytest.raises(netns.NetnsError, match="kernel's limit is 15"):
        netns.check_ifname("a" * 16)
    assert netns.NetnsBridge("pcclu", 78, _members("pcclu", 78, 8)).veth(7) == ("pcclun8", "pcclup8")


def test_four_hosts_reach_each_other_and_leave_nothing_behind():
    _require_netns()
    tag, index = f"pcbr{os.getpid() % 1000}", 90 + os.getpid() % 50
    members = _members(tag, index, 4)
    with netns.NetnsBridge(tag, index, members) as br:
        for ns, own in members:
            addr = subprocess.run(["ip", "-n", ns, "-o", "-4", "addr"], capture_output=True, text=True).stdout
            assert f"{own}/24" in addr and "127.0.0.1" in addr       # its address, and lo up
            routes = subprocess.run(["ip", "-n", ns, "route"], capture_output=True, text=True).stdout
            assert "default" not in routes                            # nothing routes off the /24
            for _, other in members:
                if other != own:
                    r = subprocess.run([*br.exec_prefix(ns), "ping", "-c1", "-W1", other],
                                       capture_output=True, text=True, timeout=10)
                    assert r.returncode == 0, (ns, other, r.stdout, r.stderr)
        # the bridge has no address (no IPv6 link-local either) and only the set's ports
        assert subprocess.run(["ip", "-o", "addr", "show", "dev", br.bridge], capture_output=True,
                              text=True).stdout.strip() == ""
        ports = subprocess.run(["ip", "-o", "link", "show", "master", br.bridge], capture_output=True,
                               text=True).stdout
        assert sorted(ln.split(":")[1].strip().split("@")[0] for ln in ports.splitlines()) == \
            sorted(br.veth(i)[1] for i in range(4))
    assert _left(tag) == []
    br.remove()                                                       # idempotent
    assert _left(tag) == []


HOLD = """
import sys, time
from peercache.lab.launch import netns
b = netns.NetnsBridge(sys.argv[1], int(sys.argv[2]), [(sys.argv[1] + str(i), "198.18.%s.%d" % (sys.argv[2], i))
                                                     for i in (1, 2, 3)]).create()
print("ready", flush=True)
time.sleep(120)
"""


def test_a_second_holder_is_refused_and_a_killed_runs_set_is_replaced():
    _require_netns()
    tag, index = f"pcbs{os.getpid() % 1000}", 150 + os.getpid() % 50
    members = _members(tag, index, 3)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, tag, str(index)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        second = netns.NetnsBridge(tag, index, members)
        with pytest.raises(netns.NetnsError, match=rf"in use by process {holder.pid}\b"):
            second.create()
        with pytest.raises(netns.NetnsError, match=rf"in use by process {holder.pid}\b"):
            second.remove()                                           # nor removed under its holder
        assert f"{tag}br" in _left(tag)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # killed without cleaning up: its set is still there, its lock is gone with it
    assert f"{tag}1" in _left(tag) and f"{tag}br" in _left(tag)
    t0 = time.monotonic()
    with netns.NetnsBridge(tag, index, members) as br:
        r = subprocess.run([*br.exec_prefix(f"{tag}3"), "ping", "-c1", "-W1", f"198.18.{index}.1"],
                           capture_output=True, text=True, timeout=10)
        assert r.returncode == 0, r.stdout + r.stderr
    assert _left(tag) == [] and time.monotonic() - t0 < 30
