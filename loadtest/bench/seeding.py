"""A Deployment-style controller's restart: cold, seeded from a peer, warm (``--seeding``)::

    python -m loadtest.bench --seeding --dir /tmp/warmwatch-bench-seeding \\
        [--sizes 100000] [--kb 2] [--runs 3] [--out FILE] \\
        [--link-latency-ms 25] [--link-jitter-ms 0] [--link-kb 5000]

The controller is client-go's typed informer in protobuf (tests/goclient ``--mode typed
--protobuf``: kube-controller-manager's encoding, the client benchmark's ``typed-protobuf``
kind) on N ConfigMaps of ~KB KiB of random data (``clients.grow_random``), restarted with its
warmwatch, which caches the collection in protobuf (``--resource ...;protobuf``) and reaches
the apiserver only over the client benchmark's slow link (toxiproxy, ``--link-*``: by default
50 ms RTT and 5000 KB/s each direction per connection), as a service account (token
kubeconfig; ``loadtest.seeding`` makes the account, its grants and tokens, as
tests/e2e/test_seeding.py does). Three ways to restart, one cell each per run:

- ``cold``: a new warmwatch on an empty database (a Deployment's replacement pod on an
  emptyDir today, seeding off): it fills the collection over the link;
- ``seeded``: a new warmwatch on an empty database with ``--seed-peer`` at a running, warm
  peer of the same service account (its ``--seed-listen`` TLS listener, both tokens requested
  and reviewed by the apiserver over each one's link). The snapshot itself crosses loopback
  (in a cluster it crosses the pod network, not the apiserver link); then the watch resumes
  over the link;
- ``warm``: the cold cell's warmwatch restarted on its own database (the same volume).

In each cell the client starts once warmwatch is ready (``/readyz``, what
``deploy/component``'s startupProbe waits for) and is stopped once synced; then warmwatch is
stopped. Figures per cell: seconds from warmwatch's start until ready and until the client
synced (the restart as the pod sees it), the client's own sync, and warmwatch's counters
(``warmwatch_upstream_relists_total`` of the collection: its LISTs upstream;
``warmwatch_seedings_total{result="installed"}``, ``warmwatch_seeding_bytes_total``, and
the seeding's own seconds from its log line: fetched, checked, installed); the
bytes its link carried each way (toxiproxy's proxy metrics, counted as its connections close,
so read after warmwatch stopped; the peer has a link of its own, not counted). Odd runs go
cold, warm, seeded; even runs seeded, cold, warm, after SETTLE s of quiet each. The peer is
filled over its link once per size, before the runs.

Prints a markdown table (medians of --runs) with notes on anything unexpected (a seeded cell
that did not install, a cold one that did not list, a warm one that relisted) to stdout and
to --out FILE; progress goes to stderr; warmwatch logs sit next to their databases in DIR.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from loadtest import exposition, goclient, kubeapi, seeding, toxiproxy
from loadtest.bench import say, scan_log
from loadtest.bench.clients import (
    CLIENT_KINDS,
    CLIENTS_NAMESPACE,
    CLIENTS_RESOURCE,
    SETTLE,
    SYNC_TIMEOUT,
    ClientsBench,
    grow_random,
)
from loadtest.cluster import ControlPlane
from loadtest.ports import free_port
from loadtest.sidecar import Sidecar

SHAPE = f"{CLIENTS_RESOURCE};protobuf"
"""The one collection every warmwatch here caches: what the controller reads."""

KIND = next(kind for kind in CLIENT_KINDS if kind.key == "typed-protobuf")
"""The controller: client-go's typed informer in protobuf."""

CONDITIONS = {
    "cold": "cold: new warmwatch, empty database",
    "seeded": "seeded: new warmwatch, empty database, --seed-peer",
    "warm": "warm: warmwatch restarted on its own database",
}

ORDERS = (("cold", "warm", "seeded"), ("seeded", "cold", "warm"))
"""The cells of odd runs, of even runs (``warm`` always after ``cold``: it restarts it)."""

RELISTS = "warmwatch_upstream_relists_total"
SEEDINGS = "warmwatch_seedings_total"
SEED_BYTES = "warmwatch_seeding_bytes_total"


@dataclass(frozen=True, kw_only=True, slots=True)
class Restart:
    """One cell: a warmwatch started and the client started on it once ready."""

    ready: float
    """Seconds from warmwatch's start until ``/readyz`` answered 200."""
    synced: float
    """Seconds from warmwatch's start until the client synced (NaN: it did not)."""
    client: float
    """Seconds from the client's start until it synced."""
    lists: float
    """warmwatch's upstream LISTs of the collection (``RELISTS``)."""
    installed: float
    """``SEEDINGS{result="installed"}``."""
    seed_bytes: float
    seed_seconds: float
    """From its log's ``seeded PATH from peer ...: ... in N s`` line (the seeding's own time:
    fetched, checked, installed); NaN without one."""
    link_down: float
    """Bytes its link carried from the apiserver to warmwatch."""
    link_up: float


@dataclass
class SeedingBench:
    plane: ControlPlane
    directory: Path
    clients: ClientsBench
    """Runs the client (``ClientsBench.sync``) and keeps its notes."""
    server: toxiproxy.Toxiproxy
    link: toxiproxy.Proxy
    """The restarted warmwatch's link to the apiserver."""
    kubeconfig: Path
    """Its kubeconfig: the service account's token, through ``link``."""
    peer_kubeconfig: Path
    """The peer's: the same account, through a link of its own."""
    samples: dict[tuple[int, str], list[Restart]] = field(default_factory=dict)
    peers: dict[int, str] = field(default_factory=dict)
    """What the peer of each size took to fill."""

    @classmethod
    def start(
        cls, *, plane: ControlPlane, directory: Path, link: toxiproxy.Link, binary: Path
    ) -> SeedingBench:
        """Toxiproxy (counting bytes) with two links to the apiserver, the service account
        with seeding's grants in CLIENTS_NAMESPACE, and a kubeconfig through each link."""
        server = toxiproxy.Toxiproxy.start(log=directory / "toxiproxy.log", metrics=True)
        try:
            upstream = f"127.0.0.1:{plane.state().apiserver_port}"
            proxies = {
                name: server.create_proxy(name, upstream=upstream) for name in ("ww", "peer")
            }
            for proxy in proxies.values():
                link.apply(proxy)
            tokens = asyncio.run(_accounts(plane))
            kubeconfigs = {
                name: kubeapi.kubeconfig_for(
                    f"https://127.0.0.1:{proxy.port}",  # 127.0.0.1: a SAN of the apiserver's
                    path=directory / f"{name}-link.kubeconfig",
                    token=tokens[seeding.ACCOUNT],
                    ca=plane.pki.ca_cert,
                )
                for name, proxy in proxies.items()
            }
        except BaseException:
            server.stop()
            raise
        say(
            f"links to {upstream}: {link.describe()}; one for the restarted warmwatch, one for the peer"
        )
        return cls(
            plane=plane,
            directory=directory,
            clients=ClientsBench(
                plane=plane, directory=directory, binary=binary, link=link, kinds=(KIND,)
            ),
            server=server,
            link=proxies["ww"],
            kubeconfig=kubeconfigs["ww"],
            peer_kubeconfig=kubeconfigs["peer"],
        )

    def stop(self) -> None:
        self.server.stop()

    def note(self, message: str) -> None:
        self.clients.note(message)

    def run_size(self, size: int, *, runs: int) -> None:
        """The peer filled over its link, then ``runs`` rounds of the three cells."""
        seed_port = free_port()
        peer = self._sidecar(
            f"peer-{size}",
            upstream=self.peer_kubeconfig,
            extra=[f"--seed-listen=127.0.0.1:{seed_port}"],
        )
        try:
            started = time.monotonic()
            peer.wait_ready(timeout=SYNC_TIMEOUT)
            self.peers[size] = (
                f"{time.monotonic() - started:.1f} s over its link, "
                f"{_file_bytes(peer.db) / 1e6:.0f} MB database and WAL"
            )
            say(f"peer: {size:,} objects, filled in {self.peers[size]}; log {peer.log}")
            for run in range(1, runs + 1):
                say(f"N={size:,}: run {run} of {runs}")
                cold: Sidecar | None = None
                for condition in ORDERS[(run - 1) % 2]:
                    time.sleep(SETTLE)
                    if condition == "warm":
                        assert cold is not None
                        self.measure(condition, cold, size=size)
                        continue
                    flags = [f"--seed-peer=127.0.0.1:{seed_port}"] if condition == "seeded" else []
                    sidecar = self._sidecar(
                        f"{condition}-{size}-{run}", upstream=self.kubeconfig, extra=flags
                    )
                    self.measure(condition, sidecar, size=size)
                    cold = sidecar if condition == "cold" else cold
                for db in self.directory.glob(f"ww-*-{size}-{run}.db*"):  # the logs stay
                    db.unlink()
        finally:
            peer.stop()
        for log in sorted(self.directory.glob(f"ww-*-{size}*.log")):
            odd = scan_log(log)
            if odd:
                self.note(
                    f"{log.name}: {len(odd)} warning/error lines, e.g. "
                    + " | ".join(line[:300] for line in odd[:3])
                )

    def _sidecar(self, name: str, *, upstream: Path, extra: Sequence[str]) -> Sidecar:
        """A warmwatch of SHAPE on a new database ``ww-NAME.db``, started, not waited for."""
        for stale in self.directory.glob(f"ww-{name}.*"):
            stale.unlink()
        return Sidecar.start(
            upstream_kubeconfig=upstream,
            db=self.directory / f"ww-{name}.db",
            resources=[SHAPE],
            extra=extra,
            wait_ready=False,
        )

    def measure(self, condition: str, sidecar: Sidecar, *, size: int) -> Restart:
        """``sidecar``, just started (``warm``: stopped, and restarted here), until ready; the
        client on it until synced; both stopped; the cell's figures, recorded."""
        what = f"({condition})"
        before = self.link.bytes()
        started = time.monotonic()
        if condition == "warm":
            sidecar.restart(wait_ready=False)
        try:
            sidecar.wait_ready(timeout=SYNC_TIMEOUT)
            ready = time.monotonic() - started
            synced = self.clients.sync(KIND, sidecar.kubeconfig, expect=size, what=what)
            text = sidecar.metrics()
        finally:
            sidecar.stop()
        after = self._settled_bytes()
        restart = Restart(
            ready=ready,
            synced=ready + synced.seconds,
            client=synced.seconds,
            lists=exposition.total(text, RELISTS, {"resource": "v1/configmaps"}),
            installed=exposition.total(text, SEEDINGS, {"result": "installed"}),
            seed_bytes=exposition.total(text, SEED_BYTES),
            seed_seconds=_seeding_seconds(sidecar),
            link_down=after["downstream"] - before["downstream"],
            link_up=after["upstream"] - before["upstream"],
        )
        self.samples.setdefault((size, condition), []).append(restart)
        say(
            f"{what} N={size:,}: ready {restart.ready:.2f} s, client synced {restart.synced:.2f} s "
            f"after warmwatch's start ({restart.client:.2f} s its own); upstream LISTs "
            f"{restart.lists:.0f}, seeding installed {restart.installed:.0f} "
            f"({restart.seed_bytes / 1e6:.1f} MB in {restart.seed_seconds:.1f} s); link {restart.link_down / 1e6:.2f} MB down, "
            f"{restart.link_up / 1e6:.2f} MB up; log {sidecar.log}"
        )
        expected = {"cold": (1, 0), "seeded": (0, 1), "warm": (0, 0)}[condition]
        if (restart.lists, restart.installed) != expected:
            self.note(
                f"({condition}) N={size:,}: {restart.lists:.0f} upstream LISTs and "
                f"{restart.installed:.0f} seedings installed, expected {expected[0]} and "
                f"{expected[1]} (log {sidecar.log.name})"
            )
        return restart

    def _settled_bytes(self) -> dict[toxiproxy.Stream, float]:
        """The link's byte counts once its closed connections have all been counted."""
        last = self.link.bytes()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            time.sleep(0.3)
            now = self.link.bytes()
            if now == last:
                return now
            last = now
        return last

    def table(self, *, sizes: Sequence[int], runs: int, kb: int) -> list[str]:
        def median(size: int, condition: str, figure: str) -> float:
            values = [
                getattr(r, figure)
                for r in self.samples.get((size, condition), [])
                if getattr(r, figure) == getattr(r, figure)
            ]
            return statistics.median(values) if values else float("nan")

        def number(value: float, digits: int = 2) -> str:
            return f"{value:,.{digits}f}" if value == value else "—"

        lines = [
            f"A Deployment-style controller's restart (client-go typed informer, protobuf) with "
            f"its warmwatch, median of {runs}: N ConfigMaps of {kb} KiB of random data in one "
            "namespace, cached in protobuf; warmwatch's upstream is a link of "
            f"{self.clients.link.describe()} (toxiproxy); the seed crosses loopback (in a "
            "cluster: the pod network). Seconds from warmwatch's start; the client starts once "
            "warmwatch is ready. Peer: "
            + ("; ".join(f"N={size:,}: {text}" for size, text in self.peers.items()) or "n/a")
            + ".",
            "",
            "| restart | objects | warmwatch ready s | client synced s | client's own sync s "
            "| ratio to cold | upstream LISTs | link MB down / up | seed MB (s) |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for size in sizes:
            cold = median(size, "cold", "synced")
            for condition, label in CONDITIONS.items():
                synced = median(size, condition, "synced")
                ratio = f"{synced / cold:.2f}x" if synced == synced and cold > 0 else "n/a"
                lines.append(
                    f"| {label} | {size:,} | {number(median(size, condition, 'ready'))} | "
                    f"{number(synced)} | {number(median(size, condition, 'client'))} | {ratio} | "
                    f"{number(median(size, condition, 'lists'), 0)} | "
                    f"{number(median(size, condition, 'link_down') / 1e6)} / "
                    f"{number(median(size, condition, 'link_up') / 1e6)} | "
                    f"{number(median(size, condition, 'seed_bytes') / 1e6, 1)} "
                    f"({number(median(size, condition, 'seed_seconds'), 1)}) |"
                )
        if self.clients.notes:
            lines += ["", "Notes:", *(f"- {note}" for note in self.clients.notes)]
        return lines


def _seeding_seconds(sidecar: Sidecar) -> float:
    """The seeding's seconds from the log line of ``sidecar``'s database (NaN: none)."""
    found = re.findall(
        rf"seeded {re.escape(str(sidecar.db))} from peer \S+: .* in ([0-9.]+) s$",
        sidecar.log.read_text(errors="replace"),
        re.MULTILINE,
    )
    return float(found[-1]) if found else float("nan")


def _file_bytes(db: Path) -> int:
    """A database's size with its write-ahead log."""
    wal = db.with_name(db.name + "-wal")
    return db.stat().st_size + (wal.stat().st_size if wal.exists() else 0)


async def _accounts(plane: ControlPlane) -> dict[str, str]:
    async with seeding.admin(plane) as api:
        return await seeding.make_accounts(
            api, home=CLIENTS_NAMESPACE, namespaces=(CLIENTS_NAMESPACE,)
        )


def seeding_main(args: argparse.Namespace) -> int:
    sizes = [int(s) for s in (args.sizes or "100000").split(",")]
    args.dir.mkdir(parents=True, exist_ok=True)
    directory = args.dir.resolve()
    plane = ControlPlane(directory / "cp")
    plane.up()
    plane.stop_controller_manager()  # nothing else asks the apiserver
    link = toxiproxy.Link(
        latency_ms=args.link_latency_ms, jitter_ms=args.link_jitter_ms, rate_kb=args.link_kb
    )
    bench: SeedingBench | None = None
    try:
        for size in sizes:
            say(f"growing to {size:,} ConfigMaps of {args.kb} KiB of random data ...")
            asyncio.run(grow_random(plane, to=size, kb=args.kb))
            if bench is None:
                bench = SeedingBench.start(
                    plane=plane, directory=directory, link=link, binary=goclient.build()
                )
            bench.run_size(size, runs=args.runs)
    finally:
        if bench is not None:
            bench.stop()
        if args.keep:
            plane.start_controller_manager()
        else:
            plane.down()
            shutil.rmtree(directory / "cp", ignore_errors=True)
    assert bench is not None
    text = "\n".join(bench.table(sizes=sizes, runs=args.runs, kb=args.kb))
    print(f"\n{text}")
    if args.out:
        args.out.write_text(text + "\n")
    return 0
