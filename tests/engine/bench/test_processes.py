"""peercache.bench.processes: how the bench's tools end their child processes, and say how a child ended."""
import multiprocessing as mp
import signal
import time

from peercache.bench.processes import end_all, exit_text

CTX = mp.get_context("fork")


def _exits_soon() -> None:
    time.sleep(0.2)


def _sleeps() -> None:
    time.sleep(60)


def _ignores_sigterm() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(60)


def started(*targets):
    procs = [CTX.Process(target=t, daemon=True) for t in targets]
    for p in procs:
        p.start()
    return procs


def test_each_child_is_given_the_grace_then_sigterm_then_sigkill():
    procs = started(_exits_soon, _sleeps, _ignores_sigterm)
    t0 = time.monotonic()
    end_all(procs, 1.0, last=0.5)
    took = time.monotonic() - t0
    assert not any(p.is_alive() for p in procs)
    assert procs[0].exitcode == 0                                  # ended on its own within the grace
    assert procs[1].exitcode == -signal.SIGTERM                    # asked
    assert procs[2].exitcode == -signal.SIGKILL                    # told
    assert 1.0 <= took < 1.0 + 0.5 + 0.5 + 2.0                     # the grace in all, not per child
    assert [exit_text(p) for p in procs] == ["exit status 0", "killed by SIGTERM", "killed by SIGKILL"]


def test_without_terminate_a_child_still_running_is_killed():
    procs = started(_sleeps)
    end_all(procs, 0.2, terminate=False, last=0.5)
    assert procs[0].exitcode == -signal.SIGKILL


def test_children_already_gone_cost_nothing():
    procs = started(_exits_soon)
    procs[0].join()
    t0 = time.monotonic()
    end_all(procs, 5.0)
    assert time.monotonic() - t0 < 1.0 and procs[0].exitcode == 0
