"""warmwatch's SQLite file read while it runs: the relists it made upstream and where each
shape's event log starts."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from loadtest.checking import UpstreamRelist


class CacheLog:
    """Reads warmwatch's SQLite file (read-only, short statements) while it runs: relists and
    where each shape's event log starts."""

    def __init__(self, db: Path) -> None:
        self.db = db
        self.relists: dict[tuple[str, int], int | None] = {}
        self.log_start: dict[str, int | None] = {}

    def poll(self) -> None:
        if not self.db.exists():
            return
        try:
            connection = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=2)
        except sqlite3.Error:
            return
        try:
            shapes = {
                shape_id: (key, start)
                for shape_id, key, start in connection.execute(
                    "SELECT id, key, log_start_rv FROM shapes"
                ).fetchall()
            }
            for key, start in shapes.values():
                self.log_start[key] = int(start) if start is not None and start.isdigit() else None
            rows = connection.execute(
                "SELECT shape_id, seq, rv FROM events WHERE batch = 1 AND type = 'BOOKMARK'"
            ).fetchall()
            for shape_id, seq, rv in rows:
                if shape_id not in shapes or (shapes[shape_id][0], int(rv)) in self.relists:
                    continue
                before = connection.execute(
                    "SELECT rv FROM events WHERE shape_id = ? AND seq < ? "
                    "AND (batch = 0 OR type = 'BOOKMARK') ORDER BY seq DESC LIMIT 1",
                    (shape_id, seq),
                ).fetchone()
                reached = int(before[0]) if before is not None else None
                self.relists[(shapes[shape_id][0], int(rv))] = reached
        except sqlite3.Error:
            pass
        finally:
            connection.close()

    def shape_rvs(self) -> dict[str, int | None]:
        """Each shape's current RV (``shapes.rv``, None before its first list), read now."""
        if not self.db.exists():
            return {}
        try:
            connection = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=2)
        except sqlite3.Error:
            return {}
        try:
            rows = connection.execute("SELECT key, rv FROM shapes").fetchall()
        except sqlite3.Error:
            return {}
        finally:
            connection.close()
        return {
            str(key): int(rv) if rv is not None and str(rv).isdigit() else None for key, rv in rows
        }

    def relists_of(self, shape: str) -> list[UpstreamRelist]:
        return [
            UpstreamRelist(rv=rv, reached=reached, shape=key)
            for (key, rv), reached in sorted(self.relists.items())
            if key == shape
        ]

    async def follow(self) -> None:
        while True:
            await asyncio.to_thread(self.poll)
            await asyncio.sleep(1.0)
