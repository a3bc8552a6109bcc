"""AG-UI agents on loopback for Core's tests: a real Pydantic AI agent (its ``AGUIAdapter``,
a ``FunctionModel``: offline) and a scripted SSE server for the failures.

``python tests/core/aguikit.py`` serves the Pydantic AI agent on a free loopback port and
prints its URL (the Chromium test starts it so).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

import uvicorn
from corekit import config
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelRequest, ToolReturnPart, UserPromptPart
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel
from pydantic_ai.ui.ag_ui import AGUIAdapter
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from pedelec_pyodide import Session, define_tool

WAIT = 10.0
AGENT_PATH = "/agent"


# --- a page and a Core for the agent ----------------------------------------------------


def counter_session() -> tuple[Session, list[Any]]:
    """A page with ``update_counter``; the args of each run of it."""
    runs: list[Any] = []
    counter = {"value": 0}

    def update_counter(delta: int) -> dict[str, int]:
        """Add delta to the counter and return its new value."""
        runs.append({"delta": delta})
        counter["value"] += delta
        return {"value": counter["value"]}

    return Session([define_tool(update_counter)]), runs


def ag_ui(url: str, **options: Any) -> Any:
    return config(agent=f"ag-ui:{url}", agent_factory=None, **options)


# --- the Pydantic AI agent ---------------------------------------------------------------


def _prompt(messages: list[ModelMessage]) -> str:
    for message in reversed(messages):
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, UserPromptPart) and isinstance(part.content, str):
                    return part.content
    return ""


async def _counter_model(messages: list[ModelMessage], info: AgentInfo
                         ) -> AsyncIterator[str | DeltaToolCalls]:
    """The user writes ``TOOL {JSON args}``: the model calls that frontend tool with those
    args, then answers from the result it gets back. Anything else is echoed."""
    last = messages[-1]
    returned = ([part for part in last.parts if isinstance(part, ToolReturnPart)]
                if isinstance(last, ModelRequest) else [])
    if returned:
        result = returned[-1]
        verdict = "failed" if result.outcome == "failed" else "answered"
        yield f"The tool {verdict}: {json.dumps(result.content, sort_keys=True)}"
        return
    name, _, args = _prompt(messages).partition(" ")
    if name not in {tool.name for tool in info.function_tools}:
        yield f"You said: {name} {args}".strip()
        return
    yield f"Calling {name}. "
    yield {0: DeltaToolCall(name=name, json_args=args or "{}",
                            tool_call_id=f"call_{uuid.uuid4().hex[:8]}")}


def counter_agent() -> Agent[None, str]:
    return Agent(FunctionModel(stream_function=_counter_model))


def pydantic_app(requests: list[dict[str, Any]] | None = None) -> Starlette:
    """The agent at :data:`AGENT_PATH`, through Pydantic AI's own AG-UI adapter; the body
    of every request is appended to ``requests``."""
    agent = counter_agent()

    async def run(request: Request) -> Response:
        if requests is not None:
            requests.append(json.loads(await request.body()))
        return await AGUIAdapter.dispatch_request(request, agent=agent)

    return Starlette(routes=[Route(AGENT_PATH, run, methods=["POST"])])


@contextlib.asynccontextmanager
async def serving(app: Any) -> AsyncIterator[str]:
    """``app`` under uvicorn on a free loopback port, in this loop; yields its base URL."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                           lifespan="off"))
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, WAIT)


# --- a scripted AG-UI agent ------------------------------------------------------------------


def sse(event: dict[str, Any] | str | bytes) -> bytes:
    """One server-sent event carrying ``event`` (a dict: as JSON)."""
    data = event if isinstance(event, bytes) else (
        event if isinstance(event, str) else json.dumps(event)).encode()
    return b"data: " + data + b"\n\n"


def text_run(text: str) -> list[bytes]:
    """A run that says ``text`` and finishes."""
    return [sse({"type": "RUN_STARTED", "threadId": "t", "runId": "r"}),
            sse({"type": "TEXT_MESSAGE_START", "messageId": "m", "role": "assistant"}),
            sse({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": text}),
            sse({"type": "TEXT_MESSAGE_END", "messageId": "m"}),
            sse({"type": "RUN_FINISHED", "threadId": "t", "runId": "r"})]


def started() -> bytes:
    return sse({"type": "RUN_STARTED", "threadId": "t", "runId": "r"})


def call_run(tool: str, args: str, call_id: str = "call-1") -> list[bytes]:
    """A run that calls ``tool`` with ``args`` (JSON text, in two pieces) and finishes."""
    return [sse({"type": "RUN_STARTED", "threadId": "t", "runId": "r"}),
            sse({"type": "TOOL_CALL_START", "toolCallId": call_id, "toolCallName": tool}),
            sse({"type": "TOOL_CALL_ARGS", "toolCallId": call_id, "delta": args[:3]}),
            sse({"type": "TOOL_CALL_ARGS", "toolCallId": call_id, "delta": args[3:]}),
            sse({"type": "TOOL_CALL_END", "toolCallId": call_id}),
            sse({"type": "RUN_FINISHED", "threadId": "t", "runId": "r"})]


Ending = Literal["close", "break", "hang", "hold"]


@dataclass
class Script:
    """One answer: a status, a content type, body pieces (chunked), then how it ends:
    ``close`` (the last chunk, then closed), ``break`` (closed in the middle of a chunk),
    ``hang`` (open, silent, until the server stops), ``hold`` (open, silent, until the
    client closes the connection: :attr:`ScriptedAgent.holding`, then
    :attr:`ScriptedAgent.let_go`)."""

    pieces: list[bytes]
    end: Ending = "close"
    status: int = 200
    content_type: str = "text/event-stream"
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class ScriptedAgent:
    """A loopback HTTP server answering the n-th request with the n-th script; records each
    request's headers (lower-case names) and JSON body."""

    scripts: list[Script]
    requests: list[dict[str, Any]] = field(default_factory=list)
    server: asyncio.Server | None = None
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    #: set once a ``hold`` script's pieces are sent; ``let_go`` once its client closed
    holding: asyncio.Event = field(default_factory=asyncio.Event)
    let_go: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}{AGENT_PATH}"

    async def __aenter__(self) -> ScriptedAgent:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.stopping.set()
        assert self.server is not None
        self.server.close()
        await asyncio.wait_for(self.server.wait_closed(), WAIT)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            headers = {name.strip().lower(): value.strip() for name, _, value in
                       (line.partition(":") for line in head[1:] if line)}
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            index = len(self.requests)
            self.requests.append({"headers": headers, "body": json.loads(body)})
            script = (self.scripts[index] if index < len(self.scripts)
                      else Script([b"no more scripts"], status=500, content_type="text/plain"))
            extra = "".join(f"{name}: {value}\r\n" for name, value in script.headers.items())
            writer.write(f"HTTP/1.1 {script.status} X\r\nContent-Type: {script.content_type}"
                         f"\r\n{extra}Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                         .encode())
            for piece in script.pieces:
                writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                await writer.drain()
            if script.end == "close":
                writer.write(b"0\r\n\r\n")
            elif script.end == "break":
                writer.write(b"10\r\nonly part")
            elif script.end == "hold":
                await writer.drain()
                self.holding.set()
                await reader.read()  # until the client closes the connection
                self.let_go.set()
            else:
                await writer.drain()
                await self.stopping.wait()
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


def main() -> None:
    """Serve the Pydantic AI agent on a free loopback port; print its URL; run until
    stopped (SIGTERM)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()  # a turn that comes before uvicorn serves waits in the backlog
        config = uvicorn.Config(pydantic_app(), log_level="warning", lifespan="off")
        server = uvicorn.Server(config)
        port = sock.getsockname()[1]
        print(f"http://127.0.0.1:{port}{AGENT_PATH}", flush=True)
        server.run(sockets=[sock])


if __name__ == "__main__":
    sys.exit(main())
