"""Results a page sent before its socket closed are handled (issue 22), step by step.

Two orderings lost them, each made to happen here on purpose (``test_ws_frames.py`` runs
pages that answer and close at once, many times, against a Core process):

- the send side fails first (the page is gone) while results still wait to be read: the
  bridge's loop stopped reading on ``not page.open``;
- a write meets the page's reset before Core has read what the page sent: asyncio drops
  the socket and never reads what its kernel still holds (the WebSocket protocol now
  reads it before the disconnect, ``ws_limits.py``).
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import socket
import struct
import termios
import threading
import time
from collections.abc import MutableMapping
from typing import Any

import pytest
from corekit import WAIT, config, run, running_core, tool_meta
from starlette.websockets import WebSocket
from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.protocol import State
from websockets.uri import parse_uri

from pedelec_pyodide.core.agents import OfflineAgent
from pedelec_pyodide.core.cluster import Node
from pedelec_pyodide.core.page.bridge import BridgeConnection
from pedelec_pyodide.core.page.ws_limits import BoundedWebSocket
from pedelec_pyodide.core.sessions import Registry
from pedelec_pyodide.core.sessions.turns import restore
from pedelec_pyodide.core.store import open_store

CALLS = 3


class ScriptedSocket:
    """The ASGI side of a WebSocket, scripted: what the page sends is put in ``inbox``;
    once ``gone``, every send fails as it does for a page that has left."""

    def __init__(self) -> None:
        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.sent: list[MutableMapping[str, Any]] = []
        self.gone = False

    async def receive(self) -> dict[str, Any]:
        return await self.inbox.get()

    async def send(self, message: MutableMapping[str, Any]) -> None:
        if self.gone and message["type"] == "websocket.send":
            raise OSError("the page is gone")
        self.sent.append(message)

    def texts(self, kind: str) -> list[dict[str, Any]]:
        frames = (json.loads(m["text"]) for m in self.sent if m["type"] == "websocket.send")
        return [f for f in frames if f["type"] == kind]

    def page_sends(self, frame: dict[str, Any]) -> None:
        self.inbox.put_nowait({"type": "websocket.receive", "text": json.dumps(frame)})


async def until(condition: Any) -> None:
    for _ in range(int(WAIT / 0.005)):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("waited in vain")


def test_results_queued_when_a_send_fails_are_still_handled() -> None:
    async def main() -> None:
        cfg = config(agent_factory=OfflineAgent)
        registry = Registry(cfg, open_store("memory"), OfflineAgent, restore)
        ws = ScriptedSocket()
        ws.inbox.put_nowait({"type": "websocket.connect"})
        scope = {"type": "websocket", "path": "/pedelec/v1/bridge", "headers": [],
                 "query_string": b""}
        bridge = BridgeConnection(WebSocket(scope, ws.receive, ws.send), Node(registry))
        serving = asyncio.create_task(bridge.serve(frozenset()))
        try:
            ws.page_sends({"type": "hello", "protocol": 1, "tools": [tool_meta("t")]})
            await until(lambda: ws.texts("welcome"))
            session = registry.get(ws.texts("welcome")[0]["sessionId"])
            assert session is not None
            calls = [asyncio.create_task(session.call_tool("t", {"n": n}))
                     for n in range(CALLS)]
            await until(lambda: len(ws.texts("tool.request")) == CALLS)
            # the page answers and leaves; Core sends once more before reading the answers
            ws.gone = True
            extra = asyncio.create_task(session.call_tool("t", {"n": CALLS}))
            await until(lambda: not bridge.page.open)
            for request in ws.texts("tool.request"):
                ws.page_sends({"type": "tool.result", "toolRequestId": request["toolRequestId"],
                               "result": request["args"]["n"], "handledBy": "named"})
            ws.inbox.put_nowait({"type": "websocket.disconnect", "code": 1001})
            await asyncio.wait_for(serving, WAIT)
            done, _ = await asyncio.wait(calls, timeout=WAIT)
            assert len(done) == CALLS, "results the page sent before it left were dropped"
            assert sorted(call.result()[1] for call in calls) == list(range(CALLS))
            extra.cancel()
        finally:
            serving.cancel()
            await registry.shutdown()

    run(main())


class BlockingPage:
    """A page on a plain blocking socket, in a thread: it can send its results and reset
    the connection while Core's event loop is held still."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.protocol = ClientProtocol(parse_uri(f"ws://127.0.0.1:{port}/pedelec/v1/bridge"))
        self.protocol.send_request(self.protocol.connect())
        self.sock.sendall(b"".join(self.protocol.data_to_send()))
        self.texts: list[dict[str, Any]] = []
        while self.protocol.state is not State.OPEN:  # the handshake's answer
            data = self.sock.recv(65536)
            assert data, "Core closed the socket in the handshake"
            self.protocol.receive_data(data)
            self.protocol.events_received()

    def read_until(self, count: int) -> None:
        """Read until ``count`` text messages have come."""
        while len(self.texts) < count:
            data = self.sock.recv(65536)
            assert data, "Core closed the socket"
            self.protocol.receive_data(data)
            self.texts += [json.loads(bytes(e.data)) for e in self.protocol.events_received()
                           if isinstance(e, Frame) and e.opcode is Opcode.TEXT]

    def send(self, frame: dict[str, Any]) -> None:
        self.protocol.send_text(json.dumps(frame).encode())
        self.sock.sendall(b"".join(self.protocol.data_to_send()))

    def reset(self) -> None:
        """Reset the connection once Core's kernel has acknowledged all this page sent
        (a reset drops what is still unsent)."""
        for _ in range(int(WAIT / 0.001)):
            unsent = fcntl.ioctl(self.sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
            if not struct.unpack("i", unsent)[0]:
                break
            time.sleep(0.001)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()


def test_what_a_reset_page_sent_before_it_is_read_before_the_disconnect() -> None:
    async def main() -> None:
        async with running_core() as core:
            page = await asyncio.to_thread(BlockingPage, core.port)
            page.send({"type": "hello", "protocol": 1, "tools": [tool_meta("t")]})
            await asyncio.to_thread(page.read_until, 1)
            sid = page.texts[0]["sessionId"]
            calls = [asyncio.create_task(core.tool_call(sid, "t", {"n": n}))
                     for n in range(CALLS)]
            await asyncio.to_thread(page.read_until, 1 + CALLS)
            session = core.registry.get(sid)

            def answer_and_reset() -> None:
                for request in page.texts[1:]:
                    page.send({"type": "tool.result", "toolRequestId": request["toolRequestId"],
                               "result": request["args"]["n"], "handledBy": "named"})
                page.reset()

            # Core's loop held still: the results and the reset are in its kernel before
            # it runs again, and the first thing it does then is write to the page
            worker = threading.Thread(target=answer_and_reset)
            worker.start()
            worker.join(WAIT)
            session.send(json.dumps({"type": "tool.cancel", "toolRequestId": "x",
                                     "reason": "Core writes before it reads"}))
            answers = await asyncio.wait_for(asyncio.gather(*calls), WAIT)
            assert sorted(a.json()["result"] for a in answers) == list(range(CALLS)), [
                a.text for a in answers]

    run(main())


def test_a_reset_page_is_disconnected_even_if_reading_what_it_left_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Should handling the frames a reset page left ever raise, the app still hears of the
    disconnect: the session waits for a resume, its bridge loop does not hang."""

    def fails(self: BoundedWebSocket) -> None:
        raise RuntimeError("a frame the page left could not be handled")

    monkeypatch.setattr(BoundedWebSocket, "_read_what_is_left", fails)

    async def main() -> None:
        async with running_core() as core:
            page = await asyncio.to_thread(BlockingPage, core.port)
            page.send({"type": "hello", "protocol": 1, "tools": [tool_meta("t")]})
            await asyncio.to_thread(page.read_until, 1)
            session = core.registry.get(page.texts[0]["sessionId"])
            call = asyncio.create_task(core.tool_call(session.id, "t", {"n": 1}))
            await asyncio.to_thread(page.read_until, 2)
            await asyncio.to_thread(page.reset)
            session.send(json.dumps({"type": "tool.cancel", "toolRequestId": "x",
                                     "reason": "a write that meets the reset"}))
            for _ in range(int(WAIT / 0.01)):
                if session.connection is None:
                    break
                await asyncio.sleep(0.01)
            assert session.connection is None, "the disconnect never reached the session"
            call.cancel()

    run(main())
