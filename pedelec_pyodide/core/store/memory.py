"""The memory backend, the default: it keeps nothing, Core's own memory is the only copy."""

from __future__ import annotations

import asyncio

from ..clock import Clock, SystemClock
from .leases import LocalLeases
from .records import (
    RECENT_TURNS,
    IdempotencyRecord,
    RequestRecord,
    SessionRecord,
    Snapshot,
    TurnRecord,
)


class MemoryStore(LocalLeases):
    durable = False
    shared = False
    label = "memory"
    problem: str | None = None
    unavailable = False

    def __init__(self, clock: Clock | None = None) -> None:
        super().__init__(clock or SystemClock())

    async def load(self) -> Snapshot:
        return Snapshot()

    async def load_session(self, session_id: str) -> Snapshot:
        return Snapshot()

    async def load_session_record(self, session_id: str) -> SessionRecord | None:
        return None

    async def unstored(self, session_ids: list[str]) -> list[str]:
        return list(session_ids)  # it stores none

    def save_session(self, record: SessionRecord) -> None:
        pass

    def save_tools(self, record: SessionRecord) -> None:
        pass

    def save_history(self, record: SessionRecord) -> None:
        pass

    def delete_session(self, session_id: str) -> None:
        pass

    def save_request(self, record: RequestRecord) -> None:
        pass

    def delete_request(self, session_id: str, request_id: str) -> None:
        pass

    def save_turn(self, record: TurnRecord) -> None:
        pass

    def mark_end_delivered(self, session_id: str, turn_id: str) -> None:
        pass

    def save_key(self, record: IdempotencyRecord) -> None:
        pass

    def delete_key(self, session_id: str, key_hash: str) -> None:
        pass

    def prune_turns(self, keep: int = RECENT_TURNS) -> None:
        pass

    async def flush(self, *keys: str, timeout: float | None = None) -> None:
        # nothing to wait for, but a flush is a yield point with every store: a turn's
        # large steps (1 MiB of args, then of results) let other clients' work in between
        await asyncio.sleep(0)

    async def close(self, timeout: float | None = None) -> None:
        pass
