"""A response's head and body go out in one write (http/response_writes.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from corekit import run, running_core

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
