"""The fault run's options (``python -m loadtest.faults``'s flags)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, kw_only=True)
class Options:
    directory: Path
    minutes: float = 10.0
    seed: int = 1
    rate: float = 200.0
    plane_dir: Path | None = None
    namespaces: int = 4
    population: int = 150
    """Objects per resource the traffic keeps alive (about)."""
    payload: int = 512
    """Bytes of data per object."""
    outage: float = 30.0
    gap: tuple[float, float] = (1.0, 5.0)
    """Seconds between faults (uniform)."""
    retention_events: int = 2000
    away_limit: float = 240.0
    """Longest a ``client-away`` waits for warmwatch's log to drop its RV."""
    min_faults: int = 0
    """Go on with quick faults after ``minutes`` until this many were injected."""
    go_clients: bool = True
    settle: float = 180.0
    """Longest wait, once traffic stopped, for every client to equal the apiserver."""
    idle_timeout: float = 8.0
    """warmwatch's ``--upstream-idle-timeout`` (its default, 120 s, is for production)."""
    blackhole: tuple[float, float] = (15.0, 25.0)
    """Seconds a ``blackhole`` holds (uniform): longer than ``idle_timeout``."""
    recovery_limit: float = 120.0
    """Longest wait for every shape of warmwatch to be current again after a blackhole."""

    @property
    def namespace_names(self) -> list[str]:
        return [f"faults-{index}" for index in range(self.namespaces)]
