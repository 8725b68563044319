"""Evidence that a NUMA binding took effect: read from the processes (cpusample), judged (numa.judge),
attached to the point's numa_binding and flagged in its notes (runpoint); the node each side binds to."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from peercache.lab.system import cpusample, numa
from peercache.lab.system import hostinfo as hi

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "lab"
PROC = FIX / "numa"                              # real /proc texts, one node (see its README.md)
RXE2 = FIX / "hosts" / "rxe-virtio-2numa"        # reconstructed 2-node guest (see its README.md)
TWO = {"0": "0-1", "1": "2-3"}                   # that guest's nodes and CPUs


def reading(name: str) -> dict:
    """A binding record as cpusample writes it, from the real texts."""
    return {"pid": 4242, **cpusample.parse_status((PROC / f"{name}.status").read_text()),
            **cpusample.parse_numa_maps((PROC / f"{name}.numa_maps").read_text())}


def on_two_nodes(name: str, cpus: str, mems: str, own_node: int, policy: str | None = None,
                 file_node: int = 0) -> dict:
    """CONSTRUCTED: the real texts rewritten as a process on the 2-node guest shows them: its own memory
    (anonymous, heap, stack, memfd) on ``own_node``, library pages on ``file_node``, ``policy`` on every mapping."""
    status = (PROC / f"{name}.status").read_text()
    status = re.sub(r"Cpus_allowed_list:\t.*", f"Cpus_allowed_list:\t{cpus}", status)
    status = re.sub(r"Mems_allowed_list:\t.*", f"Mems_allowed_list:\t{mems}", status)
    lines = []
    for line in (PROC / f"{name}.numa_maps").read_text().splitlines():
        toks = line.split()
        own = not any(t.startswith("file=/") and not t.startswith("file=/memfd:") for t in toks)
        node = own_node if own else file_node
        toks = [f"N{node}={t.split('=')[1]}" if re.fullmatch(r"N\d+=\d+", t) else t for t in toks]
        if policy:
            toks[1] = policy
        lines.append(" ".join(toks))
    return {"pid": 4242, **cpusample.parse_status(status), **cpusample.parse_numa_maps("\n".join(lines))}


# --- what cpusample reads --------------------------------------------------------------------------

def test_status_and_numa_maps_of_a_bound_process():
    b, u = reading("bound"), reading("unbound")
    assert (b["comm"], b["cpus_allowed_list"], b["mems_allowed_list"]) == ("python3", "0-1", "0")
    assert b["policies"] == ["bind:0"] and u["policies"] == ["default"]
    # the memfd pool is the process's own memory and among its largest mappings
    assert any(m["what"] == "/memfd:peercache-pool (deleted)" and m["pages"] == 2048 and m["nodes"] == {"0": 2048}
               for m in b["largest"])
    assert b["own_kb_per_node"]["0"] >= (8 << 10) + (4 << 10)
    # library pages count in pages_per_node, not in the process's own memory
    assert sum(b["pages_per_node"].values()) * 4 > b["own_kb_per_node"]["0"]


# --- the judge (pure) ---------------------------------------------------------------------------

def test_bound_on_one_node_host_both_ways_and_explicit_says_which():
    b = numa.judge([reading("bound")], 0, {"0": "0-1"})
    assert b["verdict"] == "bound" and b["explicit"] is True
    # One node: an unbound process is on node 0 too. The judge checks what the process shows, so it
    # says bound; explicit (a bind policy on its memory) says no binding was applied.
    u = numa.judge([reading("unbound")], 0, {"0": "0-1"})
    assert u["verdict"] == "bound" and u["explicit"] is False
    assert any("one NUMA node" in w and "no binding was applied" in w for w in u["why"])
    assert numa.judge([reading("unbound")], None, {"0": "0-1"})["verdict"] == "bound"


def test_a_reading_without_memory_policies_does_not_say_a_binding_was_missing():
    # a process read only as it exited (its numa_maps gone) beside one whose reading shows the bind
    unread = dict(reading("bound"), pid=4343, policies=[], own_kb_per_node={}, pages_per_node={})
    j = numa.judge([reading("bound"), unread], 0, {"0": "0-1"})
    assert j["explicit"] is True, j
    assert [p["explicit"] for p in j["processes"]] == [True, None]
    assert numa.judge([unread], 0, {"0": "0-1"})["explicit"] is None      # nothing told either way


def test_bound_to_node_1_of_two_despite_library_pages_on_node_0():
    # numactl --cpunodebind=1 --membind=1: CPUs 2-3, the cpuset still allows memory on 0-1, policy bind:1
    r = on_two_nodes("bound", cpus="2-3", mems="0-1", own_node=1, policy="bind:1", file_node=0)
    j = numa.judge([r], 1, TWO)
    assert j["verdict"] == "bound", j
    assert j["processes"][0]["on_node_fraction"] == 1.0 and j["explicit"] is True


def test_unbound_on_two_nodes():
    r = on_two_nodes("unbound", cpus="0-3", mems="0-1", own_node=0)
    j = numa.judge([r], 1, TWO)
    assert j["verdict"] == "unbound"
    assert any("may run on CPUs 0-3, node 1 has 2-3" in w for w in j["why"])
    assert any("not confined to node 1" in w for w in j["why"])
    assert numa.judge([r], None, TWO)["verdict"] == "unbound"


def test_bound_to_the_wrong_node():
    r = on_two_nodes("bound", cpus="0-1", mems="0-1", own_node=0, policy="bind:0")
    j = numa.judge([r], 1, TWO)
    assert j["verdict"] == "wrong_node" and j["found_node"] == 0
    r = on_two_nodes("unbound", cpus="0-3", mems="0-1", own_node=1, policy="bind:0")
    assert numa.judge([r], 1, TWO)["verdict"] == "wrong_node"
    # CPUs right, no memory policy and its memory on the other node: not bound elsewhere, unbound
    r = on_two_nodes("unbound", cpus="2-3", mems="0-1", own_node=0)
    j = numa.judge([r], 1, TWO)
    assert j["verdict"] == "unbound" and any("0% of its own resident memory" in w for w in j["why"])


def test_cpus_bound_memory_not_confined_is_unbound():
    # numactl --cpunodebind=1 alone: memory follows first touch (here on node 1) but nothing confines it
    r = on_two_nodes("unbound", cpus="2-3", mems="0-1", own_node=1)
    j = numa.judge([r], 1, TWO)
    assert j["verdict"] == "unbound" and any("policy default" in w for w in j["why"])


def test_a_librarys_local_policy_follows_the_cpus():
    # numpy's OpenBLAS sets the policy "local" on its 64 MiB buffer (seen here under numactl --membind=0):
    # local to CPUs 2-3 is node 1
    r = on_two_nodes("bound", cpus="2-3", mems="0-1", own_node=1, policy="bind:1")
    r["policies"] = ["bind:1", "local"]
    j = numa.judge([r], 1, TWO)
    assert j["verdict"] == "bound" and j["explicit"] is True
    u = on_two_nodes("unbound", cpus="0-3", mems="0-1", own_node=1)
    u["policies"] = ["default", "local"]
    assert numa.judge([u], 1, TWO)["verdict"] == "unbound"


def test_cpuset_confinement_counts_as_memory_binding():
    r = on_two_nodes("unbound", cpus="2-3", mems="1", own_node=1)
    assert numa.judge([r], 1, TWO)["verdict"] == "bound"


def test_worst_process_decides_and_unknowns_are_said():
    good = on_two_nodes("bound", cpus="2-3", mems="0-1", own_node=1, policy="bind:1")
    child = on_two_nodes("unbound", cpus="0-3", mems="0-1", own_node=0)
    assert numa.judge([good, child], 1, TWO)["verdict"] == "unbound"
    assert numa.judge([], 1, TWO)["verdict"] == "no_evidence"
    j = numa.judge([good], 1, {"0": "0-1"})              # node 1's CPU list unknown: CPUs not checked
    assert j["verdict"] == "bound" and any("CPUs not checked" in w for w in j["why"])
    no_maps = {k: v for k, v in good.items() if k not in ("own_kb_per_node", "pages_per_node")}
    j = numa.judge([no_maps], 1, TWO)
    assert j["verdict"] == "bound" and any("not read" in w for w in j["why"])


def test_capture_gives_the_node_cpu_lists_the_judge_takes():
    doc = hi.capture(RXE2)
    nodes = {str(n["node"]): n["cpulist"] for n in doc["numa"]["nodes"]}
    assert nodes == TWO


# --- real processes through cpusample ---------------------------------------------------------------

HOLD = ("import mmap, os, time\nfd = os.memfd_create('peercache-pool'); os.ftruncate(fd, 32 << 20)\n"
        "m = mmap.mmap(fd, 32 << 20); m[:] = b'a' * (32 << 20)\nx = bytes(range(256)) * (1 << 16)\n"
        "time.sleep(2.2)\n")


def _sampled(tmp_path: Path, prefix: list[str]) -> list[dict]:
    out = tmp_path / f"cpu{len(prefix)}.jsonl"
    argv = [*prefix, *cpusample.wrap([sys.executable, "-c", HOLD], str(out), interval=0.2)]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if r.returncode != 0 and "set_mempolicy" in r.stderr:
        pytest.skip(f"numactl cannot set a memory policy here: {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr
    return cpusample.read_samples(out.read_text())


def _need_numactl() -> None:
    if shutil.which("numactl") is None:
        print("numactl is not installed (apt-get install numactl): a binding cannot be applied here")
        pytest.skip("numactl not installed (apt-get install numactl)")


def test_real_process_under_numactl_is_judged_bound_to_node_0(tmp_path):
    _need_numactl()
    samples = _sampled(tmp_path, ["numactl", "--cpunodebind=0", "--membind=0"])
    host = cpusample.host_record(samples)
    assert host and "0" in host["nodes"]
    recs = cpusample.bindings(samples)
    assert {r["at"] for r in recs} >= {"settled"}
    py = [r for r in recs if r["comm"].startswith("python")]
    assert py and py[0]["own_kb_per_node"].get("0", 0) >= 32 << 10     # the 32 MiB pool, read from the process
    j = numa.judge(recs, 0, host["nodes"])
    assert j["verdict"] == "bound" and j["node"] == 0 and j["explicit"] is True, j
    # the CPU samples are unchanged by the extra records
    assert cpusample.window_usage(samples, samples[0]["t"], samples[-1]["t"]) is not None


def test_real_process_without_numactl_is_judged_by_the_rules(tmp_path):
    samples = _sampled(tmp_path, [])
    host = cpusample.host_record(samples)
    recs = cpusample.bindings(samples)
    j = numa.judge(recs, 0, host["nodes"])
    assert j["explicit"] is False
    if len(host["nodes"]) == 1:
        # one node: everything is on node 0, bound or not (see numa.py): judged bound, not explicit
        assert j["verdict"] == "bound", j
    else:
        assert j["verdict"] == "unbound", j


def test_a_reading_taken_as_the_process_exited_does_not_undo_its_evidence():
    # Seen on the two-machine testbed: the last reading of a drive process came as it exited, with
    # Cpus_allowed_list still set but numa_maps already empty; its settled reading showed bind:1.
    settled = dict(on_two_nodes("bound", cpus="2-3", mems="0-1", own_node=1, policy="bind:1", file_node=0), at="settled")
    gone = dict(settled, at="last", policies=[], own_kb_per_node={}, pages_per_node={}, largest=[])
    j = numa.judge([settled, gone], 1, TWO)
    assert j["verdict"] == "bound", j
    assert j["processes"][0]["readings"] == ["settled"]
    # a process never read with its mappings (seen: the git a drive runs, read as it exited) is judged
    # by its CPUs, and says so; one whose CPUs are not confined either is unbound
    j = numa.judge([gone], 1, TWO)
    assert j["verdict"] == "bound" and any("judged by its CPUs" in w for w in j["why"]), j
    assert numa.judge([dict(gone, cpus_allowed_list="0-3")], 1, TWO)["verdict"] == "unbound"
