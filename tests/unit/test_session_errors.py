"""What a Session tells its user when a turn fails, a call is wrong or Core misbehaves:
the TurnError fields, the exceptions' words, the log lines. Each test fails on a runtime
that gets one of them wrong (mutation testing of session.py:
docs/how-to/mutation-testing.md)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import pytest
from manual_clock import ManualClock
from sessionkit import WELCOME, FakeCore, connected, request

from pedelec_pyodide import (
    NotConnectedError,
    Session,
    SessionClosedError,
    SessionState,
    ToolCall,
    ToolContext,
    ToolProgress,
    TurnError,
    define_tool,
)
from pedelec_pyodide.protocol import Welcome

LOGGER = "pedelec_pyodide"


async def finished(task: asyncio.Future[Any]) -> Any:
    """The outcome of ``task``, which must be done once the loop has run its ready work
    (no time passes): a runtime that leaves it waiting fails here instead of hanging."""
    for _ in range(20):
        if task.done():
            break
        await asyncio.sleep(0)
    assert task.done(), "still waiting"
    return task.result()


async def _turn_error(end: dict[str, Any]) -> TurnError:
    """Start a turn; Core ends it with ``end`` (plus its turnId); the TurnError raised."""
    session = Session()
    core = connected(session)
    task = asyncio.ensure_future(session.send_text("hi"))
    await asyncio.sleep(0)
    turn_id = core.of_type("turn.start")[0]["turnId"]
    session.receive(json.dumps({"type": "turn.end", "turnId": turn_id, **end}))
    with pytest.raises(TurnError) as raised:
        await finished(task)
    return raised.value


# --- TurnError ------------------------------------------------------------------------

async def test_a_failed_turn_end_with_an_error_gives_its_code_message_and_text() -> None:
    error = await _turn_error({"status": "failed", "text": "partial reply",
                               "error": {"code": "AGENT_ERROR", "message": "model down"}})
    assert (error.status, error.code, error.message, error.text) == (
        "failed", "AGENT_ERROR", "model down", "partial reply")
    assert str(error) == "turn failed: AGENT_ERROR: model down"


@pytest.mark.parametrize("status", ["failed", "cancelled"])
async def test_a_turn_end_without_an_error_object_is_named_by_its_status(status: str) -> None:
    error = await _turn_error({"status": status, "text": "so far"})
    assert (error.status, error.code, error.message, error.text) == (
        status, status.upper(), "", "so far")


async def test_an_error_object_without_a_message_gives_an_empty_message() -> None:
    error = await _turn_error({"status": "failed", "text": "",
                               "error": {"code": "AGENT_ERROR"}})
    assert (error.code, error.message) == ("AGENT_ERROR", "")


async def test_turn_lost_has_no_text_and_says_why() -> None:
    session = Session()
    connected(session)
    task = asyncio.ensure_future(session.send_text("hi"))
    await asyncio.sleep(0)
    session.connection_lost()
    session.connection_made(FakeCore())
    session.receive(json.dumps({"type": "welcome", "sessionId": "s2", "resumeToken": "t2",
                                "resumed": False, "state": "idle"}))
    with pytest.raises(TurnError) as raised:
        await finished(task)
    assert raised.value.code == "TURN_LOST" and raised.value.text == ""
    assert raised.value.message == ("the session could not be resumed, so this turn's end "
                                    "is unknown")


# --- the words of the exceptions --------------------------------------------------------

async def test_send_text_without_a_connection_says_what_it_needs() -> None:
    with pytest.raises(NotConnectedError,
                       match=r"^send_text needs a connection to Core \(see connect\(\)\)$"):
        await Session().send_text("hi")


async def test_send_text_refuses_a_lone_surrogate_and_sends_nothing() -> None:
    session = Session()
    core = connected(session)
    with pytest.raises(ValueError, match=r"^send_text: the text holds .*surrogate"):
        await session.send_text("a\ud800b")
    assert core.of_type("turn.start") == []


async def test_a_closed_session_refuses_calls_and_fails_its_open_turns() -> None:
    session = Session()
    connected(session)
    task = asyncio.ensure_future(session.send_text("hi"))
    await asyncio.sleep(0)
    session.close()
    with pytest.raises(SessionClosedError, match=r"^the session was closed$"):
        await finished(task)
    with pytest.raises(SessionClosedError, match=r"^the session is closed$"):
        await session.send_text("again")


def test_a_session_of_something_not_a_tool_names_its_type() -> None:
    with pytest.raises(TypeError, match=r"^expected a Tool \(from define_tool\), got int$"):
        Session([1])  # type: ignore[list-item]


def test_on_tool_with_a_function_and_a_second_argument_says_how_to_call_it() -> None:
    session = Session()
    with pytest.raises(TypeError, match=r"^on_tool\(handler\) takes one function; "
                                        r"on_tool\(name, handler\) two$"):
        session.on_tool(lambda *a: None, lambda *a: None)  # type: ignore[call-overload]


def test_on_approval_with_something_not_a_function_names_its_type() -> None:
    with pytest.raises(TypeError, match=r"^on_approval\(handler\): expected a function, "
                                        r"got str$"):
        Session().on_approval("yes")  # type: ignore[arg-type]


# --- what the page logs -----------------------------------------------------------------

def test_a_bad_frame_from_core_is_logged_with_the_reason(caplog: pytest.LogCaptureFixture
                                                         ) -> None:
    session = Session()
    core = connected(session)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        session.receive("{not json")
    [record] = [r for r in caplog.records if r.name == LOGGER]
    code = core.of_type("error")[0]["code"]
    assert record.getMessage().startswith("bad frame from Core: ")
    assert code in record.getMessage()


def test_an_error_from_core_is_logged_with_its_code_and_message(
        caplog: pytest.LogCaptureFixture) -> None:
    session = Session()
    connected(session)
    seen: list[Any] = []
    session.subscribe(seen.append)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        session.receive(json.dumps({"type": "error", "code": "FRAME_TOO_LARGE",
                                    "message": "over the limit"}))
    [record] = [r for r in caplog.records if r.name == LOGGER]
    assert record.getMessage() == "Core reported FRAME_TOO_LARGE: over the limit"
    assert [(e.code, e.message) for e in seen if type(e).__name__ == "Error"] == [
        ("FRAME_TOO_LARGE", "over the limit")]


def test_a_failing_transport_is_logged_with_its_exception(caplog: pytest.LogCaptureFixture
                                                          ) -> None:
    class Broken(FakeCore):
        def send(self, frame: str) -> None:
            raise OSError("socket gone")

    session = Session()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        session.connection_made(Broken())  # the hello fails to go out; nothing raises
    [record] = [r for r in caplog.records if r.name == LOGGER]
    assert record.getMessage() == "sending a frame to Core failed"
    assert record.exc_info is not None and "socket gone" in str(record.exc_info[1])


def test_a_failing_listener_is_logged_with_the_event_and_the_others_still_get_it(
        caplog: pytest.LogCaptureFixture) -> None:
    session = Session()
    seen: list[Any] = []

    def broken(event: Any) -> None:
        raise RuntimeError("listener bug")

    session.subscribe(broken)
    session.subscribe(seen.append)
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        connected(session)
    welcomes = [e for e in seen if isinstance(e, Welcome)]
    assert [w.session_id for w in welcomes] == ["s1"]
    failed = [r for r in caplog.records if r.name == LOGGER
              and r.getMessage().startswith("session listener failed on ")]
    assert any("Welcome" in r.getMessage() for r in failed)
    assert all(r.exc_info is not None and "listener bug" in str(r.exc_info[1])
               for r in failed)


# --- progress and waiting on the wire and to listeners ----------------------------------

async def test_progress_and_waiting_frames_name_their_request_and_listeners_get_it_all(
        ) -> None:
    seen: list[ToolProgress] = []

    async def work(args: Any, ctx: ToolContext) -> str:
        ctx.progress(1, 10, "one")
        async with ctx.waiting_for_user("confirm"):
            pass
        return "done"

    session = Session([define_tool(name="t", description="d", args_schema={"type": "object"},
                                   handler=work)], scheduler=ManualClock())
    session.subscribe(lambda e: seen.append(e) if isinstance(e, ToolProgress) else None)
    core = connected(session)
    session.receive(request("q1", turn_id="turn-1"))
    for _ in range(10):
        await asyncio.sleep(0)
    assert [(f["toolRequestId"], f["progress"], f.get("total"), f.get("message"))
            for f in core.of_type("tool.progress")] == [("q1", 1, 10, "one")]
    assert [(f["toolRequestId"], f["waiting"], f.get("reason"))
            for f in core.of_type("tool.waiting")] == [("q1", True, "confirm"),
                                                       ("q1", False, None)]
    assert [(e.tool_request_id, e.turn_id, e.progress, e.total, e.message)
            for e in seen] == [("q1", "turn-1", 1, 10, "one")]
    assert core.of_type("tool.result")[0]["result"] == "done"


# --- state events: one per change -------------------------------------------------------

def test_a_state_event_comes_once_per_change() -> None:
    session = Session()
    states: list[SessionState] = []
    session.subscribe(lambda e: states.append(e) if isinstance(e, SessionState) else None)
    connected(session)
    session.receive(WELCOME)  # the same state again: no event
    assert states == [SessionState.CONNECTING, SessionState.IDLE]


async def test_a_listener_subscribed_mid_turn_gets_no_event_until_the_state_changes() -> None:
    session = Session()
    core = connected(session)
    task = asyncio.ensure_future(session.send_text("hi"))
    await asyncio.sleep(0)
    states: list[SessionState] = []
    session.subscribe(lambda e: states.append(e) if isinstance(e, SessionState) else None)
    session.receive(json.dumps({"type": "welcome", "sessionId": "s1", "resumeToken": "tok",
                                "resumed": True, "state": "running"}))
    assert states == []  # still running: the new listener reads session.state itself
    turn_id = core.of_type("turn.start")[0]["turnId"]
    session.receive(json.dumps({"type": "turn.end", "turnId": turn_id,
                                "status": "completed", "text": "ok"}))
    assert await finished(task) == "ok"
    assert states == [SessionState.IDLE]


# --- connection and resume --------------------------------------------------------------

async def test_closed_and_connected_are_false_whenever_not_so(
        caplog: pytest.LogCaptureFixture) -> None:
    release = asyncio.Event()
    session = Session([_waiting_tool(release, [])])
    assert session.closed is False and session.connected is False
    core = connected(session)
    session.receive(request("q1"))
    await asyncio.sleep(0)
    session.connection_lost()
    assert session.connected is False
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        release.set()  # its result is kept for the resume: nothing is sent meanwhile
        for _ in range(5):
            await asyncio.sleep(0)
    assert caplog.records == [] and core.of_type("tool.result") == []
    connected(session)
    session.close()
    assert session.connected is False and session.closed is True


async def test_a_resumed_welcome_re_sends_waiting_and_progress_of_core_s_requests() -> None:
    """A local dispatch in flight first (Core does not know it), then Core's request,
    which waits for the user after a progress report: after the resume both frames are
    sent again for it, naming it."""
    release = asyncio.Event()

    async def work(args: Any, ctx: ToolContext) -> str:
        ctx.progress(2, 5, "half")
        async with ctx.waiting_for_user("confirm"):
            await release.wait()
        return "done"

    session = Session([define_tool(name="t", description="d", args_schema={"type": "object"},
                                   handler=work)], scheduler=ManualClock())
    connected(session)
    local = asyncio.ensure_future(session.dispatch("t", {}))
    await asyncio.sleep(0)
    session.receive(request("q1"))
    for _ in range(5):
        await asyncio.sleep(0)
    session.connection_lost()
    core = FakeCore()
    session.connection_made(core)
    session.receive(json.dumps({"type": "welcome", "sessionId": "s1", "resumeToken": "tok",
                                "resumed": True, "state": "waiting_tool_result"}))
    assert [(f["toolRequestId"], f["waiting"]) for f in core.of_type("tool.waiting")] == [
        ("q1", True)]
    assert [(f["toolRequestId"], f["progress"], f.get("total"), f.get("message"))
            for f in core.of_type("tool.progress")] == [("q1", 2, 5, "half")]
    release.set()
    assert await finished(local) == "done"


# --- cancel, duplicates, joining a request in flight ------------------------------------

def _waiting_tool(release: asyncio.Event, runs: list[str]) -> Any:
    async def work(args: Any, ctx: ToolContext) -> str:
        runs.append(ctx.tool_request_id)
        await release.wait()
        return "done"

    return define_tool(name="t", description="d", args_schema={"type": "object"},
                       handler=work)


async def test_cancel_s_default_reason_is_in_the_tool_cancelled_result() -> None:
    clock = ManualClock()
    release = asyncio.Event()
    session = Session([_waiting_tool(release, [])], scheduler=clock, cancel_grace=1.0)
    call = asyncio.ensure_future(session.dispatch("t", {}, tool_request_id="r1"))
    await asyncio.sleep(0)
    assert session.cancel("r1")
    clock.advance(1.0)
    release.set()
    result = await finished(call)
    assert result["error"]["code"] == "TOOL_CANCELLED"
    assert result["error"]["details"]["reason"] == "cancelled by the user"


async def test_a_request_core_re_sends_while_it_runs_runs_once() -> None:
    release = asyncio.Event()
    runs: list[str] = []
    session = Session([_waiting_tool(release, runs)])
    core = connected(session)
    session.receive(request("q1"))
    await asyncio.sleep(0)
    session.receive(request("q1"))
    await asyncio.sleep(0)
    release.set()
    for _ in range(5):
        await asyncio.sleep(0)
    assert runs == ["q1"]
    assert [f["result"] for f in core.of_type("tool.result")] == ["done"]
    session.close()
    session.receive(request("q2"))  # a closed session runs nothing
    assert runs == ["q1"]


async def test_run_request_with_the_id_of_a_request_in_flight_waits_for_its_result() -> None:
    release = asyncio.Event()
    runs: list[str] = []
    session = Session([_waiting_tool(release, runs)])
    connected(session)
    session.receive(request("q1"))
    await asyncio.sleep(0)
    joined = asyncio.ensure_future(session.run_request("t", {}, tool_request_id="q1"))
    await asyncio.sleep(0)
    assert not joined.done()
    release.set()
    call = await finished(joined)
    assert (call.tool_request_id, call.result) == ("q1", "done")
    assert runs == ["q1"]


async def test_the_duration_of_core_s_request_seen_by_a_listener_is_its_own() -> None:
    calls: list[ToolCall] = []

    async def work(args: Any) -> str:
        await asyncio.sleep(0.001)  # so that it takes a time above any clock's resolution
        return "ok"

    session = Session([define_tool(name="t", description="d", args_schema={"type": "object"},
                                   handler=work)])
    session.subscribe(lambda e: calls.append(e) if isinstance(e, ToolCall) else None)
    connected(session)
    started = time.perf_counter()
    session.receive(request("q1"))
    while not calls:
        assert time.perf_counter() - started < 10, "the request never finished"
        await asyncio.sleep(0.001)
    elapsed_ms = (time.perf_counter() - started) * 1000
    [call] = calls
    assert 0 < call.duration_ms <= elapsed_ms


async def test_a_disposed_approver_leaves_the_session_without_one() -> None:
    session = Session([define_tool(name="t", description="d", args_schema={"type": "object"},
                                   handler=lambda args: "ran", needs_approval=True)])
    unasked = await session.dispatch("t", {}, tool_request_id="r1")
    assert unasked["error"]["code"] == "TOOL_DENIED"
    dispose = session.on_approval(lambda request: True)
    assert await session.dispatch("t", {}, tool_request_id="r2") == "ran"
    dispose()
    assert await session.dispatch("t", {}, tool_request_id="r3") == unasked


async def test_a_resume_re_sends_the_open_turn_past_one_that_just_ended() -> None:
    """Two turns; the first ends and the connection drops before the loop runs again:
    the resumed welcome re-sends only the open one's start."""
    session = Session()
    core = connected(session)
    first = asyncio.ensure_future(session.send_text("one"))
    second = asyncio.ensure_future(session.send_text("two"))
    await asyncio.sleep(0)
    one, two = (frame["turnId"] for frame in core.of_type("turn.start"))
    session.receive(json.dumps({"type": "turn.end", "turnId": one, "status": "completed",
                                "text": "first"}))
    session.connection_lost()
    again = FakeCore()
    session.connection_made(again)
    session.receive(json.dumps({"type": "welcome", "sessionId": "s1", "resumeToken": "tok",
                                "resumed": True, "state": "running"}))
    assert [(f["turnId"], f["text"]) for f in again.of_type("turn.start")] == [(two, "two")]
    session.receive(json.dumps({"type": "turn.end", "turnId": two, "status": "completed",
                                "text": "second"}))
    assert (await finished(first), await finished(second)) == ("first", "second")


async def test_local_dispatch_and_run_request_send_core_nothing() -> None:
    session = Session([define_tool(name="t", description="d", args_schema={"type": "object"},
                                   handler=lambda args: "ok")])
    core = connected(session)
    sent = len(core.sent)
    assert await session.dispatch("t", {}, tool_request_id="r1") == "ok"
    assert (await session.run_request("t", {}, tool_request_id="r2")).result == "ok"
    assert core.sent[sent:] == []


def test_a_cancel_grace_of_zero_is_allowed_and_nan_is_not() -> None:
    Session(cancel_grace=0)
    with pytest.raises(ValueError, match=r"^cancel_grace must be a number of seconds >= 0, "
                                         r"got nan$"):
        Session(cancel_grace=float("nan"))
