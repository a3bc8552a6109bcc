"""Several Core processes on one Redis (a real redis-server of each test's own): which
node holds a page's session (a lease), and a page resuming on another node taking the
session over, from a live node or from a killed one."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import websockets
from clockkit import FakeClock, advance_until
from clusterkit import answer_requests
from core_process import PLAN
from corekit import (
    WAIT,
    PlanAgent,
    RawClient,
    config,
    core_process,
    next_of,
    run,
    running_core,
    tool_meta,
    until,
)
from storekit import RedisServer, free_port

from pedelec_pyodide import protocol
from pedelec_pyodide.core.cluster import leases
from pedelec_pyodide.core.cluster.leases import HANDOVER_SECONDS
from pedelec_pyodide.core.sessions import SESSION_MOVED
from pedelec_pyodide.core.store import STORE_UNAVAILABLE, open_store


async def holder(url: str, session_id: str) -> str | None:
    store = open_store(url)
    try:
        return await store.holder(session_id)
    finally:
        await store.close()


async def closed_with(client: RawClient) -> int | None:
    """The close code of ``client``'s connection, once Core closed it."""
    try:
        while True:
            await asyncio.wait_for(client.ws.recv(), WAIT)
    except websockets.ConnectionClosed as exc:
        return exc.rcvd.code if exc.rcvd is not None else None


def test_a_page_resuming_on_another_node_takes_its_session_over(
        redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Node A holds the page's session with a call pending; the page resumes on node B:
    A closes its old socket (CLOSE_SUPERSEDED) and lets go, the caller waiting on A is
    told the session moved, B re-sends the pending request (same id), takes its result
    once and keeps it; the lease is B's. (Leases long enough that no renewal runs: the
    nodes' messages do it.)"""
    monkeypatch.setattr(leases, "LEASE_SECONDS", 60.0)

    async def main() -> None:
        cfg = {"store": redis_server.url}
        async with running_core(config(**cfg)) as a, running_core(config(**cfg)) as b:
            first = await RawClient.open(a.ws_url)
            welcome = await first.hello([tool_meta("echo")])
            sid, token = welcome["sessionId"], welcome["resumeToken"]
            await until(lambda: sid in a.registry.sessions)
            call = asyncio.ensure_future(a.tool_call(sid, "echo", {"n": 1}))
            sent = await first.recv()
            assert sent["type"] == "tool.request"
            assert await holder(redis_server.url, sid) == a.registry.node

            second = await RawClient.open(b.ws_url)
            resumed = await second.hello([tool_meta("echo")], sessionId=sid, resumeToken=token)
            assert resumed["type"] == "welcome" and resumed["resumed"], resumed
            again = await second.recv()
            assert again["type"] == "tool.request"
            assert again["toolRequestId"] == sent["toolRequestId"]
            assert await closed_with(first) == protocol.CLOSE_SUPERSEDED
            answer = (await asyncio.wait_for(call, WAIT)).json()
            assert answer["result"]["error"]["code"] == SESSION_MOVED, answer
            assert sid not in a.registry.sessions
            assert await holder(redis_server.url, sid) == b.registry.node

            await second.send({"type": "tool.result", "toolRequestId": again["toolRequestId"],
                               "result": {"ok": True, "data": {"n": 1}},
                               "handledBy": "named"})
            await until(lambda: not b.registry.sessions[sid].pending)
            kept = await b.http.get(
                f"/pedelec/v1/sessions/{sid}/tool-calls/{again['toolRequestId']}")
            assert kept.json()["result"] == {"ok": True, "data": {"n": 1}}, kept.text
            await second.close()

    run(main())


def test_a_page_whose_node_is_killed_resumes_on_another_and_its_turn_carries_on(
        redis_server: RedisServer) -> None:
    """Node A (a process of its own) runs the page's turn, its first two requests sent;
    A is SIGKILLed. The page resumes on node B: B waits for A's answer no longer than
    HANDOVER_SECONDS, loads the session, carries the turn on (the two requests re-sent,
    same ids), and it ends completed; each request reached the page's handler once."""

    async def main() -> None:
        async with core_process(redis_server.url, free_port()) as a, \
                running_core(config(store=redis_server.url,
                                    agent_factory=lambda: PlanAgent(PLAN))) as b:
            port = a.args[-1]
            first = await RawClient.open(f"ws://127.0.0.1:{port}/pedelec/v1/bridge")
            welcome = await first.hello([tool_meta(name) for name in "abc"])
            sid, token = welcome["sessionId"], welcome["resumeToken"]
            await first.send({"type": "turn.start", "turnId": "t1", "text": "go"})
            sent = [await first.recv(), await first.recv()]
            assert {frame["tool"] for frame in sent} == {"a", "b"}, sent
            a.kill()
            await asyncio.to_thread(a.wait, WAIT)

            page = await RawClient.open(b.ws_url)
            started = asyncio.get_running_loop().time()
            resumed = await page.hello([tool_meta(name) for name in "abc"], sessionId=sid,
                                       resumeToken=token)
            assert resumed["resumed"], resumed
            assert asyncio.get_running_loop().time() - started < HANDOVER_SECONDS + 2
            ran: list[str] = []
            while True:
                frame = await page.recv()
                if frame["type"] == "turn.end":
                    break
                if frame["type"] == "tool.request":
                    ran.append(frame["toolRequestId"])
                    await page.send({"type": "tool.result",
                                     "toolRequestId": frame["toolRequestId"],
                                     "result": {"ok": True, "data": frame["args"]},
                                     "handledBy": "named"})
            assert frame["status"] == "completed", frame
            assert sorted(ran[:2]) == sorted(f["toolRequestId"] for f in sent)
            assert len(ran) == len(set(ran)) == 3
            assert await holder(redis_server.url, sid) == b.registry.node
            await page.close()

    run(main())


def test_calls_arriving_at_a_node_without_the_page_reach_it_and_come_back(
        redis_server: RedisServer) -> None:
    """The page's socket is on A; a tool call, a turn and a GET arrive at B: forwarded to
    A through Redis, answered there, the answers back on B; each request ran once."""

    async def main() -> None:
        cfg = {"store": redis_server.url, "agent_factory": lambda: PlanAgent(PLAN)}
        async with running_core(config(**cfg)) as a, running_core(config(**cfg)) as b:
            page = await RawClient.open(a.ws_url)
            sid = (await page.hello([tool_meta(name) for name in "abc"]))["sessionId"]
            ran: list[str] = []
            handlers = asyncio.ensure_future(answer_requests(page, ran))
            try:
                await until(lambda: sid in a.registry.sessions)
                response = await b.tool_call(sid, "a", {"n": 7})
                assert response.status_code == 200, response.text
                assert response.json()["result"] == {"ok": True, "data": {"n": 7}}
                turn = await b.turn(sid, "go")
                assert turn.json()["status"] == "completed", turn.text
                info = await b.session_info(sid)
                assert info["connected"] and info["sessionId"] == sid
                assert sid not in b.registry.sessions
                assert len(ran) == len(set(ran)) == 4
                missing = await b.http.get("/pedelec/v1/sessions/nope")
                assert missing.status_code == 404
                bare = await b.http.post(f"/pedelec/v1/sessions/{sid}/tool-calls",
                                         json={"tool": "a"}, headers={"Authorization": ""})
                assert bare.status_code == 401 and len(ran) == 4  # not forwarded
            finally:
                handlers.cancel()
                await page.close()

    run(main())


def test_a_caller_whose_pages_node_is_killed_gets_its_result_once_the_page_resumes(
        redis_server: RedisServer) -> None:
    """The page is on A (a process of its own); a call arrives at B and is forwarded to
    A; A is SIGKILLed before the page answers. The page resumes on B, the request is sent
    again with its id, the page answers it once, and the caller on B gets that result."""

    async def main() -> None:
        async with core_process(redis_server.url, free_port()) as a, \
                running_core(config(store=redis_server.url,
                                    agent_factory=lambda: PlanAgent(PLAN))) as b:
            first = await RawClient.open(f"ws://127.0.0.1:{a.args[-1]}/pedelec/v1/bridge")
            welcome = await first.hello([tool_meta("a")])
            sid, token = welcome["sessionId"], welcome["resumeToken"]
            call = asyncio.ensure_future(b.tool_call(sid, "a", {"n": 1}))
            sent = await first.recv()
            assert sent["type"] == "tool.request"
            a.kill()
            await asyncio.to_thread(a.wait, WAIT)

            page = await RawClient.open(b.ws_url)
            assert (await page.hello([tool_meta("a")], sessionId=sid,
                                     resumeToken=token))["resumed"]
            ran: list[str] = []
            handlers = asyncio.ensure_future(answer_requests(page, ran))
            try:
                response = await asyncio.wait_for(call, WAIT)
                assert response.json()["result"] == {"ok": True, "data": {"n": 1}}, (
                    response.text)
                assert ran == [sent["toolRequestId"]]
            finally:
                handlers.cancel()
                await page.close()

    run(main())


def test_a_call_for_another_nodes_session_with_redis_away_is_a_503(
        redis_server: RedisServer) -> None:
    """Which node holds the session cannot be known without Redis: STORE_UNAVAILABLE,
    as the control API answers whenever its store is out of reach."""

    async def main() -> None:
        cfg = {"store": redis_server.url, "store_timeout": 0.5}
        async with running_core(config(**cfg)) as a, running_core(config(**cfg)) as b:
            page = await RawClient.open(a.ws_url)
            sid = (await page.hello([tool_meta("a")]))["sessionId"]
            redis_server.kill()
            response = await b.tool_call(sid, "a", {})
            assert response.status_code == 503, response.text
            assert response.json()["error"]["code"] == STORE_UNAVAILABLE
            assert response.headers["retry-after"]
            await page.close()

    run(main())


async def resume_on_and_call_again(url: str, caller: Any, sid: str, token: str,
                                   ran: list[str], moved: Callable[[], bool] | None = None
                                   ) -> None:
    """The page resumes at ``url`` (once ``moved()`` holds, if given) and ``caller`` calls
    it again: answered, and each request the page was sent ran once."""
    second = await RawClient.open(url)
    assert (await second.hello([tool_meta("a")], sessionId=sid,
                               resumeToken=token))["resumed"]
    if moved is not None:
        await until(moved)
    handlers = asyncio.ensure_future(answer_requests(second, ran))
    try:
        response = await asyncio.wait_for(caller.tool_call(sid, "a", {"n": 2}), WAIT)
        assert response.json()["result"] == {"ok": True, "data": {"n": 2}}, response.text
        assert len(ran) == len(set(ran)) == 2
    finally:
        handlers.cancel()
        await second.close()


def test_a_call_routed_by_a_stale_remembered_holder_is_routed_again_and_runs_once(
        redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """B forwards a call to A, where the page is, and remembers A; the page resumes on C
    (A lets go). B's next call goes to A, is told the session is not there, and is routed
    again through the lease to C: answered, and each request ran once."""
    monkeypatch.setattr(leases, "LEASE_SECONDS", 60.0)

    async def main() -> None:
        cfg = {"store": redis_server.url}
        async with running_core(config(**cfg)) as a, running_core(config(**cfg)) as b, \
                running_core(config(**cfg)) as c:
            first = await RawClient.open(a.ws_url)
            welcome = await first.hello([tool_meta("a")])
            sid, token = welcome["sessionId"], welcome["resumeToken"]
            ran: list[str] = []
            handlers = asyncio.ensure_future(answer_requests(first, ran))
            await until(lambda: sid in a.registry.sessions)
            response = await b.tool_call(sid, "a", {"n": 1})
            assert response.json()["result"] == {"ok": True, "data": {"n": 1}}, response.text
            handlers.cancel()

            try:
                await resume_on_and_call_again(c.ws_url, b, sid, token, ran,
                                               lambda: sid not in a.registry.sessions)
            finally:
                await first.close()

    run(main())


def test_a_call_routed_to_a_remembered_holder_that_was_killed_reaches_the_page_once(
        redis_server: RedisServer) -> None:
    """B forwards a call to A (a process of its own), where the page is, and remembers
    A; A is SIGKILLed and the page resumes on C. B's next call, sent to the dead A, is
    routed again once A's lease is C's: answered, and each request ran once."""

    async def main() -> None:
        cfg = {"store": redis_server.url}
        async with core_process(redis_server.url, free_port()) as a, \
                running_core(config(**cfg)) as b, running_core(config(**cfg)) as c:
            first = await RawClient.open(f"ws://127.0.0.1:{a.args[-1]}/pedelec/v1/bridge")
            welcome = await first.hello([tool_meta("a")])
            sid, token = welcome["sessionId"], welcome["resumeToken"]
            ran: list[str] = []
            handlers = asyncio.ensure_future(answer_requests(first, ran))
            response = await b.tool_call(sid, "a", {"n": 1})
            assert response.json()["result"] == {"ok": True, "data": {"n": 1}}, response.text
            handlers.cancel()
            a.kill()
            await asyncio.to_thread(a.wait, WAIT)

            await resume_on_and_call_again(c.ws_url, b, sid, token, ran)

    run(main())


def test_a_node_starting_takes_the_sessions_no_node_holds_once_their_lease_stays_missing(
        redis_server: RedisServer) -> None:
    """The cluster stopped with a page's session stored (its page away): the first node to
    start takes it, with its pending request, once its lease has stayed missing for
    VACANT_SECONDS (not at once: a live holder whose lease lapsed takes it back first),
    so that its request times out and it expires as on one node. The starting node on a
    fake clock."""

    async def main() -> None:
        cfg = {"store": redis_server.url}
        async with running_core(config(**cfg)) as a:
            page = await RawClient.open(a.ws_url)
            sid = (await page.hello([tool_meta("a")]))["sessionId"]
            # with a key: the request outlives its caller (and Core's stop)
            call = asyncio.ensure_future(a.http.post(
                f"/pedelec/v1/sessions/{sid}/tool-calls", json={"tool": "a", "args": {}},
                headers={"Idempotency-Key": "k"}))
            request = await next_of(page, "tool.request")
            await a.registry.store.flush()
            await page.close()
            call.cancel()
        clock = FakeClock()
        async with running_core(config(**cfg, clock=clock)) as b:
            assert sid not in b.registry.sessions
            await advance_until(clock, lambda: sid in b.registry.sessions, "the session taken",
                                limit=leases.VACANT_SECONDS + WAIT)
            assert clock.elapsed >= leases.VACANT_SECONDS
            assert list(b.registry.sessions[sid].pending) == [request["toolRequestId"]]
            assert await b.registry.store.holder(sid) == b.registry.node

    run(main())

