"""Exactly once for control-API callers: ``Idempotency-Key``, ``GET .../tool-calls/{id}``,
the results Core keeps (and for how long), and what a caller's hang-up does.

The crash tests run Core as a process on SQLite and kill it with SIGKILL mid-call; the
page is a real :class:`pedelec_pyodide.Session` over a websockets connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import signal
import sqlite3
import threading
import tracemalloc
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from core_process import RETRY, until_logged
from corekit import (
    TOKEN,
    WAIT,
    Core,
    GatedTools,
    Page,
    PlanAgent,
    RawClient,
    config,
    core_process,
    fake_clock,
    hang_up,
    http_handlers_done,
    run,
    running_core,
    tool_meta,
    until,
)
from storekit import free_port, load_file

from pedelec_pyodide import Session, define_tool
from pedelec_pyodide.core.cluster.relay import keyed_call, prepare_call
from pedelec_pyodide.core.server import create_app
from pedelec_pyodide.core.sessions.idempotency import IDEMPOTENCY_KEY_REUSED, key_hash
from pedelec_pyodide.core.store import (
    RECENT_TURNS,
    IdempotencyRecord,
    JsonText,
    RequestRecord,
    SessionRecord,
    SQLiteStore,
    hash_token,
)

KEY = "Idempotency-Key"


def calls_path(session_id: str) -> str:
    return f"/pedelec/v1/sessions/{session_id}/tool-calls"


def turns_path(session_id: str) -> str:
    return f"/pedelec/v1/sessions/{session_id}/turns"


async def post(http: httpx.AsyncClient, path: str, body: dict[str, Any],
               key: str | None = None) -> httpx.Response:
    headers = {} if key is None else {KEY: key}
    return await http.post(path, json=body, headers=headers)


async def gated_page(core: Core, *names: str) -> tuple[GatedTools, Page, str]:
    """A page whose tools ``names`` wait for their gates, connected: its tools, the
    page and its session id."""
    gated = GatedTools(*names)
    page = await Page(Session(gated.tools())).connect(core.ws_url)
    sid = page.session.session_id
    assert sid is not None
    return gated, page, sid


# --- the hang-up ---------------------------------------------------------------------------


def test_a_caller_that_hangs_up_cancels_its_request() -> None:
    """Without a key, nobody can fetch the result any more: the page is told at once."""

    async def main() -> None:
        async with running_core() as core:
            gated, page, sid = await gated_page(core, "slow")
            await hang_up(core.port, calls_path(sid), {"tool": "slow", "args": {}}, {},
                          lambda: asyncio.wait_for(gated.started["slow"].wait(), WAIT))
            await page.wait_frame("tool.cancel")
            (cancel,) = page.frames("tool.cancel")
            (sent,) = page.frames("tool.request")
            assert cancel["toolRequestId"] == sent["toolRequestId"]
            assert "hung up" in cancel["reason"]
            state = (await core.http.get(f"{calls_path(sid)}/{sent['toolRequestId']}")).json()
            assert state["state"] == "done"
            assert state["result"]["error"]["code"] == "TOOL_CANCELLED"
            assert core.registry.get(sid).state == "idle"

    run(main())


def test_a_caller_with_a_key_that_hangs_up_leaves_its_request_running() -> None:
    async def main() -> None:
        async with running_core() as core:
            gated, page, sid = await gated_page(core, "slow")
            baseline = len(core.server.server_state.tasks)
            body = {"tool": "slow", "args": {"n": 1}}
            await hang_up(core.port, calls_path(sid), body, {KEY: "k-hang"},
                          lambda: asyncio.wait_for(gated.started["slow"].wait(), WAIT))
            await http_handlers_done(core, baseline)
            (sent,) = page.frames("tool.request")
            rid = sent["toolRequestId"]
            state = (await core.http.get(f"{calls_path(sid)}/{rid}")).json()
            assert state == {"toolRequestId": rid, "tool": "slow", "state": "pending",
                             "turnId": None}
            retry = asyncio.create_task(post(core.http, calls_path(sid), body, "k-hang"))
            gated.gates["slow"].set()
            answer = (await asyncio.wait_for(retry, WAIT)).json()
            assert answer == {"toolRequestId": rid, "handledBy": "inline",
                              "result": {"tool": "slow", "args": {"n": 1}}}
            assert page.frames("tool.cancel") == []
            assert gated.runs == Counter(slow=1)

    run(main())


async def _plain_core() -> Core:
    """Core under plain uvicorn (h11, its own WebSocket protocol): no HangUp in the scope,
    no frame guard: the hang-up is heard through receive(), frames go out by the task."""
    cfg = config()
    app = create_app(cfg)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, http="h11",
                                           log_level="warning"))
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    task = asyncio.create_task(server.serve())
    await until(lambda: server.started or task.done(), "uvicorn to start")
    if task.done():
        task.result()
    port = server.servers[0].sockets[0].getsockname()[1]
    http = httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=WAIT,
                             headers={"Authorization": f"Bearer {cfg.admin_token}"})
    return Core(server, task, port, http, app)


@pytest.mark.parametrize("keyed", [False, True])
def test_a_hang_up_under_another_server_is_heard_as_under_cores_own(keyed: bool) -> None:
    async def main() -> None:
        core = await _plain_core()
        page = None
        try:
            gated = GatedTools("slow")
            page = await Page(Session(gated.tools())).connect(core.ws_url)
            sid = page.session.session_id
            path = f"/pedelec/v1/sessions/{sid}/tool-calls"
            headers = {"Idempotency-Key": "k-plain"} if keyed else {}
            await hang_up(core.port, path, {"tool": "slow", "args": {}}, headers,
                          lambda: asyncio.wait_for(gated.started["slow"].wait(), WAIT))
            (sent,) = page.frames("tool.request")
            rid = sent["toolRequestId"]
            if not keyed:  # cancelled: the page is told
                await page.wait_frame("tool.cancel")
                (cancel,) = page.frames("tool.cancel")
                assert cancel["toolRequestId"] == rid and "hung up" in cancel["reason"]
                return
            retry = asyncio.create_task(core.http.post(
                path, json={"tool": "slow", "args": {}}, headers=headers))
            gated.gates["slow"].set()
            answer = (await asyncio.wait_for(retry, WAIT)).json()
            assert answer["toolRequestId"] == rid and not page.frames("tool.cancel")
            assert len(page.frames("tool.request")) == 1  # run once
        finally:
            if page is not None:
                await page.drop()
            await core.stop()

    run(main())


# --- the key: retries, reuse, validation ------------------------------------------------------


@contextlib.contextmanager
def retries_claimed() -> Iterator[threading.Event]:
    """Set once Core has taken a retry as one of a key it knows (its ``control.retry``
    log event): from then on the retry waits for the first run, whatever the timing."""
    claimed = threading.Event()

    class Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("event=control.retry "):
                claimed.set()

    logger = logging.getLogger("pedelec.core")
    seen, level = Seen(), logger.level
    logger.addHandler(seen)
    logger.setLevel(logging.INFO)
    try:
        yield claimed
    finally:
        logger.removeHandler(seen)
        logger.setLevel(level)


async def until_set(event: threading.Event) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while not event.is_set():  # Core runs in this loop: it sets the event between polls
        assert loop.time() < deadline, "Core never took the retry"
        await asyncio.sleep(0.005)


def test_a_retry_with_the_key_gets_the_first_result_and_never_runs_twice() -> None:
    async def main() -> None:
        async with running_core() as core:
            gated, page, sid = await gated_page(core, "slow")
            body = {"tool": "slow", "args": {"a": 1, "b": [1, 2]}, "timeoutMs": 9000}
            first = asyncio.create_task(post(core.http, calls_path(sid), body, "k1"))
            await asyncio.wait_for(gated.started["slow"].wait(), WAIT)
            # the same request while the first waits, its JSON written another way
            same = '{"timeoutMs": 9000, "args": {"b": [1, 2], "a": 1}, "tool": "slow"}'
            with retries_claimed() as claimed:
                second = asyncio.create_task(core.http.post(
                    calls_path(sid), content=same, headers={KEY: "k1"}))
                await until_set(claimed)
            assert not second.done()  # Core has it, and it waits for the first
            gated.gates["slow"].set()
            one, two = (await asyncio.wait_for(asyncio.gather(first, second), WAIT))
            assert one.status_code == two.status_code == 200
            assert one.json() == two.json()
            late = await post(core.http, calls_path(sid), body, "k1")  # after the result
            assert late.json() == one.json()
            assert gated.runs == Counter(slow=1)
            assert len(page.frames("tool.request")) == 1

            # the same key for another request: refused, nothing sent
            for other, path in (({**body, "args": {"a": 2}}, calls_path(sid)),
                                ({**body, "timeoutMs": 100}, calls_path(sid)),
                                ({"text": "hi"}, turns_path(sid))):
                refused = await post(core.http, path, other, "k1")
                assert refused.status_code == 422, refused.text
                error = refused.json()["error"]
                assert error["code"] == "IDEMPOTENCY_KEY_REUSED"
                assert KEY in error["message"]
            # a new key is a new request; a key is scoped to its session
            assert (await post(core.http, calls_path(sid), body, "k2")).json()[
                "toolRequestId"] != one.json()["toolRequestId"]
            other_page = await Page(Session(gated.tools())).connect(core.ws_url)
            other_sid = other_page.session.session_id
            assert other_sid is not None
            elsewhere = await post(core.http, calls_path(other_sid), body, "k1")
            assert elsewhere.status_code == 200
            assert gated.runs == Counter(slow=3)

    run(main())


@pytest.mark.parametrize(("value", "problem"), [
    (b"", "1 to 128 characters"),
    (b"k" * 129, "1 to 128 characters"),
    ("é".encode() * 129, "1 to 128 characters"),
    (b"\xff\xfe", "UTF-8"),
    (b"\xed\xa0\x80", "UTF-8"),  # an encoded lone surrogate is not UTF-8
    (None, "once"),
])
def test_a_bad_key_is_refused_naming_the_header(value: bytes | None, problem: str) -> None:
    async def main() -> None:
        async with running_core() as core:
            gated = GatedTools("t")
            gated.gates["t"].set()
            page = await Page(Session(gated.tools())).connect(core.ws_url)
            sid = page.session.session_id
            assert sid is not None
            headers: list[tuple[bytes, bytes]] = (
                [(b"Idempotency-Key", b"a"), (b"Idempotency-Key", b"a")] if value is None
                else [(b"Idempotency-Key", value)])
            for path, body in ((calls_path(sid), {"tool": "t"}),
                               (turns_path(sid), {"text": "hi"})):
                refused = await core.http.post(path, json=body, headers=headers)
                assert refused.status_code == 400, refused.text
                error = refused.json()["error"]
                assert error["code"] == "BAD_REQUEST"
                assert KEY in error["message"] and problem in error["message"]
            assert page.frames("tool.request") == [] and gated.runs == Counter()
            # the longest key, and any Unicode text, is a key
            for key in ("k" * 128, "é" * 128, "clé ✓ 鍵"):
                done = await core.http.post(calls_path(sid), json={"tool": "t"},
                                            headers=[(b"Idempotency-Key", key.encode())])
                assert done.status_code == 200, done.text
            assert gated.runs == Counter(t=3)

    run(main())


def test_a_retried_turn_returns_that_turn_waiting_for_it() -> None:
    async def main() -> None:
        cfg = config(agent_factory=lambda: PlanAgent([[("slow", {"n": 1})]]))
        async with running_core(cfg) as core:
            gated, page, sid = await gated_page(core, "slow")
            first = asyncio.create_task(post(core.http, turns_path(sid), {"text": "go"}, "t1"))
            await asyncio.wait_for(gated.started["slow"].wait(), WAIT)
            # a retry waits for the running turn, not TURN_BUSY
            with retries_claimed() as claimed:
                second = asyncio.create_task(
                    post(core.http, turns_path(sid), {"text": "go"}, "t1"))
                await until_set(claimed)
            assert not second.done()  # Core has it, and it waits for the running turn
            busy = await post(core.http, turns_path(sid), {"text": "go"}, "t2")
            assert busy.status_code == 409
            gated.gates["slow"].set()
            one, two = await asyncio.wait_for(asyncio.gather(first, second), WAIT)
            assert one.json() == two.json() and one.json()["status"] == "completed"
            late = await post(core.http, turns_path(sid), {"text": "go"}, "t1")
            assert late.json() == one.json()
            assert gated.runs == Counter(slow=1)
            assert len(page.frames("turn.end")) == 1

    run(main())


# --- GET .../tool-calls/{id} and retention -----------------------------------------------------


def test_a_kept_result_keeps_only_the_result() -> None:
    """Found: a finished call's args (up to a frame) were kept with its result, as text,
    for a day, though only its result is ever given again: a session's kept results took
    up to twice the memory their bound (``--kept-results`` results of up to a frame, in
    each of two lots) says."""
    pad = "x" * (256 * 1024)
    session = Session()
    session.add_tool(define_tool(name="size", description="The length of pad.",
                                 args_schema={"type": "object"},
                                 handler=lambda args: {"chars": len(args["pad"])}))

    async def main() -> int:
        async with running_core() as core:
            page = await Page(session).connect(core.ws_url)
            sid = page.session.session_id or ""
            assert (await core.tool_call(sid, "size", {"pad": pad})).status_code == 200
            gc.collect()
            tracemalloc.start()
            try:
                before = tracemalloc.get_traced_memory()[0]
                done = []
                for _ in range(16):
                    answer = (await core.tool_call(sid, "size", {"pad": pad})).json()
                    assert answer["result"] == {"chars": len(pad)}
                    done.append(answer["toolRequestId"])
                page.frames_in.clear()  # (this test page's own records of them)
                page.events.clear()
                gc.collect()
                grown = tracemalloc.get_traced_memory()[0] - before
            finally:
                tracemalloc.stop()
            for request_id in done:  # each result is kept all the same
                kept = (await core.http.get(f"{calls_path(sid)}/{request_id}")).json()
                assert kept["result"] == {"chars": len(pad)}
            return grown

    grown = run(main())
    # the last frame this test's page read is still held, three ways (its bytes, its text,
    # decoded); sixteen calls' args kept would be over 16 times
    assert grown < 4 * len(pad), grown


def test_a_long_result_is_answered_and_given_again_as_the_text_core_keeps(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A long result, answered and then read again with ``GET .../tool-calls/{id}``, is
    written out as the JSON text Core keeps: it was decoded on the event loop for each GET
    (and written out again), ~0.1-0.5 s of 1 MiB of small arrays that held every other
    client; a caller could ask for it again and again."""
    rows = [[n] for n in range(10_000)]
    session = Session()
    session.add_tool(define_tool(name="rows", description="Many rows.",
                                 args_schema={"type": "object"}, handler=lambda: rows))

    def never(kept: JsonText) -> Any:
        raise AssertionError(f"decoded: {kept!r}")

    async def main() -> None:
        async with running_core() as core:
            page = await Page(session).connect(core.ws_url)
            sid = page.session.session_id or ""
            monkeypatch.setattr(JsonText, "value", never)
            answer = (await core.tool_call(sid, "rows", {})).json()
            assert answer["result"] == rows
            kept = await core.http.get(f"{calls_path(sid)}/{answer['toolRequestId']}")
            assert kept.status_code == 200 and kept.json()["result"] == rows
            streamed = await core.http.post(
                calls_path(sid), json={"tool": "rows", "args": {}},
                headers={"Accept": "text/event-stream"})
            assert streamed.status_code == 200
            assert json.loads(streamed.text.split("event: result\ndata: ")[1])["result"] == rows

    run(main())


def test_get_tool_call_gives_state_then_result_and_results_are_kept_within_bounds(
        tmp_path: Path) -> None:
    async def main() -> None:
        db = tmp_path / "core.sqlite"
        async with running_core(config(store=str(db), kept_results=2)) as core:
            gated, page, sid = await gated_page(core, "slow")
            call = asyncio.create_task(post(core.http, calls_path(sid), {"tool": "slow"}))
            await page.wait_frame("tool.request")
            rid = page.frames("tool.request")[0]["toolRequestId"]
            pending = await core.http.get(f"{calls_path(sid)}/{rid}")
            assert pending.json() == {"toolRequestId": rid, "tool": "slow",
                                      "state": "pending", "turnId": None}
            gated.gates["slow"].set()
            assert (await asyncio.wait_for(call, WAIT)).json()["toolRequestId"] == rid
            done = (await core.http.get(f"{calls_path(sid)}/{rid}")).json()
            assert done == {"toolRequestId": rid, "tool": "slow", "state": "done",
                            "turnId": None, "handledBy": "inline",
                            "result": {"tool": "slow", "args": {}}}
            for missing in ("nope", rid * 20):
                gone = await core.http.get(f"{calls_path(sid)}/{missing}")
                assert gone.status_code == 404
                assert gone.json()["error"]["code"] == "TOOL_REQUEST_NOT_FOUND"
                assert len(gone.json()["error"]["message"]) < 200
            # another session does not see it
            other = await Page(Session(gated.tools())).connect(core.ws_url)
            assert (await core.http.get(
                f"{calls_path(other.session.session_id or '')}/{rid}")).status_code == 404

            # two more results without a key: only the last two of those are kept, in
            # memory and in the store
            keyed = (await post(core.http, calls_path(sid), {"tool": "slow"}, "kx")).json()
            for _ in range(2):
                await post(core.http, calls_path(sid), {"tool": "slow"})
            assert (await core.http.get(f"{calls_path(sid)}/{rid}")).status_code == 404
            # ... and they never push out a result a caller's key started
            assert (await post(core.http, calls_path(sid), {"tool": "slow"}, "kx")).json() \
                == keyed
            await core.registry.store.flush()
            with contextlib.closing(sqlite3.connect(db)) as reader:
                rows = reader.execute("SELECT count(*) FROM requests").fetchone()[0]
                keys = reader.execute("SELECT count(*) FROM idempotency_keys").fetchone()[0]
            assert (rows, keys) == (3, 1)
            for key in ("ky", "kz"):  # two more keyed ones: the first keyed one goes
                await post(core.http, calls_path(sid), {"tool": "slow"}, key)
            assert (await core.http.get(
                f"{calls_path(sid)}/{keyed['toolRequestId']}")).status_code == 404
            await core.registry.store.flush()
            with contextlib.closing(sqlite3.connect(db)) as reader:
                rows = reader.execute("SELECT count(*) FROM requests").fetchone()[0]
                keys = reader.execute("SELECT count(*) FROM idempotency_keys").fetchone()[0]
            assert (rows, keys) == (4, 2)
            # the key is unknown again: a new run
            again = (await post(core.http, calls_path(sid), {"tool": "slow"}, "kx")).json()
            assert again["toolRequestId"] != keyed["toolRequestId"]

    run(main())


def test_results_and_keys_go_when_their_retention_ends() -> None:
    """Aged by moving Core's clock on a day (no sleeping on a noisy machine)."""
    day = 86400.0

    async def main() -> None:
        clock = fake_clock()
        cfg = config(result_retention=day, agent_factory=lambda: PlanAgent([]), clock=clock)
        async with running_core(cfg) as core:
            gated = GatedTools("t")
            gated.gates["t"].set()
            page = await Page(Session(gated.tools())).connect(core.ws_url)
            sid = page.session.session_id
            assert sid is not None
            session = core.registry.get(sid)
            first = (await post(core.http, calls_path(sid), {"tool": "t"}, "k")).json()
            rid = first["toolRequestId"]
            turn = (await post(core.http, turns_path(sid), {"text": "x"}, "k-turn")).json()
            assert (await core.http.get(f"{calls_path(sid)}/{rid}")).status_code == 200
            await clock.advance(day - 60)  # still within a day
            assert (await post(core.http, calls_path(sid), {"tool": "t"}, "k")).json() == first
            assert (await post(core.http, turns_path(sid), {"text": "x"}, "k-turn")).json() == turn
            await clock.advance(120)  # now past it
            assert (await core.http.get(f"{calls_path(sid)}/{rid}")).status_code == 404
            assert not session.callers.keys and not session.callers.results
            assert not session.callers.turns
            again = (await post(core.http, calls_path(sid), {"tool": "t"}, "k")).json()
            assert again["toolRequestId"] != rid
            new_turn = (await post(core.http, turns_path(sid), {"text": "x"}, "k-turn")).json()
            assert new_turn["turnId"] != turn["turnId"]
            assert gated.runs == Counter(t=2)

    run(main())


def test_a_page_cannot_take_over_the_id_of_a_callers_keyed_turn() -> None:
    """Turn ids are the page's to choose, and a turn's row is keyed by (session, id): a
    page that reused the id of a caller's keyed turn replaced its record, and after a
    restart the caller's retry got the page's turn."""
    async def main() -> None:
        async with running_core() as core:
            page = await RawClient.open(core.ws_url)
            sid = (await page.hello())["sessionId"]
            turn = (await post(core.http, turns_path(sid), {"text": "mine"}, "k")).json()
            frame = await page.recv()
            while frame["type"] != "turn.end":
                frame = await page.recv()
            for n in range(RECENT_TURNS):  # until Core no longer lists it among recent ends
                await page.send({"type": "turn.start", "turnId": f"p{n}", "text": "x"})
                while (await page.recv())["type"] != "turn.end":
                    pass
            await page.send({"type": "turn.start", "turnId": turn["turnId"], "text": "yours"})
            refused = await page.recv()
            assert refused["type"] == "error", refused
            assert (refused["type"], refused["code"], refused["turnId"]) == (
                "error", "TURN_ID_TAKEN", turn["turnId"])
            assert (await post(core.http, turns_path(sid), {"text": "mine"}, "k")).json() == turn
            await page.close()

    run(main())


def test_turns_kept_by_key_are_bounded_per_session() -> None:
    async def main() -> None:
        async with running_core(config(kept_results=2)) as core:
            page = await Page(Session()).connect(core.ws_url)
            sid = page.session.session_id
            assert sid is not None
            turns = [(await post(core.http, turns_path(sid), {"text": "x"}, f"k{n}")).json()
                     for n in range(3)]
            session = core.registry.get(sid)
            assert list(session.callers.turns) == [t["turnId"] for t in turns[1:]]
            assert len(session.callers.keys) == 2
            kept = await post(core.http, turns_path(sid), {"text": "x"}, "k2")
            assert kept.json() == turns[2]
            forgotten = await post(core.http, turns_path(sid), {"text": "x"}, "k0")
            assert forgotten.json()["turnId"] not in {t["turnId"] for t in turns}

    run(main())


# --- the store -------------------------------------------------------------------------------


def test_keys_are_stored_hashed_and_go_with_their_session(tmp_path: Path) -> None:
    path = tmp_path / "core.sqlite"
    hashed = key_hash("s1", "my-secret-key")

    async def write() -> None:
        store = SQLiteStore(path)
        for sid in ("s1", "s2"):  # rows of an unknown session are skipped at load
            store.save_session(SessionRecord(sid, hash_token("t"), "[]", "[]", 1.0))
        store.save_request(RequestRecord("r1", "s1", None, 0, 0, "t", {}, 9e9, {"v": 1},
                                         "named", 5.0))
        store.save_key(IdempotencyRecord(hashed, "s1", "tool-call", "f" * 64, "r1", 4.0))
        store.save_key(IdempotencyRecord(key_hash("s2", "x"), "s2", "turn", "f" * 64, "t9",
                                         4.0))
        await store.close()

    asyncio.run(write())
    assert b"my-secret-key" not in path.read_bytes()
    snapshot = load_file(path)
    assert {(k.key_hash, k.target_id) for k in snapshot.keys} == {
        (hashed, "r1"), (key_hash("s2", "x"), "t9")}
    (request,) = snapshot.requests
    assert (request.result, request.handled_by, request.finished_at) == ({"v": 1}, "named", 5.0)

    async def delete() -> None:
        store = SQLiteStore(path)
        store.delete_session("s1")
        await store.close()

    asyncio.run(delete())
    snapshot = load_file(path)
    assert [k.session_id for k in snapshot.keys] == ["s2"] and snapshot.requests == []


def test_a_database_from_before_kept_results_gains_the_column(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("CREATE TABLE requests (id TEXT PRIMARY KEY, session_id TEXT NOT NULL,"
                   " turn_id TEXT, step INTEGER NOT NULL, idx INTEGER NOT NULL, tool TEXT NOT"
                   " NULL, args TEXT NOT NULL, deadline REAL NOT NULL, result TEXT,"
                   " handled_by TEXT)")
        db.execute("INSERT INTO requests VALUES ('r0', 's0', NULL, 0, 0, 't', '{}', 1, NULL,"
                   " NULL)")
        db.commit()

    async def write() -> None:
        store = SQLiteStore(path)
        store.save_session(SessionRecord("s0", hash_token("t"), "[]", "[]", 1.0))
        store.save_request(RequestRecord("r1", "s0", None, 0, 0, "t", {}, 2.0, 7, "named",
                                         3.0))
        await store.close()

    asyncio.run(write())
    requests = load_file(path).requests
    assert [(r.id, r.finished_at) for r in requests] == [("r0", None), ("r1", 3.0)]


# --- kill -9 of Core mid-call ------------------------------------------------------------------


def test_core_killed_mid_call_then_a_retry_with_the_key_gets_the_one_result(
        tmp_path: Path) -> None:
    """kill -9 while the page runs the call; after the restart the page resumes and
    answers the re-sent request (same id, not run again), the caller's retry with its key
    gets that result; after another kill -9 the result is still there, from the store."""

    async def main() -> None:
        db = tmp_path / "core.sqlite"
        port = free_port()
        url = f"ws://127.0.0.1:{port}/pedelec/v1/bridge"
        gated = GatedTools("charge")
        page = Page(Session(gated.tools()))
        body = {"tool": "charge", "args": {"cents": 500}}
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=WAIT,
                                     headers=headers) as http:
            async with core_process(db, port) as process:
                await page.connect(url)
                sid = page.session.session_id
                assert sid is not None
                first = asyncio.create_task(post(http, calls_path(sid), body, "pay-1"))
                await asyncio.wait_for(gated.started["charge"].wait(), WAIT)
                process.send_signal(signal.SIGKILL)
                with pytest.raises(httpx.HTTPError):
                    await asyncio.wait_for(first, WAIT)
            (sent,) = page.frames("tool.request")
            rid = sent["toolRequestId"]
            async with core_process(db, port) as process:
                await page.connect(url)
                assert page.frames("welcome")[-1]["resumed"] is True
                retry = asyncio.create_task(post(http, calls_path(sid), body, "pay-1"))
                await page.wait_frame("tool.request", 2)  # the re-send, same id
                assert {f["toolRequestId"] for f in page.frames("tool.request")} == {rid}
                gated.gates["charge"].set()
                answer = (await asyncio.wait_for(retry, WAIT)).json()
                assert answer == {"toolRequestId": rid, "handledBy": "inline",
                                  "result": {"tool": "charge", "args": {"cents": 500}}}
                process.send_signal(signal.SIGKILL)
            async with core_process(db, port):
                again = await post(http, calls_path(sid), body, "pay-1")
                assert again.json() == answer
                state = (await http.get(f"{calls_path(sid)}/{rid}")).json()
                assert (state["state"], state["result"]) == ("done", answer["result"])
                reused = await post(http, calls_path(sid), {**body, "args": {}}, "pay-1")
                assert reused.status_code == 422
            assert gated.runs == Counter(charge=1)
            assert page.frames("tool.cancel") == []
            for file in tmp_path.iterdir():
                assert b"pay-1" not in file.read_bytes()
            await page.drop()

    run(main(), timeout=90)


def test_core_killed_mid_turn_then_a_retry_with_the_key_gets_that_turn(
        tmp_path: Path) -> None:
    """The same for a turn (core_process.py's plan: a and b, then c): the retry waits
    for the resumed turn and gets its final record; every handler ran once."""

    async def main() -> None:
        db = tmp_path / "core.sqlite"
        port = free_port()
        url = f"ws://127.0.0.1:{port}/pedelec/v1/bridge"
        gated = GatedTools("a", "b", "c")
        gated.gates["a"].set()
        gated.gates["c"].set()
        page = Page(Session(gated.tools()))
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=WAIT,
                                     headers=headers) as http:
            async with core_process(db, port) as process:
                await page.connect(url)
                sid = page.session.session_id
                assert sid is not None
                first = asyncio.create_task(post(http, turns_path(sid), {"text": "go"}, "t-1"))
                await asyncio.wait_for(gated.started["b"].wait(), WAIT)
                process.send_signal(signal.SIGKILL)
                with pytest.raises(httpx.HTTPError):
                    await asyncio.wait_for(first, WAIT)
            async with core_process(db, port) as process:
                await page.connect(url)
                retry = asyncio.create_task(post(http, turns_path(sid), {"text": "go"}, "t-1"))
                await until_logged(process, RETRY)
                assert not retry.done()  # b is still gated: the retry waits for the turn
                gated.gates["b"].set()
                answer = (await asyncio.wait_for(retry, WAIT)).json()
                assert answer["status"] == "completed"
                assert [c["tool"] for c in answer["toolCalls"]] == ["a", "b", "c"]
                again = await post(http, turns_path(sid), {"text": "go"}, "t-1")
                assert again.json() == answer
            assert gated.runs == Counter(a=1, b=1, c=1)
            await page.drop()

    run(main(), timeout=90)


def test_a_relayed_mcp_calls_key_is_claimed_by_the_control_apis_rule() -> None:
    """The holder's side of an MCP call relayed from another node (``keyed_call``)
    claims its key as the control API claims a caller's: the same call again gets the
    first one's result; the key with another call (args or tool) gets
    ``IDEMPOTENCY_KEY_REUSED`` and sends the page nothing, where it got the other call's
    result (the fingerprint was not checked)."""

    async def main() -> None:
        async with running_core(config()) as core:
            page = await RawClient.open(core.ws_url)
            sid = (await page.hello([tool_meta("a"), tool_meta("b")]))["sessionId"]
            session = core.registry.sessions[sid]
            key = "pedelec-mcp-" + "0" * 32
            async def relayed(tool: str, args: Any) -> Any:
                return await keyed_call(session, key, tool, args, None, await prepare_call(
                    tool, args, core.registry.config.max_frame_bytes))

            first = asyncio.ensure_future(relayed("a", {"n": 1}))
            request = await asyncio.wait_for(page.recv(), WAIT)
            assert request["type"] == "tool.request", request
            await page.send({"type": "tool.result", "toolRequestId": request["toolRequestId"],
                             "result": {"ok": True}, "handledBy": "named"})
            assert await asyncio.wait_for(first, WAIT) == {"ok": True}
            again = await asyncio.wait_for(relayed("a", {"n": 1}), WAIT)
            assert again == {"ok": True}
            for tool, args in (("a", {"n": 2}), ("b", {"n": 1})):
                reused = await asyncio.wait_for(relayed(tool, args), WAIT)
                assert reused["error"]["code"] == IDEMPOTENCY_KEY_REUSED, reused
            assert not session.pending
            with pytest.raises(TimeoutError):  # nothing sent to the page
                await asyncio.wait_for(page.recv(), 0.5)
            await page.close()

    run(main())
