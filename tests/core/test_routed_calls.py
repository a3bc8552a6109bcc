"""A control-API call another node forwarded, run on the holder (``routing.run_here``):
with the router's own ``Idempotency-Key`` it is answered as soon as the page has answered,
its result's write still under way; with a caller's key (even one that looks like the
router's) only once the result is stored, as a call made to the holder directly."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from corekit import TOKEN, WAIT, RawClient, config, run, running_core, tool_meta, until
from test_cluster import answer_requests

from pedelec_pyodide.core.routing import run_here
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


def forwarded(session_id: str, key: str, *, route_key: bool) -> dict[str, Any]:
    """A tool call as ClusterRouter publishes it to the holder."""
    return {"method": "POST", "path": f"/pedelec/v1/sessions/{session_id}/tool-calls",
            "query": "", "body": json.dumps({"tool": "a", "args": {}}),
            "headers": [["authorization", f"Bearer {TOKEN}"],
                        ["content-type", "application/json"], ["idempotency-key", key]],
            "routeKey": route_key}


def held_core(tmp_path: Path) -> Any:
    """Core on SQLite; a flush outlasts any wait here (it would answer at its timeout)."""
    return running_core(config(store=str(tmp_path / "core.sqlite"), store_timeout=4 * WAIT))


@contextlib.asynccontextmanager
async def answered_page(core: Any) -> AsyncIterator[tuple[str, list[str]]]:
    page = await RawClient.open(core.ws_url)
    sid = (await page.hello([tool_meta("a")]))["sessionId"]
    ran: list[str] = []
    handlers = asyncio.ensure_future(answer_requests(page, ran))
    try:
        yield sid, ran
    finally:
        handlers.cancel()
        await page.close()


def test_a_routers_key_is_answered_before_its_result_is_stored(tmp_path: Path) -> None:
    async def main() -> None:
        async with held_core(tmp_path) as core, answered_page(core) as (sid, ran):
            held = HeldResults(core.registry.store)
            status, body = await asyncio.wait_for(run_here(
                core.app, forwarded(sid, "pedelec-route-1", route_key=True)), WAIT)
            assert status == 200, body
            assert json.loads(body)["result"] == {"ok": True, "data": {}}
            assert held.holding.is_set() and not held.release.is_set()
            assert len(ran) == 1
            held.release.set()

    run(main())


def test_a_callers_key_is_answered_once_its_result_is_stored(tmp_path: Path) -> None:
    async def main() -> None:
        async with held_core(tmp_path) as core, answered_page(core) as (sid, ran):
            held = HeldResults(core.registry.store)
            call = asyncio.ensure_future(run_here(  # a key like the router's, from a caller
                core.app, forwarded(sid, "pedelec-route-2", route_key=False)))
            session = core.registry.sessions[sid]
            await until(lambda: held.holding.is_set() and not session.pending, "the result")
            await asyncio.sleep(0.05)  # loop turns enough to answer, were it not waiting
            assert not call.done()
            held.release.set()
            status, body = await asyncio.wait_for(call, WAIT)
            assert status == 200, body
            assert len(ran) == 1

    run(main())
