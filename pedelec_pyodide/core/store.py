"""Session stores: memory (the default: nothing outlives the process) and SQLite.

Core keeps its live state in memory; a store is where that state is written so a restart
of Core loses nothing. Writes are queued (they never block the event loop) and one
writer thread applies them in order, batching what has queued up into one transaction.
``await store.flush(*keys)`` returns once everything queued before it is committed: Core
flushes before it sends a tool request, so a request a page may run is always on disk.

A write that fails fails alone: values are serialised and checked by the caller
(``save_*`` never raises), a batch that fails is retried one write at a time, and the
failure is kept under the write's key (a session's id, a request's id, a turn's
:func:`turn_key`) for the flush that names that key to raise :class:`StoreError`. A flush
has a deadline; if the writer ever stops, every flush fails and :attr:`problem` says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import os
import queue
import re
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from ..protocol import MAX_ID_LENGTH, TURN_STATUSES
from ..tools import check_metadata
from .log import log_event

#: the error code of a request that could not be stored (so it was not sent)
STORE_FAILED = "STORE_FAILED"
#: seconds a flush waits for the writer before it fails (``--store-timeout``)
DEFAULT_STORE_TIMEOUT = 5.0
# failed writes kept for the flush that names their key; the oldest are forgotten
MAX_REMEMBERED_FAILURES = 1024
# the longest reason quoted in an error or a log line
MAX_REASON_CHARS = 200
# characters of text queued for the writer, not yet written: past it (a stuck or slow store), a new
# write fails at once rather than holding its values in memory
MAX_QUEUED_CHARS = 64 * 1024 * 1024


class StoreError(Exception):
    """A write the store could not make, or a flush that could not wait any longer."""

    code = STORE_FAILED


def hash_token(token: str) -> str:
    """What the store keeps of a resume token: its sha256, in hex."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def turn_key(session_id: str, turn_id: str) -> str:
    """The key of a turn's writes (turn ids are the page's, unique per session only)."""
    return f"{session_id}/{turn_id}"


@dataclass
class SessionRecord:
    """A session as stored. Its tool metadata and the agent's history are kept as compact
    JSON text: decoded, they take up to ~24 times the memory of their JSON."""

    id: str
    token_hash: str  # hash_token(resume token): the token itself is never stored
    tools: str  # JSON: the page's tool metadata
    history: str  # JSON: the agent's own record of earlier turns
    created_at: float


@dataclass
class RequestRecord:
    """A tool request that has not been delivered to its caller yet."""

    id: str
    session_id: str
    turn_id: str | None
    step: int
    index: int
    tool: str
    args: Any
    deadline: float  # wall-clock (time.time()) seconds
    result: Any = None
    handled_by: str | None = None  # set once the result is in
    # wall-clock time the result came in; kept (outside turns) until the retention ends
    finished_at: float | None = None

    @property
    def answered(self) -> bool:
        return self.handled_by is not None


#: what an ``Idempotency-Key`` started: a control-API tool call or a turn
KeyKind = Literal["tool-call", "turn"]
TOOL_CALL: KeyKind = "tool-call"
TURN: KeyKind = "turn"
KEY_KINDS: tuple[KeyKind, ...] = (TOOL_CALL, TURN)


@dataclass
class IdempotencyRecord:
    """An ``Idempotency-Key`` a control-API caller gave, and what it started. The key is
    kept only as ``key_hash`` (sha256 of the session id and the key), never in clear."""

    key_hash: str
    session_id: str
    kind: KeyKind
    fingerprint: str  # sha256 of what the request asked for (see core/idempotency.py)
    target_id: str  # the toolRequestId or turnId it started
    created_at: float


@dataclass
class TurnRecord:
    id: str
    session_id: str
    text: str
    status: str  # running | completed | failed | cancelled
    final_text: str = ""
    error: dict[str, Any] | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    end_delivered: bool = False
    created_at: float = 0.0
    usage: dict[str, int] = field(default_factory=dict)  # the model's token counts


# Ended turns remembered per session (in memory, and loaded again after a restart), so a
# page that re-sends the ``turn.start`` of a turn whose ``turn.end`` it never got (lost
# with a dropped connection or a killed Core) gets that end again, not a second run.
RECENT_TURNS = 8
#: seconds between two prunings of old turns (Core calls ``prune_turns``)
PRUNE_SECONDS = 60.0
# the key a pruning's failure is kept under
PRUNE_KEY = "prune"


@dataclass
class Snapshot:
    """What a store holds at start: sessions, their open requests (and the kept results
    of requests made outside turns), their turns (old ones leave by ``prune_turns``) and
    the idempotency keys."""

    sessions: list[SessionRecord] = field(default_factory=list)
    requests: list[RequestRecord] = field(default_factory=list)
    turns: list[TurnRecord] = field(default_factory=list)
    keys: list[IdempotencyRecord] = field(default_factory=list)


class Store(Protocol):
    durable: bool

    @property
    def problem(self) -> str | None:
        """Why the store is not writing (health reports ``degraded``), or None."""

    def load(self) -> Snapshot: ...

    def save_session(self, record: SessionRecord) -> None: ...

    def delete_session(self, session_id: str) -> None: ...

    def save_request(self, record: RequestRecord) -> None: ...

    def delete_request(self, request_id: str) -> None: ...

    def save_turn(self, record: TurnRecord) -> None: ...

    def save_key(self, record: IdempotencyRecord) -> None: ...

    def delete_key(self, key_hash: str) -> None: ...

    def mark_end_delivered(self, session_id: str, turn_id: str) -> None: ...

    def prune_turns(self, keep: int = RECENT_TURNS) -> None:
        """Delete each session's ended turns past its ``keep`` latest, but none that is
        running, whose end the page has not had, or that an idempotency key names."""

    async def flush(self, *keys: str, timeout: float | None = None) -> None: ...

    async def close(self, timeout: float | None = None) -> None: ...


class MemoryStore:
    """Keeps nothing: Core's own memory is the only copy."""

    durable = False
    problem: str | None = None

    def load(self) -> Snapshot:
        return Snapshot()

    def save_session(self, record: SessionRecord) -> None:
        pass

    def delete_session(self, session_id: str) -> None:
        pass

    def save_request(self, record: RequestRecord) -> None:
        pass

    def delete_request(self, request_id: str) -> None:
        pass

    def save_turn(self, record: TurnRecord) -> None:
        pass

    def save_key(self, record: IdempotencyRecord) -> None:
        pass

    def delete_key(self, key_hash: str) -> None:
        pass

    def mark_end_delivered(self, session_id: str, turn_id: str) -> None:
        pass

    def prune_turns(self, keep: int = RECENT_TURNS) -> None:
        pass

    async def flush(self, *keys: str, timeout: float | None = None) -> None:
        # nothing to wait for, but a flush is a yield point with every store: a turn's
        # large steps (1 MiB of args, then of results) let other clients' work in between
        await asyncio.sleep(0)

    async def close(self, timeout: float | None = None) -> None:
        pass


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


_PRUNE_TURNS = (
    "DELETE FROM turns WHERE status != 'running' AND end_delivered = 1"
    " AND rowid NOT IN (SELECT rowid FROM (SELECT rowid, row_number() OVER"
    " (PARTITION BY session_id ORDER BY created_at DESC) AS n FROM turns) WHERE n <= ?)"
    " AND NOT EXISTS (SELECT 1 FROM idempotency_keys k WHERE k.session_id = turns.session_id"
    f" AND k.kind = '{TURN}' AND k.target_id = turns.id)")

# A queued write: its key, its SQL and its parameters (already serialised and checked).
_Op = tuple[str, str, tuple[Any, ...]]
_Item = _Op | asyncio.Future[None] | None
# SQLite's "another connection holds the lock" (primary result codes): every write of
# the batch would wait the same busy timeout again, so the batch fails as a whole
_BUSY_CODES = (5, 6)  # SQLITE_BUSY, SQLITE_LOCKED
# failures of the store itself, not of one write's value (PERM, BUSY, LOCKED, READONLY,
# IOERR, CORRUPT, FULL, CANTOPEN, NOTADB): they make health say "degraded"
_STORE_CODES = (3, *_BUSY_CODES, 8, 10, 11, 13, 14, 26)
_STORED_STATUSES = ("running", *TURN_STATUSES)
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def dump_json(value: Any) -> str:
    """Compact JSON text, as Core keeps metadata and history in memory."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _dump(value: Any) -> str:
    """JSON text for a row: strict, so a value SQLite could store but no page or model
    could read back (NaN) fails its own write."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _reason(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= MAX_REASON_CHARS else text[:MAX_REASON_CHARS] + "..."


def _size(params: tuple[Any, ...]) -> int:
    return sum(len(value) for value in params if isinstance(value, str))


def _checked(params: tuple[Any, ...]) -> tuple[Any, ...]:
    """The parameters, if SQLite can take every one: text that encodes as UTF-8 (no lone
    surrogate) and numbers; raised here, on the caller's side, not in the writer."""
    for value in params:
        if isinstance(value, str):
            value.encode("utf-8")
        elif value is not None and not isinstance(value, (int, float)):
            raise TypeError(f"cannot store a value of type {type(value).__name__}")
    return params


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
                      error=_reason(exc))


class SQLiteStore:
    """SQLite in WAL mode with one connection, owned by one writer thread."""

    durable = True

    def __init__(self, path: str | Path, timeout: float = DEFAULT_STORE_TIMEOUT) -> None:
        self.path = Path(path)
        self.timeout = timeout
        self._queue: queue.SimpleQueue[_Item] = queue.SimpleQueue()
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
        self._thread = threading.Thread(target=self._run, name="pedelec-store", daemon=True)
        self._started = False
        # guards _failures and _queued_chars (the writer and the loop both write them)
        self._lock = threading.Lock()
        self._failures: OrderedDict[str, str] = OrderedDict()
        self._dead: str | None = None
        self._last_failure: str | None = None  # cleared by the next batch that commits
        self._queued_chars = 0  # of text in queued writes (guarded by _lock)

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

    @property
    def problem(self) -> str | None:
        return self._dead or self._last_failure

    # --- reading (once, at start, before the writer runs) ------------------------------

    def load(self) -> Snapshot:
        """Every row that makes sense; a damaged one (bad JSON, a wrong type, a NULL, a
        row of an unknown session) is skipped with a warning."""
        db = self._db
        snapshot = Snapshot()
        db.text_factory = bytes  # text is decoded per row: bad UTF-8 spoils one row only
        try:
            snapshot.sessions = _rows(db, "sessions", "SELECT rowid, id, token_hash, tools,"
                                      " history, created_at FROM sessions ORDER BY created_at",
                                      _session)
            known = {session.id for session in snapshot.sessions}
            snapshot.requests = _rows(
                db, "requests", "SELECT rowid, id, session_id, turn_id, step, idx, tool, args,"
                " deadline, result, handled_by, finished_at FROM requests ORDER BY rowid",
                _request, known)
            snapshot.turns = _rows(
                db, "turns", "SELECT rowid, id, session_id, text, status, final_text, error,"
                " tool_calls, end_delivered, created_at, usage FROM turns ORDER BY created_at",
                _turn, known, set())
            snapshot.keys = _rows(
                db, "idempotency_keys", "SELECT rowid, key_hash, session_id, kind, fingerprint,"
                " target_id, created_at FROM idempotency_keys ORDER BY created_at", _key, known)
        finally:
            db.text_factory = str
        return snapshot

    # --- writing ------------------------------------------------------------------------

    def save_session(self, record: SessionRecord) -> None:
        self._submit(record.id, "INSERT OR REPLACE INTO sessions (id, token_hash, tools,"
                     " history, created_at) VALUES (?, ?, ?, ?, ?)", lambda: (
                         record.id, record.token_hash, record.tools, record.history,
                         record.created_at))

    def delete_session(self, session_id: str) -> None:
        self._submit(session_id, "DELETE FROM requests WHERE session_id = ?",
                     lambda: (session_id,))
        self._submit(session_id, "DELETE FROM idempotency_keys WHERE session_id = ?",
                     lambda: (session_id,))
        self._submit(session_id, "DELETE FROM turns WHERE session_id = ?",
                     lambda: (session_id,))
        self._submit(session_id, "DELETE FROM sessions WHERE id = ?", lambda: (session_id,))

    def save_request(self, record: RequestRecord) -> None:
        self._submit(record.id,
                     "INSERT OR REPLACE INTO requests VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                     lambda: (record.id, record.session_id, record.turn_id, record.step,
                              record.index, record.tool, _dump(record.args), record.deadline,
                              None if record.handled_by is None else _dump(record.result),
                              record.handled_by, record.finished_at))

    def delete_request(self, request_id: str) -> None:
        self._submit(request_id, "DELETE FROM requests WHERE id = ?", lambda: (request_id,))

    def save_turn(self, record: TurnRecord) -> None:
        self._submit(turn_key(record.session_id, record.id),
                     "INSERT OR REPLACE INTO turns VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                     lambda: (record.id, record.session_id, record.text, record.status,
                              record.final_text,
                              None if record.error is None else _dump(record.error),
                              _dump(record.tool_calls), int(record.end_delivered),
                              record.created_at, _dump(record.usage)))

    def save_key(self, record: IdempotencyRecord) -> None:
        self._submit(record.key_hash,
                     "INSERT OR REPLACE INTO idempotency_keys VALUES (?, ?, ?, ?, ?, ?)",
                     lambda: (record.key_hash, record.session_id, record.kind,
                              record.fingerprint, record.target_id, record.created_at))

    def delete_key(self, key_hash: str) -> None:
        self._submit(key_hash, "DELETE FROM idempotency_keys WHERE key_hash = ?",
                     lambda: (key_hash,))

    def mark_end_delivered(self, session_id: str, turn_id: str) -> None:
        self._submit(turn_key(session_id, turn_id),
                     "UPDATE turns SET end_delivered = 1 WHERE session_id = ? AND id = ?",
                     lambda: (session_id, turn_id))

    def prune_turns(self, keep: int = RECENT_TURNS) -> None:
        self._submit(PRUNE_KEY, _PRUNE_TURNS, lambda: (keep,))

    async def flush(self, *keys: str, timeout: float | None = None) -> None:
        """Wait until every write queued so far is committed, at most ``timeout`` seconds
        (default: the store's); raise :class:`StoreError` if that took too long, if the
        writer has stopped, or if a write of one of ``keys`` failed since their last
        flush."""
        if self._dead is None:
            self._ensure_started()
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._queue.put(done)
            limit = self.timeout if timeout is None else timeout
            try:
                await asyncio.wait_for(done, limit)
            except TimeoutError:
                reason = (f"the store did not commit within {limit:g} s (--store-timeout): "
                          f"{self.path} is locked by another process, slow or stuck")
                self._last_failure = reason  # until a batch commits again
                log_event("store.flush_timeout", level=logging.WARNING, seconds=limit)
                raise StoreError(reason) from None
        if self._dead is not None:
            raise StoreError(self._dead)
        with self._lock:
            failed = [self._failures.pop(key) for key in keys if key in self._failures]
        if failed:
            raise StoreError(failed[0])

    async def close(self, timeout: float | None = None) -> None:
        """Commit what is queued and close the database, waiting at most ``timeout``
        seconds for the writer: a writer stuck in SQLite is left to the process's exit."""
        if self._started:
            self._queue.put(None)
            limit = self.timeout if timeout is None else timeout
            loop = asyncio.get_running_loop()
            deadline = loop.time() + limit
            while self._thread.is_alive() and loop.time() < deadline:
                await asyncio.sleep(0.02)
            if self._thread.is_alive():
                log_event("store.close_timeout", level=logging.WARNING, seconds=limit)
                return
        self._db.close()

    def _submit(self, key: str, sql: str, params: Callable[[], tuple[Any, ...]]) -> None:
        """Queue one write; ``params`` is called here, so a value that cannot be stored
        fails its own write (kept under ``key``), not the writer."""
        if self._dead is not None:
            self._fail(key, self._dead)
            return
        try:
            values = _checked(params())
        except Exception as exc:  # unserialisable, NaN, a lone surrogate, too deep
            self._fail(key, f"a value cannot be stored ({_reason(exc)})")
            return
        size = _size(values)
        with self._lock:
            behind = self._queued_chars + size > MAX_QUEUED_CHARS
            if not behind:
                self._queued_chars += size
        if behind:
            self._fail(key, f"the store is over {MAX_QUEUED_CHARS} characters behind: "
                       f"{self.path} is stuck or too slow", of_store=True)
            return
        self._ensure_started()
        self._queue.put((key, sql, values))

    def _fail(self, key: str, reason: str, *, of_store: bool = False) -> None:
        """Keep ``reason`` for the flush that names ``key``; ``of_store``: the store
        itself failed (not one bad value), so :attr:`problem` reports it."""
        with self._lock:
            self._failures[key] = reason
            self._failures.move_to_end(key)
            while len(self._failures) > MAX_REMEMBERED_FAILURES:
                self._failures.popitem(last=False)
        if of_store:
            self._last_failure = reason
        log_event("store.write_failed", level=logging.WARNING,
                  key=key.encode("utf-8", "backslashreplace").decode(), error=reason)

    def _ensure_started(self) -> None:
        if not self._started:
            self._started = True
            self._thread.start()

    # --- the writer thread --------------------------------------------------------------

    def _run(self) -> None:
        waiters: list[asyncio.Future[None]] = []
        try:
            stop = False
            while not stop:
                batch: list[_Item] = [self._queue.get()]
                while True:
                    try:
                        batch.append(self._queue.get_nowait())
                    except queue.Empty:
                        break
                ops: list[_Op] = []
                for item in batch:
                    if item is None:
                        stop = True
                    elif isinstance(item, asyncio.Future):
                        waiters.append(item)
                    else:
                        ops.append(item)
                if ops:
                    self._apply(ops)
                    written = sum(_size(params) for _key, _sql, params in ops)
                    with self._lock:
                        self._queued_chars -= written
                for waiter in waiters:
                    _settle_soon(waiter, None)
                waiters = []
        except BaseException as exc:  # a bug, not a write: never leave a flush waiting
            self._dead = f"the store's writer stopped ({_reason(exc)}); nothing is stored"
            log_event("store.writer_died", level=logging.ERROR, error=self._dead)
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if isinstance(item, asyncio.Future):
                    waiters.append(item)
            for waiter in waiters:
                _settle_soon(waiter, StoreError(self._dead))

    def _apply(self, ops: list[_Op]) -> None:
        """The batch in one transaction; if it fails, each write on its own, so that only
        the bad one fails."""
        db = self._db
        try:
            db.execute("BEGIN")
            for _key, sql, params in ops:
                db.execute(sql, params)
            db.execute("COMMIT")
        except Exception as exc:
            self._rollback()
            if len(ops) == 1 or _code(exc) in _BUSY_CODES:
                for key, _sql, _params in ops:
                    self._fail(key, f"the write failed ({_reason(exc)})",
                               of_store=_code(exc) in _STORE_CODES)
                return
            for key, sql, params in ops:
                try:
                    db.execute(sql, params)  # autocommit: a transaction of its own
                except Exception as single:
                    self._rollback()
                    self._fail(key, f"the write failed ({_reason(single)})",
                               of_store=_code(single) in _STORE_CODES)
            return
        self._last_failure = None

    def _rollback(self) -> None:
        if self._db.in_transaction:
            try:
                self._db.execute("ROLLBACK")
            except sqlite3.Error as exc:
                log_event("store.rollback_failed", level=logging.ERROR, error=_reason(exc))


def _code(exc: BaseException) -> int:
    """SQLite's primary result code of an error (0 for an error not from SQLite)."""
    code: int = getattr(exc, "sqlite_errorcode", 0) & 0xFF
    return code


def _settle_soon(waiter: asyncio.Future[None], error: BaseException | None) -> None:
    with contextlib.suppress(RuntimeError):  # its loop is closed: nobody waits any more
        waiter.get_loop().call_soon_threadsafe(_settle, waiter, error)


def _settle(waiter: asyncio.Future[None], error: BaseException | None) -> None:
    if waiter.done():
        return
    if error is None:
        waiter.set_result(None)
    else:
        waiter.set_exception(error)


# --- reading rows: each field checked, a damaged row skipped ------------------------------

class _Damaged(ValueError):
    pass


def _skipped(table: str, rowid: Any, reason: str) -> None:
    log_event("store.row_skipped", level=logging.WARNING, table=table, rowid=rowid,
              reason=reason[:MAX_REASON_CHARS])


def _parsed(table: str, row: tuple[Any, ...], build: Callable[..., Any],
            *context: Any) -> Any:
    try:
        return build(row[1:], *context)
    except (ValueError, TypeError, RecursionError) as exc:  # UnicodeError is a ValueError
        _skipped(table, row[0], str(exc) if isinstance(exc, _Damaged) else _reason(exc))
        return None


def _rows(db: sqlite3.Connection, table: str, sql: str, build: Callable[..., Any],
          *context: Any) -> list[Any]:
    """The records ``build`` makes of the rows ``sql`` selects (rowid first); a damaged
    row is skipped with a warning."""
    records = []
    for row in db.execute(sql):
        record = _parsed(table, row, build, *context)
        if record is not None:
            records.append(record)
    return records


def _text(value: Any, name: str, *, null: bool = False) -> Any:
    if value is None and null:
        return None
    if not isinstance(value, bytes):
        raise _Damaged(f"{name} is {'NULL' if value is None else type(value).__name__}, "
                       "not text")
    return value.decode("utf-8")


def _id(value: Any, name: str, *, null: bool = False) -> Any:
    text = _text(value, name, null=null)
    if text is not None and not 0 < len(text) <= MAX_ID_LENGTH:
        raise _Damaged(f"{name} is not an id (1 to {MAX_ID_LENGTH} characters)")
    return text


def _number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(
            value):
        raise _Damaged(f"{name} is not a number")
    return value


def _integer(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _Damaged(f"{name} is not a whole number")
    return value


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _json(value: Any, name: str, kind: type | None = None, *, null: bool = False) -> Any:
    text = _text(value, name, null=null)
    if text is None:
        return None
    try:
        data = json.loads(text, parse_constant=_not_json)
        _dump(data).encode("utf-8")  # a lone surrogate, escaped in the JSON
    except (ValueError, RecursionError) as exc:
        raise _Damaged(f"{name} is not valid JSON ({_reason(exc)})") from None
    if kind is not None and not isinstance(data, kind):
        raise _Damaged(f"{name} is {type(data).__name__}, not {kind.__name__}")
    return data


def _objects(data: list[Any], name: str) -> list[dict[str, Any]]:
    if not all(isinstance(item, dict) for item in data):
        raise _Damaged(f"{name} holds something other than objects")
    return data


def _session(row: tuple[Any, ...]) -> SessionRecord:
    id_, token_hash, tools, history, created_at = row
    token_hash = _text(token_hash, "token_hash")
    if not _SHA256_HEX.fullmatch(token_hash):
        raise _Damaged("token_hash is not a sha256 in hex")
    tools_text = _text(tools, "tools")
    names: set[str] = set()
    for index, metadata in enumerate(_objects(_json(tools, "tools", list), "tools")):
        try:
            check_metadata(metadata)
        except ValueError as exc:
            raise _Damaged(f"tools[{index}]: {exc}") from None
        if metadata["name"] in names:
            raise _Damaged(f"tools[{index}]: {metadata['name']!r} is listed twice")
        names.add(metadata["name"])
    _objects(_json(history, "history", list), "history")
    return SessionRecord(_id(id_, "id"), token_hash, tools_text, _text(history, "history"),
                         _number(created_at, "created_at"))


def _request(row: tuple[Any, ...], sessions: set[str]) -> RequestRecord:
    (id_, session_id, turn_id, step, idx, tool, args, deadline, result, handled_by,
     finished_at) = row
    record = RequestRecord(
        _id(id_, "id"), _id(session_id, "session_id"), _id(turn_id, "turn_id", null=True),
        _integer(step, "step"), _integer(idx, "idx"), _text(tool, "tool"),
        _json(args, "args"), _number(deadline, "deadline"),
        _json(result, "result", null=True), _text(handled_by, "handled_by", null=True),
        None if finished_at is None else _number(finished_at, "finished_at"))
    if record.session_id not in sessions:
        raise _Damaged("a request of an unknown session")
    return record


def _turn(row: tuple[Any, ...], sessions: set[str], running: set[str]) -> TurnRecord:
    """A turn; a second running turn of one session is damage (one turn at a time)."""
    (id_, session_id, text, status, final_text, error, tool_calls, end_delivered, created_at,
     usage) = row
    status = _text(status, "status")
    if status not in _STORED_STATUSES:
        raise _Damaged(f"status is not one of {list(_STORED_STATUSES)}")
    if end_delivered not in (0, 1) or isinstance(end_delivered, float):
        raise _Damaged("end_delivered is not 0 or 1")
    usage = _json(usage, "usage", dict)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in usage.values()):
        raise _Damaged("usage holds something other than whole numbers")
    record = TurnRecord(
        _id(id_, "id"), _id(session_id, "session_id"), _text(text, "text"), status,
        _text(final_text, "final_text"), _json(error, "error", dict, null=True),
        _objects(_json(tool_calls, "tool_calls", list), "tool_calls"), bool(end_delivered),
        _number(created_at, "created_at"), usage)
    if record.session_id not in sessions:
        raise _Damaged("a turn of an unknown session")
    if status == "running":
        if record.session_id in running:
            raise _Damaged("a second running turn of its session")
        running.add(record.session_id)
    return record


def _key(row: tuple[Any, ...], sessions: set[str]) -> IdempotencyRecord:
    key_hash, session_id, kind, fingerprint, target_id, created_at = row
    record = IdempotencyRecord(
        _text(key_hash, "key_hash"), _id(session_id, "session_id"), _text(kind, "kind"),
        _text(fingerprint, "fingerprint"), _id(target_id, "target_id"),
        _number(created_at, "created_at"))
    if record.kind not in KEY_KINDS:
        raise _Damaged(f"kind is not one of {list(KEY_KINDS)}")
    if not (_SHA256_HEX.fullmatch(record.key_hash)
            and _SHA256_HEX.fullmatch(record.fingerprint)):
        raise _Damaged("key_hash or fingerprint is not a sha256 in hex")
    if record.session_id not in sessions:
        raise _Damaged("a key of an unknown session")
    return record


def open_store(spec: str, timeout: float = DEFAULT_STORE_TIMEOUT) -> Store:
    """``memory`` or a path to an SQLite file (created ``0600`` when missing)."""
    if spec == "memory":
        return MemoryStore()
    return SQLiteStore(spec, timeout)
