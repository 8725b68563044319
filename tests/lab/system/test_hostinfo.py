"""Testbed capture against the 8 x ConnectX-7 fixture tree and on this machine."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from peercache.lab.system import hostinfo as hi
from peercache.sysfs import proc_path, read_attr, sysfs_path, using_root

CX7 = Path(__file__).resolve().parents[2] / "fixtures" / "lab" / "hosts" / "cx7-8bond"


@pytest.fixture(scope="module")
def cx7() -> dict:
    return hi.capture(CX7)


def test_sysroot_paths_resolve_under_root():
    assert sysfs_path("class", "infiniband", root=CX7) == CX7 / "sys" / "class" / "infiniband"
    assert proc_path("meminfo", root="/") == Path("/proc/meminfo")
    with using_root(CX7):
        p = sysfs_path("class", "infiniband", "mlx5_bond_1", "ports", 1, "counters", "port_rcv_data")
        assert read_attr(p) == ("1234567890123", None)
    assert sysfs_path("x") == Path("/sys/x")
    text, why = read_attr(CX7 / "sys" / "nope")
    assert text is None and "does not exist" in why


def test_eight_bonded_cx7_ports(cx7):
    devs = cx7["rdma"]["devices"]
    assert [d["name"] for d in devs] == [f"mlx5_bond_{i}" for i in range(1, 9)]
    for i, d in enumerate(devs, 1):
        assert d["board_id"] == "MT_0000000834" and d["fw_ver"] == "28.39.1002"
        assert d["numa_node"] == (0 if i <= 4 else 1)
        [p] = d["ports"]
        assert p["state"] == "4: ACTIVE" and p["link_layer"] == "Ethernet"
        assert p["rate"]["gbps"] == 400.0 and p["rate"]["width"] == 4
        assert p["rate"]["lane_gbps"] == 100.0 and p["rate"]["speed"] == "NDR"
        assert p["roce_v2_ipv4_gid_index"] == 3
        assert p["gids"][3]["ipv4"] == f"10.0.1.{i}" and len(p["gids"]) == 4  # zero slot skipped
        assert p["netdev"] == f"bond{i}" and p["bond_members"] == [f"ens{i}f0np0", f"ens{i}f1np1"]
        assert p["active_mtu"] == 4096 and "iboe_get_mtu" in p["active_mtu_source"]
        assert p["counters_present"]
    assert cx7["rdma"]["pyverbs"]["used"] is False  # fixture: live sources not used


def test_cpu_numa_memory_software(cx7):
    assert cx7["cpu"] == {"threads": 384, "model": "AMD EPYC 9K84 96-Core Processor",
                          "sockets": 2, "cores": 192}
    nodes = cx7["numa"]["nodes"]
    assert [n["distances"] for n in nodes] == [[10, 32], [32, 10]]
    assert [n["cpu_count"] for n in nodes] == [192, 192]
    assert cx7["memory"]["total_bytes"] == 2 * 1188366336 * 1024
    sw = cx7["software"]
    assert sw["mlnx_ofed"] == "MLNX_OFED_LINUX-5.8-2.0.3.0" and sw["glibc"] == "2.35"
    assert sw["perftest"] == "6.06"
    gpus = cx7["gpu"]["devices"]
    assert len(gpus) == 8 and gpus[0]["pcie_link_gen_current"] == 5
    assert cx7["tools"]["numactl"]["usable"] is True
    assert cx7["host"]["kernel"] == "5.4.241-1-tlinux4-0017.7"


def test_summary(cx7):
    s = hi.summary(cx7)
    assert s["host"] == "cx7-host-a" and s["sockets"] == 2 and s["numa_nodes"] == 2
    assert {n["name"]: n["numa_node"] for n in s["nics"]} == {
        f"mlx5_bond_{i}": (0 if i <= 4 else 1) for i in range(1, 9)}
    assert {n["rate_gbps"] for n in s["nics"]} == {400.0}
    json.dumps(s)


def test_missing_files_give_null_with_reason(tmp_path):
    root = tmp_path / "host"
    shutil.copytree(CX7, root)
    (root / "sys/class/infiniband/mlx5_bond_2/fw_ver").unlink()
    (root / "sys/class/infiniband/mlx5_bond_3/device/numa_node").write_text("-1\n")
    (root / "sys/class/infiniband/mlx5_bond_4/ports/1/rate").write_text("weird\n")
    (root / "proc/cpuinfo").unlink()
    (root / "commands.json").unlink()
    doc = hi.capture(root)
    d = {x["name"]: x for x in doc["rdma"]["devices"]}
    assert d["mlx5_bond_2"]["fw_ver"] is None and "fw_ver" in d["mlx5_bond_2"]["_missing"]
    assert d["mlx5_bond_3"]["numa_node"] is None and "-1" in d["mlx5_bond_3"]["_missing"]["numa_node"]
    rate = d["mlx5_bond_4"]["ports"][0]["rate"]
    assert rate["gbps"] is None and "unrecognised" in rate["_missing"]["gbps"]
    assert doc["cpu"]["model"] is None and "cpuinfo" in doc["cpu"]["_missing"]["model"]
    assert doc["software"]["perftest"] is None and doc["software"]["_missing"]["perftest"]
    assert doc["gpu"]["devices"] is None and "nvidia-smi" in doc["gpu"]["_missing"]["devices"]


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


def test_every_null_has_a_reason(cx7):
    _nulls_have_reasons(cx7)


def test_capture_on_this_machine():
    doc = hi.capture("/")
    json.dumps(doc)  # a valid JSON document
    assert doc["live"] is True and doc["schema_version"] == hi.SCHEMA_VERSION
    assert doc["host"]["kernel"] and doc["cpu"]["threads"] >= 1
    assert doc["memory"]["total_bytes"] > 0
    _nulls_have_reasons(doc)
    if not Path("/sys/class/infiniband").is_dir():
        assert doc["rdma"]["devices"] == [] and "no RDMA" in doc["rdma"]["note"]
    s = hi.summary(doc)
    assert s["kernel"] == doc["host"]["kernel"]


def test_pcie_link_of_each_rdma_device_from_sysfs():
    pcie_link = hi.pcie_link
    assert pcie_link("32.0 GT/s PCIe", "16") == {"gen": 5, "width": 16, "gt_per_s": 32.0, "GBps": 63.015}
    assert pcie_link("16.0 GT/s PCIe", "8", "32.0 GT/s PCIe", "16")["degraded"] is True
    assert pcie_link("8.0 GT/s PCIe", "16")["GBps"] == 15.754
    with pytest.raises(ValueError, match="unknown speed or width"):
        pcie_link("3.0 GT/s PCIe", "16")
    doc = hi.capture(CX7)
    devs = {d["name"]: d for d in doc["rdma"]["devices"]}
    assert devs["mlx5_bond_1"]["pcie"]["GBps"] == 63.015 and devs["mlx5_bond_1"]["pcie"]["degraded"] is False
    assert devs["mlx5_bond_8"]["pcie"]["width"] == 8 and devs["mlx5_bond_8"]["pcie"]["degraded"] is True
    nics = {n["name"]: n for n in hi.summary(doc)["nics"]}
    assert nics["mlx5_bond_8"]["pcie"]["GBps"] == 31.508


RXE2 = CX7.parent / "rxe-virtio-2numa"   # reconstructed: see its README.md


def test_pci_rdma_device_numa_source(cx7):
    assert {d["numa_source"] for d in cx7["rdma"]["devices"]} == {"rdma device"}
    assert {n["numa_source"] for n in hi.summary(cx7)["nics"]} == {"rdma device"}


def test_rxe_on_virtio_numa_node_from_its_netdevs_pci_function():
    doc = hi.capture(RXE2)
    devs = {d["name"]: d for d in doc["rdma"]["devices"]}
    assert sorted(devs) == ["rxe0", "rxe1"]
    for name, node, netdev, fn in (("rxe0", 0, "eth1", "0000:11:00.0"), ("rxe1", 1, "eth2", "0000:21:00.0")):
        d = devs[name]
        # rxe has no device link; its parent file names the netdev, whose virtio device has no
        # numa_node: the PCI function above it answers, and the source says all of that.
        assert d["numa_node"] == node
        assert d["numa_source"] == f"netdev {netdev} (rxe parent), its parent PCI function {fn}"
        assert d["ports"][0]["netdev"] == netdev
    assert [(n["node"], n["cpulist"]) for n in doc["numa"]["nodes"]] == [(0, "0-1"), (1, "2-3")]
    assert {n["name"]: n["numa_node"] for n in hi.summary(doc)["nics"]} == {"rxe0": 0, "rxe1": 1}
    _nulls_have_reasons(doc)


def test_rxe_without_parent_file_uses_the_gid_table_netdev(tmp_path):
    root = tmp_path / "host"
    shutil.copytree(RXE2, root, symlinks=True)
    (root / "sys/devices/virtual/infiniband/rxe1/parent").unlink()
    d = {x["name"]: x for x in hi.capture(root)["rdma"]["devices"]}
    assert d["rxe1"]["numa_node"] == 1 and d["rxe1"]["numa_source"].startswith("netdev eth2 (GID table)")


def test_rxe_numa_minus_one_and_missing_give_null_with_reason(tmp_path):
    root = tmp_path / "host"
    shutil.copytree(RXE2, root, symlinks=True)
    (root / "sys/devices/pci0000:10/0000:10:00.0/0000:11:00.0/numa_node").write_text("-1\n")
    (root / "sys/devices/pci0000:20/0000:20:00.0/0000:21:00.0/numa_node").unlink()
    (root / "sys/devices/pci0000:20/0000:20:00.0/numa_node").unlink()
    d = {x["name"]: x for x in hi.capture(root)["rdma"]["devices"]}
    r0, r1 = d["rxe0"], d["rxe1"]
    assert r0["numa_node"] is None and "-1" in r0["_missing"]["numa_node"]
    assert "eth1" in r0["_missing"]["numa_node"] and "eth1" in r0["numa_source"]
    assert r1["numa_node"] is None and "nor in any parent device" in r1["_missing"]["numa_node"]


def test_virtio_netdev_numa_on_this_machine():
    # This machine's own netdevs, read the same way (a virtio NIC's node sits on its PCI function).
    for nd in sorted(Path("/sys/class/net").iterdir()) if Path("/sys/class/net").is_dir() else []:
        if not (nd / "device").exists():
            continue
        ctx = hi._Ctx(root=Path("/"), runner=hi.ReplayRunner(None), live=True)
        text, via, why = hi._device_numa(ctx, sysfs_path("class", "net", nd.name, "device"))
        assert text is not None, why
        assert text == "-1" or text.isdigit()
        return
    pytest.skip("no netdev with a device on this machine")
