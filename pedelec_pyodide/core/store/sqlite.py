"""The SQLite backend: one file in WAL mode, one connection, used by one thread.

SQLite's calls block, so they run on a thread of their own (:class:`_Worker`) and the
event loop awaits them; the queue and its writer are :mod:`.writer`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..clock import Clock
from ..log import log_event
from . import rows
from .errors import reason
from .leases import RENEW_CHUNK, LocalLeases
from .ops import KEY_COLUMNS, REQUEST_COLUMNS, SESSION_COLUMNS, TURN_COLUMNS, Op
from .records import TURN, Snapshot, hash_token
from .writer import DEFAULT_STORE_TIMEOUT, QueuedStore

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    token_hash TEXT NOT NULL,
    tools TEXT NOT NULL,
    history TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS requests (
    id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    turn_id TEXT,
    step INTEGER NOT NULL,
    idx INTEGER NOT NULL,
    tool TEXT NOT NULL,
    args TEXT NOT NULL,
    deadline REAL NOT NULL,
    result TEXT,
    handled_by TEXT,
    finished_at REAL
);
CREATE TABLE IF NOT EXISTS turns (
    id TEXT NOT NULL,
    session_id TEXT NOT NULL,
    text TEXT NOT NULL,
    status TEXT NOT NULL,
    final_text TEXT NOT NULL,
    error TEXT,
    tool_calls TEXT NOT NULL,
    end_delivered INTEGER NOT NULL,
    created_at REAL NOT NULL,
    usage TEXT NOT NULL DEFAULT '{}',
    PRIMARY KEY (session_id, id)
);
CREATE INDEX IF NOT EXISTS requests_session ON requests (session_id);
CREATE TABLE IF NOT EXISTS idempotency_keys (
    key_hash TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    target_id TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS idempotency_keys_session ON idempotency_keys (session_id);
"""

# SQLite's "another connection holds the lock" (primary result codes): every write of
# the batch would wait the same busy timeout again, so the batch fails as a whole
_BUSY_CODES = (5, 6)  # SQLITE_BUSY, SQLITE_LOCKED
# failures of the store itself, not of one write's value (PERM, BUSY, LOCKED, READONLY,
# IOERR, CORRUPT, FULL, CANTOPEN, NOTADB): they make health say "degraded"
_STORE_CODES = (3, *_BUSY_CODES, 8, 10, 11, 13, 14, 26)


def _insert(table: str, columns: tuple[str, ...]) -> str:
    return (f"INSERT OR REPLACE INTO {table} ({', '.join(columns)})"
            f" VALUES ({', '.join('?' * len(columns))})")


# each kind of write as SQL, and its parameters
_WRITES: dict[str, tuple[tuple[str, Callable[[Op], tuple[Any, ...]]], ...]] = {
    "session": ((_insert("sessions", SESSION_COLUMNS), lambda op: op.row),),
    "tools": (("UPDATE sessions SET tools = ? WHERE id = ?",
               lambda op: (op.row[0], op.session_id)),),
    "history": (("UPDATE sessions SET history = ? WHERE id = ?",
                 lambda op: (op.row[SESSION_COLUMNS.index("history")], op.session_id)),),
    "delete_session": tuple((sql, lambda op: (op.session_id,)) for sql in (
        "DELETE FROM requests WHERE session_id = ?",
        "DELETE FROM idempotency_keys WHERE session_id = ?",
        "DELETE FROM turns WHERE session_id = ?",
        "DELETE FROM sessions WHERE id = ?")),
    "request": ((_insert("requests", REQUEST_COLUMNS), lambda op: op.row),),
    "delete_request": (("DELETE FROM requests WHERE session_id = ? AND id = ?",
                        lambda op: (op.session_id, op.target)),),
    "turn": ((_insert("turns", TURN_COLUMNS), lambda op: op.row),),
    "end_delivered": (("UPDATE turns SET end_delivered = 1 WHERE session_id = ? AND id = ?",
                       lambda op: (op.session_id, op.target)),),
    "key": ((_insert("idempotency_keys", KEY_COLUMNS), lambda op: op.row),),
    "delete_key": (("DELETE FROM idempotency_keys WHERE session_id = ? AND key_hash = ?",
                    lambda op: (op.session_id, op.target)),),
    "prune_turns": ((
        "DELETE FROM turns WHERE status != 'running' AND end_delivered = 1"
        " AND rowid NOT IN (SELECT rowid FROM (SELECT rowid, row_number() OVER"
        " (PARTITION BY session_id ORDER BY created_at DESC) AS n FROM turns) WHERE n <= ?)"
        " AND NOT EXISTS (SELECT 1 FROM idempotency_keys k"
        f" WHERE k.session_id = turns.session_id AND k.kind = '{TURN}'"
        " AND k.target_id = turns.id)", lambda op: op.row),),
}


def _private(path: Path) -> None:
    """Create the database file ``0600`` before SQLite opens it (its -wal and -shm take
    the database's mode), and tighten files an older Core left readable by others."""
    try:
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    except OSError as exc:  # as SQLite would have said it: Core's CLI reports it so
        raise sqlite3.OperationalError(f"unable to open database file ({exc.strerror})"
                                       ) from None
    for file in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        try:
            if file.exists() and file.stat().st_mode & 0o077:
                file.chmod(0o600)
        except OSError as exc:  # not ours to change: say so, and carry on
            log_event("store.mode_unchanged", level=logging.WARNING, file=str(file),
                      error=reason(exc))


class _Worker:
    """One daemon thread running calls in order: the connection is used by it alone. A
    call stuck in SQLite is left to the process's exit (the thread is a daemon)."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    async def call(self, function: Callable[..., Any], *args: Any) -> Any:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Any] = loop.create_future()
        if not self._thread.is_alive():
            self._thread.start()
        self._jobs.put((function, args, done, loop))
        return await done

    def stop(self, then: Callable[[], None]) -> None:
        """Run ``then`` after the calls queued so far, and end the thread."""
        if self._thread.is_alive():
            self._jobs.put(then)
        else:
            then()

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if not isinstance(job, tuple):
                job()
                return
            function, args, done, loop = job
            try:
                outcome: tuple[Any, BaseException | None] = (function(*args), None)
            except BaseException as exc:  # handed to the awaiting task, whatever it is
                outcome = (None, exc)
            with contextlib.suppress(RuntimeError):  # its loop is closed: nobody waits
                loop.call_soon_threadsafe(_settle, done, *outcome)


def _settle(done: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if done.done():
        return
    if error is None:
        done.set_result(result)
    else:
        done.set_exception(error)


class SQLiteStore(QueuedStore, LocalLeases):
    """SQLite in WAL mode; the file is created ``0600``. One process uses the file, so
    its leases are that process's (:class:`~.leases.LocalLeases`)."""

    def __init__(self, path: str | Path, timeout: float = DEFAULT_STORE_TIMEOUT,
                 clock: Clock | None = None) -> None:
        QueuedStore.__init__(self, str(path), timeout, clock)
        LocalLeases.__init__(self, self.clock)
        self.path = Path(path)
        _private(self.path)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        # what a write frees is zeroed, so no token a migration hashed lingers in the file
        self._db.execute("PRAGMA secure_delete=ON")
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(turns)")}
        if "usage" not in columns:  # a database written before turns kept token usage
            self._db.execute("ALTER TABLE turns ADD COLUMN usage TEXT NOT NULL DEFAULT '{}'")
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(requests)")}
        if "finished_at" not in columns:  # written before results outside turns were kept
            self._db.execute("ALTER TABLE requests ADD COLUMN finished_at REAL")
        self._hash_clear_tokens()
        self._worker = _Worker("pedelec-store")

    def _hash_clear_tokens(self) -> None:
        """A database written before tokens were hashed: hash them, once."""
        db = self._db
        columns = {row[1] for row in db.execute("PRAGMA table_info(sessions)")}
        if "resume_token" not in columns:
            return
        db.execute("BEGIN IMMEDIATE")
        db.execute("ALTER TABLE sessions RENAME COLUMN resume_token TO token_hash")
        db.text_factory = bytes  # a token that is not UTF-8 spoils its row only
        try:
            rows = db.execute("SELECT rowid, token_hash FROM sessions").fetchall()
        finally:
            db.text_factory = str
        for rowid, token in rows:
            # a token that is not text cannot be matched: its row is skipped at load
            try:
                hashed = hash_token(token.decode("utf-8")) if isinstance(token, bytes) else ""
            except UnicodeDecodeError:
                hashed = ""
            db.execute("UPDATE sessions SET token_hash = ? WHERE rowid = ?", (hashed, rowid))
        db.execute("COMMIT")
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # and none left in the -wal either
        log_event("store.tokens_hashed", file=str(self.path))

    # --- the backend -----------------------------------------------------------------

    async def _load(self) -> Snapshot:
        snapshot: Snapshot = await self._worker.call(self._read)
        return snapshot

    def _read(self) -> Snapshot:
        db = self._db
        snapshot = Snapshot()
        db.text_factory = bytes  # text is decoded per row: bad UTF-8 spoils one row only
        try:
            snapshot.sessions = rows.records("sessions", db.execute(
                f"SELECT rowid, {', '.join(SESSION_COLUMNS)} FROM sessions"
                " ORDER BY created_at"), rows.session)
            known = {session.id for session in snapshot.sessions}
            snapshot.requests = rows.records("requests", db.execute(
                f"SELECT rowid, {', '.join(REQUEST_COLUMNS)} FROM requests ORDER BY rowid"),
                rows.request, known)
            snapshot.turns = rows.records("turns", db.execute(
                f"SELECT rowid, {', '.join(TURN_COLUMNS)} FROM turns ORDER BY created_at"),
                rows.turn, known, set())
            snapshot.keys = rows.records("idempotency_keys", db.execute(
                f"SELECT rowid, {', '.join(KEY_COLUMNS)} FROM idempotency_keys"
                " ORDER BY created_at"), rows.key, known)
        finally:
            db.text_factory = str
        return snapshot

    async def unstored(self, session_ids: list[str]) -> list[str]:
        stored: set[str] = await self._worker.call(self._stored, session_ids)
        return [session_id for session_id in session_ids if session_id not in stored]

    def _stored(self, session_ids: list[str]) -> set[str]:
        found: set[str] = set()
        for start in range(0, len(session_ids), RENEW_CHUNK):
            chunk = session_ids[start:start + RENEW_CHUNK]
            found.update(row[0] for row in self._db.execute(
                f"SELECT id FROM sessions WHERE id IN ({', '.join('?' * len(chunk))})",
                chunk))
        return found

    async def _apply(self, ops: list[Op]) -> None:
        await self._worker.call(self._transaction, ops)

    def _transaction(self, ops: list[Op]) -> None:
        db = self._db
        try:
            db.execute("BEGIN")
            for op in ops:
                for sql, params in _WRITES[op.kind]:
                    db.execute(sql, params(op))
            db.execute("COMMIT")
        except BaseException:
            self._rollback()
            raise

    def _rollback(self) -> None:
        if self._db.in_transaction:
            try:
                self._db.execute("ROLLBACK")
            except sqlite3.Error as exc:
                log_event("store.rollback_failed", level=logging.ERROR, error=reason(exc))

    def _whole_batch(self, exc: Exception) -> bool:
        return _code(exc) in _BUSY_CODES

    def _of_store(self, exc: Exception) -> bool:
        return _code(exc) in _STORE_CODES

    async def _probe(self) -> None:
        pass  # a file is always within reach: what fails is a write, reported as such

    async def _release(self) -> None:
        self._worker.stop(self._db.close)


def _code(exc: BaseException) -> int:
    """SQLite's primary result code of an error (0 for an error not from SQLite)."""
    code: int = getattr(exc, "sqlite_errorcode", 0) & 0xFF
    return code
