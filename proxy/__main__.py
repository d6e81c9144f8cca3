"""``warmwatch`` / ``python -m proxy``: the command line (docs/design.md §7).

``warmwatch verify`` and ``warmwatch inspect`` are the operator's commands
(``proxy/operating.py``); any other command line runs the proxy.

Every flag can also be set by the environment variable ``WARMWATCH_<FLAG>`` (upper case,
dashes as underscores); ``WARMWATCH_RESOURCE`` takes a comma-separated list.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import resource
import sys
from collections.abc import Sequence
from pathlib import Path

from proxy import logs
from proxy.app import Settings, StartRefused, run
from proxy.cache.store import StoreSettings
from proxy.environment import env, variable
from proxy.kube.resources import ResourceFlag
from proxy.serve.authenticating import DEFAULT_REJECT_PATHS, ClientAuth, RejectPaths
from proxy.serve.context import ServeSettings
from proxy.serve.limiting import Limits
from proxy.upstream.delegating import DelegationSettings
from proxy.upstream.discovering import DiscoverySettings
from proxy.upstream.reflecting import ReflectorSettings
from proxy.upstream.seeding import SeedSettings
from proxy.upstream.syncing import SyncSettings

OPERATOR_COMMANDS = ("verify", "inspect")
"""The commands of ``proxy/operating.py``, which is imported for them only: the proxy does
not need it, nor the modules only it uses (a shorter start)."""


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def _number(
    p: argparse.ArgumentParser,
    flag: str,
    *,
    kind: type[int] | type[float],
    default: float,
    help: str,
) -> None:
    """A numeric flag whose default is ``WARMWATCH_<FLAG>``, else ``default``; a variable that
    is not such a number is refused (``proxy/environment.py``)."""
    text = env(flag)
    try:
        value = kind(default) if text is None else kind(text)
    except ValueError:
        number = "an integer" if kind is int else "a number"
        p.error(f"{variable(flag)}: expected {number}, got {text!r}")
    p.add_argument(flag, type=kind, default=value, help=help)


def _discovery_flags(p: argparse.ArgumentParser) -> None:
    discovery = DiscoverySettings()
    _number(
        p,
        "--discovery-max-age",
        kind=float,
        default=discovery.max_age,
        help="answer discovery from warmwatch's copy while the apiserver confirmed it within "
        "this many seconds (kept confirmed in the background); 0: always ask the apiserver "
        f"(default {discovery.max_age:g})",
    )
    _number(
        p,
        "--discovery-max-copies",
        kind=int,
        default=discovery.max_copies,
        help="discovery documents stored at most, the least recently asked evicted "
        f"(default {discovery.max_copies})",
    )
    _number(
        p,
        "--discovery-max-bytes",
        kind=int,
        default=discovery.max_bytes,
        help="bytes of discovery documents stored at most, the least recently asked evicted "
        f"(default {discovery.max_bytes})",
    )


def _seeding_flags(p: argparse.ArgumentParser) -> None:
    seeding = SeedSettings()
    p.add_argument(
        "--seed",
        choices=("auto", "off"),
        default=env("seed", seeding.mode),
        help="auto: a new database starts from a snapshot of a peer (the same service "
        "account's warmwatch: a --seed-peer, or one found with --pod-name); off: never ask "
        "(default auto)",
    )
    try:
        env_peers = [
            _address(peer.strip()) for peer in (env("seed-peer") or "").split(",") if peer.strip()
        ]
    except argparse.ArgumentTypeError as error:
        p.error(f"{variable('--seed-peer')}: {error}")
    p.add_argument(
        "--seed-peer",
        action="append",
        type=_address,
        default=None,
        metavar="HOST:PORT",
        help="a peer's seeding listener (its --seed-listen) to seed from (repeatable; asked "
        "in order)",
    )
    p.set_defaults(env_seed_peers=env_peers)
    p.add_argument(
        "--pod-name",
        default=env("pod-name"),
        help="this warmwatch's pod (the downward API's metadata.name): with --seed auto and "
        "no --seed-peer, the running pods of its workload are the peers",
    )
    p.add_argument(
        "--pod-namespace",
        default=env("pod-namespace"),
        help="the pod's namespace (the downward API's metadata.namespace)",
    )
    p.add_argument(
        "--seed-peer-port",
        type=int,
        default=env("seed-peer-port"),  # (argparse converts a string default with type)
        help="the seeding port of the peers found by --pod-name (default: the port of "
        "--seed-listen: a workload's pods share their flags)",
    )
    p.add_argument(
        "--seed-listen",
        type=_address,
        default=env("seed-listen"),
        metavar="HOST:PORT",
        help="serve this warmwatch's cache to peers here, over TLS (default: not served)",
    )
    _number(
        p,
        "--seed-timeout",
        kind=float,
        default=seeding.timeout,
        help="seconds the whole seeding may take, plus --seed-seconds-per-gib of the "
        f"snapshot; past it the start is cold (default {seeding.timeout:g})",
    )
    _number(
        p,
        "--seed-seconds-per-gib",
        kind=float,
        default=seeding.seconds_per_gib,
        help=f"added to --seed-timeout per GiB of snapshot (default {seeding.seconds_per_gib:g})",
    )


def _host_port(address: tuple[str, int]) -> str:
    """``address`` as ``--listen`` takes it (``_address`` reads it back)."""
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="warmwatch", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    defaults = Settings()
    p.add_argument(
        "--kubeconfig",
        default=env("kubeconfig"),
        help="upstream kubeconfig (default: in-cluster, then $KUBECONFIG, then ~/.kube/config)",
    )
    p.add_argument("--context", default=env("context"))
    p.add_argument("--listen", type=_address, default=env("listen", _host_port(defaults.listen)))
    p.add_argument(
        "--metrics-listen",
        type=_address,
        default=env("metrics-listen", _host_port(defaults.metrics_listen)),
    )
    p.add_argument("--db", type=Path, default=env("db", str(defaults.db)))
    env_resources = [r for r in (env("resource") or "").split(",") if r.strip()]
    p.add_argument(
        "--resource",
        action="append",
        default=None,
        metavar="GVR[@NAMESPACE][;protobuf]",
        help="cache this collection from the start (repeatable), e.g. v1/configmaps, "
        "apps/v1/deployments@team-a, example.com/v1/widgets; ';protobuf' caches it for "
        "protobuf clients (kube-controller-manager, typed client-go controllers)",
    )
    p.add_argument(
        "--learn",
        action=argparse.BooleanOptionalAction,
        default=(env("learn") or str(defaults.sync.learn)).lower() not in ("0", "false", "no"),
        help="cache collections that clients ask for (default: on)",
    )
    p.add_argument(
        "--client-auth",
        default=env("client-auth", defaults.client_auth.mode),
        help="delegated (each client's token is reviewed by the apiserver and its cached "
        "reads authorized per client; passthrough carries the client's own credentials), "
        "token-file:PATH (clients must present that bearer token, which must be warmwatch's "
        "own identity) or none (loopback only; every caller acts as warmwatch)",
    )
    delegation = defaults.delegation
    _number(
        p,
        "--auth-cache-ttl",
        kind=float,
        default=delegation.token_ttl,
        help="delegated: seconds a TokenReview or SubjectAccessReview decision is reused, and "
        "how often open cached watches are authorized again (the apiserver's 10 s)",
    )
    _number(
        p,
        "--auth-offline-window",
        kind=float,
        default=delegation.offline_window,
        help="delegated: while the apiserver is unreachable, decisions made within this many "
        "seconds still hold; anything else is refused with 503",
    )
    p.add_argument(
        "--reject-paths",
        default=env("reject-paths", DEFAULT_REJECT_PATHS),
        help="none: comma-separated regular expressions of paths refused with 403 "
        "(default: exec, attach, as kubectl proxy, and port-forward and the node, pod and "
        "service proxies; empty allows all)",
    )
    _number(
        p,
        "--auth-review-rate",
        kind=float,
        default=delegation.review_rate,
        help="delegated: TokenReviews per second one client address may cause for tokens not "
        f"accepted before; over it 429 (default {delegation.review_rate:g})",
    )
    _number(
        p,
        "--auth-review-burst",
        kind=int,
        default=delegation.review_burst,
        help="delegated: TokenReviews one client address may cause at once "
        f"(default {delegation.review_burst})",
    )
    p.add_argument(
        "--tls-cert-file",
        type=Path,
        default=env("tls-cert-file"),
        help="serve the API listener over TLS with this certificate (reloaded when it "
        "changes); required beyond loopback, with --client-auth delegated",
    )
    p.add_argument("--tls-private-key-file", type=Path, default=env("tls-private-key-file"))
    store = StoreSettings(path=defaults.db)
    p.add_argument(
        "--cert-dir",
        type=Path,
        default=env("cert-dir"),
        help="without --tls-cert-file: serve the loopback listener over TLS with a "
        "self-signed certificate for localhost, 127.0.0.1 and ::1 kept in this directory "
        "(warmwatch.crt, made at the first start); clients trust warmwatch.crt. Go "
        "controllers send a token (token-file mode) only over TLS",
    )
    p.add_argument(
        "--sync-mode",
        choices=("NORMAL", "FULL"),
        default=env("sync-mode", store.synchronous),
        help="SQLite synchronous mode: FULL also survives power loss",
    )
    _number(
        p,
        "--retention-events",
        kind=int,
        default=store.retention_events,
        help="event log entries kept per shape",
    )
    _number(
        p,
        "--retention-seconds",
        kind=float,
        default=store.retention_seconds,
        help="event log entries older than this are dropped",
    )
    retention_bytes = store.retention_bytes
    _number(
        p,
        "--retention-bytes",
        kind=int,
        default=retention_bytes,
        help="bytes of event-log entries (objects, new and old) kept per collection; the "
        f"oldest go first (default {retention_bytes}: {retention_bytes >> 20} MiB)",
    )
    _number(
        p,
        "--bookmark-interval",
        kind=float,
        default=defaults.serve.bookmark_interval,
        help="seconds between the bookmarks of a cached watch that asked for them",
    )
    _number(
        p,
        "--watch-write-timeout",
        kind=float,
        default=defaults.serve.slow_write_timeout,
        help="disconnect a watch or LIST client that accepted no write for this long",
    )
    _number(
        p,
        "--upstream-idle-timeout",
        kind=float,
        default=defaults.reflector.idle_timeout,
        help="replace an upstream watch silent for this long (bookmarks come every minute)",
    )
    _number(
        p,
        "--max-shapes",
        kind=int,
        default=defaults.sync.max_shapes,
        help="learned collections at most; requests for more pass through",
    )
    _discovery_flags(p)
    _seeding_flags(p)
    limits = defaults.limits
    _number(
        p,
        "--max-connections",
        kind=int,
        default=limits.max_connections,
        help="open client connections; over it a connection gets 429 and is closed "
        f"(default {limits.max_connections})",
    )
    _number(
        p,
        "--max-watches",
        kind=int,
        default=limits.max_watches,
        help="watches and other long-running requests at once, cached or passed through "
        f"(default {limits.max_watches})",
    )
    _number(
        p,
        "--max-client-watches",
        kind=int,
        default=limits.max_client_watches,
        help="watches of one client: remote address and credentials "
        f"(default {limits.max_client_watches})",
    )
    _number(
        p,
        "--max-requests",
        kind=int,
        default=limits.max_requests,
        help="short requests passed through to the apiserver at once "
        f"(default {limits.max_requests})",
    )
    _number(
        p,
        "--max-client-requests",
        kind=int,
        default=limits.max_client_requests,
        help="short passed-through requests of one client at once "
        f"(default {limits.max_client_requests})",
    )
    _number(
        p,
        "--max-list-streams",
        kind=int,
        default=limits.max_list_streams,
        help="LISTs (and initial watch states) streamed from the cache at once "
        f"(default {limits.max_list_streams})",
    )
    _number(
        p,
        "--header-timeout",
        kind=float,
        default=limits.header_timeout,
        help="close a connection whose request headers took longer than this "
        f"(default {limits.header_timeout:g} s, the apiserver's)",
    )
    _number(
        p,
        "--idle-timeout",
        kind=float,
        default=limits.idle_timeout,
        help=f"close an idle keep-alive connection after this (default {limits.idle_timeout:g} s)",
    )
    _number(
        p,
        "--max-header-bytes",
        kind=int,
        default=limits.max_header_bytes,
        help="request line and headers at most; over it 431 "
        f"(default {limits.max_header_bytes}, the apiserver's)",
    )
    p.add_argument("--log-level", default=env("log-level", "INFO"))
    p.add_argument(
        "--log-format",
        choices=logs.FORMATS,
        default=env("log-format", "text"),
        help="text (default) or json: one JSON object per line",
    )
    p.set_defaults(env_resources=env_resources)
    return p


def settings_from(args: argparse.Namespace) -> Settings:
    resources = tuple(ResourceFlag.parse(r) for r in (args.resource or args.env_resources))
    metrics_listen = (
        args.metrics_listen
        if isinstance(args.metrics_listen, tuple)
        else _address(args.metrics_listen)
    )
    seed_listen = (
        _address(args.seed_listen) if isinstance(args.seed_listen, str) else args.seed_listen
    )
    return Settings(
        kubeconfig=args.kubeconfig,
        context=args.context,
        listen=args.listen if isinstance(args.listen, tuple) else _address(args.listen),
        metrics_listen=metrics_listen,
        seed_listen=seed_listen,
        db=Path(args.db),
        resources=resources,
        client_auth=ClientAuth.parse(args.client_auth),
        delegation=DelegationSettings(
            token_ttl=args.auth_cache_ttl,
            allow_ttl=args.auth_cache_ttl,
            deny_ttl=args.auth_cache_ttl,
            offline_window=args.auth_offline_window,
            review_rate=args.auth_review_rate,
            review_burst=args.auth_review_burst,
        ),
        reject_paths=RejectPaths.parse(args.reject_paths),
        tls_cert_file=Path(args.tls_cert_file) if args.tls_cert_file else None,
        tls_key_file=Path(args.tls_private_key_file) if args.tls_private_key_file else None,
        cert_dir=Path(args.cert_dir) if args.cert_dir else None,
        store=StoreSettings(
            path=Path(args.db),
            synchronous=args.sync_mode,
            retention_events=args.retention_events,
            retention_seconds=args.retention_seconds,
            retention_bytes=args.retention_bytes,
        ),
        sync=SyncSettings(learn=args.learn, max_shapes=args.max_shapes),
        reflector=ReflectorSettings(idle_timeout=args.upstream_idle_timeout),
        serve=ServeSettings(
            bookmark_interval=args.bookmark_interval, slow_write_timeout=args.watch_write_timeout
        ),
        seed=SeedSettings(
            mode=args.seed,
            peers=tuple(args.seed_peer or args.env_seed_peers),
            pod_name=args.pod_name or None,
            pod_namespace=args.pod_namespace or None,
            peer_port=args.seed_peer_port or (seed_listen[1] if seed_listen else None),
            timeout=args.seed_timeout,
            seconds_per_gib=args.seed_seconds_per_gib,
        ),
        discovery=DiscoverySettings(
            max_age=args.discovery_max_age,
            max_copies=args.discovery_max_copies,
            max_bytes=args.discovery_max_bytes,
        ),
        limits=Limits(
            max_connections=args.max_connections,
            max_watches=args.max_watches,
            max_client_watches=args.max_client_watches,
            max_requests=args.max_requests,
            max_client_requests=args.max_client_requests,
            max_list_streams=args.max_list_streams,
            header_timeout=args.header_timeout,
            idle_timeout=args.idle_timeout,
            max_header_bytes=args.max_header_bytes,
        ),
    )


def raise_open_files_limit() -> None:
    """Raise the soft limit of open files to the hard one, as Go's runtime does for the
    apiserver: ``--max-connections``, not a default soft limit of 1,024, bounds connections
    (at that limit ``accept()`` would fail, and asyncio log each failure as an error)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft != resource.RLIM_INFINITY and soft < wanted:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments and arguments[0] in OPERATOR_COMMANDS:
        from proxy import operating

        return operating.main(arguments)
    args = parser().parse_args(arguments)
    raise_open_files_limit()
    try:
        logs.configure(level=args.log_level, log_format=args.log_format)
        settings = settings_from(args)
    except ValueError as error:
        print(f"warmwatch: {error}", file=sys.stderr)
        return 2
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        runner = asyncio.run
    else:
        runner = uvloop.run
    try:
        runner(run(settings))
    except StartRefused as error:
        logging.getLogger("warmwatch").error("refusing to start: %s", error)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
