"""A kopf operator for the warm-restart tests (tests/e2e/test_controller_runtime_kopf.py).

Run as kopf runs any operator, with its kubeconfig pointing at warmwatch:

    KUBECONFIG=... python -m kopf run --standalone --namespace NS tests/e2e/kopf_operator.py

On every ConfigMap labelled ``warmwatch.test/mirror=true`` that is created, or whose ``data``
changes, it sets the annotation ``warmwatch.test/kopf-data`` to ``data_annotation(data)``: the
effect the tests look for upstream. It prints JSON lines on stdout (kopf logs to stderr):

    {"kind":"startup"}                                    the operator's startup handlers ran
    {"kind":"event","type":null,"name":"a","rv":"12"}     every labelled ConfigMap it sees; type
                                                          null = listed (kopf's initial list)
    {"kind":"handled","cause":"create","name":"a","rv":"12","value":"{...}"}

Kopf's own Kubernetes Events (posted for handler outcomes) are off, so the handlers' patches are
the operator's only writes besides kopf's bookkeeping annotation on the same object.

Login: kopf piggybacks on a client library when one is installed; here kubernetes_asyncio (a
warmwatch dependency) is, so it logs in with ``login_via_async_client``. With
``WARMWATCH_KOPF_LOGIN=kubeconfig`` it uses kopf's own minimal kubeconfig reader instead
(``kopf.login_with_kubeconfig``, what kopf uses where no client library is installed), as the
activity ``kubeconfig_login``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Mapping
from typing import Any

import kopf

LABELS = {"warmwatch.test/mirror": "true"}
ANNOTATION = "warmwatch.test/kopf-data"


def data_annotation(data: Mapping[str, str] | None) -> str:
    """The annotation's value for a ConfigMap with ``data``."""
    return json.dumps(dict(data or {}), sort_keys=True, separators=(",", ":"))


_stdout = threading.Lock()


def emit(**fields: Any) -> None:
    """One JSON line, whole: kopf runs sync handlers on several threads at once."""
    line = json.dumps(fields) + "\n"
    with _stdout:
        sys.stdout.write(line)
        sys.stdout.flush()


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.posting.enabled = False
    emit(kind="startup")


if os.environ.get("WARMWATCH_KOPF_LOGIN") == "kubeconfig":

    @kopf.on.login()
    def kubeconfig_login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        return kopf.login_with_kubeconfig(**kwargs)


@kopf.on.event("configmaps", labels=LABELS)
def seen(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
    emit(
        kind="event",
        type=event["type"],
        name=body.metadata.name,
        rv=body.metadata.get("resourceVersion"),
    )


def _annotate(cause: str, body: kopf.Body, patch: kopf.Patch) -> None:
    value = data_annotation(body.get("data"))
    patch.metadata.annotations[ANNOTATION] = value
    emit(
        kind="handled",
        cause=cause,
        name=body.metadata.name,
        rv=body.metadata.get("resourceVersion"),
        value=value,
    )


@kopf.on.create("configmaps", labels=LABELS)
def created(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
    _annotate("create", body, patch)


@kopf.on.update("configmaps", labels=LABELS, field="data")
def data_changed(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
    _annotate("update", body, patch)
