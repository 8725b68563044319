"""The cluster scenario over rxe: three hosts on one bridge in the Soft-RoCE guest, each with its own rxe device
(experiments/testbeds/softroce-cluster.yaml; the guest builds them with --cluster-hosts 3, as `make test-rdma`
does). Incast and fan-out, every page verified, RDMA READs between the hosts' devices; beside each, the raw
pattern: one ib_read_bw pair per link, each side on its own host's device, summed over one window."""
import json
from pathlib import Path

import pytest
from cluster_testbeds import guest_hosts

from peercache.lab.pipeline import experiments, runpoint
from peercache.lab.pipeline.points import cluster

ROOT = Path(__file__).resolve().parents[3]
TESTBED = ROOT / "experiments/testbeds/softroce-cluster.yaml"
pytestmark = pytest.mark.rdma


@pytest.mark.parametrize("pattern", ["incast", "fanout"])
def test_three_soft_roce_hosts_read_each_others_pages_over_rxe_verified(tmp_path, pattern):
    tb = experiments.load_testbed(TESTBED, experiments.load_scenarios())
    assert [(h.devices[0], h.address) for h in tb.cluster] == guest_hosts()[:3]
    part = {"kind": "cluster", "protocol": "rdma", "pattern": [pattern], "hosts": [3], "working_set": 64,
            "batch_size": 8, "duration": 2, "warmup": 0.5}
    pt, = experiments.expand_part("cluster", "patterns", part, [])
    with runpoint.testbed_hosts(tb) as th:
        rows = runpoint.run_point(tb, pt, 0, tmp_path / "result.json", hosts=th, quiet=True)
    failed = [f"{r.tool} {r.metric}: {r.reason}" for r in rows if r.status == "failed"]
    assert not failed, failed
    pl = cluster.place(pattern, [(h.name, h.roles) for h in tb.cluster], 3)
    agg = next(r for r in rows if (r.tool, r.metric, r.side) == ("peercache-bench", "get_throughput", "aggregate"))
    assert agg.value > 0 and agg.extra["verified"] and agg.protocol == "rdma"
    assert next(r for r in rows if r.metric == "verify_failures" and r.side == "aggregate").value == 0
    per = [r for r in rows if (r.metric, r.side) == ("get_throughput", "per_host")]
    assert sorted(r.devices for r in per) == sorted(pl.consumers) and all(r.value > 0 for r in per)
    raw = next(r for r in rows if (r.tool, r.metric, r.side) == ("ib_read_bw", "bw", "aggregate"))
    raw_per = [r for r in rows if (r.tool, r.metric, r.side) == ("ib_read_bw", "bw", "per_host")]
    assert raw.status == "ok" and raw.value > 0 and raw.protocol == "rdma" and raw.extra["flows"] == 2, raw
    assert sorted(r.devices for r in raw_per) == sorted(pl.consumers) and all(r.value > 0 for r in raw_per)
    print(f"{pattern} over rxe, 3 hosts: aggregate {agg.value:.4f} GB/s; per host "
          + ", ".join(f"{r.devices} {r.value:.4f}" for r in per) + "; 0 wrong pages; raw (ib_read_bw pairs) "
          f"{raw.value / 1e9:.4f} GB/s, per host " + ", ".join(f"{r.devices} {r.value / 1e9:.4f}" for r in raw_per)
          + f"; skew start {raw.extra['start_skew_s']:.3f} s, end {raw.extra['end_skew_s']:.3f} s")
    # each pair's sides ran on their own hosts' devices, the client connecting to its producer's address
    meta = json.loads((tmp_path / "result.json").read_text())["meta"]
    devs = {h.name: h.devices[0] for h in tb.cluster}
    for i, (prod, cons) in enumerate(pl.flows):
        server, client = (meta["commands"][f"raw{i}_{prod}_to_{cons}/{side}"] for side in ("server", "client"))
        assert devs[prod] in server and devs[cons] in client
        assert client[-1] == dict((h.name, h.address) for h in tb.cluster)[prod]
    print("notes: " + " | ".join(n for n in meta["params"]["notes"] if "raw pattern" in n))
    # each consumer read over its own host's rxe device: drive's rails name it
    for c in pl.consumers:
        doc = json.loads((tmp_path / c / "drive.json").read_text())
        rails = [r["rail"] for r in doc["points"][0]["rails"]]
        assert rails == [dict((h.name, h.devices[0]) for h in tb.cluster)[c]], (c, rails)
