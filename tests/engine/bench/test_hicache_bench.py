"""``python -m peercache.bench.hicache_drive drive``: drive's loop through PeerCacheStore.batch_get_v1,
against a real serve process."""
import json
import subprocess
import sys

import pytest

from conftest import BENCH
from peercache.bench.serve import READY_LINE

HC = [sys.executable, "-m", "peercache.bench.hicache_drive"]


@pytest.mark.parametrize("layout", ["mla", "mha"])
def test_hicache_drive_reads_serves_pages_verified(procs, port, tmp_path, layout):
    addr = f"127.0.0.1:{port}"
    common = ["--discovery-addr", addr, "--protocol", "shm", "--layout", layout, "--page-size", "16384",
              "--working-set", "64"]
    serve = procs.start([*BENCH, "serve", *common, "--readers", "1"])
    procs.wait_line(serve, READY_LINE)
    out = tmp_path / "hc.json"
    r = subprocess.run([*HC, "drive", *common, "--batch-size", "16", "--concurrencies", "1,2",
                        "--dir-cache-ttl", "10", "--duration", "1", "--warmup", "0.3", "--out", str(out),
                        "--ready-timeout", "10"], capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert doc["status"] == "ok" and doc["mode"] == "hicache-drive" and "batch_get_v1" in doc["meta"]["read_path"]
    for p in doc["points"]:
        assert p["verified"] and p["hit_rate"] == 1.0 and p["errors"] == 0 and p["verify_failures"] == 0
        assert p["keys"] > 0 and p["gb_per_s"] > 0
    assert serve.wait(timeout=10) == 0    # hicache_drive told serve it was done, as drive does


def test_hicache_drive_refuses_gpu(port):
    addr = f"127.0.0.1:{port}"
    common = ["--discovery-addr", addr, "--protocol", "shm", "--page-size", "16384", "--working-set", "16"]
    r = subprocess.run([*HC, "drive", *common, "--batch-size", "4", "--duration", "0.5", "--warmup", "0",
                        "--gpu", "--ready-timeout", "5"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "host KV pool" in r.stderr and "drop --gpu" in r.stderr
