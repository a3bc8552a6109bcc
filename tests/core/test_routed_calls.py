"""A control-API call forwarded to the node holding the page (two nodes on a real
redis-server): given an ``Idempotency-Key`` by the forwarding node, it is answered as soon
as the page has answered, its result's write still under way; with the caller's own key
(even one that looks like the router's) only once the result is stored, as on one node.
Whether the node that ran it had let the session go is read from its answer's JSON."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from clusterkit import answer_requests
from corekit import WAIT, Core, RawClient, config, next_of, run, running_core, tool_meta, until
from storekit import RedisServer

from pedelec_pyodide.core.cluster.routing import _moved
from pedelec_pyodide.core.http.control import SESSION_NOT_FOUND, TOOL_REQUEST_NOT_FOUND
from pedelec_pyodide.core.sessions import SESSION_MOVED
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


def test_a_caller_with_its_own_key_hanging_up_on_a_node_without_the_page_does_not_cancel(
        redis_server: RedisServer) -> None:
    """A keyed request outlives its caller, whichever node the caller reached: the page
    is not told ``tool.cancel``, and a retry with the key gets the result."""

    async def main() -> None:
        cfg = {"store": redis_server.url}
        async with running_core(config(**cfg)) as a, running_core(config(**cfg)) as b:
            page = await RawClient.open(a.ws_url)
            sid = (await page.hello([tool_meta("a")]))["sessionId"]
            call = forwarded_call(b, sid, **{"Idempotency-Key": "mine"})
            first = asyncio.ensure_future(call())
            frame = await next_of(page, "tool.request")
            first.cancel()  # httpx closes the connection: the caller hung up
            with contextlib.suppress(asyncio.CancelledError):
                await first
            with contextlib.suppress(asyncio.TimeoutError):
                cancel = await asyncio.wait_for(next_of(page, "tool.cancel"), 1)
                raise AssertionError(f"the page was told {cancel}")
            await page.send({"type": "tool.result", "toolRequestId": frame["toolRequestId"],
                             "result": {"ok": True, "data": 1}, "handledBy": "named"})
            again = await asyncio.wait_for(call(), WAIT)
            assert again.json()["result"] == {"ok": True, "data": 1}, again.text
            await page.close()

    run(main())


def test_a_caller_hanging_up_on_a_node_that_took_the_session_cancels_the_request(
        redis_server: RedisServer) -> None:
    """No node holds the session (its node stopped, the page away): the node the call
    reached takes it and waits there for the page; its caller hangs up: the request is
    cancelled, as on one node, so the page coming back is not asked to run it."""

    async def main() -> None:
        cfg = {"store": redis_server.url}
        async with running_core(config(**cfg)) as b:
            async with running_core(config(**cfg)) as a:
                page = await RawClient.open(a.ws_url)
                sid = (await page.hello([tool_meta("a")]))["sessionId"]
                await page.close()
            call = asyncio.ensure_future(forwarded_call(b, sid)())
            await until(lambda: (s := b.registry.sessions.get(sid)) is not None
                        and bool(s.pending), "the request waiting on B")
            call.cancel()  # the caller hangs up
            with contextlib.suppress(asyncio.CancelledError):
                await call
            await until(lambda: not b.registry.sessions[sid].pending, "it is cancelled")

    run(main())


def test_a_404_quoting_session_not_found_from_the_holder_is_the_callers_answer(
        redis_server: RedisServer) -> None:
    """The holder's 404 for an unknown tool request whose id is ``SESSION_NOT_FOUND``
    (quoted in its message) is answered: the router reads the code from the answer's
    JSON, where it matched the text and routed the call again until its limit."""

    async def main() -> None:
        async with two_nodes(redis_server.url) as (_, b, sid, _held):
            response = await asyncio.wait_for(b.http.get(
                f"/pedelec/v1/sessions/{sid}/tool-calls/SESSION_NOT_FOUND"), WAIT)
            assert response.status_code == 404, response.text
            error = response.json()["error"]
            assert error["code"] == TOOL_REQUEST_NOT_FOUND
            assert "SESSION_NOT_FOUND" in error["message"]

    run(main())


def _error(code: str, message: str = "") -> str:
    return json.dumps({"error": {"code": code, "message": message}})


@pytest.mark.parametrize(("status", "answer", "here", "moved"), [
    (200, json.dumps({"result": {"error": {"code": SESSION_MOVED}}}), True, True),
    (503, _error(SESSION_MOVED), False, True),
    (404, _error(SESSION_NOT_FOUND), False, True),
    (404, _error(SESSION_NOT_FOUND), True, False),  # this node's own answer: final
    (404, _error(TOOL_REQUEST_NOT_FOUND, "no tool request 'SESSION_NOT_FOUND'"), False,
     False),
    (200, json.dumps({"result": {"ok": True, "data": SESSION_MOVED}}), False, False),
    (200, json.dumps({"result": [SESSION_MOVED], "error": SESSION_NOT_FOUND}), False,
     False),
    (404, f"not JSON {SESSION_NOT_FOUND}", False, False),
])
def test_whether_a_call_moved_is_read_from_the_answers_json(
        status: int, answer: str, here: bool, moved: bool) -> None:
    assert _moved(status, answer, here=here) is moved
