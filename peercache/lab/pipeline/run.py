"""``python -m peercache.lab.pipeline.run --testbed FILE [--cores N] [-- SNAKEMAKE ARGS...]``: the pipeline
on a testbed, with the machines it names brought up around it (what ``make run`` calls).

A testbed with a ``machines`` block (``experiments/testbeds/softroce-2host.yaml``) is two QEMU guests:
they are booted (:mod:`peercache.lab.launch.guest.machines`), Snakemake runs here through
``profiles/ssh-testbed`` with the pair's ssh config and slowness in its environment, and both guests
are powered off however the run ends (success, failure, Ctrl-C, SIGTERM). A testbed whose hosts are
SSH hosts runs through the same profile; any other runs Snakemake plainly.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

SSH_PROFILE = "profiles/ssh-testbed"


def uses_ssh(doc: dict[str, Any]) -> bool:
    """True when either host of the testbed is an SSH host."""
    return any(str(h.get("host", "")).startswith("ssh:") for h in (doc.get("hosts") or {}).values())


def snakemake_argv(testbed: str, doc: dict[str, Any], cores: int, extra: list[str]) -> list[str]:
    """The Snakemake command for ``testbed`` (pure): through the ssh profile when its hosts are SSH hosts."""
    argv = [sys.executable, "-m", "snakemake", "--cores", str(cores)]
    if uses_ssh(doc):
        argv += ["--profile", SSH_PROFILE]
    return [*argv, "--config", f"testbed={testbed}", *extra]


def machines_spec(doc: dict[str, Any]):
    """The :class:`MachinesSpec` of a testbed's ``machines`` block (None without one)."""
    from peercache.lab.launch.guest.machines import MachinesSpec
    block = doc.get("machines")
    if block is None:
        return None
    return MachinesSpec(**block)


class _Stop(Exception):
    """SIGTERM, turned into an exception so every cleanup path runs."""


class _Stalled(Exception):
    """A machine of the testbed stopped (its description)."""


def _run(argv: list[str], env: dict[str, str], stalled: Callable[[], str | None] = lambda: None) -> int:
    """Run ``argv``; on Ctrl-C or SIGTERM pass the signal on and wait for it to clean up (bounded).
    ``stalled`` is asked every 5 s; when it answers, the run is interrupted the same way and _Stalled
    raised with its answer."""
    p = subprocess.Popen(argv, env=env)
    try:
        while True:
            try:
                return p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                why = stalled()
                if why is not None:
                    raise _Stalled(why)
    except (KeyboardInterrupt, _Stop, _Stalled) as e:
        p.send_signal(signal.SIGTERM if isinstance(e, _Stop) else signal.SIGINT)
        try:
            p.wait(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        raise


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m peercache.lab.pipeline.run", description=__doc__.split("\n\n")[0])
    ap.add_argument("--testbed", required=True, help="testbed file (experiments/testbeds/*.yaml)")
    ap.add_argument("--cores", type=int, default=2, help="Snakemake --cores [2]")
    ap.add_argument("extra", nargs=argparse.REMAINDER, help="more Snakemake arguments, after --")
    a = ap.parse_args(argv)
    extra = a.extra[1:] if a.extra[:1] == ["--"] else a.extra
    from peercache.lab.pipeline import experiments
    try:
        doc = experiments.load_testbed(a.testbed).doc
        spec = machines_spec(doc)
    except (experiments.DefinitionError, ValueError) as e:
        print(f"testbed: {e}", file=sys.stderr)
        return 2
    cmd = snakemake_argv(a.testbed, doc, a.cores, extra)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(_Stop()))
    try:
        if spec is None:
            return _run(cmd, dict(os.environ))
        from peercache.lab.launch.guest.errors import GuestError
        from peercache.lab.launch.guest.machines import ROLES, STALL_S, MachinePair
        try:
            with MachinePair(spec) as pair:
                env = {**os.environ, **pair.environment()}
                print(f"testbed {doc['name']}: {' '.join(cmd)}", file=sys.stderr, flush=True)
                try:
                    rc = _run(cmd, env, lambda: next((pair.describe(r) for r in ROLES if pair.stalled(r)), None))
                except _Stalled as e:
                    print(f"testbed {doc['name']}: a machine stopped answering (its qemu runs, the machine inside "
                          f"has written no health for {STALL_S:.0f} s), so the run was stopped:\n{e}\n"
                          f"Run the same command again: it boots a fresh pair and Snakemake keeps the points "
                          f"already done (a point that failed meanwhile keeps its failed result: delete its folder "
                          f"under the testbed's results to measure it again).", file=sys.stderr, flush=True)
                    rc = 4
            print(f"testbed {doc['name']}: both machines powered off", file=sys.stderr, flush=True)
            return rc
        except GuestError as e:
            print(f"testbed {doc['name']}: the machines could not run: {e}", file=sys.stderr)
            return 3
    except KeyboardInterrupt:
        print("testbed: interrupted; machines powered off", file=sys.stderr)
        return 130
    except _Stop:
        print("testbed: terminated; machines powered off", file=sys.stderr)
        return 143


if __name__ == "__main__":
    sys.exit(main())
