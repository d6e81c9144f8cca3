"""Peer seeding: a new warmwatch starts from a peer's snapshot (docs/design.md §3).

At start, when the database is new (``snapshotting.is_new``) and peers are named
(``--seed-peer``) or found (``peering.look_up``: the serving pods of the same workload, when
``--pod-name`` and ``--pod-namespace`` say which pod this is), :func:`seed` asks each in
turn for ``GET /seed`` on its seeding listener (``serve.seeding``, TLS), the token and the
answer bound to that connection both ways (``binding``): a token of warmwatch's own service
account for the peer's certificate, sent only over a connection pinned to it, and the
peer's token for this request, checked before the snapshot is read. It writes the answer
beside the database, checks its length and SHA-256 (:data:`DIGEST_HEADER`), then the file
itself (``snapshotting.check_snapshot``: integrity, schema version, and the cluster identity
against what the apiserver says now), and only then renames it into place. The whole is
bounded in time (:meth:`SeedSettings.bound`). Any failure leaves no file and the start is
cold, as without a peer. One result is counted per start
(``warmwatch_seedings_total{result}``):

- ``installed``: a snapshot is the database now;
- ``refused``: every peer asked refused the token (401/403);
- ``failed``: a peer or the snapshot failed (unreachable, not proven to be warmwatch's own
  service account, truncated, corrupt, another cluster's, too slow), or this apiserver's
  identity cannot be read, or no seeding token can be had;
- ``none``: not asked (``--seed=off``, no peer named or found, the lookup failed, or a
  database already there).

The peer is not the apiserver: this module talks to it with a client session of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
import ssl
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

import aiohttp

from proxy.cache import snapshotting
from proxy.cache.store import StorageError, Store, keep_private
from proxy.metrics import Metrics
from proxy.upstream.binding import (
    REPLY_HEADER,
    ServiceAccount,
    peer_audience,
    reply_audience,
    request_token,
)
from proxy.upstream.connecting import Upstream
from proxy.upstream.errors import UpstreamError, UpstreamStatusError
from proxy.upstream.peering import look_up
from proxy.upstream.reviewing import UserInfo, review_token, who_am_i

logger = logging.getLogger(__name__)

SEED_PATH: Final = "/seed"
"""Where a peer's seeding listener serves its snapshot."""

DIGEST_HEADER: Final = "Warmwatch-Snapshot-Sha256"
"""The snapshot's SHA-256, hex, sent before its bytes."""

KUBE_SYSTEM: Final = "/api/v1/namespaces/kube-system"

CONNECT_TIMEOUT: Final = 5.0
"""Seconds to reach a peer's listener (and finish the TLS handshake): a peer whose pod is gone (no reset, packets dropped)
is given up for the next one, not waited for until the whole bound is spent."""

CHUNK: Final = 1 << 20
GIB: Final = 1 << 30

Result = Literal["installed", "refused", "failed", "none"]


@dataclass(frozen=True, kw_only=True, slots=True)
class SeedSettings:
    mode: Literal["auto", "off"] = "auto"
    """``auto``: seed a new database from a named peer; ``off``: never ask."""
    peers: tuple[tuple[str, int], ...] = ()
    """Peers' metrics listeners (``--seed-peer``), asked in order until one gives a snapshot.
    None named: looked up from ``pod_name`` and ``pod_namespace``."""
    pod_name: str | None = None
    pod_namespace: str | None = None
    """This warmwatch's pod (``--pod-name``, ``--pod-namespace``; the downward API in a pod),
    whose workload's other pods are the peers when none is named. Unset: no lookup (outside
    a pod there is no workload)."""
    peer_port: int | None = None
    """The seeding port of the peers found by lookup (``--seed-peer-port``). Every pod of a
    workload runs with the same flags, so the command line makes it this warmwatch's own
    ``--seed-listen`` port; without either there is no lookup."""
    timeout: float = 30.0
    """The fixed part of the bound on the whole seeding: the apiserver's identity, reaching
    the peers (:data:`CONNECT_TIMEOUT` each), the checks. Measured, the whole seeding of
    100,000 ConfigMaps (a 53 MB snapshot) took 0.5 s on loopback; 30 s leaves room for a few
    peers that do not answer, and is less than a cold fill of a large cache (minutes)."""
    seconds_per_gib: float = 20.0
    """Added to the bound per GiB the peer announces: its copy, digest, sending, and the
    receiver's digest and checks took 0.5 s for 53 MB on loopback (~10 s per GiB on the
    2-core test machine); a 1 Gbit/s pod network adds ~9 s per GiB."""

    def __post_init__(self) -> None:
        if self.mode not in ("auto", "off"):
            raise ValueError(f"--seed must be auto or off, not {self.mode!r}")
        if not self.timeout > 0 or self.seconds_per_gib < 0:
            raise ValueError("--seed-timeout must be positive, --seed-seconds-per-gib not negative")
        if (self.pod_name is None) != (self.pod_namespace is None):
            raise ValueError("--pod-name and --pod-namespace go together")
        if self.peer_port is not None and not 0 < self.peer_port < 65536:
            raise ValueError(f"--seed-peer-port must be a port, not {self.peer_port}")
        if self.pod_name is not None and self.peer_port is None:
            raise ValueError("--pod-name needs the peers' port: --seed-listen or --seed-peer-port")

    def bound(self, size: int) -> float:
        """Seconds the whole seeding may take for a snapshot of ``size`` bytes."""
        return self.timeout + self.seconds_per_gib * size / GIB


class SeedRefused(Exception):
    """The peer refused the token (401 or 403)."""


class SeedFailed(Exception):
    """The peer's answer is no snapshot this warmwatch can install (the reason)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Received:
    path: Path
    size: int


async def cluster_identity(upstream: Upstream) -> str | None:
    """The ``kube-system`` namespace's UID, the cluster's identity; None when warmwatch's
    account may not read it (or there is none). Other failures are raised."""
    try:
        answer = await upstream.json_request("GET", KUBE_SYSTEM, purpose="review", verb="GET")
    except UpstreamStatusError as error:
        if error.code in (403, 404):
            return None
        raise
    uid = (answer.get("metadata") or {}).get("uid")
    return str(uid) if uid else None


IDENTITY_RETRY: Final = 10.0
"""Seconds between attempts to read the cluster's identity while the apiserver cannot be
asked."""


async def remember_cluster(store: Store, *, upstream: Upstream) -> None:
    """Record the cluster's identity in the database at first contact with the apiserver
    (retried until it answers). An account that may not read it leaves none: the cache is
    then never offered to a peer."""
    while True:
        try:
            uid = await cluster_identity(upstream)
            break
        except UpstreamError as error:
            logger.debug("cluster identity not read yet: %s", error)
            await asyncio.sleep(IDENTITY_RETRY)
    if uid is None:
        logger.info(
            "the kube-system namespace cannot be read (RBAC: get namespaces/kube-system): "
            "without the cluster's identity this cache is not offered to peers"
        )
        return
    try:
        await store.record_cluster_identity(uid)
    except StorageError as error:
        logger.warning("cluster identity not recorded: %s", error)


async def seed(
    settings: SeedSettings, *, upstream: Upstream, database: Path, metrics: Metrics
) -> Result:
    """Install a peer's snapshot at ``database`` when it is new and a peer gives one; the
    result (also counted). Never raises for a peer's or a snapshot's failure."""
    result = await _seed(settings, upstream=upstream, database=database, metrics=metrics)
    metrics.seedings.labels(result=result).inc()
    return result


async def _seed(
    settings: SeedSettings, *, upstream: Upstream, database: Path, metrics: Metrics
) -> Result:
    if settings.mode == "off" or not (settings.peers or settings.pod_name):
        return "none"
    if not snapshotting.is_new(database):
        logger.info("seeding: not asked, %s is not a new database", database)
        return "none"
    started, begun = time.monotonic(), asyncio.get_running_loop().time()
    peers = settings.peers or await _find_peers(settings, upstream=upstream, until=begun)
    if not peers:
        return "none"
    refused = 0
    try:
        async with asyncio.timeout_at(begun + settings.bound(0)) as deadline:
            asking = await _asking(
                settings, upstream=upstream, metrics=metrics, deadline=deadline, started=started
            )
            if asking is None:
                return "failed"
            for peer in peers:
                try:
                    await _from_peer(peer, asking=asking, database=database)
                    return "installed"
                except SeedRefused as error:
                    refused += 1
                    logger.warning("seeding: peer %s:%d refused: %s", *peer, error)
                except (SeedFailed, snapshotting.SnapshotRejected) as error:
                    logger.warning("seeding: peer %s:%d failed: %s", *peer, error)
                except (aiohttp.ClientError, OSError) as error:
                    logger.warning("seeding: peer %s:%d failed: %r", *peer, error)
    except TimeoutError:
        logger.warning("seeding: not done within its bound; starting cold")
    except (UpstreamError, OSError) as error:
        logger.warning("seeding: %s; starting cold", error)
    return "refused" if refused == len(peers) else "failed"


@dataclass(frozen=True, kw_only=True, slots=True)
class Asking:
    """What asking a peer takes: the apiserver (tokens and their reviews), warmwatch's own
    identity, the cluster's, and the bound."""

    settings: SeedSettings
    upstream: Upstream
    own: UserInfo
    account: ServiceAccount
    cluster: str
    metrics: Metrics
    deadline: asyncio.Timeout
    started: float
    """When the seeding began (``time.monotonic``), for its log line."""


async def _asking(
    settings: SeedSettings,
    *,
    upstream: Upstream,
    metrics: Metrics,
    deadline: asyncio.Timeout,
    started: float,
) -> Asking | None:
    """The cluster's identity and warmwatch's own service account, or None (logged) when
    either is missing: no snapshot could then be checked, or no token be bound."""
    cluster = await cluster_identity(upstream)
    if cluster is None:
        logger.warning(
            "seeding: the kube-system namespace cannot be read, so a snapshot cannot be told "
            "from another cluster's; starting cold"
        )
        return None
    own = await who_am_i(upstream)
    account = ServiceAccount.of(own)
    if account is None:
        logger.warning(
            "seeding: warmwatch's identity %s is not a service account, for which alone a "
            "seeding token can be requested; starting cold",
            own.username,
        )
        return None
    return Asking(
        settings=settings,
        upstream=upstream,
        own=own,
        account=account,
        cluster=cluster,
        metrics=metrics,
        deadline=deadline,
        started=started,
    )


async def _find_peers(
    settings: SeedSettings, *, upstream: Upstream, until: float
) -> tuple[tuple[str, int], ...]:
    """The running pods of this pod's workload (``peering.look_up``), within the seeding's
    fixed bound from ``until`` (the loop's clock); none when the lookup fails (no RBAC, no
    such pod, the apiserver away): one line, and the start is cold."""
    assert settings.pod_name is not None and settings.pod_namespace is not None
    assert settings.peer_port is not None  # (SeedSettings: a pod name needs it)
    pod = f"{settings.pod_namespace}/{settings.pod_name}"
    try:
        async with asyncio.timeout_at(until + settings.timeout):
            peers = await look_up(
                upstream,
                name=settings.pod_name,
                namespace=settings.pod_namespace,
                port=settings.peer_port,
            )
    except TimeoutError:
        logger.warning("seeding: the peers of pod %s not found within %g s", pod, settings.timeout)
        return ()
    except UpstreamError as error:
        logger.warning("seeding: the peers of pod %s cannot be looked up: %s", pod, error)
        return ()
    logger.info(
        "seeding: peers of pod %s: %s",
        pod,
        ", ".join(f"{host}:{port}" for host, port in peers) or "none serving; starting cold",
    )
    return peers


async def _from_peer(peer: tuple[str, int], *, asking: Asking, database: Path) -> None:
    """Fetch, check and install one peer's snapshot, or raise; the partial file is always
    deleted."""
    partial = database.with_name(f"{database.name}.seed-partial")
    try:
        received = await _fetch(peer, asking=asking, into=partial)
        summary = await asyncio.to_thread(
            snapshotting.check_snapshot, partial, cluster_uid=asking.cluster
        )
        snapshotting.install(partial, database=database)
    finally:
        partial.unlink(missing_ok=True)
    logger.info(
        "seeded %s from peer %s:%d: %d bytes, %d shapes, %d objects, in %.1f s",
        database,
        *peer,
        received.size,
        summary.shapes,
        summary.objects,
        time.monotonic() - asking.started,
        extra={"peer": f"{peer[0]}:{peer[1]}", "bytes": received.size},
    )


async def peer_certificate(peer: tuple[str, int]) -> bytes:
    """The DER certificate ``peer`` presents in a TLS handshake (not verified: it is
    self-signed; what binds it is the token's audience)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        async with asyncio.timeout(CONNECT_TIMEOUT):
            _, writer = await asyncio.open_connection(*peer, ssl=context)
    except TimeoutError:
        raise SeedFailed(f"no TLS handshake within {CONNECT_TIMEOUT:g} s") from None
    try:
        ssl_object = writer.get_extra_info("ssl_object")
        certificate = ssl_object.getpeercert(binary_form=True) if ssl_object else None
    finally:
        writer.close()
        with contextlib.suppress(OSError, ssl.SSLError):
            await writer.wait_closed()
    if not certificate:
        raise SeedFailed("the peer presented no certificate")
    return bytes(certificate)


async def _fetch(peer: tuple[str, int], *, asking: Asking, into: Path) -> Received:
    """The peer's snapshot, written to ``into`` (a new private file), its sender proven and
    its length and digest checked; the deadline is extended by the announced size
    (:meth:`SeedSettings.bound`)."""
    certificate = await peer_certificate(peer)
    digest = hashlib.sha256(certificate)
    token = await request_token(
        asking.upstream, account=asking.account, audience=peer_audience(digest.hexdigest())
    )
    host = f"[{peer[0]}]" if ":" in peer[0] else peer[0]
    async with (
        aiohttp.ClientSession(
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT),
        ) as session,
        session.get(
            f"https://{host}:{peer[1]}{SEED_PATH}",
            headers={"Authorization": f"Bearer {token}"},
            # The token goes only over a connection to the certificate it is bound to.
            ssl=aiohttp.Fingerprint(digest.digest()),
        ) as response,
    ):
        if response.status in (401, 403):
            raise SeedRefused(f"{response.status} {(await response.text())[:200]}")
        if response.status != 200:
            raise SeedFailed(f"{response.status} {(await response.text())[:200]}")
        await _check_sender(response, token=token, asking=asking)
        size, expected = _announced(response)
        when = asking.deadline.when()
        if when is not None:
            bound = asking.settings.bound
            asking.deadline.reschedule(when + bound(size) - bound(0))
        received, hashing = await _receive(response, into=into, metrics=asking.metrics)
    if received != size:
        raise SeedFailed(f"truncated: {received} of {size} bytes")
    if hashing.hexdigest() != expected:
        raise SeedFailed("the snapshot's SHA-256 is not the one announced")
    return Received(path=into, size=size)


async def _check_sender(response: aiohttp.ClientResponse, *, token: str, asking: Asking) -> None:
    """Raise :class:`SeedFailed` unless the answer carries a token of warmwatch's own
    service account for this request (``binding.reply_audience``)."""
    reply = response.headers.get(REPLY_HEADER)
    user = None
    if reply:
        user = await review_token(asking.upstream, reply, audiences=(reply_audience(token),))
    if user is None or (user.username, user.uid) != (asking.own.username, asking.own.uid):
        raise SeedFailed(
            "the peer did not prove to be warmwatch's own service account (no reply token "
            "for this request): its snapshot is not read"
        )


async def _receive(
    response: aiohttp.ClientResponse, *, into: Path, metrics: Metrics
) -> tuple[int, hashlib._Hash]:
    """The answer's bytes written to ``into``; how many, and their digest."""
    _create_private(into)
    hashing = hashlib.sha256()
    received = 0
    with into.open("r+b") as out:
        async for chunk in response.content.iter_chunked(CHUNK):
            out.write(chunk)
            hashing.update(chunk)
            received += len(chunk)
            metrics.seeding_bytes.inc(len(chunk))
    return received, hashing


_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")


def _announced(response: aiohttp.ClientResponse) -> tuple[int, str]:
    """The snapshot's length and digest, as its headers announce them."""
    length = response.headers.get("Content-Length", "")
    digest = response.headers.get(DIGEST_HEADER, "").lower()
    if not length.isdigit() or not _HEX_DIGEST.fullmatch(digest):
        raise SeedFailed(f"no Content-Length or {DIGEST_HEADER} announced")
    return int(length), digest


def _create_private(path: Path) -> None:
    """A new empty file at ``path`` that only warmwatch's user may read (it will hold the
    cache's objects, Secrets included)."""
    path.unlink(missing_ok=True)
    keep_private(path)
