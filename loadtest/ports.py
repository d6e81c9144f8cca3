"""Ports for the listeners the harness starts (etcd, kube-apiserver, warmwatch, toxiproxy).

A port the kernel hands out for ``bind(("127.0.0.1", 0))`` is an *ephemeral* port: between
choosing it and the server binding it, any outgoing connection on the machine may take it as
its local port — the e2e suite opens thousands — and the server then exits with "address
already in use". So listeners get ports below the kernel's ephemeral range, which outgoing
connections never use, chosen at random and checked free.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

LOWEST = 10_000
"""Below this are well-known and registered services' ports."""

_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_start() -> int:
    try:
        return int(_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def free_port() -> int:
    """A free port on 127.0.0.1 that no outgoing connection will take."""
    top = max(_ephemeral_start(), LOWEST + 1_000)
    for _ in range(200):
        port = random.randrange(LOWEST, top)
        with socket.socket() as probe:  # no SO_REUSEADDR: a port in TIME_WAIT counts as taken
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port between {LOWEST} and {top}")
