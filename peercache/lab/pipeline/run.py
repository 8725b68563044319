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

from peercache.lab.launch.guest.errors import GuestError
from peercache.lab.launch.guest.machines import ROLES, STALL_S, MachinePair, MachinesSpec

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


def _run_on_pair(pair, name: str, cmd: list[str], retries: int) -> int:
    """Snakemake against the booted ``pair``. When a machine stops answering, the run is stopped and what
    the machine was doing printed; then, ``retries`` times, the pair is rebooted and the same command
    goes on (Snakemake keeps the points already done; the stopped one runs again). Exit 4 when the
    machines stop once more than that."""
    for attempt in range(retries + 1):
        env = {**os.environ, **pair.environment()}
        print(f"testbed {name}: {' '.join(cmd)}", file=sys.stderr, flush=True)
        try:
            return _run(cmd, env, lambda: next((pair.describe(r) for r in ROLES if pair.stalled(r)), None))
        except _Stalled as e:
            print(f"testbed {name}: a machine stopped answering (its qemu runs, the machine inside has written "
                  f"no health for {STALL_S:.0f} s), so the run was stopped:\n{e}\n", file=sys.stderr, flush=True)
        if attempt < retries:
            print(f"testbed {name}: rebooting both machines; the run goes on with the points already done kept "
                  f"(retry {attempt + 1} of {retries})", file=sys.stderr, flush=True)
            pair.restart()
            # A Snakemake that had to be killed leaves its lock on the folder.
            subprocess.run([*cmd, "--unlock"], env={**os.environ, **pair.environment()},
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
    print(f"testbed {name}: the machines stopped {retries + 1} time(s). Run the same command again: it boots a fresh "
          f"pair and Snakemake keeps the points already done (a point that failed meanwhile keeps its failed result: "
          f"delete its folder under the testbed's results to measure it again).", file=sys.stderr, flush=True)
    return 4


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m peercache.lab.pipeline.run", description=__doc__.split("\n\n")[0])
    ap.add_argument("--testbed", required=True, help="testbed file (experiments/testbeds/*.yaml)")
    ap.add_argument("--cores", type=int, default=2, help="Snakemake --cores [2]")
    ap.add_argument("--stall-retries", type=int, default=1, metavar="N",
                    help="on a testbed with machines: times a stopped machine is rebooted and the run goes on "
                         "(finished points kept) before giving up with exit 4 [1]")
    ap.add_argument("extra", nargs=argparse.REMAINDER, help="more Snakemake arguments, after --")
    a = ap.parse_args(argv)
    extra = a.extra[1:] if a.extra[:1] == ["--"] else a.extra
    # experiments validates with jsonschema (~2.3 s to import): the flags are parsed first, so --help
    # and a usage error answer at once
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
        try:
            with MachinePair(spec) as pair:
                rc = _run_on_pair(pair, doc["name"], cmd, a.stall_retries)
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
