"""The group kind (whole_machine): when a run is run again on emulated hosts."""
from peercache.lab.pipeline.points import group

LOST = ("group run failed: client on ssh:pc-consumer exited with rc 1; stderr: 'no rail can carry these reads: "
        "rxe1: up, but READs to this peer failed on it (no completion within the poll timeout)")
EMPTY = "group rxe1: drive failed: no batch completed inside the 4 s measurement window; nothing was measured"


def test_a_run_that_lost_its_reads_on_an_emulated_wire_runs_once_more():
    assert group.run_again(LOST, 16.0, 1) and group.run_again(EMPTY, 16.0, 1)
    assert not group.run_again(LOST, 16.0, group.GROUP_ATTEMPTS_EMULATED)     # then it fails


def test_real_hardware_other_faults_and_success_run_once():
    assert not group.run_again(LOST, 1.0, 1)                                    # real hardware: at once
    assert not group.run_again("group rxe0: serve was not ready in 960 s", 16.0, 1)
    assert not group.run_again(None, 16.0, 1)
