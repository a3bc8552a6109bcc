"""Handler registration: named, inline and fallback, priority, and disposers."""

from __future__ import annotations

from typing import Any

import pytest

from pedelec_pyodide import Session, SessionClosedError, define_tool

SCHEMA = {"type": "object", "properties": {"delta": {"type": "integer"}}}


def counter_tool(handler: Any = None) -> Any:
    return define_tool(name="update_counter", description="Change the counter.",
                       args_schema=SCHEMA, handler=handler)


async def call(session: Session, tool: str = "update_counter", args: Any = None) -> Any:
    return await session.run_request(tool, {} if args is None else args)


async def test_priority_named_then_inline_then_fallback_then_not_found() -> None:
    session = Session([counter_tool(lambda: "inline")])
    dispose_fallback = session.on_tool(lambda tool: f"fallback:{tool}")
    dispose_named = session.on_tool("update_counter", lambda: "named")

    first = await call(session)
    assert (first.result, first.handled_by) == ("named", "named")
    dispose_named()
    second = await call(session)
    assert (second.result, second.handled_by) == ("inline", "inline")

    no_inline = Session([counter_tool()])
    no_inline.on_tool(lambda tool: f"fallback:{tool}")
    third = await call(no_inline)
    assert (third.result, third.handled_by) == ("fallback:update_counter", "fallback")

    other = await call(session, "other")
    assert (other.result, other.handled_by) == ("fallback:other", "fallback")
    dispose_fallback()
    gone = await call(session, "other")  # the same session, its fallback disposed
    assert gone.handled_by == "none"
    assert gone.result["error"]["code"] == "TOOL_HANDLER_NOT_FOUND"
    bare = Session([counter_tool()])
    fourth = await call(bare)
    assert fourth.handled_by == "none"
    assert fourth.result["error"]["code"] == "TOOL_HANDLER_NOT_FOUND"


async def test_named_and_fallback_serve_names_without_definition() -> None:
    session = Session()
    session.on_tool("undeclared", lambda args: {"got": args})
    assert await session.dispatch("undeclared", {"anything": [1]}) == {"got": {"anything": [1]}}
    session.on_tool(lambda tool, args: [tool, args])
    assert await session.dispatch("other", 5) == ["other", 5]


async def test_new_fallback_replaces_old_and_old_disposer_does_nothing() -> None:
    session = Session()
    dispose_first = session.on_tool(lambda tool: "first")
    session.on_tool(lambda tool: "second")
    dispose_first()
    assert await session.dispatch("x", {}) == "second"


async def test_disposer_removes_only_its_own_registration() -> None:
    session = Session()

    def handler(args: Any) -> str:
        return "same function"

    dispose_first = session.on_tool("t", handler)
    dispose_second = session.on_tool("t", handler)  # same function, distinct registration
    dispose_first()  # no longer current: must not remove the second
    assert await session.dispatch("t", {}) == "same function"
    dispose_second()
    result = await session.dispatch("t", {})
    assert result["error"]["code"] == "TOOL_HANDLER_NOT_FOUND"


async def test_disposers_are_idempotent() -> None:
    session = Session([counter_tool(lambda: "inline")])
    dispose = session.on_tool("update_counter", lambda: "named")
    dispose()
    dispose()
    session.on_tool("update_counter", lambda: "named again")
    dispose()  # a stale disposer never removes a later registration
    assert await session.dispatch("update_counter", {}) == "named again"
    dispose_fallback = session.on_tool(lambda: "fb")
    dispose_fallback()
    dispose_fallback()
    assert (await session.dispatch("other", {}))["error"]["code"] == "TOOL_HANDLER_NOT_FOUND"
    session.on_tool(lambda: "fb again")
    dispose_fallback()  # nor a later fallback
    assert await session.dispatch("other", {}) == "fb again"


async def test_handlers_receive_the_leading_parameters_they_declare() -> None:
    session = Session()
    session.on_tool("zero", lambda: "zero")
    session.on_tool("one", lambda args: args)
    session.on_tool("two", lambda args, ctx: [args, ctx.tool])
    session.on_tool("star", lambda *a: len(a))
    assert await session.dispatch("zero", {"a": 1}) == "zero"
    assert await session.dispatch("one", {"a": 1}) == {"a": 1}
    assert await session.dispatch("two", {"a": 1}) == [{"a": 1}, "two"]
    assert await session.dispatch("star", {}) == 2
    session.on_tool(lambda tool, args, ctx: [tool, args, ctx.tool_request_id])
    assert await session.dispatch("any", 1, tool_request_id="r") == ["any", 1, "r"]


async def test_add_tool_later_and_dispose_it() -> None:
    session = Session()
    dispose = session.add_tool(counter_tool(lambda args: args["delta"] * 2))
    assert "update_counter" in session.tools
    assert await session.dispatch("update_counter", {"delta": 4}) == 8
    dispose()
    assert "update_counter" not in session.tools
    result = await session.dispatch("update_counter", {"delta": 4})
    assert result["error"]["code"] == "TOOL_HANDLER_NOT_FOUND"
    dispose()  # idempotent: a second call removes nothing...
    session.add_tool(counter_tool(lambda args: args["delta"] * 3))
    dispose()  # ...not even the same name added again
    assert "update_counter" in session.tools
    assert await session.dispatch("update_counter", {"delta": 4}) == 12


def test_two_tools_under_one_name_are_rejected() -> None:
    with pytest.raises(ValueError, match="two tools are defined under the name 'update_counter'"):
        Session([counter_tool(), counter_tool()])
    session = Session([counter_tool()])
    with pytest.raises(ValueError, match="two tools"):
        session.add_tool(counter_tool())


def test_registration_argument_errors() -> None:
    session = Session()
    with pytest.raises(TypeError, match="handler is missing"):
        session.on_tool("t")
    with pytest.raises(TypeError, match="must be callable"):
        session.on_tool("t", 42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="expected a Tool"):
        Session(["not a tool"])  # type: ignore[list-item]


def test_closed_session_refuses_registrations() -> None:
    session = Session()
    session.close()
    with pytest.raises(SessionClosedError):
        session.on_tool("t", lambda: 1)
