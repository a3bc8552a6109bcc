"""Interactive tools: behaviours of the public contract (ToolContext, ApprovalRequest,
progress, waiting, cancel, ``session.pending``) that mutation testing found unpinned; each
test fails on a runtime that gets one of them wrong (docs/how-to/mutation-testing.md)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sessionkit import approval_tool, connected, request, spin, tool
from web_storage import DictStorage

from pedelec_pyodide import ApprovalRequest, Session, StorageLedger, ToolContext

# --- ApprovalRequest -------------------------------------------------------------------


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
    for task in first._tasks:  # the tab goes away while the handler runs
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
