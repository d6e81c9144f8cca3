"""Memory and LIST throughput of warmwatch, measured side by side with the apiserver.

    python -m loadtest.bench --dir /tmp/warmwatch-bench [--sizes 10000,50000,200000] [--kb 2]

For each size N (cumulative: the collection grows between rows), with ConfigMaps of ~KB KiB:
- warmwatch starts on a fresh database and fills the shape from the apiserver; its RSS is
  read after the fill and again after serving full LISTs (memory must not grow with N);
- a full LIST of the collection is read by one HTTP client, as fast as it can, from warmwatch
  and from the apiserver (RV "0": its watch cache; RV unset: a consistent read from etcd);
  MB/s and the ratio are printed side by side, best of three;
- the client-go informer program syncs through warmwatch and directly; seconds side by side.

Prints one table; nothing is asserted (this is a measurement, not a test).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import ssl
import sys
import time
from pathlib import Path

import aiohttp

from loadtest import charting, goclient, kubeapi
from loadtest.cluster import ControlPlane
from loadtest.sidecar import Sidecar

Row = tuple[int, float, int, int, int, float, float, float, float, float]
"""size, fill s, RSS filled, RSS served, DB bytes, LIST MB/s via warmwatch, apiserver RV 0 and
RV unset, informer sync s via warmwatch and direct."""

NAMESPACE = "bench"


SHAPE = f"v1/configmaps@{NAMESPACE}"


PATH = f"/api/v1/namespaces/{NAMESPACE}/configmaps"


async def read_list(url: str, *, ssl_context: ssl.SSLContext | None) -> tuple[int, float]:
    """Bytes of one full LIST and the seconds it took, body read and discarded."""
    connector = aiohttp.TCPConnector(ssl=ssl_context or False)
    async with aiohttp.ClientSession(connector=connector) as session:
        started = time.perf_counter()
        async with session.get(url, headers={"Accept": "application/json"}) as response:
            assert response.status == 200, await response.text()
            size = 0
            async for chunk in response.content.iter_chunked(1 << 20):
                size += len(chunk)
        return size, time.perf_counter() - started


def best_rate(url: str, *, ssl_context: ssl.SSLContext | None, runs: int = 3) -> float:
    """Best MB/s of ``runs`` full LISTs."""
    rates = []
    for _ in range(runs):
        size, seconds = asyncio.run(read_list(url, ssl_context=ssl_context))
        rates.append(size / seconds / 1e6)
    return max(rates)


def informer_sync(binary: Path, kubeconfig: Path) -> float:
    started = time.monotonic()
    client = goclient.GoClient.start(
        binary, kubeconfig=kubeconfig, resources=[SHAPE], extra=["--no-items", "--no-events"]
    )
    try:
        client.wait_synced(timeout=900)
        return time.monotonic() - started
    finally:
        client.stop()


async def grow(plane: ControlPlane, *, to: int, kb: int) -> None:
    async with kubeapi.RawClient(
        base_url=plane.server,
        concurrency=64,
        ssl_context=kubeapi.client_ssl(plane.pki, identity="admin"),
    ) as api:
        await kubeapi.ensure_namespace(api, NAMESPACE)
        have = len((await api.get(PATH))["items"])
        if have >= to:
            return
        path = PATH
        await api.gather(
            api.create(
                path, kubeapi.configmap(name=f"cm-{i:07d}", namespace=NAMESPACE, size=kb * 1024)
            )
            for i in range(have, to)
        )


def _measure(args: argparse.Namespace) -> list[Row]:
    """A row per size: the collection grown to it, then measured."""
    sizes = [int(s) for s in (args.sizes or "10000,50000,200000").split(",")]

    plane = ControlPlane(args.dir / "cp")
    plane.up()
    binary = goclient.build()
    admin_ssl = kubeapi.client_ssl(plane.pki, identity="admin")
    rows: list[Row] = []
    try:
        for size in sizes:
            print(
                f"[bench] growing to {size} ConfigMaps of {args.kb} KiB ...",
                file=sys.stderr,
                flush=True,
            )
            asyncio.run(grow(plane, to=size, kb=args.kb))
            db = args.dir / f"warmwatch-{size}.db"
            for stale in args.dir.glob(f"warmwatch-{size}.db*"):
                stale.unlink()
            started = time.monotonic()
            sidecar = Sidecar.start(
                upstream_kubeconfig=plane.admin_kubeconfig, db=db, resources=[SHAPE]
            )
            fill = time.monotonic() - started
            try:
                rss_filled = sidecar.rss_bytes()
                via = best_rate(f"{sidecar.url}{PATH}", ssl_context=None)
                direct_any = best_rate(
                    f"{plane.server}{PATH}?resourceVersion=0", ssl_context=admin_ssl
                )
                direct_recent = best_rate(f"{plane.server}{PATH}", ssl_context=admin_ssl)
                rss_served = sidecar.rss_bytes()
                sync_via = informer_sync(binary, sidecar.kubeconfig)
                sync_direct = informer_sync(binary, plane.admin_kubeconfig)
                db_bytes = sum(p.stat().st_size for p in args.dir.glob(f"warmwatch-{size}.db*"))
            finally:
                sidecar.stop()
            rows.append(
                (
                    size,
                    fill,
                    rss_filled,
                    rss_served,
                    db_bytes,
                    via,
                    direct_any,
                    direct_recent,
                    sync_via,
                    sync_direct,
                )
            )
    finally:
        if not args.keep:
            plane.down()
            shutil.rmtree(args.dir / "cp", ignore_errors=True)
    return rows


def _print_table(rows: list[Row], *, kb: int) -> None:
    print(
        f"\nConfigMaps of {kb} KiB; LIST rates are the best of 3 full LISTs read by one "
        "client; informer = client-go shared informer sync (LIST+WATCH)\n"
    )
    header = (
        "objects",
        "fill s",
        "RSS filled MB",
        "RSS served MB",
        "DB MB",
        "LIST via ww MB/s",
        "LIST apiserver rv=0 MB/s",
        "ratio",
        "LIST apiserver rv='' MB/s",
        "ratio",
        "informer via ww s",
        "informer direct s",
    )
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for size, fill, rss_f, rss_s, db_bytes, via, d_any, d_recent, s_via, s_direct in rows:
        cells = (
            f"{size:,}",
            f"{fill:.1f}",
            f"{rss_f / 1e6:.0f}",
            f"{rss_s / 1e6:.0f}",
            f"{db_bytes / 1e6:.0f}",
            f"{via:.0f}",
            f"{d_any:.0f}",
            f"{via / d_any:.2f}x",
            f"{d_recent:.0f}",
            f"{via / d_recent:.2f}x",
            f"{s_via:.2f}",
            f"{s_direct:.2f}",
        )
        print("| " + " | ".join(cells) + " |")


def throughput_main(args: argparse.Namespace) -> int:
    rows = _measure(args)
    if args.chart:
        charting.draw_rows(args.chart, rows)
    _print_table(rows, kb=args.kb)
    return 0
