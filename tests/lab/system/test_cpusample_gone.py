"""The CPU sampler outlives the processes it samples: one of the tree may exit between being listed and being
read. A sampler that raised there (FileNotFoundError on /proc/<pid>/task) ended the client it wrapped with
rc 1, failing a whole-machine point of the two-machine stage."""
import subprocess
import sys

from peercache.lab.system import cpusample


def test_a_process_that_has_exited_has_no_threads_no_children_and_costs_the_sample_nothing():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()                                  # reaped: /proc/<pid> is gone
    assert cpusample._tasks(p.pid) == [] and cpusample._children(p.pid) == []
    assert cpusample.tree(p.pid) == [p.pid]
    s = cpusample.sample(p.pid)
    assert s["procs"] == 0 and s["threads"] == {} and s["cpu_s"] == 0


def test_a_live_process_is_sampled_with_its_threads():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        s = cpusample.sample(p.pid)
        assert s["procs"] == 1 and any(k.startswith(f"{p.pid}/") for k in s["threads"])
    finally:
        p.kill()
        p.wait()
