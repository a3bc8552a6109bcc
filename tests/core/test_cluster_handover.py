"""A session changing node in Core's cluster: a starting node taking the sessions no node
holds (and leaving a live node's lease alone), replies nobody heard kept and not run again,
kept results in two lots after a page moved node. (First written for a review of d0af9ca
and 80d4c63: the three defects it found each failed before its fix.)"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import pytest
from clockkit import FakeClock, advance_through_io, advance_until
from clusterkit import page_on_a, request_on_open_page
from corekit import (
    CLUSTER_SECRET,
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
from mcpkit import mcp_at, modern_client
from storekit import RedisServer

from pedelec_pyodide.core.cluster import leases
from pedelec_pyodide.core.cluster import node as node_module
from pedelec_pyodide.core.cluster.messages import HttpCall, HttpReply, parse
from pedelec_pyodide.core.store.seal import Seal

PREFIX = "pedelec:main:"


def calls(sid: str) -> str:
    return f"/pedelec/v1/sessions/{sid}/tool-calls"


async def first_of(page: RawClient, call: asyncio.Future[Any], seconds: float
                   ) -> dict[str, Any] | None:
    """The page's next ``tool.request`` if it comes before ``call`` is answered (within
    ``seconds``); None if ``call`` was answered first."""
    request = asyncio.ensure_future(next_of(page, "tool.request"))
    try:
        await asyncio.wait([request, call], timeout=seconds,
                           return_when=asyncio.FIRST_COMPLETED)
        if request.done() and not request.cancelled() and request.exception() is None:
            return request.result()
        assert call.done(), "neither an answer nor a request"
        return None
    finally:
        request.cancel()


# --- kept results: the two lots after a session is loaded again -------------------------

@pytest.mark.parametrize("other", ["mcp", "routed"])
def test_a_keyed_result_outlives_other_calls_once_the_page_moved_node(
        redis_server: RedisServer, other: str) -> None:
    """kept_results=1. On A, a call with the caller's key, then one other call (MCP, or a
    call without key arriving at B and forwarded to A with B's route key): each lot holds
    one, and a retry with the key at A is answered from the kept result (the rule holds
    on one node). The page then resumes on B (A lets go, B loads the session): the retry
    with the key at B must still be answered, not run again."""

    async def main() -> None:
        cfg = {"store": redis_server.url, "kept_results": 1}
        async with running_core(config(**cfg)) as a, running_core(config(**cfg)) as b, \
                contextlib.AsyncExitStack() as stack:
            page = await RawClient.open(a.ws_url)
            stack.push_async_callback(page.close)
            welcome = await page.hello([tool_meta("a")])
            sid, token = welcome["sessionId"], welcome["resumeToken"]
            keyed = {"Idempotency-Key": "mine"}

            call = asyncio.ensure_future(a.http.post(
                calls(sid), json={"tool": "a", "args": {"n": 1}}, headers=keyed))
            first = await next_of(page, "tool.request")
            await result(page, first["toolRequestId"], {"ok": 1})
            assert (await asyncio.wait_for(call, WAIT)).status_code == 200

            async with contextlib.AsyncExitStack() as client_stack:
                if other == "mcp":
                    client = await client_stack.enter_async_context(
                        modern_client(mcp_at(a.port, sid)))
                    done: asyncio.Future[Any] = asyncio.ensure_future(
                        client.call_tool("a", {"n": 2}))
                else:
                    done = asyncio.ensure_future(b.http.post(
                        calls(sid), json={"tool": "a", "args": {"n": 2}}))
                second = await next_of(page, "tool.request")
                await result(page, second["toolRequestId"], {"ok": 2})
                await asyncio.wait_for(done, WAIT)
            memory = a.registry.sessions[sid].callers
            assert list(memory.results) == [first["toolRequestId"]]
            assert list(memory.others) == [second["toolRequestId"]]

            # on A: the retry is answered from the kept result
            retry = asyncio.ensure_future(a.http.post(
                calls(sid), json={"tool": "a", "args": {"n": 1}}, headers=keyed))
            assert await first_of(page, retry, WAIT) is None, "ran again on A"
            assert retry.result().json()["toolRequestId"] == first["toolRequestId"]
            await a.registry.store.flush()

            moved = await RawClient.open(b.ws_url)
            stack.push_async_callback(moved.close)
            assert (await moved.hello([tool_meta("a")], sessionId=sid,
                                      resumeToken=token))["resumed"]
            await until(lambda: sid in b.registry.sessions, "the session on B")
            retry = asyncio.ensure_future(b.http.post(
                calls(sid), json={"tool": "a", "args": {"n": 1}}, headers=keyed))
            stack.callback(retry.cancel)
            again = await first_of(moved, retry, WAIT)
            assert again is None, f"the keyed call ran again on B: {again}"
            assert retry.result().json()["toolRequestId"] == first["toolRequestId"]

    run(main(), timeout=60)


# --- a starting node and the leases of live nodes -----------------------------------------

async def still_on_a(a: Core, b: Core, page: RawClient, sid: str) -> None:
    """A holds the session, B does not, and the page is still A's: a call at A reaches it."""
    holder = await a.registry.store.holder(sid)
    assert (holder, sid in b.registry.sessions) == (a.registry.node, False), \
        "B took the session of a live node"
    call = asyncio.ensure_future(a.tool_call(sid, "echo", {"n": 1}))
    frame = await request_on_open_page(page)
    await result(page, frame["toolRequestId"], {"n": 1})
    assert (await asyncio.wait_for(call, WAIT)).status_code == 200


def test_a_node_started_a_moment_before_a_live_nodes_lease_lapsed_leaves_it_the_session(
        redis_server: RedisServer) -> None:
    """A holds a connected page's session. B starts (the session is stored: B will look
    at it VACANT_SECONDS later). A's lease goes missing right after one of A's renewals,
    about a second before B looks (as a restart of Redis would drop it then): it is
    missing for well under one renewal when B looks, and A takes it back at its next
    renewal. B must leave it to A: the page stays connected to A, which holds the lease.
    Both nodes on one fake clock, A's renewals at its start + k * LEASE_SECONDS / 3."""

    async def main() -> None:
        clock = FakeClock()
        cfg = {"store": redis_server.url, "clock": clock}
        period = leases.LEASE_SECONDS / 3
        async with running_core(config(**cfg)) as a:
            page = await RawClient.open(a.ws_url)
            sid = (await page.hello([tool_meta("echo")]))["sessionId"]
            await a.registry.store.flush()
            # B starts between A's renewals, a second after one
            await advance_through_io(clock, period + period / 2)
            async with running_core(config(**cfg)) as b:
                looks = clock.elapsed + leases.VACANT_SECONDS
                renewed = (looks // period) * period  # A's last renewal before B looks
                assert looks - period < renewed < looks
                await advance_through_io(clock, renewed + 0.1 - clock.elapsed)
                with redis_server.client() as client:  # lapsed: just after A renewed
                    client.delete(PREFIX + "lease:" + sid)
                # past A's next renewal: A took its lease back (or found it taken)
                await advance_through_io(clock, renewed + period + period / 2 - clock.elapsed)
                await still_on_a(a, b, page, sid)
            await page.close()

    run(main(), timeout=60)


def test_a_node_whose_look_failed_leaves_a_live_node_its_session_after_redis_was_away(
        redis_server: RedisServer) -> None:
    """A holds a connected page's session; B starts a second after one of A's renewals
    (it looks VACANT_SECONDS later, and again each VACANT_SECONDS while Redis is out of
    reach). Redis stops just after A's next renewal and is away 8 s, longer than the
    lease: B's first two looks fail. It comes back just after one of A's (failed)
    renewals, a moment before B's third look, when A's lease has lapsed: A takes it back
    at its next renewal. B must leave it to A. Both nodes on one fake clock, A's renewals
    at its start + k * LEASE_SECONDS / 3 (here r = the first one): the 8 s pass on it, and
    the lease's lapse, Redis's time, is Redis dropping it as it comes back."""

    async def main() -> None:
        clock = FakeClock()
        cfg = {"store": redis_server.url, "clock": clock}
        period = leases.LEASE_SECONDS / 3
        async with running_core(config(**cfg)) as a:
            page = await RawClient.open(a.ws_url)
            sid = (await page.hello([tool_meta("echo")]))["sessionId"]
            await a.registry.store.flush()
            renewed = period

            async def at(offset: float) -> None:
                await advance_through_io(clock, renewed + offset - clock.elapsed)

            await at(period / 2)  # B looks at +5, +9, +13 (A renews at +2, +4, ...)
            async with running_core(config(**cfg)) as b:
                await at(2 * period + 0.4)
                await asyncio.to_thread(redis_server.stop)  # B's looks at +5, +9 fail
                await at(6 * period + 0.4)  # A's lease lapsed at +10; A failed at +12
                await asyncio.to_thread(redis_server.start)  # B looks at +13, A at +14
                with redis_server.client() as client:  # its 6 s are past
                    client.delete(PREFIX + "lease:" + sid)
                await at(7 * period + period / 2)
                await still_on_a(a, b, page, sid)
            await page.close()

    run(main(), timeout=60)


# --- replies nobody heard ---------------------------------------------------------------

def deafen_and_lapse(redis_server: RedisServer, sid: str) -> None:
    """Redis drops every subscriber (every node's inbox) and the session's lease, as a
    restart of Redis does."""
    with contextlib.closing(redis_server.client()) as client:
        for entry in client.client_list(_type="pubsub"):
            client.client_kill_filter(_id=str(entry["id"]))
        client.delete(PREFIX + "lease:" + sid)


@pytest.mark.parametrize("kind", ["control", "mcp"])
def test_a_reply_nobody_heard_is_not_run_again_when_the_asker_routes_the_call_again(
        redis_server: RedisServer, kind: str) -> None:
    """As test_a_reply_nobody_heard_is_sent_again_even_once_its_kept_result_is_gone
    (kept_results=1, a second call of its lot pushes the first result out), but
    Redis keeps dropping every inbox and the session's lease until just past B's lease
    check (2 s after it asked): B finds no holder, waits for one (A renews), and routes
    the call to A again. It must get A's reply, the call run once."""

    async def main() -> None:
        async with page_on_a(redis_server, kind, "k", kept_results=1) as on_a, \
                contextlib.AsyncExitStack() as stack:
            a, page, sid = on_a.a, on_a.page, on_a.sid
            answer = asyncio.ensure_future(on_a.call())
            stack.callback(answer.cancel)
            first = await next_of(page, "tool.request")
            until_past_check = time.monotonic() + leases.LEASE_SECONDS / 3 + 0.6

            async def restarting() -> None:
                while time.monotonic() < until_past_check:
                    deafen_and_lapse(redis_server, sid)
                    await asyncio.sleep(0.01)

            redis_away = asyncio.ensure_future(restarting())
            stack.callback(redis_away.cancel)
            deafen_and_lapse(redis_server, sid)
            await result(page, first["toolRequestId"], {"ok": 1})
            await until(lambda: len(a.node._unheard) == 1, "A's reply kept")
            # of the first call's lot: with a key of the caller's own after a keyed call
            other = asyncio.ensure_future(a.http.post(
                calls(sid), json={"tool": "a", "args": {"n": 2}},
                headers={"Idempotency-Key": "k2"} if kind == "control" else {}))
            second = await next_of(page, "tool.request")
            await result(page, second["toolRequestId"], {"ok": 2})
            assert (await asyncio.wait_for(other, WAIT)).status_code == 200
            assert a.registry.sessions[sid].callers.kept(first["toolRequestId"]) is None
            await redis_away
            again = await first_of(page, answer, WAIT + leases.VACANT_SECONDS)
            assert again is None, f"the call ran again: {again}"
            assert answer.result() == {"ok": 1}

    run(main(), timeout=60)


def test_replies_nobody_heard_are_bounded_and_one_is_sent_again_when_its_ask_comes_again(
        redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """What held: at most UNHEARD_REPLIES kept (the oldest go first), at most
    UNHEARD_REPLY_CHARS in all (one larger reply is kept alone); the ask sent again gets
    the very reply, which is then no longer kept."""

    async def main() -> None:
        async with running_core(config(store=redis_server.url)) as a:
            node = a.node
            for n in range(node_module.UNHEARD_REPLIES + 5):
                await node.reply("nobody", HttpReply(ask=f"ask-{n}", status=200, body="{}"))
            kept = node._unheard
            assert len(kept) == node_module.UNHEARD_REPLIES
            assert next(iter(kept)) == "ask-5"
            assert node._unheard_chars == sum(map(len, kept.values()))

            monkeypatch.setattr(node_module, "UNHEARD_REPLY_CHARS", 1000)
            await node.reply("nobody", HttpReply(ask="big", status=200, body="x" * 5000))
            assert list(kept) == ["big"]  # alone, the rest pushed out
            for n in range(3):
                await node.reply("nobody", HttpReply(ask=f"small-{n}", status=200,
                                                     body="y" * 400))
            assert list(kept) == ["small-1", "small-2"]
            assert node._unheard_chars == sum(map(len, kept.values())) <= 1000

            listener = redis_server.client().pubsub()
            try:
                listener.subscribe(PREFIX + "node:nobody")
                assert listener.get_message(timeout=WAIT)["type"] == "subscribe"
                # the ask sent again by node "nobody" (sealed, as a node's is)
                await node.tell(node.name, HttpCall(
                    ask="small-1", sender="nobody", method="GET", path="/", query="",
                    headers=[], body="", route_key=False))
                message = await asyncio.to_thread(listener.get_message, timeout=WAIT)
                assert message is not None
                opened = Seal(CLUSTER_SECRET).open(PREFIX + "node:nobody", message["data"])
                assert parse(opened) == HttpReply(ask="small-1", status=200, body="y" * 400)
                await until(lambda: list(kept) == ["small-2"], "the reply no longer kept")
                assert node._unheard_chars == len(kept["small-2"])
            finally:
                listener.close()

    run(main(), timeout=60)


async def stored_and_stopped(redis_server: RedisServer) -> tuple[str, str, dict[str, Any]]:
    """A session stored with a pending keyed request, its page away, its node stopped
    (its lease let go): the session id, its resume token and the request."""
    async with running_core(config(store=redis_server.url)) as a:
        page = await RawClient.open(a.ws_url)
        welcome = await page.hello([tool_meta("a")])
        sid = welcome["sessionId"]
        call = asyncio.ensure_future(a.http.post(
            calls(sid), json={"tool": "a", "args": {}}, headers={"Idempotency-Key": "k"}))
        request = await next_of(page, "tool.request")
        await a.registry.store.flush()
        await page.close()
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)
    return sid, welcome["resumeToken"], request


def test_a_starting_node_lets_go_of_a_stored_session_deleted_before_it_looked(
        redis_server: RedisServer) -> None:
    """What held: a session stored at B's start and deleted before B looks is not
    restored, and the lease B's conditional renew took for it is let go. B on a fake
    clock, moved past its look."""

    async def main() -> None:
        sid, _, _ = await stored_and_stopped(redis_server)
        clock = FakeClock()
        async with running_core(config(store=redis_server.url, clock=clock)) as b:
            with contextlib.closing(redis_server.client()) as client:
                for key in client.scan_iter(PREFIX + "*" + sid):
                    client.delete(key)
                client.zrem(PREFIX + "sessions", sid)
            await advance_through_io(clock, leases.VACANT_SECONDS + 1.0)
            await until(lambda: not b.node.leases._taking, "B's look done")
            assert sid not in b.registry.sessions
            assert await b.registry.store.holder(sid) is None
            assert not b.node.leases._taking

    run(main(), timeout=60)


def test_a_starting_node_looks_again_when_redis_was_away_at_its_look(
        redis_server: RedisServer) -> None:
    """What held: Redis stopped across B's look (B's renew fails at once) and back a
    moment later: B looks again VACANT_SECONDS later and takes the stopped node's
    session, with its pending request. B on a fake clock."""

    async def main() -> None:
        sid, _, request = await stored_and_stopped(redis_server)
        clock = FakeClock()
        async with running_core(config(store=redis_server.url, clock=clock)) as b:
            await advance_through_io(clock, leases.VACANT_SECONDS - 0.7)
            await asyncio.to_thread(redis_server.stop)
            await advance_through_io(clock, 1.2)  # across B's look
            assert sid not in b.registry.sessions
            await asyncio.to_thread(redis_server.start)
            await advance_until(clock, lambda: sid in b.registry.sessions,
                                "the session taken", limit=leases.VACANT_SECONDS + WAIT)
            assert list(b.registry.sessions[sid].pending) == [request["toolRequestId"]]
            assert await b.registry.store.holder(sid) == b.registry.node
            assert not b.node.leases._taking

    run(main(), timeout=60)


@pytest.mark.parametrize("early", [0.05, 0.0, -0.05])
def test_a_page_resuming_as_the_starting_node_looks_is_resumed_once(
        redis_server: RedisServer, early: float) -> None:
    """What held: the page of a stored session resumes at B about when B looks (a
    take-over and take_vacant on one session at once): it resumes, its pending request
    is sent to it once, B holds the lease, and a retry with the key answers from it."""

    async def main() -> None:
        sid, token, request = await stored_and_stopped(redis_server)
        async with running_core(config(store=redis_server.url)) as b:
            started = time.monotonic()
            await asyncio.sleep(started + leases.VACANT_SECONDS - early - time.monotonic())
            page = await RawClient.open(b.ws_url)
            try:
                assert (await page.hello([tool_meta("a")], sessionId=sid,
                                         resumeToken=token))["resumed"]
                again = await next_of(page, "tool.request")
                assert again["toolRequestId"] == request["toolRequestId"]
                with pytest.raises(TimeoutError):  # once
                    await asyncio.wait_for(next_of(page, "tool.request"), 1.0)
                assert await b.registry.store.holder(sid) == b.registry.node
                retry = asyncio.ensure_future(b.http.post(
                    calls(sid), json={"tool": "a", "args": {}},
                    headers={"Idempotency-Key": "k"}))
                await result(page, again["toolRequestId"], {"ok": True})
                response = await asyncio.wait_for(retry, WAIT)
                assert response.json()["toolRequestId"] == request["toolRequestId"]
                assert not b.node.leases._taking
            finally:
                await page.close()

    run(main(), timeout=60)
