"""The store backends as the contract tests (test_store_contract.py) see them: a way to
open a store, to open another on the same data, and to make each fault real."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from pedelec_pyodide.core.store import MemoryStore, Snapshot, SQLiteStore, Store

#: the fixtures of every backend, and of those that keep what they are given
BACKENDS = ["memory", "sqlite"]
DURABLE = ["sqlite"]


async def loaded(store: Store) -> Snapshot:
    return await store.load()


async def read_only(store: SQLiteStore, on: bool) -> None:
    """The store's connection refuses writes (``PRAGMA query_only``), or takes them again;
    on its own thread, between two of the writer's transactions."""
    await store._worker.call(store._db.execute, f"PRAGMA query_only = {'ON' if on else 'OFF'}")


class Backend:
    #: what the store's error says while :meth:`refusing`
    refusal = ""

    def open(self) -> Store:
        raise NotImplementedError

    def reopen(self) -> Store:
        """Another store on the same data, as a restarted Core would open it."""
        return self.open()

    @contextlib.contextmanager
    def stalled(self) -> Iterator[None]:
        """The store takes no write until the block ends (another process holds it)."""
        raise NotImplementedError

    @contextlib.asynccontextmanager
    async def refusing(self, store: Store) -> AsyncIterator[None]:
        """The store answers every write of ``store`` with an error until the block ends."""
        raise NotImplementedError
        yield

    def damage_request(self, request_id: str) -> None:
        """Spoil a stored request's row behind Core's back (the store is closed)."""
        raise NotImplementedError


class MemoryBackend(Backend):
    def open(self) -> Store:
        return MemoryStore()


class SQLiteBackend(Backend):
    refusal = "readonly"

    def __init__(self, path: Path) -> None:
        self.path = path

    def open(self) -> Store:
        return SQLiteStore(self.path)

    @contextlib.contextmanager
    def stalled(self) -> Iterator[None]:
        holder = sqlite3.connect(self.path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            holder.execute("ROLLBACK")
            holder.close()

    @contextlib.asynccontextmanager
    async def refusing(self, store: Store) -> AsyncIterator[None]:
        assert isinstance(store, SQLiteStore)
        await read_only(store, True)  # as if the file had turned read-only
        try:
            yield
        finally:
            await read_only(store, False)

    def damage_request(self, request_id: str) -> None:
        with contextlib.closing(sqlite3.connect(self.path)) as db:
            db.execute("UPDATE requests SET args = '{' WHERE id = ?", (request_id,))
            db.commit()


def load_file(path: Path) -> Snapshot:
    """What a Core started on the SQLite file ``path`` would load."""
    async def main() -> Snapshot:
        store = SQLiteStore(path)
        try:
            return await store.load()
        finally:
            await store.close()

    return asyncio.run(main())
