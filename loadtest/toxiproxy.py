"""Toxiproxy on loopback: a slow, lossy or dead network link between a client and the apiserver.

    server = Toxiproxy.start(log=DIR / "toxiproxy.log")       # builds the binary once (cached)
    link = server.create_proxy("apiserver", upstream=f"127.0.0.1:{apiserver_port}")
    link.add_latency(25, stream="downstream")                 # ms; also jitter_ms=
    link.add_bandwidth(5000)                                  # KB/s (1 KB = 1000 bytes)
    toxic = link.add_timeout()                                # blackhole: data dropped, kept open
    link.remove_toxic(toxic.name)
    kubeconfig_through(link, pki=plane.pki, identity="admin", path=DIR / "slow.kubeconfig")
    link.bytes()      # {"upstream": ..., "downstream": ...} carried (Toxiproxy.start(metrics=True))
    server.stop()

The server is built from the Go module proxy like the control plane (loadtest/building.py): a
pinned release of ``github.com/Shopify/toxiproxy/v2``, its ``cmd/server`` installed with
``CGO_ENABLED=0`` into ``<cache_root>/toxiproxy-<version>/bin/toxiproxy-server`` (never into the
repository). Toxiproxy is a TCP proxy: TLS passes through it untouched, so a kubeconfig for the
proxy keeps the apiserver's CA and client certificate, changes the address, and names the
certificate's name to verify (``tls-server-name``, ``SERVING_NAME``).

Toxics act on each TCP connection separately, in the order they were added: ``latency`` delays
each chunk by latency +/- jitter after it arrived (pipelined, so it adds delay, not a rate
limit); ``bandwidth`` limits each connection to ``rate`` KB/s; ``timeout`` with 0 drops all
data and keeps the connection open (a blackhole), with N > 0 closes it after N ms;
``reset_peer`` resets the connection (TCP RST) after N ms. Removing a ``timeout`` toxic closes
the connections it held; new connections work again.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

from loadtest import exposition
from loadtest.building import cache_root
from loadtest.pki import Pki
from loadtest.ports import free_port

MODULE = "github.com/Shopify/toxiproxy/v2"
VERSION = "v2.5.0"
SERVER_PACKAGE = f"{MODULE}/cmd/server"
BINARY_NAME = "toxiproxy-server"

SERVING_NAME = "kubernetes"
"""The name a kubeconfig through the proxy verifies the apiserver's certificate against
(``tls-server-name``): a DNS SAN of the serving certificate (loadtest/pki.py), which also holds
127.0.0.1, the proxy's own address."""

START_TIMEOUT = 15.0

Stream = Literal["upstream", "downstream"]
"""``upstream``: client -> server data; ``downstream``: server -> client data."""

ToxicType = Literal["latency", "bandwidth", "timeout", "reset_peer", "slow_close", "slicer"]


def _say(message: str) -> None:
    print(f"[toxiproxy] {message}", file=sys.stderr, flush=True)


# -- building --------------------------------------------------------------------------------


def ensure_binary(*, version: str = VERSION) -> Path:
    """The cached toxiproxy server of ``version``; built with ``go install`` when missing."""
    target = cache_root() / f"toxiproxy-{version}" / "bin"
    binary = target / BINARY_NAME
    if binary.exists():
        return binary
    if shutil.which("go") is None:
        raise RuntimeError("Go is required to build toxiproxy (go not on PATH)")
    staging = target.with_name(f"bin.partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    _say(f"building {SERVER_PACKAGE}@{version} ...")
    started = time.monotonic()
    env = dict(os.environ) | {"CGO_ENABLED": "0", "GOBIN": str(staging), "GOFLAGS": ""}
    built = subprocess.run(
        ["go", "install", "-trimpath", "-ldflags=-s -w", f"{SERVER_PACKAGE}@{version}"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if built.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        raise RuntimeError(f"go install {SERVER_PACKAGE}@{version} failed:\n{built.stderr}")
    (staging / "server").rename(staging / BINARY_NAME)  # `go install` names it after the path
    if binary.exists():  # built concurrently by someone else: theirs is the same release
        shutil.rmtree(staging, ignore_errors=True)
    else:
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    _say(f"built {binary} in {time.monotonic() - started:.0f}s")
    return binary


# -- the HTTP API ----------------------------------------------------------------------------


class ToxiproxyError(Exception):
    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        super().__init__(f"toxiproxy {method} {path}: HTTP {status}: {body[:500]}")
        self.status = status


@dataclass(frozen=True, kw_only=True, slots=True)
class Toxic:
    name: str
    type: str
    stream: Stream
    toxicity: float
    attributes: dict[str, int]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Toxic:
        return cls(
            name=str(data["name"]),
            type=str(data["type"]),
            stream=cast(Stream, data["stream"]),
            toxicity=float(data["toxicity"]),
            attributes={str(k): int(v) for k, v in (data.get("attributes") or {}).items()},
        )


@dataclass(kw_only=True)
class Toxiproxy:
    """One running toxiproxy server; its API listens on 127.0.0.1:``api_port``."""

    process: subprocess.Popen[bytes]
    api_port: int
    log: Path

    @classmethod
    def start(
        cls, *, log: Path, binary: Path | None = None, attempts: int = 3, metrics: bool = False
    ) -> Toxiproxy:
        """Start the server on a free loopback port; output (zerolog JSON) appended to ``log``.
        ``metrics``: count the bytes each proxy carries (``-proxy-metrics``, read with
        ``Proxy.bytes``)."""
        binary = binary or ensure_binary()
        log.parent.mkdir(parents=True, exist_ok=True)
        for attempt in range(1, attempts + 1):
            port = free_port()
            with open(log, "ab") as out:
                process = subprocess.Popen(
                    [
                        str(binary),
                        "-host=127.0.0.1",
                        f"-port={port}",
                        *(["-proxy-metrics"] if metrics else []),
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            server = cls(process=process, api_port=port, log=log)
            try:
                server._wait_ready()
                return server
            except RuntimeError:  # it exited: the port was taken between probing and binding
                server.stop()
                if attempt == attempts:
                    raise
            except BaseException:  # never leave a server behind
                server.stop()
                raise
        raise AssertionError("unreachable")

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"toxiproxy exited {self.process.returncode}:\n"
                    + self.log.read_text(errors="replace")[-2000:]
                )
            try:
                self.version()
                return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"toxiproxy API not answering on 127.0.0.1:{self.api_port}")

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """One API call; the decoded JSON answer (None when empty). Raises ToxiproxyError."""
        raw = self._call(method, path, body)
        return json.loads(raw) if raw.strip() else None

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> bytes:
        request = urllib.request.Request(
            self.api_url + path,
            method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Content-Type": "application/json"} if body is not None else {},
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                raw: bytes = answer.read()
        except urllib.error.HTTPError as error:
            raise ToxiproxyError(
                method, path, error.code, error.read().decode(errors="replace")
            ) from None
        return raw

    def scrape(self) -> str:
        """Its ``/metrics`` text (``start(metrics=True)``: the bytes each proxy carried)."""
        return self._call("GET", "/metrics").decode(errors="replace")

    def version(self) -> str:
        """The server's version text (``git`` for a build from the module proxy, which carries
        no version stamp)."""
        return self._call("GET", "/version").decode(errors="replace").strip()

    def create_proxy(self, name: str, *, upstream: str, listen: str = "127.0.0.1:0") -> Proxy:
        """A proxy from ``listen`` (port 0: toxiproxy picks a free one) to ``upstream``."""
        answer = self.request(
            "POST", "/proxies", {"name": name, "listen": listen, "upstream": upstream}
        )
        return Proxy(server=self, name=name, listen=str(answer["listen"]), upstream=upstream)

    def reset(self) -> None:
        """Enable every proxy and remove every toxic."""
        self.request("POST", "/reset")

    def stop(self, timeout: float = 10) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> Toxiproxy:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


@dataclass(kw_only=True)
class Proxy:
    """One proxy of a server: ``listen`` (127.0.0.1:port) forwards to ``upstream``."""

    server: Toxiproxy
    name: str
    listen: str
    upstream: str

    @property
    def port(self) -> int:
        return int(self.listen.rsplit(":", 1)[1])

    @property
    def _path(self) -> str:
        return f"/proxies/{self.name}"

    def add_toxic(
        self,
        toxic_type: ToxicType,
        *,
        attributes: dict[str, int],
        stream: Stream = "downstream",
        name: str | None = None,
        toxicity: float = 1.0,
    ) -> Toxic:
        """Add a toxic (default name ``<type>_<stream>``, unique per proxy)."""
        body: dict[str, Any] = {
            "type": toxic_type,
            "stream": stream,
            "toxicity": toxicity,
            "attributes": attributes,
        }
        if name is not None:
            body["name"] = name
        return Toxic.from_json(self.server.request("POST", f"{self._path}/toxics", body))

    def add_latency(
        self, latency_ms: int, *, jitter_ms: int = 0, stream: Stream = "downstream"
    ) -> Toxic:
        """Delay every chunk by ``latency_ms`` +/- ``jitter_ms`` (one direction)."""
        return self.add_toxic(
            "latency", attributes={"latency": latency_ms, "jitter": jitter_ms}, stream=stream
        )

    def add_bandwidth(self, rate_kb: int, *, stream: Stream = "downstream") -> Toxic:
        """At most ``rate_kb`` KB/s (1 KB = 1000 bytes) per connection, one direction."""
        return self.add_toxic("bandwidth", attributes={"rate": rate_kb}, stream=stream)

    def add_timeout(self, timeout_ms: int = 0, *, stream: Stream = "downstream") -> Toxic:
        """Drop all data; 0 keeps connections open (a blackhole), N > 0 closes them after
        N ms."""
        return self.add_toxic("timeout", attributes={"timeout": timeout_ms}, stream=stream)

    def add_reset_peer(self, timeout_ms: int = 0, *, stream: Stream = "downstream") -> Toxic:
        """Reset connections (TCP RST) once data flows, after ``timeout_ms``."""
        return self.add_toxic("reset_peer", attributes={"timeout": timeout_ms}, stream=stream)

    def toxics(self) -> list[Toxic]:
        answer = self.server.request("GET", f"{self._path}/toxics")
        return [Toxic.from_json(t) for t in answer or []]

    def remove_toxic(self, name: str) -> None:
        self.server.request("DELETE", f"{self._path}/toxics/{name}")

    def delete(self) -> None:
        self.server.request("DELETE", self._path)

    def bytes(self) -> dict[Stream, float]:
        """The bytes this proxy has sent on, by direction (``upstream``: to the server), over
        its connections that have closed: toxiproxy 2.5 counts a connection's bytes when it
        ends, so stop the client first. The server must run with ``metrics``."""
        text = self.server.scrape()
        return {
            stream: exposition.total(
                text, "toxiproxy_proxy_sent_bytes_total", {"proxy": self.name, "direction": stream}
            )
            for stream in cast(tuple[Stream, ...], ("upstream", "downstream"))
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class Link:
    """A symmetric network link: ``latency_ms`` (+/- ``jitter_ms``) each way, so a round trip
    of twice that, and ``rate_kb`` KB/s each way per connection."""

    latency_ms: int = 25
    jitter_ms: int = 0
    rate_kb: int = 5000

    def apply(self, proxy: Proxy) -> list[Toxic]:
        added = []
        for stream in cast(tuple[Stream, ...], ("downstream", "upstream")):
            if self.latency_ms or self.jitter_ms:
                added.append(
                    proxy.add_latency(self.latency_ms, jitter_ms=self.jitter_ms, stream=stream)
                )
            if self.rate_kb:
                added.append(proxy.add_bandwidth(self.rate_kb, stream=stream))
        return added

    def describe(self) -> str:
        jitter = f" +/- {self.jitter_ms} ms" if self.jitter_ms else ""
        return (
            f"{2 * self.latency_ms} ms RTT ({self.latency_ms} ms{jitter} latency toxic each "
            f"direction), {self.rate_kb * 8 / 1000:g} Mbit/s ({self.rate_kb} KB/s bandwidth "
            "toxic each direction, per connection)"
        )


# -- clients through a proxy -----------------------------------------------------------------


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def kubeconfig_through(
    proxy: Proxy,
    *,
    pki: Pki,
    identity: str,
    path: Path,
    tls_server_name: str | None = SERVING_NAME,
) -> Path:
    """A kubeconfig (certificates embedded) for ``identity`` at the apiserver behind ``proxy``:
    the server is the proxy's address, TLS is verified with the apiserver's CA against
    ``tls_server_name`` (None: the proxy's address, 127.0.0.1, also a SAN)."""
    user = pki.identity(identity)
    server_name = f"    tls-server-name: {tls_server_name}\n" if tls_server_name else ""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: through-toxiproxy\n  cluster:\n"
        f"    server: https://127.0.0.1:{proxy.port}\n"
        f"    certificate-authority-data: {_b64(pki.ca_cert)}\n"
        f"{server_name}"
        f"users:\n- name: {identity}\n  user:\n"
        f"    client-certificate-data: {_b64(user.certificate)}\n"
        f"    client-key-data: {_b64(user.key)}\n"
        f"contexts:\n- name: {identity}\n  context:\n    cluster: through-toxiproxy\n"
        f"    user: {identity}\ncurrent-context: {identity}\n"
    )
    path.chmod(0o600)
    return path
