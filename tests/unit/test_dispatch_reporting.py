"""The dispatch engine: behaviours of the public contract that mutation testing found
unpinned — the messages and logs users see, status events, progress timing, the delivery
ledger's calls; each test fails on a runtime that gets one of them wrong
(docs/how-to/mutation-testing.md)."""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import re
from dataclasses import astuple
from typing import Any

import pytest
from manual_clock import ManualClock
from sessionkit import approval_tool, connected, request, spin, tool, wire

from pedelec_pyodide import (
    ApprovalUnavailable,
    MemoryLedger,
    PendingRequest,
    Session,
    SessionClosedError,
    ToolContext,
    ToolProgress,
    ToolStatus,
    define_tool,
)

LEDGER_LOST = ("the delivery ledger could not record tool request {}; were the page "
               "reloaded before Core has its result, it might run again")


def logged(caplog: pytest.LogCaptureFixture, level: int = logging.WARNING
           ) -> list[tuple[str, bool]]:
    """The package's log lines at ``level`` and above: (text, with a traceback)."""
    return [(r.getMessage(), bool(r.exc_info)) for r in caplog.records
            if r.name == "pedelec_pyodide" and r.levelno >= level]


# --- the messages of refusals ---------------------------------------------------------


async def test_no_handler_and_no_approver_say_so_and_are_not_retryable() -> None:
    session = Session([approval_tool([])])
    assert await session.dispatch("nothing", {}) == {"error": {
        "code": "TOOL_HANDLER_NOT_FOUND",
        "message": "no handler for tool 'nothing': no named handler, no inline handler, "
                   "no fallback"}}
    assert await session.dispatch("delete", {"id": 1}) == {"error": {
        "code": "TOOL_DENIED",
        "message": "'delete' needs the user's approval and no approver is registered "
                   "(session.on_approval, or the page's approval event): it was not run",
        "details": {"reason": "no approver"}, "retryable": False}}

    def unavailable(request: Any) -> bool:
        raise ApprovalUnavailable("no dialog mounted")

    session.on_approval(unavailable)
    assert (await session.dispatch("delete", {"id": 1}))["error"]["message"].startswith(
        "'delete' needs the user's approval and no approver is registered")


async def test_an_approved_request_is_running_while_its_handler_runs() -> None:
    statuses: list[str] = []

    async def delete(args: Any, ctx: ToolContext) -> str:
        statuses.append(ctx.session.pending[0].status)
        return "deleted"

    session = Session([tool("delete", delete, needs_approval=True)])
    session.on_approval(lambda request: True)
    assert await session.dispatch("delete", {}) == "deleted"
    assert statuses == ["running"]


async def test_a_closed_session_refuses_a_dispatch_saying_so() -> None:
    session = Session([tool(handler=lambda: 1)])
    session.close()
    with pytest.raises(SessionClosedError) as caught:
        await session.dispatch("t", {})
    assert str(caught.value) == "the session is closed"


async def test_a_schema_that_cannot_be_applied_names_the_tool_and_the_exception(
        caplog: pytest.LogCaptureFixture) -> None:
    schema = {"$defs": {"a": {"$id": "https://tools.example/a", "type": "object"}},
              "$ref": "#/$defs/missing"}
    session = Session([define_tool(name="t", description="d", args_schema=schema,
                                   handler=lambda: 1)])
    message = (await session.dispatch("t", {}))["error"]["message"]
    # the exception's type and its own text (what is missing; jsonschema's type names vary)
    assert re.fullmatch(r"the args_schema of 't' could not be applied: \w+Error: .*missing.*",
                        message), message
    assert logged(caplog) == [("the args_schema of tool t could not be applied", True)]


# --- handler failures and their logs ---------------------------------------------------


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_a_failing_handler_is_logged_with_its_tool_and_explained(
        kind: str, caplog: pytest.LogCaptureFixture) -> None:
    def fail() -> None:
        raise KeyError("row")

    async def fail_later() -> None:
        raise KeyError("row")

    session = Session(explain_error=lambda exc: "the row is gone")
    session.on_tool("t", fail if kind == "sync" else fail_later)
    assert await session.dispatch("t", {}) == {"error": {
        "code": "TOOL_HANDLER_ERROR", "message": "KeyError: 'row' (the row is gone)"}}
    assert logged(caplog, logging.ERROR) == [("tool handler t raised", True)]


async def test_an_explain_error_hook_that_fails_is_logged_with_the_exception(
        caplog: pytest.LogCaptureFixture) -> None:
    def explain(exc: BaseException) -> str:
        raise LookupError("no hint today")

    session = Session(explain_error=explain)
    session.on_tool("t", lambda: 1 / 0)
    await session.dispatch("t", {})
    assert logged(caplog, logging.ERROR) == [
        ("tool handler t raised", True),
        ("explain_error failed on ZeroDivisionError('division by zero')", True)]


async def test_a_failing_approver_or_rule_is_logged_with_its_tool(
        caplog: pytest.LogCaptureFixture) -> None:
    def broken_rule(args: Any) -> bool:
        raise KeyError("amount")

    def broken_approver(request: Any) -> bool:
        raise RuntimeError("no dialog")

    session = Session([approval_tool([], needs_approval=broken_rule)])
    session.on_approval(broken_approver)
    result = await session.dispatch("delete", {"id": 1})
    assert result["error"]["details"] == {"reason": "the approver failed: RuntimeError"}
    assert logged(caplog, logging.ERROR) == [
        ("the needs_approval rule of tool delete failed; asking for approval", True),
        ("the approver failed on delete; denied", True)]


# --- cancel ----------------------------------------------------------------------------


async def test_cancel_messages_say_what_was_cancelled_and_when(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = ManualClock()
    release = asyncio.Event()

    async def stubborn() -> str:
        await release.wait()
        return "late"

    never: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    session = Session([approval_tool([]), tool("t", stubborn)], scheduler=clock,
                      cancel_grace=0.5)
    session.on_approval(lambda request: never)
    calls = [asyncio.ensure_future(session.dispatch(name, args, tool_request_id=name))
             for name, args in [("delete", {"id": 1}), ("t", {})]]
    await spin()
    session.cancel("delete")
    session.cancel("t", "the user left")
    clock.advance(0.5)
    release.set()
    await spin()
    assert [call.result() for call in calls] == [
        {"error": {"code": "TOOL_CANCELLED",
                   "message": "'delete' was cancelled (cancelled by the user); before it was "
                              "approved",
                   "details": {"reason": "cancelled by the user"}, "retryable": False}},
        {"error": {"code": "TOOL_CANCELLED",
                   "message": "'t' was cancelled (the user left); its handler did not finish "
                              "within 0.5 s",
                   "details": {"reason": "the user left"}, "retryable": False}}]
    assert logged(caplog) == [("tool request t (t) finished after it was answered "
                               "TOOL_CANCELLED; its outcome is not sent", False)]


async def test_the_grace_period_runs_on_the_default_scheduler_too() -> None:
    async def stubborn() -> str:
        await asyncio.Event().wait()
        return "never"

    session = Session([tool("t", stubborn)], cancel_grace=0)  # the running loop's timers
    core = connected(session)
    session.receive(request("q1"))
    await spin()
    session.cancel("q1")
    await spin()
    (answer,) = core.of_type("tool.result")
    assert answer["result"]["error"]["code"] == "TOOL_CANCELLED"
    for task in list(session._tasks.values()):
        task.cancel()
    await spin()


# --- status events and session.pending -------------------------------------------------


async def test_status_events_and_pending_name_the_request_and_its_turn() -> None:
    answer = asyncio.Event()
    pending: list[list[PendingRequest]] = []

    async def ask(args: Any, ctx: ToolContext) -> str:
        async with ctx.waiting_for_user("why"):
            pending.append(ctx.session.pending)
            await answer.wait()
        pending.append(ctx.session.pending)
        return "ok"

    session = Session([tool(handler=ask), approval_tool([])])
    session.on_approval(lambda request: True)
    seen: list[tuple[Any, ...]] = []
    session.subscribe(lambda e: seen.append(astuple(e)) if isinstance(e, ToolStatus) else None)
    connected(session)
    session.receive(request("q1", "t", turn_id="turn-1"))
    await spin()
    answer.set()
    await spin()
    session.receive(request("q2", "delete", {"id": 1}, turn_id="turn-1"))
    await spin()
    assert pending == [[PendingRequest("q1", "t", "turn-1", "waiting_for_user", None, "core")],
                       [PendingRequest("q1", "t", "turn-1", "running", None, "core")]]
    assert seen == [("q1", "t", "turn-1", status, "core")
                    for status in ["running", "waiting_for_user", "running", "done"]] + [
                   ("q2", "delete", "turn-1", status, "core")
                    for status in ["awaiting_approval", "running", "done"]]


async def test_nested_waits_send_only_the_outer_one() -> None:
    inner_done = asyncio.Event()
    statuses: list[str] = []

    async def ask(args: Any, ctx: ToolContext) -> str:
        async with ctx.waiting_for_user("outer"):
            async with ctx.waiting_for_user("inner"):
                pass
            statuses.append(ctx.session.pending[0].status)
            await inner_done.wait()
        return "ok"

    session = Session([tool(handler=ask)])
    core = connected(session)
    session.receive(request("q1"))
    await spin()
    assert statuses == ["waiting_for_user"]
    assert wire(core, "tool.waiting") == [("tool.waiting", True, "outer")]
    inner_done.set()
    await spin()
    assert wire(core, "tool.waiting") == [("tool.waiting", True, "outer"),
                                          ("tool.waiting", False, None)]


# --- progress --------------------------------------------------------------------------


async def test_a_held_value_goes_out_when_the_interval_has_passed_and_no_sooner() -> None:
    clock = ManualClock()
    release = asyncio.Event()
    contexts: list[ToolContext] = []

    async def long(args: Any, ctx: ToolContext) -> str:
        contexts.append(ctx)
        await release.wait()
        return "done"

    session = Session([tool(handler=long)], scheduler=clock)
    sent: list[float] = []
    session.subscribe(lambda e: sent.append(e.progress) if isinstance(e, ToolProgress) else None)
    call = asyncio.ensure_future(session.dispatch("t", {}))
    await spin()
    (ctx,) = contexts
    ctx.progress(1)  # t=0: sent at once
    clock.advance(0.05)
    ctx.progress(2)  # within the interval: held for the timer
    assert sent == [1]
    clock.advance(0.06)  # t=0.11: the interval since the first has passed
    assert sent == [1, 2]
    clock.advance(0.02)
    ctx.progress(3)  # t=0.13: within the interval since the second went out (0.11)
    clock.advance(0.05)
    assert sent == [1, 2]
    clock.advance(0.05)  # t=0.23
    assert sent == [1, 2, 3]
    release.set()
    assert await call == "done" and sent == [1, 2, 3]


class Count(enum.IntEnum):
    THREE = 3


class Ratio(float):
    pass


class Big(int):
    pass


@pytest.mark.parametrize(("calls", "outcomes"), [
    # numbers: finite, and integers no larger than JSON's exact ones (2**53)
    ([((2**53,), {}), ((2**53 + 1,), {})],
     ["ok", "ctx.progress: progress must be a finite number, got 9007199254740993"]),
    ([((-2**53,), {})], ["ok"]),
    ([((float("nan"),), {})], ["ctx.progress: progress must be a finite number, got nan"]),
    ([((True,), {})], ["ctx.progress: progress must be a finite number, got True"]),
    ([((Count.THREE,), {}), ((Ratio(3.5),), {})], ["ok", "ok"]),  # number subclasses
    ([((1,), {"total": 2**53}), ((2,), {"total": Big(2**53)}), ((3,), {"total": Ratio(9)})],
     ["ok", "ok", "ok"]),
    ([((1,), {"total": Ratio("inf")}), ((2,), {"total": Big(2**53 + 1)})],
     ["ctx.progress: total must be a finite number or None, got inf",
      "ctx.progress: total must be a finite number or None, got 9007199254740993"]),
    ([((1,), {"total": "ten"})],
     ["ctx.progress: total must be a finite number or None, got 'ten'"]),
    ([((1,), {"message": 5})],
     ["ctx.progress: message must be a string or None, got int"]),
    # a total or message given once may be left out afterwards
    ([((1,), {"total": 10, "message": "a"}), ((2,), {})], ["ok", "ok"]),
])
async def test_progress_values_accepted_and_refused(calls: list[Any], outcomes: list[str]
                                                    ) -> None:
    seen: list[str] = []

    def handler(args: Any, ctx: ToolContext) -> str:
        for positional, named in calls:
            try:
                ctx.progress(*positional, **named)
                seen.append("ok")
            except ValueError as exc:
                seen.append(str(exc))
        return "done"

    session = Session([tool(handler=handler)])
    assert await session.dispatch("t", {}) == "done"
    assert seen == outcomes


# --- results, timing, the delivery ledger ----------------------------------------------


async def test_the_runtime_s_own_error_result_is_sent_as_compact_json() -> None:
    session = Session()
    session.on_tool("t", lambda: {1, 2})
    call = await session.run_request("t", {})
    assert call.result["error"]["code"] == "TOOL_RESULT_INVALID"
    assert call.result_json == json.dumps(call.result, separators=(",", ":"))


async def test_a_stored_result_given_again_took_no_time() -> None:
    runs: list[int] = []
    session = Session()
    session.on_tool("t", lambda: runs.append(1) or "ok")
    first = await session.run_request("t", {}, tool_request_id="q1")
    again = await session.run_request("t", {}, tool_request_id="q1")
    assert runs == [1] and first.duration_ms >= 0
    assert (again.result, again.handled_by, again.duration_ms) == ("ok", "named", 0.0)


class RecordingLedger(MemoryLedger):
    """A ledger that says what it was told, and can fail on one kind of write."""

    def __init__(self, fail: str | None = None) -> None:
        super().__init__()
        self.fail = fail
        self.told: list[tuple[str, ...]] = []

    def _note(self, *what: str) -> None:
        self.told.append(what)
        if what[0] == self.fail:
            raise OSError("storage full")

    def start(self, tool_request_id: str, tool: str, *, resumable: bool = False) -> None:
        self._note("start", tool_request_id, tool, *["resumable"] * resumable)
        super().start(tool_request_id, tool, resumable=resumable)

    def approve(self, tool_request_id: str, tool: str) -> None:
        self._note("approve", tool_request_id, tool)
        super().approve(tool_request_id, tool)

    def finish(self, tool_request_id: str, result_json: str, handled_by: Any) -> None:
        self._note("finish", tool_request_id)
        super().finish(tool_request_id, result_json, handled_by)


async def _run_each(ledger: RecordingLedger, *, local: bool) -> list[Any]:
    async def later() -> str:
        return "later"

    session = Session([approval_tool([]), tool("sync", lambda: "now"),
                       tool("async", later, annotations={"idempotentHint": True})],
                      ledger=ledger)
    session.on_approval(lambda request: True)
    out = []
    for name, args in [("sync", {}), ("async", {}), ("delete", {"id": 1})]:
        out.append(await session.dispatch(name, args,
                                          tool_request_id=None if local else f"q-{name}"))
    return out


async def test_the_ledger_is_told_each_request_id_and_tool_and_never_a_local_one() -> None:
    ledger = RecordingLedger()
    assert await _run_each(ledger, local=True) == ["now", "later", {"deleted": 1}]
    assert ledger.told == []  # an id made here can never be re-sent: nothing to record
    assert await _run_each(ledger, local=False) == ["now", "later", {"deleted": 1}]
    assert ledger.told == [("start", "q-sync", "sync"), ("finish", "q-sync"),
                           ("start", "q-async", "async", "resumable"), ("finish", "q-async"),
                           ("approve", "q-delete", "delete"), ("start", "q-delete", "delete"),
                           ("finish", "q-delete")]


@pytest.mark.parametrize("fails", ["start", "approve", "finish"])
async def test_a_failing_ledger_write_is_logged_with_the_request_id(
        fails: str, caplog: pytest.LogCaptureFixture) -> None:
    ledger = RecordingLedger(fail=fails)
    assert await _run_each(ledger, local=False) == ["now", "later", {"deleted": 1}]
    failed = [what[1] for what in ledger.told if what[0] == fails]
    assert failed and logged(caplog) == [(LEDGER_LOST.format(i), True) for i in failed]
