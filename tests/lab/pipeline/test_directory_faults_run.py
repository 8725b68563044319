"""The directory_faults scenario end to end on a network-namespace pair (the local testbed's shape, a pair of
its own): one reduced point per form of the directory, its fault during a verifying read. Each asserts the
hit rate came back to its level before the fault within the form's bound, 0 wrong pages, every drive's
longest stall within its fault bound, and what the directory lost came back. This is make test's reduced
run; `make run` runs the scenario's whole grid (every fault of every form) on the local testbed."""
from pathlib import Path

import pytest
import yaml

from conftest import scaled
from peercache.lab.launch import netns
from peercache.lab.launch import redis as redis_launch
from peercache.lab.pipeline import experiments, runpoint
from peercache.lab.pipeline.points import directory_faults as df

ROOT = Path(__file__).resolve().parents[3]
ok, why = netns.available()
redis_ok, redis_why = redis_launch.available()
pytestmark = [pytest.mark.skipif(not ok, reason=f"the testbed's hosts are network namespaces: {why}"),
              pytest.mark.skipif(not redis_ok, reason=redis_why)]

#: Per form: its fault, the window (s) and the bound on the hit rate's recovery from the fault (s, on this
#: machine before its slowness): embedded, the restart's pause, meta's start and the members' next heartbeat
#: (1 s) that registers them again and republishes; redis, the restart and that heartbeat; sentinel, the
#: sentinels' down-after (1 s), their vote and the promotion; redis-cluster, the node timeout (2 s), the
#: replica's election and the clients' new slot map.
FORMS = {"embedded": ("restart", 5, df.DOWN_S + 2.5), "redis": ("restart", 4, 2.5),
         "sentinel": ("kill", 7, 5.0), "redis-cluster": ("kill", 8, 6.0)}
WORKING_SET = 64


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Run one reduced point of a form on a namespace pair of its own (one pair for the module)."""
    out = tmp_path_factory.mktemp("dirfaults")
    doc = yaml.safe_load((ROOT / "experiments/testbeds/local.yaml").read_text())
    doc.update(name="dirfaults", netns_pair={"tag": "pcdfx", "index": 74}, results=str(out / "dirfaults"),
               hosts={"producer": {"host": "netns:pcdfxa", "address": "198.18.74.1"},
                      "consumer": {"host": "netns:pcdfxb", "address": "198.18.74.2"}}, base_port=23500)
    path = out / "dirfaults.yaml"
    path.write_text(yaml.safe_dump(doc))
    tb = experiments.load_testbed(path, experiments.load_scenarios())
    with runpoint.testbed_hosts(tb) as th:
        def one(form: str, protocol: str = "tcp"):
            fault, window, _ = FORMS[form]
            part = {"kind": "directory_faults", "protocol": protocol, "form": [form], "fault": [fault],
                    "working_set": WORKING_SET,
                    "consumers": 1, "duration": window, "warmup": 0.3, "fault_at": 0.2}
            pt, = experiments.expand_part("directory_faults", "reduced", part, [])
            rows = runpoint.run_point(tb, pt, 0, out / pt.name / "result.json", hosts=th, quiet=True)
            return pt, rows, out / pt.name
        yield one


@pytest.mark.parametrize("form,protocol", [*((f, "tcp") for f in FORMS), ("sentinel", "shm")])
def test_each_form_comes_back_from_its_fault_within_its_bound_without_a_wrong_page(run, form, protocol):
    """Every form under tcp reads; one under shm (the same directory, another data path)."""
    pt, rows, folder = run(form, protocol)
    assert pt.params["protocol"] == protocol
    failed = [f"{r.tool} {r.metric}: {r.reason}" for r in rows if r.status == "failed"]
    assert not failed, failed
    by = {(r.metric, r.side): r for r in rows}
    un, rec = by[("unavailable_s", "aggregate")], by[("recovery_s", "aggregate")]
    summary = (f"{form} {FORMS[form][0]}: unavailable {un.value} s, recovered {rec.value} s "
               f"({rec.reason or 'ok'}); stretches {un.extra.get('outages')}; hits per bucket "
               + " ".join(f"{b[0]:.1f}:{b[1]}" for b in un.extra["timeline"]))
    print(summary)
    assert by[("verify_failures", "aggregate")].value == 0, summary
    assert un.extra["level_before"] == 1.0 and un.extra["timeline"], summary
    assert rec.status == "ok" and rec.value <= scaled(FORMS[form][2]), summary
    assert 0 < un.value <= rec.value + 0.1, summary
    stall = by[("max_stall_s", "per_host")]
    assert stall.extra["within_bound"], (stall.value, stall.extra)
    lost, back = by[("entries_lost", "aggregate")], by[("entries_republished", "aggregate")]
    assert lost.status == back.status == "ok", (lost.reason, back.reason)
    if form in ("embedded", "redis"):       # a restarted directory knows nothing: every entry published again
        assert lost.value == back.value == 2 * WORKING_SET, (lost.value, back.value)
        assert all(n >= 1 for n in lost.extra["registered_again"].values()), lost.extra
    else:                                   # what a failover lost (a registration that expired) came back
        assert back.value >= lost.value, (lost.value, back.value, lost.extra)
    assert lost.extra["end"] == 2 * WORKING_SET
    assert (folder / "consumer1" / "drive.json").exists() and (folder / "dirwatch.json").exists()
    assert (folder / "events.json").exists() and (folder / "watch.log").exists()
