"""A page's progress to an MCP client, against its result on the same path.

One process, one event loop, on 127.0.0.1: Core (uvicorn), a page speaking the wire
protocol by hand over a websockets client, and the official ``mcp`` Python client (the
``initialize`` handshake) calling the page's tool with a ``progress_callback``. Each round,
per call: the page sends ``tool.progress`` ``--progress`` times, each time waiting for the
client's callback, then ``tool.result``, waiting for ``call_tool`` to return. Latency is
page send → client callback (progress) and page send → ``call_tool`` returns (result); the
two are interleaved in every call, so the ratio of their medians compares like with like.

Event-loop steps: a second pass counts the loop's iterations (a callback that reschedules
itself with ``call_soon`` each iteration) between Core taking the page's frame
(``accept_progress`` / ``accept_result``) and Core handing the bytes of the MCP message to
uvicorn (the ASGI ``send`` of the MCP route). The counter keeps the loop busy, so this pass
gives steps only; the latency pass runs without it.

Run: ``.venv/bin/python bench/mcp_progress.py [--rounds 7 --calls 30 --progress 10]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import uvicorn
import websockets
from mcp import ClientSession, types
from mcp.client.streamable_http import streamable_http_client
from mcp.server.session import ServerSession

from pedelec_pyodide.core import sessions
from pedelec_pyodide.core.config import CoreConfig
from pedelec_pyodide.core.http.mcp import McpEndpoint
from pedelec_pyodide.core.server import LazyMcp, create_app, uvicorn_config

TOKEN = "bench"
WAIT = 10.0  # seconds: the bound on every wait
TOOL = {"name": "work", "description": "Works a while.", "argsSchema": {"type": "object"}}


class Steps:
    """Counts event-loop iterations while running (one callback per iteration)."""

    def __init__(self) -> None:
        self.count = 0
        self.running = False

    def start(self) -> None:
        self.running = True
        asyncio.get_running_loop().call_soon(self._tick)

    def stop(self) -> None:
        self.running = False

    def _tick(self) -> None:
        self.count += 1
        if self.running:
            asyncio.get_running_loop().call_soon(self._tick)


class Marks:
    """Core's side of each message: the step it took the page's frame and the step it
    sent the MCP message on."""

    def __init__(self, steps: Steps) -> None:
        self.steps = steps
        self.taken: dict[str, int] = {}
        self.progress_steps: list[int] = []
        self.result_steps: list[int] = []
        # Core's own part: the frame taken -> the message handed to the SDK
        self.progress_handed: list[int] = []
        self.result_handed: list[int] = []

    def clear(self) -> None:
        for counted in (self.progress_steps, self.result_steps, self.progress_handed,
                        self.result_handed):
            counted.clear()

    def install(self) -> None:
        accept_progress = sessions.CoreSession.accept_progress
        accept_result = sessions.CoreSession.accept_result
        marks = self

        def on_progress(session: Any, message: Any) -> None:
            marks.taken["progress"] = marks.steps.count
            accept_progress(session, message)

        def on_result(session: Any, message: Any) -> Any:
            marks.taken["result"] = marks.steps.count
            return accept_result(session, message)

        sessions.CoreSession.accept_progress = on_progress  # type: ignore[method-assign]
        sessions.CoreSession.accept_result = on_result  # type: ignore[method-assign]
        call = LazyMcp.__call__

        async def mcp_route(self: Any, scope: Any, receive: Any, send: Any) -> None:
            async def watched(message: Any) -> None:
                body = message.get("body", b"")
                if b'"notifications/progress"' in body and "progress" in marks.taken:
                    marks.progress_steps.append(marks.steps.count - marks.taken.pop("progress"))
                elif b'"structuredContent"' in body and "result" in marks.taken:
                    marks.result_steps.append(marks.steps.count - marks.taken.pop("result"))
                await send(message)

            await call(self, scope, receive, watched)

        LazyMcp.__call__ = mcp_route  # type: ignore[method-assign]
        notify = ServerSession.send_notification

        async def handed(self: Any, notification: Any, related_request_id: Any = None) -> None:
            if isinstance(notification, types.ProgressNotification) and "progress" in marks.taken:
                marks.progress_handed.append(marks.steps.count - marks.taken["progress"])
            await notify(self, notification, related_request_id)

        ServerSession.send_notification = handed  # type: ignore[method-assign]
        call_tool = McpEndpoint._call_tool

        async def answered(self: Any, ctx: Any, params: Any) -> Any:
            answer = await call_tool(self, ctx, params)
            if "result" in marks.taken:
                marks.result_handed.append(marks.steps.count - marks.taken["result"])
            return answer

        McpEndpoint._call_tool = answered  # type: ignore[method-assign]


@contextlib.asynccontextmanager
async def core() -> AsyncIterator[int]:
    # the page's frames are not to meet the rate limit here: it measures paths, not floods
    cfg = CoreConfig(port=0, admin_token=TOKEN, web_dir=None, rate_limit=1e6,
                     rate_burst=10**6)
    app = create_app(cfg)
    server = uvicorn.Server(uvicorn_config(app, cfg))
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield server.servers[0].sockets[0].getsockname()[1]
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


async def measure(port: int, rounds: int, calls: int, updates: int,
                  steps: Steps | None) -> tuple[list[float], list[float]]:
    ws = await websockets.connect(f"ws://127.0.0.1:{port}/pedelec/v1/bridge")
    await ws.send(json.dumps({"type": "hello", "protocol": 1, "tools": [TOOL]}))
    session_id = json.loads(await ws.recv())["sessionId"]
    url = f"http://127.0.0.1:{port}/pedelec/v1/sessions/{session_id}/mcp"
    progress_ms: list[float] = []
    result_ms: list[float] = []
    arrived = asyncio.Event()
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
    async with http, streamable_http_client(url, http_client=http) as (read, write), \
            ClientSession(read, write) as client:
        await asyncio.wait_for(client.initialize(), WAIT)

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            arrived.set()

        if steps is not None:
            steps.start()
        for _ in range(rounds):
            for _ in range(calls):
                call = asyncio.create_task(
                    client.call_tool("work", {}, progress_callback=on_progress))
                request = json.loads(await asyncio.wait_for(ws.recv(), WAIT))
                assert request["type"] == "tool.request", request
                rid = request["toolRequestId"]
                for value in range(1, updates + 1):
                    arrived.clear()
                    sent = time.perf_counter()
                    await ws.send(json.dumps({"type": "tool.progress", "toolRequestId": rid,
                                              "progress": value, "total": updates}))
                    await asyncio.wait_for(arrived.wait(), WAIT)
                    progress_ms.append((time.perf_counter() - sent) * 1000)
                sent = time.perf_counter()
                await ws.send(json.dumps({"type": "tool.result", "toolRequestId": rid,
                                          "result": {"done": True}, "handledBy": "named"}))
                await asyncio.wait_for(call, WAIT)
                result_ms.append((time.perf_counter() - sent) * 1000)
        if steps is not None:
            steps.stop()
    await ws.close()
    return progress_ms, result_ms


async def main(rounds: int, calls: int, updates: int) -> None:
    steps = Steps()
    marks = Marks(steps)
    marks.install()
    async with core() as port:
        await measure(port, 1, 5, updates, None)  # warm up: imports, first connections
        progress_ms, result_ms = await measure(port, rounds, calls, updates, None)
        marks.clear()
        await measure(port, 1, calls, updates, steps)
    p50_progress = statistics.median(progress_ms)
    p50_result = statistics.median(result_ms)
    print(f"{len(progress_ms)} progress notifications, {len(result_ms)} results "
          f"({rounds} rounds of {calls} calls, {updates} progress each)")
    print(f"page -> MCP client p50: progress {p50_progress:.3f} ms, "
          f"result {p50_result:.3f} ms; progress / result = {p50_progress / p50_result:.2f}")
    print(f"p90: progress {statistics.quantiles(progress_ms, n=10)[-1]:.3f} ms, "
          f"result {statistics.quantiles(result_ms, n=10)[-1]:.3f} ms")
    for what, name, counted in (
            ("handed to the SDK", "progress", marks.progress_handed),
            ("handed to the SDK", "result", marks.result_handed),
            ("MCP bytes to uvicorn", "progress", marks.progress_steps),
            ("MCP bytes to uvicorn", "result", marks.result_steps)):
        print(f"event-loop steps, Core taking the frame -> {what}, {name}: "
              f"median {statistics.median(counted)}, max {max(counted)} "
              f"({len(counted)} messages)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--progress", type=int, default=10)
    args = parser.parse_args()
    asyncio.run(main(args.rounds, args.calls, args.progress))
