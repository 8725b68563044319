"""The lab on two real kernels: two QEMU guests as two machines (peercache.lab.launch.guest.machines),
reached over SSH only, with RDMA (rxe) across two virtual wires and two NUMA nodes each.

`make test-2host` runs this file (marker ``twohost``; the default run leaves it out). The module
boots the pair once; the tests run in file order and the last one powers a machine off. Time
limits scale with the guests' measured slowness (an emulated CPU is slow, not hung).
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from peercache.lab.launch.guest import machines as M
from peercache.lab.launch.hosts import SshHost, parse_host

pytestmark = pytest.mark.twohost
ROOT = Path(__file__).resolve().parents[2]
TWOHOST = "tests/fixtures/pipeline/twohost.yaml"
#: Processes of a lab run; none may outlive it on either machine.
RUN_PROCESS = re.compile(r"peercache|cpusample|ib_read_bw|ib_write_bw|iperf3|perf stat|numactl")
PY = str(ROOT / ".venv" / "bin" / "python")
#: Snakemake's lines worth showing while the pipeline runs: the job that starts, the count done, errors.
PROGRESS = re.compile(r"^rule |^localrule |wildcards:|steps \(|Error|error:")


@pytest.fixture(scope="module")
def pair():
    problems = M.missing()
    if problems:
        pytest.skip("the two-machine testbed cannot run here: " + "; ".join(problems))
    p = M.MachinePair(M.MachinesSpec(rails=2, cpus=2, numa_nodes=2, memory_mib=2048))
    # SIGTERM (a CI job stopped) ends the stage as Ctrl-C does: the pipeline's Snakemake (its own
    # session) is stopped and the pair powered off by the clean-ups below, not left running.
    def interrupt(*_):
        raise KeyboardInterrupt("SIGTERM")
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        p.start()
    except BaseException:
        signal.signal(signal.SIGTERM, previous)
        raise
    saved = {k: os.environ.get(k) for k in p.environment()}
    os.environ.update(p.environment())
    try:
        yield p
    finally:
        signal.signal(signal.SIGTERM, previous)
        p.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        assert not any(p.running(r) for r in M.ROLES), "a machine outlived the pair"


def scaled(pair, seconds: float) -> float:
    return seconds * pair.slowness


def leftovers(pair, role: str) -> list[str]:
    """The lab's processes still running on ``role`` (sshd sessions and this probe excluded)."""
    r = pair.ssh(role, "ps -eo pid,args", timeout=scaled(pair, 30))
    assert r.returncode == 0, f"{r.stderr.strip()}\n{pair.describe(role)}"
    return [ln.strip() for ln in r.stdout.splitlines()[1:]
            if RUN_PROCESS.search(ln) and "ps -eo" not in ln]


def host(role: str) -> SshHost:
    h = parse_host(f"ssh:{M.HOST_ALIAS[role]}")
    assert isinstance(h, SshHost)
    return h


def bench(*args: str) -> list[str]:
    return [PY, "-m", "peercache.bench.cli", *args]


def serve_drive(port: int, duration: float, device: str = "rxe0") -> tuple[list[str], list[str]]:
    common = ["--discovery-addr", f"{M.rail_addr('producer', 0)}:{port}", "--protocol", "rdma",
              "--devices", device, "--page-size", "131072", "--working-set", "64"]
    return (bench("serve", *common, "--readers", "1", "--max-wait", "900"),
            bench("drive", *common, "--batch-size", "8", "--concurrencies", "1", "--duration", str(duration),
                  "--warmup", "0", "--ready-timeout", "600"))


# --- the pipeline, reduced grid of every scenario ------------------------------------------

def _snakemake(pair, work: Path) -> tuple[subprocess.CompletedProcess, str | None]:
    """Run the pipeline in ``work`` against the pair, its progress on the console; stop it as soon as a
    machine stalls (qemu runs, the machine inside writes no health): (the run, the stalled machine's
    description or None)."""
    t0 = time.monotonic()
    # Snakemake's log goes to the console as it runs (make test-2host runs pytest -s): a stage of
    # many minutes shows which job it is on, each line stamped with the seconds since the start.
    p = subprocess.Popen([sys.executable, "-m", "snakemake", "--cores", "2", "--profile", "profiles/ssh-testbed",
                          "--config", f"testbed={TWOHOST}"], cwd=work, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []
    stalled: list[str] = []
    done = threading.Event()

    def watch():
        limit = time.monotonic() + scaled(pair, 240) + 1800
        while not done.wait(5):
            late = time.monotonic() > limit
            for role in M.ROLES:
                if pair.stalled(role) and not stalled:
                    stalled.append(pair.describe(role))
            if stalled or late:
                os.killpg(p.pid, signal.SIGTERM)
                if not done.wait(15):
                    os.killpg(p.pid, signal.SIGKILL)
                return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        for line in p.stdout:
            lines.append(line)
            if PROGRESS.search(line):
                print(f"  [{time.monotonic() - t0:5.0f} s] {line.rstrip()[:160]}", flush=True)
        p.wait()
    finally:
        done.set()
        watcher.join()
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    print(f"two-host pipeline: {time.monotonic() - t0:.0f} s, rc {p.returncode}")
    return subprocess.CompletedProcess(p.args, p.returncode, "".join(lines), ""), (stalled or [None])[0]


@pytest.fixture(scope="module")
def pipeline_run(pair, tmp_path_factory):
    """The pipeline's reduced grid on the pair. A guest has stopped altogether a few times in testing
    (qemu running, the machine silent: docs/testing.md); when that happens the run is stopped, the
    diagnosis printed, the pair rebooted, and the pipeline run again in the same folder, as a user
    goes on after a stop: the finished points are kept, the stopped one and those after it run on the
    fresh pair. A second stall fails."""
    from conftest import pipeline_copy
    work = tmp_path_factory.mktemp("twohost")
    pipeline_copy(work)
    for attempt in (1, 2):
        r, stalled = _snakemake(pair, work)
        if stalled is None:
            return work, r
        print(f"\nA MACHINE STOPPED during the two-host pipeline (attempt {attempt} of 2):\n{stalled}\n", flush=True)
        if attempt == 2:
            pytest.fail("a machine stopped in both attempts of the two-host pipeline:\n" + stalled)
        pair.restart()
        os.environ.update(pair.environment())
        # A Snakemake that had to be killed leaves its lock on the folder.
        subprocess.run([sys.executable, "-m", "snakemake", "--unlock", "--profile", "profiles/ssh-testbed",
                        "--config", f"testbed={TWOHOST}"], cwd=work, capture_output=True, timeout=300, check=True)
        kept = sorted(str(p.parent.relative_to(work / "data/raw/twohost")) for p in work.glob("data/raw/twohost/*/*/rep*/result.json"))
        print(f"rebooted the pair; the pipeline goes on, keeping {len(kept)} finished point(s): {', '.join(kept)}", flush=True)


@pytest.mark.timeout(7200)
def test_pipeline_runs_every_scenario_across_the_wire(pipeline_run):
    work, r = pipeline_run
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    rows = pd.read_parquet(work / "data/tidy/twohost/rows.parquet")
    ok = rows[rows["status"] == "ok"]
    raw = ok[(ok["scenario"] == "single_nic") & (ok["tool"] == "ib_read_bw") & (ok["metric"] == "bw")]
    assert len(raw) == 1 and raw["value"].iloc[0] > 0, rows[rows["scenario"] == "single_nic"][["metric", "status", "reason"]]
    get = ok[ok["metric"] == "get_throughput"]
    assert set(get["scenario"]) == {"single_nic", "multi_rail", "whole_machine"}
    assert (get["value"] > 0).all()
    # The sweep's raw points: each one measured, or failed saying why (under emulation perftest may not
    # calibrate its clock even in 3 runs, and -D runs skew between the hosts: docs/two-hosts.md).
    sweep = rows[(rows["scenario"] == "msgsize_sweep") & (rows["metric"] == "bw")]
    assert set(sweep["size_bytes"]) == {4096, 131072}
    for _, r in sweep.iterrows():
        assert (r["status"] == "ok" and r["value"] > 0) or (r["status"] == "failed" and len(r["reason"]) > 20), r
    # The guests keep time on the TSC (runner.CLOCK_ARGS): over the emulated HPET perftest's cycle-counter
    # calibration failed in a third to two thirds of its runs here, each failure a rerun of the point.
    calibration = [n for f in (work / "data/raw/twohost").rglob("result.json")
                   for n in json.loads(f.read_text())["meta"]["params"].get("notes") or [] if "calibrate" in n]
    assert not calibration, calibration
    gpu = rows[rows["scenario"] == "gpudirect"]
    assert len(gpu) and (gpu["status"] == "skipped").all() and gpu["reason"].str.contains("no GPU").all()
    for f in ("reports/twohost/report.html", "figures/twohost/index.md"):
        assert (work / f).stat().st_size > 0


def test_both_machines_keep_time_on_the_tsc_within_a_second_of_this_one(pair):
    for role in M.ROLES:
        before = time.time()
        r = pair.ssh(role, "cat /sys/devices/system/clocksource/clocksource0/current_clocksource; date +%s.%N",
                     timeout=scaled(pair, 30))
        assert r.returncode == 0, f"{r.stderr.strip()}\n{pair.describe(role)}"
        source, stamp = r.stdout.split()
        assert source == "tsc", (role, source)
        # at boot the guest's clock is set from the emulated RTC (whole seconds)
        assert before - 1.5 < float(stamp) < time.time() + 1.5, (role, before, stamp)


def test_the_machines_report_this_checkouts_revision_without_running_git(pipeline_run):
    from peercache.bench.meta import git_revision
    work, _ = pipeline_run
    docs = list((work / "data/raw/twohost").rglob("drive.json"))
    assert docs
    for f in docs:
        assert json.loads(f.read_text())["meta"]["git_revision"] == git_revision(), f


def test_multi_rail_moved_bytes_on_both_rails(pipeline_run):
    work, _ = pipeline_run
    doc = json.loads(next((work / "data/raw/twohost/multi_rail").rglob("result.json")).read_text())
    get = [r for r in doc["rows"] if r["metric"] == "get_throughput" and r["status"] == "ok"]
    assert get, doc["rows"]
    per_dev = {d: c["rcv_bytes"] for d, c in (get[0]["extra"].get("port_counters") or {}).items()}
    assert set(per_dev) == {"rxe0", "rxe1"}, get[0]["extra"]
    assert all(v and v > 0 for v in per_dev.values()), per_dev


def test_whole_machine_groups_are_bound_to_their_nics_nodes(pipeline_run):
    work, _ = pipeline_run
    doc = json.loads(next((work / "data/raw/twohost/whole_machine").rglob("result.json")).read_text())
    binding = doc["meta"]["numa_binding"]
    want = {"rxe0": 0, "rxe1": 1}
    for group, node in want.items():
        for side in ("client", "server"):
            rec = binding[f"{group}/{side}"]
            assert rec["node"] == node, rec
            judged = rec["evidence"]["judged"]
            assert judged["verdict"] == "bound" and judged["node"] == node, judged
    assert not [n for n in doc["meta"]["params"]["notes"] if "numa_" in n]


def test_nothing_is_left_on_either_machine_after_the_run(pair, pipeline_run):
    for role in M.ROLES:
        assert leftovers(pair, role) == [], role


# --- the preflight on two kernels ----------------------------------------------------------------

def test_validate_connect_names_a_wrong_device_and_a_host_without_peercache_in_two_lines(pair, tmp_path):
    """The consumer names rxe9 (it has rxe0, rxe1) and the producer's python is the system python3,
    which has no PeerCache: one line each, exit 1, and nothing started on either machine."""
    import yaml
    doc = yaml.safe_load((ROOT / TWOHOST).read_text())
    doc["hosts"]["producer"]["python"] = "python3"
    doc["hosts"]["consumer"]["devices"] = ["rxe0", "rxe9"]
    doc["results"] = str(tmp_path / "raw" / "twohost")
    tb = tmp_path / "broken.yaml"
    tb.write_text(yaml.safe_dump(doc))
    r = subprocess.run([sys.executable, "-m", "peercache.lab.pipeline", "validate", "--testbed", str(tb), "--connect"],
                       capture_output=True, text=True, timeout=scaled(pair, 60) + 120, cwd=ROOT)
    print(r.stderr.strip())
    assert r.returncode == 1, r.stdout + r.stderr
    fail = [ln for ln in r.stderr.splitlines() if not ln.startswith("preflight of testbed")]
    assert len(fail) == 2, r.stderr
    assert fail[0].startswith("producer (ssh:pc-producer): python python3 (") and "cannot import peercache" in fail[0], fail
    assert fail[1] == ("consumer (ssh:pc-consumer): RDMA device rxe9 not found (have: rxe0, rxe1); fix the "
                       "testbed's hosts.consumer.devices"), fail
    assert r.stderr.splitlines()[-1] == "preflight of testbed twohost: 2 problem(s); nothing was started"
    assert not (tmp_path / "raw").exists()
    assert leftovers(pair, "producer") == [] and leftovers(pair, "consumer") == []


# --- faults across the wire --------------------------------------------------------------------

def _ended_with_an_error(pair, d, what: str) -> str:
    """Wait (5 s, scaled) for drive ``d`` to end; assert it failed and said something; its output."""
    t0 = time.monotonic()
    rc = d.wait(scaled(pair, 5))
    out = d.stdout + d.stderr
    print(f"{what}: drive rc {rc} after {time.monotonic() - t0:.1f} s (limit 5 s x slowness "
          f"{pair.slowness:.0f} = {scaled(pair, 5):.0f} s): {out.strip().splitlines()[-1][:300]}")
    assert rc not in (0, None), out[-1000:]
    return out


def _clean_up(pair, role: str, netdev: str, handles: list, hosts: tuple) -> None:
    """After a test that took ``role``'s ``netdev`` down: the link up again, the processes it started
    stopped (last first), the hosts' connections closed."""
    pair.ssh(role, f"ip link set {netdev} up")
    for h in reversed(handles):
        h.stop()
    for h in hosts:
        h.close()


@pytest.mark.timeout(3600)
def test_wire_down_ends_drive_serve_stays_up_and_serves_again_then_serve_killed_ends_drive(pair):
    prod, cons = host("producer"), host("consumer")
    serve, drive = serve_drive(24901, duration=600)
    s = prod.start(serve)
    handles = [s]
    try:
        s.wait_for("serve: ready", scaled(pair, 60))
        d = cons.start(drive)
        handles.append(d)
        d.wait_for(r"measure", scaled(pair, 120))
        assert pair.ssh("producer", "ip link set rail0 down").returncode == 0
        out = _ended_with_an_error(pair, d, "wire down")
        assert re.search(r"rxe0|rdma|READ|completion|connection", out, re.I), out[-1000:]
        assert s.running, "serve went down with the wire"
        assert pair.ssh("producer", "ip link set rail0 up").returncode == 0
        # The same serve answers a new drive once the wire is back, then dies under it.
        d2 = cons.start(drive)
        handles.append(d2)
        d2.wait_for(r"measure", scaled(pair, 120))
        # ("cl[i]": the pattern must not match the shell that runs pkill)
        assert pair.ssh("producer", "pkill -KILL -f 'peercache.bench.cl[i] serve'").returncode == 0
        _ended_with_an_error(pair, d2, "serve killed")
    finally:
        _clean_up(pair, "producer", "rail0", handles, (prod, cons))
    assert leftovers(pair, "producer") == [] and leftovers(pair, "consumer") == []


@pytest.mark.timeout(3600)
def test_a_rail_down_under_drive_fails_over_to_the_other_and_comes_back(pair):
    """drive reads over both rails, every page checked; the consumer's rail1 goes down during the 2nd of
    three points and up again: no error and no wrong byte reach drive, rxe1's counters show the down,
    rxe0 carries the point, and rxe1 carries bytes again in the 3rd point."""
    prod, cons = host("producer"), host("consumer")
    dur = max(20, round(scaled(pair, 1.5)))
    # 8 KiB pages in batches of 8: one batch on the one rail left stays under what Soft-RoCE's requester
    # handles without stalling (tests/engine/transport/test_rdma_failover.py).
    common = ["--discovery-addr", f"{M.rail_addr('producer', 0)}:24911", "--protocol", "rdma",
              "--devices", "rxe0,rxe1", "--page-size", "8192", "--working-set", "64"]
    out = "/tmp/pc-rail-failover.json"
    s = prod.start(bench("serve", *common, "--readers", "1", "--max-wait", "900"))
    handles = [s]
    try:
        s.wait_for("serve: ready", scaled(pair, 60))
        d = cons.start(bench("drive", *common, "--batch-size", "8", "--concurrencies", "1,1,1", "--duration",
                             str(dur), "--warmup", "0", "--ready-timeout", "600", "--out", out))
        handles.append(d)
        d.wait_for(r"point 2/3 threads=1 .* measure", scaled(pair, 120) + 2 * dur)
        time.sleep(dur * 0.2)
        assert pair.ssh("consumer", "ip link set rail1 down").returncode == 0
        time.sleep(dur * 0.4)
        assert pair.ssh("consumer", "ip link set rail1 up").returncode == 0
        rc = d.wait(scaled(pair, 60) + 3 * dur)
        assert rc == 0, (d.stdout + d.stderr)[-3000:]
        print("rail down under drive:\n" + "\n".join(ln for ln in d.stdout.splitlines() if ln.strip()))
    finally:
        _clean_up(pair, "consumer", "rail1", handles, (prod, cons))
    doc = json.loads(pair.ssh("consumer", f"cat {out}").stdout)
    assert doc["status"] == "ok", doc.get("error")
    points = doc["points"]
    assert len(points) == 3
    for p in points:
        assert p["status"] == "ok" and p["errors"] == 0 and p["verify_failures"] == 0, p
    rails = [{r["rail"]: r for r in p["rails"]} for p in points]
    assert sum(r["rxe1"]["downs"] for r in rails) >= 1, rails
    assert rails[1]["rxe0"]["bytes_read"] > 0 and rails[1]["rxe1"]["share"] < rails[0]["rxe1"]["share"], rails
    assert rails[2]["rxe1"]["bytes_read"] > 0, rails
    assert leftovers(pair, "producer") == [] and leftovers(pair, "consumer") == []


@pytest.mark.timeout(3600)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stopped_point_leaves_nothing_on_either_machine(pair, tmp_path, sig):
    out = tmp_path / "result.json"
    p = subprocess.Popen([sys.executable, "-m", "peercache.lab.pipeline.runpoint", "--testbed", TWOHOST,
                          "--scenario", "single_nic", "--point", "pc_rdma_p1x1_s128K_b32", "--out", str(out)],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + scaled(pair, 120)
        while time.monotonic() < deadline and not any("bench.cli drive" in ln for ln in leftovers(pair, "consumer")):
            time.sleep(1)
        assert any("bench.cli serve" in ln for ln in leftovers(pair, "producer")), "serve never started"
        p.send_signal(sig)
        p.wait(timeout=scaled(pair, 30))
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    # The remote watchdogs end each group when its ssh goes; give them a bounded moment.
    deadline = time.monotonic() + scaled(pair, 10)
    while time.monotonic() < deadline and (leftovers(pair, "producer") or leftovers(pair, "consumer")):
        time.sleep(1)
    assert leftovers(pair, "producer") == [] and leftovers(pair, "consumer") == []


@pytest.mark.timeout(3600)
def test_a_machine_powered_off_mid_run_fails_the_point_and_the_next_one_still_runs(pair, tmp_path):
    """Last in the file: it powers the consumer off."""
    outs = [tmp_path / "a" / "result.json", tmp_path / "b" / "result.json"]
    argv = [sys.executable, "-m", "peercache.lab.pipeline.runpoint", "--testbed", TWOHOST, "--scenario", "single_nic"]
    p = subprocess.Popen([*argv, "--point", "pc_rdma_p1x1_s128K_b32", "--out", str(outs[0])], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + scaled(pair, 120)
        while time.monotonic() < deadline and not any("bench.cli drive" in ln for ln in leftovers(pair, "consumer")):
            time.sleep(1)
        pair.power_off("consumer", hard=True)
        text, _ = p.communicate(timeout=scaled(pair, 60) + 300)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, text[-2000:]
    doc = json.loads(outs[0].read_text())
    failed = [r for r in doc["rows"] if r["status"] == "failed"]
    assert failed and failed[0]["reason"], doc["rows"]
    print("powered off mid-run:", failed[0]["reason"][:300])
    t0 = time.monotonic()
    r = subprocess.run([*argv, "--point", "ib_read_bw_q4_s128K", "--out", str(outs[1])], cwd=ROOT,
                       capture_output=True, text=True, timeout=scaled(pair, 60) + 300)
    assert r.returncode == 0, r.stdout + r.stderr
    nxt = json.loads(outs[1].read_text())
    assert [x for x in nxt["rows"] if x["status"] == "failed" and "pc-consumer" in (x["reason"] or "")], nxt["rows"]
    print(f"next point: recorded failed in {time.monotonic() - t0:.0f} s: {nxt['rows'][0]['reason'][:200]}")
    assert leftovers(pair, "producer") == []
