"""Dispatch: validation, every row of the result rules, sync/async, state and context."""

from __future__ import annotations

import asyncio
import datetime
import math
import time
from typing import Any

import pytest

from pedelec_pyodide import (
    Session,
    SessionState,
    ToolCall,
    ToolContext,
    ToolError,
    define_tool,
    invalid_args,
    tool_error,
)

COUNTER = {
    "type": "object",
    "properties": {"delta": {"type": "integer"}, "note": {"type": "string", "maxLength": 3}},
    "required": ["delta"],
    "additionalProperties": False,
}


def session_returning(value: Any, **options: Any) -> Session:
    session = Session(**options)
    session.on_tool("t", lambda: value)
    return session


class _Cycle:
    @staticmethod
    def list_() -> list[Any]:
        items: list[Any] = [1]
        items.append(items)
        return items


@pytest.mark.parametrize(
    "value",
    [None, True, 0, -3, 2**70, 1.5, "text", "", [], {}, [1, "a", None],
     {"a": {"b": [1, 2.5, {"c": None}]}}, "ünïcödé ✓ 中文"],
)
async def test_json_values_are_returned_as_they_are(value: Any) -> None:
    assert await session_returning(value).dispatch("t", {}) == value


async def test_a_tuple_goes_on_the_wire_as_an_array() -> None:
    call = await session_returning({"pair": (1, (2, 3))}).run_request("t", {})
    assert call.result == {"pair": [1, [2, 3]]}
    assert call.result_json == '{"pair":[1,[2,3]]}'


async def test_a_value_may_appear_twice() -> None:
    shared = {"x": 1}
    assert await session_returning([shared, shared]).dispatch("t", {}) == [{"x": 1}, {"x": 1}]


@pytest.mark.parametrize(
    ("value", "path", "kind"),
    [
        (math.nan, "$", "a float"),
        ({"a": [1, math.inf]}, "$.a[1]", "a float"),
        ({"b": -math.inf}, "$.b", "a float"),
        ({"data": b"bytes"}, "$.data", "a bytes"),
        ({"tags": {1, 2}}, "$.tags", "a set"),
        ({"when": datetime.datetime(2026, 1, 1)}, "$.when", "a datetime.datetime"),
        ({"obj": object()}, "$.obj", "a object"),
        ({1: "x"}, '$["1"]', "a int"),
        ({"nested": {None: 1}}, "$.nested.None", "a NoneType"),
        ({"k": {"x": 1, (1, 2): 3}}, "$.k[\"(1, 2)\"]", "a tuple"),
        ([lambda: 1], "$[0]", "a function"),
    ],
)
async def test_non_json_results_are_invalid_naming_path_and_type(
    value: Any, path: str, kind: str
) -> None:
    result = await session_returning(value).dispatch("t", {})
    error = result["error"]
    assert error["code"] == "TOOL_RESULT_INVALID"
    assert error["details"] == {"path": path, "type": kind}
    assert path in error["message"]


async def test_a_cycle_is_invalid() -> None:
    result = await session_returning(_Cycle.list_()).dispatch("t", {})
    assert result["error"]["code"] == "TOOL_RESULT_INVALID"
    assert result["error"]["details"]["path"] == "$[1]"
    assert "cycle" in result["error"]["message"]


async def test_result_too_large_over_the_limit() -> None:
    session = session_returning("x" * 100, max_result_bytes=50)
    result = await session.dispatch("t", {})
    assert result["error"]["code"] == "TOOL_RESULT_TOO_LARGE"
    assert result["error"]["details"] == {"size": 102, "limit": 50}
    assert await session_returning("x" * 48, max_result_bytes=50).dispatch("t", {}) == "x" * 48


async def test_default_limit_is_one_mebibyte_of_utf8() -> None:
    just_under = "é" * ((1024 * 1024 - 2) // 2)  # two bytes each in UTF-8, plus quotes
    assert await session_returning(just_under).dispatch("t", {}) == just_under
    over = await session_returning(just_under + "é").dispatch("t", {})
    assert over["error"]["code"] == "TOOL_RESULT_TOO_LARGE"


async def test_domain_error_results_pass_through() -> None:
    domain = {"error": {"code": "NO_SELECTION", "message": "Nothing selected.",
                        "details": {"documentId": "d1"}}}
    assert await session_returning(domain).dispatch("t", {}) == domain


async def test_tool_error_raised_is_a_normal_result() -> None:
    session = Session()

    def handler() -> None:
        raise ToolError("NO_SELECTION", "Nothing selected.", details={"doc": 1}, retryable=False)

    session.on_tool("t", handler)
    assert await session.dispatch("t", {}) == {
        "error": {"code": "NO_SELECTION", "message": "Nothing selected.",
                  "details": {"doc": 1}, "retryable": False}
    }


def test_error_helpers() -> None:
    assert tool_error("E", "m") == {"error": {"code": "E", "message": "m"}}
    assert invalid_args("delta must be finite", {"got": "NaN"}) == {
        "error": {"code": "INVALID_ARGS", "message": "delta must be finite",
                  "details": {"got": "NaN"}, "retryable": True}
    }
    with pytest.raises(ValueError, match="non-empty string"):
        tool_error("", "m")
    assert ToolError("E", "m").code == "E"


async def test_an_exception_becomes_tool_handler_error_without_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    session = Session()

    def broken(args: Any) -> None:
        raise ZeroDivisionError("division by zero")

    session.on_tool("t", broken)
    result = await session.dispatch("t", {})
    assert result == {"error": {"code": "TOOL_HANDLER_ERROR",
                                "message": "ZeroDivisionError: division by zero"}}
    assert "Traceback" not in str(result)
    assert any("ZeroDivisionError" in (r.exc_text or "") for r in caplog.records)


async def test_async_exception_and_empty_message() -> None:
    session = Session()

    async def broken() -> None:
        await asyncio.sleep(0)
        raise KeyError()

    session.on_tool("t", broken)
    assert await session.dispatch("t", {}) == {
        "error": {"code": "TOOL_HANDLER_ERROR", "message": "KeyError"}
    }


async def test_system_exit_in_a_handler_does_not_escape() -> None:
    session = Session()
    session.on_tool("t", lambda: exec("raise SystemExit(3)"))
    result = await session.dispatch("t", {})
    assert result["error"]["code"] == "TOOL_HANDLER_ERROR"
    assert session.state == SessionState.IDLE


async def test_args_are_validated_before_the_handler_runs() -> None:
    ran: list[Any] = []
    session = Session([define_tool(name="c", description="d", args_schema=COUNTER,
                                   handler=lambda args: ran.append(args))])
    result = await session.dispatch("c", {"delta": "x", "note": "long", "extra": 1})
    error = result["error"]
    assert error["code"] == "INVALID_ARGS"
    assert error["retryable"] is True
    paths = [e["path"] for e in error["details"]["errors"]]
    assert paths == ["$", "$.delta", "$.note"]
    assert ran == []
    missing = await session.dispatch("c", {})
    assert missing["error"]["details"]["errors"] == [
        {"path": "$", "message": "'delta' is a required property"}
    ]
    not_object = await session.dispatch("c", [1])
    assert not_object["error"]["code"] == "INVALID_ARGS"
    assert await session.dispatch("c", {"delta": 1}) is None
    assert ran == [{"delta": 1}]


async def test_named_and_fallback_handlers_are_validated_against_the_definition() -> None:
    session = Session([define_tool(name="c", description="d", args_schema=COUNTER)])
    session.on_tool(lambda tool, args: "fallback ran")
    result = await session.dispatch("c", {"delta": 1.5})
    assert result["error"]["code"] == "INVALID_ARGS"


async def test_validator_is_built_once_per_tool(monkeypatch: pytest.MonkeyPatch) -> None:
    from pedelec_pyodide import tools

    built: list[Any] = []
    real = tools.compile_validator

    def counting(schema: Any) -> Any:
        built.append(schema)
        return real(schema)

    monkeypatch.setattr(tools, "compile_validator", counting)
    session = Session([define_tool(name="c", description="d", args_schema=COUNTER,
                                   handler=lambda: 1)])
    for delta in range(5):
        await session.dispatch("c", {"delta": delta})
    assert built == [COUNTER]


async def test_async_handler_keeps_waiting_tool_result_state() -> None:
    session = Session()
    release = asyncio.Event()
    states: list[SessionState] = []
    session.subscribe(lambda event: states.append(event)
                      if isinstance(event, SessionState) else None)

    async def slow() -> str:
        await release.wait()
        return "done"

    session.on_tool("slow", slow)
    assert session.state == SessionState.IDLE
    task = asyncio.ensure_future(session.dispatch("slow", {}))
    await asyncio.sleep(0)
    assert session.state == SessionState.WAITING_TOOL_RESULT
    release.set()
    assert await task == "done"
    assert session.state == SessionState.IDLE
    assert states == [SessionState.WAITING_TOOL_RESULT, SessionState.IDLE]


async def test_many_requests_in_flight_finish_in_any_order() -> None:
    session = Session()
    gates = [asyncio.Event() for _ in range(5)]
    finished: list[Any] = []
    session.subscribe(lambda e: finished.append(e.result) if isinstance(e, ToolCall) else None)

    async def gated(args: Any) -> Any:
        await gates[args["n"]].wait()
        return args["n"]

    session.on_tool("gated", gated)
    calls = asyncio.gather(*(session.dispatch("gated", {"n": n}) for n in range(5)))
    await asyncio.sleep(0)  # all five running, each waiting on its gate
    for count, n in enumerate((3, 1, 4, 0, 2), 1):  # released in another order
        gates[n].set()
        for _ in range(100):  # bounded: a few loop turns finish it
            if len(finished) == count:
                break
            await asyncio.sleep(0)
    assert await calls == [0, 1, 2, 3, 4]  # each caller gets its own result
    assert finished == [3, 1, 4, 0, 2]
    assert session.state == SessionState.IDLE


async def test_any_awaitable_is_awaited() -> None:
    session = Session()

    def returns_future() -> asyncio.Future[str]:
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(future.set_result, "from a future")
        return future

    session.on_tool("t", returns_future)
    assert await session.dispatch("t", {}) == "from a future"


async def test_context_fields() -> None:
    session = Session()
    seen: list[ToolContext] = []
    session.on_tool("t", lambda args, ctx: seen.append(ctx))
    await session.dispatch("t", {}, tool_request_id="req-1", turn_id="turn-1")
    ctx = seen[0]
    assert (ctx.tool, ctx.tool_request_id, ctx.turn_id) == ("t", "req-1", "turn-1")
    assert ctx.session is session
    assert ctx.active
    assert not ctx.cancelled
    await session.dispatch("t", {})
    assert seen[1].tool_request_id and seen[1].tool_request_id != "req-1"


async def test_dispose_during_a_running_call_lets_it_finish_inactive() -> None:
    session = Session()
    release = asyncio.Event()
    activity: list[bool] = []

    async def handler(args: Any, ctx: ToolContext) -> str:
        activity.append(ctx.active)
        await release.wait()
        activity.append(ctx.active)
        return "finished"

    dispose = session.on_tool("t", handler)
    task = asyncio.ensure_future(session.dispatch("t", {}))
    for _ in range(2):  # the dispatch, then its handler's own task
        await asyncio.sleep(0)
    dispose()
    release.set()
    assert await task == "finished"
    assert activity == [True, False]


async def test_closing_the_session_makes_running_calls_inactive() -> None:
    session = Session()
    release = asyncio.Event()
    seen: list[ToolContext] = []

    async def handler(args: Any, ctx: ToolContext) -> None:
        seen.append(ctx)
        await release.wait()

    session.on_tool("t", handler)
    task = asyncio.ensure_future(session.dispatch("t", {}))
    for _ in range(2):  # the dispatch, then its handler's own task
        await asyncio.sleep(0)
    session.close()
    assert session.state == SessionState.CLOSED
    assert not seen[0].active and seen[0].cancelled
    release.set()
    await task


async def test_same_request_id_runs_once() -> None:
    session = Session()
    runs: list[int] = []
    release = asyncio.Event()

    async def handler() -> int:
        runs.append(1)
        await release.wait()
        return len(runs)

    session.on_tool("t", handler)
    first = asyncio.ensure_future(session.dispatch("t", {}, tool_request_id="same"))
    await asyncio.sleep(0)
    second = asyncio.ensure_future(session.dispatch("t", {}, tool_request_id="same"))
    await asyncio.sleep(0)
    release.set()
    assert await first == await second == 1
    assert await session.dispatch("t", {}, tool_request_id="same") == 1  # replayed
    assert runs == [1]


async def test_tool_call_events_carry_tier_and_timing(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]  # a fake clock: the handler "takes" 0.25 s
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])

    def handler(args: Any) -> Any:
        clock[0] += 0.25
        return {"echo": args}

    session = Session()
    events: list[Any] = []
    dispose = session.subscribe(events.append)
    session.on_tool("t", handler)
    await session.dispatch("t", {"a": 1}, tool_request_id="r")
    calls = [e for e in events if isinstance(e, ToolCall)]
    assert len(calls) == 1
    assert calls[0].tool == "t" and calls[0].args == {"a": 1}
    assert calls[0].handled_by == "named" and calls[0].duration_ms == 250.0
    assert not calls[0].is_error
    dispose()
    await session.dispatch("t", {})
    assert len([e for e in events if isinstance(e, ToolCall)]) == 1


async def test_a_listener_of_some_kinds_gets_those_and_the_others_are_not_built(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``subscribe(listener, kinds=...)``: a tool call's status and state events cost
    nothing when nobody takes them (the page's JS listening to ``toolcall`` only)."""
    from pedelec_pyodide import dispatch as dispatch_module
    from pedelec_pyodide.session import ToolStatus

    built: list[Any] = []

    def counted_status(*args: Any) -> Any:
        built.append(args)
        return ToolStatus(*args)

    session = Session()
    monkeypatch.setattr(dispatch_module, "ToolStatus", counted_status)
    session.on_tool("t", lambda args: args)
    calls: list[Any] = []
    dispose = session.subscribe(calls.append, kinds=(ToolCall,))
    await session.dispatch("t", {"a": 1}, tool_request_id="r1")
    assert [type(event) for event in calls] == [ToolCall] and built == []
    everything: list[Any] = []
    session.subscribe(everything.append)
    await session.dispatch("t", {"a": 2}, tool_request_id="r2")
    assert [type(event) for event in calls] == [ToolCall, ToolCall]
    assert [type(event) for event in everything] == [
        SessionState, ToolStatus, ToolStatus, ToolCall, SessionState]
    assert len(built) == 2
    dispose()
    await session.dispatch("t", {"a": 3}, tool_request_id="r3")
    assert len(calls) == 2 and len(everything) == 10


async def test_a_tool_call_is_an_error_only_for_an_error_result() -> None:
    """``{"error": null}`` is a value a handler returned, not an error result."""
    session = Session()
    events: list[Any] = []
    session.subscribe(events.append)
    session.on_tool("t", lambda args: args["give"])
    for give in ({"error": None}, {"error": "text"}, {"error": {"code": "C", "message": "m"}}):
        await session.dispatch("t", {"give": give})
    calls = [e for e in events if isinstance(e, ToolCall)]
    assert [call.is_error for call in calls] == [False, False, True]


async def test_an_async_handlers_duration_spans_its_awaits(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [50.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    release = asyncio.Event()

    async def handler() -> str:
        clock[0] += 0.5
        await release.wait()
        clock[0] += 1.5
        return "done"

    session = Session()
    session.on_tool("t", handler)
    call = asyncio.ensure_future(session.run_request("t", {}, tool_request_id="r"))
    await asyncio.sleep(0)
    clock[0] += 2.0  # time the handler waits counts too
    release.set()
    done = await call
    assert (done.result, done.duration_ms) == ("done", 4000.0)


async def test_a_failing_listener_breaks_nothing() -> None:
    session = Session()
    session.subscribe(lambda event: 1 / 0)
    session.on_tool("t", lambda: "ok")
    assert await session.dispatch("t", {}) == "ok"


def nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


async def test_results_nest_at_most_99_levels() -> None:
    assert await session_returning(nested(99)).dispatch("t", {}) == nested(99)
    # (Deeper than a few thousand levels, Pyodide cannot even free such a value; json's C
    # encoder overflows the JS stack a little deeper still: the depth rule runs first.)
    for depth in (100, 5000):
        result = await session_returning(nested(depth)).dispatch("t", {})
        assert result["error"]["code"] == "TOOL_RESULT_INVALID"
        assert "nests deeper than 99 levels" in result["error"]["message"]
        assert result["error"]["details"]["path"] == "$" + "[0]" * 99


async def test_a_huge_exception_text_is_clipped_in_the_error_result() -> None:
    session = Session()

    def verbose() -> None:
        raise ValueError("x" * 5000)

    session.on_tool("t", verbose)
    message = (await session.dispatch("t", {}))["error"]["message"]
    assert message == "ValueError: " + "x" * 200 + "… (4800 more characters)"


async def test_a_schema_the_validator_cannot_apply_is_an_error_result_not_a_crash() -> None:
    # A subschema with its own $id takes the reference check out of definition time;
    # jsonschema then fails on the dangling reference at every call.
    schema = {"$defs": {"a": {"$id": "https://tools.example/a", "type": "object"}},
              "$ref": "#/$defs/missing"}
    runs: list[Any] = []
    session = Session([define_tool(name="t", description="d", args_schema=schema,
                                   handler=runs.append)])
    result = await session.dispatch("t", {})
    assert result["error"]["code"] == "TOOL_HANDLER_ERROR"
    assert result["error"]["message"].startswith("the args_schema of 't' could not be applied")
    assert runs == []


class BrokenDict(dict):  # type: ignore[type-arg]
    def __iter__(self) -> Any:
        raise RuntimeError("lazy rows failed to load")

    def items(self) -> Any:
        raise RuntimeError("lazy rows failed to load")


class BrokenList(list):  # type: ignore[type-arg]
    def __iter__(self) -> Any:
        raise RuntimeError("cursor closed")


@pytest.mark.parametrize("value", [BrokenDict(a=1), BrokenList([1]), {"rows": [BrokenList()]}])
async def test_a_result_that_fails_while_it_is_read_is_invalid_not_a_crash(value: Any) -> None:
    """Found by probing: the exception escaped dispatch (on the wire: the result was lost)."""
    session = Session()
    session.on_tool("t", lambda: value)
    result = await session.dispatch("t", {})
    assert result["error"]["code"] == "TOOL_RESULT_INVALID"
    assert "while it was read" in result["error"]["message"]


async def test_an_explain_error_hook_that_fails_costs_only_its_hint() -> None:
    def explain(exc: BaseException) -> str:
        raise LookupError("no hint today")

    session = Session(explain_error=explain)
    session.on_tool("t", lambda: 1 / 0)
    result = await session.dispatch("t", {})
    assert result["error"] == {"code": "TOOL_HANDLER_ERROR",
                               "message": "ZeroDivisionError: division by zero"}
