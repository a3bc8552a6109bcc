"""Simulated pages and a Core of its own, shared by the Core benchmarks (core_scale, load).

A simulated page is a websockets client that says hello with two tools and answers every
``tool.request`` at once, echoing its args; Core runs as ``pedelec serve`` in a process
of its own, so its RSS is its own; calls go through the control API over raw HTTP/1.1
keep-alive connections (an HTTP client library would dominate the figures).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import websockets

TOOLS = [
    {"name": "get_current_page", "description": "title and URL",
     "argsSchema": {"type": "object", "properties": {}}},
    {"name": "update_counter", "description": "adds delta to the counter",
     "argsSchema": {"type": "object", "properties": {"delta": {"type": "integer"}},
                    "required": ["delta"]}},
]


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def core_process(token: str, *options: str, source: str | None = None
                 ) -> contextlib.AbstractContextManager[tuple[subprocess.Popen[str], int]]:
    """``pedelec serve`` on a free loopback port: ``(process, port)``; stopped on exit.
    ``source``: a checkout whose ``pedelec_pyodide`` to run (another commit's, side by
    side with this one's), instead of the installed one."""
    env = dict(os.environ, PEDELEC_ADMIN_TOKEN=token)
    if source is not None:
        env["PYTHONPATH"] = source
    return server_process([sys.executable, "-m", "pedelec_pyodide.core.cli", "serve",
                           "--port", "0", "--no-provision", "--quiet", *options],
                          env=env, cwd=source)


@contextlib.contextmanager
def server_process(command: list[str], *, env: dict[str, str] | None = None,
                   cwd: str | None = None) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """A server that prints ``...: URL`` first, as ``pedelec serve`` does: ``(process,
    port)``; stopped on exit."""
    server = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env, cwd=cwd)
    try:
        assert server.stdout is not None
        url = server.stdout.readline().split(": ", 1)[1].strip()
        yield server, int(url.rstrip("/").rsplit(":", 1)[1])
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)


class SimPage:
    """A page that answers every tool request at once, echoing its args."""

    def __init__(self) -> None:
        self.ws: Any = None
        self.session_id = ""
        self.task: asyncio.Task[None] | None = None
        self.answered = 0

    async def open(self, url: str) -> None:
        self.ws = await websockets.connect(url, max_queue=16, open_timeout=30)
        await self.ws.send(json.dumps({"type": "hello", "protocol": 1, "tools": TOOLS}))
        self.session_id = json.loads(await asyncio.wait_for(self.ws.recv(), 30))["sessionId"]
        self.task = asyncio.create_task(self._answer())

    async def _answer(self) -> None:
        with contextlib.suppress(websockets.ConnectionClosed):
            async for frame in self.ws:
                request = json.loads(frame)
                if request["type"] == "tool.request":
                    self.answered += 1
                    await self.ws.send(json.dumps({
                        "type": "tool.result", "toolRequestId": request["toolRequestId"],
                        "result": {"echo": request["args"]}, "handledBy": "named"}))

    async def close(self) -> None:
        await self.ws.close()
        if self.task is not None:
            await asyncio.wait_for(self.task, 10)


async def open_pages(ws_url: str, count: int) -> list[SimPage]:
    """``count`` connected pages, opened 100 at a time."""
    pages: list[SimPage] = []
    for batch in range(0, count, 100):
        group = [SimPage() for _ in range(min(100, count - batch))]
        await asyncio.gather(*(page.open(ws_url) for page in group))
        pages.extend(group)
    return pages


async def post_tool_call(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                         token: str, session_id: str, tool: str, args: Any,
                         timeout: float = 30) -> tuple[int, Any]:
    """One control-API tool call on a keep-alive connection: ``(HTTP status, answer)``."""
    body = json.dumps({"tool": tool, "args": args}).encode()
    writer.write(
        f"POST /pedelec/v1/sessions/{session_id}/tool-calls HTTP/1.1\r\n"
        f"Host: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        .encode() + body)
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    answer = json.loads(await asyncio.wait_for(reader.readexactly(length), timeout))
    return int(head.split(b" ", 2)[1]), answer
