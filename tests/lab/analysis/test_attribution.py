"""What limited a point: the rules file, each rule on evidence, and the fixture run end to end."""
import json
from pathlib import Path

import pytest

from peercache.lab.analysis import attribution as A
from peercache.lab.analysis import report

ROOT = Path(__file__).resolve().parents[3]
FIX = ROOT / "tests" / "fixtures" / "tidy"
RULES = A.load_rules()


def row(value=1.0, unit="GB/s", **extra):
    return {"value": value, "unit": unit, "extra": json.dumps(extra), "devices": "", "side": "client"}


def cpu(consumer=None, producer=None):
    out = {}
    for side, use in (("consumer", consumer), ("producer", producer)):
        if use is not None:
            out[side] = {"cores": use[0], "busiest_thread": use[1]}
    return out


def machine(busy, softirq=0.0, ksoftirqd=0.0, steal=0.0, cpus=2, boot=None):
    """A side's machine reading over a window, as cpusample.machine_usage gives it."""
    return {"cpus": cpus, "busy_cores": busy, "softirq_cores": softirq, "ksoftirqd_cores": ksoftirqd,
            "steal_cores": steal, "boot": boot}


@pytest.mark.parametrize("ev_args, rule, text", [
    # 95 % of a 400 Gb/s port
    (dict(r=row(47.5), line_rate_Bps=50e9), "line_rate", "line rate (95% of 400 Gb/s)"),
    # PeerCache at 1.56 x an iperf3 figure that ran in one thread
    (dict(r=row(5.0), raw_Bps=3.2e9, raw_tool="iperf3"), "above_raw",
     "above raw (156% of iperf3): no recorded evidence says why"),
    # ... and where the raw run's own thread was at a full core, that is the cause it gives
    (dict(r=row(5.0), raw_Bps=3.2e9, raw_tool="iperf3", raw_busiest_thread=0.99), "above_raw",
     "above raw (156% of iperf3): the raw run's busiest thread was at 0.99 of a core"),
    # ... or, both runs' CPU recorded, that the raw tool spent more CPU per byte (local run: 2x2 readers at
    # 6.0 GB/s on 1.87 cores, iperf3 -R x4 at 3.6 GB/s on 1.81 cores, one 2-CPU machine)
    (dict(r=row(6.0, cpu=cpu(consumer=(1.177, 0.357), producer=(0.69, 0.494))), raw_Bps=3.605e9,
          raw_tool="iperf3", raw_busiest_thread=0.26, raw_cpu={"consumer": 0.778, "producer": 1.027}, shared_host=True),
     "above_raw", "above raw (166% of iperf3): the raw tool spent more CPU per byte: 2.00 GB/s per busy core (1.80 cores busy) against PeerCache's 3.21"),
    # ... or where it was not CPU-bound and retransmitted, loss held it back
    (dict(r=row(3.72), raw_Bps=1.72e9, raw_tool="iperf3", raw_busiest_thread=0.41, raw_retransmits=813),
     "above_raw", "above raw (216% of iperf3): the raw run was held back by loss, not CPU: it retransmitted 813 TCP"),
    (dict(r=row(2.0, cpu=cpu(consumer=(1.1, 0.98))), raw_Bps=4e9, raw_tool="iperf3"), "consumer_core",
     "one core (consumer thread at 0.98 of a core)"),
    (dict(r=row(2.0, cpu=cpu(consumer=(0.5, 0.4), producer=(0.95, 0.93)))), "producer_core",
     "one core (producer thread at 0.93 of a core)"),
    # both sides on one 2-CPU machine, 1.9 CPUs busy in all
    (dict(r=row(2.0, cpu=cpu(consumer=(1.0, 0.6), producer=(0.9, 0.5))), host_cores=2, shared_host=True),
     "machine_cpu", "CPU (95% of the machine's 2 logical CPUs busy)"),
    (dict(r=row(2.0), numa={"memory_node": 1, "nic_node": 0}), "remote_numa",
     "remote NUMA (memory on node 1, NIC on node 0)"),
    (dict(r=row(4.0), raw_Bps=4.6e9, raw_tool="ib_read_bw"), "raw_path", "the path itself (87% of ib_read_bw"),
    # 8 rails into one GPU's Gen5 x16 link: 49.5 GB/s of 63.02
    (dict(r=row(49.5), line_rate_Bps=400e9, pcie=[{"gen": 5, "width": 16, "GBps": 63.015}]), "unknown",
     "unknown"),
    (dict(r=row(58.0), line_rate_Bps=400e9, pcie=[{"gen": 5, "width": 16, "GBps": 63.015}]), "pcie",
     "PCIe Gen5 x16 (92% of 63.02 GB/s)"),
    (dict(r=row(60.0), line_rate_Bps=50e9), "above_line_rate", "nothing: not a valid measurement (120% of the 400"),
    (dict(r=row(300.0, aggregate="sum_of_windows"), line_rate_Bps=400e9), "summed_windows",
     "not one window: a sum of per-NIC figures"),
    (dict(r=row(1.0, cpu=cpu(consumer=(0.5, 0.5))), raw_Bps=4e9, raw_tool="iperf3", line_rate_Bps=50e9),
     "unknown", "unknown (nothing at its limit: line_fraction 0.02 (line_rate at ≥ 0.9); fraction_of_raw 0.25 "
                "(raw_path at ≥ 0.8); consumer_busiest_thread 0.50 (consumer_core at ≥ 0.9); not measured: "
                "pcie_fraction, producer_busiest_thread, consumer_runnable, producer_runnable, softirq_cores, "
                "cpu_fraction, machine_busy, peer_machine_busy)"),
    # a consumer thread on a CPU 0.62 of the window and waiting for one 0.33 of it: the CPUs were shared
    (dict(r=row(2.0, cpu={"consumer": {"cores": 0.7, "busiest_thread": 0.62, "runnable": 0.95, "runnable_wait": 0.33}})),
     "consumer_run_queue", "CPU contention (a consumer thread was runnable 95% of the window: 0.62 of a core on a "
                           "CPU, 0.33 waiting in a run queue)"),
    (dict(r=row(2.0, cpu={"producer": {"cores": 0.7, "busiest_thread": 0.5, "runnable": 0.91, "runnable_wait": 0.41}})),
     "producer_run_queue", "CPU contention (a producer thread was runnable 91% of the window: 0.50 of a core"),
    # a whole CPU in the kernel's interrupts and softirqs (veth and TCP/IP work between namespaces)
    (dict(r=row(2.0, cpu={"consumer": {"cores": 0.4, "busiest_thread": 0.3, "runnable": 0.5,
                                       "machine": machine(1.5, softirq=0.95, ksoftirqd=0.1)}})),
     "softirq", "the kernel's packet work (0.95 CPUs in interrupts and softirqs, 0.10 in ksoftirqd threads)"),
    # two namespaces on one 2-CPU machine (one boot id): both sides' processes and the kernel's work fill it
    (dict(r=row(2.0, cpu={"consumer": {"cores": 0.5, "busiest_thread": 0.4, "runnable": 0.6,
                                       "machine": machine(1.86, softirq=0.6, boot="b1")},
                          "producer": {"cores": 0.6, "busiest_thread": 0.5, "runnable": 0.7,
                                       "machine": machine(1.86, softirq=0.6, boot="b1")}}), host_cores=2),
     "machine_busy", "CPU (1.86 of the machine's 2 CPUs busy: 1.10 in the measured processes, 0.60 in interrupts "
                     "and softirqs, 0.16 elsewhere (other processes, kernel threads; 0.00 in ksoftirqd); 0.00 stolen "
                     "by the hypervisor)"),
    # the producer on a machine of its own (another boot id), all its CPUs busy
    (dict(r=row(2.0, cpu={"consumer": {"cores": 0.5, "busiest_thread": 0.4, "runnable": 0.6,
                                       "machine": machine(0.6, boot="b1")},
                          "producer": {"cores": 1.9, "busiest_thread": 0.5, "runnable": 0.7,
                                       "machine": machine(1.96, boot="b2")}}), host_cores=2),
     "peer_cpu", "the producer's CPU (1.96 of its 2 CPUs busy)"),
])
def test_each_rule_fires_on_its_evidence(ev_args, rule, text):
    r = ev_args.pop("r")
    got_rule, got_text = A.limited_by(A.evidence(r, **ev_args), RULES)
    assert got_rule == rule and got_text.startswith(text), got_text


def test_evidence_that_was_not_recorded_is_absent_not_guessed():
    ev = A.evidence(row(2.0))
    assert ev == {}
    # The consumer alone counts on its own machine; the producer's CPU only where they share one.
    ev = A.evidence(row(2.0, cpu=cpu(consumer=(1.0, 0.9), producer=(1.0, 0.9))), host_cores=4)
    assert ev["cpu_fraction"] == 0.25


@pytest.mark.parametrize("doc, message", [
    ("schema_version: 2\nrules: []\n", "needs schema_version: 1"),
    ("schema_version: 1\nrules:\n  - {id: x, when: {warp: {ge: 1}}, says: s}\n  - {id: u, when: {}, says: u}\n",
     "unknown evidence field 'warp'"),
    ("schema_version: 1\nrules:\n  - {id: x, when: {line_fraction: {about: 1}}, says: s}\n"
     "  - {id: u, when: {}, says: u}\n", "must be one of"),
    ("schema_version: 1\nrules:\n  - {id: x, when: {line_fraction: {ge: 1}}, says: s}\n",
     "the last rule must have no conditions"),
])
def test_malformed_rules_are_refused_naming_the_rule(tmp_path, doc, message):
    p = tmp_path / "rules.yaml"
    p.write_text(doc)
    with pytest.raises(A.RulesError, match=message):
        A.load_rules(p)


def test_the_fixture_run_says_what_limited_every_throughput_row(tmp_path):
    rep = report.build_report(FIX, tmp_path / "fig", "fixture-2x-cx7", FIX / "references.yaml")
    ov = {r["scenario"]: r for r in rep.overview.to_dict("records")}
    peer = ov["single_nic: PeerCache over rdma, 128 KiB, batch 32, 8 proc × 4 thr"]
    assert peer["limited by"] == "line rate (91% of 400 Gb/s)"        # 45.3 GB/s on a 50 GB/s port
    sections = {s.scenario: s.table for s in rep.sections}
    single = sections["single_nic"]
    ok_bw = single[(single["status"] == "ok") & single["metric"].isin(["bw", "get_throughput"])]
    assert len(ok_bw) and ok_bw["limited_by"].notna().all()
    # A per-NIC figure above its 400 Gb/s port keeps above_line_rate and no limit is read from it.
    whole = sections["whole_machine"]
    over = whole[whole["verdict"] == "above_line_rate"]
    assert len(over) == 1 and over.iloc[0]["limited_by"].startswith("nothing: not a valid measurement (105% of the 400")


def test_the_published_baseline_is_judged_by_the_same_rules(tmp_path):
    rep = report.build_report(ROOT / "data" / "reference", tmp_path / "fig", "peercache-8xcx7-roce",
                              ROOT / "data" / "reference" / "references.yaml")
    ov = {r["scenario"]: r for r in rep.overview.to_dict("records")}
    agg = ov["whole_machine: aggregate over 8 NICs"]
    # 413.1 GB/s is 3305 Gb/s over 8 x 400 Gb/s: above what the ports carry, and a sum of per-NIC windows.
    assert agg["limited by"].startswith("nothing: not a valid measurement (103% of the 3200 Gb/s")
    assert "verdict above_line_rate" in agg["notes"]
    whole = {s.scenario: s.table for s in rep.sections}["whole_machine"]
    top = whole[whole["value"] == 89.4].iloc[0]        # one NIC at 89.4 GB/s on a 50 GB/s port
    assert top["verdict"] == "above_line_rate" and top["limited_by"].startswith("nothing: not a valid")


def test_cpu_sampler_measures_a_busy_thread_and_where_its_memory_sits(tmp_path):
    import subprocess
    import sys

    from peercache.lab.system import cpusample
    out = tmp_path / "cpu.jsonl"
    # the spinning thread says what share of a core it got: on a shared machine (the suite runs in
    # parallel) that is less than one core, and the sampler must see the same share
    spin = ("import time\nx=bytearray(64<<20)\nt=time.time(); c=time.thread_time()\n"
            "while time.time()-t<1.6: pass\nprint((time.thread_time()-c)/(time.time()-t))")
    argv = cpusample.wrap([sys.executable, "-c", spin], str(out), interval=0.1)
    r = subprocess.run(argv, timeout=60, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    got = float(r.stdout.split()[-1])
    samples = cpusample.read_samples(out.read_text())
    use = cpusample.window_usage(samples, samples[2]["t"], samples[-1]["t"])
    assert use is not None and use.samples >= 5
    # one spinning thread: the share of a core it had, and it is the busiest
    assert got > 0.02 and abs(use.busiest_thread - got) < 0.25 and use.busiest_thread <= 1.1, (use, got)
    assert use.cores >= use.busiest_thread - 1e-6
    assert use.memory_node == 0 and sum(use.numa_pages.values()) > (64 << 20) // 4096 // 2
    assert subprocess.run(cpusample.wrap([sys.executable, "-c", "raise SystemExit(3)"], str(out)),
                          timeout=60).returncode == 3


def test_memory_on_another_node_than_the_nic_is_remote_numa():
    import pandas as pd
    runs = pd.DataFrame([{"run_id": "r", "hosts": json.dumps({"consumer": {
        "host": "b", "threads": 384, "nics": [{"name": "mlx5_0", "numa_node": 0}]}})}])
    r = dict(row(20.0, cpu={"consumer": {"cores": 1.0, "busiest_thread": 0.5, "memory_node": 1}}),
             metric="get_throughput", status="ok", tool="peercache-bench", protocol="rdma", run_id="r",
             devices="mlx5_0")
    got = A.attribute(pd.DataFrame([r]), runs, lambda row: None)
    assert got.iloc[0]["limit"] == "remote_numa"
    assert got.iloc[0]["limited_by"] == "remote NUMA (memory on node 1, NIC on node 0)"


@pytest.mark.parametrize("tidy, testbed", [("tests/fixtures/tidy", "fixture-2x-cx7"),
                                           ("data/reference", "peercache-8xcx7-roce")])
def test_no_fraction_of_raw_above_100_percent_in_the_overview(tmp_path, tidy, testbed):
    import re
    rep = report.build_report(ROOT / tidy, tmp_path / "fig", testbed, ROOT / "data/reference/references.yaml")
    fracs = list(rep.overview["% of single-NIC raw limit"])
    assert any(" x ib_read_bw" in f for f in fracs)  # multi-NIC figures are compared with n NICs' worth
    for f in fracs:
        m = re.match(r"(\d+)%", f)
        # never a bare percentage above 100: one above its raw limit says so
        assert m is None or int(m.group(1)) <= 100 or f.endswith("(above raw)"), f
