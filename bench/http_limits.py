"""What bounding request heads costs: uvicorn's httptools protocol against Core's wrapper.

The same apps under the same uvicorn settings, once with uvicorn's ``HttpToolsProtocol``
and once with Core's ``BoundedHttpProtocol`` (``pedelec_pyodide/core/http/http_limits.py``),
all in one process and loop on 127.0.0.1, variants interleaved round by round; prints the
medians of the round trip and of the CPU per call, and the ratios bounded / plain:

* ``GET``: a raw keep-alive client's GET of a bare Starlette route;
* ``POST 64 KiB`` / ``POST 1 MiB``: the same client POSTing a body the route reads (the
  wrapper feeds a Content-Length body to the parser whole);
* ``tool call``: ``POST /pedelec/v1/sessions/{id}/tool-calls`` to Core, answered by a real
  ``Session`` behind a websockets client (bench/core_roundtrip.py's raw tool call).

Run: ``.venv/bin/python bench/http_limits.py [--rounds 15 --calls 200]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import uvicorn
from core_roundtrip import TOKEN, EchoAgent, PageClient, RawHTTP
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from pedelec_pyodide.core.config import CoreConfig
from pedelec_pyodide.core.server import create_app, uvicorn_config


async def ping(request: Request) -> JSONResponse:
    return JSONResponse({"ok": True})


async def upload(request: Request) -> JSONResponse:
    return JSONResponse({"bytes": len(await request.body())})


@contextlib.asynccontextmanager
async def serve(app: Starlette, cfg: CoreConfig, plain: bool) -> AsyncIterator[int]:
    settings = uvicorn_config(app, cfg)
    if plain:
        settings.http = HttpToolsProtocol
    server = uvicorn.Server(settings)
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield server.servers[0].sockets[0].getsockname()[1]
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


NAMES = ("GET", "POST 64 KiB", "POST 1 MiB", "tool call")


async def endpoints(stack: contextlib.AsyncExitStack, cfg: CoreConfig,
                    plain: bool) -> dict[str, Callable[[], Awaitable[object]]]:
    """The variants, each one request, against a bare app and a Core under one protocol."""
    bare = Starlette(routes=[Route("/ping", ping), Route("/upload", upload, methods=["POST"])])
    bare_port = await stack.enter_async_context(serve(bare, cfg, plain))
    core_port = await stack.enter_async_context(serve(create_app(cfg), cfg, plain))
    page = PageClient()
    await page.connect(f"ws://127.0.0.1:{core_port}/pedelec/v1/bridge")
    stack.push_async_callback(page.ws.close)
    raw_bare = RawHTTP(bare_port)
    raw_core = RawHTTP(core_port, f"Authorization: Bearer {TOKEN}\r\n")
    stack.callback(raw_bare.close)
    stack.callback(raw_core.close)
    call_path = f"/pedelec/v1/sessions/{page.session.session_id}/tool-calls"
    call_body = json.dumps({"tool": "update_counter", "args": {"delta": 2}}).encode()
    small, large = b"x" * (64 * 1024), b"x" * (1024 * 1024)

    async def tool_call() -> None:
        answer = json.loads(await raw_core.request("POST", call_path, call_body))
        assert answer["result"] == {"value": 3}, answer

    return {"GET": lambda: raw_bare.request("GET", "/ping"),
            "POST 64 KiB": lambda: raw_bare.request("POST", "/upload", small),
            "POST 1 MiB": lambda: raw_bare.request("POST", "/upload", large),
            "tool call": tool_call}


async def main(rounds: int, calls: int) -> None:
    cfg = CoreConfig(port=0, admin_token=TOKEN, web_dir=None, agent_factory=EchoAgent)
    async with contextlib.AsyncExitStack() as stack:
        plain = await endpoints(stack, cfg, plain=True)
        bounded = await endpoints(stack, cfg, plain=False)
        variants = {(name, kind): fns[name] for name in NAMES
                    for kind, fns in (("plain", plain), ("bounded", bounded))}
        samples: dict[tuple[str, str], list[float]] = {key: [] for key in variants}
        cpu: dict[tuple[str, str], list[float]] = {key: [] for key in variants}
        for fn in variants.values():  # warm up
            for _ in range(50):
                await fn()
        for _ in range(rounds):
            for key, fn in variants.items():
                batch = time.process_time()
                for _ in range(calls):
                    started = time.perf_counter()
                    await fn()
                    samples[key].append(time.perf_counter() - started)
                cpu[key].append((time.process_time() - batch) / calls)

    p50 = {key: statistics.median(values) for key, values in samples.items()}
    cpu50 = {key: statistics.median(values) for key, values in cpu.items()}
    print(f"{rounds} rounds x {calls} calls per variant, interleaved; medians in µs of the "
          "round trip and of this process's CPU per call (client and server), bounded / plain:")
    for name in NAMES:
        wall = [p50[(name, kind)] * 1e6 for kind in ("plain", "bounded")]
        used = [cpu50[(name, kind)] * 1e6 for kind in ("plain", "bounded")]
        print(f"  {name:12s} round trip {wall[0]:7.0f} / {wall[1]:7.0f} = {wall[1] / wall[0]:5.3f}x"
              f"   CPU {used[0]:7.0f} / {used[1]:7.0f} = {used[1] / used[0]:5.3f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=200)
    options = parser.parse_args()
    asyncio.run(main(options.rounds, options.calls))
