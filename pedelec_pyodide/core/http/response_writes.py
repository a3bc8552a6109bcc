"""A response's head and body in one write to the socket.

uvicorn writes a response's head (status line and headers) as the app sends
``http.response.start``, and its body as it sends ``http.response.body``: two system calls
for every response, and for a client that reads the head first, two wake-ups, though
nearly every response (a JSON answer, a file's first chunk) sends both in the same step
of the event loop. :class:`HeadWithBody` stands for the socket's transport in uvicorn's
response cycle (:mod:`.http_limits` puts it there) and holds the head until the body's
first bytes, writing both at once; a head whose body does not follow in that step (an
event stream's, waiting for its first event) is written at the end of the step.
"""

from __future__ import annotations

import asyncio
from typing import Any


class HeadWithBody:
    """One request's response cycle's view of the transport: its first write (the head,
    or an interim ``100 Continue``) waits for the next one, in the same step at most."""

    __slots__ = ("_first", "_head", "_planned", "_transport")

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._head: bytes | None = None
        self._planned: asyncio.Handle | None = None
        self._first = True

    def write(self, data: bytes) -> None:
        if self._first:
            self._first = False
            self._head = data
            self._planned = asyncio.get_running_loop().call_soon(self._write_head)
            return
        head = self._head
        if head is not None:
            self._head = None
            if self._planned is not None:
                self._planned.cancel()
            data = head + data
        self._transport.write(data)

    def _write_head(self) -> None:
        self._planned = None
        head, self._head = self._head, None
        if head is not None and not self._transport.is_closing():
            self._transport.write(head)

    def flush(self) -> None:
        """Write the head held now: its response is complete without a body (a ``HEAD``),
        or the connection writes something of its own next (which must not overtake it)."""
        if self._planned is not None:
            self._planned.cancel()
            self._planned = None
        self._write_head()

    def close(self) -> None:
        self.flush()  # (a close writes what it holds first)
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:  # anything else uvicorn may ask of it
        return getattr(self._transport, name)
