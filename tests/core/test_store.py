"""The SQLite store keeps what a restart needs, turns' token usage included."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from pedelec_pyodide.core.store import SessionRecord, SQLiteStore, TurnRecord, hash_token


def test_an_undelivered_turn_end_keeps_its_usage(tmp_path: Path) -> None:
    path = tmp_path / "core.sqlite"

    async def write() -> None:
        store = SQLiteStore(path)
        store.save_session(SessionRecord("s1", hash_token("t"), "[]", "[]", 1.0))
        store.save_turn(TurnRecord("t1", "s1", "hi", "completed", "done", None, [], False, 1.0,
                                   {"input_tokens": 7, "output_tokens": 3}))
        await store.close()

    asyncio.run(write())
    (turn,) = SQLiteStore(path).load().turns
    assert (turn.id, turn.final_text, turn.usage) == ("t1", "done",
                                                      {"input_tokens": 7, "output_tokens": 3})


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
    (turn,) = SQLiteStore(path).load().turns
    assert turn.usage == {}
