"""The store backends as the contract tests (test_store_contract.py) see them: a way to
open a store, to open another on the same data, and to make each fault real."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from pedelec_pyodide.core.store import MemoryStore, Snapshot, SQLiteStore, Store

#: the fixtures of every backend, and of those that keep what they are given
BACKENDS = ["memory", "sqlite"]
DURABLE = ["sqlite"]


async def loaded(store: Store) -> Snapshot:
    return await asyncio.to_thread(store.load)


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

    @contextlib.contextmanager
    def refusing(self, store: Store) -> Iterator[None]:
        """The store answers every write of ``store`` with an error until the block ends."""
        raise NotImplementedError

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

    @contextlib.contextmanager
    def refusing(self, store: Store) -> Iterator[None]:
        assert isinstance(store, SQLiteStore)
        # in the writer's own order, as if the file had turned read-only
        store._submit("test", "PRAGMA query_only = ON", tuple)
        try:
            yield
        finally:
            store._submit("test", "PRAGMA query_only = OFF", tuple)

    def damage_request(self, request_id: str) -> None:
        with contextlib.closing(sqlite3.connect(self.path)) as db:
            db.execute("UPDATE requests SET args = '{' WHERE id = ?", (request_id,))
            db.commit()
