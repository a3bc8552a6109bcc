"""The page's scheduler starts a request's task at once (``PageLoop(eager=True)``): its
first step runs inside ``receive``, ``dispatch`` or ``start_request``, as a sync handler's
does. What must hold all the same. Eager tasks are Python 3.12+: these run in the Pyodide
unit suite (``node tests/pyodide/run-unit.mjs``), not on an older CPython."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import pytest
from sessionkit import connected, request, side_effect_tool, spin, tool, wire
from web_storage import DictStorage

from pedelec_pyodide import Session, SessionState, StorageLedger, ToolContext
from pedelec_pyodide.browser import PageLoop

pytestmark = pytest.mark.skipif(sys.version_info < (3, 12),
                                reason="eager tasks: Python 3.12+ (Pyodide's)")


def page_session(*tools: Any, **options: Any) -> tuple[Session, Any]:
    session = Session(tools, scheduler=PageLoop(eager=True), cancel_grace=0.05, **options)
    return session, connected(session)


async def test_in_the_page_an_async_body_begins_in_the_turn_its_request_arrived() -> None:
    """The page's scheduler starts a request's task at once: no reload can fall between
    the request's arrival and its body, and no turn of the loop (a JS task) is spent."""
    storage = DictStorage()
    runs: list[str] = []
    session, core = page_session(side_effect_tool(runs), ledger=StorageLedger(storage, "p:"))
    session.receive(request("q1", "side_effect", {"key": "a"}))
    assert runs == ["a"] and StorageLedger(storage, "p:").was_started("q1")
    assert core.of_type("tool.result") == [] and len(session._tasks) == 1
    await spin()
    assert [r["result"] for r in core.of_type("tool.result")] == ["a"]
    assert runs == ["a"] and session._tasks == {}


async def test_in_the_page_a_request_arriving_with_no_loop_running_still_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Eager start needs the loop to be the running one; where it is not (a JS callback
    with no loop set), the task starts at the loop's next turn: ``receive`` never raises."""
    runs: list[str] = []
    session, core = page_session(side_effect_tool(runs))
    running = asyncio.get_running_loop()
    # as in the page, where the event loop is the one loop whether running or not
    monkeypatch.setattr(asyncio, "get_event_loop", lambda: running)
    asyncio._set_running_loop(None)
    try:
        session.receive(request("q1", "side_effect", {"key": "a"}))
    finally:
        asyncio._set_running_loop(running)
    assert runs == []  # not begun: its first step waits for the loop
    await spin()
    assert [r["result"] for r in core.of_type("tool.result")] == ["a"] and runs == ["a"]
    assert session._tasks == {}


async def test_a_handler_that_returns_or_raises_before_any_await_is_answered_inline(
) -> None:
    async def quick(args: Any, ctx: ToolContext) -> str:
        ctx.progress(1, 2)
        if args.get("boom"):
            raise ValueError("x")
        return "q"

    session, core = page_session(tool("q", quick))
    session.receive(request("r1", "q"))
    session.receive(request("r2", "q", {"boom": True}))
    assert [f[0] for f in wire(core, "tool.progress", "tool.result")] == [
        "tool.progress", "tool.result", "tool.progress", "tool.result"]
    assert core.of_type("tool.result")[1]["result"]["error"]["code"] == "TOOL_HANDLER_ERROR"
    assert session._tasks == {} and session.state == SessionState.IDLE


async def test_a_first_step_that_cancels_itself_or_dispatches_another_tool() -> None:
    async def inner() -> str:
        await asyncio.sleep(0)
        return "inner"

    async def cancels_itself(args: Any, ctx: ToolContext) -> str:
        ctx.session.cancel(ctx.tool_request_id)
        await asyncio.sleep(0)
        return f"cancelled={ctx.cancelled}"

    async def nests(args: Any, ctx: ToolContext) -> Any:
        return {"got": await ctx.session.dispatch("inner", {})}

    session, core = page_session(tool("inner", inner), tool("self", cancels_itself),
                                 tool("nests", nests))
    session.receive(request("a", "self"))
    session.receive(request("b", "nests"))
    await spin()
    results = {f["toolRequestId"]: f["result"] for f in core.of_type("tool.result")}
    assert results == {"a": "cancelled=True", "b": {"got": "inner"}}
    assert session._tasks == {} and session.state == SessionState.IDLE


async def test_a_first_step_that_closes_the_session() -> None:
    async def closes(args: Any, ctx: ToolContext) -> str:
        ctx.session.close()
        await asyncio.sleep(0)
        return "after close"

    session, core = page_session(tool("c", closes))
    session.receive(request("x", "c"))
    await spin()
    assert session.closed and session._tasks == {}
    assert core.of_type("tool.result") == []  # no transport after close


async def test_an_approval_given_at_once_runs_the_tool_in_the_same_step() -> None:
    storage = DictStorage()
    runs: list[int] = []

    async def delete(args: Any) -> dict[str, int]:
        runs.append(args["id"])
        await asyncio.sleep(0)
        return {"deleted": args["id"]}

    schema = {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}
    session, core = page_session(
        tool("delete", delete, args_schema=schema, needs_approval=True),
        ledger=StorageLedger(storage, "p:"))
    session.on_approval(lambda request: True)
    session.receive(request("q1", "delete", {"id": 3}))
    assert runs == [3] and StorageLedger(storage, "p:").was_started("q1")
    await spin()
    assert wire(core, "tool.waiting", "tool.result") == [
        ("tool.waiting", True, "approval"), ("tool.waiting", False, None),
        ("tool.result", {"deleted": 3})]
    assert session._tasks == {}


async def test_a_request_of_the_browsers_agent_is_answered_inline() -> None:
    async def quick() -> str:
        return "now"

    session, _ = page_session(tool("q", quick))
    rec = session.start_request("q", {}, source="webmcp")
    assert rec.answered and rec.result == "now" and session._tasks == {}
