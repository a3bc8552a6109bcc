"""The Session's public contract at its edges: ``receive()`` never raises, handler
disposers and ``ctx.active``, the error shapes, resume, ``run_request``. Each test fails on a
runtime that gets one of them wrong (found by mutation testing:
docs/how-to/mutation-testing.md)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from sessionkit import FakeCore, connected, request
from web_storage import DictStorage

from pedelec_pyodide import (
    Session,
    StorageLedger,
    ToolContext,
    TurnError,
    define_tool,
)

OBJECT = {"type": "object"}


def turn_end(turn_id: str, status: str = "completed", text: str = "done") -> str:
    return json.dumps({"type": "turn.end", "turnId": turn_id, "status": status, "text": text})


# --- receive() never raises -----------------------------------------------------------

async def test_turn_end_and_error_for_unknown_or_finished_turns_are_ignored() -> None:
    session = Session()
    core = connected(session)
    seen: list[Any] = []
    session.subscribe(seen.append)
    session.receive(turn_end("never-started"))
    session.receive(json.dumps({"type": "error", "code": "TURN_BUSY", "turnId": "nope",
                                "message": "m"}))
    task = asyncio.ensure_future(session.send_text("hi"))
    await asyncio.sleep(0)
    turn_id = core.of_type("turn.start")[0]["turnId"]
    session.receive(turn_end(turn_id, text="first"))
    assert await task == "first"
    # the same turn again, ended or refused: nothing raises, the answer stays the first
    session.receive(turn_end(turn_id, text="second"))
    session.receive(json.dumps({"type": "error", "code": "TURN_BUSY", "turnId": turn_id,
                                "message": "m"}))
    assert [type(event).__name__ for event in seen].count("TurnEnd") == 3
    assert session.connected and not session.closed


# --- disposers and ctx.active ---------------------------------------------------------

async def _active_after(register: Any, dispatch_tool: str = "t") -> tuple[bool, bool, Any]:
    """Start a handler that waits; run ``register(session)`` meanwhile; report
    ctx.active before and after, and what the same tool is answered afterwards."""
    session = Session([define_tool(name="t", description="d", args_schema=OBJECT)])
    release = asyncio.Event()
    contexts: list[ToolContext] = []

    async def waiting(*params: Any) -> str:
        contexts.append(params[-1])
        await release.wait()
        return "old"

    undo = register(session, waiting)
    call = asyncio.ensure_future(session.dispatch(dispatch_tool, {}))
    for _ in range(2):  # the dispatch, then its handler's own task
        await asyncio.sleep(0)
    before = contexts[0].active
    undo()
    after = contexts[0].active
    release.set()
    await call
    return before, after, await session.dispatch(dispatch_tool, {})


async def test_add_tool_disposer_makes_its_inline_handler_inactive() -> None:
    def register(session: Session, handler: Any) -> Any:
        async def t2(ctx: ToolContext) -> str:
            """d"""
            return str(await handler(ctx))

        return session.add_tool(define_tool(t2))

    before, after, again = await _active_after(register, "t2")
    assert (before, after) == (True, False)
    assert again["error"]["code"] == "TOOL_HANDLER_NOT_FOUND"


async def test_a_replaced_named_handler_is_inactive_and_the_new_one_answers() -> None:
    def register(session: Session, handler: Any) -> Any:
        session.on_tool("t", handler)
        return lambda: session.on_tool("t", lambda: "new")

    before, after, again = await _active_after(register)
    assert (before, after, again) == (True, False, "new")


async def test_a_replaced_fallback_is_inactive_and_the_new_one_answers() -> None:
    def register(session: Session, handler: Any) -> Any:
        session.on_tool(handler)
        return lambda: session.on_tool(lambda tool: f"new {tool}")

    before, after, again = await _active_after(register)
    assert (before, after, again) == (True, False, "new t")


async def test_a_disposed_fallback_is_inactive_and_no_handler_is_left() -> None:
    def register(session: Session, handler: Any) -> Any:
        return session.on_tool(handler)

    before, after, again = await _active_after(register)
    assert (before, after) == (True, False)
    assert again["error"]["code"] == "TOOL_HANDLER_NOT_FOUND"


async def test_a_stale_disposer_leaves_the_current_registration() -> None:
    session = Session([define_tool(name="t", description="d", args_schema=OBJECT)])
    old_named = session.on_tool("t", lambda: "old")
    session.on_tool("t", lambda: "new")
    old_named()
    old_named()
    old_fallback = session.on_tool(lambda: "old fallback")
    session.on_tool(lambda: "new fallback")
    old_fallback()
    assert (await session.run_request("t", {})).result == "new"
    assert (await session.run_request("other", {})).result == "new fallback"


# --- error shapes ---------------------------------------------------------------------

async def test_explain_error_adds_its_hint_to_a_handler_error() -> None:
    explained: list[BaseException] = []

    def explain(exc: BaseException) -> str | None:
        explained.append(exc)
        return "is the divisor set?" if isinstance(exc, ZeroDivisionError) else None

    session = Session(explain_error=explain)
    session.on_tool("t", lambda: 1 / 0)
    session.on_tool("u", lambda: {}["k"])
    assert (await session.dispatch("t", {}))["error"] == {
        "code": "TOOL_HANDLER_ERROR",
        "message": "ZeroDivisionError: division by zero (is the divisor set?)"}
    # no hint: the message alone, with no empty parentheses
    assert (await session.dispatch("u", {}))["error"]["message"] == "KeyError: 'k'"
    assert [type(exc) for exc in explained] == [ZeroDivisionError, KeyError]


async def test_invalid_args_details_hold_at_most_20_errors_of_clipped_text() -> None:
    many = {"type": "object",
            "properties": {f"p{i:02}": {"type": "integer"} for i in range(30)}}
    tool = define_tool(name="t", description="d", args_schema=many)
    session = Session([tool])
    session.on_tool("t", lambda: "ran")
    result = await session.dispatch("t", {f"p{i:02}": "x" * 1000 for i in range(30)})
    error = result["error"]
    assert error["code"] == "INVALID_ARGS" and error["retryable"] is True
    errors = error["details"]["errors"]
    assert len(errors) == 20
    assert all(len(item["message"]) <= 300 for item in errors)
    assert errors == sorted(errors, key=lambda item: item["path"])
    assert error["message"].startswith(
        f"arguments for 't' do not match its schema: {errors[0]['path']}: ")


# --- resume ---------------------------------------------------------------------------

def welcome(resumed: bool) -> str:
    return json.dumps({"type": "welcome", "sessionId": "s1", "resumeToken": "tok",
                       "resumed": resumed, "state": "idle"})


async def test_a_resumed_welcome_re_sends_the_start_of_each_open_turn() -> None:
    session = Session()
    core = connected(session)
    task = asyncio.ensure_future(session.send_text("still waiting"))
    await asyncio.sleep(0)
    start = core.of_type("turn.start")[0]
    session.connection_lost()
    again = FakeCore()
    session.connection_made(again)
    session.receive(welcome(resumed=True))
    assert again.of_type("turn.start") == [start]
    assert not task.done()
    session.receive(turn_end(start["turnId"], text="answer"))
    assert await task == "answer"


async def test_a_new_session_fails_open_turns_turn_lost() -> None:
    session = Session()
    core = connected(session)
    task = asyncio.ensure_future(session.send_text("lost"))
    await asyncio.sleep(0)
    session.connection_lost()
    again = FakeCore()
    session.connection_made(again)
    session.receive(welcome(resumed=False))
    assert again.of_type("turn.start") == []
    with pytest.raises(TurnError) as info:
        await task
    assert (info.value.status, info.value.code) == ("failed", "TURN_LOST")
    assert "resumed" in str(info.value)
    assert len(core.of_type("turn.start")) == 1


async def test_a_reload_while_a_plain_functions_awaitable_is_pending_is_outcome_unknown(
) -> None:
    storage = DictStorage()
    runs: list[str] = []
    loop = asyncio.get_running_loop()
    pending: asyncio.Future[str] = loop.create_future()

    def side_effect(key: str) -> asyncio.Future[str]:
        """Writes something: must not run twice."""
        runs.append(key)
        return pending

    tool = define_tool(side_effect)
    first = Session([tool], ledger=StorageLedger(storage, "p:"))
    connected(first)
    first.receive(request("q1", "side_effect", {"key": "a"}))
    await asyncio.sleep(0)
    assert runs == ["a"] and StorageLedger(storage, "p:").was_started("q1")
    for task in list(first._tasks.values()):  # the tab goes away while the awaitable is pending
        task.cancel()

    reloaded = Session([tool], ledger=StorageLedger(storage, "p:"))
    core = connected(reloaded)
    reloaded.receive(request("q1", "side_effect", {"key": "a"}))
    result = core.of_type("tool.result")[0]["result"]
    assert result["error"]["code"] == "TOOL_OUTCOME_UNKNOWN" and runs == ["a"]


# --- run_request ----------------------------------------------------------------------

async def test_run_request_with_an_async_handler_and_an_id() -> None:
    session = Session()
    seen: list[ToolContext] = []

    async def handler(args: Any, ctx: ToolContext) -> dict[str, Any]:
        seen.append(ctx)
        await asyncio.sleep(0)
        return {"got": args}

    session.on_tool("t", handler)
    call = await session.run_request("t", {"n": 1}, tool_request_id="r-7", turn_id="turn-1")
    assert (call.tool_request_id, call.tool, call.args, call.turn_id) == (
        "r-7", "t", {"n": 1}, "turn-1")
    assert call.result == {"got": {"n": 1}} and call.handled_by == "named"
    assert json.loads(call.result_json) == call.result and not call.is_error
    assert seen[0].tool_request_id == "r-7" and seen[0].turn_id == "turn-1"
    assert session.pending == []
