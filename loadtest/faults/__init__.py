"""The randomized fault run: clients watch through warmwatch while everything around it breaks.

    python -m loadtest.faults [--minutes M] [--dir DIR] [--seed S] [--rate 200] [--plane-dir P]
    python -m loadtest.faults --recheck DIR     # check the runs recorded in DIR again, offline

What runs (all on loopback, started and stopped by the driver):

- a control plane (``loadtest.cluster``) in ``DIR/cp``, or the one in ``--plane-dir`` (reused and
  left running), with the widgets CRD (``manifests/widgets-crd.yaml``);
- the reference: one :class:`~loadtest.history.EtcdHistory` per resource, watching etcd itself
  (``/registry/configmaps/``, ``/registry/example.com/widgets/``), started before any traffic;
- traffic straight to the apiserver: creates, updates, label changes (so selectors see objects
  arrive and leave) and deletes of ConfigMaps and widgets in a few namespaces at ``--rate``;
- toxiproxy (``loadtest.toxiproxy``) with one proxy to the apiserver: warmwatch's upstream
  goes through it (a kubeconfig from ``kubeconfig_through``); the traffic and the reference
  stay direct;
- warmwatch (``loadtest.sidecar``) caching both resources, with a short event log
  (``--retention-events``), bookmarks every 2 s, a 5 s write timeout and an 8 s
  ``--upstream-idle-timeout`` (so a blackholed upstream watch is replaced within a short run;
  once traffic stops, its quiet watches are replaced every 8 s too, which is harmless);
- clients behind warmwatch. Raw Python watchers that behave like client-go's reflector (LIST
  at RV 0, WATCH from the list RV, resume from the last event or bookmark RV when the stream ends
  or the connection fails, relist after 410), in variants: with and without bookmarks, with a
  label selector, per namespace, WatchList (``sendInitialEvents``) — and one slow reader that
  stops reading for longer than the write timeout, is cut off by warmwatch and resumes. Every
  observation goes into a :class:`~loadtest.checking.ClientLog`. The Go informer program
  (``tests/goclient``), one process per resource and ``KUBE_FEATURE_WatchListClient`` value.
- faults at seeded random moments (``--gap`` apart), each counted:
  ``kill9`` (warmwatch ``kill -9``, restart), ``apiserver-restart`` (SIGTERM or, two times in
  three, SIGKILL — a graceful stop under load often takes ``loadtest.cluster``'s whole 15 s
  grace —, down a few seconds, started again), ``upstream-outage`` (apiserver down ``--outage``
  seconds while the clients carry on; halfway warmwatch is killed and restarted, so it starts
  warm with no upstream), ``compaction`` (warmwatch killed, traffic goes on, etcd compacted up to
  what the reference has read, warmwatch restarted: its resume gets 410, it relists and appends
  the difference; see below), ``client-away`` (a raw client disconnects until warmwatch's log
  no longer holds its RV, then comes back: 410, relist; counted once it got the 410) and
  ``blackhole`` (toxiproxy's ``timeout`` toxic with timeout 0 in both directions: warmwatch's
  upstream connections stay open but carry nothing, as when the apiserver's node died or a NAT
  entry was dropped, for 15-25 s, longer than the idle timeout, then removed; see below).
  warmwatch trims its log once a minute, so while a client is away warmwatch is not restarted
  and traffic flows (only a short apiserver restart may happen). ``--min-faults`` adds quick
  faults after ``--minutes`` until that many were injected; a kind never drawn by then is
  injected first.

At the end traffic stops, the driver waits (bounded) until every client equals the apiserver's
state, then checks everything with :func:`loadtest.checking.check` — one run per resource, as a
reference history is one collection — prints the violations, then exactly one line
``faults=<n> events=<n checked> violations=<n>``, and exits non-zero on any violation (or
fault failure, below). Each run is written as JSON lines to ``DIR/run-<resource>.jsonl``
(``--recheck`` reads them back), the counts to ``DIR/summary.json``; warmwatch's log is
``DIR/warmwatch.log``, toxiproxy's ``DIR/toxiproxy.log``, the Go programs' output
``DIR/go-*.log``.

Upstream relists are read from warmwatch's own database while it runs (its log is trimmed):
a relist leaves a BOOKMARK row with ``batch = 1`` at the relist RV, and the row before the batch
holds the RV the cache had reached when the resume got 410 (``UpstreamRelist.reached``).

The compaction fault restarts the apiserver between compacting etcd and restarting warmwatch:
the apiserver serves watches from its watch cache, which keeps every event of at least the last
75 s in memory whatever etcd compacted, so a resume after a short downtime would not see the
compaction at all. A restarted apiserver's watch cache starts after the compaction.

The blackhole fault waits (bounded) until every shape of warmwatch is current (its RV in the
database has reached etcd's revision), notes warmwatch's log offset and metrics, adds the toxics
and, while they hold, reads warmwatch's log for its reflectors' ``...; retrying in`` lines (a
new watch that cannot connect through the blackhole fails after warmwatch's 10 s connect
timeout, so a short blackhole may end before any). For each resource
``warmwatch_upstream_watch_restarts_total`` with ``reason="idle"`` (a silent watch replaced)
or ``"error"`` must grow by at least its number of shapes (every reflector replaced its
silent watch), and after the toxics are removed every shape must be current again within
120 s. The
timeline, the log lines and the metric deltas are recorded in ``summary.json``
(``blackholes``); a blackhole not noticed or not recovered from is a ``fault_failures`` entry,
printed before the summary line, and fails the run like a violation.

The Go informers are checked as far as their output allows: their event lines carry object RVs
but no list RVs or bookmarks. For each Go process (one resource) the final store (``digest``)
must equal the apiserver's final state — modelled as a ClientLog with only a final state, so
the checker's convergence rule reports it and the recorded run holds it — and its non-initial
events must not go back in RV: per object always (an equal RV only for the no-op update or the
tombstone a client-go relist produces), and across objects (strictly increasing, equal only for
the DELETEDs of one warmwatch relist batch) until the informer relists: client-go's relist
replays the list in key order, so ordering across objects is not checked after the first relist
(``Listing and watching`` in the program's log, ``-v=3``). Those are added to the report as
``ordered`` / ``no-time-travel`` / ``unique`` violations of the Go client.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

CRD_MANIFEST = Path(__file__).resolve().parents[1] / "manifests" / "widgets-crd.yaml"
INITIAL_EVENTS_END = "k8s.io/initial-events-end"
TIERS: tuple[str | None, ...] = ("gold", "silver", "bronze", None)
FAULT_KINDS = (
    "kill9",
    "apiserver-restart",
    "upstream-outage",
    "compaction",
    "client-away",
    "blackhole",
)
WRITE_TIMEOUT = 5.0
"""warmwatch's ``--watch-write-timeout``: the slow reader stalls longer than this."""

Key = tuple[str, str]

_T0 = time.monotonic()


def say(message: str) -> None:
    print(f"[faults {time.monotonic() - _T0:7.1f}s] {message}", file=sys.stderr, flush=True)


class RunFailed(Exception):
    """The run itself broke (not a guarantee): warmwatch died, the reference has a gap..."""
