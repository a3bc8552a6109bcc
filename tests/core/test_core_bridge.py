"""Bad input on the bridge never crashes Core nor touches another session."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

import pytest
import websockets
from corekit import Page, RawClient, config, run, running_core, tool_meta
from websockets.frames import Opcode
from ws_hostile import RawSocket, frame

from pedelec_pyodide import Session, TurnError, define_tool
from pedelec_pyodide.core.page.ws_limits import SLICE_BYTES


async def alive(client: RawClient) -> None:
    """The connection still works: an unknown turn.cancel gets its error frame."""
    await client.send({"type": "turn.cancel", "turnId": "nope"})
    assert (await client.recv())["code"] == "UNKNOWN_TURN"


def test_malformed_frames_get_error_frames_and_the_connection_stays() -> None:
    async def main() -> None:
        async with running_core() as core:
            client = await RawClient.open(core.ws_url)
            await client.send({"type": "turn.start", "turnId": "t", "text": "x"})
            assert (await client.recv())["code"] == "HELLO_REQUIRED"
            welcome = await client.hello([tool_meta("a")])
            assert welcome["type"] == "welcome" and welcome["resumed"] is False
            cases = [
                ("{oops", "FRAME_NOT_JSON"),
                ("[1]", "FRAME_NOT_OBJECT"),
                ({"no": "type"}, "MISSING_TYPE"),
                ({"type": "launch.missiles"}, "UNKNOWN_TYPE"),
                ({"type": "welcome"}, "WRONG_DIRECTION"),
                ({"type": "turn.start", "turnId": "t"}, "MISSING_FIELD"),
                ({"type": "tool.result", "toolRequestId": "x", "result": 1,
                  "handledBy": "magic"}, "INVALID_FIELD"),
                ({"type": "hello", "protocol": 1, "tools": []}, "DUPLICATE_HELLO"),
                ("[" * 500 + "]" * 500, "FRAME_TOO_DEEP"),
                ('{"type":"x","a":' + "[" * 200 + "]" * 200 + "}", "FRAME_TOO_DEEP"),
            ]
            for frame, code in cases:
                await client.send(frame if isinstance(frame, str) else json.dumps(frame))
                error = await client.recv()
                assert error["type"] == "error" and error["code"] == code, (frame, error)
            await client.ws.send(b'{"type": "turn.cancel", "turnId": "b"}')  # binary frame
            assert (await client.recv())["code"] == "UNKNOWN_TURN"
            await alive(client)
            info = (await core.http.get(f"/pedelec/v1/sessions/{welcome['sessionId']}")).json()
            assert info["connected"] is True

    run(main())


def test_invalid_hello_and_refused_resume() -> None:
    async def main() -> None:
        async with running_core() as core:
            first = await RawClient.open(core.ws_url)
            welcome = await first.hello()
            other = await RawClient.open(core.ws_url)
            bad_tools = await other.hello([{"name": "x", "description": "", "argsSchema": {}}])
            assert bad_tools["code"] == "INVALID_TOOL"
            version = await other.hello(protocol=2)
            assert version["code"] == "UNSUPPORTED_PROTOCOL"
            refusals = [
                await other.hello(sessionId=welcome["sessionId"], resumeToken="wrong"),
                await other.hello(sessionId=welcome["sessionId"]),
                await other.hello(sessionId="no-such-session", resumeToken="wrong"),
            ]
            assert {r["code"] for r in refusals} == {"RESUME_REFUSED"}
            assert len({r["message"] for r in refusals}) == 1  # says nothing about why
            # the refused connection may still start a session of its own
            fresh = await other.hello()
            assert fresh["type"] == "welcome" and fresh["sessionId"] != welcome["sessionId"]
            await alive(first)

    run(main())


def test_results_for_unknown_foreign_and_duplicate_ids() -> None:
    async def main() -> None:
        async with running_core() as core:
            owner = await RawClient.open(core.ws_url)
            sid = (await owner.hello([tool_meta("t")]))["sessionId"]
            thief = await RawClient.open(core.ws_url)
            await thief.hello()
            call = asyncio.create_task(core.tool_call(sid, "t", {"n": 1}))
            request = await owner.recv()
            assert request["type"] == "tool.request"
            rid = request["toolRequestId"]
            # another session answering this id is refused; the request stays pending
            await thief.send({"type": "tool.result", "toolRequestId": rid,
                              "result": "stolen", "handledBy": "named"})
            refused = await thief.recv()
            assert refused["code"] == "UNKNOWN_TOOL_REQUEST" and refused["toolRequestId"] == rid
            await owner.send({"type": "tool.result", "toolRequestId": "made-up",
                              "result": 1, "handledBy": "named"})
            assert (await owner.recv())["code"] == "UNKNOWN_TOOL_REQUEST"
            assert (await core.session_info(sid))["state"] == "waiting_tool_result"
            for result in ("mine", "again"):
                await owner.send({"type": "tool.result", "toolRequestId": rid,
                                  "result": result, "handledBy": "named"})
            assert (await owner.recv())["code"] == "DUPLICATE_RESULT"
            body = (await asyncio.wait_for(call, 10)).json()
            assert body == {"toolRequestId": rid, "result": "mine", "handledBy": "named"}
            await alive(owner)
            await alive(thief)

    run(main())


def test_frame_size_limit() -> None:
    async def main() -> None:
        async with running_core(config(max_frame_bytes=2000)) as core:
            client = await RawClient.open(core.ws_url, max_size=None)
            await client.hello()
            await client.send({"type": "turn.start", "turnId": "t", "text": "x" * 3000})
            error = await client.recv()
            assert error["code"] == "FRAME_TOO_LARGE" and "2000" in error["message"]
            await alive(client)
            await client.send("x" * 9000)  # over 4x the limit: not even read
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await client.recv()
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009

    run(main())


def test_rate_limit_refuses_then_cuts_off_a_flood() -> None:
    async def main() -> None:
        async with running_core(config(rate_limit=5, rate_burst=10)) as core:
            client = await RawClient.open(core.ws_url)
            await client.hello()
            codes: list[str] = []
            with pytest.raises(websockets.ConnectionClosed) as closed:
                for _ in range(200):
                    await client.send({"type": "turn.cancel", "turnId": "x"})
                while True:
                    codes.append((await client.recv())["code"])
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
            assert "RATE_LIMITED" in codes and "UNKNOWN_TURN" in codes
            # other connections are not affected
            other = await RawClient.open(core.ws_url)
            assert (await other.hello())["type"] == "welcome"

    run(main())


def sized_result_page(size: int, max_result_bytes: int) -> Session:
    """A page whose tool ``sized`` returns a string whose JSON is ``size`` bytes."""
    tool = define_tool(name="sized", description="A result of a given size.",
                       args_schema={"type": "object"}, handler=lambda: "x" * (size - 2))
    return Session([tool], max_result_bytes=max_result_bytes)


def test_a_result_at_the_limit_is_delivered_in_its_larger_frame() -> None:
    """The limit applies to a result as the page measures it; its tool.result frame is
    larger by its envelope, which Core allows (this timed out before)."""
    async def main() -> None:
        async with running_core(config(max_frame_bytes=2000)) as core:
            page = await Page(sized_result_page(2000, 2000)).connect(core.ws_url)
            body = (await core.tool_call(page.session.session_id, "sized", timeoutMs=5000)).json()
            assert body["result"] == "x" * 1998
            assert page.frames("error") == []

    run(main())


def test_a_result_over_cores_limit_is_too_large_at_once_not_a_timeout() -> None:
    """A page allowed larger results than Core takes: the caller hears why, at once."""
    async def main() -> None:
        async with running_core(config(max_frame_bytes=2000)) as core:
            page = await Page(sized_result_page(6000, 8000)).connect(core.ws_url)
            sid = page.session.session_id
            started = asyncio.get_running_loop().time()
            body = (await core.tool_call(sid, "sized", timeoutMs=20_000)).json()
            assert asyncio.get_running_loop().time() - started < 10
            assert body["result"]["error"]["code"] == "TOOL_RESULT_TOO_LARGE"
            assert "2000" in body["result"]["error"]["message"]
            await page.wait_frame("error")
            [error] = page.frames("error")
            assert error["code"] == "FRAME_TOO_LARGE"
            assert error["toolRequestId"] == body["toolRequestId"]
            assert (await core.session_info(sid))["state"] == "idle"

    run(main())


def test_a_message_too_long_for_core_fails_its_turn_instead_of_hanging(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="pedelec.core")

    async def main() -> None:
        async with running_core(config(max_frame_bytes=2000)) as core:
            page = await Page(Session()).connect(core.ws_url)
            with pytest.raises(TurnError) as refused:
                await asyncio.wait_for(page.session.send_text("x" * 5000), 10)
            assert refused.value.code == "FRAME_TOO_LARGE" and "2000" in str(refused.value)
            assert await asyncio.wait_for(page.session.send_text("short"), 10) == "echo: short"
            # Core says so in its log: one line, the code and the size, not the frame
            lines = [r.getMessage() for r in caplog.records
                     if "event=bridge.frame_refused" in r.getMessage()]
            assert len(lines) == 1
            fields = dict(part.split("=", 1) for part in lines[0].split())
            assert fields["code"] == "FRAME_TOO_LARGE" and 5000 < int(fields["bytes"]) < 5200
            assert f"session={page.session.session_id}" in lines[0]
            assert "xxxxxxxx" not in lines[0] and len(lines[0]) < 300

    run(main())


class Verbose:
    """Streams and replies more text than one frame holds."""

    async def run(self, turn: Any) -> str:
        await turn.say("d" * 5000)
        return "r" * 5000


def test_core_never_sends_the_page_a_frame_over_the_limit() -> None:
    """A long delta goes out in pieces (nothing lost); a long reply is cut to fit, with
    a note, and the control API keeps it whole. Before, the page refused the frame and
    its send_text waited for ever."""
    async def main() -> None:
        async with running_core(config(max_frame_bytes=2000, agent_factory=Verbose)) as core:
            page = await Page(Session()).connect(core.ws_url)
            reply = await asyncio.wait_for(page.session.send_text("go"), 10)
            assert reply.startswith("r" * 100) and len(reply) < 2000
            assert reply.endswith("more characters: the reply is too long for one frame; "
                                  "the whole text is in the turn's record]")
            deltas = page.frames("turn.delta")
            assert len(deltas) > 2 and "".join(d["text"] for d in deltas) == "d" * 5000
            sizes = [len(json.dumps(f, separators=(",", ":"))) for f in page.frames_in]
            assert max(sizes) <= 2000
            whole = (await core.turn(page.session.session_id, "again")).json()
            assert whole["text"] == "r" * 5000

    run(main())


def test_deadline_timeout_cancel_and_late_result() -> None:
    async def main() -> None:
        cfg = config(tool_timeouts_ms={"slow": 100})
        async with running_core(cfg) as core:
            client = await RawClient.open(core.ws_url)
            sid = (await client.hello([tool_meta("slow"), tool_meta("t")]))["sessionId"]
            # per call (timeoutMs) and per tool (config) deadlines
            for tool, extra in (("t", {"timeoutMs": 100}), ("slow", {})):
                started = asyncio.get_running_loop().time()
                response = await core.tool_call(sid, tool, {}, **extra)
                waited = asyncio.get_running_loop().time() - started
                body = response.json()
                assert body["result"]["error"]["code"] == "TOOL_TIMEOUT"
                assert body["handledBy"] == "none" and 0.09 < waited < 5
                request = await client.recv()
                cancel = await client.recv()
                assert cancel == {"type": "tool.cancel",
                                  "toolRequestId": request["toolRequestId"],
                                  "reason": "timeout"}
                await client.send({"type": "tool.result",
                                   "toolRequestId": request["toolRequestId"],
                                   "result": "too late", "handledBy": "named"})
                late = await client.recv()
                assert late["code"] == "LATE_RESULT"
            assert (await core.session_info(sid))["state"] == "idle"

    run(main())


def test_awaited_results_are_not_charged_to_the_rate_limit() -> None:
    async def main() -> None:
        async with running_core(config(rate_limit=5, rate_burst=5)) as core:
            client = await RawClient.open(core.ws_url)
            sid = (await client.hello([tool_meta("t")]))["sessionId"]
            for n in range(30):
                call = asyncio.create_task(core.tool_call(sid, "t", {"n": n}))
                request = await client.recv()
                await client.send({"type": "tool.result",
                                   "toolRequestId": request["toolRequestId"],
                                   "result": n, "handledBy": "named"})
                assert (await asyncio.wait_for(call, 10)).json()["result"] == n

    run(main())


def test_frames_are_handled_in_the_order_sent_long_or_short() -> None:
    """A short frame is handled as the socket's protocol parses it (bridge.take), a long
    one in a worker thread by the serve loop: short frames sent right behind a long one
    (in the same write, or while the long one is parsed) are still handled after it."""
    async def main() -> None:
        async with running_core() as core:
            client = await RawClient.open(core.ws_url)
            await client.hello([tool_meta("a")])
            for round_ in range(3):
                # over PARSE_IN_THREAD_CHARS (parsed in a thread), and its frame (8 bytes of
                # head) ends where a slice of the read does (SLICE_BYTES): the short ones
                # are parsed once the serve loop takes the long one
                long = {"type": "turn.cancel", "turnId": f"long{round_}", "pad": ""}
                long["pad"] = "x" * (10 * SLICE_BYTES - 8 - len(json.dumps(long)))
                frames = [json.dumps(long),
                          *(json.dumps({"type": "turn.cancel", "turnId": f"short{round_}{n}"})
                            for n in range(3))]
                if round_ == 0:  # one frame after the other
                    for frame in frames:
                        await client.ws.send(frame)
                else:  # all in one write: Core reads the short ones with the long one's end
                    for frame in frames:
                        client.ws.protocol.send_text(frame.encode())
                    client.ws.transport.write(b"".join(client.ws.protocol.data_to_send()))
                answers = [await client.recv() for _ in frames]
                assert [answer.get("turnId") for answer in answers] == [
                    f"long{round_}", *(f"short{round_}{n}" for n in range(3))], answers
            await alive(client)

    run(main())


def test_a_page_cut_off_for_flooding_is_let_go_at_once() -> None:
    """A page whose frames, each in a read of its own, flood past the rate limit is cut
    off (1008): its connection ends then (its session detached, disconnected), whether or
    not it answers the close: a frame taken as parsed (bridge.take) that cuts the
    connection off stops the serve loop as one it handles would."""

    async def main() -> None:
        async with running_core(config(rate_limit=1.0, rate_burst=2)) as core:
            sock = await RawSocket.open(core.port)
            await sock.send_text('{"type":"hello","protocol":1,"tools":[]}')
            welcome = await sock.next_text(10)
            sid = welcome["sessionId"]
            unit = frame(Opcode.TEXT, b'{"type":"turn.cancel","turnId":"x"}')
            for _ in range(10):  # one frame per read: each taken as parsed
                with contextlib.suppress(ConnectionError):
                    await sock.write(unit)
                await asyncio.sleep(0.02)
            # never answers the close: the session must be let go all the same
            deadline = asyncio.get_running_loop().time() + 2.0
            while (await core.session_info(sid))["connected"]:
                assert asyncio.get_running_loop().time() < deadline, (
                    "a page cut off for flooding still holds its session 2 s later")
                await asyncio.sleep(0.05)
            sock.abort()

    asyncio.run(asyncio.wait_for(main(), 60))
