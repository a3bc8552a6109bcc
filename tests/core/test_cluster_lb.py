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
