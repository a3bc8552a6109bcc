"""Session stores: memory (the default: nothing outlives the process) and SQLite.

Core keeps its live state in memory; a store is where that state is written so a restart
of Core loses nothing. Writes are queued (they never block the event loop) and one
writer thread applies them in order, batching what has queued up into one transaction.
``await store.flush()`` returns once everything queued before it is committed: Core
flushes before it sends a tool request, so a request a page may run is always on disk.
"""

from __future__ import annotations

import asyncio
import json
import queue
import sqlite3
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol


@dataclass
class SessionRecord:
    """A session as stored. Its tool metadata and the agent's history are kept as compact
    JSON text: decoded, they take up to ~24 times the memory of their JSON."""

    id: str
    resume_token: str
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


@dataclass
class IdempotencyRecord:
    """An ``Idempotency-Key`` a control-API caller gave, and what it started. The key is
    kept only as ``key_hash`` (sha256 of the session id and the key), never in clear."""

    key_hash: str
    session_id: str
    kind: str  # "tool-call" | "turn"
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


@dataclass
class Snapshot:
    """What a store holds at start: sessions, their open requests (and the kept results
    of requests made outside turns), unfinished turns, each session's latest ended ones
    and those started with an idempotency key, and the keys."""

    sessions: list[SessionRecord] = field(default_factory=list)
    requests: list[RequestRecord] = field(default_factory=list)
    turns: list[TurnRecord] = field(default_factory=list)
    keys: list[IdempotencyRecord] = field(default_factory=list)


class Store(Protocol):
    durable: bool

    def load(self) -> Snapshot: ...

    def save_session(self, record: SessionRecord) -> None: ...

    def delete_session(self, session_id: str) -> None: ...

    def save_request(self, record: RequestRecord) -> None: ...

    def delete_request(self, request_id: str) -> None: ...

    def save_turn(self, record: TurnRecord) -> None: ...

    def save_key(self, record: IdempotencyRecord) -> None: ...

    def delete_key(self, key_hash: str) -> None: ...

    def mark_end_delivered(self, session_id: str, turn_id: str) -> None: ...

    async def flush(self) -> None: ...

    async def close(self) -> None: ...


class MemoryStore:
    """Keeps nothing: Core's own memory is the only copy."""

    durable = False

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

    async def flush(self) -> None:
        pass

    async def close(self) -> None:
        pass


_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    resume_token TEXT NOT NULL,
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

_Op = tuple[str, tuple[Any, ...]]
_Item = _Op | asyncio.Future[None] | None


def dump_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _json_text(text: str) -> str:
    """``text`` if it is JSON (a damaged row fails at load, not later)."""
    json.loads(text)
    return text


class SQLiteStore:
    """SQLite in WAL mode with one connection, owned by one writer thread."""

    durable = True

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._queue: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(turns)")}
        if "usage" not in columns:  # a database written before turns kept token usage
            self._db.execute("ALTER TABLE turns ADD COLUMN usage TEXT NOT NULL DEFAULT '{}'")
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(requests)")}
        if "finished_at" not in columns:  # written before results outside turns were kept
            self._db.execute("ALTER TABLE requests ADD COLUMN finished_at REAL")
        self._thread = threading.Thread(target=self._run, name="pedelec-store", daemon=True)
        self._started = False
        self._error: BaseException | None = None

    # --- reading (once, at start, before the writer runs) ------------------------------

    def load(self) -> Snapshot:
        db = self._db
        snapshot = Snapshot()
        for row in db.execute(
            "SELECT id, resume_token, tools, history, created_at FROM sessions ORDER BY created_at"
        ):
            snapshot.sessions.append(SessionRecord(
                row[0], row[1], _json_text(row[2]), _json_text(row[3]), row[4]))
        for row in db.execute(
            "SELECT id, session_id, turn_id, step, idx, tool, args, deadline, result, handled_by,"
            " finished_at FROM requests ORDER BY rowid"
        ):
            snapshot.requests.append(RequestRecord(
                row[0], row[1], row[2], row[3], row[4], row[5], json.loads(row[6]), row[7],
                None if row[8] is None else json.loads(row[8]), row[9], row[10]))
        for row in db.execute(
            "SELECT id, session_id, text, status, final_text, error, tool_calls, end_delivered,"
            " created_at, usage FROM turns WHERE status = 'running' OR end_delivered = 0"
            " OR id IN (SELECT t.id FROM turns t WHERE t.session_id = turns.session_id"
            f" ORDER BY t.created_at DESC LIMIT {RECENT_TURNS})"
            " OR id IN (SELECT k.target_id FROM idempotency_keys k"
            " WHERE k.session_id = turns.session_id AND k.kind = 'turn') ORDER BY created_at"
        ):
            snapshot.turns.append(TurnRecord(
                row[0], row[1], row[2], row[3], row[4],
                None if row[5] is None else json.loads(row[5]), json.loads(row[6]),
                bool(row[7]), row[8], json.loads(row[9])))
        for row in db.execute(
            "SELECT key_hash, session_id, kind, fingerprint, target_id, created_at"
            " FROM idempotency_keys ORDER BY created_at"
        ):
            snapshot.keys.append(IdempotencyRecord(*row))
        return snapshot

    # --- writing ------------------------------------------------------------------------

    def save_session(self, record: SessionRecord) -> None:
        self._submit(
            "INSERT OR REPLACE INTO sessions VALUES (?, ?, ?, ?, ?)",
            (record.id, record.resume_token, record.tools, record.history,
             record.created_at),
        )

    def delete_session(self, session_id: str) -> None:
        self._submit("DELETE FROM requests WHERE session_id = ?", (session_id,))
        self._submit("DELETE FROM idempotency_keys WHERE session_id = ?", (session_id,))
        self._submit("DELETE FROM turns WHERE session_id = ?", (session_id,))
        self._submit("DELETE FROM sessions WHERE id = ?", (session_id,))

    def save_request(self, record: RequestRecord) -> None:
        self._submit(
            "INSERT OR REPLACE INTO requests VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (record.id, record.session_id, record.turn_id, record.step, record.index,
             record.tool, dump_json(record.args), record.deadline,
             None if record.handled_by is None else dump_json(record.result), record.handled_by,
             record.finished_at),
        )

    def delete_request(self, request_id: str) -> None:
        self._submit("DELETE FROM requests WHERE id = ?", (request_id,))

    def save_turn(self, record: TurnRecord) -> None:
        self._submit(
            "INSERT OR REPLACE INTO turns VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (record.id, record.session_id, record.text, record.status, record.final_text,
             None if record.error is None else dump_json(record.error),
             dump_json(record.tool_calls),
             int(record.end_delivered), record.created_at, dump_json(record.usage)),
        )

    def save_key(self, record: IdempotencyRecord) -> None:
        self._submit(
            "INSERT OR REPLACE INTO idempotency_keys VALUES (?, ?, ?, ?, ?, ?)",
            (record.key_hash, record.session_id, record.kind, record.fingerprint,
             record.target_id, record.created_at),
        )

    def delete_key(self, key_hash: str) -> None:
        self._submit("DELETE FROM idempotency_keys WHERE key_hash = ?", (key_hash,))

    def mark_end_delivered(self, session_id: str, turn_id: str) -> None:
        self._submit("UPDATE turns SET end_delivered = 1 WHERE session_id = ? AND id = ?",
                     (session_id, turn_id))

    async def flush(self) -> None:
        """Wait until every write queued so far is committed."""
        if self._error is not None:
            raise RuntimeError(f"the SQLite store at {self.path} failed") from self._error
        self._ensure_started()
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.put(done)
        await done

    async def close(self) -> None:
        """Commit what is queued and close the database."""
        if self._started:
            self._queue.put(None)
            await asyncio.to_thread(self._thread.join)
        self._db.close()

    def _submit(self, sql: str, params: tuple[Any, ...]) -> None:
        self._ensure_started()
        self._queue.put((sql, params))

    def _ensure_started(self) -> None:
        if not self._started:
            self._started = True
            self._thread.start()

    def _run(self) -> None:
        stop = False
        while not stop:
            batch: list[_Item] = [self._queue.get()]
            while True:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            waiters: list[asyncio.Future[None]] = []
            ops: list[_Op] = []
            for item in batch:
                if item is None:
                    stop = True
                elif isinstance(item, asyncio.Future):
                    waiters.append(item)
                else:
                    ops.append(item)
            error: BaseException | None = None
            if ops:
                try:
                    self._db.execute("BEGIN")
                    for sql, params in ops:
                        self._db.execute(sql, params)
                    self._db.execute("COMMIT")
                except sqlite3.Error as exc:
                    error = self._error = exc
                    if self._db.in_transaction:
                        self._db.execute("ROLLBACK")
            for waiter in waiters:
                waiter.get_loop().call_soon_threadsafe(_settle, waiter, error)


def _settle(waiter: asyncio.Future[None], error: BaseException | None) -> None:
    if waiter.done():
        return
    if error is None:
        waiter.set_result(None)
    else:
        waiter.set_exception(RuntimeError(f"SQLite write failed: {error}"))


def open_store(spec: str) -> Store:
    """``memory`` or a path to an SQLite file (created when missing)."""
    if spec == "memory":
        return MemoryStore()
    return SQLiteStore(spec)
