"""The order points run in: a compared scenario (engines) runs each point at least three times, repetition by
repetition, a cell's engines back to back in an order that changes every repetition (issue 40); Snakemake is
held to it by each job's input, the result before it."""
import pytest

from peercache.lab.pipeline.plan import Plan, balanced_order, repetitions


@pytest.fixture(scope="module")
def plan():
    return Plan("experiments/testbeds/local.yaml")


def test_a_compared_scenario_runs_every_point_three_times_though_the_testbed_asks_once(plan):
    assert plan.testbed["repetitions"] == 1 and repetitions(plan.scenarios["engines"], 1) == 3
    reps = {}
    for p, k in plan.order():
        reps.setdefault((p.scenario, p.name), []).append(k)
    compared = {s for s, sc in plan.scenarios.items() if sc.get("repetitions", 1) >= 3}
    assert {"engines", "single_nic", "multi_rail", "msgsize_sweep"} <= compared
    eng = {n: r for (s, n), r in reps.items() if s in compared}
    assert eng and all(r == [0, 1, 2] for r in eng.values()), eng
    assert all(r == [0] for (s, _), r in reps.items() if s not in compared)
    assert len(plan.result_paths()) == len(plan.expected()) == sum(len(r) for r in reps.values())


def test_no_engine_runs_after_the_same_neighbour_in_two_repetitions(plan):
    order = [(p, k) for p, k in plan.order() if p.scenario == "engines"]
    seen = set()
    for (a, ka), (b, kb) in zip(order, order[1:]):
        if ka == kb and a.spec.cell(a.params) is not None and a.spec.cell(a.params) == b.spec.cell(b.params):
            assert (a.kind, b.kind, a.spec.cell(a.params)) not in seen, (a.name, b.name)
            seen.add((a.kind, b.kind, a.spec.cell(a.params)))
    assert len(seen) == 2 * 3 * 3      # two cells, three neighbours a repetition, three repetitions
    # the raw runs, of no cell, open each repetition
    firsts = [p.kind for p, k in order if k == 1][:2]
    assert firsts == ["iperf3", "iperf3"]


def test_each_job_of_a_rotating_scenario_waits_for_the_one_before_it_and_no_other_scenario_is_chained(plan):
    order = plan.order()
    rotating = {s for s, sc in plan.scenarios.items() if sc.get("rotate")}
    assert {"engines", "single_nic"} <= rotating and "directory_faults" not in rotating
    for (prev, kp), (p, k) in zip(order, order[1:]):
        want = [plan.result_path(prev, kp)] if p.scenario == prev.scenario and p.scenario in rotating else []
        assert plan.before(p.scenario, p.name, k) == want
    first = next(x for x in order if x[0].scenario == "engines")
    assert plan.before(first[0].scenario, first[0].name, first[1]) == []


@pytest.mark.parametrize("n", [2, 4, 6])
def test_the_balanced_order_puts_each_point_after_each_other_once(n):
    rows = [balanced_order(n, k) for k in range(n)]
    assert all(sorted(r) == list(range(n)) for r in rows)
    pairs = [(r[i], r[i + 1]) for r in rows for i in range(n - 1)]
    assert len(pairs) == len(set(pairs)) == n * (n - 1)


def test_a_testbed_whose_repetitions_are_exact_runs_every_point_that_many_times(plan):
    """softroce-2host (make test's two-machine stage) checks the pipeline runs: its one repetition holds for
    the compared scenarios too."""
    assert repetitions(plan.scenarios["single_nic"], 1) == 3
    assert repetitions(plan.scenarios["single_nic"], 1, exact=True) == 1
    # the testbeds make test's two-machine stage runs: the pair's own, and the fixture test_twohost uses
    for path in ("experiments/testbeds/softroce-2host.yaml", "tests/fixtures/pipeline/twohost.yaml"):
        two = Plan(path)
        assert two.testbed.get("repetitions_exact") is True, path
        assert {k for _, k in two.order()} == {0}, path
