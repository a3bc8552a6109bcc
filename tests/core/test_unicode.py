"""Text is valid Unicode everywhere (issue 10, class 1), and error messages quote at most a
short excerpt of a bad value (class 3).

JSON that decodes to a lone surrogate is refused where it enters Core, naming the field:
a ``/call`` line, a control-API body, MCP args, an agent's tool call or reply, a page's
frame. No frame, store row or log line is built from it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from agentkit import KEY, TRANSCRIPTS, StandIn, agent_for, results_sent, turn_with
from agentkit import run as run_agent
from corekit import WAIT, Page, RawClient, config, run, running_core, tool_meta

from pedelec_pyodide import Session, define_tool, protocol
from pedelec_pyodide.core.agents.contract import ToolCallRequest
from pedelec_pyodide.core.agents.model import ModelError
from pedelec_pyodide.core.agents.offline import parse_call_message
from pedelec_pyodide.core.agents.scripted import ScriptedAgent
from pedelec_pyodide.core.sessions import checked_request_frame
from pedelec_pyodide.session import TurnError
from pedelec_pyodide.text import MAX_EXCERPT, lone_surrogate_at

SURROGATE_CALL = '/call update_counter {"delta": "\\ud800"}'


def counter_session() -> tuple[Session, dict[str, int]]:
    counter = {"value": 0, "runs": 0}

    def update_counter(args: Any) -> Any:
        counter["runs"] += 1
        counter["value"] += args["delta"]
        return {"value": counter["value"]}

    session = Session()
    session.add_tool(define_tool(
        name="update_counter", description="Change the counter by delta.",
        args_schema={"type": "object", "properties": {"delta": {"type": "integer"}},
                     "required": ["delta"]},
        handler=update_counter))
    return session, counter


def serve(*args: str) -> tuple[subprocess.Popen[str], str, str]:
    """``pedelec serve`` as a user runs it; its URL and admin token."""
    env = dict(os.environ)
    env.pop("PEDELEC_ADMIN_TOKEN", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "pedelec_pyodide.core.cli", "serve", *args, "--port", "0",
         "--no-provision", "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert process.stdout is not None
    url = process.stdout.readline().split(": ", 1)[1].strip()
    token = process.stdout.readline().rsplit(" ", 1)[1].strip()
    return process, url, token


def stop(process: subprocess.Popen[str]) -> tuple[int, float]:
    """SIGTERM; the exit code and the seconds it took (killed after 15 s)."""
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    try:
        code = process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=15)
        code = -9
    return code, time.monotonic() - started


@pytest.mark.parametrize("store", ["sqlite", "memory"])
def test_a_call_line_with_a_lone_surrogate_is_refused_and_core_keeps_serving(
        tmp_path: Path, store: str) -> None:
    """The issue's scenario: with --store PATH.sqlite, the line used to kill the store's
    writer, hang every session's tool calls and make SIGTERM powerless; with the memory
    store, it silenced the page's connection."""
    spec = str(tmp_path / "core.sqlite") if store == "sqlite" else "memory"
    process, url, token = serve("--agent", "offline", "--store", spec)
    try:
        async def main() -> None:
            ws_url = url.replace("http", "ws", 1) + "pedelec/v1/bridge"
            first, first_counter = counter_session()
            page = await Page(first).connect(ws_url)
            try:
                reply = await asyncio.wait_for(first.send_text(SURROGATE_CALL), WAIT)
            except TurnError as exc:  # a failed turn is a clear end too
                reply = f"{exc.code}: {exc}"
            assert "lone surrogate" in reply and "$.delta" in reply, reply
            assert first_counter["runs"] == 0
            assert page.frames("tool.request") == []
            # the same page goes on working
            assert "update_counter" in await asyncio.wait_for(
                first.send_text('/call update_counter {"delta": 2}'), WAIT)
            assert first_counter["value"] == 2
            # and another session's tool call
            second, second_counter = counter_session()
            await Page(second).connect(ws_url)
            assert second.session_id is not None
            async with httpx.AsyncClient(
                    base_url=url, timeout=WAIT,
                    headers={"Authorization": f"Bearer {token}"}) as http:
                answer = await http.post(
                    f"pedelec/v1/sessions/{second.session_id}/tool-calls",
                    json={"tool": "update_counter", "args": {"delta": 5}})
            assert answer.status_code == 200, answer.text
            assert answer.json()["result"] == {"value": 5}
            assert second_counter["runs"] == 1

        asyncio.run(asyncio.wait_for(main(), 60))
    finally:
        code, seconds = stop(process)
    assert code == 0 and seconds < 5, (code, seconds)
    assert process.stderr is not None
    assert "Traceback" not in process.stderr.read()


# --- each entry point ----------------------------------------------------------------------


def test_the_rule_names_the_json_path_of_the_first_lone_surrogate() -> None:
    assert lone_surrogate_at({"a": [1, "x", {"b": "\udc00"}]}) == "$.a[2].b"
    assert lone_surrogate_at({"a": {"k\ud800": 1}}) == '$.a["k\\ud800"]'  # a key, escaped
    assert lone_surrogate_at(["\U0001f600", "é", 1, True, None, 2.5]) is None  # pairs are fine
    assert lone_surrogate_at("text\ud800") == "$"
    assert lone_surrogate_at([["\ud800"], "\udfff"]) == "$[0][0]"  # the first, in order


@pytest.mark.parametrize("line, where", [
    (SURROGATE_CALL, "$.delta"),
    ('/call update_counter {"\\udc00": 1}', '$["\\udc00"]'),
    ('/call update_counter {"a": [{"b": "x\\ud83d"}]}', "$.a[0].b"),  # half a pair
])
def test_a_call_line_decoding_to_a_lone_surrogate_calls_nothing_and_says_where(
        line: str, where: str) -> None:
    message = parse_call_message(line)
    assert message is not None and not message.calls
    assert message.problems == [
        f"line 1: the args for update_counter hold a lone surrogate at {where}: "
        "text must be valid Unicode"]
    assert lone_surrogate_at(message.problems) is None  # the reply itself is valid text
    pair = parse_call_message('/call update_counter {"s": "\\ud83d\\ude00"}')
    assert pair is not None
    assert list(pair.calls) == [ToolCallRequest("update_counter", {"s": "\U0001f600"})]


def test_control_api_bodies_with_a_lone_surrogate_are_400_naming_the_field() -> None:
    async def main() -> None:
        async with running_core() as core:
            session, counter = counter_session()
            page = await Page(session).connect(core.ws_url)
            sid = session.session_id
            base = f"/pedelec/v1/sessions/{sid}"
            cases = [
                ("turns", b'{"text": "hi \\ud800"}', "$.text"),
                ("tool-calls", b'{"tool": "update_counter", "args": {"delta": "\\udfff"}}',
                 "$.args.delta"),
                ("tool-calls", b'{"tool": "update_counter", "args": {"\\ud800": 1}}',
                 '$.args["\\ud800"]'),
            ]
            for route, body, where in cases:
                answer = await core.http.post(f"{base}/{route}", content=body)
                assert answer.status_code == 400, answer.text
                error = answer.json()["error"]
                assert error["code"] == "BAD_REQUEST"
                assert error["message"] == (
                    f"the body is not Unicode text: a lone surrogate at {where}: "
                    "text must be valid Unicode")
            # a surrogate encoded in the bytes themselves (CESU-8) is not UTF-8
            cesu = '{"text": "\ud800"}'.encode("utf-8", "surrogatepass")
            raw = await core.http.post(f"{base}/turns", content=cesu)
            assert raw.status_code == 400 and "not UTF-8" in raw.json()["error"]["message"]
            assert page.frames("tool.request") == [] and page.frames("turn.delta") == []
            good = await core.turn(sid, "hello \U0001f600")  # valid text still goes through
            assert good.status_code == 200 and good.json()["text"] == "echo: hello \U0001f600"
            assert counter["runs"] == 0

    run(main())


def test_mcp_args_with_a_lone_surrogate_are_refused_and_the_page_never_sees_them() -> None:
    async def main() -> None:
        async with running_core() as core:
            session, counter = counter_session()
            page = await Page(session).connect(core.ws_url)
            url = f"/pedelec/v1/sessions/{session.session_id}/mcp"
            body = (b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": '
                    b'{"name": "update_counter", "arguments": {"delta": "\\ud800"}}}')
            answer = await core.http.post(url, content=body, headers={
                "Content-Type": "application/json",
                "Accept": "application/json, text/event-stream"})
            assert answer.status_code == 400, answer.text
            # the SDK's JSON parser refuses it (by position) before Core sees any args
            assert answer.json()["error"]["code"] == -32700
            assert "hex escape at line 1 column 120" in answer.json()["error"]["message"]
            assert page.frames("tool.request") == [] and counter["runs"] == 0
            again = await core.tool_call(session.session_id or "", "update_counter",
                                         {"delta": 1})
            assert again.json()["result"] == {"value": 1}

    run(main())


@pytest.mark.parametrize("frame, where", [
    ({"type": "hello", "protocol": 1, "tools": [
        {"name": "t", "description": "d\ud800", "argsSchema": {"type": "object"}}]},
     "$.tools[0].description"),
    ({"type": "hello", "protocol": 1, "tools": [], "client": {"ua": "\udc00"}},
     "$.client.ua"),
    ({"type": "hello", "protocol": 1, "tools": [
        {"name": "t", "description": "d",
         "argsSchema": {"type": "object", "properties": {"\ud800": {}}}}]},
     '$.tools[0].argsSchema.properties["\\ud800"]'),
])
def test_a_hello_with_a_lone_surrogate_is_refused_naming_the_field(
        frame: dict[str, Any], where: str) -> None:
    async def main() -> None:
        async with running_core() as core:
            client = await RawClient.open(core.ws_url)
            await client.send(json.dumps(frame))  # ensure_ascii: the surrogate escaped
            error = await client.recv()
            assert error["type"] == "error" and error["code"] == "FRAME_NOT_JSON"
            assert error["message"] == (f"frame is not Unicode text: a lone surrogate at "
                                        f"{where}: text must be valid Unicode")
            assert core.registry.sessions == {}  # no session (or row) was made of it
            welcome = await client.hello([tool_meta("t")])  # the connection carries on
            assert welcome["type"] == "welcome"
            await client.close()

    run(main())


@pytest.mark.parametrize("frame, where", [
    ({"type": "tools.update", "tools": [
        {"name": "t", "description": "d", "argsSchema": {"type": "object"},
         "annotations": {"title": "\ud800"}}]}, "$.tools[0].annotations.title"),
    ({"type": "turn.start", "turnId": "t1", "text": "hi \udfff"}, "$.text"),
    ({"type": "tool.result", "toolRequestId": "$PENDING", "result": {"v": ["\ud800"]},
      "handledBy": "named"}, "$.result.v[0]"),
])
def test_a_session_frame_with_a_lone_surrogate_is_refused_and_changes_nothing(
        tmp_path: Path, frame: dict[str, Any], where: str) -> None:
    async def main() -> None:
        async with running_core(config(store=str(tmp_path / "core.sqlite"))) as core:
            client = await RawClient.open(core.ws_url)
            welcome = await client.hello([tool_meta("t")])
            sid = welcome["sessionId"]
            call = asyncio.create_task(core.tool_call(sid, "t", {"n": 1}))
            request = await client.recv()
            assert request["type"] == "tool.request"
            text = json.dumps(frame, separators=(",", ":")).replace(  # as the runtime sends
                "$PENDING", request["toolRequestId"])
            await client.send(text)
            error = await client.recv()
            assert error["code"] == "FRAME_NOT_JSON"
            assert f"a lone surrogate at {where}" in error["message"]
            if frame["type"] == "turn.start":
                assert error["turnId"] == "t1"  # the page's runtime fails that turn
            session = core.registry.get(sid)
            assert session.turn is None and session.tools == [tool_meta("t")]
            # the request is still pending; its right answer is taken and delivered
            await client.send({"type": "tool.result", "toolRequestId":
                               request["toolRequestId"], "result": {"ok": "\U0001f600"},
                               "handledBy": "named"})
            answer = await asyncio.wait_for(call, WAIT)
            assert answer.json()["result"] == {"ok": "\U0001f600"}
            await core.registry.store.flush()  # the store's writer is alive
            await client.close()

    run(main())


def test_an_agents_call_with_a_lone_surrogate_is_invalid_args_and_never_sent(
        tmp_path: Path) -> None:
    """Any agent (here a scripted one): the bad call of a step is answered INVALID_ARGS by
    Core, the good one runs; nothing of the bad call reaches a frame or the store."""
    script = ScriptedAgent([
        [ToolCallRequest("update_counter", {"delta": 2}),
         ToolCallRequest("update_counter", {"delta": "\ud800"}),
         ToolCallRequest("update\udc00", {})],
        "done",
    ])
    db = tmp_path / "core.sqlite"

    async def main() -> None:
        async with running_core(config(store=str(db), agent_factory=lambda: script)) as core:
            session, counter = counter_session()
            page = await Page(session).connect(core.ws_url)
            answer = await core.turn(session.session_id or "", "go")
            assert answer.status_code == 200, answer.text
            turn = answer.json()
            assert turn["status"] == "completed" and turn["text"] == "done"
            good, bad_args, bad_name = turn["toolCalls"]
            assert good["result"] == {"value": 2} and counter["runs"] == 1
            assert bad_args["args"] is None and bad_args["handledBy"] == "none"
            assert bad_args["result"]["error"]["code"] == "INVALID_ARGS"
            assert bad_args["result"]["error"]["message"] == (
                "the args hold a lone surrogate at $.delta: text must be valid Unicode; "
                "the call was not made")
            assert bad_name["tool"] == "update\\udc00"  # an excerpt: escaped
            assert "the tool name holds a lone surrogate" in (
                bad_name["result"]["error"]["message"])
            assert [f["tool"] for f in page.frames("tool.request")] == ["update_counter"]
            outcomes = script.outcomes[0]
            assert [o.result.get("error", {}).get("code") for o in outcomes] == [
                None, "INVALID_ARGS", "INVALID_ARGS"]
            await core.registry.store.flush()  # the store's writer took every row

    run(main())
    with sqlite3.connect(db) as check:  # what the store holds is valid text
        for (tool_calls,) in check.execute("SELECT tool_calls FROM turns"):
            assert "INVALID_ARGS" in tool_calls
            tool_calls.encode("utf-8")


@pytest.mark.parametrize("reply", [["fine", "bad \ud800"], [ValueError("x\udc00" * 10_000)]])
def test_an_agents_reply_with_a_lone_surrogate_fails_the_turn_clearly(reply: list[Any]) -> None:
    async def main() -> None:
        agent = ScriptedAgent(reply)
        async with running_core(config(agent_factory=lambda: agent)) as core:
            session, _ = counter_session()
            page = await Page(session).connect(core.ws_url)
            with pytest.raises(TurnError) as failed:
                await asyncio.wait_for(session.send_text("go"), WAIT)
            assert failed.value.code == "AGENT_ERROR"
            message = str(failed.value)
            # 200 characters of the value, each surrogate of them escaped as 6
            assert len(message) < 7 * MAX_EXCERPT and lone_surrogate_at(message) is None
            if isinstance(reply[0], str):
                assert "the reply text of the agent holds a lone surrogate" in message
                assert [f["text"] for f in page.frames("turn.delta")] == ["fine"]
            else:  # the agent's own exception text: excerpted, its surrogates escaped
                assert "x\\udc00x\\udc00" in message and "more characters" in message
            assert (await core.turn(session.session_id or "", "again")).status_code == 200

    run(main())


def test_core_never_sends_a_request_frame_with_a_lone_surrogate() -> None:
    """The pre-send check catches raw surrogates too (it only caught escaped ones)."""
    for args in ({"a": "\ud800"}, {"\udfff": 1}, ["ok", {"b": ["\ud83d"]}]):
        request = protocol.ToolRequest(tool_request_id="r1", tool="t", args=args)
        with pytest.raises(protocol.ProtocolError) as refused:
            checked_request_frame(request, protocol.MAX_FRAME_BYTES)
        assert refused.value.code == protocol.FRAME_NOT_JSON
        assert "a lone surrogate at $.args" in refused.value.message
    fine = protocol.ToolRequest(tool_request_id="r1", tool="t", args={"a": "\U0001f600"})
    assert "\U0001f600" in checked_request_frame(fine, protocol.MAX_FRAME_BYTES)


def _nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


_ARGS = [
    {"\ud800": 1}, {"a": "\ud800"}, {"a": "\\ud800"}, {"\\ud800": 1}, {"a": "\udfff"},
    {"a": "\U0001f600"}, {"a": 1e308}, {"a": 10**300}, {"a": "\x00\u2028"}, {1: 2},
    {"a": "x" * (1 << 20)}, {"a": "\u00e9" * (1 << 19)},
    *(_nested(d) for d in range(protocol.MAX_DEPTH - 2, protocol.MAX_DEPTH + 2)),
    {"a": [[]] * 50_000}, {"a": [[], _nested(protocol.MAX_DEPTH)] * 1_000},  # wide; deep too
    {"a": [{}] * 400_000},  # too large and wide
]


@pytest.mark.parametrize("tool", ["t", 5, None, "\ud800"])
def test_the_fast_check_gives_the_pages_verdict(tool: object) -> None:
    """Whatever the args or tool name, a frame is refused exactly when, and as, the
    page's full parse of it refuses it."""
    def verdict(check: Any) -> object:
        try:
            check()
        except protocol.ProtocolError as exc:
            return exc.code, exc.message
        return "taken"

    for args in _ARGS:
        request = protocol.ToolRequest(tool_request_id="r" * 32, tool=tool,  # type: ignore[arg-type]
                                       args=args)
        full = verdict(lambda r=request: protocol.parse_server_frame(
            r.encode(), max_bytes=1 << 20))
        assert verdict(lambda r=request: checked_request_frame(r, 1 << 20)) == full


def test_a_wide_frame_is_checked_without_decoding_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Many brackets are not deep nesting: the page's own depth check tells, before any
    value is built (a 1 MiB frame of small arrays decoded: ~15 to 45 ms with the GIL held,
    on the event loop for a control-API call)."""
    decoded: list[int] = []
    decode = json.JSONDecoder.decode

    def counted(decoder: json.JSONDecoder, text: str, **options: Any) -> Any:
        decoded.append(len(text))
        return decode(decoder, text, **options)

    monkeypatch.setattr(json.JSONDecoder, "decode", counted)
    wide = protocol.ToolRequest(tool_request_id="r" * 32, tool="t", args={"a": [[]] * 300_000})
    deep = protocol.ToolRequest(tool_request_id="r" * 32, tool="t",
                                args=[[], _nested(protocol.MAX_DEPTH)])
    assert len(checked_request_frame(wide, protocol.MAX_FRAME_BYTES)) > 900_000
    assert decoded == []
    depth_checks: list[int] = []
    nests_too_deep = protocol.nests_too_deep

    def counted_check(text: str) -> bool:
        depth_checks.append(len(text))
        return nests_too_deep(text)

    monkeypatch.setattr(protocol, "nests_too_deep", counted_check)
    with pytest.raises(protocol.ProtocolError) as refused:
        checked_request_frame(deep, protocol.MAX_FRAME_BYTES)
    assert refused.value.code == protocol.FRAME_TOO_DEEP
    assert len(depth_checks) == 1  # (a pass per level: not made again for the refusal)


def surrogate_transcript(provider: str) -> dict[str, Any]:
    """The recorded one-tool-call exchange, with the model's args ``{"delta": "\\ud800"}``,
    and the request that must follow: the call kept as ``{}``, its result an error."""
    transcript = json.loads((TRANSCRIPTS / f"{provider}_one_tool_call.json").read_text())
    first, second = transcript["exchanges"]
    for event in first["response"]["events"]:
        text = json.dumps(event)
        if "3}" in text:  # the last piece of the streamed args
            event.clear()
            event.update(json.loads(text.replace('3}', '\\"\\\\ud800\\"}')))
    messages = second["request"]["body"]["messages"]
    if provider == "openai":
        messages[1]["tool_calls"][0]["function"]["arguments"] = "{}"
        del messages[2]["content"]
    else:
        messages[1]["content"][0]["input"] = {}
        messages[2]["content"][0] = {"type": "tool_result", "tool_use_id": "toolu_A1",
                                     "is_error": True}
    return transcript


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_models_args_with_a_lone_surrogate_are_invalid_args_to_the_model(
        provider: str, monkeypatch: pytest.MonkeyPatch) -> None:
    server = StandIn(surrogate_transcript(provider))
    server.thread.start()
    prefix = provider.upper()
    monkeypatch.setenv(f"{prefix}_BASE_URL", server.base_url)
    monkeypatch.setenv(f"{prefix}_API_KEY", KEY)

    async def main() -> None:
        cfg = config(agent=f"{provider}:test-model", agent_factory=None)
        async with running_core(cfg) as core:
            session, counter = counter_session()
            page = await Page(session).connect(core.ws_url)
            answer = await core.turn(session.session_id or "", "Add 3 to the counter")
            turn = answer.json()
            assert turn["status"] == "completed", turn
            (call,) = turn["toolCalls"]
            assert call["args"] is None
            assert call["result"]["error"]["code"] == "INVALID_ARGS"
            assert page.frames("tool.request") == [] and counter["runs"] == 0
            history = core.registry.get(session.session_id).record.history
            assert lone_surrogate_at(history) is None

    try:
        asyncio.run(asyncio.wait_for(main(), 30))
    finally:
        server.stopping.set()
        server.server.shutdown()
        server.server.server_close()
        server.thread.join(5)
    assert not server.problems, server.problems
    ((_, result, _),) = results_sent(server, 1)
    assert result["error"]["message"] == (
        "the args hold a lone surrogate at $.delta: text must be valid Unicode; "
        "the call was not made")


# --- error messages quote an excerpt -------------------------------------------------------


def huge_frames(size: int) -> list[str]:
    """Frames each refused with a message about a value of about ``size`` bytes."""
    value = "v" * size
    tool = {"name": "t", "description": "d", "argsSchema": {"type": "object"}}
    return [json.dumps(frame) for frame in (
        {"type": value},  # UNKNOWN_TYPE
        {"type": "tool.result", "toolRequestId": "r", "result": 1, "handledBy": value},
        {"type": "tools.update", "tools": [{**tool, "name": value}]},  # INVALID_TOOL
        {"type": "tools.update", "tools": [{**tool, "annotations": {value: 1}}]},
        {"type": "tools.update", "tools": [{**tool, "argsSchema": {
            "type": "object", "properties": {"p": {"type": value}}}}]},
        {"type": "tools.update", "tools": [{**tool, "argsSchema": {
            "type": "object", "properties": {"p": {"minLength": [value]}}}}]},
        {"type": "tools.update", "tools": [{**tool, "argsSchema": {  # a key in the path
            "type": "object", "properties": {value: {"type": "bogus"}}}}]},
    )]


def test_300_frames_quoting_a_1_mib_value_get_small_error_frames() -> None:
    size = protocol.MAX_FRAME_BYTES - 300

    async def main() -> None:
        # (at once: a client is allowed 4 MiB of metadata at once, then 1 MiB a second,
        # and its frames are read at 2 MiB a second)
        async with running_core(config(metadata_rate=1e9, read_rate=1e12)) as core:
            client = await RawClient.open(core.ws_url, max_size=None)
            assert (await client.hello([]))["type"] == "welcome"
            frames = huge_frames(size)
            largest = 0
            for index in range(300):
                await client.send(frames[index % len(frames)])
                error = await client.ws.recv()
                assert '"type":"error"' in error and "vvvvv" in error, error[:300]
                largest = max(largest, len(error))
            assert largest < 1024, largest  # not 1 MiB: at most MAX_EXCERPT of the value
            await client.close()

    run(main(), timeout=180)


def test_the_pages_runtime_refuses_a_lone_surrogate_at_its_source() -> None:
    """A handler's result (the caller gets TOOL_RESULT_INVALID at once, not a timeout)
    and the user's text (send_text raises): a browser would otherwise send U+FFFD."""
    async def main() -> None:
        async with running_core() as core:
            session = Session()
            session.add_tool(define_tool(
                name="echo", description="Echo.", args_schema={"type": "object"},
                handler=lambda args: {"text": args["text"] + "\udc00"}))
            page = await Page(session).connect(core.ws_url)
            answer = await core.tool_call(session.session_id or "", "echo", {"text": "a"},
                                          timeoutMs=60_000)
            error = answer.json()["result"]["error"]
            assert error["code"] == "TOOL_RESULT_INVALID"
            assert error["details"]["path"] == "$.text"
            with pytest.raises(ValueError, match="lone surrogate"):
                await session.send_text("hi \ud800")
            assert page.frames_out[-1]["type"] == "tool.result"  # no turn.start went out

    run(main())


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_models_answer_naming_a_tool_with_a_lone_surrogate_fails_the_turn(
        provider: str) -> None:
    transcript = json.loads((TRANSCRIPTS / f"{provider}_one_tool_call.json").read_text())
    del transcript["exchanges"][1:]
    events = transcript["exchanges"][0]["response"]["events"]
    for index, event in enumerate(events):
        text = json.dumps(event)
        if '"update_counter"' in text:
            events[index] = json.loads(text.replace('"update_counter"', '"update_\\ud800"'))
    server = StandIn(transcript)
    server.thread.start()
    try:
        turn = turn_with("Add 3 to the counter")
        with pytest.raises(ModelError, match="answer holds a lone surrogate at ") as failed:
            run_agent(agent_for(server), turn)
    finally:
        server.stopping.set()
        server.server.shutdown()
        server.server.server_close()
        server.thread.join(5)
    assert lone_surrogate_at(str(failed.value)) is None  # the path is escaped
    assert turn.batches == [] and lone_surrogate_at(turn.history) is None
