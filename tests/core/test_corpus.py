"""The bad-input corpus (tests/corpus/*.jsonl) against a real Core on loopback.

One Core serves the whole module (its event loop runs in a thread); each case is one
pytest item. After every case the runner proves that nothing broke and nothing was lost:
requests that were pending while the bad input arrived (in the session that sent it, and
in another session) resolve exactly once with the page's answer, a second answer is a
``DUPLICATE_RESULT``, a fresh tool call round-trips, and nothing is left pending.

Families run here: ``frames`` (raw WebSocket), ``args`` and ``results`` (a real
:class:`pedelec_pyodide.Session` as the page, with the demo's own tools), ``control``
(HTTP). ``page-results`` runs in Chromium: tests/e2e/corpus-results.spec.js.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import datetime
import decimal
import enum
import fractions
import json
import math
import pathlib
import sys
import threading
import types
import uuid
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest
import tools as demo_tools  # web/demo/tools.py (pyproject's pythonpath)
import websockets
from corekit import WAIT, Core, Page, RawClient, config, start_core, tool_meta

from pedelec_pyodide import Session, define_tool

CORPUS = Path(__file__).parent.parent / "corpus"
MAX_FRAME = 65_536  # Core's frame limit in this module (the corpus' sizes assume it)
MAX_METADATA = 16_384  # and its limit on a session's metadata


def load(family: str) -> list[dict[str, Any]]:
    path = CORPUS / f"{family}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def cases(family: str) -> list[Any]:
    return [pytest.param(c, id=c["id"]) for c in load(family)]


# --- one Core for the module, on a loop in a thread -------------------------------------


class CoreThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.core: Core = self.call(start_core(config(max_frame_bytes=MAX_FRAME,
                                                      max_metadata_bytes=MAX_METADATA)))

    def call(self, coro: Coroutine[Any, Any, Any], timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(
            asyncio.wait_for(coro, timeout), self.loop).result(timeout + 5)

    def stop(self) -> None:
        try:
            self.call(self.core.stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(WAIT)
            self.loop.close()


@pytest.fixture(scope="module")
def core() -> Iterator[CoreThread]:
    thread = CoreThread()
    try:
        yield thread
    finally:
        thread.stop()


# --- raw-protocol helpers -----------------------------------------------------------------


async def recv_until(client: RawClient, kind: str, limit: int = 8) -> dict[str, Any]:
    """The next frame of type ``kind`` (bounded: others before it are skipped)."""
    for _ in range(limit):
        frame = await client.recv()
        if frame["type"] == kind:
            return frame
    raise AssertionError(f"no {kind} frame within {limit} frames")


async def answer(client: RawClient, request_id: str, result: Any) -> None:
    await client.send({"type": "tool.result", "toolRequestId": request_id,
                       "result": result, "handledBy": "named"})


class RawSession:
    """A raw client with a session, one answered request and one still pending."""

    def __init__(self, core: Core, client: RawClient, welcome: dict[str, Any]) -> None:
        self.core = core
        self.client = client
        self.id: str = welcome["sessionId"]
        self.token: str = welcome["resumeToken"]
        self.done = ""
        self.pending = ""
        self.call: asyncio.Task[Any] | None = None

    @classmethod
    async def open(cls, core: Core, with_requests: bool = True) -> RawSession:
        client = await RawClient.open(core.ws_url)
        session = cls(core, client, await client.hello([tool_meta("t")]))
        if with_requests:
            session.done = await session.round_trip("done")
            session.call, session.pending = await session.start_call()
        return session

    async def start_call(self, **extra: Any) -> tuple[asyncio.Task[Any], str]:
        call = asyncio.create_task(self.core.tool_call(self.id, "t", {"n": 1}, **extra))
        request = await recv_until(self.client, "tool.request")
        return call, request["toolRequestId"]

    async def round_trip(self, value: Any) -> str:
        call, request_id = await self.start_call()
        await answer(self.client, request_id, value)
        body = (await asyncio.wait_for(call, WAIT)).json()
        assert body == {"toolRequestId": request_id, "result": value, "handledBy": "named"}
        return request_id

    async def finish(self, value: Any) -> None:
        """Answer the pending request: resolved once, with this value; a replay is refused."""
        assert self.call is not None
        await answer(self.client, self.pending, value)
        body = (await asyncio.wait_for(self.call, WAIT)).json()
        assert body == {"toolRequestId": self.pending, "result": value, "handledBy": "named"}
        await answer(self.client, self.pending, "again")
        replay = await recv_until(self.client, "error")
        assert replay["code"] == "DUPLICATE_RESULT", replay
        await self.round_trip({"after": value})
        live = self.core.registry.get(self.id)
        assert live is not None and not live.pending and live.state == "idle"


def expand(value: Any, names: dict[str, str]) -> Any:
    if isinstance(value, str):
        return names.get(value, value)
    if isinstance(value, list):
        return [expand(v, names) for v in value]
    if isinstance(value, dict):
        return {expand(k, names): expand(v, names) for k, v in value.items()}
    return value


def frame_payload(inp: dict[str, Any], names: dict[str, str]) -> str | bytes:
    """The frame a case sends: literal text, bytes, JSON, or one of the ``make`` forms."""
    if "text" in inp:
        text: str = inp["text"]
        for name, value in names.items():
            text = text.replace(name, value)
        return text
    if "bytes_hex" in inp:
        return bytes.fromhex(inp["bytes_hex"])
    if "json" in inp:
        return json.dumps(expand(inp["json"], names))
    make = inp["make"]
    if make == "nested":
        depth, open_ = inp["depth"], inp["open"]
        inner = "[]" if open_ == "[" else '{"a":1}'
        nest = ('{"a":' * (depth - 1) + inner + "}" * (depth - 1)) if open_ == "{" else (
            "[" * (depth - 1) + inner + "]" * (depth - 1))
        return ('{"type":"tool.result","toolRequestId":"' + names["$PENDING"]
                + '","result":' + nest + ',"handledBy":"named"}')
    if make == "repeat":
        return inp["unit"] * inp["count"]
    if make == "padded":
        body = expand(inp["frame"], names)
        char = inp.get("char", "x")
        base = len(json.dumps(body, ensure_ascii=False).encode())
        body[inp["field"]] = char * ((inp["bytes"] - base) // len(char.encode()) + 1)
        text = json.dumps(body, ensure_ascii=False)
        assert len(text.encode()) > MAX_FRAME
        return text
    raise AssertionError(f"unknown make {make!r}")


RESUME_REFUSED_MESSAGE: str | None = None


async def frames_case(core: Core, case: dict[str, Any]) -> None:
    inp, expect = case["input"], case["expect"]
    other = await RawSession.open(core)
    third = await RawSession.open(core, with_requests=False)
    mine: RawSession | None = None
    if inp["stage"] == "session":
        mine = await RawSession.open(core)
        client = mine.client
    else:
        client = await RawClient.open(core.ws_url)
    names = {
        "$OTHER_SESSION": other.id, "$OTHER_TOKEN": other.token,
        "$OTHER_PENDING": other.pending, "$OTHER_DONE": other.done,
        "$THIRD_TOKEN": third.token, "$WRONG_TOKEN": "wrong",
        "$WRONG_TOKEN_SAME_LENGTH": ("A" if other.token[0] != "A" else "B") + other.token[1:],
        "$PENDING": mine.pending if mine else "no-pending",
        "$DONE": mine.done if mine else "no-done",
        "$SESSION": mine.id if mine else "no-session",
    }
    payload = frame_payload(inp, names)
    if mine is not None and "$LATE" in json.dumps(inp):
        _late_call, late_id = await mine.start_call(timeoutMs=20)
        await recv_until(client, "tool.cancel")
        payload = str(payload).replace("$LATE", late_id)

    if isinstance(payload, bytes):
        await client.ws.send(payload)
    else:
        await client.send(payload)
    if "close" in expect:
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await recv_until(client, "error")
        assert closed.value.rcvd is not None and closed.value.rcvd.code == expect["close"]
        assert mine is not None
        # the session survives its connection: resume it, the pending request comes again
        client = await RawClient.open(core.ws_url)
        welcome = await client.hello([tool_meta("t")], sessionId=mine.id,
                                     resumeToken=mine.token)
        assert welcome["type"] == "welcome" and welcome["resumed"] is True, welcome
        again = await recv_until(client, "tool.request")
        assert again["toolRequestId"] == mine.pending
        mine.client = client
    else:
        error = await recv_until(client, "error")
        assert error["code"] == expect["error"], (error, case["id"])
        assert isinstance(error["message"], str) and error["message"]
        text = json.dumps(error)
        for secret in (other.token, third.token, core.app.state.admin_token):
            assert secret not in text
        if expect["error"] == "RESUME_REFUSED":
            global RESUME_REFUSED_MESSAGE
            RESUME_REFUSED_MESSAGE = RESUME_REFUSED_MESSAGE or error["message"]
            assert error["message"] == RESUME_REFUSED_MESSAGE  # the same for every cause

    if mine is None:  # the connection is still usable: a fresh hello opens a session
        welcome = await client.hello([tool_meta("t")])
        assert welcome["type"] == "welcome", welcome
        mine = RawSession(core, client, welcome)
        mine.call, mine.pending = await mine.start_call()
    await mine.finish({"case": case["id"]})
    await other.finish({"other": case["id"]})
    for session in (mine, other, third):
        await session.client.close()


# --- a real Session as the page, with the demo's tools -----------------------------------


class FakeElement:
    def __init__(self) -> None:
        self.dataset = types.SimpleNamespace(value="0")
        self.textContent = ""
        self.value = "Notes\nthe text"
        self.selectionStart = 0
        self.selectionEnd = 5


class FakeDocument:
    title = "corpus"

    def __init__(self) -> None:
        self.elements: dict[str, FakeElement] = {}

    def getElementById(self, element_id: str) -> FakeElement:
        return self.elements.setdefault(element_id, FakeElement())


@contextlib.contextmanager
def demo_session() -> Iterator[tuple[Session, dict[str, asyncio.Event]]]:
    """A Session with the demo's tools (web/demo/tools.py, imported as the module ``tools``
    through pyproject's pythonpath, registered as the page does), run against a stand-in
    ``js`` module while the case runs, plus ``produce`` (returns a value built by the
    case) and ``gate`` (waits)."""
    session = Session()
    demo_tools.register(session)
    fake_js = types.ModuleType("js")
    fake_js.document = FakeDocument()  # type: ignore[attr-defined]
    fake_js.location = types.SimpleNamespace(href="http://127.0.0.1/")  # type: ignore[attr-defined]
    gates: dict[str, asyncio.Event] = {}

    async def gate(args: dict[str, Any]) -> dict[str, Any]:
        await asyncio.wait_for(gates.setdefault(args["name"], asyncio.Event()).wait(), WAIT)
        return {"opened": args["name"]}

    session.add_tool(define_tool(name="gate", description="Wait for a gate.",
                                 args_schema={"type": "object"}, handler=gate))
    session.add_tool(define_tool(name="produce", description="Return the case's value.",
                                 args_schema={"type": "object"},
                                 handler=lambda args: python_value(args["python"])))
    saved = sys.modules.get("js")
    sys.modules["js"] = fake_js
    try:
        yield session, gates
    finally:
        if saved is None:
            del sys.modules["js"]
        else:
            sys.modules["js"] = saved


async def close_page(page: Page) -> None:
    for task in (page._writer, page._reader):
        if task is not None:
            task.cancel()
    with contextlib.suppress(Exception):
        await page.ws.close()
    for task in (page._writer, page._reader):
        if task is not None:
            with contextlib.suppress(BaseException):
                await task


def cycle_list() -> list[Any]:
    items: list[Any] = []
    items.append(items)
    return items


def cycle_dict() -> dict[str, Any]:
    items: dict[str, Any] = {}
    items["self"] = items
    return items


def nest(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


NAMESPACE = {
    "math": math, "datetime": datetime, "decimal": decimal, "fractions": fractions,
    "uuid": uuid, "pathlib": pathlib, "enum": enum, "array": array,
    "cycle_list": cycle_list, "cycle_dict": cycle_dict, "nest": nest,
}


def python_value(expression: str) -> Any:
    return eval(expression, dict(NAMESPACE))  # the corpus' own expressions


async def session_case(core: Core, case: dict[str, Any]) -> None:
    with demo_session() as (session, gates):
        await run_session_case(core, case, session, gates)


async def run_session_case(core: Core, case: dict[str, Any], session: Session,
                           gates: dict[str, asyncio.Event]) -> None:
    page = await Page(session).connect(core.ws_url)
    sid = session.session_id
    assert sid is not None
    try:
        # a request in flight while the bad one runs
        waiting = asyncio.create_task(core.tool_call(sid, "gate", {"name": "g"}))
        await page.wait_frame("tool.request", where=lambda f: f["tool"] == "gate")
        if case["family"] == "args":
            response = await core.tool_call(sid, case["input"]["tool"], case["input"]["args"])
        else:
            response = await core.tool_call(sid, "produce", {"python": case["input"]["python"]})
        assert response.status_code == 200, response.text
        body = response.json()
        error = body["result"]["error"]
        expect = case["expect"]
        assert error["code"] == expect["code"], body
        assert "Traceback" not in error["message"]
        if expect["code"] == "INVALID_ARGS":
            assert error["retryable"] is True
            paths = [e["path"] for e in error["details"]["errors"]]
            assert expect["path"] in paths, (paths, expect)
        elif expect["code"] == "TOOL_RESULT_INVALID":
            assert error["details"]["path"] == expect["path"], error
            assert expect["type_contains"] in error["details"]["type"], error
            assert expect["path"] in error["message"]
        gates.setdefault("g", asyncio.Event()).set()
        held = (await asyncio.wait_for(waiting, WAIT)).json()
        assert held["result"] == {"opened": "g"} and held["handledBy"] == "inline", held
        # the session still works, and counted every request once
        counted = (await core.tool_call(sid, "update_counter", {"delta": 2})).json()
        assert counted["result"] == {"value": 2}, counted
        results = [f["toolRequestId"] for f in page.frames_out if f["type"] == "tool.result"]
        assert len(results) == len(set(results)) == 3
        live = core.registry.get(sid)
        assert live is not None and not live.pending and live.state == "idle"
        assert session.state == "idle"
    finally:
        await close_page(page)


# --- control API -------------------------------------------------------------------------


def auth_headers(auth: str, token: str) -> tuple[dict[str, str], str]:
    """Headers for an auth variant, and a query string."""
    wrong_same = ("A" if token[0] != "A" else "B") + token[1:]
    return {
        "good": ({"Authorization": f"Bearer {token}"}, ""),
        "none": ({}, ""),
        "wrong": ({"Authorization": "Bearer wrong"}, ""),
        "wrong-same-length": ({"Authorization": f"Bearer {wrong_same}"}, ""),
        "basic": ({"Authorization": f"Basic {token}"}, ""),
        "no-scheme": ({"Authorization": token}, ""),
        "token-in-query": ({}, f"?token={token}"),
        "bearer-no-token": ({"Authorization": "Bearer"}, ""),
    }[auth]


async def control_case(core: Core, case: dict[str, Any]) -> None:
    inp, expect = case["input"], case["expect"]
    session = Session()
    session.add_tool(define_tool(name="echo", description="Echo.",
                                 args_schema={"type": "object"}, handler=lambda a: a))
    page = await Page(session).connect(core.ws_url)
    sid = session.session_id
    assert sid is not None
    try:
        path = inp["path"].replace("$SESSION", sid)
        token = core.app.state.admin_token
        headers, query = auth_headers(inp.get("auth", "good"), token)
        make = inp.get("make")
        content: bytes | None
        if make is not None:
            size = make["bytes"]
            key = "text" if path.endswith("/turns") else "args"
            value = "x" * size if make["kind"] == "big_body" else {"s": "x" * size}
            content = json.dumps({"tool": "echo", key: value}).encode()
            if make["kind"] == "big_args":
                assert len(content) < MAX_FRAME
        elif "body_hex" in inp:
            content = bytes.fromhex(inp["body_hex"])
        else:
            content = inp["body"].encode() if "body" in inp else None
        if "host" in inp:
            headers["Host"] = inp["host"]
        http = core.http
        sent: list[tuple[bytes, bytes]] = [
            (name.encode(), value.encode()) for name, value in
            ({"Authorization": "", **headers} if "Authorization" not in headers
             else headers).items()]
        sent += [(name.encode(), bytes.fromhex(value))
                 for name, value in inp.get("headers_hex", [])]
        response = await http.request(inp["method"], path + query, content=content,
                                      headers=sent)
        assert response.status_code == expect["status"], (response.status_code, response.text)
        if "code" in expect:
            assert response.json()["error"]["code"] == expect["code"], response.text
        assert token not in response.text and token not in str(response.headers)
        if expect["status"] == 401:
            assert response.headers["www-authenticate"] == "Bearer"
        # the session still works; nothing was sent to the page by the refused request
        done = await core.tool_call(sid, "echo", {"case": case["id"]})
        assert done.json()["result"] == {"case": case["id"]}
        requests = [f for f in page.frames_in if f["type"] == "tool.request"]
        assert len(requests) == 1, requests
        live = core.registry.get(sid)
        assert live is not None and not live.pending and live.state == "idle"
    finally:
        await close_page(page)


# --- the tests -----------------------------------------------------------------------------


@pytest.mark.parametrize("case", cases("frames"))
def test_frames(core: CoreThread, case: dict[str, Any]) -> None:
    core.call(frames_case(core.core, case))


@pytest.mark.parametrize("case", cases("args"))
def test_args(core: CoreThread, case: dict[str, Any]) -> None:
    core.call(session_case(core.core, case))


@pytest.mark.parametrize("case", cases("results"))
def test_results(core: CoreThread, case: dict[str, Any]) -> None:
    core.call(session_case(core.core, case))


@pytest.mark.parametrize("case", cases("control"))
def test_control(core: CoreThread, case: dict[str, Any]) -> None:
    core.call(control_case(core.core, case))


def test_corpus_shape() -> None:
    """Every case has the agreed fields; ids are unique; at least 200 cases in all."""
    families = ["frames", "args", "results", "page-results", "control", "store-rows"]
    seen: set[str] = set()
    total = 0
    for family in families:
        for case in load(family):
            assert set(case) == {"id", "family", "description", "applies", "input", "expect"}
            assert case["family"] == family and case["id"].startswith(family + "/")
            assert case["id"] not in seen
            seen.add(case["id"])
            assert case["expect"] and case["description"]
            total += 1
    assert total >= 200
