"""Three Core nodes (processes of their own) on one redis-server behind Debian's HAProxy
(``deploy/haproxy.cfg``, sticky on nothing but an MCP session id): a page and its callers
go through HAProxy, and the node holding the page is SIGKILLed."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import httpx
from clusterkit import answer_requests, cluster
from corekit import TOKEN, WAIT, RawClient, run, tool_meta
from storekit import RedisServer


def test_through_haproxy_calls_reach_the_page_and_survive_its_node_being_killed(
        redis_server: RedisServer, tmp_path: Path) -> None:
    """Calls through HAProxy land on any node and reach the page; the page's node is
    SIGKILLed with a call waiting: the page reconnects through HAProxy to a live node and
    resumes, the caller (on another node) gets the result, and each handler ran once."""

    async def main() -> None:
        async with cluster(redis_server.url, 3, tmp_path) as nodes:
            first = await RawClient.open(nodes.ws_url)
            welcome = await first.hello([tool_meta("a")])
            sid, token = welcome["sessionId"], welcome["resumeToken"]
            ran: list[str] = []
            handlers = asyncio.ensure_future(answer_requests(first, ran))
            for n in range(6):  # round robin: at least 4 of them arrive at other nodes
                response = await nodes.http.post(
                    f"/pedelec/v1/sessions/{sid}/tool-calls",
                    json={"tool": "a", "args": {"n": n}})
                assert response.json()["result"] == {"ok": True, "data": {"n": n}}, (
                    response.text)
            assert len(ran) == len(set(ran)) == 6
            handlers.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await handlers

            call = asyncio.ensure_future(nodes.http.post(
                f"/pedelec/v1/sessions/{sid}/tool-calls", json={"tool": "a", "args": {}},
                timeout=3 * WAIT))
            sent = await first.recv()
            assert sent["type"] == "tool.request"
            owner = [node for node in nodes.nodes if await _holds(node.port, sid)]
            assert len(owner) == 1
            await owner[0].kill()

            page = await RawClient.open(nodes.ws_url)
            resumed = await page.hello([tool_meta("a")], sessionId=sid, resumeToken=token)
            assert resumed["type"] == "welcome" and resumed["resumed"], resumed
            again: list[str] = []
            handlers = asyncio.ensure_future(answer_requests(page, again))
            try:
                response = await asyncio.wait_for(call, 3 * WAIT)
                assert response.json()["result"] == {"ok": True, "data": {}}, response.text
                assert again == [sent["toolRequestId"]]
            finally:
                handlers.cancel()
                await page.close()

    run(main(), timeout=90)


async def _holds(port: int, session_id: str) -> bool:
    """Whether the node on ``port`` holds the session (its own list of sessions)."""
    async with httpx.AsyncClient(timeout=WAIT) as client:
        response = await client.get(f"http://127.0.0.1:{port}/pedelec/v1/sessions",
                                    headers={"Authorization": f"Bearer {TOKEN}"})
    return session_id in response.text


def test_a_node_stopping_while_it_routes_a_call_answers_core_stopping(
        redis_server: RedisServer, tmp_path: Path) -> None:
    """Node B forwards a call (no Idempotency-Key) to node A, which holds the page (it
    never answers), and B is stopped (SIGTERM): once it gives up waiting, B's caller gets
    503 CORE_STOPPING, not a bare 500 and a traceback in B's log, and the call is cancelled
    as CORE_STOPPING says (the page gets tool.cancel); B exits 0."""
    import signal

    from clusterkit import Node

    async def main() -> None:
        a, b = Node(redis_server.url, tmp_path), Node(redis_server.url, tmp_path)
        try:
            await asyncio.gather(a.start(), b.start())
            page = await RawClient.open(f"ws://127.0.0.1:{a.port}/pedelec/v1/bridge")
            sid = (await page.hello([tool_meta("a")]))["sessionId"]
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{b.port}", timeout=WAIT,
                                         headers={"Authorization": f"Bearer {TOKEN}"}
                                         ) as http:
                call = asyncio.ensure_future(http.post(
                    f"/pedelec/v1/sessions/{sid}/tool-calls",
                    json={"tool": "a", "args": {"n": 1}}))
                while (await asyncio.wait_for(page.recv(), WAIT))["type"] != "tool.request":
                    pass
                assert b.process is not None
                b.process.send_signal(signal.SIGTERM)
                answer = await asyncio.wait_for(call, WAIT)
            assert answer.status_code == 503, answer.text
            assert answer.json()["error"]["code"] == "CORE_STOPPING"
            assert (await asyncio.wait_for(page.recv(), WAIT))["type"] == "tool.cancel"
            assert await asyncio.to_thread(b.process.wait, WAIT) == 0
            assert "Traceback" not in b.log.read_text(errors="replace")
            await page.close()
        finally:
            await a.kill()
            await b.kill()

    run(main())
