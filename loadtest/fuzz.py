"""Hostile-input fuzzing: random requests, malformed HTTP and raw garbage at warmwatch in front of
a real apiserver.

    python -m loadtest.fuzz --dir /tmp/warmwatch-fuzz [--requests 200000] [--seed 1] \\
        [--concurrency 32] [--keep]

On a control plane of its own (loadtest/cluster.py, in DIR/cp) and a warmwatch with a few
cached shapes (loadtest/sidecar.py; database and log ``DIR/fuzz.*``), --requests cases are sent
by --concurrency workers, each on a new connection, as raw bytes:

- LISTs and WATCHes of cached and uncached collections with random values for every list/watch
  parameter (resourceVersion, resourceVersionMatch, limit, continue, labelSelector,
  fieldSelector, timeoutSeconds, allowWatchBookmarks, sendInitialEvents, watch), good and bad;
- single-object GETs, discovery, health, writes (POST/PUT/PATCH/DELETE in the fuzz namespace
  only) with valid, invalid and random bodies;
- ``Accept`` variants (JSON, protobuf, Table, PartialObjectMetadata, CBOR, garbage),
  random and oversized headers, HTTP/1.0, pipelined requests, invalid chunked bodies, bodies
  shorter than their ``Content-Length``, truncated headers, bad escapes, raw socket garbage.

Each case must get an answer (a status line) or a close within ``HANG_TIMEOUT``, the
apiserver's own deadline for a request plus a margin; otherwise it is a hang. One answered
later than ``CASE_TIMEOUT`` is slow: it is sent again to the apiserver and the table shows both
times (a cluster-wide LIST in YAML is one: warmwatch passes it through, and the apiserver
renders it whole before its status line, seconds per 10,000 objects). A 5xx from warmwatch is
sent again, byte for byte, to the apiserver: it is a finding unless the apiserver answers that
case with a 5xx too (or it is the 504 "Too large resource version" both give). warmwatch's RSS
is sampled all along, and its log is searched for tracebacks and ERROR lines. Prints one
markdown table; exits 1 on any finding.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import shutil
import ssl
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from loadtest import kubeapi
from loadtest.cluster import ControlPlane
from loadtest.sidecar import Sidecar

NAMESPACE = "fuzz"
SHAPES = (
    f"v1/configmaps@{NAMESPACE}",
    f"v1/configmaps@{NAMESPACE};protobuf",
    "v1/configmaps",
    "v1/configmaps;protobuf",
    "v1/services",
)
"""Cached from the start; requests for other collections are learned or passed through. The
cluster-wide ConfigMaps among them: every cluster-wide selector variant is then served by that
one shape rather than learning a shape of its own."""

SIDECAR_FLAGS = ("--header-timeout=5",)
"""A short header deadline, so that truncated headers are closed within the case timeout."""

CASE_TIMEOUT = 15.0
"""An answer later than this is slow (reported, not a finding): every case but a big LIST the
apiserver renders itself is answered in well under a second."""
HANG_TIMEOUT = 75.0
"""No answer and no close by then is a hang: the apiserver answers or cuts every request that
is not a watch within its ``--request-timeout`` (60 s), and warmwatch gives up waiting for it
after as long (``PassthroughSettings.idle_timeout``)."""
MAX_ANSWER_BYTES = 64 << 20
"""What a case keeps of its answers: pipelined answers are found by their status lines in it,
so it must hold a whole LIST before the next answer (a cluster-wide LIST of what the other
suites left is several MiB; a cap of 1 MiB here once dropped the answers after it and
reported them as a hang)."""
STATUS_LINE = re.compile(rb"HTTP/1\.[01] (\d{3})[^\r\n]*\r\n")


@dataclass(frozen=True)
class Case:
    kind: str
    data: bytes
    answers: int = 1
    """Status lines expected (pipelined requests expect several; garbage may get none)."""
    hang_up: bool = False
    """Half-close after sending: the request is incomplete and the client has given up."""


@dataclass
class Exchange:
    statuses: list[int]
    closed: bool
    hung: bool
    heads: list[bytes]
    """The start of each answer (status line, headers, the start of the body)."""
    seconds: float
    """Until the answers' heads arrived or the connection ended."""


@dataclass
class Finding:
    kind: str
    what: str
    request: bytes


@dataclass
class Report:
    requests: int = 0
    seconds: float = 0.0
    by_kind: Counter[str] = field(default_factory=Counter)
    statuses: Counter[int] = field(default_factory=Counter)
    closed_without_answer: int = 0
    replayed: int = 0
    hangs: list[Finding] = field(default_factory=list)
    slow: list[Finding] = field(default_factory=list)
    """Answered after ``CASE_TIMEOUT``; ``what`` gives warmwatch's and the apiserver's time."""
    server_errors: list[Finding] = field(default_factory=list)
    """5xx from warmwatch the apiserver does not give for the same bytes."""
    client_errors_replayed: int = 0
    client_errors_differing: list[Finding] = field(default_factory=list)
    """4xx answers of warmwatch to a collection read (the requests it answers itself: the
    query checks) that the apiserver gives another code for, such as 400 where it finds
    no such resource (404) or no such media type (406) first."""
    tracebacks: int = 0
    error_lines: list[str] = field(default_factory=list)
    rss_start: int = 0
    rss_max: int = 0
    rss_end: int = 0

    @property
    def ok(self) -> bool:
        return not (
            self.hangs
            or self.server_errors
            or self.client_errors_differing
            or self.tracebacks
            or self.error_lines
        )

    def table(self) -> list[str]:
        mib = 2**20
        rows = [
            ("requests (cases)", f"{self.requests:,}"),
            ("seconds", f"{self.seconds:.0f} ({self.requests / max(self.seconds, 1e-9):.0f}/s)"),
            (
                "answers by status",
                ", ".join(f"{k}: {v:,}" for k, v in sorted(self.statuses.items())),
            ),
            ("closed without an answer", f"{self.closed_without_answer:,}"),
            ("5xx replayed to the apiserver", f"{self.replayed:,}"),
            ("5xx the apiserver does not give", f"{len(self.server_errors):,}"),
            (
                "4xx to a collection read replayed to the apiserver",
                f"{self.client_errors_replayed:,}",
            ),
            ("... answered with another code there", f"{len(self.client_errors_differing):,}"),
            ("hangs", f"{len(self.hangs):,}"),
            (f"answered after {CASE_TIMEOUT:.0f} s (slow)", f"{len(self.slow):,}"),
            ("tracebacks in warmwatch's log", f"{self.tracebacks:,}"),
            ("ERROR lines in warmwatch's log", f"{len(self.error_lines):,}"),
            (
                "warmwatch RSS start / max / end",
                f"{self.rss_start / mib:.0f} / {self.rss_max / mib:.0f} / {self.rss_end / mib:.0f} MiB",
            ),
            ("cases by kind", ", ".join(f"{k}: {v:,}" for k, v in sorted(self.by_kind.items()))),
        ]
        lines = ["| fuzz | |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)]
        for finding in (self.server_errors + self.client_errors_differing + self.hangs)[:20]:
            lines.append(f"| finding: {finding.kind} | {finding.what}: {finding.request[:300]!r} |")
        lines.extend(
            f"| slow: {finding.kind} | {finding.what}: {finding.request[:300]!r} |"
            for finding in self.slow[:10]
        )
        lines.extend(f"| log | {line[:300]} |" for line in self.error_lines[:20])
        return lines


# ----------------------------------------------------------------------------- generating

ACCEPTS = (
    None,
    "application/json",
    "application/json, */*",
    "application/vnd.kubernetes.protobuf",
    "application/vnd.kubernetes.protobuf, application/json",
    "application/vnd.kubernetes.protobuf;stream=watch",
    "application/json;as=Table;v=v1;g=meta.k8s.io",
    "application/json;as=Table;v=v1;g=meta.k8s.io, application/json",
    "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io",
    "application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io",
    "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io",
    "application/cbor",
    "application/apply-patch+cbor",
    "application/yaml",
    "text/html",
    "*/*",
    "*/*;q=x",
    "application/json;q=0",
    ";;;",
    "application/json;as=Table;v=v9;g=meta.k8s.io",
    "\x7f\x01",
)

PARAMETERS: dict[str, tuple[str, ...]] = {
    "resourceVersion": ("", "0", "1", "{rv}", "{rv}", "abc", "-1", "1e3", "00", "%20", "{ahead}"),
    "resourceVersionMatch": ("", "NotOlderThan", "Exact", "notolderthan", "Garbage"),
    "limit": ("", "1", "2", "0", "-1", "500", "abc", "99999999999999999999"),
    "continue": ("", "abc", "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MSwic3RhcnQiOiJ4In0", "%%%"),
    "labelSelector": (
        "",
        "a=b",
        "a!=b",
        "a in (x,y)",
        "!a",
        "a",
        "a in (x",
        "a=%zz",
        "a==b,c notin (d)",
        "x" * 300 + "=y",
        "a=" + "v" * 70,
    ),
    "fieldSelector": (
        "",
        "metadata.name=cm-00001",
        "metadata.namespace=" + NAMESPACE,
        "metadata.name!=x",
        "metadata.name",
        "spec.bogus=x",
        "metadata.name=a,metadata.namespace=b",
    ),
    "timeoutSeconds": ("", "0", "1", "1", "abc", "-1", "2"),
    "allowWatchBookmarks": ("", "true", "false", "1", "garbage"),
    "sendInitialEvents": ("", "true", "false", "x"),
    "watch": ("", "1", "true", "false", "0", "yes"),
}

COLLECTIONS = (
    f"/api/v1/namespaces/{NAMESPACE}/configmaps",
    f"/api/v1/namespaces/{NAMESPACE}/configmaps",
    f"/api/v1/namespaces/{NAMESPACE}/configmaps",
    "/api/v1/configmaps",
    "/api/v1/services",
    f"/api/v1/namespaces/{NAMESPACE}/services",
    f"/api/v1/namespaces/{NAMESPACE}/secrets",
    f"/api/v1/watch/namespaces/{NAMESPACE}/configmaps",
    "/apis/apps/v1/deployments",
    "/api/v1/nosuchresources",
    "/apis/nosuch.example.com/v1/things",
)

OTHER_PATHS = (
    "/api",
    "/apis",
    "/api/v1",
    "/apis/apps/v1",
    "/version",
    "/healthz",
    "/readyz?verbose",
    "/livez/ping",
    f"/api/v1/namespaces/{NAMESPACE}",
    f"/api/v1/namespaces/{NAMESPACE}/configmaps/cm-00001",
    f"/api/v1/namespaces/{NAMESPACE}/configmaps/no-such",
    f"/api/v1/namespaces/{NAMESPACE}/configmaps/cm-00001/status",
    f"/api/v1/namespaces/{NAMESPACE}/pods/nopod/log",
    "/api/v1/namespaces/%zz/configmaps",
    "/api/v1/namespaces/a%2Fb/configmaps",
    "/api/v1/../v1/configmaps",
    "//api/v1/configmaps",
    "/api/v1/namespaces/" + "n" * 300 + "/configmaps",
    "/metrics",
    "/",
    "*",
)


class Generator:
    """Random cases from one seed."""

    def __init__(self, *, seed: int, rv: Callable[[], str]) -> None:
        self.rng = random.Random(seed)
        self.rv = rv

    def case(self) -> Case:
        r = self.rng.random()
        if r < 0.55:
            return Case("list/watch", self.request("GET", self.collection_target()))
        if r < 0.65:
            return Case("get", self.request("GET", self.rng.choice(OTHER_PATHS)))
        if r < 0.75:
            return self.write()
        if r < 0.79:
            return Case("http/1.0", self.request("GET", self.collection_target(), version="1.0"))
        if r < 0.84:
            return self.pipelined()
        if r < 0.89:
            return self.broken_body()
        if r < 0.94:
            return self.garbage()
        if r < 0.98:
            return self.odd_headers()
        return self.truncated()

    # -- parts ---------------------------------------------------------------------------

    def collection_target(self, *, watch: bool = True) -> str:
        """A collection and a random query; ``watch=False``: never a watch (a request
        pipelined behind a watch would wait for its end)."""
        rng = self.rng
        pairs = []
        for name, values in PARAMETERS.items():
            if not watch and name == "watch":
                continue
            if rng.random() < 0.35:
                raw = rng.choice(values)
                if raw == "{ahead}" and rng.random() < 0.9:
                    raw = "{rv}"  # an RV ahead waits 3 s (then 504): keep it rare
                value = raw.format(rv=self.rv(), ahead=str(int(self.rv()) + 10**6))
                pairs.append((name, value))
        if any(k == "watch" for k, _ in pairs) and not any(k == "timeoutSeconds" for k, _ in pairs):
            pairs.append(("timeoutSeconds", "1"))  # every watch ends by itself
        if rng.random() < 0.05:
            pairs.append((rng.choice(("x", "watch", "limit", "%zz", "a;b")), "%zz"))
        query = "&".join(f"{k}={_escape(v, rng)}" for k, v in pairs)
        path = rng.choice([c for c in COLLECTIONS if watch or "/watch/" not in c])
        if "/watch/" in path and "timeoutSeconds" not in query:
            query += ("&" if query else "") + "timeoutSeconds=1"
        return f"{path}?{query}" if query else path

    def headers(self) -> list[tuple[str, str]]:
        rng = self.rng
        headers = [("Host", "127.0.0.1")]
        accept = rng.choice(ACCEPTS)
        if accept is not None:
            headers.append(("Accept", accept))
        if rng.random() < 0.1:
            headers.append(("Authorization", "Bearer " + "t0ken" * rng.randint(1, 20)))
        if rng.random() < 0.05:
            headers.append(("Accept-Encoding", rng.choice(("gzip", "br", "garbage"))))
        if rng.random() < 0.05:
            headers.append(("Audit-Id", "".join(rng.choice("abc-123") for _ in range(20))))
        if rng.random() < 0.05:
            headers.append(("X-" + "".join(rng.choice("abcXYZ-") for _ in range(8)), "v" * 100))
        return headers

    def request(
        self,
        method: str,
        target: str,
        *,
        version: str = "1.1",
        body: bytes | None = None,
        content_type: str | None = None,
        close: bool = True,
        extra: list[tuple[str, str]] | None = None,
    ) -> bytes:
        headers = self.headers() + (extra or [])
        if content_type:
            headers.append(("Content-Type", content_type))
        if body is not None:
            headers.append(("Content-Length", str(len(body))))
        if close and version == "1.1":
            headers.append(("Connection", "close"))
        head = f"{method} {target} HTTP/{version}\r\n" + "".join(
            f"{k}: {v}\r\n" for k, v in headers
        )
        return head.encode("latin-1") + b"\r\n" + (body or b"")

    def write(self) -> Case:
        rng = self.rng
        name = f"f-{rng.randrange(10**9)}"
        objects = f"/api/v1/namespaces/{NAMESPACE}/configmaps"
        configmap = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "labels": {"a": rng.choice("xyz")}},
            "data": {"k": "v" * rng.randint(0, 2000)},
        }
        bodies = (
            json.dumps(configmap).encode(),
            json.dumps(configmap).encode(),
            b"{",
            b"",
            b"null",
            rng.randbytes(rng.randint(1, 500)),
            json.dumps({"kind": "Pod"}).encode(),
        )
        method, target = rng.choice(
            (
                ("POST", objects),
                ("POST", objects),
                ("PUT", f"{objects}/{name}"),
                ("PATCH", f"{objects}/cm-0000{rng.randrange(10)}"),
                ("DELETE", f"{objects}/{name}"),
                ("DELETE", f"{objects}/cm-0004{rng.randrange(10)}"),
                ("POST", f"/api/v1/namespaces/{NAMESPACE}/secrets"),
            )
        )
        content_type = rng.choice(
            (
                "application/json",
                "application/json",
                "application/merge-patch+json",
                "application/strategic-merge-patch+json",
                "application/apply-patch+yaml",
                "application/vnd.kubernetes.protobuf",
                "text/plain",
                None,
            )
        )
        if method == "PATCH" and content_type == "application/json":
            content_type = "application/merge-patch+json"
        return Case(
            "write",
            self.request(method, target, body=rng.choice(bodies), content_type=content_type),
        )

    def pipelined(self) -> Case:
        count = self.rng.randint(2, 4)
        requests = [
            self.request("GET", self.collection_target(watch=i == count - 1), close=i == count - 1)
            for i in range(count)
        ]
        return Case("pipelined", b"".join(requests), answers=count)

    def broken_body(self) -> Case:
        rng = self.rng
        objects = f"/api/v1/namespaces/{NAMESPACE}/configmaps"
        choice = rng.randrange(4)
        if choice == 0:  # invalid chunk sizes
            head = self.request(
                "POST",
                objects,
                content_type="application/json",
                extra=[("Transfer-Encoding", "chunked")],
            )
            return Case(
                "invalid-chunking",
                head + rng.choice((b"zz\r\nxx\r\n", b"5\r\n{\r\n0\r\n\r\n", b"-1\r\n")),
            )
        if choice == 1:  # a valid chunked body
            body = json.dumps(
                {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "c-"}}
            ).encode()
            head = self.request(
                "POST",
                objects,
                content_type="application/json",
                extra=[("Transfer-Encoding", "chunked")],
            )
            return Case("chunked", head + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
        if choice == 2:  # shorter than its Content-Length, then the client gives up
            head = self.request(
                "POST", objects, content_type="application/json", extra=[("Content-Length", "1000")]
            )
            return Case("short-body", head + b'{"apiVersion":', hang_up=True)
        both = self.request(  # Content-Length and Transfer-Encoding together (smuggling)
            "POST",
            objects,
            content_type="application/json",
            extra=[("Content-Length", "5"), ("Transfer-Encoding", "chunked")],
        )
        return Case("cl-and-te", both + b"0\r\n\r\nGET / HTTP/1.1\r\n\r\n")

    def garbage(self) -> Case:
        rng = self.rng
        data = rng.choice(
            (
                rng.randbytes(rng.randint(1, 2000)),
                b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + rng.randbytes(100),
                b"GET\r\n\r\n",
                b"GET / HTTP/2.0\r\n\r\n",
                b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
                b"GET /api HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: -1\r\n\r\n",
                b"GET /api HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
                b"GET /api HTTP/1.1\r\nHost 127.0.0.1\r\n\r\n",
                b"GET /api HTTP/1.1\r\n Host: folded\r\n\r\n",
                b"GET /api HTTP/1.1\nHost: 127.0.0.1\n\n",
                b"G\x00T /api HTTP/1.1\r\n\r\n",
                b"GET /api/v1/\xff\xfe HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
                b"\r\n\r\n\r\n",
            )
        )
        return Case("garbage", data, hang_up=rng.random() < 0.5)

    def odd_headers(self) -> Case:
        rng = self.rng
        target = self.collection_target()
        choice = rng.randrange(5)
        if choice == 0:
            extra = [("X-Big", "a" * rng.choice((9000, 100_000, 600_000)))]
        elif choice == 1:
            extra = [("X-Huge", "a" * 1_100_000)]  # over the apiserver's 1 MiB: 431
        elif choice == 2:
            extra = [(f"X-H{i}", "v") for i in range(rng.choice((100, 1000)))]
        elif choice == 3:
            extra = [("Authorization", "Bearer \x01secret")]
        else:
            extra = [("Host", "evil.example.com"), ("Host", "127.0.0.1")]
        return Case("odd-headers", self.request("GET", target, extra=extra))

    def truncated(self) -> Case:
        data = self.request("GET", self.collection_target())
        return Case("truncated", data[: self.rng.randint(1, max(len(data) - 5, 1))], hang_up=True)


def _escape(value: str, rng: random.Random) -> str:
    """Percent-encode like a client mostly does; sometimes send the raw characters."""
    if rng.random() < 0.1:
        return value.replace(" ", "%20")
    return "".join(c if c.isalnum() or c in "-._~%!=," else f"%{ord(c):02X}" for c in value)


# ----------------------------------------------------------------------------- exchanging


async def exchange(
    host: str, port: int, case: Case, *, tls: ssl.SSLContext | None = None
) -> Exchange:
    """Send the case on a new connection; read until its answers' heads arrive, the server
    closes, or ``HANG_TIMEOUT`` passes (a hang)."""
    buffer = b""
    statuses: list[int] = []
    closed = False
    began = time.monotonic()
    deadline = began + HANG_TIMEOUT
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, ssl=tls, limit=1 << 22), CASE_TIMEOUT
        )
    except (OSError, TimeoutError):
        return Exchange(statuses=[], closed=True, hung=False, heads=[], seconds=0.0)
    try:
        writer.write(case.data)
        await asyncio.wait_for(writer.drain(), CASE_TIMEOUT)
        if case.hang_up and tls is None:
            writer.write_eof()
        while True:
            statuses = [int(m.group(1)) for m in STATUS_LINE.finditer(buffer)]
            if len(statuses) >= case.answers:
                last = list(STATUS_LINE.finditer(buffer))[-1]
                head_end = buffer.find(b"\r\n\r\n", last.start())
                if head_end >= 0 and (statuses[-1] < 500 or len(buffer) > head_end + 2000):
                    break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                chunk = await asyncio.wait_for(reader.read(65536), remaining)
            except TimeoutError:
                break
            if not chunk:
                closed = True
                break
            if len(buffer) < MAX_ANSWER_BYTES:
                buffer += chunk
    except (OSError, ssl.SSLError, TimeoutError):
        closed = True
    finally:
        writer.transport.abort()
    matches = list(STATUS_LINE.finditer(buffer))
    ends = [m.start() for m in matches[1:]] + [len(buffer)] * bool(matches)
    heads = [buffer[m.start() : end][:4000] for m, end in zip(matches, ends, strict=True)]
    statuses = [int(m.group(1)) for m in matches]
    hung = not closed and len(statuses) < case.answers
    return Exchange(
        statuses=statuses, closed=closed, hung=hung, heads=heads, seconds=time.monotonic() - began
    )


def expected_server_error(head: bytes) -> bool:
    """A 5xx the apiserver gives for the same request without a replay: 504 for a
    resourceVersion the cache has not reached (the watch cache's "Too large resource
    version")."""
    return head.startswith((b"HTTP/1.1 504", b"HTTP/1.0 504")) and (
        b"Too large resource version" in head
    )


# ----------------------------------------------------------------------------- running


def rss_of(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


async def _follow_rv(sidecar: Sidecar, *, current_rv: dict[str, str], report: Report) -> None:
    """The collection's current resourceVersion (in ``current_rv["rv"]``), for resumes and
    not-older-than reads; and warmwatch's peak RSS."""
    while True:
        probe = Case(
            "probe",
            f"GET /api/v1/namespaces/{NAMESPACE}/configmaps?limit=1 HTTP/1.1\r\n"
            "Host: 127.0.0.1\r\nConnection: close\r\n\r\n".encode(),
        )
        answer = await exchange("127.0.0.1", sidecar.port, probe)
        found = re.search(rb'"resourceVersion":"(\d+)"', b"".join(answer.heads))
        if found:
            current_rv["rv"] = found.group(1).decode()
        report.rss_max = max(report.rss_max, rss_of(sidecar.process.pid))
        await asyncio.sleep(0.5)


async def run(
    *,
    sidecar: Sidecar,
    apiserver: tuple[str, int],
    apiserver_tls: ssl.SSLContext,
    requests: int,
    seed: int = 1,
    concurrency: int = 32,
    log_start: int = 0,
) -> Report:
    """Fuzz ``sidecar`` with ``requests`` cases; replay its 5xx, and its 4xx to collection
    reads, to the apiserver."""
    report = Report(requests=requests)
    pid = sidecar.process.pid
    report.rss_start = report.rss_max = rss_of(pid)
    current_rv = {"rv": "1"}

    async def compare_client_error(case: Case, got: Exchange) -> None:
        report.client_errors_replayed += 1
        direct = await exchange(*apiserver, case, tls=apiserver_tls)
        theirs = direct.statuses[0] if direct.statuses else None
        if theirs != got.statuses[0]:
            what = f"warmwatch {got.statuses[0]}, apiserver {theirs}: {got.heads[0][-400:]!r}"
            report.client_errors_differing.append(Finding(case.kind, what, case.data))

    generator = Generator(seed=seed, rv=lambda: current_rv["rv"])
    cases = iter(range(requests))

    async def worker() -> None:
        for _ in cases:
            case = generator.case()
            report.by_kind[case.kind] += 1
            got = await exchange("127.0.0.1", sidecar.port, case)
            report.statuses.update(got.statuses)
            if not got.statuses and got.closed:
                report.closed_without_answer += 1
            if got.hung:
                report.hangs.append(Finding(case.kind, "no answer, no close", case.data))
            elif got.seconds > CASE_TIMEOUT:
                direct = await exchange(*apiserver, case, tls=apiserver_tls)
                what = f"warmwatch {got.seconds:.1f} s, apiserver {direct.seconds:.1f} s"
                report.slow.append(Finding(case.kind, what, case.data))
            unexpected = [
                i
                for i, (status, head) in enumerate(zip(got.statuses, got.heads, strict=True))
                if status >= 500 and not expected_server_error(head)
            ]
            if case.kind == "list/watch" and got.statuses and 400 <= got.statuses[0] < 500:
                await compare_client_error(case, got)
            if unexpected:
                report.replayed += 1
                direct = await exchange(*apiserver, case, tls=apiserver_tls)
                for i in unexpected:
                    theirs = direct.statuses[i] if i < len(direct.statuses) else None
                    if theirs is None or theirs < 500:
                        what = (
                            f"warmwatch {got.statuses[i]}, apiserver {theirs}: "
                            f"{got.heads[i][:400]!r}"
                        )
                        report.server_errors.append(Finding(case.kind, what, case.data))

    began = time.monotonic()
    follower = asyncio.create_task(
        _follow_rv(sidecar, current_rv=current_rv, report=report), name="fuzz rv follower"
    )
    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)
    report.seconds = time.monotonic() - began
    report.rss_end = rss_of(pid)
    report.rss_max = max(report.rss_max, report.rss_end)
    text = sidecar.log.read_bytes()[log_start:].decode(errors="replace")
    report.tracebacks = text.count("Traceback")
    report.error_lines = [line for line in text.splitlines() if " ERROR " in line]
    return report


async def prepare(plane: ControlPlane, *, objects: int = 60) -> None:
    """The fuzz namespace and some ConfigMaps in it (idempotent)."""
    async with kubeapi.RawClient(
        base_url=plane.server, ssl_context=kubeapi.client_ssl(plane.pki, identity="admin")
    ) as api:
        await kubeapi.ensure_namespace(api, NAMESPACE)
        existing = await api.get(f"/api/v1/namespaces/{NAMESPACE}/configmaps", limit="1")
        if not existing["items"]:
            await kubeapi.create_configmaps(
                api, namespace=NAMESPACE, count=objects, size=500, labels={"a": "x"}
            )


def apiserver_address(plane: ControlPlane) -> tuple[str, int]:
    return "127.0.0.1", int(plane.server.rsplit(":", 1)[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.fuzz",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--keep", action="store_true", help="leave the control plane running")
    args = parser.parse_args(argv)
    directory: Path = args.dir.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    plane = ControlPlane(directory / "cp")
    plane.up()
    sidecar: Sidecar | None = None
    try:
        asyncio.run(prepare(plane))
        db = directory / "fuzz.db"
        for stale in directory.glob("fuzz.db*"):
            stale.unlink()
        log = db.with_suffix(".log")
        log_start = log.stat().st_size if log.exists() else 0
        sidecar = Sidecar.start(
            upstream_kubeconfig=plane.admin_kubeconfig,
            db=db,
            resources=SHAPES,
            extra=SIDECAR_FLAGS,
        )
        report = asyncio.run(
            run(
                sidecar=sidecar,
                apiserver=apiserver_address(plane),
                apiserver_tls=kubeapi.client_ssl(plane.pki, identity="admin"),
                requests=args.requests,
                seed=args.seed,
                concurrency=args.concurrency,
                log_start=log_start,
            )
        )
        print("\n".join(report.table()))
        return 0 if report.ok else 1
    finally:
        if sidecar is not None:
            sidecar.stop()
        if not args.keep:
            plane.down()
            shutil.rmtree(directory / "cp", ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
