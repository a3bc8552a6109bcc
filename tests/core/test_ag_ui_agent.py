"""``--agent ag-ui:URL``: Core runs turns on an AG-UI agent.

A real Pydantic AI agent (its ``AGUIAdapter``, a ``FunctionModel``: offline) served by uvicorn
on loopback, a real Core and a page (a real ``Session``) check the whole turn; a scripted
SSE server on loopback plays the failures, and a recorded LangGraph stream is replayed.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aguikit import (
    AGENT_PATH,
    Script,
    ScriptedAgent,
    ag_ui,
    call_run,
    counter_session,
    pydantic_app,
    serving,
    sse,
    started,
    text_run,
)
from corekit import (
    WAIT,
    Page,
    RawClient,
    next_of,
    run,
    running_core,
    start_core,
    tool_meta,
)

from pedelec_pyodide import TurnError
from pedelec_pyodide.core.agents.ag_ui_agent import MAX_EVENT_BYTES, MAX_STREAM_BYTES, sse_events
from pedelec_pyodide.core.agents.factory import make_agent, parse_header
from pedelec_pyodide.core.cli import build_parser, main

TRANSCRIPTS = Path(__file__).parent / "transcripts"


# --- a real agent framework ---------------------------------------------------------------


def test_a_pydantic_ai_agent_calls_the_page_tool_and_answers_from_its_result() -> None:
    async def main() -> None:
        requests: list[dict[str, Any]] = []
        async with serving(pydantic_app(requests)) as base, \
                running_core(ag_ui(base + AGENT_PATH)) as core:
            session, runs = counter_session()
            page = await Page(session).connect(core.ws_url)
            reply = await page.session.send_text('update_counter {"delta": 2}')

            assert reply == 'Calling update_counter. \n\nThe tool answered: {"value": 2}'
            assert runs == [{"delta": 2}]
            deltas = "".join(frame["text"] for frame in page.frames("turn.delta"))
            assert deltas == reply
            [request] = page.frames("tool.request")
            assert (request["tool"], request["args"]) == ("update_counter", {"delta": 2})
            assert page.frames("turn.end")[0]["status"] == "completed"

            first, second = requests
            sid = page.session.session_id
            assert first["threadId"] == second["threadId"] == sid
            assert first["runId"] != second["runId"]
            assert first["tools"] == [{
                "name": "update_counter",
                "description": "Add delta to the counter and return its new value.",
                "parameters": session.tools["update_counter"].metadata()["argsSchema"]}]
            assert (first["context"], first["state"], first["forwardedProps"]) == ([], {}, {})
            user, assistant, tool = second["messages"]
            assert user["role"] == "user" and user["content"] == 'update_counter {"delta": 2}'
            assert assistant["role"] == "assistant"
            assert assistant["content"] == "Calling update_counter. "
            [call] = assistant["toolCalls"]
            assert call["function"] == {"name": "update_counter", "arguments": '{"delta": 2}'}
            assert tool == {"id": tool["id"], "role": "tool", "toolCallId": call["id"],
                            "content": '{"value": 2}'}

            # the control API's turns run on the same agent, in the same thread
            response = await core.turn(sid, 'update_counter {"delta": 3}')
            body = response.json()
            assert body["status"] == "completed", body
            assert body["text"].endswith('The tool answered: {"value": 5}')
            assert [(c["tool"], c["result"]) for c in body["toolCalls"]] == [
                ("update_counter", {"value": 5})]
            assert requests[-1]["threadId"] == sid
            assert [m["role"] for m in requests[-1]["messages"]] == [
                "user", "assistant", "tool", "assistant", "user", "assistant", "tool"]

    run(main())


def test_the_history_survives_a_restart_of_core_with_sqlite(tmp_path: Path) -> None:
    async def main() -> None:
        db = str(tmp_path / "core.sqlite")
        requests: list[dict[str, Any]] = []
        async with serving(pydantic_app(requests)) as base:
            url = base + AGENT_PATH
            core = await start_core(ag_ui(url, store=db))
            session, runs = counter_session()
            page = await Page(session).connect(core.ws_url)
            sid = page.session.session_id
            await page.session.send_text('update_counter {"delta": 5}')
            await page.drop()
            await core.stop()

            core = await start_core(ag_ui(url, store=db), core.port)
            try:
                await page.connect(core.ws_url)
                assert page.frames("welcome")[-1]["resumed"] is True
                reply = await page.session.send_text("thanks")
            finally:
                await core.stop()
        assert reply == "You said: thanks"
        assert runs == [{"delta": 5}]
        later = requests[-1]
        assert later["threadId"] == sid
        roles = [message["role"] for message in later["messages"]]
        assert roles == ["user", "assistant", "tool", "assistant", "user"]
        assert later["messages"][2]["content"] == '{"value": 5}'
        assert later["messages"][3]["content"] == 'The tool answered: {"value": 5}'

    run(main())


# --- the turn's rules -----------------------------------------------------------------------


def test_a_tool_the_page_does_not_have_is_answered_not_found_and_the_turn_goes_on() -> None:
    async def main() -> None:
        echoed = sse({"type": "TOOL_CALL_RESULT", "messageId": "e", "toolCallId": "call-1",
                      "content": "the page's answer, echoed"})
        second = text_run("No rockets then.")
        scripts = [Script(call_run("launch_rockets", '{"count": 3}')),
                   Script([second[0], echoed, *second[1:]])]
        async with ScriptedAgent(scripts) as agent, running_core(ag_ui(agent.url)) as core:
            session, runs = counter_session()
            page = await Page(session).connect(core.ws_url)
            assert await page.session.send_text("go") == "No rockets then."
            assert runs == [] and page.frames("tool.request") == []
            tool = agent.requests[1]["body"]["messages"][-1]
            assert tool["role"] == "tool" and tool["toolCallId"] == "call-1"
            assert tool["error"].startswith("TOOL_HANDLER_NOT_FOUND: ")
            assert json.loads(tool["content"])["error"]["code"] == "TOOL_HANDLER_NOT_FOUND"

    run(main())


def test_message_ids_stay_unique_when_the_agent_reuses_a_call_id_in_every_turn() -> None:
    """An agent that keeps the thread itself and skips ids it has seen (LangGraph) would
    drop the second turn's result if its id were the first's."""
    async def main() -> None:
        scripts = [Script(call_run("update_counter", '{"delta": 1}')), Script(text_run("one")),
                   Script(call_run("update_counter", '{"delta": 1}')), Script(text_run("two"))]
        async with ScriptedAgent(scripts) as agent, running_core(ag_ui(agent.url)) as core:
            session, runs = counter_session()
            page = await Page(session).connect(core.ws_url)
            assert await page.session.send_text("go") == "one"
            assert await page.session.send_text("again") == "two"
            assert runs == [{"delta": 1}, {"delta": 1}]
            messages = agent.requests[3]["body"]["messages"]
            results = [m for m in messages if m["role"] == "tool"]
            assert [m["toolCallId"] for m in results] == ["call-1", "call-1"]
            ids = [m["id"] for m in messages]
            assert len(ids) == len(set(ids)), ids

    run(main())


def test_an_error_result_goes_back_with_error_set() -> None:
    async def main() -> None:
        scripts = [Script(call_run("update_counter", '{"delta": "x"}')), Script(text_run("ok"))]
        async with ScriptedAgent(scripts) as agent, running_core(ag_ui(agent.url)) as core:
            session, runs = counter_session()
            page = await Page(session).connect(core.ws_url)
            assert await page.session.send_text("go") == "ok"
            tool = agent.requests[1]["body"]["messages"][-1]
            assert tool["error"].startswith("INVALID_ARGS: ")
            assert json.loads(tool["content"])["error"]["code"] == "INVALID_ARGS"
            assert runs == []

    run(main())


def test_the_step_limit_counts_the_runs_that_call_tools() -> None:
    async def main() -> None:
        scripts = [Script(call_run("update_counter", '{"delta": 1}', f"call-{n}"))
                   for n in range(5)]
        async with ScriptedAgent(scripts) as agent, \
                running_core(ag_ui(agent.url, max_steps=2)) as core:
            session, runs = counter_session()
            page = await Page(session).connect(core.ws_url)
            with pytest.raises(TurnError) as failed:
                await page.session.send_text("go")
            assert (failed.value.status, failed.value.code) == ("failed", "STEP_LIMIT_EXCEEDED")
            assert "limit of 2 tool-calling steps" in failed.value.message
            assert len(runs) == 2 and len(agent.requests) == 3

    run(main())


def test_calls_the_agent_answers_itself_stay_with_the_agent() -> None:
    """A call with a TOOL_CALL_RESULT in its run is one of the agent's own tools: the page
    never sees it, the history keeps it with its result."""
    async def main() -> None:
        own = [sse({"type": "RUN_STARTED", "threadId": "t", "runId": "r"}),
               sse({"type": "TOOL_CALL_START", "toolCallId": "b1", "toolCallName": "search"}),
               sse({"type": "TOOL_CALL_ARGS", "toolCallId": "b1", "delta": '{"q": "x"}'}),
               sse({"type": "TOOL_CALL_END", "toolCallId": "b1"}),
               sse({"type": "TOOL_CALL_RESULT", "messageId": "r1", "toolCallId": "b1",
                    "content": "found it"}),
               *text_run("Found it.")[1:]]
        scripts = [Script(own), Script(text_run("Again."))]
        async with ScriptedAgent(scripts) as agent, running_core(ag_ui(agent.url)) as core:
            session, _ = counter_session()
            page = await Page(session).connect(core.ws_url)
            assert await page.session.send_text("look") == "Found it."
            assert page.frames("tool.request") == []
            assert await page.session.send_text("again") == "Again."
            messages = agent.requests[1]["body"]["messages"]
            assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant",
                                                     "user"]
            assert messages[1]["toolCalls"][0]["function"] == {
                "name": "search", "arguments": '{"q": "x"}'}
            assert messages[2] == {"id": "r1", "role": "tool", "toolCallId": "b1",
                                   "content": "found it"}
            assert messages[3]["content"] == "Found it."

    run(main())


def test_chunk_events_crlf_lines_comments_and_other_fields() -> None:
    """TEXT_MESSAGE_CHUNK and TOOL_CALL_CHUNK (a chunk with no id continues the latest
    call); lines ended by CRLF; comments and the event/id/retry fields carry nothing."""
    async def main() -> None:
        events = [b": keep-alive\r\n\r\n", b"event: message\r\nid: 1\r\nretry: 5\r\n"
                  + sse({"type": "RUN_STARTED", "threadId": "t", "runId": "r"}),
                  sse({"type": "TEXT_MESSAGE_CHUNK", "messageId": "m", "role": "assistant",
                       "delta": "Counting. "}),
                  sse({"type": "TOOL_CALL_CHUNK", "toolCallId": "c1",
                       "toolCallName": "update_counter", "delta": '{"del'}),
                  sse({"type": "TOOL_CALL_CHUNK", "delta": 'ta": 1}'}),
                  sse({"type": "RUN_FINISHED", "threadId": "t", "runId": "r"})]
        crlf = [event.replace(b"\n\n", b"\r\n\r\n") for event in events]
        async with ScriptedAgent([Script(crlf), Script(text_run("Done."))]) as agent, \
                running_core(ag_ui(agent.url)) as core:
            session, runs = counter_session()
            page = await Page(session).connect(core.ws_url)
            assert await page.session.send_text("count") == "Counting. \n\nDone."
            assert runs == [{"delta": 1}]

    run(main())


def test_the_agent_gets_its_headers() -> None:
    async def main() -> None:
        async with ScriptedAgent([Script(text_run("hi"))]) as agent:
            cfg = ag_ui(agent.url, agent_headers=(("Authorization", "Bearer s3cret"),
                                                  ("X-Team", "blue")))
            async with running_core(cfg) as core:
                page = await Page(counter_session()[0]).connect(core.ws_url)
                assert await page.session.send_text("hello") == "hi"
        headers = agent.requests[0]["headers"]
        assert headers["authorization"] == "Bearer s3cret" and headers["x-team"] == "blue"
        assert headers["accept"] == "text/event-stream"
        assert "s3cret" not in repr(cfg)

    run(main())


# --- failures: the turn fails, naming the agent and why; Core stays healthy ---------------------


FAILURES: dict[str, tuple[Script, str]] = {
    "run error": (Script([started(), sse({"type": "RUN_ERROR", "message": "model overloaded",
                                          "code": "OVERLOADED"})]),
                  "reported RUN_ERROR (OVERLOADED): model overloaded"),
    "ended early": (Script([started()]), "its stream ended before RUN_FINISHED"),
    "broken stream": (Script([started()], end="break"), "its stream broke before RUN_FINISHED"),
    "not json": (Script([started(), sse("{not json")]), "not an AG-UI event"),
    "not ag-ui": (Script([started(), sse({"type": "HELLO_WORLD"})]), "not an AG-UI event"),
    "bad field": (Script([started(), sse({"type": "TEXT_MESSAGE_CONTENT", "delta": 3})]),
                  "not an AG-UI event"),
    "not utf-8": (Script([started(), sse(b'{"type": "RUN_STARTED", "x": "\xff"}')]),
                  "not UTF-8 text"),
    "huge stream": (Script([b": " + b"x" * (1024 * 1024) + b"\n"] * 17),
                    f"over {MAX_STREAM_BYTES} bytes in one run"),
    "huge line": (Script([b"data: " + b"x" * (MAX_EVENT_BYTES + 1)]),
                  f"a line over {MAX_EVENT_BYTES} bytes"),
    "http error": (Script([b"upstream down"], status=502, content_type="text/plain"),
                   "answered HTTP 502: upstream down"),
    "not sse": (Script([b"{}"], content_type="application/json"),
                "answered application/json, not text/event-stream"),
    "interrupt": (Script([started(), sse({"type": "RUN_FINISHED", "threadId": "t",
                                          "runId": "r", "outcome": {
                                              "type": "interrupt", "interrupts": [
                                                  {"id": "i", "reason": "confirm"}]}})]),
                  "ended the run with the outcome interrupt"),
    "too slow": (Script([started()], end="hang"), "sent no event for 0.3 s"),
    "args first": (Script([started(), sse({"type": "TOOL_CALL_ARGS", "toolCallId": "c9",
                                           "delta": "{}"})]),
                   "sent TOOL_CALL_ARGS for the call 'c9', which it had not started"),
    "encoded": (Script([gzip.compress(started())], headers={"Content-Encoding": "gzip"}),
                "sent its stream encoded (gzip), though asked for identity"),
    # (deeper than pydantic's limit, within Core's bound on an event's values: one over
    # that bound fails before it is parsed, test_ag_ui_bounds)
    "too deep": (Script([started(), sse('{"type": "RAW", "event": ' + "[" * 5_000
                                        + "]" * 5_000 + "}")]), "not an AG-UI event"),
}


@pytest.mark.parametrize("case", FAILURES)
def test_a_failing_agent_fails_the_turn_with_agent_error(case: str) -> None:
    script, said = FAILURES[case]
    # a short event timeout for "too slow"; a longer one where the failure must not depend on
    # how fast 16 MiB of comments (no event) crosses a busy machine's loopback
    timeout_ms = 300 if case == "too slow" else 10_000

    async def main() -> None:
        async with ScriptedAgent([script]) as agent, \
                running_core(ag_ui(agent.url, tool_timeout_ms=timeout_ms)) as core:
            page = await Page(counter_session()[0]).connect(core.ws_url)
            with pytest.raises(TurnError) as failed:
                await page.session.send_text("go")
            assert (failed.value.status, failed.value.code) == ("failed", "AGENT_ERROR")
            assert agent.url in failed.value.message and said in failed.value.message, \
                failed.value.message
            assert (await core.http.get("/pedelec/v1/health")).status_code == 200
            assert (await core.session_info(page.session.session_id))["state"] == "idle"

    run(main())


def test_an_agent_that_is_down_fails_the_turn_naming_its_url() -> None:
    async def main() -> None:
        with socket.socket() as sock:  # a port nothing listens on
            sock.bind(("127.0.0.1", 0))
            url = f"http://127.0.0.1:{sock.getsockname()[1]}{AGENT_PATH}"
        async with running_core(ag_ui(url)) as core:
            page = await Page(counter_session()[0]).connect(core.ws_url)
            with pytest.raises(TurnError) as failed:
                await page.session.send_text("go")
            assert failed.value.code == "AGENT_ERROR"
            assert f"cannot reach the AG-UI agent at {url}" in failed.value.message

    run(main())


def test_a_header_value_the_agent_echoes_is_never_shown(caplog: pytest.LogCaptureFixture
                                                        ) -> None:
    async def main() -> None:
        script = Script([b"bad token s3cret-value"], status=401, content_type="text/plain")
        async with ScriptedAgent([script]) as agent:
            cfg = ag_ui(agent.url, agent_headers=(("Authorization", "s3cret-value"),
                                                  ("X-Shard", "1")))
            async with running_core(cfg) as core:
                page = await Page(counter_session()[0]).connect(core.ws_url)
                with pytest.raises(TurnError) as failed:
                    await page.session.send_text("go")
        assert "answered HTTP 401: bad token ***" in failed.value.message  # 401: no "1" hidden
        assert "s3cret" not in failed.value.message

    with caplog.at_level(logging.DEBUG):
        run(main())
    assert "s3cret" not in caplog.text


# --- a second framework, recorded ----------------------------------------------------------------


def test_a_recorded_langgraph_stream_replays() -> None:
    """ag-ui-langgraph's stream (a LangGraph graph with a fake chat model, recorded by
    transcripts/record_ag_ui_langgraph.py): text, a frontend tool call whose args arrive in
    pieces, state and messages snapshots and RAW events Core skips."""
    recording = json.loads((TRANSCRIPTS / "ag_ui_langgraph.json").read_text())

    async def main() -> None:
        scripts = [Script([run["stream"].encode()]) for run in recording["runs"]]
        async with ScriptedAgent(scripts) as agent, running_core(ag_ui(agent.url)) as core:
            session, runs = counter_session()
            page = await Page(session).connect(core.ws_url)
            reply = await page.session.send_text("add two")
            assert runs == [{"delta": 2}]
            assert reply == "Adding two. \n\nThe counter is now 2. "
            assistant, tool = agent.requests[1]["body"]["messages"][-2:]
            assert assistant["id"] == "lc-1"  # LangGraph's own id: no second copy there
            assert tool["toolCallId"] == recording["call_id"]
            assert json.loads(tool["content"]) == {"value": 2}

    run(main())


# --- configuration ---------------------------------------------------------------------------


def test_header_syntax() -> None:
    assert parse_header("Authorization:  Bearer abc ") == ("Authorization", "Bearer abc")
    assert parse_header("X-Empty:") == ("X-Empty", "")
    for bad, why in [("no colon here", "no colon"), ("Bad Name: v", "HTTP header name"),
                     ("X: a\rb", "line break"), ("X: a\nb", "line break"),
                     ("X: caf\u00e9", "visible ASCII")]:
        with pytest.raises(ValueError, match=why) as caught:
            parse_header(bad)
        value = bad.partition(":")[2].strip()
        assert not value or value not in str(caught.value)


def test_the_cli_refuses_a_bad_header_without_showing_it(capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["serve", "--agent", "ag-ui:http://127.0.0.1:1/",
                                   "--agent-header", "Authorization: sk-live-1\r\nX: y"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "line break" in err and "sk-live-1" not in err


def test_the_cli_takes_headers_for_ag_ui_agents_only(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--agent", "offline", "--agent-header", "X: y"]) == 2
    assert "--agent-header is for an AG-UI agent" in capsys.readouterr().err
    assert main(["serve", "--agent", "ag-ui:ftp://example.org/agent"]) == 2
    assert "http or https URL" in capsys.readouterr().err


def test_make_agent_reads_ag_ui_specs() -> None:
    agent = make_agent("ag-ui:http://user:pw@127.0.0.1:8000/agent?key=k",
                       headers=[("X", "y")], event_timeout=5)
    assert agent.info.details == {"model": "http://127.0.0.1:8000/agent",  # type: ignore[attr-defined]
                                  "base_url": "http://127.0.0.1:8000/agent"}
    with pytest.raises(ValueError, match="http or https"):
        make_agent("ag-ui:")


def test_a_turn_waits_for_nothing_once_the_agent_has_failed() -> None:
    """The agent's socket is closed when a run fails: the server sees its client go."""
    async def main() -> None:
        scripts = [Script([sse({"type": "RUN_ERROR", "message": "no"})], end="hold")]
        async with ScriptedAgent(scripts) as agent, running_core(ag_ui(agent.url)) as core:
            page = await Page(counter_session()[0]).connect(core.ws_url)
            with pytest.raises(TurnError):
                await page.session.send_text("go")
            await asyncio.wait_for(agent.let_go.wait(), WAIT)

    run(main())


def test_cancelling_the_turn_closes_the_run_it_is_reading() -> None:
    async def main() -> None:
        async with ScriptedAgent([Script([started()], end="hold")]) as agent, \
                running_core(ag_ui(agent.url)) as core:
            client = await RawClient.open(core.ws_url)
            await client.hello([tool_meta("a")])
            await client.send({"type": "turn.start", "turnId": "t1", "text": "go"})
            await asyncio.wait_for(agent.holding.wait(), WAIT)
            await client.send({"type": "turn.cancel", "turnId": "t1"})
            end = await next_of(client, "turn.end")
            assert end["status"] == "cancelled"
            await asyncio.wait_for(agent.let_go.wait(), WAIT)
            await client.close()

    run(main())


@pytest.mark.parametrize("eol", [b"\r\n", b"\n", b"\r"], ids=["CRLF", "LF", "CR"])
def test_events_are_read_whatever_the_chunks(eol: bytes) -> None:
    """The SSE reader over chunks of every size, lines split anywhere (a CRLF too: one
    line end), each line ended as the SSE rule allows (found: a lone CR was none)."""

    datas = [json.dumps({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": "x" * n})
             for n in range(0, 300, 7)]
    # each event's JSON in two data lines, rejoined by a line feed (JSON whitespace)
    stream = b"".join(b": c" + eol + b"data: " + data.encode().replace(b", ", b"," + eol
                      + b"data: ", 1) + eol + eol for data in datas)
    datas = [data.replace(", ", ",\n", 1) for data in datas]

    async def read(size: int) -> list[bytes]:
        async def chunks() -> AsyncIterator[bytes]:
            for start in range(0, len(stream), size):
                yield stream[start:start + size]

        return [event async for event in sse_events(chunks(), "here")]

    for size in (1, 2, 3, 7, 64, 1000, len(stream)):
        assert asyncio.run(read(size)) == [data.encode() for data in datas], size
