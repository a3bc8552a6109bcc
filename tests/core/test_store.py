"""What only the SQLite store does: migrating files written by older Cores; and Core
pruning old turns from its store (the store contract itself: test_store_contract.py)."""

from __future__ import annotations

import contextlib
import re
import sqlite3
from pathlib import Path

import pytest
from corekit import config, run, running_core
from storekit import load_file

from pedelec_pyodide.core.store import (
    RECENT_TURNS,
    SessionRecord,
    SQLiteStore,
    StoreSpec,
    TurnRecord,
    hash_token,
    open_store,
    parse_store,
)


def test_a_database_from_before_usage_gains_the_column(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE turns (id TEXT NOT NULL, session_id TEXT NOT NULL, text TEXT NOT"
               " NULL, status TEXT NOT NULL, final_text TEXT NOT NULL, error TEXT, tool_calls"
               " TEXT NOT NULL, end_delivered INTEGER NOT NULL, created_at REAL NOT NULL,"
               " PRIMARY KEY (session_id, id))")
    db.execute("CREATE TABLE sessions (id TEXT PRIMARY KEY, resume_token TEXT NOT NULL,"
               " tools TEXT NOT NULL, history TEXT NOT NULL, created_at REAL NOT NULL)")
    db.execute("INSERT INTO sessions VALUES ('s0', 'token', '[]', '[]', 1)")
    db.execute("INSERT INTO turns VALUES ('t0', 's0', 'x', 'completed', 'ok', NULL, '[]', 0, 1)")
    db.commit()
    db.close()
    (turn,) = load_file(path).turns
    assert turn.usage == {}


def test_core_prunes_old_turns_from_its_store(tmp_path: Path) -> None:
    """Turns that ended long ago, in a session that lives on: Core prunes them (at start,
    then every PRUNE_SECONDS), down to the latest RECENT_TURNS."""
    path = tmp_path / "core.sqlite"

    async def main() -> None:
        store = SQLiteStore(path)
        store.save_session(SessionRecord("s1", hash_token("t"), "[]", "[]", 1.0))
        for n in range(RECENT_TURNS + 5):
            store.save_turn(TurnRecord(f"t{n}", "s1", "hi", "completed", "ok",
                                       end_delivered=True, created_at=float(n)))
        await store.close()
        async with running_core(config(store=str(path))) as core:
            await core.registry.store.flush()
            with contextlib.closing(sqlite3.connect(path)) as db:
                count = db.execute("SELECT count(*) FROM turns").fetchone()[0]
            assert count == RECENT_TURNS

    run(main())


@pytest.mark.parametrize(("url", "kind", "target"), [
    ("memory", "memory", ""),
    ("core.sqlite", "sqlite", "core.sqlite"),
    ("/var/lib/pedelec/core.sqlite", "sqlite", "/var/lib/pedelec/core.sqlite"),
    ("sqlite:core.sqlite", "sqlite", "core.sqlite"),
    ("sqlite:///var/lib/core.sqlite", "sqlite", "/var/lib/core.sqlite"),
    ("redis://127.0.0.1:6379/0", "redis", "redis://127.0.0.1:6379/0"),
    ("redis://:secret@redis.internal/2?cluster=eu-1", "redis",
     "redis://:secret@redis.internal/2?cluster=eu-1"),
])
def test_the_store_url_names_its_backend(url: str, kind: str, target: str) -> None:
    assert parse_store(url) == StoreSpec(kind, target)  # type: ignore[arg-type]


@pytest.mark.parametrize(("url", "words"), [
    ("http://example.com/x", "not a store"),
    ("sqlite:", "empty"),
    ("redis:///0", "needs a host"),
    ("redis://h:port/0", "port is not a number"),
    ("redis://h/zero", "must be a number"),
    ("redis://h/0?socket_timeout=1", "only ?cluster=NAME"),
    ("redis://h/0?cluster=a:b", "cluster name"),
])
def test_a_store_url_that_names_no_backend_says_why(url: str, words: str) -> None:
    with pytest.raises(ValueError, match=re.escape(words)):
        parse_store(url)


def test_a_redis_store_logs_its_url_without_the_password() -> None:
    store = open_store("redis://:hunter2@127.0.0.1:1/3?cluster=eu")
    assert store.label == "redis://:***@127.0.0.1:1/3?cluster=eu"
