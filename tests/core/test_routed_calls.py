"""A control-API call forwarded to the node holding the page (two nodes on a real
redis-server): given an ``Idempotency-Key`` by the forwarding node, it is answered as soon
as the page has answered, its result's write still under way; with the caller's own key
(even one that looks like the router's) only once the result is stored, as on one node."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from corekit import WAIT, Core, RawClient, config, run, running_core, tool_meta, until
from storekit import RedisServer
from test_cluster import answer_requests

from pedelec_pyodide.core.store.ops import REQUEST_COLUMNS, Op

_FINISHED = REQUEST_COLUMNS.index("finished_at")


class HeldResults:
    """Holds every batch of writes that stores a request's result until released."""

    def __init__(self, store: Any) -> None:
        self.release = asyncio.Event()
        self.holding = asyncio.Event()
        apply = store._apply

        async def held(ops: list[Op]) -> None:
            if any(op.kind == "request" and op.row[_FINISHED] is not None for op in ops):
                self.holding.set()
                await self.release.wait()
            await apply(ops)

        store._apply = held


@contextlib.asynccontextmanager
async def two_nodes(url: str) -> AsyncIterator[tuple[Core, Core, str, HeldResults]]:
    """The page on A (answering at once), A's result writes held; B forwards to A. A
    flush outlasts any wait here (at its timeout it would answer anyway)."""
    cfg = {"store": url, "store_timeout": 4 * WAIT}
    async with running_core(config(**cfg)) as a, running_core(config(**cfg)) as b:
        page = await RawClient.open(a.ws_url)
        sid = (await page.hello([tool_meta("a")]))["sessionId"]
        handlers = asyncio.ensure_future(answer_requests(page, []))
        held = HeldResults(a.registry.store)
        try:
            await until(lambda: sid in a.registry.sessions)
            yield a, b, sid, held
        finally:
            held.release.set()
            handlers.cancel()
            await page.close()


def forwarded_call(b: Core, sid: str, **headers: str) -> Callable[[], Awaitable[Any]]:
    return lambda: b.http.post(f"/pedelec/v1/sessions/{sid}/tool-calls", headers=headers,
                               json={"tool": "a", "args": {"n": 1}})


def test_a_call_keyed_by_its_router_is_answered_before_its_result_is_stored(
        redis_server: RedisServer) -> None:
    async def main() -> None:
        async with two_nodes(redis_server.url) as (_, b, sid, held):
            response = await asyncio.wait_for(forwarded_call(b, sid)(), WAIT)
            assert response.status_code == 200, response.text
            assert response.json()["result"] == {"ok": True, "data": {"n": 1}}
            assert held.holding.is_set() and not held.release.is_set()

    run(main())


def test_a_call_keyed_by_its_caller_is_answered_once_its_result_is_stored(
        redis_server: RedisServer) -> None:
    async def main() -> None:
        async with two_nodes(redis_server.url) as (a, b, sid, held):
            call = asyncio.ensure_future(
                forwarded_call(b, sid, **{"Idempotency-Key": "pedelec-route-mine"})())
            session = a.registry.sessions[sid]
            await until(lambda: held.holding.is_set() and not session.pending, "the result")
            await asyncio.sleep(0.05)  # loop turns enough to answer, were it not waiting
            assert not call.done()
            held.release.set()
            response = await asyncio.wait_for(call, WAIT)
            assert response.status_code == 200, response.text
            assert response.json()["result"] == {"ok": True, "data": {"n": 1}}

    run(main())
