"""A response's head and body go out in one write (http/response_writes.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from typing import Any

from corekit import TOKEN, RawClient, run, running_core, tool_meta

from pedelec_pyodide.core.http.http_limits import MAX_HEAD_BYTES
from pedelec_pyodide.core.http.response_writes import HeadWithBody


class Transport:
    """Keeps each write, as the socket would get it."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str) -> Any:
        return f"info {name}"


def test_the_head_goes_with_the_body_or_at_the_end_of_its_step() -> None:
    async def main() -> None:
        # a body in the same step: one write, nothing more at the step's end
        transport = Transport()
        writes = HeadWithBody(transport)  # type: ignore[arg-type]
        writes.write(b"HEAD")
        assert transport.writes == []
        writes.write(b"BODY")
        writes.write(b"MORE")
        await asyncio.sleep(0)
        assert transport.writes == [b"HEADBODY", b"MORE"]
        # a stream's head, its body later: the head at the end of the step
        transport = Transport()
        writes = HeadWithBody(transport)  # type: ignore[arg-type]
        writes.write(b"HEAD")
        await asyncio.sleep(0)
        assert transport.writes == [b"HEAD"]
        writes.write(b"EVENT")
        assert transport.writes == [b"HEAD", b"EVENT"]
        # a close writes what is held first, once
        transport = Transport()
        writes = HeadWithBody(transport)  # type: ignore[arg-type]
        writes.write(b"HEAD")
        writes.close()
        await asyncio.sleep(0)
        assert transport.writes == [b"HEAD"] and transport.closed
        assert writes.is_closing()
        assert writes.get_extra_info("peername") == "info peername"

    run(main())


def test_core_answers_in_one_write_per_response() -> None:
    """Through Core's own protocol: each answer (head and body) is one write to the socket."""
    async def main() -> None:
        async with running_core() as core:
            reader, writer = await asyncio.open_connection("127.0.0.1", core.port)
            request = b"GET /pedelec/v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"

            async def answered() -> None:
                writer.write(request)
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                await asyncio.wait_for(reader.readexactly(length), 10)

            try:
                await answered()
                here = writer.get_extra_info("sockname")
                transport = next(
                    connection.transport for connection in core.server.server_state.connections
                    if connection.transport.get_extra_info("peername") == here)
                writes: list[bytes] = []
                write = transport.write

                def recorded(data: bytes) -> None:
                    writes.append(bytes(data))
                    write(data)

                transport.write = recorded
                for _ in range(3):
                    await answered()
                assert len(writes) == 3 and all(data.startswith(b"HTTP/1.1 200") for data in writes)
            finally:
                writer.close()

    run(main())


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
    """A HEAD response has no body write: its head, held for one, still goes out before
    the 431 Core owes a too-large head pipelined behind it."""
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


def test_pipelined_and_closing_responses_come_whole_and_in_order() -> None:
    """Pipelined GET, HEAD, POST (the lane, with Expect: 100-continue) and a last HEAD
    with Connection: close: every response whole, in order, then the close."""
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
