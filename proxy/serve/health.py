"""Health endpoints: ``/healthz``, ``/livez``, ``/readyz``, their checks and ``?verbose``.

On the API listener they answer what a controller needs. Controllers gate their start on
them: kube-controller-manager polls ``/healthz`` for 10 s and exits if it never passes.

- While the apiserver answers, its own answer is passed through (a failing etcd check
  included: the controller sees the apiserver as it is).
- While it cannot be reached (no connection, or the circuit breaker is open), warmwatch
  answers for itself: ``/healthz`` and ``/livez`` pass while warmwatch runs (its cache can
  serve reads), ``/readyz`` passes once every configured collection is serveable (the
  metrics listener's ``/readyz``). So a controller restarted while the apiserver is down
  starts, and syncs from the cache.

The same rendering serves the metrics listener's probes, which always answer for warmwatch.
Its form is the apiserver's: ``ok``, or with ``?verbose`` one ``[+]name ok`` line per check
and ``<endpoint> check passed``; a failure is HTTP 503 (the apiserver says 500; 503 is what
"not ready" means to a load balancer) with ``[-]name failed: <why>`` and ``<endpoint> check
failed``. A named check (``/readyz/etcd``) answers ``ok`` or the failure;
while the apiserver is away, warmwatch's one check stands for every name.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from proxy.serve.relaying import Offline
from proxy.upstream.discovering import HEALTH_ENDPOINTS
from proxy.upstream.errors import UpstreamUnavailable

Check = Callable[[], tuple[bool, str]]
"""A check: passing or not, and why."""


def is_health_path(path: str) -> bool:
    return any(path == e or path.startswith(f"{e}/") for e in HEALTH_ENDPOINTS)


def answer(request: web.BaseRequest, *, check: Check) -> web.Response:
    """warmwatch's own answer to a health request, in the apiserver's form."""
    endpoint, _, name = request.path.strip("/").partition("/")
    ok, why = check()
    headers = {"X-Content-Type-Options": "nosniff"}
    if name:
        text = "ok" if ok else f"internal server error: {name} failed: {why}\n"
    elif ok and "verbose" not in request.query:
        text = "ok"
    else:
        line = "[+]warmwatch ok" if ok else f"[-]warmwatch failed: {why}"
        text = f"[+]ping ok\n{line}\n{endpoint} check {'passed' if ok else 'failed'}\n"
    return web.Response(status=200 if ok else 503, text=text, headers=headers)


def alive() -> tuple[bool, str]:
    """Liveness: warmwatch is running, so its cache can serve reads."""
    return True, "ok"


def offline_answer(*, ready: Check) -> Offline:
    """The passthrough ``offline`` answer for the API listener's health paths."""

    async def respond(request: web.Request, error: UpstreamUnavailable) -> web.StreamResponse:
        return answer(request, check=ready if request.path.startswith("/readyz") else alive)

    return respond
