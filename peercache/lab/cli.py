"""``peercache-lab``: the lab's command line.

Each subcommand is a ``register(subparsers)`` function that adds its parser
and sets ``func`` (called with the parsed args, returns the exit status).
Another module adds a command by appending its register function to
:data:`REGISTRARS` (or calling :func:`add_command`) before :func:`main` runs.

Exit status: 0 ok; 1 a file could not be read or written; 2 the input could
not be parsed (the parse error, naming the line, on stderr) or bad usage;
3 the saved output is of a failed run (the tool error on stderr). ``compare``:
0 nothing regressed, 1 something regressed beyond the tolerance, 2 a run not
found, no common point or bad usage.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any, Callable

from peercache import atomic
from peercache.lab import jupyter
from peercache.lab.errors import ParseError, ToolError
from peercache.lab.system import hostinfo
from peercache.lab.tools import iperf3, perfstat, perftest

EXIT_OK, EXIT_IO, EXIT_PARSE, EXIT_TOOL = 0, 1, 2, 3


def _read(path: str) -> str:
    return Path(path).read_text(errors="replace")


def _print_rows(rows: list[Any]) -> None:
    for r in rows:
        print(json.dumps(dataclasses.asdict(r), sort_keys=True, default=str))


# --- hostinfo -------------------------------------------------------------------

def _run_hostinfo(args: argparse.Namespace) -> int:
    doc = hostinfo.capture(args.root)
    if args.summary:
        doc = hostinfo.summary(doc)
    text = json.dumps(doc, indent=1, sort_keys=False, default=str)
    if args.out:
        try:
            atomic.write_text(args.out, text + "\n")
        except OSError as e:
            print(f"peercache-lab hostinfo: cannot write {args.out}: {e}", file=sys.stderr)
            return EXIT_IO
    else:
        print(text)
    return EXIT_OK


def register_hostinfo(sub: argparse._SubParsersAction) -> None:
    """Add ``hostinfo``: capture the testbed as JSON."""
    p = sub.add_parser("hostinfo", help="capture this host's testbed description as JSON")
    p.add_argument("--root", default="/", help="read sysfs/proc under this root (a fixture tree)")
    p.add_argument("--out", help="write the JSON here instead of stdout")
    p.add_argument("--summary", action="store_true", help="only the short meta-block summary")
    p.set_defaults(func=_run_hostinfo)


# --- parse ----------------------------------------------------------------------

def _rows_perftest(text: str, args: argparse.Namespace, ctx: dict[str, Any]) -> list[Any]:
    if args.json:
        res = perftest.parse_json(text, bw_unit=args.bw_unit, source=args.file)
        if args.bw_unit is None:
            raise ParseError("perftest-json", "the --out_json file does not record its unit; "
                             "pass --bw-unit 'Gb/sec' (run with --report_gbits) or 'MiB/sec'",
                             source=args.file)
    else:
        try:
            res = perftest.parse_output(text, source=args.file)
        except ParseError:
            err = perftest.classify_failure(text, None, ctx.get("host", ""), args.tool_name)
            if err is not None:
                raise err from None
            raise
    return perftest.to_rows(res, **ctx)


def _rows_perfstat(text: str, args: argparse.Namespace, ctx: dict[str, Any]) -> list[Any]:
    fmt = args.format
    if fmt == "auto":
        counters = perfstat.parse(text, source=args.file, sep=args.sep)
    elif fmt == "csv":
        counters = perfstat.parse_csv(text, sep=args.sep, source=args.file)
    elif fmt == "json":
        counters = perfstat.parse_json(text, source=args.file)
    else:
        counters = perfstat.parse_text(text, source=args.file)
    return perfstat.to_rows(counters, **ctx)


def _rows_iperf3(text: str, args: argparse.Namespace, ctx: dict[str, Any]) -> list[Any]:
    return iperf3.to_rows(iperf3.parse_json(text, source=args.file, host=ctx.get("host", "")), **ctx)


_PARSERS: dict[str, Callable[[str, argparse.Namespace, dict[str, Any]], list[Any]]] = {
    "perftest": _rows_perftest, "perfstat": _rows_perfstat, "iperf3": _rows_iperf3,
}


def _run_parse(args: argparse.Namespace) -> int:
    try:
        text = _read(args.file)
    except OSError as e:
        print(f"peercache-lab parse: cannot read {args.file}: {e.strerror or e}", file=sys.stderr)
        return EXIT_IO
    ctx: dict[str, Any] = {k: v for k, v in (("experiment", args.experiment),
                                             ("scenario", args.scenario), ("run_id", args.run_id),
                                             ("host", args.host), ("side", args.side)) if v}
    try:
        rows = _PARSERS[args.tool](text, args, ctx)
    except ParseError as e:
        print(f"peercache-lab parse {args.tool}: {e}", file=sys.stderr)
        return EXIT_PARSE
    except ToolError as e:
        print(f"peercache-lab parse {args.tool}: the saved output is of a failed run: {e}",
              file=sys.stderr)
        return EXIT_TOOL
    _print_rows(rows)
    return EXIT_OK


def register_parse(sub: argparse._SubParsersAction) -> None:
    """Add ``parse perftest|perfstat|iperf3 FILE``: saved tool output -> tidy rows (JSON lines)."""
    p = sub.add_parser("parse", help="turn a saved tool output into tidy rows, one JSON per line")
    tools = p.add_subparsers(dest="tool", required=True, metavar="TOOL")
    for name, help_text in (("perftest", "ib_read_bw / ib_write_bw / ib_send_bw output"),
                            ("perfstat", "perf stat -x CSV, -j JSON, or its default report"),
                            ("iperf3", "iperf3 -J JSON")):
        t = tools.add_parser(name, help=help_text)
        t.add_argument("file", help="the saved output")
        for opt in ("experiment", "scenario", "run-id", "host", "side"):
            t.add_argument(f"--{opt}", help=f"{opt} field of every row")
        if name == "perftest":
            t.add_argument("--json", action="store_true", help="FILE is an --out_json file")
            t.add_argument("--bw-unit", choices=["Gb/sec", "MiB/sec", "MB/sec"],
                           help="unit of an --out_json file (it does not record one)")
            t.add_argument("--tool-name", default="perftest",
                           help="tool name for failure messages (e.g. ib_read_bw)")
        if name == "perfstat":
            t.add_argument("--format", choices=["auto", "csv", "json", "text"], default="auto")
            t.add_argument("--sep", default=",", help="the -x separator of a CSV file")
    p.set_defaults(func=_run_parse)


# --- compare --------------------------------------------------------------------

def _run_compare(args: argparse.Namespace) -> int:
    # pandas and matplotlib (~3.8 s to import): only compare needs them, every other subcommand starts at once
    from peercache.lab.analysis import compare, explore

    roots = args.roots or explore.DEFAULT_ROOTS
    try:
        a = explore.load_run(args.run_a, roots, args.references or None)
        b = explore.load_run(args.run_b, roots, args.references or None)
        c = compare.compare_runs(a, b, args.tolerance, args.match)
    except (LookupError, ValueError, FileNotFoundError) as e:
        # NoCommonPoints is a ValueError: it says which keys each run has and what to do.
        print(f"peercache-lab compare: {e}", file=sys.stderr)
        return EXIT_PARSE
    text = compare.dumps(c) if args.format == "json" else compare.comparison_markdown(c)
    if args.out:
        try:
            atomic.write_text(args.out, text + "\n")
        except OSError as e:
            print(f"peercache-lab compare: cannot write {args.out}: {e}; pick a writable path", file=sys.stderr)
            return EXIT_PARSE
    else:
        try:
            print(text, flush=True)
        except BrokenPipeError:      # `| head`: the reader has what it wanted; the exit status still says it
            sys.stdout = None
    for line in compare.headline(c)[-1:]:
        print(f"peercache-lab compare: {line}", file=sys.stderr)
    return 1 if len(c.regressions) else EXIT_OK


def register_compare(sub: argparse._SubParsersAction) -> None:
    """Add ``compare RUN_A RUN_B``: run B against run A point by point; exit 1 on a regression."""
    p = sub.add_parser("compare", help="compare two runs point by point (exit 1: something regressed)",
                       description="Compare run B with run A (the baseline) on their common points: B/A ratio, "
                                   "verdict changes, regressions beyond the tolerance. A run is a folder of tidy "
                                   "rows (data/tidy/<testbed>, data/reference/<name>, results/bench/<run>) or its "
                                   "name under those. Exit status: 0 nothing regressed; 1 something regressed "
                                   "beyond the tolerance; 2 a run not found, no common point, or bad usage.")
    p.add_argument("run_a", metavar="RUN_A", help="the baseline run (name or folder)")
    p.add_argument("run_b", metavar="RUN_B", help="the run checked against it (name or folder)")
    p.add_argument("--tolerance", type=float, default=0.05,
                   help="fraction B may be worse than A before it counts as regressed [%(default)s]")
    p.add_argument("--format", choices=["markdown", "json"], default="markdown", help="output [%(default)s]")
    p.add_argument("--match", choices=["point", "knobs"], default="point",
                   help="key rows by point name (same scenario file) or by knob values [%(default)s]")
    p.add_argument("--references", default="data/reference/references.yaml",
                   help="references YAML for the verdicts ('' for none) [%(default)s]")
    p.add_argument("--roots", action="append", metavar="DIR",
                   help="folder holding runs, repeatable [data/tidy, data/reference, results/bench]")
    p.add_argument("--out", help="write the comparison here instead of stdout")
    p.set_defaults(func=_run_compare)


# --- jupyter --------------------------------------------------------------------

def register_jupyter(sub: argparse._SubParsersAction) -> None:
    """Add ``jupyter``: JupyterLab on notebooks/ with the "PeerCache Lab" kernel (what ``make lab`` runs)."""
    p = sub.add_parser("jupyter", help="JupyterLab on notebooks/, kernel \"PeerCache Lab\", 127.0.0.1 + token")
    jupyter.add_arguments(p)
    p.set_defaults(func=jupyter.run)


#: Subcommand registrars, in help order.
REGISTRARS: list[Callable[[argparse._SubParsersAction], None]] = [register_hostinfo, register_parse,
                                                                 register_compare, register_jupyter]


def add_command(register: Callable[[argparse._SubParsersAction], None]) -> None:
    """Add a subcommand registrar (another module's ``register(subparsers)``)."""
    if register not in REGISTRARS:
        REGISTRARS.append(register)


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser with every registered subcommand."""
    parser = argparse.ArgumentParser(prog="peercache-lab", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for register in REGISTRARS:
        register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``peercache-lab`` console script."""
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
