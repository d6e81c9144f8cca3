"""``python -m loadtest.faults``: a fault run, or ``--recheck`` of a recorded one."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
from collections.abc import Sequence
from pathlib import Path

import loadtest.faults
from loadtest.checking import Report, check_run, read_run
from loadtest.faults import say
from loadtest.faults.driving import Driver, combine
from loadtest.faults.options import Options


def recheck(directory: Path) -> Report:
    """The recorded runs of ``directory`` checked again (without the Go ordering checks,
    which need the Go programs' output)."""
    runs = [read_run(path) for path in sorted(directory.glob("run-*.jsonl"))]
    if not runs:
        raise SystemExit(f"no run-*.jsonl in {directory}")
    return combine([check_run(run) for run in runs], [], 0, runs[0].faults)


def _gap(text: str) -> tuple[float, float]:
    low, _, high = text.partition(",")
    return float(low), float(high or low)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.faults",
        description=loadtest.faults.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--minutes", type=float, default=10.0, help="traffic and faults (default 10)"
    )
    parser.add_argument("--dir", type=Path, default=Path("/tmp/warmwatch-faults"))
    parser.add_argument("--seed", type=int, default=None, help="default: random (printed)")
    parser.add_argument("--rate", type=float, default=200.0, help="writes per second (default 200)")
    parser.add_argument("--plane-dir", type=Path, default=None, help="reuse this control plane")
    parser.add_argument("--outage", type=float, default=30.0, help="upstream outage seconds")
    parser.add_argument(
        "--gap", type=_gap, default=(1.0, 5.0), help="MIN,MAX seconds between faults"
    )
    parser.add_argument("--population", type=int, default=150, help="live objects per resource")
    parser.add_argument("--retention-events", type=int, default=2000)
    parser.add_argument(
        "--min-faults",
        type=int,
        default=0,
        help="inject quick faults after --minutes until this many",
    )
    parser.add_argument("--no-go", action="store_true", help="without the Go informers")
    parser.add_argument(
        "--recheck", type=Path, default=None, metavar="DIR", help="check DIR's runs again"
    )
    args = parser.parse_args(argv)
    failures: list[str] = []
    if args.recheck is not None:
        report = recheck(args.recheck)
    else:
        seed = args.seed if args.seed is not None else random.randrange(1 << 30)
        options = Options(
            directory=args.dir,
            minutes=args.minutes,
            seed=seed,
            rate=args.rate,
            plane_dir=args.plane_dir,
            outage=args.outage,
            gap=args.gap,
            population=args.population,
            retention_events=args.retention_events,
            min_faults=args.min_faults,
            go_clients=not args.no_go,
        )
        say(f"seed {seed}, directory {options.directory}")
        report, summary = asyncio.run(Driver(options).run())
        (options.directory / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        say(f"summary: {json.dumps(summary)}")
        failures = summary["fault_failures"]
    for line in report.details():
        print(line)
    for failure in failures:
        print(f"fault failure: {failure}")
    print(report.summary_line(), flush=True)
    return 0 if report.ok and not failures else 1


if __name__ == "__main__":
    sys.exit(main())
