"""An outside review of the performance pass on Core's hot path: what it must not have
broken (see docs/explanation/performance.md)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
import uvicorn
from corekit import WAIT, Core, GatedTools, Page, config, hang_up, run, until

from pedelec_pyodide import Session, protocol
from pedelec_pyodide.core.server import create_app
from pedelec_pyodide.core.sessions.frames import checked_request_frame
from pedelec_pyodide.core.sessions.turns import appended_history


@pytest.mark.parametrize("kept", ["[ ]", "[]\n", ' [{"turn_id": "t0"}] ', '[{"turn_id": "t0"}\n]'])
def test_appending_to_a_kept_history_not_in_compact_form_stays_json(kept: str) -> None:
    """A stored history is taken as any JSON list of objects (store/rows.py), so it may
    hold whitespace (a row written by hand or by another tool). Appending the offline
    agent's entry as text must still give JSON, or the session's row is damaged at the
    next start and the session lost."""
    new = [{"agent": "offline", "turn_id": "t1", "user": "hi"}]
    appended = appended_history(kept, new, 10_000)
    assert appended is not None
    assert json.loads(appended) == json.loads(kept) + new


# --- a caller's hang-up, served other than by Core's own protocols ----------------------------


async def _plain_core() -> Core:
    """Core under plain uvicorn (h11, its own WebSocket protocol): no HangUp in the scope,
    no frame guard: the hang-up is heard through receive(), frames go out by the task."""
    cfg = config()
    app = create_app(cfg)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, http="h11",
                                           log_level="warning"))
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    task = asyncio.create_task(server.serve())
    await until(lambda: server.started or task.done(), "uvicorn to start")
    if task.done():
        task.result()
    port = server.servers[0].sockets[0].getsockname()[1]
    http = httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=WAIT,
                             headers={"Authorization": f"Bearer {cfg.admin_token}"})
    return Core(server, task, port, http, app)


@pytest.mark.parametrize("keyed", [False, True])
def test_a_hang_up_under_another_server_is_heard_as_under_cores_own(keyed: bool) -> None:
    async def main() -> None:
        core = await _plain_core()
        page = None
        try:
            gated = GatedTools("slow")
            page = await Page(Session(gated.tools())).connect(core.ws_url)
            sid = page.session.session_id
            path = f"/pedelec/v1/sessions/{sid}/tool-calls"
            headers = {"Idempotency-Key": "k-plain"} if keyed else {}
            await hang_up(core.port, path, {"tool": "slow", "args": {}}, headers,
                          lambda: asyncio.wait_for(gated.started["slow"].wait(), WAIT))
            (sent,) = page.frames("tool.request")
            rid = sent["toolRequestId"]
            if not keyed:  # cancelled: the page is told
                await page.wait_frame("tool.cancel")
                (cancel,) = page.frames("tool.cancel")
                assert cancel["toolRequestId"] == rid and "hung up" in cancel["reason"]
                return
            retry = asyncio.create_task(core.http.post(
                path, json={"tool": "slow", "args": {}}, headers=headers))
            gated.gates["slow"].set()
            answer = (await asyncio.wait_for(retry, WAIT)).json()
            assert answer["toolRequestId"] == rid and not page.frames("tool.cancel")
            assert len(page.frames("tool.request")) == 1  # run once
        finally:
            if page is not None:
                await page.drop()
            await core.stop()

    run(main())


# --- the fast check that vouches for a tool.request frame ------------------------------------


def _nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


_ARGS = [
    {"\ud800": 1}, {"a": "\ud800"}, {"a": "\\ud800"}, {"\\ud800": 1}, {"a": "\udfff"},
    {"a": "\U0001f600"}, {"a": 1e308}, {"a": 10**300}, {"a": "\x00\u2028"}, {1: 2},
    {"a": "x" * (1 << 20)}, {"a": "\u00e9" * (1 << 19)},
    *(_nested(d) for d in range(protocol.MAX_DEPTH - 2, protocol.MAX_DEPTH + 2)),
]


@pytest.mark.parametrize("tool", ["t", 5, None, "\ud800"])
def test_the_fast_check_gives_the_pages_verdict(tool: object) -> None:
    """Whatever the args or tool name, a frame is refused exactly when, and as, the
    page's full parse of it refuses it."""
    def verdict(check: Any) -> object:
        try:
            check()
        except protocol.ProtocolError as exc:
            return exc.code, exc.message
        return "taken"

    for args in _ARGS:
        request = protocol.ToolRequest(tool_request_id="r" * 32, tool=tool,  # type: ignore[arg-type]
                                       args=args)
        full = verdict(lambda r=request: protocol.parse_server_frame(
            r.encode(), max_bytes=1 << 20))
        assert verdict(lambda r=request: checked_request_frame(r, 1 << 20)) == full
