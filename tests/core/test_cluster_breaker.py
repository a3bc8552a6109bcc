"""Several Core nodes on one real redis-server, attacked from outside: forged and
malformed messages between nodes, keys of the wrong type in Redis, callers and pages
racing each other across nodes. Each test is a defect's reproduction or a rule that held."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
from pathlib import Path
from typing import Any

import pytest
import websockets
from clockkit import FakeClock, advance_through_io, advance_until
from clusterkit import answer, cluster, request_on_open_page
from corekit import (
    WAIT,
    RawClient,
    config,
    next_of,
    run,
    running_core,
    start_core,
    tool_meta,
    until,
)
from storekit import RedisServer

from pedelec_pyodide.core.cluster.leases import LEASE_SECONDS, VACANT_SECONDS
from pedelec_pyodide.core.cluster.messages import McpReply

PREFIX = "pedelec:main:"


async def answer_all(page: RawClient, ran: list[str]) -> int | None:
    """The page's handlers, with no limit on idle time: each tool.request answered with
    its args (ids in ``ran``); the close code once Core closes the socket."""
    while True:
        try:
            frame = json.loads(await page.ws.recv())
        except websockets.ConnectionClosed as exc:
            return exc.rcvd.code if exc.rcvd is not None else None
        if frame["type"] == "tool.request":
            ran.append(frame["toolRequestId"])
            await answer(page, frame)


def test_a_node_starts_past_a_session_key_of_the_wrong_type(
        redis_server: RedisServer) -> None:
    """A key of a stored session holding another Redis type (a string where a hash is)
    spoils that session only, as a damaged row does: the node starts and serves."""
    with redis_server.client() as client:
        client.zadd(PREFIX + "sessions", {"x": 1})
        client.set(PREFIX + "requests:x", "garbage")

    async def main() -> None:
        async with running_core(config(store=redis_server.url)) as a:
            response = await a.http.get("/pedelec/v1/health")
            assert response.status_code == 200, response.text

    run(main())


def test_a_call_for_a_session_whose_lease_key_is_of_the_wrong_type_is_a_structured_error(
        redis_server: RedisServer) -> None:
    """A session's lease key of another type: the call is answered with a structured
    error (503 ``STORE_FAILED``), not a bare 500."""
    with redis_server.client() as client:
        client.hset(PREFIX + "lease:y", "a", "b")

    async def main() -> None:
        async with running_core(config(store=redis_server.url)) as a:
            response = await a.tool_call("y", "echo", {})
            assert response.status_code == 503, response.text
            assert response.json()["error"]["code"] == "STORE_FAILED", response.text

    run(main())


def test_a_forged_http_message_of_the_wrong_type_is_logged_as_a_bad_message(
        redis_server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    """An ``http.call`` with a field of the wrong type, or fields missing, in a node's
    inbox: logged ``cluster.bad_message`` and dropped, as the design says."""
    caplog.set_level(logging.INFO, logger="pedelec.core")

    async def main() -> None:
        async with running_core(config(store=redis_server.url)) as a:
            for bad in ({"type": "http.call", "ask": "a", "from": "b", "method": "GET",
                         "path": 1, "query": "", "headers": [], "body": "", "routeKey": False},
                        {"type": "http.call", "method": "GET", "ask": "c", "from": "b"}):
                await a.registry.store.publish(a.registry.node, json.dumps(bad))
            await until(lambda: sum("cluster.bad_message" in r.getMessage()
                                    for r in caplog.records) >= 2, "bad_message logged")

    run(main())


def test_a_forged_reply_without_a_status_does_not_fail_the_forwarded_call(
        redis_server: RedisServer) -> None:
    """A reply to a forwarded call missing its fields, or of another kind (what any
    publisher on Redis can send, the ask id read off the channel), is dropped: the
    caller gets the page's answer."""

    async def main() -> None:
        cfg = {"store": redis_server.url}
        async with running_core(config(**cfg)) as a, running_core(config(**cfg)) as b:
            page = await RawClient.open(a.ws_url)
            sid = (await page.hello([tool_meta("echo")]))["sessionId"]
            call = asyncio.ensure_future(b.tool_call(sid, "echo", {"n": 1}))
            frame = await next_of(page, "tool.request")
            ask_id = next(iter(b.node._asked))
            await a.registry.store.publish(b.registry.node, json.dumps(
                {"type": "http.reply", "ask": ask_id}))
            await a.node.tell(b.node.name, McpReply(ask=ask_id, result={"forged": True}))
            await asyncio.sleep(0.3)
            await answer(page, frame)
            response = await asyncio.wait_for(call, WAIT)
            assert response.status_code == 200, response.text
            assert response.json()["result"] == {"ok": True, "data": {"n": 1}}
            await page.close()

    run(main())


def test_two_tabs_resuming_one_session_on_two_nodes_at_once_leave_one_holder(
        redis_server: RedisServer) -> None:
    """Node A holds a page's session with a request pending; two tabs resume it at once,
    one on B, one on C: at no moment do both B and C hold it."""

    async def main() -> None:
        cfg = {"store": redis_server.url}
        async with running_core(config(**cfg)) as a, running_core(config(**cfg)) as b, \
                running_core(config(**cfg)) as c:
            first = await RawClient.open(a.ws_url)
            welcome = await first.hello([tool_meta("echo")])
            sid, token = welcome["sessionId"], welcome["resumeToken"]
            call = asyncio.ensure_future(a.tool_call(sid, "echo", {"n": 1},
                                                     waitForPage=True))
            await next_of(first, "tool.request")
            tabs = [await RawClient.open(node.ws_url) for node in (b, c)]
            await asyncio.gather(*(tab.hello([tool_meta("echo")], sessionId=sid,
                                             resumeToken=token) for tab in tabs))
            both = 0
            loop = asyncio.get_running_loop()
            end = loop.time() + 3
            while loop.time() < end:
                held = [node for node in (b, c) if (s := node.registry.sessions.get(sid))
                        is not None and not s.closed]
                both = max(both, len(held))
                await asyncio.sleep(0.01)
            call.cancel()
            for tab in (first, *tabs):
                await tab.close()
            assert both <= 1, "B and C held the session at once"

    run(main())


def test_one_key_two_bodies_at_two_nodes_at_once_run_one_call(
        redis_server: RedisServer) -> None:
    """The same Idempotency-Key with two different bodies, at B and C at once, for a page
    on A: one call reaches the page, the other is refused 422."""

    async def main() -> None:
        cfg = {"store": redis_server.url}
        async with running_core(config(**cfg)) as a, running_core(config(**cfg)) as b, \
                running_core(config(**cfg)) as c:
            page = await RawClient.open(a.ws_url)
            sid = (await page.hello([tool_meta("echo")]))["sessionId"]
            calls = [asyncio.ensure_future(node.http.post(
                f"/pedelec/v1/sessions/{sid}/tool-calls",
                json={"tool": "echo", "args": {"n": n}}, headers={"Idempotency-Key": "same"}))
                for n, node in ((1, b), (2, c))]
            frame = await next_of(page, "tool.request")
            await answer(page, frame)
            responses = await asyncio.wait_for(asyncio.gather(*calls), WAIT)
            assert sorted(r.status_code for r in responses) == [200, 422], [
                r.text for r in responses]
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(next_of(page, "tool.request"), 1)
            await page.close()

    run(main())


def test_a_caller_hanging_up_on_a_node_without_the_page_cancels_the_request(
        redis_server: RedisServer) -> None:
    """A caller without an Idempotency-Key hangs up on B while its call waits on the
    page's node A: as on one node, the page gets ``tool.cancel``."""

    async def main() -> None:
        cfg = {"store": redis_server.url}
        async with running_core(config(**cfg)) as a, running_core(config(**cfg)) as b:
            page = await RawClient.open(a.ws_url)
            sid = (await page.hello([tool_meta("echo")]))["sessionId"]
            call = asyncio.ensure_future(b.tool_call(sid, "echo", {"n": 1}))
            frame = await next_of(page, "tool.request")
            call.cancel()  # httpx closes the connection: the caller hung up
            cancel = await next_of(page, "tool.cancel")
            assert cancel["toolRequestId"] == frame["toolRequestId"]
            await page.close()

    run(main())


def test_a_call_forwarded_while_the_page_resumes_on_a_third_node_runs_once(
        redis_server: RedisServer) -> None:
    """A call arriving at C is forwarded to A, where the page is; the page resumes on B
    before it answers: the call follows it, the page runs it once, the caller gets it."""

    async def main() -> None:
        cfg = {"store": redis_server.url}
        async with running_core(config(**cfg)) as a, running_core(config(**cfg)) as b, \
                running_core(config(**cfg)) as c:
            first = await RawClient.open(a.ws_url)
            welcome = await first.hello([tool_meta("echo")])
            sid, token = welcome["sessionId"], welcome["resumeToken"]
            call = asyncio.ensure_future(c.tool_call(sid, "echo", {"n": 7}))
            sent = await next_of(first, "tool.request")
            second = await RawClient.open(b.ws_url)
            await second.hello([tool_meta("echo")], sessionId=sid, resumeToken=token)
            again = await next_of(second, "tool.request")
            assert again["toolRequestId"] == sent["toolRequestId"]
            await answer(second, again)
            response = await asyncio.wait_for(call, WAIT)
            assert response.json()["result"] == {"ok": True, "data": {"n": 7}}, response.text
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(next_of(second, "tool.request"), 1)
            await first.close()
            await second.close()

    run(main())


def test_bad_callers_at_a_node_without_the_page_get_structured_errors(
        redis_server: RedisServer) -> None:
    """At B, for A's page: a bad token is 401 and publishes nothing; a body nested
    100,000 deep is refused 400 by A; a session id that is none is 404; a body past the
    frame limit is 413 on B."""

    async def main() -> None:
        cfg = {"store": redis_server.url}
        async with running_core(config(**cfg)) as a, running_core(config(**cfg)) as b:
            page = await RawClient.open(a.ws_url)
            sid = (await page.hello([tool_meta("echo")]))["sessionId"]
            path = f"/pedelec/v1/sessions/{sid}/tool-calls"
            bad = await b.http.post(path, json={"tool": "echo", "args": {}},
                                    headers={"Authorization": "Bearer nope"})
            assert bad.status_code == 401, bad.text
            assert not b.node._asked
            deep = await b.http.post(path, content=b"[" * 100_000 + b"]" * 100_000,
                                     headers={"content-type": "application/json"})
            assert deep.status_code == 400 and "error" in deep.json(), deep.text
            none = await b.tool_call("not-a-session", "echo", {})
            assert none.status_code == 404 and "error" in none.json(), none.text
            huge = await b.http.post(path, content=b" " * (b.registry.config.max_frame_bytes
                                                           + 1))
            assert huge.status_code == 413, huge.text
            await page.close()

    run(main())


def test_a_page_resuming_on_another_node_while_redis_is_away_keeps_its_session(
        redis_server: RedisServer) -> None:
    """The page's socket drops and it resumes on B while Redis is down (it comes back a
    second later): the page is not told RESUME_REFUSED (which makes it start a new
    session, its pending calls and history gone): it is asked to try again, or resumed."""

    async def main() -> None:
        cfg = {"store": redis_server.url, "store_timeout": 0.5}
        async with running_core(config(**cfg)) as a, running_core(config(**cfg)) as b:
            first = await RawClient.open(a.ws_url)
            welcome = await first.hello([tool_meta("echo")])
            sid, token = welcome["sessionId"], welcome["resumeToken"]
            await a.registry.store.flush()
            redis_server.kill()
            back = asyncio.get_running_loop().call_later(1.0, redis_server.start)
            try:
                second = await RawClient.open(b.ws_url)
                try:
                    frame = await second.hello([tool_meta("echo")], sessionId=sid,
                                               resumeToken=token)
                except websockets.ConnectionClosed as exc:  # "try again later" is fine
                    frame = {"closed": exc.rcvd.code if exc.rcvd is not None else None}
            finally:
                back.cancel()
                if redis_server.process is None or redis_server.process.poll() is not None:
                    redis_server.start()
            assert frame.get("code") != "RESUME_REFUSED", frame
            await first.close()
            await second.close()

    run(main())


def test_tools_list_on_another_node_after_redis_lost_its_data_finds_the_connected_page(
        redis_server: RedisServer) -> None:
    """Redis restarts without its append-only file (its data gone) while the page stays
    connected to A: A's next renewal finds its lease gone and the session too, and stores
    it again; an MCP client on B then lists the page's tools. Both nodes on one fake
    clock, moved until A's renewal has stored the session again."""
    from mcpkit import modern_client

    async def main() -> None:
        clock = FakeClock()
        cfg = {"store": redis_server.url, "clock": clock}
        async with running_core(config(**cfg)) as a, running_core(config(**cfg)) as b:
            page = await RawClient.open(a.ws_url)
            sid = (await page.hello([tool_meta("echo")]))["sessionId"]
            await a.registry.store.flush()
            wipe(redis_server)
            await advance_until(clock, lambda: stored_again(redis_server, sid),
                                "A's renewal stored the session again")
            url = f"http://127.0.0.1:{b.port}/pedelec/v1/sessions/{sid}/mcp"
            async with modern_client(url) as client:
                listed = await client.list_tools()
            assert [tool.name for tool in listed.tools] == ["echo"]
            await page.close()

    run(main())


def test_a_call_after_a_live_nodes_lease_lapsed_leaves_the_page_its_session(
        redis_server: RedisServer) -> None:
    """A's lease on its connected page lapses (what a Redis away for longer than a lease,
    or a node stalled that long, leaves) and a call arrives at B before A renews: the
    call reaches the page on A, which keeps its socket and its session."""

    async def main() -> None:
        cfg = {"store": redis_server.url}
        async with running_core(config(**cfg)) as a, running_core(config(**cfg)) as b:
            page = await RawClient.open(a.ws_url)
            sid = (await page.hello([tool_meta("echo")]))["sessionId"]
            await a.registry.store.flush()
            with redis_server.client() as client:
                client.delete(PREFIX + "lease:" + sid)
            call = asyncio.ensure_future(b.tool_call(sid, "echo", {"n": 1}))
            try:
                frame = await request_on_open_page(page)
            finally:
                call.cancel()
            assert frame["args"] == {"n": 1}
            await page.close()

    run(main())


def test_a_node_starting_after_a_live_nodes_lease_lapsed_leaves_the_page_its_session(
        redis_server: RedisServer) -> None:
    """A's lease on its connected page lapses (Redis restarted: every lease gone) and B
    starts before A renews: B does not take the session at its start (it used to, and
    A's next renewal found its lease taken and closed the page 1013), and a call at B
    reaches the page on A. Both nodes on one fake clock: B starts before A renews."""

    async def main() -> None:
        clock = FakeClock()
        cfg = {"store": redis_server.url, "clock": clock}
        async with running_core(config(**cfg)) as a:
            page = await RawClient.open(a.ws_url)
            sid = (await page.hello([tool_meta("echo")]))["sessionId"]
            await a.registry.store.flush()
            with redis_server.client() as client:
                client.delete(PREFIX + "lease:" + sid)
            async with running_core(config(**cfg)) as b:
                assert sid not in b.registry.sessions
                await advance_until(clock, lambda: holder(redis_server, sid) == a.registry.node,
                                    "A's renewal took its lease back")
                # past B's look at the sessions stored at its start: it did not take it
                await advance_through_io(clock, VACANT_SECONDS)
                assert await a.registry.store.holder(sid) == a.registry.node
                call = asyncio.ensure_future(b.tool_call(sid, "echo", {"n": 1}))
                await answer(page, await request_on_open_page(page))
                response = await asyncio.wait_for(call, WAIT)
                assert response.json()["result"] == {"ok": True, "data": {"n": 1}}
                assert sid not in b.registry.sessions
            await page.close()

    run(main())


def test_through_haproxy_redis_away_10_s_costs_no_page_its_session(
        redis_server: RedisServer, tmp_path: Path) -> None:
    """Three node processes behind HAProxy, a page on one of them; redis-server is
    stopped for 10 s and started again (its append-only file kept), then calls come
    through HAProxy for 6 s: the page keeps its socket and session, and every call that
    was answered ran once."""

    async def main() -> None:
        async with cluster(redis_server.url, 3, tmp_path) as nodes:
            page = await RawClient.open(nodes.ws_url)
            sid = (await page.hello([tool_meta("echo")]))["sessionId"]
            ran: list[str] = []
            handlers = asyncio.ensure_future(answer_all(page, ran))
            await asyncio.sleep(0.5)
            redis_server.stop()
            await asyncio.sleep(10)
            redis_server.start()
            answered = 0
            loop = asyncio.get_running_loop()
            end = loop.time() + 6
            try:
                while loop.time() < end and not handlers.done():
                    response = await nodes.http.post(
                        f"/pedelec/v1/sessions/{sid}/tool-calls",
                        json={"tool": "echo", "args": {}, "waitForPage": False})
                    answered += response.status_code == 200
                    await asyncio.sleep(0.05)
                closed = handlers.done()
            finally:
                handlers.cancel()
                await page.close()
            assert not closed, f"the page was closed ({handlers.result()})"
            assert answered and len(ran) == len(set(ran))

    run(main(), timeout=90)


def test_a_wrong_token_hello_does_not_spoil_a_take_over_under_way(
        redis_server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    """The page resumes on B (A holds it, alive) while a stranger sends B a hello for the
    same session with a wrong token: B still hears A let go (no ``holder_silent``)."""
    caplog.set_level(logging.INFO, logger="pedelec.core")

    async def main() -> None:
        cfg = {"store": redis_server.url}
        async with running_core(config(**cfg)) as a, running_core(config(**cfg)) as b:
            first = await RawClient.open(a.ws_url)
            welcome = await first.hello([tool_meta("echo")])
            sid, token = welcome["sessionId"], welcome["resumeToken"]
            page, stranger = [await RawClient.open(b.ws_url) for _ in range(2)]
            resumed, refused = await asyncio.gather(
                page.hello([tool_meta("echo")], sessionId=sid, resumeToken=token),
                stranger.hello([tool_meta("echo")], sessionId=sid, resumeToken="x" * 43))
            assert resumed.get("resumed") and refused["code"] == "RESUME_REFUSED"
            silent = [r.getMessage() for r in caplog.records
                      if "session.holder_silent" in r.getMessage()]
            assert not silent, silent
            for client in (first, page, stranger):
                await client.close()

    run(main())


def test_a_wrong_token_hello_reads_the_session_row_only(redis_server: RedisServer) -> None:
    """A hello naming a stored session with a wrong token, at a node that does not hold
    it, costs Redis the session's own row, not the whole session: here its 8 kept results
    of 100 KB each (it read them all before being refused)."""

    def sent_by_redis() -> int:
        with redis_server.client() as client:
            return int(client.info("stats")["total_net_output_bytes"])

    async def main() -> None:
        cfg = {"store": redis_server.url}
        async with running_core(config(**cfg)) as a, running_core(config(**cfg)) as b:
            page = await RawClient.open(a.ws_url)
            sid = (await page.hello([tool_meta("echo")]))["sessionId"]
            for _ in range(8):
                call = asyncio.ensure_future(a.tool_call(sid, "echo", {"pad": "x" * 100_000}))
                await answer(page, await next_of(page, "tool.request"))
                assert (await call).status_code == 200
            await a.registry.store.flush()
            stranger = await RawClient.open(b.ws_url)
            before = sent_by_redis()
            refused = await stranger.hello([tool_meta("echo")], sessionId=sid,
                                           resumeToken="x" * 43)
            read = sent_by_redis() - before
            assert refused["code"] == "RESUME_REFUSED"
            assert read < 100_000, f"Redis sent {read} bytes for a refused hello"
            for client in (page, stranger):
                await client.close()

    run(main())


def test_a_lease_taken_without_the_page_asks_the_page_to_resume_not_to_start_afresh(
        redis_server: RedisServer) -> None:
    """Another node took A's lease for its connected page without the page resuming
    there (what a call's adopt does once A was stalled past its lease): A's next renewal
    closes the page 1013 (reconnect), not 4001 (start afresh), and the page resumes its
    session, its pending request sent again."""

    async def main() -> None:
        cfg = {"store": redis_server.url}
        async with running_core(config(**cfg)) as a, running_core(config(**cfg)) as b:
            first = await RawClient.open(a.ws_url)
            welcome = await first.hello([tool_meta("echo")])
            sid, token = welcome["sessionId"], welcome["resumeToken"]
            call = asyncio.ensure_future(a.tool_call(sid, "echo", {"n": 1},
                                                     waitForPage=True))
            sent = await next_of(first, "tool.request")
            await a.registry.store.flush()
            with redis_server.client() as client:
                client.set(PREFIX + "lease:" + sid, b.registry.node,
                           px=int(LEASE_SECONDS * 1000))
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await asyncio.wait_for(next_of(first, "tool.request"), WAIT)
            call.cancel()
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
            second = await RawClient.open(a.ws_url)
            again = await second.hello([tool_meta("echo")], sessionId=sid,
                                       resumeToken=token)
            assert again.get("resumed"), again
            resent = await next_of(second, "tool.request")
            assert resent["toolRequestId"] == sent["toolRequestId"]
            await second.close()

    run(main())


def test_a_page_resuming_twice_at_once_on_one_node_waits_for_its_holder_to_let_go(
        redis_server: RedisServer) -> None:
    """The page resumes on B on two sockets at once (a reload racing the old tab) while
    A, slow to let go, holds it: the second take-over joins the first, so B welcomes
    neither before A let go, and two nodes never hold the session at once."""

    async def main() -> None:
        cfg = {"store": redis_server.url}
        async with running_core(config(**cfg)) as a, running_core(config(**cfg)) as b:
            first = await RawClient.open(a.ws_url)
            welcome = await first.hello([tool_meta("echo")])
            sid, token = welcome["sessionId"], welcome["resumeToken"]
            let_go = a.node.leases.let_go

            async def slowly(session_id: str, to: str) -> None:
                await asyncio.sleep(0.5)
                await let_go(session_id, to)

            a.node.leases.let_go = slowly  # type: ignore[method-assign]
            tabs = [await RawClient.open(b.ws_url) for _ in range(2)]

            async def resume(tab: RawClient) -> bool:
                """Whether A still held the session when B welcomed this tab."""
                frame = await tab.hello([tool_meta("echo")], sessionId=sid,
                                        resumeToken=token)
                assert frame.get("resumed"), frame
                return sid in a.registry.sessions

            held = await asyncio.gather(*(resume(tab) for tab in tabs))
            assert not any(held), held
            for client in (first, *tabs):
                await client.close()

    run(main())


def test_lease_renewal_outlives_redis_refusing_writes_for_a_while(
        redis_server: RedisServer) -> None:
    """Redis refuses writes for 3 s (``min-replicas-to-write`` with no replica: a refusal
    docs/how-to/deploy.md names); once it takes them again, the node still holds its
    page's lease, renewed. The node on a fake clock: its renewals are refused for 3 s of
    it; then the lease is left 3 s of Redis's time, and the clock moved a renewal on."""

    async def main() -> None:
        clock = FakeClock()
        async with running_core(config(store=redis_server.url, clock=clock)) as a:
            page = await RawClient.open(a.ws_url)
            sid = (await page.hello([tool_meta("echo")]))["sessionId"]
            await a.registry.store.flush()
            lease = PREFIX + "lease:" + sid
            with redis_server.client() as client:
                client.config_set("min-replicas-to-write", 1)
                try:  # a renewal, and its retry at once, refused
                    await advance_through_io(clock, 3)
                finally:
                    client.config_set("min-replicas-to-write", 0)
                client.pexpire(lease, 3000)  # Redis's time: the lease nearly out
                await advance_through_io(clock, LEASE_SECONDS / 3 + 0.5)
                held, ttl = client.get(lease), client.pttl(lease)
            assert held == a.registry.node.encode(), held
            assert ttl > 3000, f"the lease was not renewed ({ttl} ms left)"
            await page.close()

    run(main())


def holder(redis_server: RedisServer, sid: str) -> str | None:
    """The node Redis has holding ``sid``'s lease."""
    with redis_server.client() as client:
        held = client.get(PREFIX + "lease:" + sid)
    return None if held is None else held.decode()


def stored_again(redis_server: RedisServer, sid: str) -> bool:
    """Whether Redis holds ``sid``'s session and its lease (after it lost its data)."""
    with redis_server.client() as client:
        return bool(client.exists(PREFIX + "session:" + sid, PREFIX + "lease:" + sid) == 2)


def wipe(server: RedisServer) -> None:
    """redis-server restarted without its append-only file: everything it held is gone."""
    server.kill()
    for path in server.workdir.iterdir():
        if path.name.startswith("appendonly"):
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    server.start()


def test_a_page_moving_to_another_node_after_redis_lost_its_data_keeps_its_session(
        redis_server: RedisServer) -> None:
    """Redis restarts without its append-only file while A holds the page; the page's
    socket drops and it resumes on B (its load balancer's pick): it keeps its session
    (A, alive, has it all, and stored it again at its next renewal). Both nodes on one
    fake clock."""

    async def main() -> None:
        clock = FakeClock()
        cfg = {"store": redis_server.url, "clock": clock}
        async with running_core(config(**cfg)) as a, running_core(config(**cfg)) as b:
            first = await RawClient.open(a.ws_url)
            welcome = await first.hello([tool_meta("echo")])
            sid, token = welcome["sessionId"], welcome["resumeToken"]
            await a.registry.store.flush()
            wipe(redis_server)
            await advance_until(clock, lambda: stored_again(redis_server, sid),
                                "A's renewal stored the session again")
            second = await RawClient.open(b.ws_url)
            resumed = await second.hello([tool_meta("echo")], sessionId=sid,
                                         resumeToken=token)
            assert resumed.get("resumed"), resumed
            await first.close()
            await second.close()

    run(main())


def test_what_a_node_holds_of_a_session_redis_lost_is_stored_again_and_carries_on(
        redis_server: RedisServer) -> None:
    """A holds a session with a kept keyed result, a request the page has not answered
    (its caller gave a key) and the agent's history of a turn; Redis restarts without
    its data. A's next renewal stores it all again: the page resumes on B, which sends
    the pending request again (its id) and runs nothing else; a retry of each key at B
    gets its one request's result; B has the history."""

    async def main() -> None:
        cfg = {"store": redis_server.url}
        async with running_core(config(**cfg)) as a, running_core(config(**cfg)) as b:
            first = await RawClient.open(a.ws_url)
            welcome = await first.hello([tool_meta("echo")])
            sid, token = welcome["sessionId"], welcome["resumeToken"]
            path = f"/pedelec/v1/sessions/{sid}/tool-calls"

            def keyed(node: Any, key: str, n: int) -> Any:
                return node.http.post(path, json={"tool": "echo", "args": {"n": n}},
                                      headers={"Idempotency-Key": key})

            done = asyncio.ensure_future(keyed(a, "done", 1))
            frame = await next_of(first, "tool.request")
            await answer(first, frame)
            kept = (await done).json()
            assert (await a.turn(sid, "remember me")).json()["status"] == "completed"
            waiting = asyncio.ensure_future(keyed(a, "waiting", 2))
            pending = await next_of(first, "tool.request")
            history = a.registry.sessions[sid].record.history
            await a.registry.store.flush()
            wipe(redis_server)
            with redis_server.client() as client:
                await until(lambda: client.exists(PREFIX + "session:" + sid) == 1,
                            "A storing the session again", 2 * WAIT)
            await a.registry.store.flush()
            await first.close()
            second = await RawClient.open(b.ws_url)
            resumed = await second.hello([tool_meta("echo")], sessionId=sid,
                                         resumeToken=token)
            assert resumed.get("resumed"), resumed
            again = await next_of(second, "tool.request")
            assert again["toolRequestId"] == pending["toolRequestId"]
            assert b.registry.sessions[sid].record.history == history
            retry = asyncio.ensure_future(keyed(b, "waiting", 2))
            await answer(second, again)
            assert (await asyncio.wait_for(retry, WAIT)).json()["toolRequestId"] == (
                pending["toolRequestId"])
            assert (await waiting).status_code in (200, 409, 503)  # A's caller: moved
            assert (await keyed(b, "done", 1)).json() == kept
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(next_of(second, "tool.request"), 1)
            await second.close()

    run(main(), timeout=90)


def test_one_key_two_bodies_at_two_nodes_for_a_session_no_node_holds_run_one_call(
        redis_server: RedisServer) -> None:
    """The page's node stopped (its lease let go) and the page is away; the same
    Idempotency-Key with two bodies arrives at B and C at once: one of them takes the
    session, the other's call is forwarded there and refused 422; the page, back, runs
    one request."""

    async def main() -> None:
        cfg = {"store": redis_server.url}
        async with running_core(config(**cfg)) as b, running_core(config(**cfg)) as c:
            a = await start_core(config(**cfg))
            try:
                first = await RawClient.open(a.ws_url)
                welcome = await first.hello([tool_meta("echo")])
                sid, token = welcome["sessionId"], welcome["resumeToken"]
            finally:
                await a.stop()
            calls = [asyncio.ensure_future(node.http.post(
                f"/pedelec/v1/sessions/{sid}/tool-calls",
                json={"tool": "echo", "args": {"n": n}}, headers={"Idempotency-Key": "k"}))
                for n, node in ((1, b), (2, c))]
            await until(lambda: sid in b.registry.sessions or sid in c.registry.sessions,
                        "a node took the session")
            holder = b if sid in b.registry.sessions else c
            page = await RawClient.open(holder.ws_url)
            assert (await page.hello([tool_meta("echo")], sessionId=sid,
                                     resumeToken=token)).get("resumed")
            frame = await next_of(page, "tool.request")
            await answer(page, frame)
            responses = await asyncio.wait_for(asyncio.gather(*calls), WAIT)
            assert sorted(r.status_code for r in responses) == [200, 422], [
                r.text for r in responses]
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(next_of(page, "tool.request"), 1)
            await page.close()

    run(main())
