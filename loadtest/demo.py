"""The demo: a controller restarts warm through warmwatch, even while the apiserver is down.

    python -m loadtest.demo --dir /tmp/warmwatch-demo [--objects 20000] [--keep]

1. Starts a real etcd + kube-apiserver (loadtest.cluster) and creates N ConfigMaps.
2. Starts warmwatch and a client-go informer program (the "controller") through it: a cold
   start — warmwatch lists from the apiserver once.
3. Stops both, changes 30 objects upstream, stops the apiserver.
4. Starts warmwatch and the controller again: the controller syncs from the cache alone.
5. Starts the apiserver: the controller receives the 30 changes it missed, and its cache ends
   equal to the apiserver's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

from loadtest import goclient, kubeapi
from loadtest.cluster import ControlPlane
from loadtest.sidecar import Sidecar


def say(text: str) -> None:
    print(f"\n=== {text}", flush=True)


async def create(plane: ControlPlane, *, namespace: str, count: int) -> None:
    async with kubeapi.RawClient(
        base_url=plane.server,
        concurrency=64,
        ssl_context=kubeapi.client_ssl(plane.pki, identity="admin"),
    ) as api:
        existing = await api.get(f"/api/v1/namespaces/{namespace}/configmaps", limit="1")
        if existing.get("items"):
            return
        await kubeapi.create_configmaps(api, namespace=namespace, count=count, size=1024)


async def change(plane: ControlPlane, *, namespace: str) -> None:
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    async with kubeapi.RawClient(
        base_url=plane.server, ssl_context=kubeapi.client_ssl(plane.pki, identity="admin")
    ) as api:
        stamp = int(time.time())
        for i in range(10):
            await api.create(path, kubeapi.configmap(name=f"late-{stamp}-{i}", namespace=namespace))
            await api.merge_patch(f"{path}/cm-{i:06d}", {"data": {"at": str(stamp)}})
            await api.delete(f"{path}/cm-{100 + i + stamp % 1000:06d}")


def synced(client: goclient.GoClient, started: float) -> str:
    line = client.wait_synced(timeout=600)[0]
    return f"{line['count']} objects in {time.monotonic() - started:.2f}s"


def _listed(plane: ControlPlane, namespace: str) -> set[tuple[str, str, str]]:
    """The namespace's ConfigMaps as the apiserver lists them: (namespace, name, RV)."""
    listed = subprocess.run(
        [
            str(plane.kubectl()),
            f"--kubeconfig={plane.admin_kubeconfig}",
            "get",
            "cm",
            "-n",
            namespace,
            "-o",
            "json",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return {
        (i["metadata"]["namespace"], i["metadata"]["name"], i["metadata"]["resourceVersion"])
        for i in json.loads(listed)["items"]
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--dir", type=Path, default=Path("/tmp/warmwatch-demo"))
    parser.add_argument("--objects", type=int, default=20_000)
    parser.add_argument(
        "--keep",
        action="store_true",
        help="leave the control plane running (stop it: make demo-down)",
    )
    args = parser.parse_args(argv)
    namespace, shape = "demo", "v1/configmaps@demo"

    say("starting a real etcd + kube-apiserver (first run builds them: minutes)")
    plane = ControlPlane(args.dir)
    plane.up()
    binary = goclient.build()
    sidecar: Sidecar | None = None
    try:
        say(f"creating {args.objects} ConfigMaps of ~1 KiB in namespace {namespace}")
        asyncio.run(create(plane, namespace=namespace, count=args.objects))

        say("cold start: warmwatch lists from the apiserver, the controller from warmwatch")
        sidecar = Sidecar.start(
            upstream_kubeconfig=plane.admin_kubeconfig,
            db=args.dir / "warmwatch.db",
            resources=[shape],
        )
        started = time.monotonic()
        controller = goclient.GoClient.start(
            binary, kubeconfig=sidecar.kubeconfig, resources=[shape]
        )
        print(f"controller synced: {synced(controller, started)}")
        controller.stop()
        sidecar.stop()

        say("controller and warmwatch stopped; 30 changes upstream; apiserver stopped")
        asyncio.run(change(plane, namespace=namespace))
        items = _listed(plane, namespace)
        plane.stop_apiserver()

        say("warm start with the apiserver DOWN: the controller syncs from warmwatch's cache")
        sidecar.restart()
        started = time.monotonic()
        controller = goclient.GoClient.start(
            binary, kubeconfig=sidecar.kubeconfig, resources=[shape]
        )
        print(f"controller synced: {synced(controller, started)}")

        say("apiserver back: the controller receives what it missed")
        plane.start_apiserver()
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if {tuple(i) for i in controller.digest()[shape]["items"]} == items:
                break
            time.sleep(0.5)
        missed = [e for e in controller.events() if not e["initial"]]
        for event in missed:
            print(f"  {event['type']:9} {event['namespace']}/{event['name']} rv={event['rv']}")
        same = {tuple(i) for i in controller.digest()[shape]["items"]} == items
        print(f"{len(missed)} events; controller's cache equals the apiserver's: {same}")
        controller.stop()
        return 0 if same else 1
    finally:
        if sidecar is not None:
            sidecar.stop()
        if not args.keep:
            plane.down()


if __name__ == "__main__":
    sys.exit(main())
