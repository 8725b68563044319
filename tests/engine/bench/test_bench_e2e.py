"""serve and drive as real processes: loopback, two network namespaces, faults."""
import json
import os
import signal
import subprocess
import time

import pytest

from conftest import BENCH, free_port
from peercache.bench.serve import READY_LINE
from peercache.lab.launch import netns
from peercache.transport.tcp import batch_wire

SMALL = ["--working-set", "64", "--page-size", "16384"]


def drive_argv(addr, out, *extra):
    return [*BENCH, "drive", "--discovery-addr", addr, *SMALL, "--batch-size", "8",
            "--duration", "1", "--warmup", "0.3", "--out", str(out), "--ready-timeout", "10", *extra]


def test_loopback_serve_drive_verified_full_hit_rate(procs, port, tmp_path):
    addr = f"127.0.0.1:{port}"
    serve = procs.start([*BENCH, "serve", "--discovery-addr", addr, *SMALL, "--readers", "1",
                         "--layout", "mha"])
    procs.wait_line(serve, READY_LINE)
    out = tmp_path / "drive.json"
    r = subprocess.run(drive_argv(addr, out, "--layout", "mha", "--concurrencies", "1,2",
                                  "--processes", "2"), capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert doc["schema_version"] == 1 and doc["status"] == "ok"
    m = doc["meta"]
    for k in ("host", "kernel", "cpu", "protocol", "layout", "page_size", "batch_size", "processes",
              "versions", "git_revision", "command", "start", "end"):
        assert k in m, k
    assert m["layout"] == "mha" and m["processes"] == 2 and "drive" in m["command"]
    # how the tcp client moved each batch (8 pages of 2 objects of 16 KiB): what a raw limit must match
    assert m["tcp_wire"] == batch_wire(16384, 16)
    assert [p["threads"] for p in doc["points"]] == [2, 4]
    for p in doc["points"]:
        assert p["verified"] and p["hit_rate"] == 1.0 and p["errors"] == 0
        assert p["gb_per_s"] > 0 and p["bytes"] == p["objects_per_s"] * p["duration_s"] * 16384
        assert p["latency_us"]["p50"] <= p["latency_us"]["p99"] <= p["latency_us"]["p999"]
        assert abs(p["window_end"] - p["window_start"] - 1.0) < 1e-3
    assert "GB/s" in r.stdout and "100.00" in r.stdout           # the console table
    assert "drive: point" in r.stderr                             # progress
    assert serve.wait(timeout=10) == 0                            # serve exits once its reader is done


def test_start_at_sets_the_shared_window_and_refuses_the_past(procs, port, tmp_path):
    addr = f"127.0.0.1:{port}"
    serve = procs.start([*BENCH, "serve", "--discovery-addr", addr, *SMALL, "--readers", "2"])
    procs.wait_line(serve, READY_LINE)
    start = time.time() + 8
    out = tmp_path / "d.json"
    r = subprocess.run(drive_argv(addr, out, "--start-at", f"{start:.3f}"), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert abs(json.loads(out.read_text())["points"][0]["window_start"] - (start + 0.3)) < 1e-3
    r = subprocess.run(drive_argv(addr, out, "--start-at", f"{time.time() - 5:.3f}"),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "give a later start time" in r.stderr


def test_start_file_holds_drive_until_a_runner_writes_the_start_time(procs, port, tmp_path):
    """--start-file: drive gets ready, says so, and waits for the epoch a runner writes into the file once
    every driver is ready; its window starts there. A file that never comes, or holds no number, fails."""
    addr = f"127.0.0.1:{port}"
    serve = procs.start([*BENCH, "serve", "--discovery-addr", addr, *SMALL, "--readers", "3"])
    procs.wait_line(serve, READY_LINE)
    start_file, out = tmp_path / "start", tmp_path / "d.json"
    d = subprocess.Popen(drive_argv(addr, out, "--start-file", str(start_file)), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
    procs.procs.append(d)
    procs.wait_line(d, "process(es) ready against", timeout=60)
    time.sleep(1.0)
    assert d.poll() is None and not out.exists()                  # held: nothing measured yet
    start = time.time() + 2
    (tmp_path / "start.tmp").write_text(f"{start:.6f}\n")
    (tmp_path / "start.tmp").rename(start_file)
    assert d.wait(timeout=60) == 0
    assert abs(json.loads(out.read_text())["points"][0]["window_start"] - (start + 0.3)) < 1e-3
    r = subprocess.run(drive_argv(addr, out, "--start-file", str(tmp_path / "never"), "--ready-timeout", "2"),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "never released it" in r.stderr, r.stderr
    start_file.write_text("soon")
    r = subprocess.run(drive_argv(addr, out, "--start-file", str(start_file)), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1 and "not an epoch in seconds" in r.stderr, r.stderr


def test_exists_op_reports_rate_not_bandwidth(procs, port, tmp_path):
    addr = f"127.0.0.1:{port}"
    serve = procs.start([*BENCH, "serve", "--discovery-addr", addr, *SMALL, "--readers", "1"])
    procs.wait_line(serve, READY_LINE)
    out = tmp_path / "d.json"
    r = subprocess.run(drive_argv(addr, out, "--op", "exists", "--dir-cache-ttl", "5"),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    p = json.loads(out.read_text())["points"][0]
    assert p["gb_per_s"] is None and p["pages_per_s"] > 0 and p["hit_rate"] == 1.0


@pytest.mark.parametrize("flags, message", [
    (["--page-size", "0"], "--page-size must be positive"),
    (["--batch-size", "4096", "--working-set", "8192", "--recv-buffer", "1048576"], "receive buffer"),
    (["--batch-size", "100", "--working-set", "10"], "larger than --working-set"),
    (["--concurrencies", "0"], "--concurrencies must all be positive"),
])
def test_invalid_flags_refused_before_start(flags, message, port):
    r = subprocess.run([*BENCH, "drive", "--discovery-addr", f"127.0.0.1:{port}", *flags],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and message in r.stderr, r.stderr


def test_unknown_layout_refused():
    r = subprocess.run([*BENCH, "serve", "--layout", "gqa"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "invalid choice: 'gqa'" in r.stderr


def test_unbuilt_protocol_or_discovery_down_is_a_clear_error(port, tmp_path):
    t = time.monotonic()
    r = subprocess.run(drive_argv(f"127.0.0.1:{port}", tmp_path / "x.json"),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert "no reply from discovery" in r.stderr
    assert time.monotonic() - t < 30


def test_producer_killed_during_drive_exits_nonzero_quickly(procs, port, tmp_path):
    addr = f"127.0.0.1:{port}"
    serve = procs.start([*BENCH, "serve", "--discovery-addr", addr, *SMALL, "--readers", "1"])
    procs.wait_line(serve, READY_LINE)
    out = tmp_path / "d.json"
    drive = procs.start(drive_argv(addr, out, "--duration", "30", "--warmup", "0"))
    time.sleep(2.5)
    os.killpg(serve.pid, signal.SIGKILL)
    t = time.monotonic()
    rc = drive.wait(timeout=30)
    assert rc == 1
    assert time.monotonic() - t < 15
    doc = json.loads(out.read_text())
    assert doc["status"] == "failed" and doc["error"]
    assert doc["points"][0]["status"] == "failed"


ok, why = netns.available()


@pytest.mark.skipif(not ok, reason=f"two-namespace test needs network namespaces: {why}")
def test_two_network_namespaces(procs, tmp_path):
    pair = netns.NetnsPair(f"pct{os.getpid() % 10000}", index=200)
    with pair:
        addr = f"{pair.addr_a}:{free_port()}"
        serve = procs.start([*pair.exec_prefix("a"), *BENCH, "serve", "--discovery-addr", addr, *SMALL,
                             "--readers", "1"])
        procs.wait_line(serve, READY_LINE)
        out = tmp_path / "d.json"
        r = subprocess.run([*pair.exec_prefix("b"), *drive_argv(addr, out)], capture_output=True,
                           text=True, timeout=90)
        assert r.returncode == 0, r.stderr
        doc = json.loads(out.read_text())
        p = doc["points"][0]
        assert p["verified"] and p["hit_rate"] == 1.0 and p["errors"] == 0 and p["bytes"] > 0
        assert doc["meta"]["discovery_addr"].startswith("198.18.200.1:")
        assert serve.wait(timeout=10) == 0


def _serve_names(addr: str) -> list[str]:
    """The names of the serve nodes the directory at ``addr`` lists now (asked by a node that stores nothing)."""
    from peercache.node import Node
    with Node(addr, name="probe") as probe:
        return sorted(i["name"] for i in probe.members().values() if i["name"] != "probe")


def test_cluster_two_serves_join_one_meta_directory_and_drive_reads_their_union(procs, port, tmp_path):
    """The lab's cluster scenario in small: `meta` hosts the directory; two `serve --join`, each publishing its
    own --key-prefix; one drive reads the union of both working sets with Zipf popularity (a batch spans both
    producers), every page verified; then SIGTERM ends each serve: it leaves the directory and exits 0."""
    addr = f"127.0.0.1:{port}"
    # a long heartbeat timeout: a serve gone from the directory right after it exits has left, not expired
    meta = procs.start([*BENCH, "meta", "--discovery-addr", addr, "--heartbeat-timeout", "120"])
    procs.wait_line(meta, "peercache-bench meta: ready")
    serves = {p: procs.start([*BENCH, "serve", "--join", "--discovery-addr", addr, *SMALL, "--readers", "0",
                              "--key-prefix", p, "--out", str(tmp_path / f"serve-{p}.json")]) for p in ("pA", "pB")}
    for p, s in serves.items():
        assert f"key_prefix={p}" in procs.wait_line(s, READY_LINE)
    assert _serve_names(addr) == ["serve", "serve"]
    out = tmp_path / "drive.json"
    r = subprocess.run(drive_argv(addr, out, "--key-prefix", "pA,pB", "--access", "zipf", "--zipf-s", "0.8"),
                       capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert doc["status"] == "ok", doc["error"]
    m = doc["meta"]
    assert (m["access"], m["zipf_s"], m["key_prefixes"], m["working_set"]) == ("zipf", 0.8, ["pA", "pB"], 64)
    p = doc["points"][0]
    assert p["verified"] and p["hit_rate"] == 1.0 and p["verify_failures"] == 0 and p["errors"] == 0
    assert p["bytes"] > 0
    # drive counts each producer's bytes by its prefix: both served some, and they add up to the whole
    assert set(p["bytes_by_prefix"]) == {"pA", "pB"} and min(p["bytes_by_prefix"].values()) > 0
    assert sum(p["bytes_by_prefix"].values()) == p["bytes"]
    for s in serves.values():
        s.send_signal(signal.SIGTERM)
    for s in serves.values():
        assert s.wait(timeout=20) == 0
    assert _serve_names(addr) == []           # both left the directory on their way out
    served = {}
    for prefix in ("pA", "pB"):
        sdoc = json.loads((tmp_path / f"serve-{prefix}.json").read_text())
        assert sdoc["meta"]["joined"] == addr and sdoc["meta"]["key_prefix"] == prefix
        assert sdoc["readers_done"] == [] and sdoc["refused_ops"] == 0
        served[prefix] = sdoc["data_server"]["served"]
    # both producers answered the drive's reads: its batches spanned both
    assert min(served.values()) > 0, served
    assert meta.poll() is None                # the directory's host outlives its members
