"""hostinfo against the Soft-RoCE guest: its live JSON and a copy of the files it read.

hosts/softroce/hostinfo_rxe.json is `python -m peercache.lab.cli hostinfo` run in the QEMU guest
(kernel 6.1.0-57-amd64, four rxe devices); hosts/softroce/tree holds the sysfs/proc files it
reads and, in commands.json, the command outputs it got (recorded by capture.sh), so
``capture(tree)`` can be compared with the live document. No device needed.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from peercache.lab.system import hostinfo as hi

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "lab"
H = FIX / "hosts" / "softroce"
TREE = H / "tree"
NETDEV = {"rxe_a0": ("pcg0a", "198.18.0.1"), "rxe_a1": ("pcg1a", "198.18.1.1"),
          "rxe_b0": ("pcg0b", "198.18.0.2"), "rxe_b1": ("pcg1b", "198.18.1.2")}


@pytest.fixture(scope="module")
def live() -> dict:
    return json.loads((H / "hostinfo_rxe.json").read_text())


def _nulls_have_reasons(obj, path="doc"):
    if isinstance(obj, dict):
        missing = obj.get("_missing", {})
        for k, v in obj.items():
            if v is None and k not in ("ipv4", "reason"):
                assert k in missing, f"{path}.{k} is null without a reason"
            _nulls_have_reasons(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            _nulls_have_reasons(v, f"{path}[{i}]")


def test_guest_host_cpu_software(live):
    # captured in the guest before captures listed their sources (schema 2)
    assert live["live"] is True and live["schema_version"] == 1
    assert live["host"]["kernel"] == "6.1.0-57-amd64" and live["host"]["hostname"] == "pcguest"
    assert "Debian 6.1.192-3" in live["host"]["kernel_version"]
    assert live["cpu"] == {"threads": 2, "model": "QEMU TCG CPU version 2.5+", "sockets": 1, "cores": 2}
    [node] = live["numa"]["nodes"]
    assert (node["cpulist"], node["cpu_count"], node["distances"]) == ("0-1", 2, [10])
    sw = live["software"]
    assert (sw["perftest"], sw["perftest_package"], sw["rdma_core"], sw["glibc"]) == (
        "6.06", "4.5+0.17-1", "44.0-2", "2.36")
    assert sw["mlnx_ofed"] is None and "ofed_info" in sw["_missing"]["mlnx_ofed"]
    assert live["tools"]["perf"]["version"] == "perf version 6.1.192"
    assert live["tools"]["perf_event_paranoid"] == 3
    assert live["gpu"]["devices"] is None
    _nulls_have_reasons(live)


def test_rxe_devices(live):
    rdma = live["rdma"]
    assert rdma["pyverbs"] == {"used": True, "reason": None}  # no per-device errors
    devs = {d["name"]: d for d in rdma["devices"]}
    assert sorted(devs) == ["rxe_a0", "rxe_a1", "rxe_b0", "rxe_b1"]
    for name, d in devs.items():
        netdev, ip = NETDEV[name]
        assert d["node_desc"] == "rxe" and re.fullmatch(r"([0-9a-f]{4}:){3}[0-9a-f]{4}", d["node_guid"])
        # rxe writes an empty fw_ver and has no board_id, hca_type or PCI device
        assert d["fw_ver"] is None and "is empty" in d["_missing"]["fw_ver"]
        assert d["board_id"] is None and "does not exist" in d["_missing"]["board_id"]
        assert d["numa_node"] is None and "numa_node" in d["_missing"]
        [p] = d["ports"]
        assert (p["state"], p["phys_state"], p["link_layer"]) == ("4: ACTIVE", "5: LinkUp", "Ethernet")
        assert p["rate"] == {"text": "10 Gb/sec (1X FDR10)", "gbps": 10.0, "width": 1,
                             "speed": "FDR10", "lane_gbps": 10.0}
        assert [(g["index"], g["type"], g["ndev"], g["ipv4"]) for g in p["gids"]] == [
            (0, "RoCE v2", netdev, None), (1, "RoCE v2", netdev, ip)]
        assert p["gids"][1]["gid"] == "0000:0000:0000:0000:0000:ffff:" + "{:02x}{:02x}:{:02x}{:02x}".format(
            *map(int, ip.split(".")))
        assert p["roce_v2_ipv4_gid_index"] == 1 and p["netdev"] == netdev and p["bond_members"] == []
        # pyverbs answered (netdev MTU 1500 -> RoCE MTU 1024, as ibv_devinfo says)
        assert p["active_mtu"] == 1024 and p["active_mtu_source"] == "pyverbs query_port"
        assert p["counters_present"] is False  # rxe on 6.1 has hw_counters only
    dv = (FIX / "perftest" / "softroce" / "ibv_devinfo_v_rxe_b0.txt").read_text()
    assert re.search(r"active_mtu:\s+1024 \(3\)", dv) and "::ffff:198.18.0.2, RoCE v2" in dv
    s = hi.summary(live)
    assert [(n["name"], n["roce_v2_gid_index"], n["active_mtu"], n["netdev"]) for n in s["nics"]] == [
        (n, 1, 1024, NETDEV[n][0]) for n in ("rxe_a0", "rxe_a1", "rxe_b0", "rxe_b1")]


def _strip_root(obj, root: str):
    if isinstance(obj, dict):
        return {k: _strip_root(v, root) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_strip_root(v, root) for v in obj]
    if isinstance(obj, str):
        return obj.replace(root, "")
    return obj


def test_fixture_tree_reproduces_the_live_capture(live):
    doc = json.loads(json.dumps(hi.capture(TREE)))
    assert doc["live"] is False
    assert doc["rdma"]["pyverbs"]["used"] is False
    doc = _strip_root(doc, str(TREE))
    for key in ("host", "cpu", "memory", "numa", "software", "gpu", "tools"):
        assert doc[key] == live[key], key
    for dl, dt in zip(live["rdma"]["devices"], doc["rdma"]["devices"], strict=True):
        for pl, pt in zip(dl["ports"], dt["ports"], strict=True):
            # live: pyverbs; fixture: the kernel's rule on the netdev MTU; the same answer
            assert pl["active_mtu"] == pt["active_mtu"] == 1024
            assert pt["active_mtu_source"].startswith("derived from ") and "MTU 1500" in pt["active_mtu_source"]
            pl.pop("active_mtu_source"), pt.pop("active_mtu_source")
        # Captured before hostinfo read PCIe links: rxe has no PCI device, so that field is null with its reason.
        assert dt.pop("pcie") is None and "current_link_speed does not exist" in dt["_missing"].pop("pcie")
        # Captured before hostinfo looked past a virtual device: rxe on veth has no NUMA node either way,
        # now with the netdev it looked at in the reason.
        assert dl.pop("numa_node") is dt.pop("numa_node") is None and dt.pop("numa_source") is None
        assert "veth" in dt["_missing"].pop("numa_node") and dt["_missing"].pop("numa_source")
        dl["_missing"].pop("numa_node")
        assert dl == dt


def test_pyverbs_error_is_reported(monkeypatch):
    # The bug the guest capture found: DeviceAttr has fw_version, not fw_ver; an error there
    # must name itself in the document, not hide as "no answer for this port".
    def broken(ctx):
        return {("rxe_b0", 0): {"error": "AttributeError: no attribute 'fw_ver'"}}, None
    monkeypatch.setattr(hi, "_pyverbs_ports", broken)
    doc = hi.capture(TREE)
    assert doc["rdma"]["pyverbs"]["errors"] == {"rxe_b0": "AttributeError: no attribute 'fw_ver'"}
    b0 = [d for d in doc["rdma"]["devices"] if d["name"] == "rxe_b0"][0]
    assert "AttributeError" in b0["ports"][0]["active_mtu_source"]


def test_pyverbs_attributes_hostinfo_reads_exist():
    d = pytest.importorskip("pyverbs.device")
    for cls, attr in ((d.DeviceAttr, "fw_version"), (d.DeviceAttr, "phys_port_cnt"),
                      (d.PortAttr, "active_mtu")):
        assert hasattr(cls, attr), f"{cls.__name__}.{attr}"
