"""``python -m peercache.lab.launch.guest [options] -- COMMAND...``: run one command in the Soft-RoCE guest.

Exit status: the command's own; 124 when the guest ran past ``--timeout``
and was killed; 3 when the guest cannot run here (0 with ``--if-available``,
after saying why); 1 when the guest failed in another way.
"""
from __future__ import annotations

import argparse
import shlex
import sys

from peercache.lab.launch.guest import runner
from peercache.lab.launch.guest.errors import GuestError, GuestTimeout, GuestUnavailable
from peercache.lab.launch.guest.topology import MAX_RAILS, Topology

EXIT_TIMEOUT, EXIT_UNAVAILABLE = 124, 3


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m peercache.lab.launch.guest",
                                description="Run COMMAND as root in a QEMU guest with Debian's kernel and Soft-RoCE "
                                            "devices (rxe_a<i> on the producer end, rxe_b<i> on the consumer end "
                                            "of each rail); the current folder is shared read-write.")
    p.add_argument("--rails", type=int, default=2, choices=range(0, MAX_RAILS + 1), metavar=f"0..{MAX_RAILS}",
                   help="veth pairs with an rxe device on each end (default 2)")
    p.add_argument("--mtu", type=int, default=1500, help="netdev MTU of the rails (default 1500: rxe MTU 1024)")
    p.add_argument("--cluster-hosts", type=int, default=0, metavar="N",
                   help="N hosts on one bridge, host i with rxe_h<i> at 198.18.100.<i> (0: none; 2..16)")
    p.add_argument("--cpus", type=int, default=2, help="guest CPUs (default 2)")
    p.add_argument("--memory", type=int, default=4096, help="guest memory in MiB (default 4096)")
    p.add_argument("--accel", choices=("auto", "kvm", "tcg"), default="auto",
                   help="auto: KVM when it really boots a guest here (probed once, cached), else TCG")
    p.add_argument("--timeout", type=float, default=1200.0,
                   help="seconds before the guest is killed and the run fails (default 1200)")
    p.add_argument("--if-available", action="store_true",
                   help="when this machine cannot run the guest, say why and exit 0 instead of 3")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command (after --)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        build_parser().error("no command given (put it after --)")
    if args.cpus < 1 or args.memory < 512 or args.timeout <= 0:
        build_parser().error("--cpus must be >= 1, --memory >= 512 MiB and --timeout > 0")
    try:
        topo = Topology(rails=args.rails, mtu=args.mtu, cluster_hosts=args.cluster_hosts)
    except ValueError as e:
        build_parser().error(str(e))
    spec = runner.GuestSpec(cpus=args.cpus, memory_mib=args.memory, accel=args.accel)
    text = cmd[0] if len(cmd) == 1 else shlex.join(cmd)
    try:
        res = runner.run(text, topology=topo, spec=spec, timeout=args.timeout,
                         stream=lambda line: (sys.stdout.write(line), sys.stdout.flush()))
    except GuestUnavailable as e:
        print(f"peercache guest: {e}", file=sys.stderr)
        if args.if_available:
            print("peercache guest: stage skipped (--if-available): the RDMA tests did not run here",
                  file=sys.stderr)
            return 0
        return EXIT_UNAVAILABLE
    except GuestTimeout as e:
        print(f"peercache guest: FAILED: {e}", file=sys.stderr)
        return EXIT_TIMEOUT
    except GuestError as e:
        print(f"peercache guest: FAILED: {e}", file=sys.stderr)
        return 1
    print(f"peercache guest: {text!r} exited {res.returncode} ({res.accel}, kernel {res.kernel}, "
          f"boot {res.boot_s:.1f} s, total {res.wall_s:.1f} s)", file=sys.stderr)
    return res.returncode


if __name__ == "__main__":
    sys.exit(main())
