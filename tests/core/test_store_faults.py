"""The store never dies silently, never hangs a request, and keeps nothing private in
clear: each test runs on a real SQLite file (and, where it says so, a real Core)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import secrets
import signal
import sqlite3
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from corekit import (
    TOKEN,
    WAIT,
    Page,
    RawClient,
    config,
    core_process,
    echo_page,
    run,
    running_core,
    tool_meta,
)
from storekit import free_port, load_file, read_only

from pedelec_pyodide import Session, define_tool
from pedelec_pyodide.core.store import (
    STORE_FAILED,
    RequestRecord,
    SessionRecord,
    SQLiteStore,
    StoreError,
    hash_token,
    writer,
)


def request(request_id: str, args: Any, session_id: str = "s1") -> RequestRecord:
    return RequestRecord(request_id, session_id, None, 0, 0, "echo", args, 1e12)


def store_bytes(path: Path) -> bytes:
    """The database and its -wal and -shm, as they are on disk."""
    files = (path, Path(f"{path}-wal"), Path(f"{path}-shm"))
    return b"".join(file.read_bytes() for file in files if file.exists())


def wrong(token: str) -> str:
    return ("A" if token[0] != "A" else "B") + token[1:]


# --- a write that fails fails alone ---------------------------------------------------------


def test_a_write_sqlite_refuses_fails_alone_and_the_rest_of_its_batch_commits(
        tmp_path: Path) -> None:
    """A database that is full for one large row (``PRAGMA max_page_count``): the batch
    it came in is retried write by write, so only that row's flush fails; health says
    "degraded" (the disk is full) until a batch commits again."""
    path = tmp_path / "core.sqlite"

    async def main() -> None:
        store = SQLiteStore(path)
        # the writer's own connection (not started yet): room for small rows only
        pages = store._db.execute("PRAGMA page_count").fetchone()[0]
        store._db.execute(f"PRAGMA max_page_count = {pages + 20}")
        # queued with no await between them: the writer (a task, started by the first
        # save, run at the first await) takes all four as one batch, whatever the timing
        store.save_session(SessionRecord("s1", hash_token("t"), "[]", "[]", 1.0))
        store.save_request(request("small-1", {"n": 1}))
        store.save_request(request("large", {"blob": "x" * 1_000_000}))
        store.save_request(request("small-2", {"n": 2}))
        await store.flush("s1", "small-1", "small-2")
        with pytest.raises(StoreError, match="full"):
            await store.flush("large")
        assert store.problem is not None and "full" in store.problem
        store.save_request(request("small-3", {"n": 3}))
        await store.flush("small-3")
        assert store.problem is None
        await store.close()

    run(main())
    assert [r.id for r in load_file(path).requests] == ["small-1", "small-2",
                                                                  "small-3"]


def test_a_read_only_store_fails_the_request_unsent_and_health_says_degraded(
        tmp_path: Path) -> None:
    """Through a real Core: while the database refuses writes, a control-API call gets
    the result STORE_FAILED (retryable) at once, the page is sent nothing, and health
    is "degraded" with the reason; once it takes writes again, all is as before."""

    async def main() -> None:
        async with running_core(config(store=str(tmp_path / "core.sqlite"))) as core:
            page = await echo_page().connect(core.ws_url)
            sid = page.session.session_id
            assert sid is not None
            store = core.registry.store
            await read_only(store, True)
            answer = (await core.tool_call(sid, "echo", {"n": 1})).json()
            error = answer["result"]["error"]
            assert (error["code"], error["retryable"]) == (STORE_FAILED, True)
            assert "readonly" in error["message"]
            assert answer["handledBy"] == "none"
            health = (await core.http.get("/pedelec/v1/health")).json()
            assert health["status"] == "degraded" and "readonly" in health["reason"]
            await read_only(store, False)
            answer = (await core.tool_call(sid, "echo", {"n": 2})).json()
            assert answer["result"] == {"n": 2}
            assert [f["args"] for f in page.frames("tool.request")] == [{"n": 2}]
            health = (await core.http.get("/pedelec/v1/health")).json()
            assert health["status"] == "ok" and "reason" not in health

    run(main())


def test_a_locked_store_fails_the_request_at_its_deadline_not_never(tmp_path: Path) -> None:
    """Another process holds the database's write lock: the call fails STORE_FAILED after
    --store-timeout (not a hang), and once the lock is gone the next call goes through."""
    path = tmp_path / "core.sqlite"

    async def main() -> None:
        async with running_core(config(store=str(path), store_timeout=0.5)) as core:
            page = await echo_page().connect(core.ws_url)
            sid = page.session.session_id
            assert sid is not None
            await core.registry.store.flush()
            holder = sqlite3.connect(path, isolation_level=None)
            holder.execute("BEGIN IMMEDIATE")
            started = time.monotonic()
            answer = (await core.tool_call(sid, "echo", {"n": 1})).json()
            waited = time.monotonic() - started
            error = answer["result"]["error"]
            assert error["code"] == STORE_FAILED and "--store-timeout" in error["message"]
            assert 0.4 < waited < 4, waited
            health = (await core.http.get("/pedelec/v1/health")).json()
            assert health["status"] == "degraded"
            holder.execute("ROLLBACK")
            holder.close()
            answer = (await core.tool_call(sid, "echo", {"n": 2})).json()
            assert answer["result"] == {"n": 2}
            assert [f["args"] for f in page.frames("tool.request")] == [{"n": 2}]

    run(main())


def test_if_the_writer_dies_every_waiter_fails_and_health_says_why(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug in the writer (injected): the flush waiting on it fails at once (not at its
    deadline), so does every later one, and health reports the writer stopped."""

    async def main() -> None:
        cfg = config(store=str(tmp_path / "core.sqlite"), store_timeout=30.0)
        async with running_core(cfg) as core:
            page = await echo_page().connect(core.ws_url)
            sid = page.session.session_id
            assert sid is not None
            store = core.registry.store

            async def broken(ops: object) -> None:
                raise RuntimeError("injected bug")

            monkeypatch.setattr(store, "_write", broken)
            for n in (1, 2):
                started = time.monotonic()
                answer = (await core.tool_call(sid, "echo", {"n": n})).json()
                assert time.monotonic() - started < 5
                error = answer["result"]["error"]
                assert error["code"] == STORE_FAILED and "writer stopped" in error["message"]
            assert page.frames("tool.request") == []
            health = (await core.http.get("/pedelec/v1/health")).json()
            assert health["status"] == "degraded"
            assert "writer stopped" in health["reason"] and "injected bug" in health["reason"]

    run(main())


# --- damaged rows are skipped at start --------------------------------------------------------

CORPUS = Path(__file__).resolve().parent.parent / "corpus" / "store-rows.jsonl"
# no constraints, so that NULLs and wrong types get in as they could in a damaged file
_LOOSE_SCHEMA = """
CREATE TABLE sessions (id, token_hash, tools, history, created_at);
CREATE TABLE requests (id, session_id, turn_id, step, idx, tool, args, deadline, result,
                       handled_by);
CREATE TABLE turns (id, session_id, text, status, final_text, error, tool_calls,
                    end_delivered, created_at, usage);
"""
GOOD_TOKEN = "good-token"
_HEX = re.compile(r"(?:[0-9a-f]{2})+")


def _base_row(table: str, index: int, owner: str) -> dict[str, Any]:
    """A good row of ``table``; ``owner``: the good session a request or turn is of."""
    if table == "sessions":
        return {"id": f"s-{index}", "token_hash": hash_token(GOOD_TOKEN),
                "tools": json.dumps([tool_meta("echo")]), "history": "[]", "created_at": 1.0}
    if table == "requests":
        return {"id": f"r-{index}", "session_id": owner, "turn_id": None, "step": 0,
                "idx": 0, "tool": "echo", "args": "{}", "deadline": 1e12, "result": None,
                "handled_by": None}
    return {"id": f"t-{index}", "session_id": owner, "text": "hi", "status": "completed",
            "final_text": "ok", "error": None, "tool_calls": "[]", "end_delivered": 0,
            "created_at": 1.0, "usage": "{}"}


def _insert(db: sqlite3.Connection, table: str, row: dict[str, Any]) -> int:
    marks, values = [], []
    for value in row.values():
        if isinstance(value, dict):  # {"utf8_hex": ...}: text of these bytes, as they are
            assert _HEX.fullmatch(value["utf8_hex"])
            marks.append(f"CAST(X'{value['utf8_hex']}' AS TEXT)")
        else:
            marks.append("?")
            values.append(value)
    cursor = db.execute(f"INSERT INTO {table} ({', '.join(row)}) VALUES ({', '.join(marks)})",
                        values)
    assert cursor.lastrowid is not None
    return cursor.lastrowid


def test_damaged_rows_are_skipped_with_a_warning_and_core_starts(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Every case of tests/corpus/store-rows.jsonl written straight into one store file,
    beside good rows: Core starts, lists (HTTP 200) and resumes exactly the good sessions,
    and warns once for each damaged row, naming it."""
    path = tmp_path / "core.sqlite"
    cases = [json.loads(line) for line in CORPUS.read_text().splitlines()]
    db = sqlite3.connect(path)
    db.executescript(_LOOSE_SCHEMA)
    good = ["good"]
    _insert(db, "sessions", _base_row("sessions", 0, "") | {"id": "good"})
    _insert(db, "requests", _base_row("requests", 0, "good") | {"args": '{"n": 1}'})
    expected: dict[tuple[str, int], str] = {}
    for index, case in enumerate(cases, start=1):
        table = case["input"]["table"]
        owner = f"owner-{index}"
        if table != "sessions":
            good.append(owner)
            _insert(db, "sessions", _base_row("sessions", index, "") | {"id": owner})
        row = _base_row(table, index, owner) | case["input"]["columns"]
        expected[(table, _insert(db, table, row))] = case["id"]
    db.commit()
    db.close()

    async def main() -> None:
        async with running_core(config(store=str(path))) as core:
            listed = await core.http.get("/pedelec/v1/sessions")
            assert listed.status_code == 200, listed.text
            assert sorted(s["sessionId"] for s in listed.json()["sessions"]) == sorted(good)
            assert len((await core.session_info("good"))["pendingToolRequests"]) == 1
            assert (await core.http.get("/pedelec/v1/health")).json()["status"] == "ok"
            page = await RawClient.open(core.ws_url)
            welcome = await page.hello([tool_meta("echo")], sessionId="good",
                                       resumeToken=GOOD_TOKEN)
            assert (welcome["type"], welcome["resumed"]) == ("welcome", True)
            assert welcome["resumeToken"] == GOOD_TOKEN
            assert (await page.recv())["args"] == {"n": 1}  # the restored request
            await page.close()

    with caplog.at_level(logging.WARNING, logger="pedelec.core"):
        run(main())
    skipped = [re.search(r"table=(\w+) rowid=(\d+)", r.getMessage())
               for r in caplog.records if "store.row_skipped" in r.getMessage()]
    found = {(m.group(1), int(m.group(2))) for m in skipped if m is not None}
    missed = sorted(case for key, case in expected.items() if key not in found)
    assert not missed, f"loaded, not skipped: {missed}"
    assert len(skipped) == len(expected)


# --- files and tokens ---------------------------------------------------------------------


def test_store_files_are_created_private_and_old_ones_tightened(tmp_path: Path) -> None:
    path = tmp_path / "core.sqlite"
    old_path = tmp_path / "old.sqlite"
    sqlite3.connect(old_path).close()
    old_path.chmod(0o644)  # as an older Core left it
    umask = os.umask(0o022)
    try:
        async def main() -> None:
            for file in (path, old_path):
                store = SQLiteStore(file)
                store.save_session(SessionRecord("s1", hash_token("t"), "[]", "[]", 1.0))
                await store.flush()
                for suffix in ("", "-wal", "-shm"):
                    mode = Path(f"{file}{suffix}").stat().st_mode & 0o777
                    assert mode == 0o600, (file.name, suffix, oct(mode))
                await store.close()

        run(main())
    finally:
        os.umask(umask)


def test_resume_tokens_are_stored_as_hashes_and_still_resume_after_a_restart(
        tmp_path: Path) -> None:
    path = tmp_path / "core.sqlite"
    cfg = config(store=str(path))

    async def main() -> None:
        async with running_core(cfg) as core:
            page = await RawClient.open(core.ws_url)
            welcome = await page.hello([tool_meta("echo")])
            sid, token = welcome["sessionId"], welcome["resumeToken"]
            await core.registry.store.flush()
            on_disk = store_bytes(path)
            assert hash_token(token).encode() in on_disk  # the row is there...
            assert token.encode() not in on_disk  # ...and the token is not
            await page.close()
        async with running_core(config(store=str(path))) as core:  # Core restarted
            await refused_then_resumed(core.ws_url, sid, token)

    run(main())


def test_a_store_with_tokens_in_clear_is_migrated_to_hashes(tmp_path: Path) -> None:
    """A database written by the old code: Core hashes the tokens at start, none is left
    in the file (nor in its -wal), and the page resumes with its token."""
    path = tmp_path / "old.sqlite"
    token = secrets.token_urlsafe(32)
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE sessions (id TEXT PRIMARY KEY, resume_token TEXT NOT NULL,"
               " tools TEXT NOT NULL, history TEXT NOT NULL, created_at REAL NOT NULL)")
    db.execute("INSERT INTO sessions VALUES ('s-old', ?, '[]', '[]', 1)", (token,))
    # and a damaged one: a token that is not UTF-8 (skipped, not an exit at start)
    db.execute("INSERT INTO sessions VALUES ('s-bad', CAST(X'FF41' AS TEXT), '[]', '[]', 2)")
    db.commit()
    db.close()
    assert token.encode() in store_bytes(path)

    async def main() -> None:
        async with running_core(config(store=str(path))) as core:
            assert token.encode() not in store_bytes(path)
            assert list(core.registry.sessions) == ["s-old"]
            await refused_then_resumed(core.ws_url, "s-old", token)
        assert token.encode() not in store_bytes(path)

    run(main())


async def refused_then_resumed(url: str, sid: str, token: str) -> None:
    thief = await RawClient.open(url)
    refused = await thief.hello([tool_meta("echo")], sessionId=sid, resumeToken=wrong(token))
    assert refused["code"] == "RESUME_REFUSED"
    await thief.close()
    page = await RawClient.open(url)
    welcome = await page.hello([tool_meta("echo")], sessionId=sid, resumeToken=token)
    assert (welcome["type"], welcome["resumed"], welcome["resumeToken"]) == (
        "welcome", True, token)
    await page.close()


# --- SIGTERM stops Core whatever it is doing --------------------------------------------------


async def until_pending(http: httpx.AsyncClient, session_id: str, count: int) -> None:
    """Until Core lists ``count`` requests pending in the session (each is listed once it
    is opened, before the store has taken it and it is sent)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while True:
        info = (await http.get(f"/pedelec/v1/sessions/{session_id}")).json()
        if len(info["pendingToolRequests"]) >= count:
            return
        assert loop.time() < deadline, f"Core never had {count} requests pending: {info}"
        await asyncio.sleep(0.02)  # a poll: each look is the same however late


@pytest.mark.parametrize("state", ["idle", "busy", "store_locked"])
def test_sigterm_stops_core_within_5_seconds(tmp_path: Path, state: str) -> None:
    """A real Core process (core_process.py: a turn of parallel calls a and b). busy: a
    turn running with its two requests pending (the page never answers) and a control-API
    call waiting; store_locked: the same while another process holds the store's write
    lock, so every flush is stuck."""
    db = tmp_path / "core.sqlite"
    port = free_port()

    async def main() -> float:
        async with core_process(db, port) as process:
            base = f"http://127.0.0.1:{port}"
            page = await RawClient.open(f"ws://127.0.0.1:{port}/pedelec/v1/bridge")
            welcome = await page.hello([tool_meta(name) for name in "abc"])
            holder = sqlite3.connect(db, isolation_level=None, timeout=WAIT)
            waiting: asyncio.Task[httpx.Response] | None = None
            async with httpx.AsyncClient(base_url=base, timeout=WAIT,
                                         headers={"Authorization": f"Bearer {TOKEN}"}) as http:
                if state != "idle":
                    if state == "store_locked":
                        holder.execute("BEGIN IMMEDIATE")
                    await page.send({"type": "turn.start", "turnId": "t1", "text": "go"})
                    waiting = asyncio.create_task(http.post(
                        f"/pedelec/v1/sessions/{welcome['sessionId']}/tool-calls",
                        json={"tool": "c", "args": {}}))
                    if state == "busy":
                        kinds = [(await page.recv())["type"] for _ in range(3)]
                        assert kinds.count("tool.request") == 3, kinds
                    else:  # a, b and c opened, their flushes stuck on the lock
                        await until_pending(http, welcome["sessionId"], 3)
                started = time.monotonic()
                process.send_signal(signal.SIGTERM)
                await asyncio.to_thread(process.wait, 3 * WAIT)
                elapsed = time.monotonic() - started
                if waiting is not None:
                    await asyncio.gather(waiting, return_exceptions=True)
            holder.close()
            await page.ws.close()
            return elapsed

    elapsed = run(main())
    print(f"SIGTERM to exit ({state}): {elapsed:.2f} s")
    assert elapsed < 5, elapsed


def test_the_issue_s_chat_line_costs_no_other_session_its_store(tmp_path: Path) -> None:
    """The line that stopped every session of a Core with --store (issue 10): the offline
    agent decodes the escape into a lone surrogate. Its turn ends (however it is refused),
    another session's call still goes through, the writer lives and health is ok."""

    def counter_page() -> Page:
        session = Session()
        session.add_tool(define_tool(
            name="update_counter", description="Add delta to the counter.",
            args_schema={"type": "object", "properties": {"delta": {}}},
            handler=lambda a: {"value": 1}))
        return Page(session)

    async def main() -> None:
        cfg = config(store=str(tmp_path / "core.sqlite"), agent_factory=None,
                     agent="offline")
        async with running_core(cfg) as core:
            attacker = await counter_page().connect(core.ws_url)
            other = await echo_page().connect(core.ws_url)
            reply = await asyncio.wait_for(
                attacker.session.send_text('/call update_counter {"delta": "\\ud800"}'), WAIT)
            assert isinstance(reply, str)
            sid = other.session.session_id
            assert sid is not None
            answer = (await core.tool_call(sid, "echo", {"n": 1})).json()
            assert answer["result"] == {"n": 1}
            assert core.registry.store.problem is None
            assert (await core.http.get("/pedelec/v1/health")).json()["status"] == "ok"

    run(main())


def test_writes_queued_behind_a_stuck_store_are_bounded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While the writer is stuck (another process holds the lock), queued text is capped:
    a write past the cap fails at once instead of being held in memory."""
    monkeypatch.setattr(writer, "MAX_QUEUED_CHARS", 1_000_000)
    path = tmp_path / "core.sqlite"

    async def main() -> None:
        store = SQLiteStore(path)
        store.save_session(SessionRecord("s1", hash_token("t"), "[]", "[]", 1.0))
        await store.flush("s1")
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        store.save_request(request("first", {"blob": "x" * 600_000}))
        store.save_request(request("second", {"blob": "y" * 600_000}))
        holder.execute("ROLLBACK")
        holder.close()
        await store.flush("first")
        with pytest.raises(StoreError, match="characters behind"):
            await store.flush("second")
        store.save_request(request("third", {"blob": "z" * 600_000}))  # room again
        await store.flush("third")
        await store.close()

    run(main())
    assert [r.id for r in load_file(path).requests] == ["first", "third"]
