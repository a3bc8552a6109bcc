"""Interactive and long-running tools: progress, waiting for the user, approval, cancel,
``session.pending`` — in the Session and on the wire (a fake Core, a manual clock)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from manual_clock import ManualClock
from sessionkit import (
    WELCOME,
    FakeCore,
    approval_tool,
    browser_page,
    connected,
    request,
    spin,
    tool,
    wire,
)
from web_storage import DictStorage

import pedelec_pyodide
from pedelec_pyodide import (
    ApprovalRequest,
    ApprovalUnavailable,
    PedelecError,
    Session,
    SessionState,
    StorageLedger,
    ToolCall,
    ToolContext,
    ToolProgress,
    ToolStatus,
    define_tool,
)
from pedelec_pyodide.dispatch import MAX_STATUS_TEXT, PROGRESS_INTERVAL

# --- progress ------------------------------------------------------------------------------


def test_progress_is_throttled_and_the_last_value_goes_before_the_result() -> None:
    clock = ManualClock()

    def work(args: Any, ctx: ToolContext) -> str:
        for n in range(1, 1001):
            ctx.progress(n, 1000, f"step {n}")
        return "done"

    session = Session([tool(handler=work)], scheduler=clock)
    core = connected(session)
    session.receive(request("q1"))
    assert wire(core, "tool.progress", "tool.result") == [
        ("tool.progress", 1, 1000, "step 1"),
        ("tool.progress", 1000, 1000, "step 1000"),
        ("tool.result", "done"),
    ]
    assert clock.waiting == 0  # the flush timer was cancelled with the answer


async def test_progress_within_the_interval_keeps_the_latest_for_the_timer() -> None:
    clock = ManualClock()
    step = asyncio.Event()
    release = asyncio.Event()
    seen: list[Any] = []

    async def work(args: Any, ctx: ToolContext) -> str:
        ctx.progress(1)
        await step.wait()
        ctx.progress(2)
        ctx.progress(3, message="third")
        await release.wait()
        return "ok"

    session = Session([tool(handler=work)], scheduler=clock)
    session.subscribe(lambda e: seen.append(e) if isinstance(e, ToolProgress) else None)
    core = connected(session)
    session.receive(request("q1", turn_id="turn-1"))
    await spin()
    step.set()
    await spin()
    assert wire(core, "tool.progress") == [("tool.progress", 1, None, None)]
    assert session.pending[0].progress == {"progress": 3, "total": None, "message": "third"}
    clock.advance(PROGRESS_INTERVAL / 2)
    assert len(wire(core, "tool.progress")) == 1
    clock.advance(PROGRESS_INTERVAL / 2)
    assert wire(core, "tool.progress")[-1] == ("tool.progress", 3, None, "third")
    release.set()
    await spin()
    assert wire(core, "tool.progress", "tool.result")[-2:] == [
        ("tool.progress", 3, None, "third"), ("tool.result", "ok")]
    assert [(e.tool_request_id, e.tool, e.turn_id, e.progress) for e in seen] == [
        ("q1", "t", "turn-1", 1), ("q1", "t", "turn-1", 3)]


@pytest.mark.parametrize(("call", "match"), [
    (lambda ctx: (ctx.progress(2), ctx.progress(2)), "must increase: 2 after 2"),
    (lambda ctx: (ctx.progress(2), ctx.progress(1)), "must increase: 1 after 2"),
    (lambda ctx: ctx.progress(float("nan")), "finite number"),
    (lambda ctx: ctx.progress(True), "finite number"),
    (lambda ctx: ctx.progress("1"), "finite number"),
    (lambda ctx: ctx.progress(2**60), "finite number"),  # beyond a double: the wire refuses it
    (lambda ctx: ctx.progress(1, float("inf")), "total must be"),
    (lambda ctx: ctx.progress(1, message=3), "message must be"),
])
@pytest.mark.parametrize("armed", [False, True])
async def test_bad_progress_is_a_value_error_in_the_handler(call: Any, match: str,
                                                            armed: bool) -> None:
    caught: list[BaseException] = []

    def work(args: Any, ctx: ToolContext) -> str:
        if armed:  # the throttle's timer armed: the steady state's fast path checks too
            ctx.progress(0.25)
            ctx.progress(0.5)
        try:
            call(ctx)
        except ValueError as exc:
            caught.append(exc)
        return "ok"

    session = Session([tool(handler=work)], scheduler=ManualClock())
    assert await session.dispatch("t", {}) == "ok"
    assert len(caught) == 1 and match in str(caught[0])


async def test_progress_message_is_cut_and_progress_after_the_answer_is_ignored() -> None:
    kept: list[ToolContext] = []

    def work(args: Any, ctx: ToolContext) -> str:
        kept.append(ctx)
        ctx.progress(1, message="x" * (MAX_STATUS_TEXT + 50))
        return "ok"

    session = Session([tool(handler=work)], scheduler=ManualClock())
    core = connected(session)
    session.receive(request("q1"))
    kept[0].progress(2)  # answered already: nothing to tell Core (it would refuse it)
    progress = core.of_type("tool.progress")
    assert len(progress) == 1 and len(progress[0]["message"]) == MAX_STATUS_TEXT


async def test_a_local_dispatch_reports_progress_to_listeners_not_to_core() -> None:
    seen: list[Any] = []
    session = Session([tool(handler=lambda args, ctx: ctx.progress(5, 10))],
                      scheduler=ManualClock())
    core = connected(session)
    session.subscribe(seen.append)
    await session.dispatch("t", {})
    assert core.of_type("tool.progress") == []
    assert [e.progress for e in seen if isinstance(e, ToolProgress)] == [5]


# --- waiting for the user ------------------------------------------------------------------


async def test_waiting_for_user_sends_waiting_true_then_false_even_on_an_exception() -> None:
    answer = asyncio.Event()
    statuses: list[str] = []

    async def ask(args: Any, ctx: ToolContext) -> str:
        async with ctx.waiting_for_user("confirm the address"):
            statuses.append(ctx.session.pending[0].status)
            await answer.wait()
            raise RuntimeError("the dialog broke")

    session = Session([tool(handler=ask)])
    core = connected(session)
    session.receive(request("q1"))
    await spin()
    assert statuses == ["waiting_for_user"]
    assert wire(core, "tool.waiting") == [("tool.waiting", True, "confirm the address")]
    answer.set()
    await spin()
    assert wire(core, "tool.waiting", "tool.result")[1:] == [
        ("tool.waiting", False, None),
        ("tool.result", {"error": {"code": "TOOL_HANDLER_ERROR",
                                   "message": "RuntimeError: the dialog broke"}})]


async def test_a_resumed_connection_tells_core_again_what_is_waiting_and_how_far() -> None:
    answer = asyncio.Event()

    async def ask(args: Any, ctx: ToolContext) -> str:
        ctx.progress(7, 9)
        async with ctx.waiting_for_user():
            await answer.wait()
        return "ok"

    session = Session([tool(handler=ask)], scheduler=ManualClock())
    connected(session)
    session.receive(request("q1"))
    await spin()
    session.connection_lost()
    core = FakeCore()
    session.connection_made(core)
    session.receive(WELCOME)
    assert wire(core, "tool.waiting", "tool.progress") == [
        ("tool.waiting", True, None), ("tool.progress", 7, 9, None)]
    answer.set()
    await spin()
    assert core.of_type("tool.result")[0]["result"] == "ok"


# --- approval ------------------------------------------------------------------------------


async def test_an_approved_request_runs_after_the_approver_said_yes() -> None:
    runs: list[Any] = []
    asked: list[ApprovalRequest] = []
    session = Session([approval_tool(runs)])
    session.on_approval(lambda request: asked.append(request) or True)
    core = connected(session)
    session.receive(request("q1", "delete", {"id": 3}, turn_id="turn-1"))
    await spin()
    assert [(r.tool, r.args, r.tool_request_id, r.turn_id) for r in asked] == [
        ("delete", {"id": 3}, "q1", "turn-1")]
    assert runs == [3]
    assert wire(core, "tool.waiting", "tool.result") == [
        ("tool.waiting", True, "approval"), ("tool.waiting", False, None),
        ("tool.result", {"deleted": 3})]


async def test_args_are_validated_and_the_handler_found_before_anyone_is_asked() -> None:
    runs: list[Any] = []
    asked: list[Any] = []
    session = Session([approval_tool(runs)])
    session.on_approval(lambda request: asked.append(request) or True)
    result = await session.dispatch("delete", {"id": "x"})
    assert result["error"]["code"] == "INVALID_ARGS"
    session.on_tool(lambda: "fallback")
    assert await session.dispatch("unknown", {}) == "fallback"  # no definition: no approval
    assert asked == [] and runs == []


@pytest.mark.parametrize(("approver", "reason"), [
    (lambda request: False, "denied"),
    (lambda request: request.deny("not on Fridays"), "not on Fridays"),
    (lambda request: 1, "denied"),  # only True approves
])
async def test_a_denied_request_is_tool_denied_and_never_runs(approver: Any, reason: str
                                                              ) -> None:
    runs: list[Any] = []
    session = Session([approval_tool(runs)])
    session.on_approval(approver)
    result = await session.dispatch("delete", {"id": 1})
    assert result["error"]["code"] == "TOOL_DENIED"
    assert result["error"]["retryable"] is False
    assert result["error"]["details"] == {"reason": reason}
    assert runs == []


@pytest.mark.parametrize("approver", [None, "unavailable"])
async def test_no_approver_denies_saying_so(approver: Any) -> None:
    runs: list[Any] = []
    session = Session([approval_tool(runs)])
    if approver == "unavailable":
        def unavailable(request: ApprovalRequest) -> bool:
            raise ApprovalUnavailable("no dialog mounted")
        session.on_approval(unavailable)
    result = await session.dispatch("delete", {"id": 1})
    assert result["error"]["code"] == "TOOL_DENIED"
    assert "no approver is registered" in result["error"]["message"]
    assert runs == []


async def test_a_failing_approver_denies_and_a_failing_rule_asks() -> None:
    runs: list[Any] = []

    def broken_rule(args: Any) -> bool:
        raise KeyError("oops")

    session = Session([approval_tool(runs, needs_approval=broken_rule)])
    asked: list[Any] = []
    session.on_approval(lambda request: asked.append(request) or True)
    assert await session.dispatch("delete", {"id": 1}) == {"deleted": 1}
    assert len(asked) == 1

    def broken(request: ApprovalRequest) -> bool:
        raise RuntimeError("boom")

    session.on_approval(broken)
    result = await session.dispatch("delete", {"id": 2})
    assert result["error"]["details"]["reason"] == "the approver failed: RuntimeError"
    assert runs == [1]


async def test_needs_approval_may_depend_on_the_args() -> None:
    runs: list[Any] = []
    session = Session([approval_tool(runs, needs_approval=lambda args: args["id"] > 10)])
    session.on_approval(lambda request: False)
    assert await session.dispatch("delete", {"id": 1}) == {"deleted": 1}
    assert (await session.dispatch("delete", {"id": 11}))["error"]["code"] == "TOOL_DENIED"
    assert runs == [1]


def test_an_async_needs_approval_function_is_refused_when_the_tool_is_defined() -> None:
    """Its coroutine would be truthy and never awaited: every call asked, whatever it
    would have said, and a "never awaited" warning."""
    async def rule(args: Any) -> bool:
        return False

    with pytest.raises(ValueError, match="needs_approval must be a plain function"):
        tool("t", needs_approval=rule)


async def test_awaiting_approval_is_pending_and_the_session_waits() -> None:
    runs: list[Any] = []
    decision: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    statuses: list[Any] = []
    session = Session([approval_tool(runs)])
    session.subscribe(lambda e: statuses.append(e.status) if isinstance(e, ToolStatus) else None)
    session.on_approval(lambda request: decision)
    connected(session)
    session.receive(request("q1", "delete", {"id": 5}))
    await spin()
    assert session.state == SessionState.WAITING_TOOL_RESULT
    assert [(p.tool_request_id, p.status, p.progress) for p in session.pending] == [
        ("q1", "awaiting_approval", None)]
    decision.set_result(True)
    await spin()
    assert runs == [5] and session.pending == [] and session.state == SessionState.IDLE
    assert statuses == ["awaiting_approval", "running", "done"]


# The first tab's approval coroutine never finishes: that is the point (the tab is gone).
@pytest.mark.filterwarnings("ignore:coroutine .* was never awaited:RuntimeWarning")
async def test_a_reload_while_awaiting_approval_asks_again_and_runs_once() -> None:
    storage = DictStorage()
    runs: list[Any] = []
    first = Session([approval_tool(runs)], ledger=StorageLedger(storage, "p:"))
    first.on_approval(lambda request: asyncio.get_running_loop().create_future())  # never
    connected(first)
    first.receive(request("q1", "delete", {"id": 4}))
    await spin()
    assert first.pending[0].status == "awaiting_approval"
    for task in list(first._tasks.values()):  # the tab goes away with the approval card on screen
        task.cancel()
    await spin()

    asked: list[Any] = []
    reloaded = Session([approval_tool(runs)], ledger=StorageLedger(storage, "p:"))
    reloaded.on_approval(lambda request: asked.append(request.tool_request_id) or True)
    core = connected(reloaded)
    reloaded.receive(request("q1", "delete", {"id": 4}))  # Core re-sends it on resume
    await spin()
    assert asked == ["q1"] and runs == [4]
    reloaded.receive(request("q1", "delete", {"id": 4}))  # and again: its stored result
    assert [r["result"] for r in core.of_type("tool.result")] == [{"deleted": 4}] * 2
    assert asked == ["q1"] and runs == [4]


@pytest.mark.filterwarnings("ignore:coroutine .* was never awaited:RuntimeWarning")
async def test_an_approval_given_is_not_asked_again_after_a_reload() -> None:
    storage = DictStorage()
    runs: list[Any] = []

    async def delete(id: int) -> int:
        """Delete a note."""
        runs.append(id)
        return id

    delete_tool = define_tool(delete, needs_approval=True)
    asked: list[str] = []
    decision: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

    def approver(request: ApprovalRequest) -> asyncio.Future[bool]:
        asked.append("first")
        request.approve()  # as the page's approve() button does, before the loop resumes
        return decision

    first = Session([delete_tool], ledger=StorageLedger(storage, "p:"))
    first.on_approval(approver)
    connected(first)
    first.receive(request("q1", "delete", {"id": 8}))
    await spin()
    # approved; the page reloads before the handler ran
    assert asked == ["first"] and runs == []
    ledger = StorageLedger(storage, "p:")
    assert ledger.was_approved("q1") and not ledger.was_started("q1")
    for task in list(first._tasks.values()):
        task.cancel()
    await spin()

    reloaded = Session([delete_tool], ledger=StorageLedger(storage, "p:"))
    reloaded.on_approval(lambda request: asked.append("again") or False)
    core = connected(reloaded)
    reloaded.receive(request("q1", "delete", {"id": 8}))
    await spin()
    assert asked == ["first"] and runs == [8]
    assert core.of_type("tool.result")[0]["result"] == 8


def test_on_approval_keeps_one_approver_and_its_disposer_removes_only_its_own() -> None:
    session = Session()
    first = session.on_approval(lambda request: True)
    second_handler = lambda request: False  # noqa: E731
    session.on_approval(second_handler)
    first()  # not current: nothing happens
    assert session._engine.approver is second_handler
    with pytest.raises(TypeError):
        session.on_approval("yes")  # type: ignore[arg-type]


# --- cancel --------------------------------------------------------------------------------


async def test_cancel_sets_cancelled_and_a_handler_that_stops_in_time_answers_itself() -> None:
    clock = ManualClock()
    stop = asyncio.Event()

    async def long(args: Any, ctx: ToolContext) -> Any:
        await stop.wait()
        return {"stopped": ctx.cancelled}

    session = Session([tool(handler=long)], scheduler=clock)
    core = connected(session)
    session.receive(request("q1"))
    await spin()
    assert session.cancel("q1") is True
    assert session.cancel("nope") is False
    stop.set()
    await spin()
    assert core.of_type("tool.result")[0]["result"] == {"stopped": True}
    assert clock.waiting == 0


async def test_a_handler_past_the_grace_period_is_answered_cancelled_and_its_outcome_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock()
    release = asyncio.Event()
    storage = DictStorage()

    async def stubborn(args: Any, ctx: ToolContext) -> str:
        await release.wait()
        return "late"

    session = Session([tool(handler=stubborn)], scheduler=clock, cancel_grace=0.5,
                      ledger=StorageLedger(storage, "p:"))
    core = connected(session)
    session.receive(request("q1"))
    await spin()
    session.cancel("q1", "the user pressed Stop")
    clock.advance(0.4)
    assert core.of_type("tool.result") == []
    clock.advance(0.1)
    (answer,) = core.of_type("tool.result")
    assert answer["result"]["error"]["code"] == "TOOL_CANCELLED"
    assert answer["result"]["error"]["details"] == {"reason": "the user pressed Stop"}
    assert answer["handledBy"] == "named" or answer["handledBy"] == "inline"
    assert session.pending == [] and session.state == SessionState.IDLE
    release.set()
    await spin()
    assert len(core.of_type("tool.result")) == 1
    assert "finished after it was answered TOOL_CANCELLED" in caplog.text
    session.receive(request("q1"))  # re-sent: the cancellation is its answer
    assert core.of_type("tool.result")[1] == answer


@pytest.mark.parametrize("via", ["dispatch", "run_request"])
async def test_a_local_call_cancelled_past_the_grace_period_returns_then_not_with_its_handler(
    via: str, caplog: pytest.LogCaptureFixture,
) -> None:
    """``dispatch`` (and ``run_request``) return ``TOOL_CANCELLED`` once the grace period
    has passed, as Core's caller gets it, while a handler that ignores ``ctx.cancelled``
    goes on; its late outcome is logged, not returned."""
    clock = ManualClock()
    release = asyncio.Event()

    async def stubborn(args: Any, ctx: ToolContext) -> str:
        await release.wait()
        return "late"

    session = Session([tool(handler=stubborn)], scheduler=clock, cancel_grace=0.5)
    run = session.dispatch if via == "dispatch" else session.run_request
    call = asyncio.ensure_future(run("t", {}, tool_request_id="q1"))
    await spin()
    assert session.cancel("q1", "the user pressed Stop") is True
    clock.advance(0.5)
    await spin()
    assert call.done()
    result = call.result() if via == "dispatch" else call.result().result
    assert result["error"]["code"] == "TOOL_CANCELLED"
    assert result["error"]["details"] == {"reason": "the user pressed Stop"}
    assert session.pending == [] and session.state == SessionState.IDLE
    release.set()
    await spin()
    assert "finished after it was answered TOOL_CANCELLED" in caplog.text


async def test_a_local_call_awaiting_approval_then_running_is_cancelled_the_same_way() -> None:
    clock = ManualClock()
    release = asyncio.Event()

    async def stubborn(args: Any, ctx: ToolContext) -> str:
        await release.wait()
        return "late"

    session = Session([tool(handler=stubborn, needs_approval=True)], scheduler=clock,
                      cancel_grace=0.5)
    session.on_approval(lambda request: True)
    call = asyncio.ensure_future(session.dispatch("t", {}, tool_request_id="q1"))
    await spin()
    assert session.pending[0].status == "running"
    session.cancel("q1")
    clock.advance(0.5)
    await spin()
    assert call.done() and call.result()["error"]["code"] == "TOOL_CANCELLED"
    release.set()
    await spin()


async def test_a_cancelled_caller_of_dispatch_cancels_its_request() -> None:
    """The caller gives up (``asyncio.timeout``, a cancelled task): the handler sees
    ``ctx.cancelled`` and its request is settled, never left in flight."""
    clock = ManualClock()
    seen: list[bool] = []

    async def polite(args: Any, ctx: ToolContext) -> str:
        while not ctx.cancelled:
            await asyncio.sleep(0)
        seen.append(True)
        return "stopped"

    session = Session([tool(handler=polite)], scheduler=clock)
    answered: list[ToolCall] = []
    session.subscribe(lambda event: isinstance(event, ToolCall) and answered.append(event))
    call = asyncio.ensure_future(session.dispatch("t", {}))
    await spin()
    call.cancel()
    await spin()
    assert call.cancelled() and seen == [True]
    assert [c.result for c in answered] == ["stopped"] and session.pending == []


@pytest.mark.parametrize("by", ["user", "core"])
async def test_cancelling_a_request_awaiting_approval_answers_it_at_once(by: str) -> None:
    runs: list[Any] = []
    session = Session([approval_tool(runs)])
    never: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    session.on_approval(lambda request: never)
    core = connected(session)
    session.receive(request("q1", "delete", {"id": 1}))
    await spin()
    if by == "user":
        session.cancel("q1")
    else:
        session.receive('{"type":"tool.cancel","toolRequestId":"q1","reason":"deadline"}')
    await spin()
    answers = core.of_type("tool.result")
    if by == "user":
        (answer,) = answers
        assert answer["result"]["error"]["code"] == "TOOL_CANCELLED"
    else:  # Core answered its caller already and would refuse a result
        assert answers == []
    assert never.cancelled() and runs == [] and session._tasks == {}
    assert session.pending == [] and session.state == SessionState.IDLE


class ReentrantCore(FakeCore):
    """A transport whose ``send`` of the first ``tool.result`` runs ``react`` before it
    returns (a transport may be anything with ``send``)."""

    def __init__(self, react: Any) -> None:
        super().__init__()
        self.react: Any = react

    def send(self, frame: str) -> None:
        super().send(frame)
        if json.loads(frame)["type"] == "tool.result" and self.react is not None:
            react, self.react = self.react, None
            react()


@pytest.mark.parametrize("then", ["core cancels", "session closes"])
async def test_a_transport_reentering_the_session_as_a_result_goes_out_answers_once(
        then: str) -> None:
    """A denial's result is sent while its request is still awaiting approval: a cancel or
    a close that its send runs finds it answered (it was answered twice, and the second
    answer raised ``KeyError`` in the request's task)."""
    runs: list[Any] = []
    session = Session([approval_tool(runs)])
    session.on_approval(lambda request: False)
    cancel = '{"type":"tool.cancel","toolRequestId":"q1","reason":"deadline"}'
    core = ReentrantCore(lambda: session.receive(cancel) if then == "core cancels"
                         else session.close())
    session.connection_made(core)
    session.receive(WELCOME)
    errors: list[Any] = []
    asyncio.get_running_loop().set_exception_handler(lambda loop, context: errors.append(context))
    session.receive(request("q1", "delete", {"id": 1}))
    await spin()
    (answer,) = core.of_type("tool.result")
    assert answer["result"]["error"]["code"] == "TOOL_DENIED"
    assert errors == [] and runs == [] and session.pending == []
    assert session._engine.ledger.get("q1") is not None


async def test_a_result_whose_send_is_interrupted_is_kept_for_the_request_sent_again() -> None:
    """A KeyboardInterrupt out of the transport's ``send`` (Ctrl-C in a CPython session):
    the result is kept all the same, so the request Core sends again after a reconnect is
    answered from it, not left in flight for ever nor run twice."""
    runs: list[Any] = []
    session = Session([tool("t", lambda args: runs.append(1) or "ran")])

    class Interrupted(FakeCore):
        def send(self, frame: str) -> None:
            super().send(frame)
            if json.loads(frame)["type"] == "tool.result":
                raise KeyboardInterrupt

    session.connection_made(Interrupted())
    session.receive(WELCOME)
    with pytest.raises(KeyboardInterrupt):
        session.receive(request("r1", "t"))
    session.connection_lost()
    core = connected(session)
    session.receive(request("r1", "t"))
    await spin()
    assert [frame["result"] for frame in core.of_type("tool.result")] == ["ran"]
    assert runs == [1] and session.pending == []


async def test_closing_the_session_settles_every_request_in_flight() -> None:
    clock = ManualClock()
    runs: list[Any] = []
    asked: list[ApprovalRequest] = []
    never: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    seen: list[bool] = []

    def approver(request: ApprovalRequest) -> Any:
        asked.append(request)
        return never

    async def stubborn(args: Any, ctx: ToolContext) -> str:
        await asyncio.Event().wait()  # ignores ctx.cancelled: only the grace ends it
        return "late"

    async def polite(args: Any, ctx: ToolContext) -> str:
        while not ctx.cancelled:
            await asyncio.sleep(0)
        seen.append(ctx.cancelled)
        return "stopped"

    session = Session([approval_tool(runs), tool("stubborn", stubborn),
                       tool("polite", polite)], scheduler=clock, cancel_grace=0.5)
    session.on_approval(approver)
    answered: list[Any] = []
    session.subscribe(lambda event: isinstance(event, ToolCall) and answered.append(event))
    calls = [asyncio.ensure_future(session.dispatch(name, args, tool_request_id=name))
             for name, args in [("delete", {"id": 1}), ("polite", {})]]
    session.receive(request("stubborn", "stubborn"))
    await spin()
    assert {p.tool: p.status for p in session.pending} == {
        "delete": "awaiting_approval", "polite": "running", "stubborn": "running"}
    session.close()
    (asking,) = asked
    # the approval is withdrawn at once: answered, its approver's wait cancelled
    assert asking.withdrawn and {p.tool for p in session.pending} == {"polite", "stubborn"}
    await spin()
    assert calls[0].result()["error"]["code"] == "TOOL_CANCELLED"
    assert calls[0].result()["error"]["details"] == {"reason": "the session was closed"}
    assert never.cancelled()
    assert asking.approve() is True and not asking.approved  # a late verdict: ignored
    assert runs == [] and calls[1].result() == "stopped" and seen == [True]
    assert [p.tool for p in session.pending] == ["stubborn"]
    clock.advance(0.5)  # the stubborn handler: answered once the grace period has passed
    assert [call.tool for call in answered] == ["delete", "polite", "stubborn"]
    assert answered[0].result["error"]["details"] == {"reason": "the session was closed"}
    assert answered[2].result["error"]["code"] == "TOOL_CANCELLED"
    assert session.pending == [] and clock.waiting == 0


def test_cancel_grace_must_be_a_number_of_seconds() -> None:
    with pytest.raises(ValueError, match="cancel_grace"):
        Session(cancel_grace=-1)


# --- structure -----------------------------------------------------------------------------


def test_an_async_request_is_answered_with_no_event_loop_running() -> None:
    """The adapter's scheduler spawns the work; the Session never asks for a loop."""
    clock = ManualClock(collect_tasks=True)

    async def slow(args: Any) -> str:
        return "answered"

    session = Session([tool(handler=slow)], scheduler=clock)
    core = connected(session)
    session.receive(request("q1"))
    (work,) = clock.collected
    with pytest.raises(StopIteration):
        work.send(None)
    assert core.of_type("tool.result")[0]["result"] == "answered"


def test_the_adapter_is_told_of_welcome_refusal_and_close() -> None:
    told: list[str] = []

    class Adapter(FakeCore):
        def welcomed(self, welcome: Any) -> None:
            told.append(f"welcomed {welcome.session_id}")

        def refused(self, error: Any) -> None:
            told.append(f"refused {error.code}")

        def session_closed(self) -> None:
            told.append("closed")

    session = Session()
    adapter = Adapter()
    session.subscribe(lambda event: None)  # the user's listeners are not the adapter's
    session.connection_made(adapter, adapter)
    session.receive(json.dumps({"type": "error", "code": "UNKNOWN_SESSION", "message": "m"}))
    session.receive(WELCOME)
    session.receive(json.dumps({"type": "error", "code": "LATER", "message": "m"}))
    session.close()
    assert told == ["refused UNKNOWN_SESSION", "welcomed s1", "closed"]


def test_every_exception_of_the_package_is_a_pedelec_error_and_exported() -> None:
    exported = [getattr(pedelec_pyodide, name) for name in pedelec_pyodide.__all__]
    errors = [item for item in exported
              if isinstance(item, type) and issubclass(item, BaseException)]
    assert len(errors) >= 10
    assert all(issubclass(error, PedelecError) for error in errors)


async def test_a_resumed_connection_tells_core_again_that_an_approval_is_asked() -> None:
    runs: list[Any] = []
    session = Session([approval_tool(runs)])
    decision: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    session.on_approval(lambda request: decision)
    connected(session)
    session.receive(request("q1", "delete", {"id": 2}))
    await spin()
    session.connection_lost()
    core = FakeCore()
    session.connection_made(core)
    session.receive(WELCOME)
    assert wire(core, "tool.waiting") == [("tool.waiting", True, "approval")]
    decision.set_result(True)
    await spin()
    assert wire(core, "tool.waiting", "tool.result") == [
        ("tool.waiting", True, "approval"), ("tool.waiting", False, None),
        ("tool.result", {"deleted": 2})]


# --- the page's JS approver (browser.PageSession, with a stand-in for the js module) -------


@pytest.fixture
def page_session(monkeypatch: pytest.MonkeyPatch) -> Any:
    return browser_page(monkeypatch)


async def test_the_page_asks_its_js_only_once_ready_and_takes_its_decisions(
    page_session: Any,
) -> None:
    page, runs = page_session, []
    page.session.add_tool(approval_tool(runs))
    core = connected(page.session)
    asked = lambda: [d for kind, d in page.emitted if kind == "approval"]  # noqa: E731
    page.session.receive(request("q1", "delete", {"id": 1}, turn_id="turn-1"))
    await spin()
    # a request Core re-sends as the page reloads: the app's listeners are not there yet
    assert asked() == [] and page.session.pending[0].status == "awaiting_approval"
    page.ready()
    await spin()
    assert asked() == [{"toolRequestId": "q1", "tool": "delete", "args": {"id": 1},
                        "turnId": "turn-1", "source": "core"}]
    assert page.decide("q1", '{"approved": true}') is True
    assert page.decide("q1", '{"approved": false}') is False  # decided already
    await spin()
    assert runs == [1]

    page.session.receive(request("q2", "delete", {"id": 2}))
    await spin()
    page.decide("q2", '{"approved": false, "reason": "keep it"}')
    page.session.receive(request("q3", "delete", {"id": 3}))
    await spin()
    page.decide("q3", '{"approved": false, "noApprover": true}')  # nothing listens in JS
    await spin()
    denied, nobody = (r["result"]["error"] for r in core.of_type("tool.result")[1:])
    assert denied["details"] == {"reason": "keep it"}
    assert nobody["details"] == {"reason": "no approver"}
    assert runs == [1]
    assert json.loads(page.pending()) == []
    assert page.cancel("q9") is False


async def test_closing_the_page_withdraws_the_approval_its_js_is_asked(
    page_session: Any,
) -> None:
    page, runs = page_session, []
    page.session.add_tool(approval_tool(runs))
    page.ready()
    page.session.receive(request("q1", "delete", {"id": 1}))  # no connection: answer dropped
    await spin()
    assert [kind for kind, _ in page.emitted][-1] == "approval"
    page.close()
    # the page hears it settled at once (its question taken down first), and a verdict
    # given now is refused
    kinds = [kind for kind, _ in page.emitted]
    withdrawn = kinds.index("approvalwithdrawn")
    assert page.emitted[withdrawn][1] == {
        "toolRequestId": "q1", "tool": "delete", "args": {"id": 1}, "turnId": None,
        "source": "core"}
    assert withdrawn < page.emitted.index(("toolstatus", {
        "toolRequestId": "q1", "tool": "delete", "turnId": None, "status": "done",
        "source": "core"}))
    assert ("statechange", {"state": "closed", "id": None}) in page.emitted
    assert page.decide("q1", '{"approved": true}') is False
    await spin()
    assert kinds.count("approvalwithdrawn") == 1 == [
        kind for kind, _ in page.emitted].count("approvalwithdrawn")
    assert page.decide("q1", '{"approved": true}') is False
    await spin()
    assert runs == [] and json.loads(page.pending()) == []


async def test_a_core_cancel_during_approval_takes_the_question_down_before_done(
    page_session: Any,
) -> None:
    """The caller hung up (Core sends tool.cancel): the page hears approvalwithdrawn, then
    the request's done and its call, in that order, and each once."""
    page, runs = page_session, []
    page.session.add_tool(approval_tool(runs))
    page.ready()
    core = connected(page.session)
    page.session.receive(request("q1", "delete", {"id": 1}))
    await spin()
    page.emitted.clear()
    page.session.receive(json.dumps({"type": "tool.cancel", "toolRequestId": "q1",
                                     "reason": "the caller hung up"}))
    await spin()
    kinds = [kind for kind, _ in page.emitted if kind != "statechange"]
    assert kinds == ["approvalwithdrawn", "toolstatus", "toolcall"], page.emitted
    (call,) = [detail for kind, detail in page.emitted if kind == "toolcall"]
    assert call["result"]["error"]["code"] == "TOOL_CANCELLED"
    assert core.of_type("tool.result") == []  # Core answered its caller already
    assert runs == []


# --- ApprovalRequest: its verdict ---------------------------------------------------------


async def test_an_approval_request_starts_undecided_and_records_its_verdict() -> None:
    seen: list[tuple[Any, ...]] = []

    def approver(request: ApprovalRequest) -> bool:
        seen.append((request.approved, request.withdrawn, request.reason))
        assert request.approve() is True
        seen.append((request.approved, request.withdrawn, request.reason))
        return True

    runs: list[Any] = []
    session = Session([approval_tool(runs)])
    session.on_approval(approver)
    assert await session.dispatch("delete", {"id": 2}) == {"deleted": 2}
    assert seen == [(False, False, None), (True, False, None)]
    request = ApprovalRequest("delete", {"id": 2}, "q1", None)
    assert request.deny() is False and request.reason is None and not request.approved
    assert request.deny("not now") is False and request.reason == "not now"


@pytest.mark.filterwarnings("ignore:coroutine .* was never awaited:RuntimeWarning")
async def test_approving_again_while_the_handler_runs_does_not_let_a_reload_run_it_twice(
) -> None:
    storage = DictStorage()
    runs: list[int] = []
    release = asyncio.Event()
    kept: list[ApprovalRequest] = []

    async def delete(args: Any) -> int:
        runs.append(args["id"])
        await release.wait()
        return int(args["id"])

    def approver(request: ApprovalRequest) -> bool:
        kept.append(request)
        return request.approve()

    delete_tool = tool("delete", delete, needs_approval=True)
    first = Session([delete_tool], ledger=StorageLedger(storage, "p:"))
    first.on_approval(approver)
    connected(first)
    first.receive(request("q1", "delete", {"id": 6}))
    await spin()
    assert runs == [6] and StorageLedger(storage, "p:").was_started("q1")
    kept[0].approve()  # a second click on the approval card, the handler already running
    assert StorageLedger(storage, "p:").was_started("q1")
    for task in list(first._tasks.values()):  # the tab goes away while the handler runs
        task.cancel()
    await spin()

    reloaded = Session([delete_tool], ledger=StorageLedger(storage, "p:"))
    reloaded.on_approval(lambda request: True)
    core = connected(reloaded)
    reloaded.receive(request("q1", "delete", {"id": 6}))  # Core re-sends it on resume
    await spin()
    assert runs == [6]  # never run twice: its outcome is unknown
    assert core.of_type("tool.result")[0]["result"]["error"] == {
        "code": "TOOL_OUTCOME_UNKNOWN",
        "message": "'delete' was interrupted (page reload or crash) after it started; it may "
                   "or may not have taken effect, and it is not run twice",
        "retryable": False}


# --- waiting for the user ------------------------------------------------------------------


@pytest.mark.parametrize(("reason", "kind"), [(5, "int"), (b"why", "bytes")])
async def test_waiting_for_user_refuses_a_reason_that_is_not_a_string(reason: Any, kind: str
                                                                      ) -> None:
    refused: list[str] = []

    def ask(args: Any, ctx: ToolContext) -> str:
        with pytest.raises(TypeError) as caught:
            ctx.waiting_for_user(reason)
        refused.append(str(caught.value))
        return "ok"

    session = Session([tool(handler=ask)])
    assert await session.dispatch("t", {}) == "ok"
    assert refused == [f"waiting_for_user: reason must be a string, got {kind}"]
