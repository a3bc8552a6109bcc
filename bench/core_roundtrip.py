"""One tool call, control API -> Core -> simulated page -> back, against raw round trips.

All in one process and one event loop, on 127.0.0.1, same libraries (uvicorn, Starlette,
websockets, httpx), variants interleaved round by round; prints ratios of the medians.

* ``ws echo``: a websocket client sends a frame to a Starlette echo endpoint under the
  same uvicorn settings and waits for it to come back (the issue's baseline);
* ``http + ws echo``: one HTTP request to a bare Starlette route, plus one ws echo: the
  two hops a control-API tool call cannot avoid;
* ``tool call``: ``POST /pedelec/v1/sessions/{id}/tool-calls`` to Core, which sends
  ``tool.request`` to a page (a real ``pedelec_pyodide.Session`` behind a websockets
  client), which runs a sync tool and answers ``tool.result``.

Run: ``.venv/bin/python bench/core_roundtrip.py [--rounds 15 --calls 200]``
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

import httpx
import uvicorn
import websockets
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from pedelec_pyodide import Session, define_tool
from pedelec_pyodide.core.config import CoreConfig
from pedelec_pyodide.core.server import create_app, uvicorn_config

TOKEN = "bench"


class EchoAgent:
    async def run(self, turn: Any) -> str:
        return str(turn.text)


async def echo(websocket: WebSocket) -> None:
    await websocket.accept()
    while True:
        message = await websocket.receive()
        if message["type"] == "websocket.disconnect":
            return
        await websocket.send({"type": "websocket.send", "text": message["text"]})


async def ping(request: Request) -> JSONResponse:
    return JSONResponse({"ok": True})


@contextlib.asynccontextmanager
async def serve(app: Starlette, cfg: CoreConfig) -> AsyncIterator[int]:
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


class RawHTTP:
    """A minimal HTTP/1.1 keep-alive client on asyncio streams: shows what the server
    side costs without httpx's own client overhead."""

    def __init__(self, port: int, headers: str = "") -> None:
        self.port = port
        self.headers = headers
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, method: str, path: str, body: bytes = b"") -> bytes:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        assert self.reader is not None
        self.writer.write(
            f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n{self.headers}"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            .encode() + body)
        head = await self.reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        return await self.reader.readexactly(length)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


class PageClient:
    """A real Session behind a websockets client."""

    def __init__(self) -> None:
        tool = define_tool(name="update_counter", description="adds delta",
                           args_schema={"type": "object"},
                           handler=lambda args: {"value": args["delta"] + 1})
        self.session = Session([tool])
        self.ws: Any = None
        self.tasks: set[asyncio.Future[Any]] = set()

    def send(self, frame: str) -> None:
        task = asyncio.ensure_future(self.ws.send(frame))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def connect(self, url: str) -> None:
        self.ws = await websockets.connect(url)
        self.session.connection_made(self)
        self.session.receive(await self.ws.recv())  # welcome
        reader = asyncio.ensure_future(self._read())
        self.tasks.add(reader)
        reader.add_done_callback(self.tasks.discard)

    async def _read(self) -> None:
        with contextlib.suppress(websockets.ConnectionClosed):
            async for frame in self.ws:
                self.session.receive(frame)


async def main(rounds: int, calls: int) -> None:
    cfg = CoreConfig(port=0, admin_token=TOKEN, web_dir=None, agent_factory=EchoAgent)
    bare = Starlette(routes=[Route("/ping", ping), WebSocketRoute("/echo", echo)])
    async with serve(create_app(cfg), cfg) as core_port, serve(bare, cfg) as bare_port:
        page = PageClient()
        await page.connect(f"ws://127.0.0.1:{core_port}/pedelec/v1/bridge")
        sid = page.session.session_id
        core_http = httpx.AsyncClient(base_url=f"http://127.0.0.1:{core_port}",
                                      headers={"Authorization": f"Bearer {TOKEN}"})
        bare_http = httpx.AsyncClient(base_url=f"http://127.0.0.1:{bare_port}")
        echo_ws = await websockets.connect(f"ws://127.0.0.1:{bare_port}/echo")
        raw_core = RawHTTP(core_port, f"Authorization: Bearer {TOKEN}\r\n")
        raw_bare = RawHTTP(bare_port)
        call_path = f"/pedelec/v1/sessions/{sid}/tool-calls"
        frame = ('{"type":"tool.result","toolRequestId":"x","result":{"value":3},'
                 '"handledBy":"named"}')
        body = {"tool": "update_counter", "args": {"delta": 2}}
        raw_body = json.dumps(body).encode()

        async def ws_echo() -> None:
            await echo_ws.send(frame)
            await echo_ws.recv()

        async def http_and_echo() -> None:
            await bare_http.get("/ping")
            await ws_echo()

        async def tool_call() -> None:
            response = await core_http.post(f"/pedelec/v1/sessions/{sid}/tool-calls", json=body)
            assert response.json()["result"] == {"value": 3}

        async def raw_http_and_echo() -> None:
            await raw_bare.request("GET", "/ping")
            await ws_echo()

        async def raw_tool_call() -> None:
            answer = json.loads(await raw_core.request("POST", call_path, raw_body))
            assert answer["result"] == {"value": 3}, answer

        variants = {
            "ws echo": ws_echo,
            "http + ws echo": http_and_echo,
            "tool call": tool_call,
            "raw http + ws echo": raw_http_and_echo,
            "raw tool call": raw_tool_call,
        }
        samples: dict[str, list[float]] = {name: [] for name in variants}
        for fn in variants.values():  # warm up
            for _ in range(50):
                await fn()
        for _ in range(rounds):
            for name, fn in variants.items():
                for _ in range(calls):
                    started = time.perf_counter()
                    await fn()
                    samples[name].append(time.perf_counter() - started)
        raw_core.close()
        raw_bare.close()
        await echo_ws.close()
        await page.ws.close()
        await core_http.aclose()
        await bare_http.aclose()

    p50 = {name: statistics.median(values) for name, values in samples.items()}
    base = p50["ws echo"]
    print(f"{rounds} rounds x {calls} calls per variant, interleaved; p50 ratios:")
    for name, value in p50.items():
        print(f"  {name:20s} {value / base:5.2f}x ws echo   (p50 {value * 1e6:7.1f} us)")
    print("Core's own cost, over the hops a control-API call cannot avoid:")
    print(f"  httpx client:   tool call / (http + ws echo) = "
          f"{p50['tool call'] / p50['http + ws echo']:.2f}x")
    print(f"  raw client:     raw tool call / (raw http + ws echo) = "
          f"{p50['raw tool call'] / p50['raw http + ws echo']:.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=200)
    options = parser.parse_args()
    asyncio.run(main(options.rounds, options.calls))
