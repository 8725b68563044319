"""serve and drive over --protocol shm as real processes, verification on."""
import json
import subprocess

from conftest import BENCH
from peercache.bench.serve import READY_LINE

SMALL = ["--working-set", "64", "--page-size", "16384", "--protocol", "shm"]


def test_shm_serve_drive_verified(procs, port, tmp_path):
    addr = f"127.0.0.1:{port}"
    serve = procs.start([*BENCH, "serve", "--discovery-addr", addr, *SMALL, "--readers", "1",
                         "--layout", "mha"])
    procs.wait_line(serve, READY_LINE)
    out = tmp_path / "drive.json"
    r = subprocess.run([*BENCH, "drive", "--discovery-addr", addr, *SMALL, "--layout", "mha",
                        "--batch-size", "8", "--concurrencies", "1,2", "--dir-cache-ttl", "10",
                        "--duration", "1", "--warmup", "0.3", "--out", str(out), "--ready-timeout", "10"],
                       capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert doc["status"] == "ok" and doc["meta"]["protocol"] == "shm"
    for p in doc["points"]:
        assert p["verified"] and p["hit_rate"] == 1.0 and p["errors"] == 0 and p["verify_failures"] == 0
        assert p["keys"] > 0
    assert serve.wait(timeout=10) == 0
