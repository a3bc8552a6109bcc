"""MCP on several Core nodes on one Redis (a real redis-server of each test's own): an
MCP client (the official SDK) on a node that does not hold the page lists its tools,
calls them, hears their progress and cancels them; the page's node is SIGKILLed with a
call waiting, and the call is answered once the page resumes on a third node; clients of
both protocols work through HAProxy running ``deploy/haproxy.cfg``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path
from typing import Any

import pytest
from clusterkit import answer_requests, cluster
from corekit import (
    WAIT,
    Core,
    Page,
    RawClient,
    config,
    core_process,
    next_of,
    page_with,
    progress,
    result,
    run,
    running_core,
    start_core,
    tool_meta,
    until,
)
from mcp import types
from mcp.shared.subscriptions import ToolsListChanged
from mcpkit import mcp_at, mcp_client, modern_client, page_session
from storekit import RedisServer, free_port

from pedelec_pyodide import define_tool
from pedelec_pyodide.core.cluster import relay
from pedelec_pyodide.core.cluster.leases import VACANT_SECONDS
from pedelec_pyodide.core.cluster.messages import (
    McpCall,
    McpCancel,
    McpProgress,
    NodeMessage,
)
from pedelec_pyodide.core.http import mcp
from pedelec_pyodide.core.store import STORE_UNAVAILABLE


@contextlib.asynccontextmanager
async def client_of(era: str, url: str) -> Any:
    """The SDK's client of the handshake protocol, or of the per-request one."""
    async with (mcp_client(url) if era == "handshake" else modern_client(url)) as client:
        yield client


@pytest.mark.parametrize("era", ["handshake", "2026-07-28"])
def test_a_client_on_a_node_without_the_page_lists_calls_hears_progress_and_cancels(
        redis_server: RedisServer, era: str) -> None:
    async def main() -> None:
        cfg = {"store": redis_server.url}
        async with running_core(config(**cfg)) as a, running_core(config(**cfg)) as b:
            raw, welcome = await page_with(a)
            sid = welcome["sessionId"]
            await until(lambda: sid in a.registry.sessions)
            updates: list[tuple[float, float | None, str | None]] = []

            async def on_progress(value: float, total: float | None,
                                  message: str | None) -> None:
                updates.append((value, total, message))

            async with client_of(era, mcp_at(b.port, sid)) as client:
                listed = await client.list_tools()
                assert [tool.name for tool in listed.tools] == ["slow"]

                call = asyncio.create_task(
                    client.call_tool("slow", {"n": 1}, progress_callback=on_progress))
                rid = (await next_of(raw, "tool.request"))["toolRequestId"]
                await progress(raw, rid, 1, total=4, message="a quarter")
                await until(lambda: len(updates) == 1, "the first progress notification")
                await progress(raw, rid, 4, total=4)
                await result(raw, rid, {"done": True})
                answer = await asyncio.wait_for(call, WAIT)
                assert answer.structured_content == {"done": True}, answer
                assert updates[0] == (1, 4, "a quarter")
                assert updates[-1] == (4, 4, None)

                call = asyncio.create_task(client.call_tool("slow", {"n": 2}))
                rid = (await next_of(raw, "tool.request"))["toolRequestId"]
                call.cancel()  # notifications/cancelled, or the call's stream closed
                cancel = await next_of(raw, "tool.cancel")
                assert cancel["toolRequestId"] == rid
                await until(lambda: a.registry.sessions[sid].pending == {}, "the cancel")
            assert sid not in b.registry.sessions  # relayed, never taken from A
            await raw.close()

    run(main())


@pytest.mark.parametrize("resume", ["at_once", "after_the_lease"])
def test_a_call_waiting_on_one_node_is_answered_once_after_the_pages_node_is_killed(
        redis_server: RedisServer, resume: str) -> None:
    """The page is on A (a process of its own); an MCP call arrives at B and is relayed
    to A; A is SIGKILLed before the page answers. The page resumes on C: the request is
    sent again with its id, the page's handler runs once, and B's client gets its result.
    ``after_the_lease``: the page comes back only once A's lease has run out and B has
    taken the session to wait there; C takes it from B, and B relays the call to C."""

    async def main() -> None:
        cfg = {"store": redis_server.url}
        async with core_process(redis_server.url, free_port()) as a, \
                running_core(config(**cfg)) as b, running_core(config(**cfg)) as c:
            first = await RawClient.open(f"ws://127.0.0.1:{a.args[-1]}/pedelec/v1/bridge")
            welcome = await first.hello([tool_meta("a")])
            sid, token = welcome["sessionId"], welcome["resumeToken"]
            # after the lease, B first waits VACANT_SECONDS for it to come back (adopt)
            async with modern_client(mcp_at(b.port, sid),
                                     read_timeout=WAIT + VACANT_SECONDS) as client:
                call = asyncio.create_task(client.call_tool("a", {"n": 1}))
                sent = await next_of(first, "tool.request")
                a.kill()
                await asyncio.to_thread(a.wait, WAIT)
                if resume == "after_the_lease":
                    # the lease runs out, then B waits for it to come back (adopt)
                    await until(lambda: sid in b.registry.sessions, "B taking the session",
                                WAIT + VACANT_SECONDS)

                page = await RawClient.open(c.ws_url)
                assert (await page.hello([tool_meta("a")], sessionId=sid,
                                         resumeToken=token))["resumed"]
                ran: list[str] = []
                handlers = asyncio.ensure_future(answer_requests(page, ran))
                try:
                    answer = await asyncio.wait_for(call, 3 * WAIT)
                    assert answer.structured_content == {"ok": True, "data": {"n": 1}}, answer
                    assert ran == [sent["toolRequestId"]]
                    assert sid in c.registry.sessions and sid not in b.registry.sessions
                finally:
                    handlers.cancel()
                    await page.close()

    run(main(), timeout=90)


def test_through_haproxy_clients_of_both_protocols_reach_the_page_from_any_node(
        redis_server: RedisServer, tmp_path: Path) -> None:
    """Three nodes behind HAProxy: a client of the handshake protocol keeps its MCP
    session on one node (HAProxy sticks on Mcp-Session-Id), one of the per-request
    protocol lands on any node; each call reaches the page, wherever its socket is."""

    async def main() -> None:
        async with cluster(redis_server.url, 3, tmp_path) as nodes:
            page = await RawClient.open(nodes.ws_url)
            sid = (await page.hello([tool_meta("a")]))["sessionId"]
            ran: list[str] = []
            handlers = asyncio.ensure_future(answer_requests(page, ran))
            try:
                for era in ("handshake", "2026-07-28"):
                    async with client_of(era, mcp_at(nodes.port, sid)) as client:
                        listed = await client.list_tools()
                        assert [tool.name for tool in listed.tools] == ["a"]
                        for n in range(4):  # round robin: most land on other nodes
                            answer = await client.call_tool("a", {"n": n})
                            assert answer.structured_content == {
                                "ok": True, "data": {"n": n}}, answer
                assert len(ran) == len(set(ran)) == 8
            finally:
                handlers.cancel()
                await page.close()

    run(main(), timeout=60)


def test_an_unknown_page_is_a_404_and_redis_away_a_503(redis_server: RedisServer) -> None:
    """On a node without the page, before any MCP: a session no node holds nor stored is
    404 SESSION_NOT_FOUND; with Redis away, which node holds the page cannot be known:
    503 STORE_UNAVAILABLE, as the control API says it."""

    async def main() -> None:
        cfg = {"store": redis_server.url, "store_timeout": 0.5}
        async with running_core(config(**cfg)) as a, running_core(config(**cfg)) as b:
            raw, welcome = await page_with(a, "a")
            sid = welcome["sessionId"]
            missing = await b.http.post("/pedelec/v1/sessions/nope/mcp", json={})
            assert missing.status_code == 404, missing.text
            assert missing.json()["error"]["code"] == "SESSION_NOT_FOUND"
            redis_server.kill()
            away = await b.http.post(f"/pedelec/v1/sessions/{sid}/mcp", json={})
            assert away.status_code == 503, away.text
            assert away.json()["error"]["code"] == STORE_UNAVAILABLE
            await raw.close()

    run(main())


def test_clients_on_another_node_hear_of_the_pages_new_tools(
        redis_server: RedisServer) -> None:
    """The page (a real Session) on A adds a tool, then removes it: a client of the
    handshake protocol on B gets list_changed each time, one of the per-request protocol
    listening on B hears of it too, and their tools/list shows the change."""

    async def main() -> None:
        cfg = {"store": redis_server.url}
        async with running_core(config(**cfg)) as a, running_core(config(**cfg)) as b:
            page = await Page(page_session()).connect(a.ws_url)
            sid = page.session.session_id or ""
            url = mcp_at(b.port, sid)
            inbox: list[Any] = []

            async def changes(count: int) -> None:
                while sum(isinstance(m, types.ToolListChangedNotification)
                          for m in inbox) < count:
                    await asyncio.sleep(0.01)

            async with mcp_client(url, inbox) as client, modern_client(url) as modern, \
                    modern.listen(tools_list_changed=True) as heard:
                await client.list_tools()
                dispose = page.session.add_tool(define_tool(
                    name="greet", description="Says hello.",
                    args_schema={"type": "object"}, handler=lambda: "hello"))
                await asyncio.wait_for(changes(1), WAIT)
                assert isinstance(await asyncio.wait_for(heard.__anext__(), WAIT),
                                  ToolsListChanged)
                names = [t.name for t in (await client.list_tools()).tools]
                assert names[-1] == "greet", names
                dispose()
                await asyncio.wait_for(changes(2), WAIT)
                await asyncio.wait_for(heard.__anext__(), WAIT)
                assert "greet" not in [t.name for t in (await modern.list_tools()).tools]
            assert sid not in b.registry.sessions

    run(main())


@pytest.mark.parametrize("era", ["handshake", "2026-07-28"])
@pytest.mark.parametrize("resume", ["at_once", "after_the_lease"])
def test_a_cancel_sent_while_the_pages_node_is_dead_is_applied_where_the_page_resumes(
        redis_server: RedisServer, resume: str, era: str) -> None:
    """The page is on A; B's client calls, the call is relayed to A, A is SIGKILLed and
    the client cancels (``notifications/cancelled``, or at 2026-07-28 the call's stream
    closed): the cancel is kept on B and passed on once another node holds
    the page. ``at_once``: the page resumes on C, which sends the request again (its
    id); then C tells the page ``tool.cancel`` for it. ``after_the_lease``: A's lease runs
    out first, B takes the session and cancels the request there; the page resumes on C
    and the request is never sent again. Either way the page's late result is refused
    and the request's kept result is TOOL_CANCELLED: nothing ran to a result."""

    async def main() -> None:
        cfg = {"store": redis_server.url}
        async with core_process(redis_server.url, free_port()) as a, \
                running_core(config(**cfg)) as b, running_core(config(**cfg)) as c:
            first = await RawClient.open(f"ws://127.0.0.1:{a.args[-1]}/pedelec/v1/bridge")
            welcome = await first.hello([tool_meta("a")])
            sid, token = welcome["sessionId"], welcome["resumeToken"]
            async with client_of(era, mcp_at(b.port, sid)) as client:
                call = asyncio.create_task(client.call_tool("a", {"n": 1}))
                rid = (await next_of(first, "tool.request"))["toolRequestId"]
                a.kill()
                await asyncio.to_thread(a.wait, WAIT)
                call.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await call
                if resume == "after_the_lease":
                    # the lease runs out, then B waits for it to come back (adopt)
                    await until(lambda: sid in b.registry.sessions, "B taking the session",
                                WAIT + VACANT_SECONDS)
                    await until(lambda: b.registry.sessions[sid].pending == {},
                                "the cancel applied on B")

                page = await RawClient.open(c.ws_url)
                assert (await page.hello([tool_meta("a")], sessionId=sid,
                                         resumeToken=token))["resumed"]
                if resume == "at_once":
                    assert (await next_of(page, "tool.request"))["toolRequestId"] == rid
                    cancel = await next_of(page, "tool.cancel")
                    assert cancel["toolRequestId"] == rid
                # the handler started on A ends: its result comes too late for anyone
                await page.send({"type": "tool.result", "toolRequestId": rid,
                                 "result": {"ok": True, "data": {}}, "handledBy": "named"})
                refused = await asyncio.wait_for(page.recv(), WAIT)
                assert refused["type"] == "error", refused  # not a tool.request again
                session = c.registry.sessions[sid]
                assert session.pending == {}
                kept = session.callers.kept(rid)
                assert kept is not None and kept.result.value()["error"]["code"] == "TOOL_CANCELLED"
                assert sid not in b.registry.sessions
                await page.close()

    run(main(), timeout=90)


def nested(depth: int) -> Any:
    deep: Any = 1
    for _ in range(depth):
        deep = [deep]
    return deep


def test_a_cancel_that_comes_while_a_relayed_call_is_prepared_stops_it(
        redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A call relayed to the page's node has its args' print and frame made before its
    key is claimed (in a worker thread when they are long). A cancel that comes meanwhile
    finds no key to cancel, so it is remembered; the call, once prepared, looks again and
    never reaches the page (it did, found by a reviewer, and nobody waited for it)."""
    gate = asyncio.Event()
    real = relay.prepare_call

    async def held(*args: Any, **kwargs: Any) -> relay.PreparedCall:
        await gate.wait()
        return await real(*args, **kwargs)

    monkeypatch.setattr(relay, "prepare_call", held)

    async def main() -> None:
        cfg = {"store": redis_server.url}
        async with running_core(config(**cfg)) as a, running_core(config(**cfg)) as b:
            raw, welcome = await page_with(a)
            sid = welcome["sessionId"]
            key = "pedelec-mcp-" + "3" * 32
            a.node._on_message(McpCall(ask="call", sender=b.node.name, session=sid,
                                       tool="slow", args={"n": 1}, key=key))
            await asyncio.sleep(0)  # its preparation under way
            a.node._on_message(McpCancel(ask="cancel", sender=b.node.name, key=key,
                                         session=sid))
            gate.set()
            a.node._on_message(McpCall(ask="other", sender=b.node.name, session=sid,
                                       tool="slow", args={"n": 2},
                                       key="pedelec-mcp-" + "4" * 32))
            assert (await next_of(raw, "tool.request"))["args"] == {"n": 2}
            await raw.close()

    run(main())


def test_a_copy_of_a_call_reaching_its_node_again_is_not_run_again(
        redis_server: RedisServer) -> None:
    """One call (one key) reaches the page's node twice (its caller sends it again until
    the node says it has it): the copy that comes while the first is served is not run
    on its own, whatever it holds; a call under another key is. The first copy here
    ends at once (refused: its args nest too deep) and the second would wait on the
    page: the page's first request is the other call's. A cancel for the key then
    finds nothing to cancel, and nothing of the key runs later either."""

    async def main() -> None:
        cfg = {"store": redis_server.url}
        async with running_core(config(**cfg)) as a, running_core(config(**cfg)) as b:
            raw, welcome = await page_with(a)
            sid = welcome["sessionId"]

            def relayed(key: str, args: Any, ask: str) -> McpCall:
                return McpCall(ask=ask, sender=b.node.name, session=sid, tool="slow",
                               args=args, key=key)

            key = "pedelec-mcp-" + "0" * 32
            # taken from A's inbox before either runs, as from one read of Redis
            a.node._on_message(relayed(key, nested(150), "first"))
            a.node._on_message(relayed(key, {"n": 1}, "second"))
            a.node._on_message(relayed("pedelec-mcp-" + "1" * 32, {"n": 2}, "other"))
            assert (await next_of(raw, "tool.request"))["args"] == {"n": 2}
            await b.node.tell(a.node.name, McpCancel(ask="cancel", sender=b.node.name,
                                                     key=key, session=sid))
            a.node._on_message(relayed(key, {"n": 1}, "third"))  # cancelled: never runs
            a.node._on_message(relayed("pedelec-mcp-" + "2" * 32, {"n": 3}, "last"))
            assert (await next_of(raw, "tool.request"))["args"] == {"n": 3}
            await raw.close()

    run(main())


def test_args_are_checked_once_on_each_node_a_call_passes(
        redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """On Redis: a call to the page's own node checks its args once (not once by the MCP
    handler, then again for its request); a call relayed from another node once there
    (to refuse bad args at once, wherever the page is) and once by the node that sends
    the request; bad args relayed: one INVALID_ARGS, checked once, nothing sent."""
    checks: list[str] = []
    real = relay.checked_call

    def counted(tool: str, args: Any, max_frame_bytes: int) -> Any:
        checks.append(tool)
        return real(tool, args, max_frame_bytes)

    monkeypatch.setattr(relay, "checked_call", counted)
    monkeypatch.setattr(mcp, "checked_call", counted)

    async def main() -> None:
        cfg = {"store": redis_server.url}
        async with running_core(config(**cfg)) as a, running_core(config(**cfg)) as b:
            page = await RawClient.open(a.ws_url)
            sid = (await page.hello([tool_meta("a")]))["sessionId"]
            ran: list[str] = []
            handlers = asyncio.ensure_future(answer_requests(page, ran))
            try:
                async with modern_client(mcp_at(a.port, sid)) as here, \
                        modern_client(mcp_at(b.port, sid)) as there:
                    answer = await asyncio.wait_for(here.call_tool("a", {"n": 1}), WAIT)
                    assert answer.structured_content == {"ok": True, "data": {"n": 1}}
                    assert len(checks) == 1, checks
                    answer = await asyncio.wait_for(there.call_tool("a", {"n": 2}), WAIT)
                    assert answer.structured_content == {"ok": True, "data": {"n": 2}}
                    assert len(checks) == 3, checks
                    refused = await asyncio.wait_for(
                        there.call_tool("a", {"n": nested(150)}), WAIT)
                    assert refused.is_error is True
                    assert len(refused.content) == 1
                    assert getattr(refused.content[0], "text", "").startswith(
                        "INVALID_ARGS: the page would refuse this tool.request: "
                        "frame nests deeper"), refused
                    assert len(checks) == 4, checks
                assert len(ran) == 2
            finally:
                handlers.cancel()
                await page.close()

    run(main())


def test_bad_messages_in_a_nodes_inbox_are_dropped_and_it_serves_on(
        redis_server: RedisServer) -> None:
    """Messages no node sends, published to both nodes' inboxes (JSON nested past the
    recursion limit, a progress no float holds, fields of the wrong types, a type no node
    sends, a reply to no ask) while a call is
    relayed from B to A: each is dropped, and the call's progress and result get through."""

    async def main() -> None:
        cfg = {"store": redis_server.url}
        async with running_core(config(**cfg)) as a, running_core(config(**cfg)) as b:
            raw, welcome = await page_with(a)
            sid = welcome["sessionId"]
            updates: list[float] = []

            async def on_progress(value: float, total: float | None,
                                  message: str | None) -> None:
                updates.append(value)

            async with modern_client(mcp_at(b.port, sid)) as client:
                call = asyncio.create_task(
                    client.call_tool("slow", {"n": 1}, progress_callback=on_progress))
                rid = (await next_of(raw, "tool.request"))["toolRequestId"]
                key = next(iter(b.node.handlers[McpProgress].__self__._watching))
                progress_of = {"type": "mcp.progress", "key": key}
                bad = ["[" * 100_000 + "]" * 100_000, "not json", "[1]", '"mcp.call"',
                       json.dumps({"type": "mcp.call", "session": sid}),
                       json.dumps({"type": "mcp.cancel", "key": key}),
                       json.dumps({"type": "mcpCancel", "key": key}),
                       json.dumps({**progress_of, "progress": 10 ** 400}),
                       json.dumps({**progress_of, "progress": 2, "total": "all"}),
                       json.dumps({**progress_of, "progress": [2]}),
                       json.dumps({**progress_of, "progress": True}),
                       json.dumps({"type": "mcp.reply", "ask": "nobody's", "result": 1})]
                for node in (a, b):
                    for text in bad:
                        await b.registry.store.publish(node.registry.node, text)
                await progress(raw, rid, 1)
                await until(lambda: updates == [1], "the page's progress")
                await result(raw, rid, {"done": True})
                answer = await asyncio.wait_for(call, WAIT)
                assert answer.structured_content == {"done": True}, answer
                assert updates == [1]
            await raw.close()

    run(main())


def test_a_call_relayed_again_passes_on_only_progress_that_increases(
        redis_server: RedisServer) -> None:
    """The page reports progress 1 on A, B's client hears it; A is SIGKILLed, the page
    resumes on C and reports its progress again (as a page does after a welcome); B
    relays the call to C, which passes that progress on: B's client does not hear 1
    twice (MCP: progress increases with each notification)."""

    async def main() -> None:
        cfg = {"store": redis_server.url}
        async with core_process(redis_server.url, free_port()) as a, \
                running_core(config(**cfg)) as b, running_core(config(**cfg)) as c:
            first = await RawClient.open(f"ws://127.0.0.1:{a.args[-1]}/pedelec/v1/bridge")
            welcome = await first.hello([tool_meta("a")])
            sid, token = welcome["sessionId"], welcome["resumeToken"]
            updates: list[float] = []

            async def on_progress(value: float, total: float | None,
                                  message: str | None) -> None:
                updates.append(value)

            async with modern_client(mcp_at(b.port, sid)) as client:
                call = asyncio.create_task(
                    client.call_tool("a", {"n": 1}, progress_callback=on_progress))
                rid = (await next_of(first, "tool.request"))["toolRequestId"]
                await progress(first, rid, 1)
                await until(lambda: updates == [1], "the first progress")
                a.kill()
                await asyncio.to_thread(a.wait, WAIT)
                page = await RawClient.open(c.ws_url)
                assert (await page.hello([tool_meta("a")], sessionId=sid,
                                         resumeToken=token))["resumed"]
                assert (await next_of(page, "tool.request"))["toolRequestId"] == rid
                await progress(page, rid, 1)
                # B's call relayed to C waits there: it has had C's progress
                await until(lambda: bool(c.registry.sessions[sid].pending[rid].watchers),
                            "the call relayed to C")
                await result(page, rid, {"done": True})
                answer = await asyncio.wait_for(call, 2 * WAIT)
                assert answer.structured_content == {"done": True}, answer
                assert updates == [1]
                await page.close()

    run(main(), timeout=90)


def test_a_node_stopping_passes_its_clients_cancels_on_and_keeps_none(
        redis_server: RedisServer) -> None:
    """B stops while its client's call waits on A's page: the call is cancelled there
    (the page gets ``tool.cancel``), and no cancel of B's outlives B."""

    async def main() -> None:
        cfg = {"store": redis_server.url}
        async with running_core(config(**cfg)) as a:
            raw, welcome = await page_with(a)
            sid = welcome["sessionId"]
            b = await start_core(config(**cfg))
            client_relay = b.node.handlers[McpCancel].__self__
            try:
                async with modern_client(mcp_at(b.port, sid)) as client:
                    call = asyncio.create_task(client.call_tool("slow", {"n": 1}))
                    rid = (await next_of(raw, "tool.request"))["toolRequestId"]
                    await b.stop()
                    assert (await next_of(raw, "tool.cancel"))["toolRequestId"] == rid
                    assert client_relay._cancelling == {}
                    call.cancel()
                    with contextlib.suppress(BaseException):
                        await call
            finally:
                if not b.task.done():
                    await b.stop()
            await raw.close()

    run(main())


def lose_the_first(core: Core, kind: type[NodeMessage]) -> list[NodeMessage]:
    """``core`` drops the first message of ``kind`` it gets (as pub/sub loses one sent
    while an inbox reconnects) and hears the rest; the list of those it dropped."""
    heard = core.node.handlers[kind]
    lost: list[NodeMessage] = []

    def losing_the_first(message: NodeMessage) -> None:
        if lost:
            heard(message)
        else:
            lost.append(message)

    core.node.handlers[kind] = losing_the_first
    return lost


def test_a_cancel_lost_on_its_way_is_sent_again(redis_server: RedisServer) -> None:
    """Pub/sub delivers at most once (a message sent while a node's inbox reconnects is
    lost): A loses the first cancel of B's client; B, unanswered, sends it again, and the
    page gets ``tool.cancel``."""

    async def main() -> None:
        cfg = {"store": redis_server.url}
        async with running_core(config(**cfg)) as a, running_core(config(**cfg)) as b:
            raw, welcome = await page_with(a)
            sid = welcome["sessionId"]
            lost = lose_the_first(a, McpCancel)
            async with modern_client(mcp_at(b.port, sid)) as client:
                call = asyncio.create_task(client.call_tool("slow", {"n": 1}))
                rid = (await next_of(raw, "tool.request"))["toolRequestId"]
                call.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await call
                assert (await next_of(raw, "tool.cancel"))["toolRequestId"] == rid
                assert len(lost) == 1
            await raw.close()

    run(main())


def test_a_holder_remembers_cancels_before_their_calls_within_bounds(
        redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Cancels that overtake their calls (pub/sub over several connections may reorder)
    are remembered, at most MAX_CANCELS (here 2) and ROUTE_LIMIT_SECONDS (here 1 s): a
    call whose cancel is remembered never runs; one whose cancel was forgotten (the
    oldest, over the count; or past the time) runs."""
    monkeypatch.setattr(relay, "MAX_CANCELS", 2)
    monkeypatch.setattr(relay, "ROUTE_LIMIT_SECONDS", 1.0)

    async def main() -> None:
        cfg = {"store": redis_server.url}
        async with running_core(config(**cfg)) as a, running_core(config(**cfg)) as b:
            raw, welcome = await page_with(a)
            sid = welcome["sessionId"]
            here, there = a.node.name, b.node.name

            async def send(message: NodeMessage) -> None:
                await b.node.tell(here, message)

            def call(key: str, n: int) -> McpCall:
                return McpCall(ask="x", sender=there, session=sid, tool="slow",
                               args={"n": n}, key=key)

            for key in ("k1", "k2", "k3"):
                await send(McpCancel(ask="x", sender=there, key=key, session=sid))
            await send(call("k3", 3))  # remembered: never runs
            await send(call("k1", 1))  # the oldest, forgotten: runs
            assert (await next_of(raw, "tool.request"))["args"] == {"n": 1}
            started = time.monotonic()
            await send(call("k2", 2))  # remembered: never runs
            await until(lambda: time.monotonic() - started > 1.0, "the cancels' time")
            await send(call("k3", 3))  # forgotten by now: runs
            assert (await next_of(raw, "tool.request"))["args"] == {"n": 3}
            await raw.close()

    run(main())


def test_a_node_keeps_at_most_max_cancels_on_their_way(
        redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """MAX_CANCELS (here 1): B's client cancels two calls while the page's node is dead;
    B keeps only the newer cancel, which reaches the page where it resumes (C); the
    older one is dropped, and its request runs to its result there."""
    monkeypatch.setattr(relay, "MAX_CANCELS", 1)

    async def main() -> None:
        cfg = {"store": redis_server.url}
        async with core_process(redis_server.url, free_port()) as a, \
                running_core(config(**cfg)) as b, running_core(config(**cfg)) as c:
            first = await RawClient.open(f"ws://127.0.0.1:{a.args[-1]}/pedelec/v1/bridge")
            welcome = await first.hello([tool_meta("a")])
            sid, token = welcome["sessionId"], welcome["resumeToken"]
            keeping = b.node.handlers[McpCancel].__self__._cancelling
            async with modern_client(mcp_at(b.port, sid)) as client:
                calls, ids = [], []
                for n in (1, 2):
                    calls.append(asyncio.create_task(client.call_tool("a", {"n": n})))
                    ids.append((await next_of(first, "tool.request"))["toolRequestId"])
                a.kill()
                await asyncio.to_thread(a.wait, WAIT)
                kept: list[str] = []
                for call in calls:
                    call.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await call
                    await until(lambda: len(keeping) == 1 and next(iter(keeping)) not in kept,
                                "the newest cancel kept")
                    kept.append(next(iter(keeping)))
                page = await RawClient.open(c.ws_url)
                assert (await page.hello([tool_meta("a")], sessionId=sid,
                                         resumeToken=token))["resumed"]
                assert (await next_of(page, "tool.cancel"))["toolRequestId"] == ids[1]
                session = c.registry.sessions[sid]
                assert list(session.pending) == [ids[0]]  # its cancel dropped: it runs
                await page.close()

    run(main(), timeout=90)


def test_a_relayed_call_lost_on_its_way_is_sent_again_and_runs_once(
        redis_server: RedisServer) -> None:
    """Pub/sub delivers at most once: A loses the first copy of B's relayed call; B, not
    told A has it, sends it again, and the call is answered. A hears every later copy
    while it serves the call: the page gets the request once."""

    async def main() -> None:
        cfg = {"store": redis_server.url}
        async with running_core(config(**cfg)) as a, running_core(config(**cfg)) as b:
            page = await RawClient.open(a.ws_url)
            sid = (await page.hello([tool_meta("a")]))["sessionId"]
            lost = lose_the_first(a, McpCall)
            async with modern_client(mcp_at(b.port, sid)) as client:
                call = asyncio.create_task(client.call_tool("a", {"n": 1}))
                sent = await next_of(page, "tool.request")
                assert len(lost) == 1
                await page.send({"type": "tool.result", "toolRequestId": sent["toolRequestId"],
                                 "result": {"ok": True, "data": {"n": 1}}, "handledBy": "named"})
                answer = await asyncio.wait_for(call, WAIT)
                assert answer.structured_content == {"ok": True, "data": {"n": 1}}, answer
            await page.send({"type": "tool.result", "toolRequestId": "nope",
                             "result": {}, "handledBy": "named"})
            assert (await page.recv())["type"] == "error"  # no second tool.request before it
            await page.close()

    run(main())


@pytest.mark.parametrize("era", ["handshake", "2026-07-28"])
def test_a_relayed_call_asks_redis_once_for_the_holder_and_never_for_the_history(
        redis_server: RedisServer, era: str) -> None:
    """On a node without the page, each ``tools/call`` asks Redis which node holds the
    page once (before the SDK sees the request; the relay goes there without asking
    again), and a client of the per-request protocol, whose every call the SDK checks
    against the tool's input schema, has the tools read from the session's row alone,
    never the whole session with the results (``--kept-results``) and keys it keeps."""

    async def main() -> None:
        cfg = {"store": redis_server.url}
        async with running_core(config(**cfg)) as a, running_core(config(**cfg)) as b:
            page = await RawClient.open(a.ws_url)
            sid = (await page.hello([tool_meta("a")]))["sessionId"]
            ran: list[str] = []
            handlers = asyncio.ensure_future(answer_requests(page, ran))
            store = b.registry.store
            counts = {"holder": 0, "load_session": 0, "load_session_record": 0}

            def counted(name: str) -> None:
                method = getattr(store, name)

                async def count(*args: Any) -> Any:
                    counts[name] += 1
                    return await method(*args)
                setattr(store, name, count)

            for name in counts:
                counted(name)
            try:
                async with client_of(era, mcp_at(b.port, sid)) as client:
                    await client.call_tool("a", {"n": 0})  # the SDK lists the tools once
                    before = dict(counts)
                    for n in range(1, 4):
                        answer = await client.call_tool("a", {"n": n})
                        assert answer.structured_content == {"ok": True, "data": {"n": n}}
                    after = dict(counts)  # (closing the client is a request too)
            finally:
                handlers.cancel()
                await page.close()
            assert len(ran) == 4
            assert {name: after[name] - before[name] for name in counts} == {
                "holder": 3, "load_session": 0,
                "load_session_record": 3 if era == "2026-07-28" else 0}

    run(main())
