"""Core's side of a page connection, in-process: frames in, frames out, no socket.

A :class:`PageConnection` on a real registry and memory store; :class:`FakeBridge`
plays the serve loop (it records when the connection wants its frames sent) and the
tests read the frames it queued. The rate limit runs on a clock the test moves.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from corekit import WAIT, config, fake_clock, run, tool_meta

from pedelec_pyodide import protocol, strictjson
from pedelec_pyodide.core.agents import OfflineAgent
from pedelec_pyodide.core.page.connection import CLOSE_POLICY, PageConnection
from pedelec_pyodide.core.sessions import Registry
from pedelec_pyodide.core.sessions.turns import restore
from pedelec_pyodide.core.store import JsonText, dump_json, open_store
from pedelec_pyodide.protocol import CLOSE_TRY_AGAIN

POLL = 0.005  # seconds between looks for Core's next frame (a turn stores, then sends)


class FakeBridge:
    """Plays bridge.py: counts the connection's calls for sending and for giving up."""

    def __init__(self) -> None:
        self.wakes = 0
        self.aborts = 0

    def wake(self) -> None:
        self.wakes += 1

    def abort(self) -> None:
        self.aborts += 1

    def flush(self) -> None:
        pass  # frames stay queued: the tests take them with next_frame


def registry(**overrides: Any) -> Registry:
    overrides.setdefault("agent_factory", OfflineAgent)
    core = config(**overrides)
    assert core.agent_factory is not None
    return Registry(core, open_store("memory"), core.agent_factory, restore)


def connect(registry: Registry, client: str = "127.0.0.1") -> tuple[PageConnection, FakeBridge]:
    bridge = FakeBridge()
    return PageConnection(registry, bridge, client=client), bridge


def feed(page: PageConnection, frame: dict[str, Any] | str) -> bool:
    data = frame if isinstance(frame, str) else json.dumps(frame)
    return page.receive(data, page.parse(data))


def sent(page: PageConnection) -> list[dict[str, Any]]:
    frames = []
    while (frame := page.next_frame()) is not None:
        frames.append(json.loads(frame))
    return frames


def hello(page: PageConnection, **extra: Any) -> dict[str, Any]:
    assert feed(page, {"type": "hello", "protocol": 1, "tools": [tool_meta("t")], **extra})
    [welcome] = sent(page)
    return welcome


async def next_frame(page: PageConnection) -> dict[str, Any]:
    """The next frame Core queues for the page (a turn runs on the event loop)."""
    for _ in range(int(WAIT / POLL)):
        frame = page.next_frame()
        if frame is not None:
            return dict(json.loads(frame))
        await asyncio.sleep(POLL)
    raise AssertionError("Core sent nothing")


def in_core(test: Callable[[Registry], Awaitable[None]], **overrides: Any) -> None:
    async def main() -> None:
        core = registry(**overrides)
        try:
            await test(core)
        finally:
            await core.shutdown()
    run(main())


def test_hello_gets_a_welcome_and_the_session_is_this_connections() -> None:
    async def test(core: Registry) -> None:
        page, bridge = connect(core)
        welcome = hello(page)
        assert welcome["type"] == "welcome" and welcome["resumed"] is False
        session = core.get(welcome["sessionId"])
        assert session is not None and session.connection is page and page.session is session
        assert bridge.wakes >= 1 and bridge.aborts == 0
        page.disconnected()
        assert session.connection is None and session.state == "connecting"  # waits for a resume
    in_core(test)


def test_frames_before_hello_and_a_second_hello_are_refused_and_the_connection_stays() -> None:
    async def test(core: Registry) -> None:
        page, _ = connect(core)
        assert feed(page, {"type": "turn.cancel", "turnId": "x"})
        assert [f["code"] for f in sent(page)] == ["HELLO_REQUIRED"]
        hello(page)
        assert feed(page, {"type": "hello", "protocol": 1, "tools": []})
        assert [f["code"] for f in sent(page)] == ["DUPLICATE_HELLO"]
        assert page.open and page.closing is None
    in_core(test)


def test_a_bad_frame_gets_an_error_and_a_refused_turn_start_names_its_turn() -> None:
    async def test(core: Registry) -> None:
        page, _ = connect(core)
        hello(page)
        assert feed(page, "{not json")
        assert feed(page, '{"type":"turn.start","turnId":"t1","text":5}')
        not_json, bad_turn = sent(page)
        assert not_json["type"] == "error" and "turnId" not in not_json
        assert bad_turn["type"] == "error" and bad_turn["turnId"] == "t1"
    in_core(test)


def test_the_rate_limit_refuses_then_cuts_off_and_refills_with_the_clock() -> None:
    async def test(core: Registry) -> None:
        clock = core.config.clock
        page, _ = connect(core)
        hello(page)  # 2 of the burst of 3 left
        cancel = {"type": "turn.cancel", "turnId": "x"}
        for _ in range(2):
            assert feed(page, cancel)
        assert [f["code"] for f in sent(page)] == ["UNKNOWN_TURN"] * 2
        assert feed(page, cancel)
        assert [f["code"] for f in sent(page)] == ["RATE_LIMITED"]
        await clock.advance(0.2)  # 10 frames a second: two tokens back, one owed
        assert feed(page, cancel)
        assert [f["code"] for f in sent(page)] == ["UNKNOWN_TURN"]
        for _ in range(3):  # down to -3: refused
            assert feed(page, cancel)
        assert [f["code"] for f in sent(page)] == ["RATE_LIMITED"] * 3
        assert not feed(page, cancel)  # past -burst: a flood, cut off
        assert sent(page) == [] and page.closing == (CLOSE_POLICY, "rate limit exceeded")
    in_core(test, rate_limit=10.0, rate_burst=3, clock=fake_clock())


def test_a_page_that_does_not_read_is_cut_off_and_its_session_waits() -> None:
    async def test(core: Registry) -> None:
        page, bridge = connect(core)
        welcome = hello(page)
        session = page.session
        assert session is not None
        for _ in range(100):  # errors Core queues and nobody sends
            feed(page, {"type": "turn.cancel", "turnId": "x"})
            if not page.open:
                break
        assert bridge.aborts == 1 and not page.open
        assert page.next_frame() is None  # what was queued is dropped
        assert page.closing is not None and page.closing[0] == CLOSE_POLICY
        assert "not reading" in page.closing[1]
        assert session.connection is None and core.get(welcome["sessionId"]) is session
        page.send("{}")  # nothing more is queued
        assert page.next_frame() is None
    in_core(test, max_queued_bytes=2_000)


def test_all_queues_together_are_capped_closing_the_one_that_holds_the_most() -> None:
    frame = "x" * 10_000
    size = sys.getsizeof(frame)

    async def test(core: Registry) -> None:
        outboxes = core.outboxes
        pages = [connect(core, client=f"127.0.0.{2 + i}")[0] for i in range(3)]
        sessions = []
        for page in pages:
            hello(page)
            assert page.session is not None
            sessions.append(page.session)
        big, small, reader = pages

        def to_reader() -> None:  # the reader reads each frame at once
            sessions[2].send(frame)
            assert reader.next_frame() == frame
            assert outboxes.total >= size  # sent, not yet confirmed: still counted
            assert reader.next_frame() is None

        for _ in range(3):
            sessions[0].send(frame)
            to_reader()
        sessions[1].send(frame)
        assert outboxes.total == 4 * size and big.open
        sessions[1].send(frame)  # 5 frames' worth would be over: the biggest goes
        assert not big.open and big.closing is not None
        assert big.closing[0] == CLOSE_TRY_AGAIN and "--max-queued-total-bytes" in big.closing[1]
        assert big.next_frame() is None and sessions[0].connection is None  # awaits a resume
        assert outboxes.total == 2 * size
        sessions[1].send(frame)
        to_reader()
        sessions[1].send(frame)
        assert small.open and outboxes.total == 4 * size
        sessions[1].send(frame)  # now the sender itself holds the most: it is closed
        assert not small.open and outboxes.total == 0
        to_reader()
        assert reader.open and outboxes.holders() == 0
    in_core(test, max_queued_total_bytes=int(4.5 * size), max_queued_bytes=100 * size)


def test_a_session_resumes_on_a_new_connection_with_its_token_only() -> None:
    async def test(core: Registry) -> None:
        first, _ = connect(core)
        welcome = hello(first)
        first.disconnected()
        wrong, _ = connect(core)
        assert feed(wrong, {"type": "hello", "protocol": 1, "tools": [],
                            "sessionId": welcome["sessionId"], "resumeToken": "nope"})
        assert [f["code"] for f in sent(wrong)] == ["RESUME_REFUSED"]
        second, _ = connect(core)
        again = hello(second, sessionId=welcome["sessionId"],
                      resumeToken=welcome["resumeToken"])
        assert again["resumed"] is True and again["sessionId"] == welcome["sessionId"]
        session = core.get(welcome["sessionId"])
        assert session is not None and session.connection is second
    in_core(test)


def test_pending_requests_go_out_after_a_resume_however_large_together() -> None:
    """Found (by a stranger): a session's pending requests, sent again at its resume, were
    queued whole in one step; with more of them than --max-queued-bytes holds (9 calls of
    1 MB against 8 MiB), a page that read at once was cut off before it could read any, at
    every reconnection, until the calls timed out. Their frames are the requests' own (kept
    to send again): a connection's queue holds their ids and takes each frame as it goes."""
    pad = "x" * 10_000

    async def test(core: Registry) -> None:
        first, _ = connect(core)
        welcome = hello(first)
        session = first.session
        assert session is not None
        calls = [await session.start_call("t", {"pad": pad, "n": n}) for n in range(6)]
        assert [f["args"]["n"] for f in sent(first)] == list(range(6))  # (read: fits)
        first.disconnected()
        second, bridge = connect(core)
        assert feed(second, {"type": "hello", "protocol": 1, "tools": [tool_meta("t")],
                             "sessionId": welcome["sessionId"],
                             "resumeToken": welcome["resumeToken"]})
        assert second.open and bridge.aborts == 0
        assert second.queued < 2_000  # the ids of six requests of 10 KB
        # one answered meanwhile is not sent again
        feed(second, {"type": "tool.result", "toolRequestId": calls[2].id,
                      "result": {"ok": True}, "handledBy": "named"})
        welcomed, *requests = sent(second)
        assert welcomed["type"] == "welcome" and welcomed["resumed"] is True
        assert [f["args"]["n"] for f in requests] == [0, 1, 3, 4, 5]
        assert second.open and bridge.aborts == 0 and second.queued == 0
        assert core.outboxes.total == 0
    in_core(test, max_queued_bytes=30_000)


def test_a_request_being_stored_when_its_page_resumes_goes_out_once_stored() -> None:
    """Found (by a reviewer, and seen once as a cluster test's second tool.request): a page
    that resumed while a request's store write was under way got it from the resume, before
    it was stored, and again once it was."""
    async def test(core: Registry) -> None:
        first, _ = connect(core)
        welcome = hello(first)
        session = first.session
        assert session is not None
        first.disconnected()
        gate = asyncio.Event()
        stored = session.stored

        async def held(*keys: str, large: bool = False) -> None:
            await gate.wait()
            await stored(*keys, large=large)

        session.stored = held  # type: ignore[method-assign]
        call = asyncio.ensure_future(session.start_call("t", {"n": 1}))
        await asyncio.sleep(0)  # opened; its store write under way
        second, _ = connect(core)
        assert feed(second, {"type": "hello", "protocol": 1, "tools": [tool_meta("t")],
                             "sessionId": welcome["sessionId"],
                             "resumeToken": welcome["resumeToken"]})
        assert [f["type"] for f in sent(second)] == ["welcome"]  # not before it is stored
        gate.set()
        await asyncio.wait_for(call, WAIT)
        assert [f["args"] for f in sent(second)] == [{"n": 1}]  # then once
    in_core(test)


def test_a_full_core_refuses_a_new_session_and_closes_try_again() -> None:
    async def test(core: Registry) -> None:
        hello(connect(core)[0])
        page, _ = connect(core)
        assert feed(page, {"type": "hello", "protocol": 1, "tools": []})
        assert [f["code"] for f in sent(page)] == ["TOO_MANY_SESSIONS"]
        assert page.closing == (CLOSE_TRY_AGAIN, "too many sessions")
    in_core(test, max_sessions=1)


def test_a_turn_calls_the_page_and_the_awaited_result_is_not_charged() -> None:
    async def test(core: Registry) -> None:
        page, _ = connect(core)
        hello(page)  # the burst of 2: one left
        assert feed(page, {"type": "turn.start", "turnId": "t1",
                           "text": '/call t {"n": 1}'})  # none left
        request = await next_frame(page)
        while request["type"] != "tool.request":
            request = await next_frame(page)
        assert (request["tool"], request["args"], request["turnId"]) == ("t", {"n": 1}, "t1")
        assert feed(page, {"type": "tool.result", "toolRequestId": request["toolRequestId"],
                           "result": {"ok": 1}, "handledBy": "named"})
        end = await next_frame(page)
        while end["type"] != "turn.end":
            assert end["type"] == "turn.delta"
            end = await next_frame(page)
        assert end["status"] == "completed" and end["turnId"] == "t1"
    in_core(test, rate_limit=0.001, rate_burst=2)


def test_frames_refused_unparsed_are_traced_by_the_head_the_runtime_writes() -> None:
    """A too-large ``tool.result`` or ``turn.start`` is traced back to its request or turn
    by the protocol's own frame head (``frame_head``), not by a copy of its key order."""
    async def test(core: Registry) -> None:
        page, _ = connect(core)
        hello(page)
        assert feed(page, {"type": "turn.start", "turnId": "t1", "text": '/call t {"n": 1}'})
        request = await next_frame(page)
        while request["type"] != "tool.request":
            request = await next_frame(page)
        rid = request["toolRequestId"]
        big = strictjson.encode("x" * 3000)
        assert feed(page, protocol.encode_tool_result(rid, big, "named"))
        refused = await next_frame(page)
        assert (refused["type"], refused["code"], refused["toolRequestId"]) == (
            "error", protocol.FRAME_TOO_LARGE, rid)
        end = await next_frame(page)
        while end["type"] != "turn.end":
            end = await next_frame(page)
        assert end["turnId"] == "t1" and "TOOL_RESULT_TOO_LARGE" in end["text"]
        assert feed(page, protocol.TurnStart(turn_id="t2", text="y" * 3000).encode())
        refused = await next_frame(page)
        assert (refused["type"], refused["code"], refused["turnId"]) == (
            "error", protocol.FRAME_TOO_LARGE, "t2")
    in_core(test, max_frame_bytes=2000)


def test_a_calls_long_result_goes_on_as_its_text_and_a_turns_or_an_errors_decoded() -> None:
    """A long result decoded in the parse's thread and handed on as a value outlived the
    thread's work: once the collector went on, it walked the whole value on the event loop
    (~0.1 s for 1 MiB of small arrays). A call's caller (control API, MCP) writes the
    result out as it is, so its text goes on and its value is dropped with the parse; an
    agent reads its turn's results, and an error result is read for its code."""
    rows = [[n] for n in range(8_000)]  # ~50 KB as JSON

    async def test(core: Registry) -> None:
        page, _ = connect(core)
        hello(page)
        session = page.session
        assert session is not None
        call = await session.start_call("t", {})
        error = await session.start_call("t", {})
        in_turn = session.open_request("t", {}, turn_id="t1")
        small = await session.start_call("t", {})
        sent(page)

        def result(request_id: str, value: Any) -> Any:
            frame = json.dumps({"type": "tool.result", "toolRequestId": request_id,
                                "result": value, "handledBy": "named"})
            return page.parse(frame).message.result  # type: ignore[union-attr]

        kept = result(call.id, {"rows": rows})
        assert isinstance(kept, JsonText) and kept.value() == {"rows": rows}
        assert result(error.id, {"error": {"code": "E", "message": "m", "rows": rows}}) \
            == {"error": {"code": "E", "message": "m", "rows": rows}}
        assert result(in_turn.id, {"rows": rows}) == {"rows": rows}
        assert result(small.id, {"ok": 1}) == {"ok": 1}
        assert result("not-pending", {"rows": rows}) == {"rows": rows}

        # the caller gets the text, and writes it out as it is
        assert feed(page, {"type": "tool.result", "toolRequestId": call.id,
                           "result": {"rows": rows}, "handledBy": "named"})
        value, handled_by = await asyncio.wait_for(call.future, WAIT)
        assert isinstance(value, JsonText) and handled_by == "named"
        assert json.loads(dump_json({"result": value})) == {"result": {"rows": rows}}
    in_core(test)
