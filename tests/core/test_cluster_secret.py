"""The cluster secret: nodes prove they belong. A stranger who can publish on the
cluster's Redis (a raw client, here) cannot make a node run a call, answer one, hand a
session over or cancel one: its messages (unsealed, sealed with a wrong MAC, replayed,
sealed for another node's channel, huge) are dropped and logged, at most once per
LOG_EVERY_SECONDS. Each forgery is checked against the same message sent by a node,
which does act: the test fails if the seal stops holding."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio
from clusterkit import answer
from corekit import (
    CLUSTER_SECRET,
    TOKEN,
    WAIT,
    Core,
    RawClient,
    config,
    next_of,
    run,
    running_core,
    tool_meta,
    until,
)
from storekit import RedisServer

from pedelec_pyodide.core.cli import main as cli_main
from pedelec_pyodide.core.cluster.messages import (
    HandOver,
    HttpCall,
    HttpReply,
    McpCall,
    McpCancel,
    ToolsChanged,
)
from pedelec_pyodide.core.config import CLUSTER_SECRET_ENV
from pedelec_pyodide.core.store.seal import (
    CLOCK_WINDOW_SECONDS,
    LOG_EVERY_SECONDS,
    MAX_SENDERS,
    REPLAY_WINDOW,
    Refused,
    Seal,
)

CHANNEL = "pedelec:main:node:0123456789abcdef"


class Clocks:
    """The wall clock and the monotonic one a Seal reads, moved by the test."""

    def __init__(self) -> None:
        self.wall = 1_800_000_000.0
        self.mono = 100.0

    def time(self) -> float:
        return self.wall

    def monotonic(self) -> float:
        return self.mono

    def seal(self, secret: str = CLUSTER_SECRET) -> Seal:
        return Seal(secret, self)  # a Seal reads time() and monotonic() only


def refused(reason: str, make: Any) -> None:
    with pytest.raises(Refused) as caught:
        make()
    assert caught.value.reason == reason


# --- the seal on its own ------------------------------------------------------------------


def test_a_sealed_message_opens_once_on_its_channel_with_its_secret() -> None:
    clocks = Clocks()
    sender, receiver = clocks.seal(), clocks.seal()
    sealed = sender.seal(CHANNEL, '{"handOver": "s", "to": "n"}')
    assert receiver.open(CHANNEL, sealed) == '{"handOver": "s", "to": "n"}'
    refused("replayed", lambda: receiver.open(CHANNEL, sealed))
    refused("forged", lambda: receiver.open(CHANNEL.replace("0123", "3210"), sealed))
    refused("forged", lambda: clocks.seal("another-secret-of-at-least-32-chars!").open(
        CHANNEL, sender.seal(CHANNEL, "{}")))
    tampered = sender.seal(CHANNEL, '{"handOver": "s", "to": "n"}').replace(b'"n"', b'"x"')
    refused("forged", lambda: receiver.open(CHANNEL, tampered))
    head, mac, body = sealed.rsplit(b" ", 2)[0], sealed.split(b" ")[4], b"{}"
    flipped = bytes([mac[0] ^ 1]) + mac[1:]
    refused("forged", lambda: receiver.open(CHANNEL, b" ".join((head, flipped, body))))
    for unsealed in (b'{"handOver": "s", "to": "n"}', b"p1 x y z mac {}", b"", b"p1",
                     b"p1 a 1 " + b"9" * 21 + b" mac {}", b"p2" + sealed[2:]):
        refused("unsealed", lambda unsealed=unsealed: receiver.open(CHANNEL, unsealed))


def test_messages_overtaking_each_other_are_each_taken_once_within_the_window() -> None:
    clocks = Clocks()
    sender, receiver = clocks.seal(), clocks.seal()
    sealed = [sender.seal(CHANNEL, str(n)) for n in range(REPLAY_WINDOW + 10)]
    assert receiver.open(CHANNEL, sealed[5]) == "5"
    assert [receiver.open(CHANNEL, sealed[n]) for n in (3, 4, 0, 9, 7)] == [
        "3", "4", "0", "9", "7"]
    for n in (0, 3, 4, 5, 7, 9):
        refused("replayed", lambda n=n: receiver.open(CHANNEL, sealed[n]))
    receiver.open(CHANNEL, sealed[REPLAY_WINDOW + 8])
    refused("stale", lambda: receiver.open(CHANNEL, sealed[8]))  # slid out of the window
    assert receiver.open(CHANNEL, sealed[10]) == "10"  # just within it, never seen
    refused("replayed", lambda: receiver.open(CHANNEL, sealed[REPLAY_WINDOW + 8]))


def test_a_message_stamped_outside_the_clock_window_is_refused() -> None:
    clocks = Clocks()
    sender, receiver = clocks.seal(), clocks.seal()
    old = sender.seal(CHANNEL, "old")
    clocks.wall += CLOCK_WINDOW_SECONDS + 1
    refused("stale", lambda: receiver.open(CHANNEL, old))
    ahead = sender.seal(CHANNEL, "ahead")
    clocks.wall -= CLOCK_WINDOW_SECONDS + 1  # the sender's clock ahead of the receiver's
    refused("stale", lambda: receiver.open(CHANNEL, ahead))
    clocks.wall += 2  # within the window
    assert receiver.open(CHANNEL, ahead) == "ahead"


def test_a_forgotten_senders_messages_are_too_old_to_replay() -> None:
    """A sender quiet for three clock windows (its node died) is forgotten; a replay of
    what it sent is refused by its stamp by then."""
    clocks = Clocks()
    sender, receiver = clocks.seal(), clocks.seal()
    first = sender.seal(CHANNEL, "first")
    assert receiver.open(CHANNEL, first) == "first"
    clocks.mono += 3 * CLOCK_WINDOW_SECONDS + 1
    clocks.wall += 3 * CLOCK_WINDOW_SECONDS + 1
    assert receiver.open(CHANNEL, clocks.seal().seal(CHANNEL, "other")) == "other"
    assert len(receiver._senders) == 1  # the quiet one is gone
    refused("stale", lambda: receiver.open(CHANNEL, first))


def test_senders_are_bounded() -> None:
    clocks = Clocks()
    receiver = clocks.seal()
    for _ in range(MAX_SENDERS + 5):
        receiver.open(CHANNEL, clocks.seal().seal(CHANNEL, "x"))
    assert len(receiver._senders) == MAX_SENDERS


def test_a_short_secret_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 32 characters"):
        Seal("short")


def test_refusals_are_logged_at_most_once_per_interval_with_their_count(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="pedelec.core")
    clocks = Clocks()
    receiver = clocks.seal()
    for _ in range(1000):
        receiver.refused(CHANNEL, "forged", 10)
    clocks.mono += LOG_EVERY_SECONDS
    receiver.refused(CHANNEL, "unsealed", 10)
    lines = [r.getMessage() for r in caplog.records if "cluster.message_refused" in
             r.getMessage()]
    assert len(lines) == 2, lines
    assert "reason=forged" in lines[0] and "refused=1 " in lines[0]
    assert "reason=unsealed" in lines[1] and "refused=1000 " in lines[1]
    assert receiver.refusals == {"forged": 1000, "unsealed": 1}


# --- nodes on a real Redis, a stranger publishing on it ---------------------------------------


def stranger(server: RedisServer) -> redis.asyncio.Redis:
    return redis.asyncio.Redis(port=server.port, socket_timeout=WAIT)


def inbox_of(core: Core) -> str:
    return f"pedelec:main:node:{core.registry.node}"


def refusals(core: Core) -> dict[str, int]:
    seal = core.registry.store.seal
    assert seal is not None
    return dict(seal.refusals)


def fake_seal(message: str) -> bytes:
    """A message with a seal's shape, a fresh stamp and a MAC of the stranger's making."""
    return f"p1 {'ab' * 8} 1 {round(time.time() * 1000)} {'0' * 64} {message}".encode()


def forwarded_call(core: Core, session_id: str, args: Any, ask: str) -> str:
    """A forwarded control-API call as a node sends it (the admin token known too)."""
    return HttpCall(
        ask=ask, sender=core.node.name, method="POST",
        path=f"/pedelec/v1/sessions/{session_id}/tool-calls", query="",
        headers=[["authorization", f"Bearer {TOKEN}"], ["content-type", "application/json"]],
        body=json.dumps({"tool": "echo", "args": args}), route_key=True).encode()


@contextlib.asynccontextmanager
async def two_nodes(server: RedisServer) -> AsyncIterator[tuple[Core, Core]]:
    cfg = {"store": server.url}
    async with running_core(config(**cfg)) as a, running_core(config(**cfg)) as b:
        yield a, b


def test_a_stranger_cannot_make_a_node_run_a_call(redis_server: RedisServer) -> None:
    """Forwarded calls and relayed MCP calls published by a stranger on the holder's
    channel (unsealed, and with a seal's shape but its own MAC) run nothing; the same
    call published by a node does."""

    async def main() -> None:
        async with two_nodes(redis_server) as (a, b):
            page = await RawClient.open(a.ws_url)
            sid = (await page.hello([tool_meta("echo")]))["sessionId"]
            mcp = McpCall(ask="c" * 24, sender=b.node.name, session=sid, tool="echo",
                          args={"n": 1}, key="pedelec-mcp-" + "0" * 32).encode()
            forged = [forwarded_call(b, sid, {"n": 1}, "a" * 24), mcp]
            async with stranger(redis_server) as client:
                for message in forged:
                    await client.publish(inbox_of(a), message)
                    await client.publish(inbox_of(a), fake_seal(message))
            await until(lambda: sum(refusals(a).values()) == 4, "the forgeries refused")
            assert refusals(a) == {"unsealed": 2, "forged": 2}
            # the same call from a node runs (after the forgeries, in one channel's order)
            await b.registry.store.publish(a.registry.node,
                                           forwarded_call(b, sid, {"n": 2}, "b" * 24))
            frame = await next_of(page, "tool.request")
            assert frame["args"] == {"n": 2}, frame
            assert len(a.registry.sessions[sid].pending) == 1
            await page.close()

    run(main())


def test_a_stranger_cannot_answer_a_call(redis_server: RedisServer) -> None:
    """A well-shaped reply to a forwarded call in flight (its ask id read off Redis),
    from a stranger, is dropped: the caller gets the page's answer. The same reply from
    a node answers the call."""

    async def main() -> None:
        async with two_nodes(redis_server) as (a, b):
            page = await RawClient.open(a.ws_url)
            sid = (await page.hello([tool_meta("echo")]))["sessionId"]
            call = asyncio.ensure_future(b.tool_call(sid, "echo", {"n": 1}))
            frame = await next_of(page, "tool.request")
            ask_id = next(iter(b.node._asked))
            reply = HttpReply(ask=ask_id, status=200,
                              body=json.dumps({"forged": True})).encode()
            async with stranger(redis_server) as client:
                await client.publish(inbox_of(b), reply)
                await client.publish(inbox_of(b), fake_seal(reply))
            await until(lambda: sum(refusals(b).values()) == 2, "the forgeries refused")
            await answer(page, frame)
            response = await asyncio.wait_for(call, WAIT)
            assert response.json()["result"] == {"ok": True, "data": {"n": 1}}, response.text

            call = asyncio.ensure_future(b.tool_call(sid, "echo", {"n": 2}))
            await next_of(page, "tool.request")
            ask_id = next(iter(b.node._asked))
            await a.node.tell(b.node.name, HttpReply(
                ask=ask_id, status=200, body=json.dumps({"forged": True})))
            response = await asyncio.wait_for(call, WAIT)
            assert response.json() == {"forged": True}, response.text  # a node's is taken
            await page.close()

    run(main())


async def closed(page: RawClient, seconds: float) -> int | None:
    """The close code if Core closes ``page`` within ``seconds``; None if it stays open."""
    try:
        await asyncio.wait_for(page.ws.wait_closed(), seconds)
    except TimeoutError:
        return None
    return page.ws.close_code  # type: ignore[no-any-return]


def test_a_stranger_cannot_take_a_session_by_replaying_or_moving_a_nodes_message(
        redis_server: RedisServer) -> None:
    """The stranger listens on every node's channel while the page moves A → B → A
    (each move a real ``session.handOver``, which closed the page's socket where it was). It
    then sends A: a forged handOver, the first move's message again (replayed), the
    second's (sealed for B's channel), the first with its MAC or its body changed.
    None is taken: the page stays connected on A, which still answers its calls."""

    async def main() -> None:
        async with two_nodes(redis_server) as (a, b), stranger(redis_server) as client:
            listening = client.pubsub()
            await listening.psubscribe("pedelec:main:node:*")
            first = await RawClient.open(a.ws_url)
            welcome = await first.hello([tool_meta("echo")])
            sid, token = welcome["sessionId"], welcome["resumeToken"]
            pages = [first]
            for node in (b, a):
                page = await RawClient.open(node.ws_url)
                resumed = await page.hello([tool_meta("echo")], sessionId=sid,
                                           resumeToken=token)
                assert resumed.get("resumed"), resumed
                assert await closed(pages[-1], WAIT) == 4001
                pages.append(page)
            captured: dict[str, bytes] = {}
            while len(captured) < 2:
                message = await listening.get_message(timeout=WAIT)
                assert message is not None, captured
                if message["type"] == "pmessage" and b"handOver" in message["data"]:
                    captured[message["channel"].decode()] = message["data"]
            to_a, to_b = captured[inbox_of(a)], captured[inbox_of(b)]
            mac = to_a.split(b" ")[4]
            forgeries = [
                HandOver(session=sid, to=b.node.name).encode().encode(),
                to_a,  # replayed
                to_b,  # sealed for B's channel
                to_a.replace(mac, bytes([mac[0] ^ 1]) + mac[1:]),
                to_a.replace(b.registry.node.encode(), b"f" * 16),
            ]
            for forged in forgeries:
                await client.publish(inbox_of(a), forged)
            await until(lambda: sum(refusals(a).values()) == len(forgeries),
                        "the forgeries refused")
            assert refusals(a) == {"unsealed": 1, "replayed": 1, "forged": 3}
            page = pages[-1]
            call = asyncio.ensure_future(b.tool_call(sid, "echo", {"n": 1}))
            await answer(page, await next_of(page, "tool.request"))
            response = await asyncio.wait_for(call, WAIT)
            assert response.status_code == 200, response.text
            assert sid in a.registry.sessions and a.registry.sessions[sid].connection
            await listening.aclose()
            await page.close()

    run(main())


def test_a_stranger_cannot_cancel_a_call_or_announce_tool_changes(
        redis_server: RedisServer) -> None:
    """A stranger's ``mcp.cancel`` for a relayed call, and a page's tool change on the
    channel every node with MCP clients hears, are dropped; the call runs to its answer."""
    from mcpkit import modern_client

    async def main() -> None:
        async with two_nodes(redis_server) as (a, b):
            page = await RawClient.open(a.ws_url)
            sid = (await page.hello([tool_meta("echo")]))["sessionId"]
            url = f"http://127.0.0.1:{b.port}/pedelec/v1/sessions/{sid}/mcp"
            async with modern_client(url) as mcp, stranger(redis_server) as client:
                call = asyncio.ensure_future(mcp.call_tool("echo", {"n": 1}))
                frame = await next_of(page, "tool.request")
                key = next(iter(b.node.handlers[McpCall].__self__._watching))
                changes = "pedelec:main:node:mcp-tool-changes"
                while (await client.pubsub_numsub(changes))[0][1] < 1:  # B listens
                    await asyncio.sleep(0.01)
                await client.publish(inbox_of(a), McpCancel(
                    ask="e" * 24, sender=b.node.name, key=key, session=sid).encode())
                await client.publish(changes, ToolsChanged(session=sid).encode())
                await until(lambda: sum(refusals(a).values()) == 1
                            and sum(refusals(b).values()) == 1, "the forgeries refused")
                assert frame["toolRequestId"] in a.registry.sessions[sid].pending
                await answer(page, frame)
                result = await asyncio.wait_for(call, WAIT)
                assert result.structured_content == {"ok": True, "data": {"n": 1}}, result
            await page.close()

    run(main())


def test_huge_and_many_forgeries_cost_a_log_line_and_leave_the_node_serving(
        redis_server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    """12 MiB messages (unsealed, and with a seal's shape: its MAC is checked off the
    event loop) and 2,000 small forgeries: refused, logged in at most a few lines, and a
    call crossing the nodes is answered after. (Each huge one is sent once the last was
    read: two at once are over Redis's own 32 MB limit of a subscriber's output, and
    Redis cuts the node's inbox, which subscribes again: deploy.md says so.)"""
    caplog.set_level(logging.INFO, logger="pedelec.core")

    async def main() -> None:
        async with two_nodes(redis_server) as (a, b):
            page = await RawClient.open(a.ws_url)
            sid = (await page.hello([tool_meta("echo")]))["sessionId"]
            huge = "x" * (12 * 1024 * 1024)
            async with stranger(redis_server) as client:
                for n, message in enumerate((huge.encode(), fake_seal(huge)), 1):
                    await client.publish(inbox_of(a), message)
                    await until(lambda n=n: sum(refusals(a).values()) == n, "a huge one")
                for n in range(1000):
                    await client.publish(inbox_of(a), fake_seal(str(n)))
                    await client.publish(inbox_of(a), str(n))
            await until(lambda: sum(refusals(a).values()) == 2002, "the forgeries refused")
            assert refusals(a) == {"unsealed": 1001, "forged": 1001}
            call = asyncio.ensure_future(b.tool_call(sid, "echo", {"n": 1}))
            await answer(page, await next_of(page, "tool.request"))
            assert (await asyncio.wait_for(call, WAIT)).status_code == 200
            lines = [r for r in caplog.records if "cluster.message_refused" in r.getMessage()]
            assert 1 <= len(lines) <= 3, len(lines)
            await page.close()

    run(main())


def test_a_node_without_a_secret_says_so_at_start(redis_server: RedisServer,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="pedelec.core")

    def warned() -> int:
        return sum("cluster.unauthenticated" in r.getMessage() for r in caplog.records)

    async def main() -> None:
        async with running_core(config(store=redis_server.url)):
            assert warned() == 0
        async with running_core(config(store=redis_server.url, cluster_secret=None)) as a:
            assert warned() == 1
            assert a.registry.store.seal is None
        async with running_core(config(cluster_secret=None)):  # memory: one process
            assert warned() == 1

    run(main())


@pytest.mark.parametrize("where", ["option", "env"])
def test_a_short_cluster_secret_stops_the_cli(where: str, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv(CLUSTER_SECRET_ENV, raising=False)
    argv = ["serve", "--no-provision", "--store", "memory"]
    if where == "option":
        argv += ["--cluster-secret", "too-short"]
    else:
        monkeypatch.setenv(CLUSTER_SECRET_ENV, "too-short")
    assert cli_main(argv) == 2
    error = capsys.readouterr().err
    assert "at least 32 characters" in error and "too-short" not in error


def test_the_option_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from pedelec_pyodide.core.cli import build_parser, config_from_args

    monkeypatch.setenv(CLUSTER_SECRET_ENV, "e" * 40)
    args = build_parser().parse_args(["serve"])
    assert config_from_args(args)[0].cluster_secret == "e" * 40
    args = build_parser().parse_args(["serve", "--cluster-secret", "o" * 40])
    assert config_from_args(args)[0].cluster_secret == "o" * 40
    monkeypatch.delenv(CLUSTER_SECRET_ENV)
    assert config_from_args(build_parser().parse_args(["serve"]))[0].cluster_secret is None
