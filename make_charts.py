#!/usr/bin/env python3
"""Regenerate figures/ from data/tidy/ (and the published baselines in data/reference/).

    python make_charts.py [--testbed NAME ...] [--out DIR] [--format png,svg]

Thin wrapper: the harness is peercache/lab/analysis/charts.py, each scenario's figures are in its module
under peercache/lab/analysis/scenarios/.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and write the charts; returns the exit status."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--testbed", nargs="+", action="extend", default=[], metavar="NAME",
                    help="testbed(s) to draw (default: every testbed in the tidy and reference folders)")
    ap.add_argument("--out", default=str(ROOT / "figures"), help="output folder (default: figures/)")
    ap.add_argument("--format", default="png,svg", help="comma list of png,svg (default: png,svg)")
    ap.add_argument("--tidy-dir", default=str(ROOT / "data" / "tidy"), help="tidy tables (default: data/tidy/)")
    ap.add_argument("--reference-dir", default=str(ROOT / "data" / "reference"),
                    help="published baselines (default: data/reference/)")
    ap.add_argument("--references", default=None,
                    help="references YAML for verdicts and line rates "
                         "(default: <reference-dir>/references.yaml when present)")
    args = ap.parse_args(argv)

    from peercache.lab.analysis import charts, collect
    from peercache.lab.analysis.references import load_references

    try:
        found = collect.find_testbeds(args.tidy_dir, args.reference_dir)
    except ValueError as e:
        print(f"make_charts: {e}", file=sys.stderr)
        return 2
    if args.testbed:
        missing = [t for t in args.testbed if t not in found]
        if missing:
            print(f"make_charts: no data for testbed(s) {', '.join(missing)} under {args.tidy_dir} or "
                  f"{args.reference_dir}; known: {', '.join(sorted(found)) or 'none'}", file=sys.stderr)
            return 2
        found = {t: found[t] for t in args.testbed}
    if not found:
        print(f"make_charts: no testbeds under {args.tidy_dir} or {args.reference_dir}; "
              "run the collect notebook first", file=sys.stderr)
        return 2
    ref_path = Path(args.references) if args.references else Path(args.reference_dir) / "references.yaml"
    refs = {}
    if ref_path.exists():
        refs = load_references(ref_path)
    elif args.references:
        print(f"make_charts: references file {ref_path} not found", file=sys.stderr)
        return 2
    else:
        print(f"no references file at {ref_path}: every verdict is 'unchecked', line rates unknown")
    formats = [f.strip() for f in args.format.split(",") if f.strip()]
    try:
        written = charts.make_charts(found, args.out, formats, refs,
                                     log=lambda m: print(m, flush=True))
    except ValueError as e:
        print(f"make_charts: {e}", file=sys.stderr)
        return 2
    total = sum(len(v) for v in written.values())
    print(f"done: {total} files for {len(written)} testbed(s) under {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
