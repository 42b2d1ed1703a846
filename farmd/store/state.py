"""Small saved state by key, as JSON (the task bank's posteriors, the scheduler's marks)."""

from __future__ import annotations

import json
from typing import Any

from farmd.store.database import Database


class StateRecords:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def get_state(self, key: str) -> Any:
        row = await self._db.one("SELECT value FROM state WHERE key=?", (key,))
        return json.loads(row[0]) if row else None

    async def put_state(self, key: str, value: Any) -> None:
        async with self._db.write() as db:
            await db.execute("INSERT INTO state(key, value) VALUES (?,?) ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                             (key, json.dumps(value)))
