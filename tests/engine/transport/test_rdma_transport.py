"""rdma without hardware: device discovery rules, and --protocol rdma / --gpu failing clearly."""
from __future__ import annotations

import importlib
import subprocess
import time
from types import SimpleNamespace

import pytest

from conftest import BENCH, free_port
from peercache.errors import TransportUnavailable
from peercache.rdma import devices as D

pytestmark = pytest.mark.rdma    # also run in the Soft-RoCE guest by `make test-rdma`

ROCE_TABLE = [
    D.GidEntry(0, "fe80:0000:0000:0000:0a5c:52ff:fe10:0001", D.GID_TYPE_ROCE_V1),
    D.GidEntry(1, "fe80:0000:0000:0000:0a5c:52ff:fe10:0001", D.GID_TYPE_ROCE_V2),
    D.GidEntry(2, "0000:0000:0000:0000:0000:ffff:0a00:0005", D.GID_TYPE_ROCE_V1),
    D.GidEntry(3, "0000:0000:0000:0000:0000:ffff:0a00:0005", D.GID_TYPE_ROCE_V2),
]


def port_attr(state=D.PORT_ACTIVE, link=D.LINK_ETHERNET, mtu=5):
    return SimpleNamespace(state=state, link_layer=link, active_mtu=mtu)


def test_roce_v2_ipv4_gid_is_picked():
    assert D.pick_gid_index(ROCE_TABLE) == 3
    assert D.gid_ipv4(ROCE_TABLE[3].gid) == "10.0.0.5"
    assert D.gid_ipv4(ROCE_TABLE[1].gid) is None


def test_gid_preference_global_ipv6_over_link_local_and_none_without_v2():
    table = [D.GidEntry(1, "fe80::1", D.GID_TYPE_ROCE_V2), D.GidEntry(4, "2001:db8::7", D.GID_TYPE_ROCE_V2),
             D.GidEntry(5, "::", D.GID_TYPE_ROCE_V2)]
    assert D.pick_gid_index(table) == 4
    assert D.pick_gid_index([e for e in ROCE_TABLE if e.gid_type != D.GID_TYPE_ROCE_V2]) is None


def test_rail_spec_roce_autodetects_and_honours_gid_index():
    s = D.rail_spec("mlx5_0", 1, port_attr(), ROCE_TABLE, None, 1)
    assert (s.gid_index, s.mtu, s.numa) == (3, 4096, 1)
    assert D.rail_spec("mlx5_0", 1, port_attr(), ROCE_TABLE, 1, 1).gid_index == 1


def test_rail_spec_infiniband_uses_lid_without_grh():
    assert D.rail_spec("mlx5_0", 1, port_attr(link=D.LINK_IB), [], None, 0).gid_index == -1


@pytest.mark.parametrize("attr,gids,gid_index,message", [
    (port_attr(state=1), ROCE_TABLE, None, "port 1 of mlx5_0 is DOWN, not ACTIVE"),
    (port_attr(), ROCE_TABLE[:1], None, "no RoCE v2 GID on mlx5_0 port 1"),
    (port_attr(), ROCE_TABLE, 9, "--gid-index 9 is not populated on mlx5_0 port 1"),
])
def test_rail_spec_names_what_is_missing(attr, gids, gid_index, message):
    with pytest.raises(TransportUnavailable, match=message):
        D.rail_spec("mlx5_0", 1, attr, gids, gid_index, 0)


def test_choose_devices():
    assert D.choose([], ["mlx5_0", "mlx5_1"]) == ["mlx5_0"]
    assert D.choose(["mlx5_1", "mlx5_0"], ["mlx5_0", "mlx5_1"]) == ["mlx5_1", "mlx5_0"]
    with pytest.raises(TransportUnavailable, match="device mlx5_7 named in --devices/--device-name not found; "
                                                   "this host has mlx5_0"):
        D.choose(["mlx5_0", "mlx5_7"], ["mlx5_0"])
    with pytest.raises(TransportUnavailable, match="twice"):
        D.choose(["mlx5_0", "mlx5_0"], ["mlx5_0"])


def test_sysfs_gid_table_and_numa_from_a_fixture_tree(tmp_path):
    port = tmp_path / "sys/class/infiniband/mlx5_3/ports/1"
    (port / "gids").mkdir(parents=True)
    (port / "gid_attrs/types").mkdir(parents=True)
    for e in ROCE_TABLE:
        (port / "gids" / str(e.index)).write_text(e.gid + "\n")
        kind = {D.GID_TYPE_ROCE_V1: "IB/RoCE v1", D.GID_TYPE_ROCE_V2: "RoCE v2"}[e.gid_type]
        (port / "gid_attrs/types" / str(e.index)).write_text(kind + "\n")
    (port / "gids" / "7").write_text("0000:0000:0000:0000:0000:0000:0000:0000\n")   # unpopulated
    (tmp_path / "sys/class/infiniband/mlx5_3/device").mkdir()
    (tmp_path / "sys/class/infiniband/mlx5_3/device/numa_node").write_text("1\n")
    got = D.sysfs_gids("mlx5_3", 1, str(tmp_path))
    assert [(g.index, g.gid_type) for g in got] == [(e.index, e.gid_type) for e in ROCE_TABLE]
    assert D.pick_gid_index(got) == 3
    assert D.device_numa("mlx5_3", str(tmp_path)) == 1
    assert D.device_numa("nope", str(tmp_path)) == -1


def test_missing_pyverbs_and_missing_backend_are_named(monkeypatch):
    real = importlib.import_module

    def fake(name, *a):
        if name in ("pyverbs.device", "peercache._verbs"):
            raise ImportError(f"No module named {name!r}")
        return real(name, *a)

    monkeypatch.setattr(importlib, "import_module", fake)
    with pytest.raises(TransportUnavailable, match="no pyverbs .*python3-pyverbs.*cython<3.1"):
        D.discover(["mlx5_0"])
    with pytest.raises(TransportUnavailable, match="verbs backend .* not built: install libibverbs-dev"):
        D.load_verbs()


def test_no_device_is_named_by_discovery():
    try:
        importlib.import_module("pyverbs.device")
        names, why = importlib.import_module("peercache._verbs").devices()
    except ImportError as e:
        pytest.skip(f"pyverbs or the verbs backend is not available here ({e})")
    if names:
        pytest.skip(f"this host has RDMA devices ({', '.join(names)})")
    with pytest.raises(TransportUnavailable, match="no RDMA device: ibv_get_device_list returned 0 devices"):
        D.discover([])


def _no_rdma_device() -> str | None:
    """Why rdma cannot run here, or None when it can."""
    try:
        D.discover([])
    except TransportUnavailable as e:
        return str(e)
    return None


@pytest.mark.parametrize("mode", ["serve", "drive"])
def test_protocol_rdma_fails_fast_naming_what_is_missing(mode):
    why = _no_rdma_device()
    if why is None:
        pytest.skip("this host can run rdma; the failure path is not reachable")
    addr = f"127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    r = subprocess.run([*BENCH, mode, "--protocol", "rdma", "--discovery-addr", addr, "--working-set", "64"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stderr
    assert time.monotonic() - t0 < 20
    assert f"peercache-bench {mode}: --protocol rdma:" in r.stderr
    assert any(s in r.stderr for s in ("no RDMA device", "no pyverbs", "verbs backend"))
    assert "Traceback" not in r.stderr


def test_named_device_not_found_or_no_device(tmp_path):
    why = _no_rdma_device()
    addr = f"127.0.0.1:{free_port()}"
    r = subprocess.run([*BENCH, "drive", "--protocol", "rdma", "--devices", "nosuchdev0,nosuchdev1",
                        "--discovery-addr", addr, "--working-set", "4", "--batch-size", "2"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    if why is None:
        assert "nosuchdev0, nosuchdev1 named in --devices/--device-name not found" in r.stderr
    else:
        assert "--protocol rdma:" in r.stderr


@pytest.mark.parametrize("flags,message", [
    (["--ib-port", "0"], "--ib-port must be >= 1"),
    (["--gid-index", "-2"], "--gid-index must be >= 0"),
])
def test_rdma_flags_are_validated(flags, message):
    r = subprocess.run([*BENCH, "drive", "--protocol", "rdma", *flags], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and message in r.stderr


def test_transport_options_only_for_rdma():
    from peercache.bench import cli, options
    p = cli.build_parser()
    a = p.parse_args(["drive", "--protocol", "rdma", "--devices", "a,b", "--ib-port", "2", "--gid-index", "3"])
    assert options.transport_options(a) == {"devices": ["a", "b"], "ib_port": 2, "gid_index": 3}
    a = p.parse_args(["serve", "--device-name", "a"])
    assert options.transport_options(a) == {}


# ------------------------------------------- control plane with a stand-in verbs module (no device)
class FakeRail:
    """Stands in for peercache._verbs.Rail: registrations get distinct keys per rail."""

    count = 0

    def __init__(self, name, port, gid_index, numa):
        FakeRail.count += 1
        self.name, self.id, self.regs = name, FakeRail.count, {}

    def info(self):
        return {"name": self.name, "gid": bytes(16), "mtu": 5}

    def register(self, buf, numa=-1):
        from peercache.transport.rdma import buffer_address
        addr = buffer_address(buf)[0]
        self.regs[addr] = True
        return addr, 1, 1000 * self.id + len(self.regs), 0

    def deregister(self, addr):
        return self.regs.pop(addr, None) is not None

    def stats(self):
        """The native counters' shape (Rail.stats): a rail that went down once and came back."""
        return {"name": self.name, "state": "up", "why": "", "bytes_read": 4096 * self.id, "reads": self.id,
                "wc_errors": {12: 3, 5: 40}, "qp_resets": 2, "downs": 1, "ups": 1, "readers": 1}


class FakeChannels:
    """Stands in for peercache._verbs.Channels: records the exchange."""

    made: list = []

    def __init__(self, rails, nchan, depth, timeout):
        self.rails, self.nchan, self.remote, self.regions, self.closed = rails, nchan, None, None, False
        self.base = 100 * (len(FakeChannels.made) + 1)
        FakeChannels.made.append(self)

    def local_info(self):
        return [{"rail": r, "channel": c, "qpn": self.base + r * self.nchan + c, "psn": 7, "gid": bytes(16),
                 "lid": 0, "mtu": 5, "rd_atom": 16} for r in range(len(self.rails)) for c in range(self.nchan)]

    def connect(self, remote, *limits):
        self.remote = remote

    def set_regions(self, regions):
        self.regions = regions

    def handoff(self):
        return self

    def alive(self):
        return not self.closed

    def close(self):
        self.closed = True


@pytest.fixture
def fake_verbs(monkeypatch):
    fake = SimpleNamespace(Rail=FakeRail, Channels=FakeChannels, MAX_RAILS=16, MAX_CHANNELS=64)
    FakeChannels.made = []
    monkeypatch.setattr(D, "load_verbs", lambda: fake)
    monkeypatch.setattr(D, "discover", lambda names, port=1, gid=None, root="/sys": [
        D.RailSpec(n, port, 3, i % 2, D.LINK_ETHERNET, 4096) for i, n in enumerate(names or ["dev0"])])
    return fake


def test_qp_exchange_through_the_producers_control_endpoint(fake_verbs):
    from peercache.node import Node
    from peercache.transport.rdma import RdmaTransport
    addr = f"127.0.0.1:{free_port()}"
    prod = Node(addr, protocol="rdma", host_discovery=True, pool_slots=8, slot_capacity=4096, name="prod",
                transport_options={"devices": ["p0", "p1"]})
    cons = RdmaTransport(max_channels=3, devices=["c0"])
    try:
        info = prod.info["data"]
        assert info["host"] == "127.0.0.1" and info["control_port"] == prod.control.port
        assert [r["device"] for r in info["rails"]] == ["p0", "p1"]
        # The pool, and the directory table of the node hosting discovery (read one-sided too).
        regions = {r[0]: r for r in info["regions"]}
        assert sorted(regions) == [1, 2] and regions[2][1] == prod.meta.directory.table.rkey
        rid, cap, size, keys = regions[1]
        assert rid == 1 and cap == prod.pool.rkey and size == prod.pool.size
        assert len(keys) == 2 and keys[0][1] != keys[1][1]            # one rkey per rail
        cons._native = SimpleNamespace(adopt=lambda capsule: capsule)
        mine = cons._connect(prod.node_id, info)
        theirs = prod.transport._accepted[f"{cons.id}/{prod.node_id}"]
        # Consumer rail 0 pairs with producer rail 0; three channels each, QPs crossed over.
        assert [r.name for r in theirs.rails] == ["p0"] and theirs.nchan == 3
        assert theirs.remote == mine.local_info() and mine.remote == theirs.local_info()
        mine_regions = {r[0]: r for r in mine.regions}
        assert sorted(mine_regions) == [1, 2] and mine_regions[1] == (1, cap, size, [tuple(keys[0])])
        bad = cons._connect(prod.node_id, info, rkey_xor=0xFF)       # fault injection replaces it
        assert {r[0]: r for r in bad.regions}[1][3][0][1] == keys[0][1] ^ 0xFF
        assert theirs.closed and prod.transport._accepted[f"{cons.id}/{prod.node_id}"] is not theirs
        cons.handles._handles[prod.node_id] = bad
        cons.close()                                                   # tells the producer to drop its QPs
        assert f"{cons.id}/{prod.node_id}" not in prod.transport._accepted
    finally:
        cons.close()
        prod.close()


def test_rail_stats_have_the_agreed_keys_and_outlive_close(fake_verbs):
    """rail_stats() is what the metrics and drive read: one dict per rail with exactly these keys,
    completion errors by IBV_WC_* name; after close() the figures it closed with."""
    from peercache.transport.rdma import RdmaTransport
    t = RdmaTransport(devices=["rxe_b0", "rxe_b1"])
    stats = t.rail_stats()
    assert [s["rail"] for s in stats] == ["rxe_b0", "rxe_b1"]
    for s in stats:
        assert set(s) == {"rail", "state", "bytes_read", "reads", "completion_errors", "qp_resets", "downs", "ups"}
        assert s["state"] == "up" and s["downs"] == s["ups"] == 1 and s["qp_resets"] == 2
        assert s["completion_errors"] == {"IBV_WC_WR_FLUSH_ERR": 40, "IBV_WC_RETRY_EXC_ERR": 3}
    t.close()
    assert t.rail_stats() == stats


def test_connect_refusal_names_the_peer(fake_verbs):
    from peercache.errors import TransportError
    from peercache.transport.rdma import RdmaTransport
    cons = RdmaTransport(devices=["c0"])
    try:
        with pytest.raises(TransportError, match="lacks its control endpoint"):
            cons._connect("n1", {"host": "127.0.0.1"})
        with pytest.raises(TransportError, match=r"rdma connection to n1 at 127.0.0.1:\d+ failed: no reply"):
            cons.connect_timeout = 0.3
            cons._connect("n1", {"host": "127.0.0.1", "control_port": free_port()})
    finally:
        cons.close()


def test_with_a_secret_the_qp_exchange_needs_it(fake_verbs):
    """The producer's control endpoint is a CURVE server: no QPs and no region keys without the secret."""
    from peercache.auth import Credentials
    from peercache.errors import TransportError
    from peercache.node import Node
    from peercache.transport.rdma import RdmaTransport
    secret = b"correct horse battery staple 42"
    addr = f"127.0.0.1:{free_port()}"
    prod = Node(addr, protocol="rdma", host_discovery=True, pool_slots=8, slot_capacity=4096, name="prod",
                transport_options={"devices": ["p0"]}, auth_key=secret)
    outsider, member = RdmaTransport(devices=["c0"]), RdmaTransport(devices=["c0"])
    member.use_credentials(Credentials.of(secret))
    try:
        info = prod.info["data"]
        outsider.connect_timeout = 1.0
        with pytest.raises(TransportError, match="rdma connection to prod at .* failed: no answer .*"
                                                 "wrong or missing auth key"):
            outsider._connect("prod", info)
        assert not prod.transport._accepted, "the producer made QPs for a client without the secret"
        member._native = SimpleNamespace(adopt=lambda capsule: capsule)
        mine = member._connect("prod", info)
        assert mine.regions[0][1] == prod.pool.rkey and len(prod.transport._accepted) == 1
        member.handles._handles["prod"] = mine
        member.close()                                  # the disconnect is authenticated too
        assert not prod.transport._accepted
    finally:
        outsider.close()
        member.close()
        prod.close()
