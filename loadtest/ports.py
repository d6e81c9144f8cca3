"""Ports for the listeners the harness starts (etcd, kube-apiserver, warmwatch, toxiproxy),
and what the kernel holds to send on a listener's connections.

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


_TCP = Path("/proc/net/tcp")
_ESTABLISHED = "01"


def send_queues(port: int) -> dict[int, int]:
    """For each established IPv4 connection whose local port is ``port``: its remote port and
    the bytes the kernel holds to send on it (``tx_queue`` of ``/proc/net/tcp``: not yet sent
    plus sent but not yet acknowledged). Linux only."""
    queues = {}
    for line in _TCP.read_text().splitlines()[1:]:
        fields = line.split()
        local, remote, state, queue = fields[1], fields[2], fields[3], fields[4]
        if state == _ESTABLISHED and int(local.split(":")[1], 16) == port:
            queues[int(remote.split(":")[1], 16)] = int(queue.split(":")[0], 16)
    return queues
