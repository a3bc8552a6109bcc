"""The least a Core in Python on ASGI can do for the paths ``bench/core_paths.py`` times.

A Starlette app on uvicorn, with the server stack Core runs on (``httptools`` for HTTP,
websockets' sans-I/O protocol for the WebSocket, no permessage-deflate) and none of
Core's work: no token, no ``Host`` check, no limits, no checks of what it reads, no
store, no deadlines, no agent. It serves, on Core's routes:

* ``GET /pedelec/v1/health``: a small JSON answer;
* ``/pedelec/v1/bridge``: one page's WebSocket (a ``hello`` answered with a
  ``welcome``; each ``tool.result`` resolves the call waiting for it);
* ``POST /pedelec/v1/sessions/{id}/tool-calls``: a ``tool.request`` to the page, its
  result as the answer;
* ``POST /pedelec/v1/sessions/{id}/turns``: each ``/call`` line of the text sent to the
  page in turn, each result awaited: an agent's steps, with no agent.

With ``--redis URL`` it is one node of several on that Redis (``bench/cluster_route.py``
measures a call crossing them), as bare: a page's session is written to a hash at its
``hello``; a call to a session whose page is on another node is published to that node's
channel (its holder read from the hash once, then remembered), which runs it and
publishes the result to the caller's node. No seal, no checks, no leases, redis-py's
client as it comes.

Not a server for anything but that measurement. Run: ``python bench/bare_core.py
[--redis URL]`` (prints ``serving: http://127.0.0.1:PORT`` as ``pedelec serve`` does;
Ctrl-C stops it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
from collections.abc import AsyncIterator
from typing import Any

import redis.asyncio as redis
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

_pages: dict[str, WebSocket] = {}
_waiting: dict[str, asyncio.Future[object]] = {}


class _Cluster:
    """This node's part in a cluster on Redis (``--redis``)."""

    def __init__(self, url: str) -> None:
        self.redis = redis.from_url(url, decode_responses=True)
        self.node = os.urandom(8).hex()
        self.holders: dict[str, str] = {}  # session id -> its page's node
        self.replies: dict[str, asyncio.Future[object]] = {}
        self.running: set[asyncio.Task[None]] = set()  # calls run for other nodes

    async def call(self, session_id: str, tool: str, args: object) -> object:
        holder = self.holders.get(session_id)
        if holder is None:
            found = await self.redis.hget("bare:sessions", session_id)
            assert isinstance(found, str), "no such session"
            holder = self.holders[session_id] = found
        call_id = os.urandom(16).hex()
        reply = self.replies[call_id] = asyncio.get_running_loop().create_future()
        await self.redis.publish(f"bare:{holder}", json.dumps({
            "from": self.node, "id": call_id, "session": session_id, "tool": tool,
            "args": args}))
        return await reply

    async def serve(self) -> None:
        """This node's channel: calls to run for other nodes, and their replies."""
        async with self.redis.pubsub() as channel:
            await channel.subscribe(f"bare:{self.node}")
            async for message in channel.listen():
                if message["type"] != "message":
                    continue
                data = json.loads(message["data"])
                if "result" in data:
                    self.replies.pop(data["id"]).set_result(data["result"])
                else:
                    task = asyncio.ensure_future(self._run(data))
                    self.running.add(task)
                    task.add_done_callback(self.running.discard)

    async def _run(self, call: dict[str, Any]) -> None:
        result = await _call(_pages[call["session"]], call["tool"], call["args"])
        await self.redis.publish(f"bare:{call['from']}",
                                 json.dumps({"id": call["id"], "result": result}))


_cluster: _Cluster | None = None


async def health(request: Request) -> JSONResponse:
    return JSONResponse({"status": "ok"})


async def bridge(websocket: WebSocket) -> None:
    await websocket.accept()
    session_id = os.urandom(16).hex()
    _pages[session_id] = websocket
    if _cluster is not None:
        await _cluster.redis.hset("bare:sessions", session_id, _cluster.node)
    try:
        while True:
            frame = json.loads(await websocket.receive_text())
            if frame["type"] == "tool.result":
                _waiting.pop(frame["toolRequestId"]).set_result(frame["result"])
            elif frame["type"] == "hello":
                await websocket.send_text(json.dumps({"type": "welcome",
                                                      "sessionId": session_id}))
    except Exception:  # the page went away
        _pages.pop(session_id, None)


async def _call(page: WebSocket, tool: str, args: object) -> object:
    request_id = os.urandom(16).hex()
    result = _waiting[request_id] = asyncio.get_running_loop().create_future()
    await page.send_text(json.dumps({"type": "tool.request", "toolRequestId": request_id,
                                     "tool": tool, "args": args}, separators=(",", ":")))
    return await result


async def tool_call(request: Request) -> JSONResponse:
    body = await request.json()
    session_id = request.path_params["session_id"]
    page = _pages.get(session_id)
    if page is None and _cluster is not None:
        return JSONResponse({"result": await _cluster.call(session_id, body["tool"],
                                                           body["args"])})
    assert page is not None, "no such session"
    return JSONResponse({"result": await _call(page, body["tool"], body["args"])})


async def turn(request: Request) -> JSONResponse:
    body = await request.json()
    page = _pages[request.path_params["session_id"]]
    calls = []
    for line in body["text"].splitlines():
        _, tool, args = line.split(" ", 2)
        calls.append({"tool": tool, "result": await _call(page, tool, json.loads(args))})
    return JSONResponse({"status": "completed", "toolCalls": calls})


@contextlib.asynccontextmanager
async def _lifespan(app: Starlette) -> AsyncIterator[None]:
    serving = asyncio.ensure_future(_cluster.serve()) if _cluster is not None else None
    yield
    if serving is not None:
        serving.cancel()


app = Starlette(lifespan=_lifespan, routes=[
    Route("/pedelec/v1/health", health),
    WebSocketRoute("/pedelec/v1/bridge", bridge),
    Route("/pedelec/v1/sessions/{session_id}/tool-calls", tool_call, methods=["POST"]),
    Route("/pedelec/v1/sessions/{session_id}/turns", turn, methods=["POST"]),
])


def main() -> None:
    global _cluster
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis", metavar="URL", help="a node of a cluster on this Redis")
    redis_url = parser.parse_args().redis
    if redis_url is not None:
        _cluster = _Cluster(redis_url)
    # IPPROTO_TCP, as Core's: asyncio sets TCP_NODELAY only on sockets that say so
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)  # connections wait in the backlog until uvicorn takes them
    print(f"serving: http://127.0.0.1:{listener.getsockname()[1]}", flush=True)
    config = uvicorn.Config(app, log_level="warning", access_log=False, http="httptools",
                            ws="websockets-sansio", ws_per_message_deflate=False,
                            lifespan="on")
    uvicorn.Server(config).run(sockets=[listener])


if __name__ == "__main__":
    main()
