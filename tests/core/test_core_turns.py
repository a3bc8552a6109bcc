"""Turns: parallel tool calls, deltas, the step limit, cancel, one turn at a time."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import pytest
from corekit import (
    GatedTools,
    PlanAgent,
    RawClient,
    config,
    next_of,
    page_with,
    run,
    running_core,
    tool_meta,
    until,
)
from corekit import Page as PageAdapter

from pedelec_pyodide import Session, TurnError, define_tool
from pedelec_pyodide.core.agents import OfflineAgent
from pedelec_pyodide.core.agents.contract import ToolCallRequest, Turn


def test_parallel_calls_go_out_together_and_come_back_in_order() -> None:
    async def main() -> None:
        plan = [[("a", {"n": 1}), ("b", {"n": 2}), ("c", {"n": 3})], [("a", {"n": 4})]]
        async with running_core(config(agent_factory=lambda: PlanAgent(plan))) as core:
            gated = GatedTools("a", "b", "c")
            page = await PageAdapter(Session(gated.tools())).connect(core.ws_url)
            sid = page.session.session_id
            reply = asyncio.create_task(page.session.send_text("go"))
            # all three requests of the step are out before any result
            await page.wait_frame("tool.request", 3)
            for name in "abc":
                await asyncio.wait_for(gated.started[name].wait(), 10)
            assert (await core.session_info(sid))["state"] == "waiting_tool_result"
            for name in "cba":  # finish in reverse order
                gated.gates[name].set()
            text = await asyncio.wait_for(reply, 10)
            results = json.loads(text)
            assert [r["args"]["n"] for r in results] == [1, 2, 3, 4]
            assert gated.runs == Counter(a=2, b=1, c=1)
            end = page.frames("turn.end")[0]
            assert end["status"] == "completed" and end["text"] == text
            requests = page.frames("tool.request")
            assert len({r["toolRequestId"] for r in requests}) == 4
            assert {r["turnId"] for r in requests} == {end["turnId"]}
            assert (await core.session_info(sid))["state"] == "idle"

    run(main())


def test_turn_through_the_control_api_lists_its_tool_calls() -> None:
    async def main() -> None:
        plan = [[("add", {"a": 1}), ("missing", {})]]
        async with running_core(config(agent_factory=lambda: PlanAgent(plan))) as core:
            add = define_tool(name="add", description="adds one",
                              args_schema={"type": "object"},
                              handler=lambda args: {"value": args["a"] + 1})
            page = await PageAdapter(Session([add])).connect(core.ws_url)
            response = await core.turn(page.session.session_id, "hi")
            body = response.json()
            assert body["status"] == "completed"
            calls = body["toolCalls"]
            assert [(c["tool"], c["handledBy"]) for c in calls] == [
                ("add", "inline"), ("missing", "none")]
            assert calls[0]["result"] == {"value": 2}
            assert calls[1]["result"]["error"]["code"] == "TOOL_HANDLER_NOT_FOUND"
            # the page saw the turn too
            await page.wait_frame("turn.end")

    run(main())


class Looping:
    async def run(self, turn: Turn) -> str:
        while True:
            await turn.call_tools([ToolCallRequest("t", {})])


class Failing:
    async def run(self, turn: Turn) -> str:
        raise RuntimeError("the model said no")


class Talking:
    async def run(self, turn: Turn) -> str:
        for word in ("one ", "two ", "three"):
            await turn.say(word)
        return "one two three"


@pytest.mark.parametrize(("agent", "status", "code"), [
    (Looping, "failed", "STEP_LIMIT_EXCEEDED"),
    (Failing, "failed", "AGENT_ERROR"),
    (Talking, "completed", None),
])
def test_turn_endings(agent: Any, status: str, code: str | None) -> None:
    async def main() -> None:
        async with running_core(config(agent_factory=agent, max_steps=3)) as core:
            tool = define_tool(name="t", description="t", args_schema={"type": "object"},
                               handler=lambda: 1)
            page = await PageAdapter(Session([tool])).connect(core.ws_url)
            if status == "completed":
                assert await page.session.send_text("x") == "one two three"
                assert [f["text"] for f in page.frames("turn.delta")] == [
                    "one ", "two ", "three"]
                return
            with pytest.raises(TurnError) as failed:
                await page.session.send_text("x")
            assert failed.value.status == status and failed.value.code == code
            if agent is Looping:
                assert len(page.frames("tool.request")) == 3
            else:
                assert "RuntimeError: the model said no" in failed.value.message

    run(main())


def test_one_turn_at_a_time_and_cancel() -> None:
    async def main() -> None:
        async with running_core(config(agent_factory=lambda: PlanAgent([[("a", {})]]))) as core:
            client = await RawClient.open(core.ws_url)
            sid = (await client.hello([tool_meta("a")]))["sessionId"]
            await client.send({"type": "turn.start", "turnId": "t1", "text": "go"})
            request = await client.recv()
            assert request["type"] == "tool.request" and request["turnId"] == "t1"
            assert (await core.session_info(sid))["turnId"] == "t1"
            await client.send({"type": "turn.start", "turnId": "t2", "text": "again"})
            busy_frame = await client.recv()  # names the refused turn, so the page can end it
            assert (busy_frame["code"], busy_frame["turnId"]) == ("TURN_BUSY", "t2")
            busy = await core.turn(sid, "third")
            assert busy.status_code == 409 and busy.json()["error"]["code"] == "TURN_BUSY"
            await client.send({"type": "turn.cancel", "turnId": "t2"})
            unknown = await client.recv()
            assert (unknown["code"], unknown["turnId"]) == ("UNKNOWN_TURN", "t2")
            await client.send({"type": "turn.cancel", "turnId": "t1"})
            cancel = await client.recv()
            assert cancel == {"type": "tool.cancel", "toolRequestId": request["toolRequestId"],
                              "reason": "the page cancelled the turn"}
            end = await client.recv()
            assert end["type"] == "turn.end" and end["status"] == "cancelled"
            assert end["error"]["code"] == "TURN_CANCELLED"
            await client.send({"type": "tool.result", "toolRequestId": request["toolRequestId"],
                               "result": 1, "handledBy": "named"})
            assert (await client.recv())["code"] == "LATE_RESULT"
            # the session takes the next turn
            await client.send({"type": "turn.start", "turnId": "t3", "text": "go"})
            assert (await client.recv())["turnId"] == "t3"
            await until(lambda: core.registry.get(sid).state == "waiting_tool_result")

    run(main())


def test_a_second_send_text_on_a_busy_session_fails_instead_of_hanging() -> None:
    release = asyncio.Event()

    async def wait(args: Any) -> str:
        await release.wait()
        return "released"

    async def main() -> None:
        async with running_core(config(agent_factory=lambda: PlanAgent([[("wait", {})]]))) as core:
            session = Session()
            session.on_tool("wait", wait)
            page = await PageAdapter(session).connect(core.ws_url)
            first = asyncio.ensure_future(page.session.send_text("first"))
            await until(lambda: page.session.state == "waiting_tool_result", "the first turn")
            with pytest.raises(TurnError) as info:
                await asyncio.wait_for(page.session.send_text("second"), 10)
            assert info.value.code == "TURN_BUSY"
            release.set()
            assert await asyncio.wait_for(first, 10) == '["released"]'

    run(main())


def test_an_agent_request_the_page_would_refuse_fails_at_once() -> None:
    plan = [[("a", {"x": float("nan")}), ("a", {"y": 1})]]

    async def main() -> None:
        async with running_core(config(agent_factory=lambda: PlanAgent(plan))) as core:
            session = Session()
            session.on_tool("a", lambda args: args)
            page = await PageAdapter(session).connect(core.ws_url)
            reply = await asyncio.wait_for(page.session.send_text("go"), 10)
            refused, fine = json.loads(reply)
            assert refused["error"]["code"] == "INVALID_ARGS"
            assert "would refuse this tool.request" in refused["error"]["message"]
            assert fine == {"y": 1}
            assert [f["args"] for f in page.frames("tool.request")] == [{"y": 1}]

    run(main())


def test_a_step_s_text_and_its_requests_go_to_the_page_in_one_write() -> None:
    """An agent's step: its text so far (``turn.delta``) and the tool requests that follow
    are written to the page together, once the step waits for them (CoreSession.flush),
    and nothing is written twice."""
    async def main() -> None:
        # the offline agent: a step per /call line
        async with running_core(config(agent_factory=OfflineAgent)) as core:
            client, welcome = await page_with(core, "a")
            page = core.registry.get(welcome["sessionId"]).connection
            guard = page._output.guard
            writes: list[list[str]] = []
            send_texts = guard.send_texts

            def recorded(texts: list[str]) -> None:
                writes.append([json.loads(text)["type"] for text in texts])
                send_texts(texts)

            guard.send_texts = recorded
            turn = asyncio.ensure_future(core.turn(welcome["sessionId"],
                                                   "\n".join(['/call a {"n": 1}'] * 3)))
            for _ in range(3):
                request = await next_of(client, "tool.request")
                await client.send({"type": "tool.result", "toolRequestId":
                                   request["toolRequestId"], "result": 1, "handledBy": "named"})
            assert (await turn).json()["status"] == "completed"
            requests = [write for write in writes if "tool.request" in write]
            assert [write.count("tool.request") for write in requests] == [1, 1, 1], writes
            # after the first call, each request goes with the text of the one before it
            assert all(write == ["turn.delta", "tool.request"] for write in requests[1:]), writes

    run(main())
