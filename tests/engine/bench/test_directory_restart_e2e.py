"""The embedded directory's restart, shown and measured (issue 39, item 3).

`peercache-bench meta` hosts the directory; two `serve --join` producers (pA, pB) and one verifying
drive reading both (--faults-expected, --timeline-ms 100) are its members. Mid-window meta is
SIGKILLed and started again at the same address. Nothing else is restarted: the members register
again on their own (under fresh ids: a restarted directory knows no token), the producers republish,
and drive's hit rate comes back to its level before the fault. The test prints what it measured
(``pytest -s``): seconds down, seconds from the directory's return to the members' registration, to
every entry republished, and to the hit rate's recovery, and the wrong pages (0).

Every wait is bounded; every process is started by the ``procs`` fixture and ended by it.
"""
from __future__ import annotations

import json
import os
import re
import signal
import threading
import time

from conftest import BENCH, scaled
from peercache.bench.drive.bounds import IO_TIMEOUT_S
from peercache.bench.serve import READY_LINE
from peercache.config import NodeConfig
from peercache.rpc import RpcClient

SMALL = ["--working-set", "64", "--page-size", "16384"]
PREFIXES = ("pA", "pB")
KEYS = [f"pc/{p}/{i}".encode() for p in PREFIXES for i in range(64)]
META_READY = "peercache-bench meta: ready"
#: Where in drive's measured window meta is killed, and for how long it stays dead (s).
KILL_AT_S, DOWN_S = 2.0, 1.0
#: drive's measured window (s): the fault, the recovery and a stretch of recovered reading
WINDOW_S = 8.0
#: How often a member heartbeats (NodeConfig's default: serve and drive use it).
HEARTBEAT_S = NodeConfig().heartbeat_interval
#: The bound on "from the directory's return to the hit rate's recovery": each member's next heartbeat
#: (one interval) finds it forgotten and registers again, the producers republish, the consumer's next
#: lookup finds the keys; plus the answers of the directory and slack for this loaded 2-core machine.
RECOVERY_BOUND_S = HEARTBEAT_S + 1.5
#: A bucket is recovered when its hit rate is within this of the rate before the fault.
RATE_TOLERANCE = 0.02


class _Lines:
    """A pipe's lines, read in a thread."""

    def __init__(self, pipe):
        self.lines: list[str] = []
        self._t = threading.Thread(target=lambda: self.lines.extend(pipe), daemon=True)
        self._t.start()

    def text(self) -> str:
        self._t.join(timeout=5)
        return "".join(self.lines)


def _directory(addr: str) -> tuple[dict, int]:
    """The directory's members now (node id -> info) and how many of KEYS it holds."""
    c = RpcClient(addr, timeout=1.0, what="discovery")
    try:
        nodes = c.call("members")["nodes"]
        found = sum(loc is not None for loc in c.call("lookup", keys=KEYS)["locs"])
        return nodes, found
    finally:
        c.close()


def _measuring_at(err: _Lines, drive, seconds: float) -> None:
    """Return ``seconds`` into drive's measured window (placed by its progress lines)."""
    end = time.monotonic() + scaled(30)
    while True:
        m = [re.search(r"([0-9.]+)/[0-9.]+ s measure", ln) for ln in list(err.lines)]
        m = [x for x in m if x]
        if m:
            break
        assert drive.poll() is None, f"drive ended before it measured: {err.text()}"
        assert time.monotonic() < end, "drive never measured"
        time.sleep(0.05)
    # a progress line says how far into the point (warmup 0.3 s + window) drive was when it was written
    time.sleep(max(0.0, 0.3 + seconds - float(m[0].group(1)) - 0.05))


def _recovery(tl: dict, kill_t: float, min_after: int = 5) -> tuple[float, float | None]:
    """(the hit rate before the fault, the start of the first bucket after ``kill_t`` from which every
    bucket that read anything is within RATE_TOLERANCE of it, or None if none is: s into the window)."""
    width = tl["bucket_ms"] / 1000.0
    buckets = tl["buckets"]
    before = [b for b in buckets if b["t"] + width <= kill_t - 0.05 and b["keys"]]
    assert before, f"no bucket read anything before the fault at {kill_t:.2f} s"
    rate = sum(b["hits"] for b in before) / sum(b["keys"] for b in before)
    after = [b for b in buckets if b["t"] >= kill_t]
    ok = [not b["keys"] or b["hits"] / b["keys"] >= rate - RATE_TOLERANCE for b in after]
    for i in range(len(after)):
        if all(ok[i:]) and sum(1 for b in after[i:] if b["keys"]) >= min_after:
            return rate, after[i]["t"]
    return rate, None


def test_the_embedded_directory_restarts_and_every_member_comes_back_on_its_own(procs, port, tmp_path):
    addr = f"127.0.0.1:{port}"
    meta = procs.start([*BENCH, "meta", "--discovery-addr", addr])
    procs.wait_line(meta, META_READY)
    serves = {p: procs.start([*BENCH, "serve", "--join", "--bind", "127.0.0.1", "--discovery-addr", addr, *SMALL,
                              "--readers", "0", "--key-prefix", p]) for p in PREFIXES}
    for s in serves.values():
        procs.wait_line(s, READY_LINE)
    out = tmp_path / "drive.json"
    drive = procs.start([*BENCH, "drive", "--discovery-addr", addr, *SMALL, "--batch-size", "8",
                         "--key-prefix", ",".join(PREFIXES), "--duration", str(WINDOW_S), "--warmup", "0.3",
                         "--timeline-ms", "100", "--faults-expected", "--ready-timeout", "15", "--out", str(out)])
    err = _Lines(drive.stderr)
    _measuring_at(err, drive, KILL_AT_S)
    old, found = _directory(addr)
    assert found == len(KEYS) and len(old) == 3, (old, found)

    os.killpg(meta.pid, signal.SIGKILL)
    killed_at = time.time()
    meta.wait(timeout=5)
    time.sleep(DOWN_S)
    meta = procs.start([*BENCH, "meta", "--discovery-addr", addr])        # the same address, knowing nobody
    procs.wait_line(meta, META_READY)
    back_at = time.time()
    registered_s = republished_s = None
    end = time.monotonic() + scaled(10)
    while registered_s is None or republished_s is None:
        assert time.monotonic() < end, f"within 10 s of its return the directory has {_directory(addr)}"
        nodes, found = _directory(addr)
        if registered_s is None and len(nodes) == len(old):
            registered_s = time.time() - back_at
        if republished_s is None and found == len(KEYS):
            republished_s = time.time() - back_at
        time.sleep(0.02)

    assert drive.wait(timeout=scaled(WINDOW_S + 30)) == 0, err.text()
    stderr = err.text()
    assert "Traceback" not in stderr, stderr
    # no other process was restarted: the producers still run, the ones the directory lists
    assert all(s.poll() is None for s in serves.values())
    nodes, found = _directory(addr)
    pids = {info.get("pid") for info in nodes.values() if info.get("name") == "serve"}
    assert pids == {s.pid for s in serves.values()}, nodes
    assert found == len(KEYS)
    serve_logs = {}
    for p, s in serves.items():
        s.send_signal(signal.SIGTERM)
        s.wait(timeout=scaled(10))
        serve_logs[p] = s.stderr.read()
    # every member registered again, under a fresh id (the restarted directory could check no old token)
    assert len(registered_ids := set(re.findall(r"registered again as node (\w+)", "".join(serve_logs.values())))) == 2
    assert registered_ids <= set(nodes) and not registered_ids & set(old), (serve_logs, nodes, old)

    doc = json.loads(out.read_text())
    assert doc["status"] == "ok", doc["error"]
    p = doc["points"][0]
    assert p["verified"] and p["verify_failures"] == 0 and p["redirected"] == 0, p
    tl = p["timeline"]
    kill_t, back_t = killed_at - tl["start"], back_at - tl["start"]
    rate, recovered_t = _recovery(tl, kill_t)
    width = tl["bucket_ms"] / 1000.0
    down = [b for b in tl["buckets"] if kill_t + width <= b["t"] and b["t"] + width <= back_t]
    summary = (f"directory down {back_at - killed_at:.2f} s (killed {kill_t:.2f} s into the window, back at "
               f"{back_t:.2f} s); from its return: members registered again in "
               + (f"{registered_s:.2f} s, " if registered_s is not None else "never, ") +
               f"{len(KEYS)} entries republished in {republished_s:.2f} s, hit rate back to {rate:.3f} in "
               + (f"{recovered_t - back_t:.2f} s" if recovered_t is not None else "never")
               + f"; errors while down {sum(b['errors'] for b in down)}, wrong pages {p['verify_failures']}, "
               f"longest stall {tl['max_stall_s']:.2f} s; hits/keys per bucket: "
               + " ".join(f"{b['t']:.1f}:{b['hits']}/{b['keys']}" for b in tl["buckets"]))
    print(summary)
    assert rate >= 0.99, summary
    assert recovered_t is not None and recovered_t - back_t <= scaled(RECOVERY_BOUND_S), summary
    # while the directory was gone, lookups failed (errors) and none waited out its bound
    assert sum(b["errors"] for b in down) > 0 and tl["max_stall_s"] < IO_TIMEOUT_S, summary
