"""The evidence beyond a thread's CPU time: how long a thread waited in a run queue for a CPU (schedstat),
and what the whole machine's CPUs did (/proc/stat: busy, interrupts and softirqs, steal, ksoftirqd)."""
import subprocess
import sys

import pytest

from peercache.lab.system import cpusample

# /proc/stat of this 2-CPU VM, its first lines as read (2026-12-07); USER_HZ 100
PROC_STAT = """cpu  6703315 9712 1213863 3132336 26580 0 186833 24919 0 0
cpu0 3351657 4856 606931 1566168 13290 0 93416 12459 0 0
cpu1 3351658 4856 606932 1566168 13290 0 93417 12460 0 0
intr 1 2 3
ctxt 123
"""


def test_proc_stat_gives_busy_softirq_steal_and_the_cpus():
    m = cpusample.parse_proc_stat(PROC_STAT)
    hz = cpusample.CLK_TCK
    # busy: user + nice + system + irq + softirq; idle, iowait and steal are not busy
    assert m["busy"] == pytest.approx((6703315 + 9712 + 1213863 + 0 + 186833) / hz, abs=0.01)
    assert m["softirq"] == pytest.approx(186833 / hz, abs=0.01)
    assert m["steal"] == pytest.approx(24919 / hz, abs=0.01) and m["cpus"] == 2
    with pytest.raises(ValueError, match="no 'cpu' line"):
        cpusample.parse_proc_stat("intr 1 2\n")


def test_the_machine_over_a_window_is_the_difference_of_two_readings():
    a = {"busy": 100.0, "softirq": 10.0, "steal": 1.0, "ksoftirqd": 2.0, "total": 300.0, "cpus": 2}
    b = {"busy": 103.8, "softirq": 11.2, "steal": 1.1, "ksoftirqd": 2.4, "total": 304.0, "cpus": 2}
    u = cpusample.machine_usage(a, b, 2.0, "x")         # the boot id: the file's host record
    assert u == {"cpus": 2, "busy_cores": 1.9, "softirq_cores": 0.6, "ksoftirqd_cores": 0.2, "steal_cores": 0.05,
                 "boot": "x"}
    assert cpusample.machine_usage(a, None, 2.0) is None


def test_the_thread_runnable_longest_counts_its_wait_for_a_cpu():
    def s(t, cpu, wait):
        return {"t": t, "threads": {"1/1": cpu, "1/2": 0.0}, "waits": {"1/1": wait, "1/2": 0.0}}
    # on a CPU 0.5 s of 1 s and waiting 0.45 s for one
    use = cpusample.window_usage([s(10.0, 1.0, 2.0), s(11.0, 1.5, 2.45)], 10.0, 11.0)
    assert use.busiest_thread == pytest.approx(0.5) and use.runnable == pytest.approx(0.95)
    assert use.runnable_wait == pytest.approx(0.45) and use.runnable_thread == "1/1"
    assert use.as_dict()["runnable"] == 0.95
    # samples of a sampler without the reading have no runnable, not a made-up one
    old = [{"t": 10.0, "threads": {"1/1": 1.0}}, {"t": 11.0, "threads": {"1/1": 1.5}}]
    assert cpusample.window_usage(old, 10.0, 11.0).runnable is None


def test_two_spinning_processes_on_one_cpu_each_wait_for_it_about_half_the_time(tmp_path):
    """Measured, not assumed: both spinners are bound to one CPU, so each is runnable the whole window and on
    the CPU about half of it; the sampler must see the other half as run-queue wait."""
    out = tmp_path / "cpu.jsonl"
    cpu = sorted(cpusample.os.sched_getaffinity(0))[0]
    # two processes, not two threads of one: Python threads would wait for the GIL asleep, not in a run queue
    spin = (f"import os, time\nos.sched_setaffinity(0, {{{cpu}}})\nchild = os.fork()\n"
            "t = time.time()\nwhile time.time() - t < 2.0: pass\n"
            "if child: os.waitpid(child, 0)\nelse: os._exit(0)\n")
    argv = cpusample.wrap([sys.executable, "-c", spin], str(out), interval=0.1)
    r = subprocess.run(argv, timeout=60, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    samples = [x for x in cpusample.read_samples(out.read_text()) if "threads" in x]
    use = cpusample.window_usage(samples, samples[3]["t"], samples[-2]["t"])
    assert use is not None and use.runnable is not None, "no run-queue reading (schedstat) in the samples"
    # other work on the machine takes some of the CPU too: runnable stays near 1, the wait near a half or more
    assert use.runnable >= 0.85, use.as_dict()
    assert use.runnable_wait >= 0.3 and use.busiest_thread <= 0.7, use.as_dict()
    assert use.machine and use.machine["cpus"] >= 1 and use.machine["busy_cores"] > 0.5, use.as_dict()


def test_groups_of_one_point_combine_their_waits_and_keep_the_machine():
    """A raw run of several iperf3 pairs is several sampled groups: the point's evidence is the thread runnable
    longest of all of them and the one machine they ran on (it was "not measured" before)."""
    m = {"cpus": 2, "busy_cores": 1.96, "softirq_cores": 0.4, "ksoftirqd_cores": 0.0, "steal_cores": 0.0, "boot": "b"}
    got = cpusample.combine({
        "p0": {"consumer": {"cores": 0.3, "busiest_thread": 0.2, "busiest": "1/1", "runnable": 0.5,
                            "runnable_thread": "1/1", "runnable_wait": 0.3, "wait_cores": 0.3, "machine": m}},
        "p1": {"consumer": {"cores": 0.4, "busiest_thread": 0.35, "busiest": "2/2", "runnable": 0.92,
                            "runnable_thread": "2/2", "runnable_wait": 0.57, "wait_cores": 0.6, "machine": m}}})
    c = got["consumer"]
    assert c["cores"] == 0.7 and c["busiest_thread"] == 0.35 and c["groups"] == 2
    assert (c["runnable"], c["runnable_thread"], c["runnable_wait"], c["wait_cores"]) == (0.92, "2/2", 0.57, 0.9)
    assert c["machine"] == m
