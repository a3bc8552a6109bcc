"""MCP: a real Core, a page (a real Session over a WebSocket), the official ``mcp`` client.

Every client here is the SDK's own (``streamable_http_client`` + ``ClientSession``), with
the admin token as a bearer header, on loopback; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from corekit import (
    TOKEN,
    WAIT,
    Core,
    Page,
    config,
    next_of,
    page_with,
    progress,
    result,
    run,
    running_core,
    until,
)
from mcp import ClientSession, types
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import ToolsListChanged
from mcpkit import COUNTER_SCHEMA, mcp_client, modern_client, page_session

from pedelec_pyodide import Session, ToolError, define_tool
from pedelec_pyodide.core.http import mcp as mcp_endpoint


def mcp_url(core: Core, session_id: str) -> str:
    return f"http://127.0.0.1:{core.port}/pedelec/v1/sessions/{session_id}/mcp"


def text_of(result: types.CallToolResult) -> str:
    [block] = result.content
    assert isinstance(block, types.TextContent)
    return block.text


def test_lists_the_pages_tools_as_given() -> None:
    async def main() -> None:
        async with running_core() as core:
            page = await Page(page_session()).connect(core.ws_url)
            async with mcp_client(mcp_url(core, page.session.session_id or "")) as client:
                init = client.initialize_result
                assert init is not None
                assert init.capabilities.tools is not None
                assert init.capabilities.tools.list_changed is True
                listed = await client.list_tools()
                tools = {t.name: t for t in listed.tools}
                assert list(tools) == ["update_counter", "get_items", "fail", "hang"]
                counter = tools["update_counter"]
                assert counter.description == "Adds delta to the counter."
                assert counter.input_schema == COUNTER_SCHEMA
                assert counter.annotations == types.ToolAnnotations(
                    title="Update the counter", idempotent_hint=False, destructive_hint=False)
                # "type": "object" is added only where the schema has none
                assert tools["get_items"].input_schema == {"type": "object", "properties": {}}
                assert tools["get_items"].annotations == types.ToolAnnotations(
                    read_only_hint=True)
                assert tools["fail"].annotations is None

    run(main())


def test_calls_reach_the_page_and_come_back_as_content() -> None:
    async def main() -> None:
        async with running_core() as core:
            page = await Page(page_session()).connect(core.ws_url)
            async with mcp_client(mcp_url(core, page.session.session_id or "")) as client:
                first = await client.call_tool("update_counter", {"delta": 2})
                second = await client.call_tool("update_counter", {"delta": 3})
                assert second.is_error is False
                assert second.structured_content == {"value": 5}
                assert json.loads(text_of(second)) == {"value": 5}
                assert first.structured_content == {"value": 2}
                # a result that is not an object is wrapped for structuredContent only
                items = await client.call_tool("get_items", {})
                assert items.structured_content == {"result": ["a", "b"]}
                assert text_of(items) == '["a","b"]'
            # the same path as every tool request: sent to the page, one each
            assert [f["tool"] for f in page.frames("tool.request")] == [
                "update_counter", "update_counter", "get_items"]
            assert all(f["turnId"] is None for f in page.frames("tool.request"))

    run(main())


def test_a_long_result_is_text_only_and_a_long_error_result_keeps_its_code() -> None:
    """A result over 16 KiB as compact JSON has no structuredContent (optional in MCP for
    a tool with no output schema): the SDK's serializer walked it item by item, several times,
    on Core's event loop (~0.2-0.4 s each for 1 MiB of small arrays)."""
    rows = [[n, "x"] for n in range(5_000)]

    def failing(args: dict[str, Any]) -> None:
        raise ToolError("TOO_MANY", "too many rows", details={"rows": rows}, retryable=False)

    tools = Session([
        define_tool(name="rows", description="Many rows.", args_schema={"type": "object"},
                    handler=lambda args: {"rows": rows, "echo": args}),
        define_tool(name="fails", description="Fails, long.", args_schema={"type": "object"},
                    handler=failing),
        define_tool(name="nulls", description="n nulls.", args_schema={"type": "object"},
                    handler=lambda args: [None] * args["n"]),
    ])

    async def main() -> None:
        async with running_core() as core:
            page = await Page(tools).connect(core.ws_url)
            async with modern_client(mcp_url(core, page.session.session_id or "")) as client:
                long = await client.call_tool("rows", {"n": rows})
                assert long.is_error is False and long.structured_content is None
                assert json.loads(text_of(long)) == {"rows": rows, "echo": {"n": rows}}
                failed = await client.call_tool("fails", {})
                assert failed.is_error is True and failed.structured_content is None
                said, whole = failed.content  # its details, as text
                assert isinstance(said, types.TextContent) and isinstance(
                    whole, types.TextContent)
                assert said.text == "TOO_MANY: too many rows"
                assert json.loads(whole.text) == {"error": {
                    "code": "TOO_MANY", "message": "too many rows", "details": {"rows": rows},
                    "retryable": False}}
                # the bound is the compact JSON's length, not an estimate of it
                nulls = await client.call_tool("nulls", {"n": 3_000})
                assert json.loads(text_of(nulls)) == [None] * 3_000
                assert nulls.structured_content == {"result": [None] * 3_000}
                over = await client.call_tool("nulls", {"n": 3_300})
                assert len(text_of(over)) > 16 * 1024 and over.structured_content is None
    run(main())


def test_a_long_calls_args_are_read_by_core_and_the_sdk_gets_a_placeholder(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK held a call's args decoded for the whole call (~50 times their JSON for
    small arrays: 16 pending calls of 0.75 MiB took ~600 MiB) and decoded them on the
    event loop. Core reads a long tools/call body first, in a worker thread, keeps the
    args as text, and hands the SDK the body with a placeholder in their place."""
    set_aside: list[bool] = []
    real = mcp_endpoint._set_aside

    def recording(body: bytes, limit: int) -> Any:
        done = real(body, limit)
        set_aside.append(done is not None)
        return done

    monkeypatch.setattr(mcp_endpoint, "_set_aside", recording)
    rows = [[n, "x"] for n in range(3_000)]
    tools = Session([define_tool(name="echo", description="Its args.",
                                 args_schema={"type": "object"}, handler=lambda args: args)])

    async def main() -> None:
        async with running_core() as core:
            page = await Page(tools).connect(core.ws_url)
            async with modern_client(mcp_url(core, page.session.session_id or "")) as client:
                long = await client.call_tool("echo", {"rows": rows})
                assert json.loads(text_of(long)) == {"rows": rows}
                # a client's own args shaped like the placeholder are args like any other
                forged = {"pedelec.argsAside": "0" * 32}
                assert (await client.call_tool("echo", forged)).structured_content == forged
                deep: Any = rows
                for _ in range(120):
                    deep = [deep]
                refused = await client.call_tool("echo", {"deep": deep})
                assert text_of(refused).startswith("INVALID_ARGS: the page would refuse")
            sid = page.session.session_id or ""
            async with mcp_client(mcp_url(core, sid)) as handshake:  # the other era
                again = await handshake.call_tool("echo", {"rows": rows, "n": 2})
                assert json.loads(text_of(again)) == {"rows": rows, "n": 2}
            assert [f["args"] for f in page.frames("tool.request")] == [
                {"rows": rows}, forged, {"rows": rows, "n": 2}]
    run(main())
    # (the deep one too: refused from Core's own check, the SDK reading a placeholder)
    assert set_aside == [True, True, True]


def test_error_results_are_is_error_with_code_and_message() -> None:
    async def main() -> None:
        async with running_core() as core:
            page = await Page(page_session()).connect(core.ws_url)
            async with mcp_client(mcp_url(core, page.session.session_id or "")) as client:
                failed = await client.call_tool("fail", {})
                assert failed.is_error is True
                assert text_of(failed) == "NOT_TODAY: the page says no"
                assert failed.structured_content == {"error": {
                    "code": "NOT_TODAY", "message": "the page says no", "retryable": False}}
                bad = await client.call_tool("update_counter", {"delta": "x"})
                assert bad.is_error is True
                assert text_of(bad).startswith("INVALID_ARGS: ")
                assert bad.structured_content is not None
                assert bad.structured_content["error"]["details"]["errors"][0]["path"] == (
                    "$.delta")
                missing = await client.call_tool("no_such_tool", {})
                assert missing.is_error is True
                assert text_of(missing).startswith("TOOL_HANDLER_NOT_FOUND: ")
                odd = await client.call_tool("not a name", {})
                assert odd.is_error is True
                assert text_of(odd).startswith("TOOL_HANDLER_NOT_FOUND: ")
            assert "not a name" not in [f["tool"] for f in page.frames("tool.request")]

    run(main())


def test_args_the_page_would_refuse_fail_at_once_and_never_reach_it() -> None:
    async def main() -> None:
        async with running_core() as core:
            page = await Page(page_session()).connect(core.ws_url)
            async with mcp_client(mcp_url(core, page.session.session_id or "")) as client:
                deep: Any = 1
                for _ in range(150):
                    deep = [deep]
                refused = await asyncio.wait_for(
                    client.call_tool("update_counter", {"delta": deep}), 5)
                assert refused.is_error is True
                assert text_of(refused).startswith(
                    "INVALID_ARGS: the page would refuse this tool.request: frame nests deeper")
            assert page.frames("tool.request") == []

    run(main())


def test_a_page_that_does_not_answer_in_time_is_a_tool_timeout() -> None:
    async def main() -> None:
        stall = asyncio.Event()
        async with running_core(config(tool_timeout_ms=300)) as core:
            page = await Page(page_session(stall)).connect(core.ws_url)
            async with mcp_client(mcp_url(core, page.session.session_id or "")) as client:
                result = await client.call_tool("hang", {})
                assert result.is_error is True
                assert text_of(result).startswith("TOOL_TIMEOUT: ")
                assert result.structured_content is not None
                assert result.structured_content["error"]["retryable"] is True
                # the page was told, and a late answer changes nothing
                await page.wait_frame("tool.cancel")
                stall.set()
                await page.wait_frame("error", where=lambda f: f["code"] == "LATE_RESULT")
                after = await client.call_tool("update_counter", {"delta": 1})
                assert after.structured_content == {"value": 1}

    run(main())


def test_a_call_the_client_gives_up_on_is_cancelled_at_the_page() -> None:
    async def main() -> None:
        stall = asyncio.Event()
        async with running_core() as core:
            page = await Page(page_session(stall)).connect(core.ws_url)
            async with mcp_client(mcp_url(core, page.session.session_id or "")) as client:
                with pytest.raises(MCPError):
                    await client.call_tool("hang", {}, read_timeout_seconds=0.3)
                await page.wait_frame("tool.cancel")
                [cancel] = page.frames("tool.cancel")
                assert cancel["reason"] == "the caller went away"
                session = core.registry.get(page.session.session_id)
                assert session.pending == {}

    run(main())


def test_tools_added_and_removed_by_the_page_send_list_changed() -> None:
    async def main() -> None:
        async with running_core() as core:
            page = await Page(page_session()).connect(core.ws_url)
            url = mcp_url(core, page.session.session_id or "")
            inbox: list[Any] = []
            other: list[Any] = []
            async with mcp_client(url, inbox) as client, mcp_client(url, other) as bystander:
                await client.list_tools()

                async def changes(box: list[Any], count: int) -> None:
                    def seen() -> int:
                        return sum(isinstance(m, types.ToolListChangedNotification)
                                   for m in box)

                    while seen() < count:
                        await asyncio.sleep(0.01)

                extra = define_tool(name="greet", description="Says hello.",
                                    args_schema={"type": "object"},
                                    handler=lambda: "hello")
                dispose = page.session.add_tool(extra)
                await asyncio.wait_for(changes(inbox, 1), WAIT)
                await asyncio.wait_for(changes(other, 1), WAIT)
                names = [t.name for t in (await client.list_tools()).tools]
                assert names[-1] == "greet"
                greeting = await client.call_tool("greet", {})
                assert greeting.structured_content == {"result": "hello"}

                dispose()
                await asyncio.wait_for(changes(inbox, 2), WAIT)
                names = [t.name for t in (await client.list_tools()).tools]
                assert "greet" not in names
                await bystander.list_tools()
            session = core.registry.get(page.session.session_id)
            # both clients ended their MCP sessions (DELETE): nobody is left to tell
            assert session.tool_listeners == {}

    run(main())


def test_clients_of_the_per_request_protocol_list_and_call_too() -> None:
    async def main() -> None:
        async with running_core() as core:
            page = await Page(page_session()).connect(core.ws_url)
            http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"},
                                      timeout=WAIT)
            url = mcp_url(core, page.session.session_id or "")
            async with http, streamable_http_client(url, http_client=http) as (read, write), \
                    ClientSession(read, write, read_timeout_seconds=WAIT) as client:
                discovered = await client.discover()  # no handshake, no Mcp-Session-Id
                assert client.protocol_version == "2026-07-28"
                assert discovered.capabilities.tools is not None
                # delivered on subscriptions/listen streams
                assert discovered.capabilities.tools.list_changed is True
                assert len((await client.list_tools()).tools) == 4
                result = await client.call_tool("update_counter", {"delta": 2})
                assert result.structured_content == {"value": 2}

    run(main())


def test_the_token_is_required_and_the_session_must_exist() -> None:
    async def main() -> None:
        async with running_core() as core:
            page = await Page(page_session()).connect(core.ws_url)
            url = mcp_url(core, page.session.session_id or "")
            initialize = {
                "jsonrpc": "2.0", "id": 1, "method": "initialize",
                "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                           "clientInfo": {"name": "probe", "version": "0"}},
            }
            headers = {"Accept": "application/json, text/event-stream"}
            async with httpx.AsyncClient(timeout=WAIT) as anonymous:
                for auth in ({}, {"Authorization": "Bearer wrong"},
                             {"Authorization": f"Basic {TOKEN}"}):
                    response = await anonymous.post(url, json=initialize,
                                                    headers={**headers, **auth})
                    assert response.status_code == 401
                    assert response.headers["www-authenticate"] == "Bearer"
                    assert response.json()["error"]["code"] == "UNAUTHORIZED"
                    assert "Authorization: Bearer" in response.json()["error"]["message"]
                unknown = await anonymous.post(
                    mcp_url(core, "nope"), json=initialize,
                    headers={**headers, "Authorization": f"Bearer {TOKEN}"})
                assert unknown.status_code == 404
                assert unknown.json()["error"]["code"] == "SESSION_NOT_FOUND"
                foreign = await anonymous.post(
                    url, json=initialize, headers={
                        **headers, "Authorization": f"Bearer {TOKEN}",
                        "Origin": "http://evil.example"})
                assert foreign.status_code == 403
            # the official client, without the token, fails to connect (the SDK reports
            # an HTTP 401 as a bare "Server returned an error response")
            with pytest.raises(ExceptionGroup) as failure:
                async with mcp_client(url, token="wrong"):
                    raise AssertionError("connected without the token")
            assert failure.group_contains(MCPError, match="error response")

    run(main())


def test_core_starts_without_loading_the_mcp_sdk() -> None:
    """The SDK (~0.4 s, ~35 MiB) loads on the first MCP request, not with Core."""
    probe = (
        "import asyncio, sys\n"
        "from corekit import config, run, running_core\n"
        "async def main():\n"
        "    async with running_core(config()) as core:\n"
        "        assert (await core.http.get('/pedelec/v1/health')).status_code == 200\n"
        "        print(sorted(m for m in sys.modules if m == 'mcp' or m.startswith('mcp.')))\n"
        "run(main())\n"
    )
    here = Path(__file__).resolve().parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))  # the kits, as here
    done = subprocess.run([sys.executable, "-c", probe], cwd=here, capture_output=True,
                          text=True, timeout=60, check=False, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_sdk_loads_in_a_thread_on_the_first_mcp_request() -> None:
    """Imported on the event loop, its ~0.4 s held every other client that long."""
    probe = (
        "import importlib, sys, threading\n"
        "from corekit import TOKEN, config, run, running_core\n"
        "on_loop = []\n"
        "real = importlib.import_module\n"
        "def recording(name, package=None):\n"
        "    if name == 'pedelec_pyodide.core.http.mcp':\n"
        "        on_loop.append(threading.current_thread() is threading.main_thread())\n"
        "    return real(name, package)\n"
        "importlib.import_module = recording\n"
        "async def main():\n"
        "    async with running_core(config()) as core:\n"
        "        answer = await core.http.post('/pedelec/v1/sessions/none/mcp', json={},\n"
        "                                      headers={'Authorization': 'Bearer ' + TOKEN})\n"
        "        print(answer.status_code, on_loop, 'mcp' in sys.modules)\n"
        "run(main())\n"
    )
    here = Path(__file__).resolve().parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, "-c", probe], cwd=here, capture_output=True,
                          text=True, timeout=60, check=False, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "404 [False] True"


@pytest.mark.parametrize("value", ["NaN", "Infinity", "1e999"])
def test_args_no_page_can_read_are_invalid_args_before_anything_is_stored(
        value: str, tmp_path: Path) -> None:
    """The SDK's JSON parser takes NaN and Infinity; such a call was stored, the store
    refused it, and the client got STORE_FAILED, retryable, which no retry could cure."""
    async def main() -> None:
        async with running_core(config(store=str(tmp_path / "core.sqlite"))) as core:
            page = await Page(page_session()).connect(core.ws_url)
            url = mcp_url(core, page.session.session_id or "")
            headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json",
                       "Accept": "application/json, text/event-stream"}
            async with httpx.AsyncClient(timeout=WAIT) as http:
                opened = await http.post(url, headers=headers, json={
                    "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                        "protocolVersion": "2025-03-26", "capabilities": {},
                        "clientInfo": {"name": "t", "version": "1"}}})
                headers["mcp-session-id"] = opened.headers["mcp-session-id"]
                await http.post(url, headers=headers,
                                json={"jsonrpc": "2.0", "method": "notifications/initialized"})
                answer = await http.post(url, headers=headers, content=(
                    '{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":'
                    f'"update_counter","arguments":{{"delta":{value}}}}}}}'))
            text = answer.text
            assert "INVALID_ARGS: the page would refuse this tool.request" in text, text
            assert "STORE_FAILED" not in text
            assert core.registry.store.problem is None
            assert page.frames("tool.request") == []

    run(main())


# --- long-running tools: progress, cancellation; listen streams (2026-07-28) -----------------


@pytest.mark.parametrize("era", ["handshake", "2026-07-28"])
def test_progress_of_the_pages_handler_reaches_the_clients_progress_callback(era: str) -> None:
    async def main() -> None:
        async with running_core() as core:
            raw, welcome = await page_with(core)
            url = mcp_url(core, welcome["sessionId"])
            updates: list[tuple[float, float | None, str | None]] = []

            async def on_progress(value: float, total: float | None,
                                  message: str | None) -> None:
                updates.append((value, total, message))

            async with contextlib.AsyncExitStack() as stack:
                if era == "handshake":
                    client: Any = await stack.enter_async_context(mcp_client(url))
                else:
                    client = await stack.enter_async_context(modern_client(url))
                    assert client.session.protocol_version == "2026-07-28"
                call = asyncio.create_task(
                    client.call_tool("slow", {}, progress_callback=on_progress))
                rid = (await next_of(raw, "tool.request"))["toolRequestId"]
                await progress(raw, rid, 1, total=4, message="a quarter")
                await until(lambda: len(updates) == 1, "the first progress notification")
                await progress(raw, rid, 3, total=4)
                await progress(raw, rid, 4, total=4)
                await result(raw, rid, {"done": True})
                answer = await asyncio.wait_for(call, WAIT)
                assert answer.structured_content == {"done": True}
                assert updates[0] == (1, 4, "a quarter")
                assert updates[-1] == (4, 4, None)  # the last one, before the result
                assert [value for value, _, _ in updates] in ([1, 3, 4], [1, 4])

    run(main())


@pytest.mark.parametrize("era", ["handshake", "2026-07-28"])
def test_a_call_the_client_cancels_sends_tool_cancel_to_the_page(era: str) -> None:
    async def main() -> None:
        async with running_core() as core:
            raw, welcome = await page_with(core)
            sid = welcome["sessionId"]
            url = mcp_url(core, sid)
            async with contextlib.AsyncExitStack() as stack:
                if era == "handshake":
                    client: Any = await stack.enter_async_context(mcp_client(url))
                else:
                    client = await stack.enter_async_context(modern_client(url))
                call = asyncio.create_task(client.call_tool("slow", {}))
                rid = (await next_of(raw, "tool.request"))["toolRequestId"]
                call.cancel()  # notifications/cancelled, or the call's stream closed
                cancel = await next_of(raw, "tool.cancel")
                assert cancel["toolRequestId"] == rid
                await until(lambda: core.registry.get(sid).pending == {}, "the cancel")
                assert core.registry.get(sid).callers.kept(rid).result.value()["error"]["code"] \
                    == "TOOL_CANCELLED"

    run(main())


def test_clients_of_the_per_request_protocol_hear_of_new_tools_by_listening() -> None:
    async def main() -> None:
        async with running_core() as core:
            page = await Page(page_session()).connect(core.ws_url)
            url = mcp_url(core, page.session.session_id or "")
            async with modern_client(url) as client:
                capabilities = client.session.server_capabilities  # from server/discover
                assert capabilities is not None and capabilities.tools is not None
                assert capabilities.tools.list_changed is True
                assert len((await client.list_tools()).tools) == 4
                async with client.listen(tools_list_changed=True) as changes:
                    assert changes.honored.tools_list_changed is True
                    dispose = page.session.add_tool(define_tool(
                        name="greet", description="Says hello.",
                        args_schema={"type": "object"}, handler=lambda: "hello"))
                    event = await asyncio.wait_for(changes.__anext__(), WAIT)
                    assert isinstance(event, ToolsListChanged)
                    names = [t.name for t in (await client.list_tools()).tools]
                    assert names[-1] == "greet"
                    dispose()
                    event = await asyncio.wait_for(changes.__anext__(), WAIT)
                    assert "greet" not in [t.name for t in (await client.list_tools()).tools]
            # another page's changes are not this page's
            other = await Page(page_session()).connect(core.ws_url)
            async with modern_client(url) as client, \
                    client.listen(tools_list_changed=True) as changes:
                other.session.add_tool(define_tool(
                    name="elsewhere", description="Elsewhere.",
                    args_schema={"type": "object"}, handler=lambda: None))
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(changes.__anext__(), 0.3)

    run(main())


TS_CLIENT = Path(__file__).resolve().parent / "mcp_ts_client.mjs"


@contextlib.asynccontextmanager
async def ts_client(url: str, *args: str) -> AsyncIterator[asyncio.subprocess.Process]:
    """The official TypeScript SDK's client (tests/core/mcp_ts_client.mjs), stopped after."""
    child = await asyncio.create_subprocess_exec(
        "node", str(TS_CLIENT), url, TOKEN, *args, stdout=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.PIPE, cwd=TS_CLIENT.parents[2])
    try:
        yield child
        assert child.stdin is not None
        child.stdin.close()  # the client closes; then it ends
        assert await asyncio.wait_for(child.wait(), WAIT) == 0
    finally:
        if child.returncode is None:
            child.kill()
        await asyncio.wait_for(child.wait(), WAIT)


async def line_of(child: asyncio.subprocess.Process) -> dict[str, Any]:
    assert child.stdout is not None
    line = await asyncio.wait_for(child.stdout.readline(), WAIT * 2)
    assert line, "the TypeScript client ended early"
    data: dict[str, Any] = json.loads(line)
    return data


def test_progress_reaches_the_typescript_sdks_onprogress_and_its_abort_cancels() -> None:
    async def main() -> None:
        async with running_core() as core:
            raw, welcome = await page_with(core)
            url = mcp_url(core, welcome["sessionId"])
            async with ts_client(url, "slow") as child:
                assert await line_of(child) == {"called": True}
                rid = (await next_of(raw, "tool.request"))["toolRequestId"]
                await progress(raw, rid, 1, total=2, message="half")
                first = (await line_of(child))["progress"]
                assert first == {"progress": 1, "total": 2, "message": "half"}
                await progress(raw, rid, 2, total=2)
                assert (await line_of(child))["progress"] == {"progress": 2, "total": 2}
                await result(raw, rid, {"done": True})
                assert (await line_of(child))["result"]["structuredContent"] == {"done": True}
            async with ts_client(url, "slow", "cancel") as child:
                assert await line_of(child) == {"called": True}
                rid = (await next_of(raw, "tool.request"))["toolRequestId"]
                await progress(raw, rid, 1)
                assert "progress" in await line_of(child)
                assert "aborted" in await line_of(child)
                cancel = await next_of(raw, "tool.cancel")  # notifications/cancelled
                assert cancel["toolRequestId"] == rid

    run(main())
