"""The metrics endpoint of a real ``serve`` under attack, on loopback: 2,000 silent connections, and 300
slowloris senders trickling never-ending request headers. serve runs at a 1,024 open-file limit (a common
default, where the old thread-per-connection endpoint ran the data server out of descriptors); its memory
and descriptors stay put, a verifying drive runs clean during the attack, and scrapes answer during and after.

Every load loop is bounded in count and in time, and every socket is on 127.0.0.1."""
import json
import os
import resource
import socket
import subprocess
import threading
import time
import urllib.request

import pytest

from conftest import BENCH, free_port, scaled
from peercache.bench.serve import READY_LINE

PAGE, WS = 16384, 128
SMALL = ["--working-set", str(WS), "--page-size", str(PAGE)]
SERVE_NOFILE = 1024
SILENT, SLOWLORIS = 2000, 300
#: what the attack may add to serve's resident memory
RSS_SLACK = 32 << 20
#: slowloris: rounds of one header line each, a line's bytes, and the pause between rounds (the attack
#: trickles for ~2 s; each sender offers at most ROUNDS * LINE bytes, 300 of them ~70 MiB in all)
ROUNDS, LINE, PAUSE = 20, 12000, 0.1


def rss(pid: int) -> int:
    """Resident bytes of process ``pid``."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def open_fds(pid: int) -> int:
    """Descriptors process ``pid`` holds."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def scrape(url: str) -> str:
    return urllib.request.urlopen(url, timeout=scaled(5)).read().decode()


@pytest.fixture
def nofile():
    """This process may hold the attack's sockets: its soft open-file limit raised (and restored)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = SILENT + SLOWLORIS + 512
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.skip(f"the hard open-file limit {hard} is below the {need} sockets the attack opens")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, need), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def connect_all(port: int, n: int, deadline: float) -> list[socket.socket]:
    """Up to ``n`` connections to 127.0.0.1:``port``, made one after another as a client would (each waits for
    its handshake, at most 1 s), then non-blocking; fewer when ``deadline`` passes first.

    A server slower to accept than the connections come fills its accept queue, and the next SYN is dropped
    and sent again 1 s later: each such stall doubles a pause between connections (4 ms to 64 ms), so that a
    slow server (the old endpoint took a thread per connection, a few ms each) is attacked with as many
    connections as it will take in the time, not with a queue of retries."""
    socks, pace = [], 0.0
    for _ in range(n):
        if time.monotonic() > deadline:
            break
        s = socket.socket()
        s.settimeout(1.0)
        t = time.monotonic()
        try:
            s.connect(("127.0.0.1", port))
        except OSError:
            s.close()
            continue
        if time.monotonic() - t > 0.2:
            pace = min(0.064, max(0.004, 2 * pace))
        s.setblocking(False)
        socks.append(s)
        if pace:
            time.sleep(pace)
    return socks


def silent(port: int, connected: threading.Event, stop: threading.Event, held: list) -> None:
    """SILENT connections that never send a byte, held until ``stop``."""
    held.extend(connect_all(port, SILENT, time.monotonic() + scaled(15)))
    connected.set()
    stop.wait(scaled(60))


def slowloris(port: int, connected: threading.Event, stop: threading.Event, held: list) -> None:
    """SLOWLORIS connections each sending a request line, then a long header line per round, never the blank
    line that ends the headers; a sender the server closed just stops."""
    socks = connect_all(port, SLOWLORIS, time.monotonic() + scaled(15))
    held.extend(socks)
    connected.set()
    live = list(socks)
    for rnd in range(ROUNDS + 1):
        if stop.is_set() or not live:
            break
        chunk = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n" if rnd == 0 else \
            b"X-Pad-%d: " % rnd + b"a" * LINE + b"\r\n"
        still = []
        for s in live:
            try:
                s.send(chunk)
                still.append(s)
            except BlockingIOError:     # a full send buffer: try the next round
                still.append(s)
            except OSError:             # closed by the server
                pass
        live = still
        stop.wait(PAUSE)
    stop.wait(scaled(60))


class Watch:
    """The peak RSS and open descriptors of a process, sampled until stopped."""

    def __init__(self, pid: int):
        self.pid, self.rss, self.fds = pid, rss(pid), open_fds(pid)
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        while not self._stop.wait(0.02):
            try:
                self.rss, self.fds = max(self.rss, rss(self.pid)), max(self.fds, open_fds(self.pid))
            except (OSError, AssertionError):
                return

    def stop(self):
        self._stop.set()
        self._t.join(5)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("attack", [silent, slowloris])
def test_an_attack_on_the_metrics_endpoint_leaves_serve_and_its_drives_alone(attack, procs, port, tmp_path, nofile):
    from peercache.metrics.endpoint import FDS
    addr = f"127.0.0.1:{port}"
    mport = free_port()
    url = f"http://127.0.0.1:{mport}/metrics"
    serve = procs.start([*BENCH, "serve", "--discovery-addr", addr, *SMALL, "--readers", "0",
                         "--metrics-addr", f"127.0.0.1:{mport}"],
                        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (SERVE_NOFILE, SERVE_NOFILE)))
    procs.wait_line(serve, READY_LINE)
    assert "peercache_node_info" in scrape(url)          # the scrape's own allocations are in the baseline
    base_rss, base_fds = rss(serve.pid), open_fds(serve.pid)
    watch = Watch(serve.pid)
    connected, stop, held = threading.Event(), threading.Event(), []
    attacker = threading.Thread(target=attack, args=(mport, connected, stop, held), daemon=True)
    attacker.start()
    try:
        assert connected.wait(scaled(30))
        t0 = time.monotonic()
        during = scrape(url)
        doc_path = tmp_path / "drive.json"
        drive = subprocess.run([*BENCH, "drive", "--discovery-addr", addr, *SMALL, "--batch-size", "8",
                                "--duration", "1", "--warmup", "0.3", "--ready-timeout", "10",
                                "--out", str(doc_path)], capture_output=True, text=True, timeout=scaled(60))
        if attack is slowloris:                           # the senders are done trickling
            time.sleep(max(0.0, t0 + ROUNDS * PAUSE + 0.3 - time.monotonic()))
        watch.stop()
        peak_rss, peak_fds = watch.rss, watch.fds
        still_during = scrape(url)
    finally:
        stop.set()
        attacker.join(scaled(40))
        for s in held:
            s.close()
    after = scrape(url)
    assert drive.returncode == 0, drive.stderr[-2000:]
    doc = json.loads(doc_path.read_text())
    (pt,) = doc["points"]
    assert doc["status"] == "ok" and pt["errors"] == 0 and pt["verify_failures"] == 0 and pt["hit_rate"] == 1.0
    for text in (during, still_during, after):
        assert "peercache_node_info" in text
    assert peak_rss - base_rss <= RSS_SLACK, \
        f"serve's RSS went from {base_rss / 2**20:.0f} MiB to {peak_rss / 2**20:.0f} MiB under {attack.__name__}"
    # drive's own connections to serve (data and control) come and go as well
    assert peak_fds - base_fds <= FDS + 32, f"serve held {peak_fds - base_fds} more descriptors under the attack"
    # the attack was made in full: the endpoint takes connections as fast as they come (and closes them)
    assert len(held) >= (SILENT if attack is silent else SLOWLORIS) * 0.95
    print(f"{attack.__name__}: {len(held)} connections, serve's RSS {base_rss / 2**20:.1f} -> peak "
          f"{peak_rss / 2**20:.1f} MiB, fds {base_fds} -> peak {peak_fds}, drive {pt['batches']} batches")
