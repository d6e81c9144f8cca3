"""``python -m loadtest.bench``: one of the four benchmarks, by flag."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from loadtest.bench import clients as clients_bench
from loadtest.bench import million as million_bench
from loadtest.bench import seeding as seeding_bench
from loadtest.bench import throughput
from loadtest.bench.clients import clients_main
from loadtest.bench.million import million_main
from loadtest.bench.seeding import seeding_main
from loadtest.bench.throughput import throughput_main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.bench",
        description="\n".join(
            m.__doc__ or "" for m in (throughput, clients_bench, million_bench, seeding_bench)
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--dir", type=Path, default=Path("/tmp/warmwatch-bench"))
    parser.add_argument(
        "--sizes",
        default=None,
        help="default 10000,50000,200000; with --clients 10000,100000; with --million 1000000; "
        "with --seeding 100000",
    )
    parser.add_argument("--kb", type=int, default=2, help="data per ConfigMap, KiB")
    parser.add_argument("--keep", action="store_true", help="leave the control plane running")
    clients = parser.add_argument_group(
        "--clients: client kinds on fast and slow links (--runs and the link: also --seeding)"
    )
    clients.add_argument("--clients", action="store_true", help="run this benchmark instead")
    clients.add_argument("--runs", type=int, default=1, help="measurements per cell (median)")
    clients.add_argument("--link-latency-ms", type=int, default=25, help="each direction")
    clients.add_argument("--link-jitter-ms", type=int, default=0, help="each direction")
    clients.add_argument("--link-kb", type=int, default=5000, help="KB/s each direction")
    clients.add_argument(
        "--warmwatch-only-from",
        type=int,
        default=None,
        help="sizes from this on: (b) and (d) only, the link warmwatch on a copy",
    )
    clients.add_argument(
        "--link-copy-from",
        type=int,
        default=None,
        help="sizes from this on: the link warmwatch starts on a copy of the local one",
    )
    clients.add_argument(
        "--kinds",
        default=None,
        help="client kinds, comma-separated (default all): dynamic, typed-json, "
        "typed-protobuf, metadata, controller-manager",
    )
    parser.add_argument("--out", type=Path, help="also write the table to this file")
    parser.add_argument("--chart", type=Path, help="also draw the results as a PNG chart here")
    million = parser.add_argument_group("--million: the million-object bar")
    million.add_argument("--million", action="store_true", help="run this benchmark instead")
    million.add_argument(
        "--concurrency", type=int, default=256, help="concurrent creates and deletes"
    )
    million.add_argument(
        "--create-budget-min",
        type=float,
        default=25,
        help="stop creating at the largest N (a multiple of 50,000) that fits in this",
    )
    million.add_argument("--restarts", type=int, default=3, help="warm restarts (median)")
    million.add_argument("--list-runs", type=int, default=3, help="full LISTs each (best)")
    seeding = parser.add_argument_group("--seeding: a restart cold, seeded from a peer, warm")
    seeding.add_argument("--seeding", action="store_true", help="run this benchmark instead")
    args = parser.parse_args(argv)
    if args.seeding:
        return seeding_main(args)
    if args.clients:
        return clients_main(args)
    if args.million:
        return million_main(args)
    return throughput_main(args)


if __name__ == "__main__":
    sys.exit(main())
