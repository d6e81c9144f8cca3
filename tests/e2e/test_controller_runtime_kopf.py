"""Warm restarts of two controller stacks whose framework this project did not write:

- a typed controller-runtime manager, as kubebuilder generates them (tests/crmanager): it keeps
  a ConfigMap ``<name>-mirror`` (same data, controller owner reference) for every ConfigMap
  labelled ``warmwatch.test/mirror=true``;
- a kopf operator (tests/e2e/kopf_operator.py), run as ``python -m kopf run``: it annotates such
  ConfigMaps with their data (``warmwatch.test/kopf-data``).

Each one, through warmwatch, does its job (effects checked upstream). Then the warm restart that
warmwatch exists for: controller and warmwatch stop, changes are made upstream, the apiserver
goes down, and both start again. The controller must start from warmwatch's cache alone (its
caches sync / it lists and watches while the apiserver is down) and, once the apiserver is back,
carry out what changed while it was away.
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from loadtest import crmanager, kubeapi
from loadtest.cluster import ControlPlane
from loadtest.crmanager import ControllerProcess
from loadtest.sidecar import Sidecar

pytestmark = pytest.mark.e2e

LABELS = {"warmwatch.test/mirror": "true"}
OPERATOR = Path(__file__).with_name("kopf_operator.py")
REPO = Path(__file__).resolve().parents[2]

EFFECT_TIMEOUT = 60.0
"""Seconds for a controller to act on a change while everything runs."""
OFFLINE_START_TIMEOUT = 60.0
"""Seconds for a restarted controller to start from the cache while the apiserver is down."""
CATCH_UP_TIMEOUT = 120.0
"""Seconds, from the apiserver's return, to carry out the changes made while it was away."""

CATCH_UP_BOUND = 10.0
"""...and the bound those seconds are held to. On an idle machine either controller is done
0.1 s after the apiserver is ready again (2.6 s after it was started); while warmwatch's circuit
breaker stayed open a fixed 15 s, kopf was done 15-16 s after the start."""

BREAKER = "warmwatch_circuit_breaker_state"
BREAKER_OPEN = 2

Cached = dict[str, str]
"""ConfigMaps of the test namespace in warmwatch's cache: name -> resourceVersion."""


def _path(namespace: str, name: str = "") -> str:
    return f"/api/v1/namespaces/{namespace}/configmaps" + (f"/{name}" if name else "")


async def _get(api: kubeapi.RawClient, namespace: str, name: str) -> dict[str, Any] | None:
    """The object, or None when it does not exist (or the apiserver does not answer)."""
    try:
        found = await api.request("GET", _path(namespace, name), ok=(200, 404))
    except (aiohttp.ClientError, OSError, TimeoutError):
        return None  # the pooled connection died with the apiserver; the next try reconnects
    return None if found.get("kind") == "Status" else found


async def _create(
    api: kubeapi.RawClient, namespace: str, name: str, *, labelled: bool, v: str
) -> None:
    body = kubeapi.configmap(name=name, namespace=namespace, labels=LABELS if labelled else None)
    body["data"] = {"k": v}
    await api.create(_path(namespace), body)


def _apiserver_down(plane: ControlPlane) -> bool:
    with socket.socket() as probe:
        probe.settimeout(1)
        return probe.connect_ex(("127.0.0.1", plane.state().apiserver_port)) != 0


class Stack:
    """How to run one controller and recognise its effect and its start."""

    id: str

    def start(self, *, kubeconfig: Path, namespace: str, log: Path) -> ControllerProcess:
        raise NotImplementedError

    def problem(self, source: dict[str, Any], effect: dict[str, Any] | None) -> str | None:
        """Why ``effect`` (what ``effect_of`` fetched) does not yet reflect ``source``."""
        raise NotImplementedError

    async def effect_of(
        self, api: kubeapi.RawClient, source: dict[str, Any]
    ) -> dict[str, Any] | None:
        raise NotImplementedError

    def wait_started_offline(
        self, controller: ControllerProcess, *, namespace: str, cached: Cached, labelled: set[str]
    ) -> None:
        """Wait until ``controller`` has started from ``cached`` (warmwatch's cache) alone."""
        raise NotImplementedError

    def acted_on(self, controller: ControllerProcess) -> dict[str, set[str]]:
        """What the controller reports it did: outcome -> names."""
        raise NotImplementedError

    def started_as_expected(self, controller: ControllerProcess, sidecar: Sidecar) -> None:
        """Assert what the controller says about its own start (after it has done its job)."""
        raise NotImplementedError

    def caught_up(self, controller: ControllerProcess, *, created: str, updated: str) -> None:
        """Assert the restarted controller itself reports creating/updating what changed."""
        acted = self.acted_on(controller)
        assert created in acted.get("created", set()), acted
        assert updated in acted.get("updated", set()), acted


class ControllerRuntime(Stack):
    id = "controller-runtime"

    def __init__(self, binary: Path) -> None:
        self.binary = binary

    def start(self, *, kubeconfig: Path, namespace: str, log: Path) -> ControllerProcess:
        return crmanager.start_manager(
            self.binary, kubeconfig=kubeconfig, namespace=namespace, log=log
        )

    async def effect_of(
        self, api: kubeapi.RawClient, source: dict[str, Any]
    ) -> dict[str, Any] | None:
        meta = source["metadata"]
        return await _get(api, meta["namespace"], f"{meta['name']}-mirror")

    def problem(self, source: dict[str, Any], effect: dict[str, Any] | None) -> str | None:
        if effect is None:
            return "no mirror"
        owners = [o for o in effect["metadata"].get("ownerReferences", []) if o.get("controller")]
        expected_owner = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "name": source["metadata"]["name"],
            "uid": source["metadata"]["uid"],
        }
        if [{k: o.get(k) for k in expected_owner} for o in owners] != [expected_owner]:
            return f"mirror's controller references {owners}"
        if effect.get("data") != source.get("data"):
            return f"mirror data {effect.get('data')} != source data {source.get('data')}"
        return None

    def wait_started_offline(
        self, controller: ControllerProcess, *, namespace: str, cached: Cached, labelled: set[str]
    ) -> None:
        synced = controller.wait_for(
            lambda ls: any(x["kind"] == "synced" for x in ls), timeout=OFFLINE_START_TIMEOUT
        )
        count = next(x for x in synced if x["kind"] == "synced")["count"]
        assert count == len(cached), f"cache synced with {count} ConfigMaps, warmwatch had {cached}"

        # Its workers run on the cached state: every labelled source, at its cached RV, is
        # reconciled and found in order (the mirrors in the cache match), so nothing is written.
        def reconciled(lines: list[dict[str, Any]]) -> bool:
            done = {
                x["name"]: x
                for x in lines
                if x["kind"] == "reconcile" and x.get("sourceRV") == cached.get(x["name"])
            }
            return labelled <= done.keys()

        lines = controller.wait_for(reconciled, timeout=OFFLINE_START_TIMEOUT)
        outcomes = {
            x["name"]: x["result"]
            for x in lines
            if x["kind"] == "reconcile" and x["name"] in labelled
        }
        assert outcomes == dict.fromkeys(labelled, "unchanged"), outcomes

    def acted_on(self, controller: ControllerProcess) -> dict[str, set[str]]:
        acted: dict[str, set[str]] = {}
        for x in controller.of_kind("reconcile"):
            acted.setdefault(x["result"], set()).add(x["name"])
        return acted

    def started_as_expected(self, controller: ControllerProcess, sidecar: Sidecar) -> None:
        assert [x["server"] for x in controller.of_kind("start")] == [sidecar.url]
        assert len(controller.of_kind("synced")) == 1, controller.snapshot()


class Kopf(Stack):
    """``python -m kopf run`` with KUBECONFIG pointing at warmwatch. ``kubeconfig_login``: use
    kopf's own kubeconfig login instead of the client library it finds installed."""

    def __init__(self, *, kubeconfig_login: bool = False) -> None:
        self.kubeconfig_login = kubeconfig_login
        self.id = "kopf-kubeconfig-login" if kubeconfig_login else "kopf"

    def start(self, *, kubeconfig: Path, namespace: str, log: Path) -> ControllerProcess:
        argv = [sys.executable, "-m", "kopf", "run", "--standalone", "--verbose"]
        argv += [f"--namespace={namespace}", str(OPERATOR)]
        env = {k: v for k, v in os.environ.items() if k != "WARMWATCH_KOPF_LOGIN"}
        env["KUBECONFIG"] = str(kubeconfig)
        if self.kubeconfig_login:
            env["WARMWATCH_KOPF_LOGIN"] = "kubeconfig"
        return ControllerProcess.start(argv, name="kopf", log=log, env=env, cwd=REPO)

    def started_as_expected(self, controller: ControllerProcess, sidecar: Sidecar) -> None:
        # The login activity kopf chose (see kopf_operator.py), against an http:// server
        # with no credentials.
        login = "kubeconfig_login" if self.kubeconfig_login else "login_via_async_client"
        log = controller.log_text()
        logins = re.findall(r"Activity '(\w+)' succeeded", log)
        assert login in logins, (logins, controller.log_tail())
        assert "Initial authentication has finished." in log
        assert len(controller.of_kind("startup")) == 1, controller.snapshot()

    async def effect_of(
        self, api: kubeapi.RawClient, source: dict[str, Any]
    ) -> dict[str, Any] | None:
        # The effect is on the source itself: read it again.
        meta = source["metadata"]
        return await _get(api, meta["namespace"], meta["name"])

    def problem(self, source: dict[str, Any], effect: dict[str, Any] | None) -> str | None:
        if effect is None:
            return "source not readable"
        # Imported here: the operator imports kopf, which only the kopf tests need.
        from tests.e2e.kopf_operator import ANNOTATION, data_annotation

        annotation = effect["metadata"].get("annotations", {}).get(ANNOTATION)
        if annotation != data_annotation(effect.get("data")):
            return f"annotation {annotation!r} for data {effect.get('data')}"
        return None

    def wait_started_offline(
        self, controller: ControllerProcess, *, namespace: str, cached: Cached, labelled: set[str]
    ) -> None:
        # kopf lists, then watches from the list's RV. Its list is answered from the cache:
        # every labelled ConfigMap arrives as a listed event (type null) at its cached RV ...
        def listed(lines: list[dict[str, Any]]) -> bool:
            seen = {
                x["name"]
                for x in lines
                if x["kind"] == "event" and x["type"] is None and x["rv"] == cached.get(x["name"])
            }
            return labelled <= seen

        controller.wait_for(listed, timeout=OFFLINE_START_TIMEOUT)
        # ... and it logs the watch-stream it starts.
        log = controller.log_text()
        assert f"Starting the watch-stream for configmaps.v1 in {namespace!r}" in log, (
            controller.log_tail()
        )

    def acted_on(self, controller: ControllerProcess) -> dict[str, set[str]]:
        acted: dict[str, set[str]] = {}
        for x in controller.of_kind("handled"):
            acted.setdefault({"create": "created", "update": "updated"}[x["cause"]], set()).add(
                x["name"]
            )
        return acted


@pytest.fixture(scope="session")
def crmanager_binary() -> Path:
    return crmanager.build()


@pytest.fixture
def stack(request: pytest.FixtureRequest) -> Stack:
    """The controller stack named by the test's (indirect) parameter."""
    if request.param == "kopf":
        return Kopf()
    if request.param == "kopf-kubeconfig-login":
        return Kopf(kubeconfig_login=True)
    assert request.param == "controller-runtime"
    binary: Path = request.getfixturevalue("crmanager_binary")
    return ControllerRuntime(binary)


@dataclass
class Started:
    stack: Stack
    processes: list[ControllerProcess]
    directory: Path

    def check_output(self) -> None:
        """Every line each controller printed was one whole JSON object."""
        for controller in self.processes:
            garbled = controller.of_kind("text")
            assert not garbled, f"{controller.name} printed non-JSON lines: {garbled}"

    def __call__(self, sidecar: Sidecar, namespace: str) -> ControllerProcess:
        log = self.directory / f"{self.stack.id}-{len(self.processes)}.log"
        controller = self.stack.start(kubeconfig=sidecar.kubeconfig, namespace=namespace, log=log)
        self.processes.append(controller)
        return controller


@pytest.fixture
def start_controller(
    stack: Stack, start_sidecar: Callable[..., Sidecar], tmp_path: Path
) -> Iterator[Started]:
    """Start the stack's controller through a warmwatch; stopped before warmwatch is."""
    started = Started(stack=stack, processes=[], directory=tmp_path)
    yield started
    for controller in started.processes:
        controller.stop()


async def wait_effects(
    stack: Stack,
    api: kubeapi.RawClient,
    namespace: str,
    names: list[str],
    *,
    timeout: float,
    controller: ControllerProcess,
) -> float:
    """Wait until the controller's effect reflects each named source's current state upstream;
    returns the seconds it took."""
    started = time.monotonic()
    problems: dict[str, str | None] = dict.fromkeys(names, "not checked")
    while time.monotonic() - started < timeout:
        for name in names:
            source = await _get(api, namespace, name)
            if source is None:
                problems[name] = "source not readable"
                continue
            problems[name] = stack.problem(source, await stack.effect_of(api, source))
        if not any(problems.values()):
            return time.monotonic() - started
        assert controller.running(), f"{stack.id} exited:\n{controller.log_tail()}"
        await asyncio.sleep(0.25)
    raise AssertionError(
        f"{stack.id}: not done in {timeout:.0f}s: {problems}; "
        f"last lines {controller.snapshot()[-5:]}; log tail:\n{controller.log_tail()}"
    )


def _names_rvs(listed: dict[str, Any]) -> Cached:
    return {i["metadata"]["name"]: i["metadata"]["resourceVersion"] for i in listed["items"]}


async def cache_caught_up(sidecar: Sidecar, admin_api: kubeapi.RawClient, namespace: str) -> Cached:
    """What warmwatch serves for the namespace (from its cache) once it equals the apiserver's
    list and both stay so for a second (the controller has finished writing)."""
    async with kubeapi.RawClient(base_url=sidecar.url) as local:
        expected: Cached = {}
        served: Cached = {}
        for _ in range(30):
            previous = served if served == expected else None
            expected = _names_rvs(await admin_api.get(_path(namespace)))
            served = _names_rvs(await local.get(_path(namespace)))
            if served == expected == previous:
                return served
            await asyncio.sleep(1 if served == expected else 0.2)
    raise AssertionError(f"warmwatch serves {served}, the apiserver has {expected}")


@pytest.mark.parametrize(
    "stack", ["controller-runtime", "kopf", "kopf-kubeconfig-login"], indirect=True
)
async def test_controller_does_its_job_through_warmwatch(
    stack: Stack,
    namespace: str,
    admin_api: kubeapi.RawClient,
    start_sidecar: Callable[..., Sidecar],
    start_controller: Started,
) -> None:
    """Learning on, nothing configured: the controller lists, watches and writes through
    warmwatch; labelled ConfigMaps get the effect (existing, created and updated ones), others
    do not."""
    await _create(admin_api, namespace, "src-a", labelled=True, v="1")
    await _create(admin_api, namespace, "plain", labelled=False, v="1")
    sidecar = start_sidecar()
    controller = start_controller(sidecar, namespace)

    took = await wait_effects(
        stack, admin_api, namespace, ["src-a"], timeout=EFFECT_TIMEOUT, controller=controller
    )
    print(f"{stack.id}: existing object handled {took:.1f}s after start")

    await _create(admin_api, namespace, "src-b", labelled=True, v="1")
    await admin_api.merge_patch(_path(namespace, "src-a"), {"data": {"k": "2"}})
    took = await wait_effects(
        stack,
        admin_api,
        namespace,
        ["src-a", "src-b"],
        timeout=EFFECT_TIMEOUT,
        controller=controller,
    )
    print(f"{stack.id}: create and update handled in {took:.1f}s")

    stack.started_as_expected(controller, sidecar)
    plain = await _get(admin_api, namespace, "plain")
    assert plain is not None
    assert stack.problem(plain, await stack.effect_of(admin_api, plain)) is not None, (
        "an unlabelled ConfigMap got the effect"
    )
    # The controller read through warmwatch's cache (a watch is open there) and wrote through
    # its passthrough.
    assert sidecar.metric("warmwatch_watchers") >= 1, sidecar.metrics()
    writes = sum(
        sidecar.metric("warmwatch_passthrough_requests_total", {"verb": verb})
        for verb in ("POST", "PUT", "PATCH")
    )
    assert writes >= 2, sidecar.metrics()
    start_controller.check_output()


@pytest.mark.parametrize("stack", ["controller-runtime", "kopf"], indirect=True)
async def test_warm_restart_while_apiserver_down(
    stack: Stack,
    plane: ControlPlane,
    namespace: str,
    admin_api: kubeapi.RawClient,
    start_sidecar: Callable[..., Sidecar],
    start_controller: Started,
) -> None:
    """Controller and warmwatch stop; a labelled ConfigMap is created and another one's data
    changes; the apiserver goes down; warmwatch and the controller start again: the controller
    starts from the cache alone. When the apiserver returns, it carries out both changes."""
    await _create(admin_api, namespace, "src-old", labelled=True, v="1")
    await _create(admin_api, namespace, "src-upd", labelled=True, v="1")
    await _create(admin_api, namespace, "plain", labelled=False, v="1")
    sidecar = start_sidecar()
    first = start_controller(sidecar, namespace)
    await wait_effects(
        stack,
        admin_api,
        namespace,
        ["src-old", "src-upd"],
        timeout=EFFECT_TIMEOUT,
        controller=first,
    )
    cached = await cache_caught_up(sidecar, admin_api, namespace)
    assert first.stop() == 0, first.log_tail()  # graceful, and surely gone
    assert sidecar.stop() == 0

    await _create(admin_api, namespace, "src-new", labelled=True, v="new")
    await admin_api.merge_patch(_path(namespace, "src-upd"), {"data": {"k": "2"}})

    plane.stop_apiserver()
    try:
        assert _apiserver_down(plane)
        started = time.monotonic()
        sidecar.restart(wait_ready=False)
        sidecar.wait_ready(timeout=OFFLINE_START_TIMEOUT)
        ready = time.monotonic() - started
        second = start_controller(sidecar, namespace)
        stack.wait_started_offline(
            second, namespace=namespace, cached=cached, labelled={"src-old", "src-upd"}
        )
        offline_start = time.monotonic() - started
        # Its watch is open on warmwatch (served from the cache; the apiserver is away).
        for _ in range(50):
            if sidecar.metric("warmwatch_watchers") >= 1:
                break
            await asyncio.sleep(0.2)
        assert sidecar.metric("warmwatch_watchers") >= 1, sidecar.metrics()
        # An outage long enough to open warmwatch's circuit breaker, as a real one is: the
        # controller must still catch up as soon as the apiserver is back, not a cool-down later.
        for _ in range(150):
            if sidecar.metric(BREAKER, {"target": "apiserver"}) == BREAKER_OPEN:
                break
            await asyncio.sleep(0.2)
        assert sidecar.metric(BREAKER, {"target": "apiserver"}) == BREAKER_OPEN, sidecar.metrics()
        assert _apiserver_down(plane)  # all of the above happened without it
        print(
            f"{stack.id}: warmwatch ready {ready:.1f}s, controller started from the cache "
            f"{offline_start:.1f}s after warmwatch's restart, apiserver down"
        )
    finally:
        restarting = time.monotonic()
        plane.start_apiserver()
    back = time.monotonic() - restarting

    took = await wait_effects(
        stack,
        admin_api,
        namespace,
        ["src-new", "src-upd", "src-old"],
        timeout=CATCH_UP_TIMEOUT,
        controller=second,
    )
    print(
        f"{stack.id}: apiserver started and ready in {back:.1f}s; changes carried out "
        f"{back + took:.1f}s after its start"
    )
    assert took < CATCH_UP_BOUND, f"{stack.id}: caught up {took:.1f}s after the apiserver returned"
    stack.caught_up(second, created="src-new", updated="src-upd")
    assert second.running()
    start_controller.check_output()
