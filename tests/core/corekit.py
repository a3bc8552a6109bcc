"""Test kit for Core: a real uvicorn server on a loopback port, pages that talk to it.

``Page`` is a real :class:`pedelec_pyodide.Session` wired to a WebSocket by a tiny adapter,
so the page side of every test is the runtime's own code. ``RawClient`` speaks the wire
protocol by hand for the bad-input tests. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import uvicorn
import websockets
from clockkit import FakeClock

from pedelec_pyodide import Session, define_tool
from pedelec_pyodide.core.agents.contract import ToolCallRequest, Turn
from pedelec_pyodide.core.config import CoreConfig
from pedelec_pyodide.core.server import create_app, uvicorn_config

WAIT = 10.0  # seconds: the bound on any single wait in these tests
TOKEN = "test-admin-token"
#: every test Core's --cluster-secret (a store of one process ignores it)
HERE = Path(__file__).resolve().parent

CLUSTER_SECRET = "test-cluster-secret-of-32-characters"


def fake_clock() -> FakeClock:
    """Core's clock (``config(clock=fake_clock())``), moved only by ``await
    clock.advance(seconds)``: a test moves time past a deadline instead of sleeping until
    it, so a stalled machine neither fails the test nor lets it pass untested. It starts
    at the wall clock's time (deadlines are wall-clock, like the records Core stores); its
    timers run on the test's loop (Core's, in-process)."""
    return FakeClock()


def run(coro: Coroutine[Any, Any, Any], timeout: float = 60.0) -> Any:
    """Run one test's coroutine with an overall bound."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


def config(**overrides: Any) -> CoreConfig:
    options: dict[str, Any] = {
        "port": 0, "admin_token": TOKEN, "web_dir": None, "agent_factory": EchoAgent,
        "cluster_secret": CLUSTER_SECRET,
    }
    options.update(overrides)
    return CoreConfig(**options)


@dataclass
class Core:
    server: uvicorn.Server
    task: asyncio.Task[None]
    port: int
    http: httpx.AsyncClient
    app: Any

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/pedelec/v1/bridge"

    @property
    def registry(self) -> Any:
        return self.app.state.registry

    @property
    def node(self) -> Any:
        """Its :class:`~pedelec_pyodide.core.cluster.Node`: inbox, asks, leases."""
        return self.app.state.node

    async def stop(self) -> None:
        self.server.should_exit = True
        await asyncio.wait_for(self.task, WAIT)
        await self.http.aclose()

    async def tool_call(self, session_id: str, tool: str, args: Any = None,
                        **extra: Any) -> httpx.Response:
        body = {"tool": tool, "args": {} if args is None else args, **extra}
        return await self.http.post(f"/pedelec/v1/sessions/{session_id}/tool-calls", json=body)

    async def turn(self, session_id: str, text: str) -> httpx.Response:
        return await self.http.post(f"/pedelec/v1/sessions/{session_id}/turns",
                                    json={"text": text})

    async def session_info(self, session_id: str) -> dict[str, Any]:
        response = await self.http.get(f"/pedelec/v1/sessions/{session_id}")
        assert response.status_code == 200, response.text
        info: dict[str, Any] = response.json()
        return info


@contextlib.asynccontextmanager
async def running_core(cfg: CoreConfig | None = None, port: int = 0) -> AsyncIterator[Core]:
    core = await start_core(cfg or config(), port)
    try:
        yield core
    finally:
        if not core.task.done():
            await core.stop()


async def start_core(cfg: CoreConfig, port: int = 0) -> Core:
    cfg.port = port
    app = create_app(cfg)
    server = uvicorn.Server(uvicorn_config(app, cfg))
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    task = asyncio.create_task(server.serve())
    for _ in range(int(WAIT / 0.01)):
        if server.started or task.done():
            break
        await asyncio.sleep(0.01)
    if task.done():
        task.result()
    assert server.started, "uvicorn did not start in time"
    bound = server.servers[0].sockets[0].getsockname()[1]
    http = httpx.AsyncClient(base_url=f"http://127.0.0.1:{bound}", timeout=WAIT,
                             headers={"Authorization": f"Bearer {cfg.admin_token}"})
    return Core(server, task, bound, http, app)


class Page:
    """A real Session as the page, over a websockets client connection."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.events: list[Any] = []
        self.frames_in: list[dict[str, Any]] = []
        self.frames_out: list[dict[str, Any]] = []
        self.ws: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._writer: asyncio.Task[None] | None = None
        self._outbox: asyncio.Queue[str] = asyncio.Queue()
        self._welcome: asyncio.Event = asyncio.Event()
        self._arrived = asyncio.Condition()
        session.subscribe(self.events.append)

    def send(self, frame: str) -> None:  # the Transport the Session uses
        self.frames_out.append(json.loads(frame))
        self._outbox.put_nowait(frame)

    async def connect(self, url: str) -> Page:
        self._welcome.clear()
        self.ws = await websockets.connect(url, open_timeout=WAIT)
        self._outbox = asyncio.Queue()
        self._writer = asyncio.create_task(self._write(self.ws, self._outbox))
        self._reader = asyncio.create_task(self._read(self.ws))
        self.session.connection_made(self)
        await asyncio.wait_for(self._welcome.wait(), WAIT)
        return self

    async def _write(self, ws: Any, outbox: asyncio.Queue[str]) -> None:
        with contextlib.suppress(websockets.ConnectionClosed):
            while True:
                await ws.send(await outbox.get())

    async def _read(self, ws: Any) -> None:
        with contextlib.suppress(websockets.ConnectionClosed):
            async for frame in ws:
                data = json.loads(frame)
                self.frames_in.append(data)
                self.session.receive(frame)
                if data["type"] == "welcome":
                    self._welcome.set()
                async with self._arrived:
                    self._arrived.notify_all()
        if self.ws is ws:
            self.session.connection_lost()

    async def drop(self) -> None:
        """The network goes away (no goodbye from the Session)."""
        ws = self.ws
        assert self._reader is not None and self._writer is not None
        self._writer.cancel()
        await ws.close()
        await asyncio.wait_for(self._reader, WAIT)
        self.ws = None

    def frames(self, kind: str) -> list[dict[str, Any]]:
        return [f for f in self.frames_in if f["type"] == kind]

    async def wait_frame(self, kind: str, count: int = 1,
                         where: Callable[[dict[str, Any]], bool] = lambda f: True) -> None:
        async def condition() -> None:
            async with self._arrived:
                await self._arrived.wait_for(
                    lambda: len([f for f in self.frames(kind) if where(f)]) >= count)

        await asyncio.wait_for(condition(), WAIT)


class RawClient:
    """Speaks the wire protocol by hand."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws

    @classmethod
    async def open(cls, url: str, **options: Any) -> RawClient:
        return cls(await websockets.connect(url, open_timeout=WAIT, **options))

    async def send(self, frame: dict[str, Any] | str) -> None:
        await self.ws.send(frame if isinstance(frame, str) else json.dumps(frame))

    async def recv(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(await asyncio.wait_for(self.ws.recv(), WAIT))
        return data

    async def hello(self, tools: list[dict[str, Any]] | None = None,
                    **extra: Any) -> dict[str, Any]:
        await self.send({"type": "hello", "protocol": 1, "tools": tools or [], **extra})
        return await self.recv()

    async def close(self) -> None:
        await self.ws.close()


def tool_meta(name: str, **annotations: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name, "description": f"the {name} tool",
        "argsSchema": {"type": "object"},
    }
    if annotations:
        meta["annotations"] = annotations
    return meta


@dataclass
class EchoAgent:
    """Calls nothing; replies with the text. The default agent of these tests."""

    async def run(self, turn: Turn) -> str:
        await turn.say("echo: ")
        return f"echo: {turn.text}"


@dataclass
class PlanAgent:
    """Runs a fixed plan: a list of steps, each a list of (tool, args); replies with the
    results as JSON."""

    plan: list[list[tuple[str, Any]]] = field(default_factory=list)

    async def run(self, turn: Turn) -> str:
        results = []
        for step in self.plan:
            outcomes = await turn.call_tools([ToolCallRequest(t, a) for t, a in step])
            results.extend(o.result for o in outcomes)
        return json.dumps(results, sort_keys=True)


async def until(predicate: Callable[[], bool], what: str = "condition",
                seconds: float = WAIT) -> None:
    """Wait (at most ``seconds``) for a condition observable only by polling server
    state."""
    async def loop() -> None:
        while not predicate():
            await asyncio.sleep(0.005)

    try:
        await asyncio.wait_for(loop(), seconds)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


@contextlib.asynccontextmanager
async def core_process(db: Path | str, port: int) -> AsyncIterator[subprocess.Popen[str]]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), *sys.path]))
    process = subprocess.Popen(
        [sys.executable, str(HERE / "core_process.py"), str(db), str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        assert process.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(process.stdout.readline), WAIT)
        assert line.startswith("http://127.0.0.1:"), line
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        await asyncio.to_thread(process.wait, WAIT)


async def page_with(core: Core, *names: str) -> tuple[RawClient, dict[str, Any]]:
    client = await RawClient.open(core.ws_url)
    welcome = await client.hello([tool_meta(name) for name in names or ("slow",)])
    assert welcome["type"] == "welcome"
    return client, welcome


async def next_of(client: RawClient, kind: str) -> dict[str, Any]:
    """The next frame of ``kind`` (others skipped), within WAIT."""
    async def find() -> dict[str, Any]:
        while True:
            frame = await client.recv()
            if frame["type"] == kind:
                return frame

    result: dict[str, Any] = await asyncio.wait_for(find(), WAIT)
    return result


async def progress(client: RawClient, request_id: str, value: float, **extra: Any) -> None:
    await client.send({"type": "tool.progress", "toolRequestId": request_id,
                       "progress": value, **extra})


async def result(client: RawClient, request_id: str, value: Any) -> None:
    await client.send({"type": "tool.result", "toolRequestId": request_id,
                       "result": value, "handledBy": "named"})


def status_of(core: Core, session_id: str, request_id: str) -> str | None:
    """The request's status in Core, None once it is resolved."""
    pending = core.registry.get(session_id).pending.get(request_id)
    return None if pending is None else str(pending.status)


async def hang_up(port: int, path: str, body: dict[str, Any], headers: dict[str, str],
                  sent: Any) -> None:
    """POST ``body`` on a raw socket, wait for ``sent()`` (the page got the request), then
    close the socket without reading the answer: a caller that hangs up."""
    data = json.dumps(body).encode()
    lines = [f"POST {path} HTTP/1.1", f"Host: 127.0.0.1:{port}",
             f"Authorization: Bearer {TOKEN}", "Content-Type: application/json",
             f"Content-Length: {len(data)}", *(f"{k}: {v}" for k, v in headers.items())]
    _reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write("\r\n".join(lines).encode() + b"\r\n\r\n" + data)
        await writer.drain()
        await sent()
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def http_handlers_done(core: Core, baseline: int) -> None:
    """Wait until Core's HTTP handlers have returned (the page's WebSocket is ``baseline``)."""
    state = core.server.server_state
    await until(lambda: len(state.tasks) <= baseline, "the hung-up call's handler to return")


class GatedTools:
    """Tools whose handlers wait for the test to open their gate; counts every run."""

    def __init__(self, *names: str) -> None:
        self.gates = {name: asyncio.Event() for name in names}
        self.started = {name: asyncio.Event() for name in names}
        self.runs: Counter[str] = Counter()

    def tools(self) -> list[Any]:
        return [self._tool(name) for name in self.gates]

    def _tool(self, name: str) -> Any:
        async def handler(args: Any) -> Any:
            self.runs[name] += 1
            self.started[name].set()
            await self.gates[name].wait()
            return {"tool": name, "args": args}

        return define_tool(name=name, description=f"gated {name}",
                           args_schema={"type": "object"}, handler=handler)


def echo_session() -> Session:
    session = Session()
    session.add_tool(define_tool(name="echo", description="Echo the args.",
                                 args_schema={"type": "object"}, handler=lambda a: a))
    return session


def echo_page() -> Page:
    session = Session()
    session.add_tool(define_tool(name="echo", description="Echo the args.",
                                 args_schema={"type": "object"}, handler=lambda a: a))
    return Page(session)
