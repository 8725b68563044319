"""rdma on a real device: a NIC, or the Soft-RoCE guest of `make test-rdma`.

Run wherever ibv_get_device_list finds a device with an active port; skipped
otherwise with the reason (for example "no RDMA device: ibv_get_device_list
returned 0 devices (Function not implemented)"). In the guest the producer
and the consumer use the devices on the two ends of each veth pair, so every
READ crosses a link, and a missing device fails instead of skipping.
"""
from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest

from conftest import BENCH, free_port, rdma_sides, scaled
from peercache import tags
from peercache.bench.serve import READY_LINE
from peercache.node import Get, Node
from peercache.transport.base import OP_DTYPE, Status

pytestmark = pytest.mark.rdma

SMALL = ["--working-set", "64", "--page-size", "16384"]


def _flags(devs: list[str]) -> list[str]:
    return ["--device-name", devs[0]] if len(devs) == 1 else ["--devices", ",".join(devs)]


def _serve_drive(procs, tmp_path, prod: list[str], cons: list[str], extra: list[str] = ()):
    addr = f"127.0.0.1:{free_port()}"
    serve = procs.start([*BENCH, "serve", "--protocol", "rdma", *_flags(prod), "--discovery-addr", addr, *SMALL,
                         "--readers", "1"])
    procs.wait_line(serve, READY_LINE, timeout=30)
    out = tmp_path / "drive.json"
    r = subprocess.run([*BENCH, "drive", "--protocol", "rdma", *_flags(cons), "--discovery-addr", addr, *SMALL,
                        "--batch-size", "8", "--duration", "1", "--warmup", "0.3",
                        "--ready-timeout", f"{scaled(10):.0f}", "--out", str(out), *extra],
                       capture_output=True, text=True, timeout=scaled(120))
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert serve.wait(timeout=scaled(15)) == 0
    return doc


def test_serve_drive_over_rdma_verified(procs, tmp_path):
    prod, cons = rdma_sides()
    doc = _serve_drive(procs, tmp_path, prod[:1], cons[:1], ["--concurrencies", "1,2", "--max-channels", "2"])
    assert doc["status"] == "ok" and doc["meta"]["protocol"] == "rdma" and doc["meta"]["devices"] == cons[:1]
    for p in doc["points"]:
        assert p["verified"] and p["hit_rate"] == 1.0 and p["errors"] == 0 and p["verify_failures"] == 0


def test_multi_rail_in_one_process(procs, tmp_path):
    prod, cons = rdma_sides()
    if len(prod) < 2 or len(cons) < 2:
        pytest.skip(f"multi-rail needs 2 RDMA devices per side; this host has {', '.join(cons)} "
                    "(Soft-RoCE: add a second rxe link on another netdev)")
    doc = _serve_drive(procs, tmp_path, prod[:2], cons[:2], ["--concurrencies", "2", "--max-channels", "2"])
    assert doc["status"] == "ok" and doc["meta"]["devices"] == cons[:2]
    assert doc["points"][0]["hit_rate"] == 1.0 and doc["points"][0]["verify_failures"] == 0


@pytest.fixture
def pair():
    prod_devs, cons_devs = rdma_sides()
    addr = f"127.0.0.1:{free_port()}"
    prod = Node(addr, protocol="rdma", host_discovery=True, pool_slots=64, slot_capacity=8192,
                name="prod", transport_options={"devices": prod_devs[:1]})
    cons = None
    try:
        cons = Node(addr, protocol="rdma", name="cons", transport_options={"devices": cons_devs[:1]},
                    max_channels=2)
        yield prod, cons
    finally:
        if cons is not None:
            cons.close()
        prod.close()


def test_partial_full_and_empty_slots_read_back_exactly(pair):
    prod, cons = pair
    rng = np.random.default_rng(3)
    sizes = [0, 1, 31, 8192, 4000, 8191, 8192, 17]
    keys = [f"k{i}".encode() for i in range(len(sizes))]
    vals = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in sizes]
    prod.put_batch(keys, vals)
    dest = np.zeros(len(keys) * 8192, dtype=np.uint8)
    offs = np.arange(len(keys), dtype=np.uint64) * 8192
    r = cons.get_batch_into(keys, dest, offs)
    assert r.error is None and (r.status == Get.HIT).all()
    for i, v in enumerate(vals):
        assert bytes(dest[i * 8192: i * 8192 + len(v)]) == v and r.lengths[i] == len(v)


def test_uncached_gets_are_resolved_by_the_directory_table_over_rdma(pair):
    """Each uncached GET reads its key's bucket one-sided over rdma (into a registered buffer):
    the table answers every key, nothing goes on to the lookup RPC."""
    prod, cons = pair
    keys = [f"t{i}".encode() for i in range(40)]
    prod.put_batch(keys, [bytes([i]) * 3000 for i in range(len(keys))])
    dest = np.zeros(len(keys) * 4096, dtype=np.uint8)
    for i, k in enumerate(keys[:8]):                      # one key at a time: the latency path
        r = cons.get_batch_into([k], dest, np.zeros(1, np.uint64))
        assert r.error is None and r.hits == 1 and bytes(dest[:3000]) == bytes([i]) * 3000
    r = cons.get_batch_into(keys, dest, np.arange(len(keys), dtype=np.uint64) * 4096)   # a batch
    assert r.error is None and (r.status == Get.HIT).all()
    assert cons.table_resolved >= 8 + len(keys) and cons.table_forwarded == 0, \
        (cons.table_resolved, cons.table_forwarded)


def test_bad_remote_key_is_reported_per_op_then_reconnects(pair):
    prod, cons = pair
    keys = [b"a", b"b", b"c"]
    prod.put_batch(keys, [b"x" * 8192, b"y" * 100, b"z" * 5000])
    locs = cons.lookup(keys)
    info = cons.peer_infos.data_endpoint(prod.node_id)
    peer = cons.transport._connect(prod.node_id, info, rkey_xor=0x5A5A5A)
    ops = np.zeros(len(keys), dtype=OP_DTYPE)
    for i, l in enumerate(locs):
        ops[i] = (l.region, 1, l.rkey, l.offset + tags.HEADER_BYTES, l.length, i * 8192)
    dest = np.zeros(3 * 8192, dtype=np.uint8)
    cons.transport.prepare_local(dest)
    status = np.zeros(len(ops), dtype=np.int32)
    err = peer.read_batch(ops, [np.zeros(64, np.uint8), dest], status)
    assert err and "remote access error" in err.lower(), err
    assert status[0] == Status.BAD_REGION
    assert set(status.tolist()) <= {Status.BAD_REGION, Status.CONNECTION}
    assert not peer.alive()                      # the channel must be reset before reuse
    status[:] = 0
    assert peer.read_batch(ops, [np.zeros(64, np.uint8), dest], status)    # refused fast, never hangs
    assert (status == Status.CONNECTION).all()
    # That connection took the producer's place for this node's id, so the node's own QPs are
    # orphaned. The next batch finds them dead: its table read waits out rdma's completion bound
    # (timeout_s, 5 s), which can be the whole of the call's 5 s; what it could not read in time is
    # an error that says so, never a miss. The dead connection is replaced before the batch after,
    # which reads every key.
    offsets = np.arange(3, dtype=np.uint64) * 8192
    r = cons.get_batch_into(keys, dest, offsets)
    if not (r.status == Get.HIT).all():
        assert (r.status != Get.MISS).all() and "timed out" in r.error, (r.status, r.error)
        r = cons.get_batch_into(keys, dest, offsets)
    assert (r.status == Get.HIT).all() and bytes(dest[:8192]) == b"x" * 8192, (r.status, r.error)


def test_producer_gone_is_an_error_not_a_hang(pair):
    prod, cons = pair
    prod.put_batch([b"p"], [b"q" * 4096])
    dest = np.zeros(4096, dtype=np.uint8)
    assert cons.get_batch_into([b"p"], dest, [0]).status[0] == Get.HIT
    prod.transport.close()     # the producer's QPs are destroyed: READs now time out / retry-exceed
    r = cons.get_batch_into([b"p"], dest, [0])
    assert r.status[0] == Get.ERROR and r.error
