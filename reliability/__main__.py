"""`make reliability`: run every scenario against real processes on loopback, print one table of figures, exit 1
when a figure misses its bound. Run: ``python -m reliability [--quick] [--only NAME ...] [--list]``."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from bench.scenarios import Workspace
from reliability.figures import table
from reliability.run import Context, run_scenario
from reliability.scenarios import SCENARIOS


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reliability", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="the short version of each scenario (as in make test)")
    parser.add_argument("--only", action="append", default=[], metavar="NAME", help="only this scenario (repeatable)")
    parser.add_argument("--list", action="store_true", help="print the scenario names and exit")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(SCENARIOS))
        return 0
    unknown = [name for name in args.only if name not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s) {unknown}; known: {', '.join(SCENARIOS)}")
    chosen = [name for name in SCENARIOS if not args.only or name in args.only]
    started = time.monotonic()
    figures = []
    with tempfile.TemporaryDirectory(prefix="reliability-") as tmp:
        ctx = Context(ws=Workspace.create(Path(tmp)), quick=args.quick)
        for name in chosen:
            figures += run_scenario(name, SCENARIOS[name], ctx)
    missed = [f for f in figures if not f.ok]
    print(f"\n## Reliability figures ({'quick' if args.quick else 'full'}, {time.monotonic() - started:.0f} s)\n")
    print(
        f"Command: python -m reliability{' --quick' if args.quick else ''}"
        + "".join(f" --only {name}" for name in args.only)
        + "\n"
    )
    print(table(figures))
    print(
        f"\n{len(figures) - len(missed)} of {len(figures)} figures within their bounds"
        + (f"; MISSED: {', '.join(f'{f.scenario}: {f.name}' for f in missed)}" if missed else "")
    )
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
