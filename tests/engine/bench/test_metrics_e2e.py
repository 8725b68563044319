"""--metrics-addr on real processes: serve and drive over tcp on loopback scraped while they run, meta,
the warning beyond loopback and the refused addresses; the HiCache store's metrics_addr."""
import json
import signal
import subprocess
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import BENCH, free_port, scaled
from hicache_fixtures import NumpyHostPool, cluster, indices, make_store
from peercache.bench.serve import READY_LINE
from peercache.errors import ConfigError

PAGE, WS, BATCH = 16384, 128, 8
SMALL = ["--working-set", str(WS), "--page-size", str(PAGE)]


def scrape(url: str) -> dict:
    """{(sample name, sorted labels): value} of one GET of ``url``."""
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def scrape_when(url: str, ready, timeout: float = 30.0) -> dict:
    """The first scrape of ``url`` for which ``ready(samples)`` holds (bounded; the endpoint may not be up yet)."""
    deadline = time.monotonic() + scaled(timeout)
    while True:
        try:
            s = scrape(url)
            if ready(s):
                return s
        except (urllib.error.URLError, ConnectionError):
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{url}: not ready within {scaled(timeout):.0f} s")
        time.sleep(0.1)


def closed(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2)
    except urllib.error.URLError:
        return True
    return False


def lookups(s: dict, tier: str, result: str) -> float:
    return s[("peercache_directory_lookups_total", (("result", result), ("tier", tier)))]


def test_serve_and_drive_export_what_they_do_and_close_their_endpoints(procs, port, tmp_path):
    addr = f"127.0.0.1:{port}"
    serve_url, drive_url = (f"http://127.0.0.1:{free_port()}/metrics" for _ in range(2))
    serve = procs.start([*BENCH, "serve", "--discovery-addr", addr, *SMALL, "--readers", "0",
                         "--metrics-addr", serve_url[7:-8]])
    out = procs.wait_line(serve, READY_LINE)
    assert f"serve: metrics at {serve_url}" in out
    doc_path = tmp_path / "drive.json"
    drive = procs.start([*BENCH, "drive", "--discovery-addr", addr, *SMALL, "--batch-size", str(BATCH),
                         "--duration", "3", "--warmup", "0.5", "--ready-timeout", "10", "--out", str(doc_path),
                         "--metrics-addr", drive_url[7:-8]])
    first = scrape_when(drive_url, lambda s: s[("peercache_get_keys_total", ())] > 0)
    time.sleep(0.5)
    second = scrape(drive_url)
    for s in (first, second):
        count, keys = s[("peercache_get_batch_duration_seconds_count", ())], s[("peercache_get_keys_total", ())]
        hits, nbytes = s[("peercache_get_hits_total", ())], s[("peercache_get_bytes_total", ())]
        # one observation per batch of BATCH keys; a record in flight may show in part (one batch at most)
        assert abs(keys - BATCH * count) <= BATCH and abs(nbytes - PAGE * hits) <= BATCH * PAGE
        assert s[("peercache_get_batch_duration_seconds_bucket", (("le", "+Inf"),))] == count
        # --dir-cache-ttl 0: every key asked of the cache (a miss), answered by serve's directory table
        assert lookups(s, "cache", "hit") == 0 and lookups(s, "table", "hit") >= keys - BATCH
        assert s[("peercache_node_info", (("node", "drive-0"), ("protocol", "tcp")))] == 1
    assert second[("peercache_get_batch_duration_seconds_count", ())] > first[("peercache_get_batch_duration_seconds_count", ())]
    assert second[("peercache_get_bytes_total", ())] > first[("peercache_get_bytes_total", ())]
    assert second[("peercache_get_hits_total", ())] >= second[("peercache_get_keys_total", ())] - BATCH
    assert drive.wait(timeout=scaled(60)) == 0, drive.stderr.read()
    assert f"drive: metrics of driver process 0 at {drive_url}" in drive.stderr.read()
    doc = json.loads(doc_path.read_text())
    assert doc["status"] == "ok" and doc["meta"]["metrics"] == [drive_url]
    assert closed(drive_url)
    s = scrape(serve_url)
    assert s[("peercache_pool_slots", ())] == WS and s[("peercache_pool_slots_used", ())] == WS
    assert s[("peercache_pool_publishes_total", ())] == WS and s[("peercache_pool_evictions_total", ())] == 0
    assert s[("peercache_directory_entries", ())] == WS
    # every batch of the window is at least one request to serve's data server
    assert s[("peercache_data_requests_total", ())] >= doc["points"][0]["batches"]
    assert s[("peercache_data_connections_accepted_total", ())] >= 1
    serve.send_signal(signal.SIGTERM)
    assert serve.wait(timeout=scaled(15)) == 0
    assert closed(serve_url)


def test_drive_processes_serve_one_port_each(procs, port, tmp_path):
    addr = f"127.0.0.1:{port}"
    serve = procs.start([*BENCH, "serve", "--discovery-addr", addr, *SMALL, "--readers", "1"])
    procs.wait_line(serve, READY_LINE)
    doc_path = tmp_path / "drive.json"
    r = subprocess.run([*BENCH, "drive", "--discovery-addr", addr, *SMALL, "--batch-size", str(BATCH),
                        "--processes", "2", "--duration", "0.5", "--warmup", "0.2", "--out", str(doc_path),
                        "--metrics-addr", "127.0.0.1:0"], capture_output=True, text=True, timeout=scaled(90))
    assert r.returncode == 0, r.stderr
    urls = json.loads(doc_path.read_text())["meta"]["metrics"]
    assert len(urls) == 2 and len(set(urls)) == 2 and all(u.startswith("http://127.0.0.1:") for u in urls)
    for i, u in enumerate(urls):
        assert f"drive: metrics of driver process {i} at {u}" in r.stderr


def samples_of(text: str) -> dict:
    """{(sample name, sorted labels): value} of one metrics text."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_drive_keeps_each_process_and_serves_metrics_at_its_window_edges(procs, port, tmp_path):
    """--metrics-scrapes: every driver process's text and serve's (read over the control plane) at the start and
    end of the window; the drivers' get bytes grew by the point's bytes between them, serve's data requests too."""
    addr = f"127.0.0.1:{port}"
    serve = procs.start([*BENCH, "serve", "--discovery-addr", addr, *SMALL, "--readers", "1",
                         "--metrics-addr", "127.0.0.1:0"])
    procs.wait_line(serve, READY_LINE)
    doc_path = tmp_path / "drive.json"
    r = subprocess.run([*BENCH, "drive", "--discovery-addr", addr, *SMALL, "--batch-size", str(BATCH),
                        "--processes", "2", "--duration", "1", "--warmup", "0.3", "--out", str(doc_path),
                        "--metrics-addr", "127.0.0.1:0", "--metrics-scrapes"], capture_output=True, text=True,
                       timeout=scaled(90))
    assert r.returncode == 0, r.stderr
    doc = json.loads(doc_path.read_text())
    (pt,) = doc["points"]
    assert doc["meta"]["metrics_scrapes"] is True
    by = {(s["source"], s["process"], s["edge"]): s for s in pt["metrics_scrapes"]}
    assert set(by) == {("drive", 0, "start"), ("drive", 0, "end"), ("drive", 1, "start"), ("drive", 1, "end"),
                       ("serve", None, "start"), ("serve", None, "end")}, [s.get("error") for s in by.values()]
    grown = 0.0
    for proc in (0, 1):
        a, b = (samples_of(by[("drive", proc, e)]["text"]) for e in ("start", "end"))
        assert by[("drive", proc, "start")]["url"] in doc["meta"]["metrics"]
        # taken at the window's edges (a timer at its start, after the threads stopped at its end)
        assert abs(by[("drive", proc, "start")]["time"] - pt["window_start"]) < scaled(1.0)
        assert 0 <= by[("drive", proc, "end")]["time"] - pt["window_end"] < scaled(5.0)
        assert a[("peercache_node_info", (("node", f"drive-{proc}"), ("protocol", "tcp")))] == 1
        grown += b[("peercache_get_bytes_total", ())] - a[("peercache_get_bytes_total", ())]
    # what the window counted, give or take the batch each thread had in flight at either edge, and what
    # moved while each of the 4 scrapes rendered its text (a timer thread beside two busy readers; one run
    # here was 2.75 MB over, about 2 ms at 1.5 GB/s): 20 ms each allowed, while the warm-up alone moves
    # ~30 % of the window's bytes
    rate = pt["bytes"] / (pt["window_end"] - pt["window_start"])
    assert abs(grown - pt["bytes"]) <= 2 * 2 * BATCH * PAGE + 4 * scaled(0.02) * rate and pt["bytes"] > 0
    sa, sb = (samples_of(by[("serve", None, e)]["text"]) for e in ("start", "end"))
    assert sb[("peercache_data_requests_total", ())] > sa[("peercache_data_requests_total", ())]
    assert sa[("peercache_node_info", (("node", "serve"), ("protocol", "tcp")))] == 1


def test_metrics_scrapes_without_an_endpoint_is_refused_naming_the_flag(port):
    r = subprocess.run([*BENCH, "drive", "--discovery-addr", f"127.0.0.1:{port}", *SMALL, "--metrics-scrapes"],
                       capture_output=True, text=True, timeout=scaled(30))
    assert r.returncode == 2
    assert "--metrics-scrapes keeps what each process's metrics endpoint answers; give --metrics-addr" in r.stderr


def test_meta_exports_its_directory(procs, port):
    import peercache
    addr = f"127.0.0.1:{port}"
    url = f"http://127.0.0.1:{free_port()}/metrics"
    meta = procs.start([*BENCH, "meta", "--discovery-addr", addr, "--metrics-addr", url[7:-8]])
    assert f"metrics at {url}" in procs.wait_line(meta, "ready")
    with peercache.Client(addr, pool_bytes=1 << 20, page_size=4096) as c:
        c.put_batch(["a", "b", "c"], [b"1", b"2", b"3"])
        s = scrape_when(url, lambda s: s[("peercache_directory_entries", ())] == 3)
        assert s[("peercache_directory_members", ())] == 1
        assert s[("peercache_control_requests_total", (("server", "directory"),))] >= 2
    meta.send_signal(signal.SIGTERM)
    assert meta.wait(timeout=scaled(15)) == 0
    assert closed(url)


def test_serve_beyond_loopback_warns_who_can_read_the_metrics(procs, port):
    serve = procs.start([*BENCH, "serve", "--discovery-addr", f"127.0.0.1:{port}", *SMALL, "--readers", "0",
                         "--metrics-addr", "0.0.0.0:0"])
    procs.wait_line(serve, READY_LINE)
    serve.send_signal(signal.SIGTERM)
    assert serve.wait(timeout=scaled(15)) == 0
    err = serve.stderr.read()
    assert "--metrics-addr 0.0.0.0:0: the metrics endpoint is not on loopback: any host that can reach any " \
           "address of this machine" in err and "without authentication" in err


@pytest.mark.parametrize("mode", ["serve", "drive", "meta"])
def test_a_bad_address_is_refused_before_anything_starts(mode, port):
    extra = SMALL if mode != "meta" else []
    r = subprocess.run([*BENCH, mode, "--discovery-addr", f"127.0.0.1:{port}", *extra, "--metrics-addr", "9464"],
                       capture_output=True, text=True, timeout=scaled(30))
    assert r.returncode == 2
    assert (f"peercache-bench {mode}: invalid options: --metrics-addr '9464' is not HOST:PORT for the metrics "
            "endpoint; give e.g. 127.0.0.1:9464") in r.stderr


def test_a_taken_port_fails_serve_naming_the_flag(procs, port):
    import socket
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = f"127.0.0.1:{taken.getsockname()[1]}"
        r = subprocess.run([*BENCH, "serve", "--discovery-addr", f"127.0.0.1:{port}", *SMALL, "--readers", "0",
                            "--metrics-addr", busy], capture_output=True, text=True, timeout=scaled(30))
    assert r.returncode == 2
    assert f"invalid options: --metrics-addr {busy}: cannot listen there" in r.stderr


def test_the_hicache_store_serves_its_metrics_at_metrics_addr():
    obj = 16384
    with cluster("tcp", sglang=False, mla=True, obj_bytes=obj) as (addr, _, w):
        keys = [f"m{i:04d}cafe" for i in range(4)]
        assert w.call("set_v1", (keys, list(range(4)))) == [True] * 4
        url = f"http://127.0.0.1:{free_port()}/metrics"
        store = make_store(False, {"discovery_addr": addr, "protocol": "tcp", "pool_bytes": 0,
                                   "metrics_addr": url[7:-8]}, is_mla_model=True)
        try:
            assert store.metrics_url == url
            assert scrape(url)[("peercache_get_batch_duration_seconds_count", ())] == 0   # no node yet
            store.register_mem_pool_host(NumpyHostPool(8, obj, True))
            assert store.batch_get_v1(keys, indices([4, 5, 6, 7], torch_indices=False)) == [True] * 4
            s = scrape(url)
            assert s[("peercache_get_batch_duration_seconds_count", ())] == 1
            assert s[("peercache_get_keys_total", ())] == 4 and s[("peercache_get_bytes_total", ())] == 4 * obj
            assert s[("peercache_node_info", (("node", "hicache-tp0"), ("protocol", "tcp")))] == 1
        finally:
            store.close()
        assert closed(url)
    with pytest.raises(ConfigError, match="extra config 'metrics_addr' 'nowhere' is not HOST:PORT"):
        make_store(False, {"metrics_addr": "nowhere"})


def test_drive_beyond_loopback_warns_once_before_its_processes_start(port):
    # nothing serves at --discovery-addr: the warning comes before the driver processes, then drive fails
    r = subprocess.run([*BENCH, "drive", "--discovery-addr", f"127.0.0.1:{port}", *SMALL, "--processes", "2",
                        "--ready-timeout", "1", "--metrics-addr", "0.0.0.0:0"],
                       capture_output=True, text=True, timeout=scaled(60))
    assert r.returncode == 1
    assert r.stderr.count("--metrics-addr 0.0.0.0:0: the metrics endpoint is not on loopback") == 1, r.stderr
