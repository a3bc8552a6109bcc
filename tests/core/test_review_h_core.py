"""Review of h-core: what a hostile or unlucky client could do to the branch's faster
common paths (the tool-call lane, frames taken as parsed, a response in one write)."""

from __future__ import annotations

import asyncio
import contextlib
import re

from corekit import running_core

from pedelec_pyodide.core.http.http_limits import MAX_HEAD_BYTES

HEALTH = "/pedelec/v1/health"


def _request(port: int, path: str = HEALTH, *lines: bytes, method: bytes = b"GET") -> bytes:
    return b"".join([method, b" ", path.encode(), b" HTTP/1.1\r\n",
                     b"Host: 127.0.0.1:%d\r\n" % port, *(line + b"\r\n" for line in lines),
                     b"\r\n"])


async def _all_until_closed(reader: asyncio.StreamReader) -> bytes:
    received = bytearray()
    with contextlib.suppress(ConnectionError):
        while chunk := await asyncio.wait_for(reader.read(65536), 10):
            received.extend(chunk)
    return bytes(received)


def test_a_head_response_goes_out_before_a_pipelined_431() -> None:
    """A HEAD response has no body write: its head, held for one, must still go out before
    the 431 Core owes a too-large head pipelined behind it (main: 200 head, then 431)."""
    async def main() -> None:
        async with running_core() as core:
            port = core.port
            pad = b"X-Pad: " + b"p" * (MAX_HEAD_BYTES + 1)
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(_request(port, method=b"HEAD") + _request(port, HEALTH, pad))
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            answer = await _all_until_closed(reader)
            writer.close()
            statuses = [line.split()[1] for line in answer.split(b"\r\n")
                        if line.startswith(b"HTTP/1.1 ")]
            assert statuses == [b"200", b"431"], answer[:300]

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_page_cut_off_for_flooding_is_let_go_at_once() -> None:
    """A page whose frames, each in a read of its own, flood past the rate limit is cut
    off (1008): its connection ends then (its session detached, disconnected), whether or
    not it answers the close. main: at once (the serve loop stops); a frame taken as
    parsed (bridge.take) ignores page.receive's False, and the serve loop waits on for
    the client's close answer, or uvicorn's 10 s close timer."""
    from corekit import config
    from websockets.frames import Opcode
    from ws_hostile import RawSocket, frame

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


def test_pipelined_and_closing_responses_come_whole_and_in_order() -> None:
    """Pipelined GET, HEAD, POST (the lane, with Expect: 100-continue) and a last HEAD
    with Connection: close: every response whole, in order, then the close."""
    import json

    from corekit import TOKEN, RawClient, tool_meta

    async def main() -> None:
        async with running_core() as core:
            port = core.port
            client = await RawClient.open(core.ws_url)
            sid = (await client.hello([tool_meta("a")]))["sessionId"]
            auth = b"Authorization: Bearer " + TOKEN.encode()
            body = json.dumps({"tool": "bad name!"}).encode()  # 400 at once, no page needed
            post = _request(port, f"/pedelec/v1/sessions/{sid}/tool-calls", auth,
                            b"Content-Type: application/json",
                            b"Content-Length: %d" % len(body), method=b"POST") + body
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(_request(port) + _request(port, method=b"HEAD") + post
                         + _request(port, method=b"HEAD") + _request(port)
                         + _request(port, HEALTH, b"Connection: close", method=b"HEAD"))
            await writer.drain()
            answer = await _all_until_closed(reader)
            writer.close()
            statuses = re.findall(rb"HTTP/1\.1 (\d{3}) ", answer)
            assert statuses == [b"200", b"200", b"400", b"200", b"200", b"200"], answer
            await client.close()

    asyncio.run(asyncio.wait_for(main(), 60))
