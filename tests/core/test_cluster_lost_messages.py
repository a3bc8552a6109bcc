"""A message between nodes that Redis drops (pub/sub delivers only to whoever is
subscribed at that moment): after Redis dropped its subscribers (a restart, a network cut;
here ``CLIENT KILL TYPE pubsub``), each node's inbox subscribes again only a moment later.
A call's ask published to a holder not yet subscribed, or the holder's reply published to
an asker not yet subscribed, is lost; the asker, still seeing the same live holder, used
to wait for the reply until the call's 600 s limit (the fault run's attempts with no
answer in 15 s after a Redis restart). The asker now sends its ask again, with the call's
key, when nobody heard it or when its own inbox subscribed again after sending: the
holder answers it from the same request, which runs once."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from clockkit import FakeClock, advance_through_io, advance_until
from clusterkit import page_on_a, pubsub_clients, subscribers
from corekit import (
    WAIT,
    Core,
    RawClient,
    config,
    next_of,
    result,
    run,
    running_core,
    tool_meta,
    until,
)
from storekit import RedisServer

from pedelec_pyodide.core.cluster.leases import LEASE_SECONDS
from pedelec_pyodide.core.cluster.messages import HttpCall, HttpReply, NodeMessage
from pedelec_pyodide.core.cluster.node import RESEND_MAX_SECONDS, RESEND_SECONDS


def heard_calls(holder: Core) -> list[HttpCall]:
    """The forwarded calls (``http.call``) ``holder``'s inbox hears from now on, each
    copy sent again too."""
    heard: list[HttpCall] = []
    on_message = holder.node._on_message

    def counted(message: NodeMessage | Exception) -> None:
        if isinstance(message, HttpCall):
            heard.append(message)
        on_message(message)

    holder.node._on_message = counted  # type: ignore[method-assign]
    return heard


def drop(redis_server: RedisServer, ids: set[int]) -> None:
    """Redis drops these subscribers, as a restart drops them all."""
    with contextlib.closing(redis_server.client()) as client:
        for client_id in ids:
            client.client_kill_filter(_id=str(client_id))


@pytest.mark.parametrize("lost", ["reply", "ask"])
@pytest.mark.parametrize("kind", ["control", "mcp"])
def test_a_call_whose_message_redis_dropped_is_answered_and_runs_once(
        redis_server: RedisServer, kind: str, lost: str) -> None:
    """The page is on A; its call arrives at B and is forwarded (control API) or relayed
    (MCP) to A. ``reply``: Redis drops B's inbox after A sent the page the request and the
    page answers at once, so A's reply reaches nobody (B's inbox subscribes again, and B
    asks again). ``ask``: Redis drops A's inbox just before the call, so B's ask reaches
    nobody (B hears that nobody heard it, and asks again)."""

    async def main() -> None:
        async with page_on_a(redis_server, kind) as on_a:
            if lost == "ask":
                drop(redis_server, on_a.of_a)
                assert subscribers(redis_server, on_a.a) == 0
                assert subscribers(redis_server, on_a.b) == 1
            answer = asyncio.ensure_future(on_a.call())
            try:
                request = await next_of(on_a.page, "tool.request")
                if lost == "reply":
                    drop(redis_server, pubsub_clients(redis_server) - on_a.of_a)
                    assert subscribers(redis_server, on_a.b) == 0
                await result(on_a.page, request["toolRequestId"], {"ok": True})
                assert await asyncio.wait_for(answer, WAIT) == {"ok": True}
            finally:
                answer.cancel()
            # once: no second tool.request for the ask sent again
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(next_of(on_a.page, "tool.request"), 1.0)

    run(main(), timeout=60)


@pytest.mark.parametrize("kind", ["control", "mcp"])
def test_a_reply_nobody_heard_is_sent_again_even_once_its_kept_result_is_gone(
        redis_server: RedisServer, kind: str) -> None:
    """As the ``reply`` case above, but the holder keeps one result per session and a
    second call on the page comes in before the ask is sent again (the fault run: a page
    busy with other calls while Redis restarted): the holder sends its reply again from
    what it kept of the reply nobody heard, and the first call runs once."""

    async def main() -> None:
        async with page_on_a(redis_server, kind, "k", kept_results=1) as on_a:
            page, sid = on_a.page, on_a.sid
            answer = asyncio.ensure_future(on_a.call())
            try:
                first = await next_of(page, "tool.request")
                drop(redis_server, pubsub_clients(redis_server) - on_a.of_a)
                assert subscribers(redis_server, on_a.b) == 0
                await result(page, first["toolRequestId"], {"ok": 1})
                # of the first call's lot: with a key of its own after a keyed call
                key = {"Idempotency-Key": "k2"} if kind == "control" else {}
                other = asyncio.ensure_future(on_a.a.http.post(
                    f"/pedelec/v1/sessions/{sid}/tool-calls",
                    json={"tool": "a", "args": {"n": 2}}, headers=key))
                second = await next_of(page, "tool.request")
                assert second["args"] == {"n": 2}
                await result(page, second["toolRequestId"], {"ok": 2})
                assert (await asyncio.wait_for(other, WAIT)).status_code == 200
                # the first result is no longer kept
                assert on_a.a.registry.sessions[sid].callers.kept(
                    first["toolRequestId"]) is None
                assert await asyncio.wait_for(answer, WAIT) == {"ok": 1}
            finally:
                answer.cancel()
            with pytest.raises(TimeoutError):  # not run again for the ask sent again
                await asyncio.wait_for(next_of(page, "tool.request"), 1.0)

    run(main(), timeout=60)


def test_an_ask_sent_again_while_its_call_runs_is_not_run_again(
        redis_server: RedisServer) -> None:
    """A call the page answers only after several resends: the holder runs the
    forwarded call once (the asks sent again meanwhile are ignored), and the caller gets
    the page's one result. Both nodes on one fake clock: the resends come as it moves."""

    async def main() -> None:
        clock = FakeClock()
        cfg = {"store": redis_server.url, "clock": clock}
        async with running_core(config(**cfg)) as a, running_core(config(**cfg)) as b:
            page = await RawClient.open(a.ws_url)
            sid = (await page.hello([tool_meta("a")]))["sessionId"]
            await until(lambda: sid in a.registry.sessions)
            serve = a.node.serve_forwarded
            assert serve is not None
            served: list[str] = []

            async def counted(request: HttpCall,
                              hung_up: asyncio.Future[None]) -> HttpReply:
                served.append(request.path)
                return await serve(request, hung_up)

            a.node.serve_forwarded = counted
            heard = heard_calls(a)
            answer = asyncio.ensure_future(b.http.post(
                f"/pedelec/v1/sessions/{sid}/tool-calls", json={"tool": "a", "args": {}}))
            request = await next_of(page, "tool.request")
            # sent again after RESEND_SECONDS, then after twice that
            await advance_until(clock, lambda: len(heard) >= 3, "the ask sent twice again")
            assert len(heard) <= 4, len(heard)
            await result(page, request["toolRequestId"], {"ok": True})
            response = await asyncio.wait_for(answer, WAIT)
            assert response.json()["result"] == {"ok": True}, response.text
            assert served == [f"/pedelec/v1/sessions/{sid}/tool-calls"]
            await page.close()

    run(main())


def test_a_long_call_is_sent_again_ever_less_often(redis_server: RedisServer) -> None:
    """A forwarded call the page takes long to answer is sent again with gaps that double
    up to RESEND_MAX_SECONDS (its whole body each time), not at every RESEND_SECONDS.
    Both nodes on one fake clock, moved 30 s on (within the call's deadline)."""

    async def main() -> None:
        clock = FakeClock()
        cfg = {"store": redis_server.url, "clock": clock, "tool_timeout_ms": 60_000}
        async with running_core(config(**cfg)) as a, running_core(config(**cfg)) as b:
            page = await RawClient.open(a.ws_url)
            sid = (await page.hello([tool_meta("a")]))["sessionId"]
            await until(lambda: sid in a.registry.sessions)
            heard = heard_calls(a)
            answer = asyncio.ensure_future(b.http.post(
                f"/pedelec/v1/sessions/{sid}/tool-calls", json={"tool": "a", "args": {}}))
            request = await next_of(page, "tool.request")
            await advance_through_io(clock, 30.0)
            # sent at 0, then after gaps of 1, 2, 4, 8, 8 s: at most 6 copies in 30 s (a
            # gap of RESEND_SECONDS each time would give ~30)
            assert (RESEND_SECONDS, RESEND_MAX_SECONDS) == (1.0, 8.0)
            await until(lambda: len(heard) >= 4, "the ask sent again thrice")
            assert len(heard) <= 6, len(heard)
            await result(page, request["toolRequestId"], {"ok": True})
            response = await asyncio.wait_for(answer, WAIT)
            assert response.json()["result"] == {"ok": True}, response.text
            await page.close()

    run(main())


@pytest.mark.parametrize("kind", ["control", "mcp"])
def test_a_call_sent_before_redis_went_away_waits_for_its_result(
        redis_server: RedisServer, kind: str) -> None:
    """The page's request was sent (its handler may run) when redis-server stops: the
    node the caller reached cannot look up the holder meanwhile, and waits for the reply
    instead of answering STORE_UNAVAILABLE (a caller retrying that, with no key to give,
    would have the handler run again). Once Redis is back, the reply comes. Both nodes on
    one fake clock."""

    async def main() -> None:
        clock = FakeClock()
        async with page_on_a(redis_server, kind, clock=clock) as on_a:
            answer = asyncio.ensure_future(on_a.call())
            try:
                request = await next_of(on_a.page, "tool.request")
                redis_server.stop()
                # a lower bound: B looks for the holder every third of a lease meanwhile
                await advance_through_io(clock, LEASE_SECONDS / 3 + 0.5)
                assert not answer.done(), (
                    answer.result() if not answer.exception() else answer)
                redis_server.start()
                await advance_until(clock, lambda: subscribers(redis_server, on_a.a) == 1,
                                    "A's inbox again")
                await result(on_a.page, request["toolRequestId"], {"ok": True})
                await advance_until(clock, answer.done, "the reply")
                assert answer.result() == {"ok": True}
            finally:
                answer.cancel()

    run(main(), timeout=60)
