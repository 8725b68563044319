"""peercache.sysfs's two formats: a GID's IPv4 address and a kernel CPU/node list, each read in one place
(issue 37, item 1: the engine's RDMA discovery, preflight, hostinfo, numa and memcpy all use these)."""
import pytest

from peercache import sysfs
from peercache.sysfs import gid_ipv4, parse_list


@pytest.mark.parametrize("gid, ip", [
    ("0000:0000:0000:0000:0000:ffff:c612:0001", "198.18.0.1"),     # sysfs's spelling
    ("0000:0000:0000:0000:0000:ffff:0a00:0005", "10.0.0.5"),
    ("0000:0000:0000:0000:0000:FFFF:C612:0001", "198.18.0.1"),
    ("::ffff:10.0.0.7", "10.0.0.7"),                               # ibv_devinfo's / pyverbs' spelling
    ("::ffff:c612:1", "198.18.0.1"),
    (" 0000:0000:0000:0000:0000:ffff:c612:0001\n", "198.18.0.1"),
    ("::ffff:0.0.0.0", "0.0.0.0"),
])
def test_gid_ipv4(gid, ip):
    assert gid_ipv4(gid) == ip


@pytest.mark.parametrize("gid", [
    "fe80:0000:0000:0000:ba3f:d2ff:fe01:1a2c",    # link-local IPv6 (RoCE v2 without an IPv4 address)
    "fe80::ba3f:d2ff:fe01:1a2c",
    "fe80:0000:0000:0000:0002:c903:0000:1234",    # an InfiniBand GID
    "0000:0000:0000:0000:0000:0000:0000:0000",
    "2001:db8::1",
    "::10.0.0.1",                                 # IPv4-compatible, not IPv4-mapped
    "", None, "not a gid", "198.18.0.1", "::ffff:999.1.1.1",
])
def test_gid_without_ipv4(gid):
    assert gid_ipv4(gid) is None


def test_one_gid_rule_for_engine_and_lab():
    from peercache.lab.pipeline import preflight
    from peercache.rdma import devices
    assert devices.gid_ipv4 is preflight.gid_ipv4 is sysfs.gid_ipv4


def test_gid_table_uses_it(tmp_path):
    base = tmp_path / "sys/class/infiniband/mlx5_0/ports/1"
    for idx, gid, kind in ((0, "fe80:0000:0000:0000:ba3f:d2ff:fe01:1a2c", "RoCE v2"),
                           (1, "0000:0000:0000:0000:0000:ffff:c612:0001", "RoCE v2"),
                           (2, "0000:0000:0000:0000:0000:0000:0000:0000", None)):
        (base / "gids").mkdir(parents=True, exist_ok=True)
        (base / "gids" / str(idx)).write_text(gid + "\n")
        if kind:
            for sub, text in (("types", kind), ("ndevs", "eth1")):
                (base / "gid_attrs" / sub).mkdir(parents=True, exist_ok=True)
                (base / "gid_attrs" / sub / str(idx)).write_text(text + "\n")
    entries, problems = sysfs.gid_table("mlx5_0", 1, root=tmp_path)
    assert problems == []
    assert [(e["index"], e["ipv4"]) for e in entries] == [(0, None), (1, "198.18.0.1")]


@pytest.mark.parametrize("text, numbers", [
    ("0", [0]),
    ("0\n", [0]),
    ("0-3", [0, 1, 2, 3]),
    ("0-1,4,6-7", [0, 1, 4, 6, 7]),
    ("0,2-3", [0, 2, 3]),
    ("8,0-1", [8, 0, 1]),          # in the order written
    ("", []),                      # a memoryless or CPU-less node: an empty list
    ("\n", []),
    ("0,,2", [0, 2]),
    ("3-1", []),                   # a range written backwards holds nothing (as it always has here)
    ("2-", [2]),                   # and N- is N
])
def test_parse_list(text, numbers):
    assert parse_list(text) == numbers


@pytest.mark.parametrize("text", ["x", "0-x", "-1", "-", "0-1-2", "0 - 1", "1,a", "\u00b2", "0x3"])
def test_parse_list_refuses(text):
    with pytest.raises(ValueError, match="kernel list"):
        parse_list(text)


def test_the_lab_keeps_its_answers_for_an_unreadable_list():
    # numa: a set, None when absent or malformed; memcpy: [] when it cannot be read; hostinfo: raises
    from peercache.lab.pipeline.points.memcpy import parse_nodelist
    from peercache.lab.system import numa
    assert numa.parse_list("0-3,8") == {0, 1, 2, 3, 8} and numa.parse_list(None) is None
    assert numa.parse_list("0-x") is None and numa.parse_list("") == set()
    assert parse_nodelist("0,2-3") == [0, 2, 3] and parse_nodelist("x") == [] and parse_nodelist("") == []
