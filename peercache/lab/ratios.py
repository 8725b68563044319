"""``make bench``: PeerCache GET against the raw limits, side by side, in one run.

Prints one ``ratio <name> <value>`` line per target and the raw figures
behind each (``raw <name> <value> <unit>``), plus ``check`` lines for the
correctness runs. Throughput figures run with verification off; each
PeerCache path also gets a short run with verification on whose hit and
content counts are printed. What each figure measures:

- ``shm_vs_memcpy_128k``: ``peercache-bench drive --protocol shm`` (one
  thread, 128 KiB pages, directory cached) against a ``serve`` process, vs a
  single-thread native memcpy of the same pages from a memfd region of the
  same size and layout into a batch-sized buffer, in this process.
- ``tcp_vs_iperf3_128k``: ``serve`` in network namespace A and ``drive`` in
  namespace B over a veth pair (198.18.x addresses; loopback when not
  root), one thread and one channel, vs ``iperf3 -R -l 131072 -P 1`` on the
  same path and direction (server sends, as a GET does).
- ``pages_per_s_64b``: ``Node.get_batch_into`` of 128 random 64-byte pages
  per call over shm, directory cached, one thread in this process, against a
  ``serve`` process (the Node API is the thing measured; the
  ``peercache-bench drive`` rate, whose Python driver loop adds its own cost
  per batch, is printed beside it as a raw figure).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from peercache import tags
from peercache.bench import meta
from peercache.bench.options import page_keys
from peercache.bench.serve import READY_LINE
from peercache.lab.tools import iperf3, memcpy
from peercache.lab.launch import netns
from peercache.lab.analysis.references import load_bench_targets

PAGE_128K = 131072
#: Seconds a serve process may take to publish and print its ready line.
READY_TIMEOUT_S = 30.0
#: Extra seconds a measured process may run past its nominal length.
GRACE_S = 30.0


class BenchError(RuntimeError):
    """One measurement could not be made; the message says which and why."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bench_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "peercache.bench.cli", *args]


class Serve:
    """A ``peercache-bench serve`` process, ready on entry and ended on exit."""

    def __init__(self, argv: list[str], log: Path):
        self.argv, self.log = argv, log
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "Serve":
        self.out = open(self.log, "w+")
        self.proc = subprocess.Popen(self.argv, stdout=self.out, stderr=subprocess.STDOUT,
                                     start_new_session=True, text=True)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if READY_LINE in self.log.read_text():
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        text = self.log.read_text()
        self.__exit__()
        raise BenchError(f"serve did not get ready within {READY_TIMEOUT_S:.0f} s "
                         f"(command {' '.join(self.argv)}); its output:\n{text[-2000:]}")

    def __exit__(self, *exc) -> None:
        p = self.proc
        if p is not None and p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(timeout=10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(timeout=5)
        self.out.close()


def _run(argv: list[str], timeout: float, what: str) -> str:
    """Run to completion in its own session (killed as a group on timeout); stdout."""
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate(timeout=5)
        raise BenchError(f"{what} did not finish within {timeout:.0f} s: {' '.join(argv)}")
    if p.returncode != 0:
        raise BenchError(f"{what} failed with exit status {p.returncode}: {' '.join(argv)}\n"
                         f"{(out + err)[-2000:]}")
    return out


def drive(prefix: list[str], addr: str, protocol: str, page: int, ws: int, batch: int,
          duration: float, warmup: float, verify: bool, workdir: Path, tag: str) -> dict:
    """One ``peercache-bench drive`` point (one thread, one channel); its result point."""
    out = workdir / f"drive-{tag}.json"
    argv = prefix + _bench_cmd(
        "drive", "--discovery-addr", addr, "--protocol", protocol, "--page-size", str(page),
        "--working-set", str(ws), "--batch-size", str(batch), "--concurrencies", "1",
        "--max-channels", "1", "--dir-cache-ttl", "3600", "--duration", str(duration),
        "--warmup", str(warmup), "--quiet", "--out", str(out)) + ([] if verify else ["--no-verify"])
    try:
        _run(argv, duration + warmup + READY_TIMEOUT_S + GRACE_S, f"drive {tag}")
    except BenchError:
        if not out.exists():
            raise
    doc = json.loads(out.read_text())
    if doc["status"] != "ok" or not doc["points"]:
        raise BenchError(f"drive {tag} failed: {doc['error']}")
    return doc["points"][0]


def serve_argv(prefix: list[str], addr: str, protocol: str, page: int, ws: int, readers: int,
               bind: str | None = None) -> list[str]:
    """argv of a ``peercache-bench serve`` for the bench."""
    return prefix + _bench_cmd(
        "serve", "--discovery-addr", addr, "--protocol", protocol, "--page-size", str(page),
        "--working-set", str(ws), "--readers", str(readers), "--max-wait", "600", "--quiet",
        *(["--bind", bind] if bind else []))


def memcpy_rate(page: int, ws: int, batch: int, duration: float) -> float:
    """Bytes/s of one thread copying random slots of a pool-shaped memfd into a batch buffer."""
    return memcpy.measure(page, ws, batch, duration)["bytes_per_s"]


def node_get_rate(addr: str, page: int, ws: int, batch: int, duration: float) -> tuple[float, dict]:
    """Objects/s of Node.get_batch_into over shm (verify off), then a verified pass."""
    from peercache.node import Get, Node

    keys = page_keys(ws, "mla")
    rng = np.random.default_rng(2)
    batches = [[keys[j] for j in rng.choice(ws, batch, replace=False)] for _ in range(64)]
    dest = np.zeros(batch * page, dtype=np.uint8)
    offsets = np.arange(batch, dtype=np.uint64) * page
    caps = np.full(batch, page, dtype=np.uint64)
    node = Node(addr, protocol="shm", dir_cache_ttl=3600.0, name="bench-64b")
    try:
        for b in batches:  # warm the directory cache and the mapping
            node.get_batch_into(b, dest, offsets, caps)
        hits = calls = 0
        t0 = time.perf_counter()
        deadline = t0 + duration
        while time.perf_counter() < deadline:
            for b in batches[:16]:
                hits += node.get_batch_into(b, dest, offsets, caps).hits
            calls += 16
        rate = hits / (time.perf_counter() - t0)
        if hits != calls * batch:
            raise BenchError(f"64 B Node loop: {calls * batch - hits} of {calls * batch} GETs were not hits")
        vfail = checked = 0
        khash = {k: tags.key_hash(k) for k in keys}
        for b in batches:  # correctness: verification on
            r = node.get_batch_into(b, dest, offsets, caps)
            hit = r.status == Get.HIT
            ok = tags.verify_patterns(dest.reshape(batch, page)[hit],
                                      np.array([khash[k] for k in b], dtype=np.uint64)[hit],
                                      r.generations[hit])
            vfail += int((~ok).sum()) + int((~hit).sum())
            checked += len(b)
        return rate, {"checked": checked, "failures": vfail}
    finally:
        node.close()


def _check_line(name: str, point: dict) -> str:
    return (f"check {name} verify=on keys={point['keys']} hit_rate={point['hit_rate']} "
            f"errors={point['errors']} verify_failures={point['verify_failures']} status={point['status']}")


def _iperf3(prod_pre: list[str], cons_pre: list[str], host: str, port: int, duration: float,
            warmup: float) -> float:
    """Bytes/s of one ``iperf3 -R -l 131072 -P 1`` test (server sends, as a GET does)."""
    srv = subprocess.Popen(prod_pre + iperf3.server_command(port, bind=host), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        time.sleep(1.0)  # a one-off iperf3 server takes any probe as its test: just wait
        text = _run(cons_pre + iperf3.client_command(host, port, length=PAGE_128K, streams=1,
                                                     duration=int(round(duration + warmup)), reverse=True)
                    + ["-O", str(int(round(warmup)))], duration + warmup + GRACE_S, "iperf3 client")
    finally:
        try:
            srv.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(srv.pid, signal.SIGKILL)
            srv.communicate(timeout=5)
    return iperf3.parse_json(text, source="iperf3 client").received_bps / 8


def run(duration: float, warmup: float, rounds: int, workdir: Path) -> dict:
    """Every measurement in paired rounds (baseline, then PeerCache, back to back); ratios are medians."""
    res: dict = {"ratios": {}, "raw": {}, "rounds": {}, "checks": [], "notes": []}
    raw, ratios, per = res["raw"], res["ratios"], res["rounds"]

    def record(name: str, value: float) -> None:
        per.setdefault(name, []).append(round(value, 4))

    # 1. shm vs memcpy, 128 KiB pages.
    ws, batch = 256, 32
    addr = f"127.0.0.1:{_free_port()}"
    with Serve(serve_argv([], addr, "shm", PAGE_128K, ws, readers=rounds + 1), workdir / "serve-shm128k.log"):
        chk = drive([], addr, "shm", PAGE_128K, ws, batch, 1.0, 0.5, True, workdir, "shm128k-verify")
        res["checks"].append(_check_line("shm_128k", chk))
        for r in range(rounds):
            record("memcpy_128k_GBps", memcpy_rate(PAGE_128K, ws, batch, duration) / 1e9)
            pt = drive([], addr, "shm", PAGE_128K, ws, batch, duration, warmup, False, workdir, f"shm128k-{r}")
            record("peercache_shm_128k_GBps", pt["gb_per_s"])
    paired(res, "shm_vs_memcpy_128k", "peercache_shm_128k_GBps", "memcpy_128k_GBps")

    # 2. tcp vs iperf3, 128 KiB, two network namespaces (loopback when not root).
    ok, why = netns.available()
    pair = netns.NetnsPair(f"pcb{os.getpid() % 10000}", index=77) if ok else None
    if pair is None:
        res["notes"].append(f"tcp over loopback 127.0.0.1, not netns: {why}")
    try:
        if pair is not None:
            pair.create()
            prod_pre, cons_pre, host = pair.exec_prefix("a"), pair.exec_prefix("b"), pair.addr_a
            res["notes"].append(f"tcp path: netns {pair.ns_a} ({pair.addr_a}) -> {pair.ns_b} "
                                f"({pair.addr_b}) over veth")
        else:
            prod_pre, cons_pre, host = [], [], "127.0.0.1"
        addr = f"{host}:{_free_port() if pair is None else 31998}"
        with Serve(serve_argv(prod_pre, addr, "tcp", PAGE_128K, ws, readers=rounds + 1, bind=host),
                   workdir / "serve-tcp128k.log"):
            chk = drive(cons_pre, addr, "tcp", PAGE_128K, ws, batch, 1.0, 0.5, True, workdir, "tcp128k-verify")
            res["checks"].append(_check_line("tcp_128k", chk))
            for r in range(rounds):
                port = _free_port() if pair is None else 5201 + r
                record("iperf3_tcp_128k_GBps", _iperf3(prod_pre, cons_pre, host, port, duration, warmup) / 1e9)
                pt = drive(cons_pre, addr, "tcp", PAGE_128K, ws, batch, duration, warmup, False, workdir,
                           f"tcp128k-{r}")
                record("peercache_tcp_128k_GBps", pt["gb_per_s"])
    finally:
        if pair is not None:
            pair.remove()
    paired(res, "tcp_vs_iperf3_128k", "peercache_tcp_128k_GBps", "iperf3_tcp_128k_GBps")

    # 3. 64-byte pages over shm, directory cached, batch 128, one thread.
    ws64, batch64 = 4096, 128
    addr = f"127.0.0.1:{_free_port()}"
    with Serve(serve_argv([], addr, "shm", 64, ws64, readers=2), workdir / "serve-shm64.log"):
        for r in range(rounds):
            rate, chk = node_get_rate(addr, 64, ws64, batch64, duration)
            record("node_api_pages_per_s_64b", rate)
        res["checks"].append(f"check node_64b verify=on keys={chk['checked']} "
                             f"failures={chk['failures']} status={'ok' if not chk['failures'] else 'failed'}")
        _tell_done(addr)
        pt = drive([], addr, "shm", 64, ws64, batch64, duration, warmup, False, workdir, "shm64")
    rates = per["node_api_pages_per_s_64b"]
    raw["node_api_pages_per_s_64b"] = round(statistics.median(rates))
    raw["drive_pages_per_s_64b"] = pt["pages_per_s"]
    ratios["pages_per_s_64b"] = {"median": statistics.median(rates), "min": min(rates), "max": max(rates),
                                 "rounds": len(rates)}
    return res


def paired(res: dict, name: str, pc: str, base: str) -> None:
    """A ratio from paired rounds: each round's PeerCache figure over the baseline measured just before it;
    the median of those per-round ratios, with their min and max (the raw figures: medians too)."""
    per = res["rounds"]
    each = [a / b for a, b in zip(per[pc], per[base], strict=True) if b > 0]
    if not each:
        raise BenchError(f"{name}: the baseline {base} measured 0 in every round")
    res["raw"][base] = round(statistics.median(per[base]), 4)
    res["raw"][pc] = round(statistics.median(per[pc]), 4)
    res["ratios"][name] = {"median": statistics.median(each), "min": min(each), "max": max(each),
                           "rounds": len(each), "each": [round(x, 4) for x in each]}


def _tell_done(addr: str) -> None:
    """Count the in-process Node loop as one of serve's readers (reader_done comes from a registered node)."""
    from peercache.node import Node

    node = Node(addr, protocol="shm", rpc_timeout=2.0, name="bench-64b-done")
    try:
        node.call("reader_done", summary={"status": "ok", "points": 1})
    finally:
        node.close()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m peercache.lab.ratios", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=3.0, help="measured seconds per figure [%(default)s]")
    p.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each [%(default)s]")
    p.add_argument("--rounds", type=int, default=3,
                   help="paired rounds (baseline, then PeerCache); the median of the per-round ratios is "
                        "reported with min and max [%(default)s]")
    p.add_argument("--out", default=None, help="also write the JSON document here")
    args = p.parse_args(argv)
    if args.duration <= 0 or args.duration > 30 or args.warmup < 0 or args.warmup > 10:
        p.error("--duration must be in (0, 30] and --warmup in [0, 10] seconds")
    if not 1 <= args.rounds <= 5:
        p.error("--rounds must be 1..5 (the whole bench must stay well under 5 minutes)")
    host = meta.host_block()
    print(f"# {host['host']} ({host.get('cpu')}), {os.cpu_count()} cores, kernel {platform.release()}, "
          f"python {platform.python_version()}, rev {meta.git_revision()}, start {meta.now_iso()}")
    print(f"# throughput figures: verification off, {args.duration:g} s after {args.warmup:g} s warm-up, "
          f"{args.rounds} paired rounds, ratio = median of the per-round ratios; check lines: verification on")
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="peercache-bench-") as tmp:
        try:
            res = run(args.duration, args.warmup, args.rounds, Path(tmp))
        except BenchError as e:
            print(f"bench: FAILED: {e}", file=sys.stderr)
            return 1
    for line in res["checks"]:
        print(line)
    for n in res["notes"]:
        print(f"# {n}")
    for k, v in res["raw"].items():
        gb = k.endswith("_GBps")
        rounds = res["rounds"].get(k)
        print(f"raw {k[:-5] if gb else k} {v} {'GB/s' if gb else 'pages/s'}"
              + (f" rounds={','.join(str(x) for x in rounds)}" if rounds else ""))
    targets = load_bench_targets()
    for k, v in res["ratios"].items():
        fmt = (lambda x: f"{x:.3f}") if v["median"] < 100 else (lambda x: f"{x:.4g}")
        print(f"ratio {k} {fmt(v['median'])} (median of {v['rounds']} paired rounds; min {fmt(v['min'])}, "
              f"max {fmt(v['max'])})")
        t = targets.get(k)
        if t is None:
            print(f"#   no target for {k} in the references")
        else:
            print(f"#   target >= {t:g} (data/reference/references.yaml): "
                  f"{'met' if v['median'] >= t else 'NOT met'}")
    print(f"# bench took {time.monotonic() - t0:.0f} s")
    if args.out:
        res["meta"] = {**host, "git_revision": meta.git_revision(), "end": meta.now_iso(),
                       "duration": args.duration, "warmup": args.warmup}
        Path(args.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
