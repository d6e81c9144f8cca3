"""The admission counters and the apiserver's 429, without sockets (``proxy.serve.limiting``)."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp.test_utils import make_mocked_request

from proxy.serve.limiting import (
    TOO_MANY_REQUESTS,
    Admission,
    LimitReached,
    Limits,
    client_of,
    is_long_running,
    is_watch,
    too_many_requests,
)


def test_watches_are_bounded_in_total_and_per_client() -> None:
    admission = Admission(Limits(max_watches=3, max_client_watches=2))
    a1 = admission.watch("a")
    a1.__enter__()
    a2 = admission.watch("a")
    a2.__enter__()
    with pytest.raises(LimitReached) as per_client:
        admission.watch("a").__enter__()
    assert per_client.value.limit == "client_watches"
    with admission.watch("b"):
        with pytest.raises(LimitReached) as total:
            admission.watch("c").__enter__()
        assert total.value.limit == "watches"
    a1.__exit__(None, None, None)
    with admission.watch("a"):  # a slot given back is free again
        assert admission.watches == 2
    a2.__exit__(None, None, None)
    assert admission.watches == 0
    assert not admission.client_watches  # no entry kept for a client without watches


def test_short_passthrough_requests_are_bounded_in_total_and_per_client() -> None:
    """Each passed-through request holds an upstream connection until its answer is read:
    one client cannot take them all, and none over the total reaches the upstream pool."""
    admission = Admission(Limits(max_requests=3, max_client_requests=2))
    with admission.request("a"), admission.request("a"):
        with pytest.raises(LimitReached) as per_client:
            admission.request("a").__enter__()
        assert per_client.value.limit == "client_requests"
        with admission.request("b"):
            with pytest.raises(LimitReached) as total:
                admission.request("c").__enter__()
            assert total.value.limit == "requests"
        assert admission.requests == 2
    assert admission.requests == 0
    assert not admission.client_requests


@pytest.mark.parametrize(
    ("method", "target", "long_running"),
    [
        ("GET", "/api/v1/namespaces/a/configmaps?watch=true", True),
        ("GET", "/api/v1/watch/namespaces/a/configmaps", True),
        ("GET", "/api/v1/namespaces/a/pods/p/log?follow=true", True),
        ("GET", "/api/v1/namespaces/a/pods/p/exec?command=ls", True),
        ("GET", "/api/v1/nodes/n/proxy/metrics", True),
        ("GET", "/api/v1/namespaces/a/configmaps", False),
        ("GET", "/api/v1/namespaces/a/configmaps/watch", False),  # an object named "watch"
        ("POST", "/api/v1/namespaces/a/configmaps", False),
        ("GET", "/version", False),
    ],
)
def test_long_running_requests_hold_watch_slots(
    method: str, target: str, long_running: bool
) -> None:
    """The apiserver's long-running check: watches, and the log, exec, attach, portforward
    and proxy subresources."""
    assert is_long_running(make_mocked_request(method, target)) is long_running


async def test_list_streams_are_bounded_and_released_on_failure() -> None:
    admission = Admission(Limits(max_list_streams=1, list_stream_wait=0.05))
    with pytest.raises(RuntimeError):
        async with admission.list_stream():
            raise RuntimeError("the stream failed")
    async with admission.list_stream():
        with pytest.raises(LimitReached) as reached:
            async with admission.list_stream():
                pass
        assert reached.value.limit == "list_streams"
    assert admission.list_streams == 0


async def test_a_burst_of_list_streams_queues_for_the_slots() -> None:
    """A controller starting its informers at once: more streams than slots, each short;
    all are served in turn, none turned away."""
    admission = Admission(Limits(max_list_streams=2, list_stream_wait=5.0))
    served: list[int] = []

    async def stream(i: int) -> None:
        async with admission.list_stream():
            assert admission.list_streams <= 2
            await asyncio.sleep(0.01)
            served.append(i)

    await asyncio.gather(*(stream(i) for i in range(10)))
    assert sorted(served) == list(range(10))
    assert served[:2] == [0, 1]  # in order of arrival


def test_the_answer_is_maxinflights() -> None:
    response = too_many_requests()
    assert response.status == 429
    assert response.headers["Retry-After"] == "1"
    assert response.headers["Content-Type"] == "text/plain; charset=utf-8"
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert response.body == TOO_MANY_REQUESTS.encode()
    assert TOO_MANY_REQUESTS == "Too many requests, please try again later.\n"


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("/api/v1/configmaps?watch=1", True),
        ("/api/v1/configmaps?watch=true&resourceVersion=5", True),
        ("/api/v1/configmaps?watch=", True),  # Go: the empty string is true
        ("/api/v1/configmaps?watch=false", False),
        ("/api/v1/configmaps?watch=0", False),
        ("/api/v1/configmaps?watch=%zz", False),  # a bad escape drops the parameter
        ("/api/v1/watch/namespaces/a/configmaps", True),
        ("/apis/apps/v1/watch/deployments", True),
        ("/api/v1/configmaps", False),
        ("/api/v1/namespaces/a/pods/p/log?follow=true", False),
    ],
)
def test_a_watch_is_what_the_apiserver_takes_for_one(target: str, expected: bool) -> None:
    assert is_watch(make_mocked_request("GET", target)) is expected


def test_clients_are_told_apart_by_credentials_not_shown() -> None:
    one = make_mocked_request("GET", "/", headers={"Authorization": "Bearer one"})
    two = make_mocked_request("GET", "/", headers={"Authorization": "Bearer two"})
    none = make_mocked_request("GET", "/")
    keys = {client_of(one), client_of(two), client_of(none)}
    assert len(keys) == 3
    assert not any("one" in key or "two" in key for key in keys)
    assert client_of(one) == client_of(
        make_mocked_request("GET", "/x", headers={"Authorization": "Bearer one"})
    )
