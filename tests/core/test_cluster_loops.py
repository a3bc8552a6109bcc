"""A node's background work on a shared store (lease renewal, its inbox, asks sent again,
tasks spawned on their own) outlives a round that fails however it fails: each failure is
logged ``cluster.failed`` with the loop's name, and the next round runs. A loop that died
would say nothing, and its node would lose its pages (renewal) or its calls (inbox)."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest
from clockkit import FakeClock, advance_until
from corekit import WAIT, Page, RawClient, config, next_of, run, running_core, tool_meta, until
from mcp import types
from mcpkit import mcp_at, mcp_client, page_session
from storekit import RedisServer

from pedelec_pyodide import define_tool
from pedelec_pyodide.core.background import INBOX_RETRY_SECONDS
from pedelec_pyodide.core.cluster import node as node_module
from pedelec_pyodide.core.cluster.leases import LEASE_SECONDS
from pedelec_pyodide.core.cluster.messages import HungUp, McpCall

PREFIX = "pedelec:main:"


def failed(caplog: pytest.LogCaptureFixture, task: str) -> int:
    return sum(f"event=cluster.failed task={task} " in r.getMessage() for r in caplog.records)


async def echo(page: RawClient) -> None:
    frame = await next_of(page, "tool.request")
    await page.send({"type": "tool.result", "toolRequestId": frame["toolRequestId"],
                     "result": {"ok": True, "data": frame["args"]}, "handledBy": "named"})


def test_lease_renewal_outlives_a_round_that_raises(
        redis_server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    """A renewal round fails with an error no store raises (a bug): logged, and the next
    round takes the page's lease back (the node on a fake clock: within a lease of it)."""
    caplog.set_level(logging.INFO, logger="pedelec.core")

    async def main() -> None:
        clock = FakeClock()
        async with running_core(config(store=redis_server.url, clock=clock)) as a:
            page = await RawClient.open(a.ws_url)
            sid = (await page.hello([tool_meta("echo")]))["sessionId"]
            store = a.registry.store
            renew = store.renew

            async def once_broken(*args: Any) -> list[str]:
                store.renew = renew  # type: ignore[method-assign]
                raise RuntimeError("a bug")

            store.renew = once_broken  # type: ignore[method-assign]
            await advance_until(clock, lambda: failed(caplog, "renew") == 1,
                                "a failed renewal")
            lease = PREFIX + "lease:" + sid
            with redis_server.client() as client:
                client.delete(lease)
                await advance_until(clock, lambda: client.get(lease) is not None,
                                    "the lease taken back", limit=LEASE_SECONDS)
                assert client.get(lease) == a.registry.node.encode()
            await page.close()

    run(main())


def test_the_inbox_outlives_a_message_that_breaks_it(
        redis_server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    """Reading a node's inbox fails once (a bug): logged; the node reads it again, so a
    call forwarded to it afterwards is answered."""
    caplog.set_level(logging.INFO, logger="pedelec.core")

    async def main() -> None:
        cfg = {"store": redis_server.url}
        async with running_core(config(**cfg)) as a, running_core(config(**cfg)) as b:
            page = await RawClient.open(a.ws_url)
            sid = (await page.hello([tool_meta("echo")]))["sessionId"]
            node = a.node
            on_message = node._on_message

            def once_broken(message: object) -> None:
                node._on_message = on_message  # type: ignore[method-assign]
                raise RuntimeError("a bug")

            node._on_message = once_broken  # type: ignore[method-assign]
            await node.tell(node.name, HungUp(ask="a" * 24))
            await until(lambda: failed(caplog, "inbox") == 1, "a failed inbox")
            call = asyncio.ensure_future(b.tool_call(sid, "echo", {"n": 1}))
            await echo(page)
            response = await asyncio.wait_for(call, WAIT)
            assert response.json()["result"] == {"ok": True, "data": {"n": 1}}, response.text
            await page.close()

    run(main())


def test_asks_are_sent_again_after_a_round_that_raises(
        redis_server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    """A forwarded call's ask is lost, and the first round sending it again fails (a
    bug): logged, and the next round sends it; the call is answered."""
    caplog.set_level(logging.INFO, logger="pedelec.core")

    async def main() -> None:
        cfg = {"store": redis_server.url}
        async with running_core(config(**cfg)) as a, running_core(config(**cfg)) as b:
            page = await RawClient.open(a.ws_url)
            sid = (await page.hello([tool_meta("echo")]))["sessionId"]
            store = b.registry.store
            publish = store.publish
            calls = 0

            async def lost_then_broken(node: str, message: str) -> None:
                nonlocal calls
                calls += 1
                if calls == 1:
                    return  # lost, as pub/sub loses a message nobody was subscribed for
                store.publish = publish  # type: ignore[method-assign]
                raise RuntimeError("a bug")

            store.publish = lost_then_broken  # type: ignore[method-assign]
            call = asyncio.ensure_future(b.tool_call(sid, "echo", {"n": 2}))
            await echo(page)
            response = await asyncio.wait_for(call, WAIT)
            assert response.json()["result"] == {"ok": True, "data": {"n": 2}}, response.text
            assert failed(caplog, "resend") == 1
            await page.close()

    run(main())


def test_a_spawned_task_that_raises_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    """Work spawned on its own that fails with any error is logged ``cluster.failed``,
    never left for asyncio's 'Task exception was never retrieved'."""
    caplog.set_level(logging.INFO, logger="pedelec.core")

    async def broken() -> None:
        raise RuntimeError("a bug")

    async def main() -> None:
        async with running_core(config()) as a:
            await a.node.spawn(broken())
            assert failed(caplog, "spawned") == 1

    run(main())


def test_tool_changes_are_heard_after_reading_them_failed(
        redis_server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    """Reading the other nodes' tool changes fails once on B (a bug): logged; B reads them
    again after its pause (both nodes on one fake clock), and its MCP client hears of the
    page's new tool on A."""
    caplog.set_level(logging.INFO, logger="pedelec.core")

    async def main() -> None:
        clock = FakeClock()
        cfg = {"store": redis_server.url, "clock": clock}
        async with running_core(config(**cfg)) as a, running_core(config(**cfg)) as b:
            relay = b.node.handlers[McpCall].__self__
            tool_changes = relay.tool_changes

            reads = 0

            async def broken() -> AsyncIterator[str]:
                raise RuntimeError("a bug")
                yield ""  # a generator, as tool_changes is

            def once_broken() -> AsyncIterator[str]:
                nonlocal reads
                reads += 1
                return broken() if reads == 1 else tool_changes()

            relay.tool_changes = once_broken
            page = await Page(page_session()).connect(a.ws_url)
            sid = page.session.session_id or ""
            inbox: list[Any] = []
            async with mcp_client(mcp_at(b.port, sid), inbox) as client:
                await client.list_tools()
                await until(lambda: failed(caplog, "tool_changes") == 1, "a failed read")
                await clock.advance(INBOX_RETRY_SECONDS)
                await until(lambda: reads == 2, "the changes read again")
                page.session.add_tool(define_tool(
                    name="greet", description="Says hello.",
                    args_schema={"type": "object"}, handler=lambda: "hello"))
                await until(lambda: any(isinstance(m, types.ToolListChangedNotification)
                                        for m in inbox), "list_changed heard on B")

    run(main())


def test_a_long_message_is_parsed_off_the_event_loop_in_the_order_it_came(
        redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A relayed call's args or result (up to a frame) was decoded on the node's event
    loop: ~0.1-0.4 s for 1 MiB of small arrays, that every other client waited for."""
    parsed_where: list[tuple[str, bool]] = []
    real = node_module.parse

    def recording(text: str) -> Any:
        message = real(text)
        parsed_where.append((message.type, threading.current_thread() is
                             threading.main_thread()))
        return message

    monkeypatch.setattr(node_module, "parse", recording)
    rows = [[n] for n in range(5_000)]  # ~30 KB of args, and as much again in the result

    async def main() -> None:
        cfg = {"store": redis_server.url}
        async with running_core(config(**cfg)) as a, running_core(config(**cfg)) as b:
            page = await RawClient.open(a.ws_url)
            sid = (await page.hello([tool_meta("echo")]))["sessionId"]
            for args in ({"rows": rows}, {"n": 1}):
                call = asyncio.ensure_future(b.tool_call(sid, "echo", args))
                await echo(page)
                response = await asyncio.wait_for(call, WAIT)
                assert response.json()["result"] == {"ok": True, "data": args}
            await page.close()

    run(main())
    # the long call and its reply off the loop, then the short ones on it, in order
    assert parsed_where == [("http.call", False), ("http.reply", False),
                            ("http.call", True), ("http.reply", True)]
