"""HTTP/1.1 requests bounded in size and time: uvicorn's httptools protocol, wrapped.

uvicorn's httptools path has neither bound. llhttp parses a head of any length, and
httptools joins the pieces of one header with ``bytes +=`` (a 200 MiB header line: ~60 s
of CPU, hundreds of MiB); ``timeout_keep_alive`` is cancelled by the first byte of a
request and not armed again before a response, so a head sent one byte at a time, or
never finished, holds its socket for good. :class:`BoundedHttpProtocol` adds both bounds
and parses nothing itself: it feeds uvicorn's own ``data_received`` in slices and counts
with the parser's callbacks.

Size: a request head (request line and headers) over :data:`MAX_HEAD_BYTES`, or with
over :data:`MAX_HEADERS` header lines, is answered 431 and its connection closed; the
parser never holds more than that of it (llhttp keeps no header; uvicorn keeps each as a
pair of byte strings, and the memory of a 64 KiB head of 15,000 empty headers lasted
until the garbage collector's rare full pass). The same
bound holds for a chunked body's framing and trailers. While such a section may be open,
the parser gets at most :data:`FEED_BYTES` at a time; a body with a Content-Length, at
most what is left of it (llhttp reports every byte of such a body). llhttp does not say
where in a slice one request ended and the next began, so a slice in which that happened
counts in full against what followed: a head pipelined behind another request in the
same slice may be over-counted by at most :data:`FEED_BYTES`, never under-counted.

Time: a head must be complete within ``header_timeout`` of the connection's opening or of
its first byte (blank lines before a request included), else the connection is closed;
a WebSocket's handshake must be done within that time of its upgrade request, and a head
the WebSocket library refuses is answered as it says (uvicorn leaves that answer unsent).
A client that reads none of its response for that time (the send buffer full, a "slow
read") is cut off. uvicorn's ``timeout_keep_alive`` closes a connection idle between
requests; a response complete while its request's body is still arriving (a refusal sent
before the body was read) leaves the rest of that body the same timeout, however slowly
it trickles in.

Pipelining: requests a client sends ahead, before it has read the answers it awaits, are
parsed one small slice at a time while a request is answered, and none more once one
waits behind it: the rest waits unparsed (at most :data:`MAX_AHEAD_BYTES`, else the
connection is closed), reading paused, until the answers before it are out. uvicorn
would parse every request of each read and queue them all, resuming reading after each
answer (a client pipelining 1 MiB of requests a few times a second, reading nothing,
took Core past a GiB).

Hang-ups: each request's scope holds a :class:`~.hangup.HangUp` that the connection's
loss completes, so a handler that waits hears of its caller going without a task of its
own reading ``receive()``.

Writes: a response's head goes out with its body, in one write
(:mod:`.response_writes`).

Stopping: a request still being answered when the server gives up on it (it stops, and
its graceful timeout is over: uvicorn cancels the request's task) is answered
``stopped_answer`` if its response has not begun (Core's: 503 ``CORE_STOPPING``), rather
than uvicorn's bare 500 and a traceback in the log. A response under way is cut off
there, its connection aborted (Core's streams end themselves before: a streamed tool
call with an ``error`` event, MCP's as they do): the stop never waits for a client to
read, and a file's download is not ended as if whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from typing import Any, Literal, cast

from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn._types import ASGI3Application
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from ..clock import Clock, Timer
from ..log import log_event
from .hangup import EXTENSION, HangUp, hang_up_of
from .response_writes import HeadWithBody

#: the largest request head (request line and headers, with their line ends) Core takes
MAX_HEAD_BYTES = 64 * 1024
#: the most header lines a request head may have (the WebSocket library's own bound)
MAX_HEADERS = 128
#: the most bytes the parser is given at once while a head, chunk framing or trailers
#: may be open: the count's only uncertainty (see above)
FEED_BYTES = 16 * 1024
#: the same while a request is answered: what a client pipelines is queued a few requests
#: at a time
PIPELINED_FEED_BYTES = 256
#: the most of what a client sends ahead of its answers that waits unparsed
MAX_AHEAD_BYTES = 1024 * 1024

#: idle: between requests; head: a request line has begun; body: its head is complete
Phase = Literal["idle", "head", "body"]

_TOO_LARGE = (f"431 Request Header Fields Too Large: a request head (request line and "
              f"headers) may have at most {MAX_HEAD_BYTES} bytes and {MAX_HEADERS} "
              "header lines\n").encode()


class BoundedHttpProtocol(HttpToolsProtocol):
    """uvicorn's :class:`HttpToolsProtocol` with the bounds of this module's docstring.
    Make one per configuration with :func:`bounded_http`."""

    #: seconds a head may take to arrive (``--header-timeout``; set by :func:`bounded_http`)
    header_timeout: float
    #: Core's clock, which times these bounds (set by :func:`bounded_http`)
    clock: Clock
    #: what a request cut off by the server's stop is answered (set by :func:`bounded_http`)
    stopped_answer: ASGIApp

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._phase: Phase = "idle"
        self._chunked = False
        #: what is left of a body with a Content-Length (None: chunked, or not in a body)
        self._body_left: int | None = None
        #: bytes of the open head (or chunk framing and trailers) fed so far
        self._open_bytes = 0
        #: per slice: body bytes the parser reported; whether a head, chunk or message
        #: ended in it; whether uvicorn dropped the rest of the data (an upgrade)
        self._slice_body = 0
        self._slice_ended = False
        self._dropped = False
        #: a pipelined head was too large: it is refused once the answers before it are out
        self._refusing = False
        self._headers = 0  # header lines of the open head
        #: what was read behind a request waiting for the one answered, not parsed yet
        self._ahead = b""
        #: when the awaited head's time began (the connection's opening, or its first
        #: byte); None while no head is awaited or its first byte has not come
        self._head_since: float | None = None
        self._deadline: Timer | None = None
        #: armed while a response waits for the client to read some of what is sent
        self._stalled: Timer | None = None
        #: the cycle answering now (its head may be held for its body: response_writes)
        self._answering_cycle: RequestResponseCycle | None = None
        self._stopping = False  # the server is stopping
        # last: httptools looks the chunk callbacks up when uvicorn makes the parser
        super().__init__(*args, **kwargs)

    # --- the connection -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_since = self.clock.monotonic()
        self._arm_head_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._ahead = b""
        if self._stalled is not None:
            self._stalled.cancel()
        # the request answered, and any pipelined behind it (uvicorn's ``cycle`` is the
        # last one parsed)
        for cycle in {self._answering_cycle, self.cycle, *(c for c, _ in self.pipeline)}:
            if cycle is not None and not cycle.response_complete:
                hang_up = _hang_up(cycle)
                if hang_up is not None:
                    hang_up.hung_up()
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._stalled is None:
            self._stalled = self.clock.call_later(self.header_timeout, self._stop_sending)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._stalled is not None:
            self._stalled.cancel()
            self._stalled = None

    def _stop_sending(self) -> None:
        """A client that took none of its response for ``header_timeout``: cut off (the
        rest is dropped: closing would wait for it to be read)."""
        self._stalled = None
        log_event("http.timeout", client=self._peer(), phase="response")
        self.transport.abort()

    def data_received(self, data: bytes) -> None:
        if self._head_since is None and self._phase != "body":
            self._head_since = self.clock.monotonic()  # the first byte of the next request
        self._dropped = False
        if self._refusing:
            return  # what follows a refused head is never read
        if self._ahead:  # (reading resumed, to hear of a hang-up): it waits behind
            if len(self._ahead) + len(data) > MAX_AHEAD_BYTES:
                log_event("http.too_far_ahead", client=self._peer())
                self.transport.close()
                return
            self._ahead += data
            return
        view = memoryview(data)
        while view and not self._dropped and not self.transport.is_closing():
            holding = self._holding()
            if holding and self._open_bytes >= MAX_HEAD_BYTES:
                self._refuse()  # what is open has all it may have, and goes on
                return
            if self._phase == "body" and not self._chunked:
                size = self._body_left or len(view)  # llhttp reports all of such a body
            else:
                size = min(FEED_BYTES, MAX_HEAD_BYTES - self._open_bytes)
                if self._answering():
                    size = min(size, PIPELINED_FEED_BYTES)
            piece, view = view[:size], view[size:]
            self._slice_body = 0
            self._slice_ended = False
            super().data_received(piece)  # type: ignore[arg-type]  # httptools takes a view
            if self._refusing:
                return
            outside_body = len(piece) - self._slice_body
            if self._slice_ended:  # all of it may belong to what opened since
                self._open_bytes = outside_body if self._holding() else 0
            elif self._holding():  # (a request line may have begun in it)
                self._open_bytes += outside_body
            if self._open_bytes > MAX_HEAD_BYTES:
                self._refuse()
                return
            if self.pipeline and view:
                # a request waits behind the one answered: what follows waits unparsed, and
                # no deadline runs for a head Core is not reading. Reading stays paused (as
                # uvicorn paused it) unless the answer's handler waits to hear of a hang-up.
                self._ahead = bytes(view)
                self._head_since = None
                self._disarm()
                self._read_while_ahead()
                return
        if self._head_since is not None and not self._dropped:
            self._arm_head_deadline()  # a head still to come: only then a timer

    # --- the parser's callbacks -----------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._phase = "head"
        self._headers = 0
        if self._head_since is None:  # pipelined behind the request that just ended
            self._head_since = self.clock.monotonic()

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers += 1
        if self._headers > MAX_HEADERS:  # the parser stops; uvicorn would answer 400
            raise _TooManyHeaders
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._phase = "body"
        self._slice_ended = True
        self._head_since = None
        self._disarm()
        length = None
        self._chunked = False
        for name, value in self.headers:
            if name == b"transfer-encoding":
                self._chunked = True
            elif name == b"content-length":
                with contextlib.suppress(ValueError):  # llhttp checked it; only a slice size
                    length = int(value)
        self._body_left = None if self._chunked else length
        scope = cast(dict[str, Any], self.scope)  # uvicorn's TypedDict has no extensions
        scope.setdefault("extensions", {})[EXTENSION] = HangUp(self.flow.resume_reading)
        before = self.cycle
        super().on_headers_complete()
        if self.cycle is not before:  # a request's response (not an upgrade): one write
            self.cycle.transport = HeadWithBody(self.transport)  # type: ignore[assignment]

    def on_body(self, body: bytes) -> None:
        self._slice_body += len(body)
        if self._body_left is not None:
            self._body_left -= len(body)
        super().on_body(body)

    def on_chunk_complete(self) -> None:
        self._slice_ended = True

    def on_message_complete(self) -> None:
        self._phase = "idle"
        self._slice_ended = True
        self._body_left = None
        super().on_message_complete()

    def handle_websocket_upgrade(self) -> None:
        self._dropped = True  # the WebSocket protocol has the connection from here
        super().handle_websocket_upgrade()
        upgraded = self.transport.get_protocol()
        conn = getattr(upgraded, "conn", None)  # uvicorn's websockets ServerProtocol
        if (conn is not None and conn.handshake_exc is not None
                and not getattr(upgraded, "handshake_initiated", True)):
            # websockets refused the head (a header line over its 8 KiB, over 128
            # headers, a body, ...) and queued its answer (431, or none), which uvicorn
            # never sends: send it, and close, else the socket would be held for good
            log_event("http.upgrade_refused", client=self._peer(),
                      reason=str(conn.handshake_exc)[:100])
            self.transport.write(b"".join(conn.data_to_send()))
            self.transport.close()
            return
        # the handshake (the app accepting or refusing) is owed within the head's time too
        self.clock.call_later(self.header_timeout, self._handshake_done, upgraded)

    def _handshake_done(self, upgraded: asyncio.BaseProtocol) -> None:
        if not getattr(upgraded, "handshake_complete", True) and not self.transport.is_closing():
            log_event("http.timeout", client=self._peer(), phase="handshake")
            self.transport.close()

    def _unsupported_upgrade_warning(self) -> None:
        self._dropped = True  # uvicorn drops the rest of the data after such a head
        super()._unsupported_upgrade_warning()

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: ASGI3Application) -> None:
        self._answering_cycle = cycle
        super()._start_asgi_task(cycle, cast(ASGI3Application, functools.partial(
            self._answer, cycle, cast(ASGIApp, app))))

    async def _answer(self, cycle: RequestResponseCycle, app: ASGIApp, scope: Scope,
                      receive: Receive, send: Send) -> None:
        try:
            await app(scope, receive, send)
        except asyncio.CancelledError:
            if not self._stopping:
                raise
            if not cycle.response_started:
                await self.stopped_answer(scope, receive, send)
            elif not cycle.response_complete:  # cut off: the stop waits for no reader
                self.transport.abort()
                cycle.disconnected = True  # (uvicorn would hear of it a step later)

    def shutdown(self) -> None:
        self._stopping = True
        answering = self._answering_cycle
        if answering is not None and not answering.response_complete:
            # its answer ends the connection: uvicorn turns keep-alive off only for the last
            # request it parsed, so requests pipelined behind this one would start next
            answering.keep_alive = False
        super().shutdown()

    def _write_held_head(self) -> None:
        """A head held for its body goes out now: its response is complete (a ``HEAD``'s
        has no body), or the connection writes on its own next (a 431, a 400)."""
        cycle = self._answering_cycle
        if cycle is not None and isinstance(cycle.transport, HeadWithBody):
            cycle.transport.flush()

    def send_400_response(self, msg: str) -> None:
        if self._headers > MAX_HEADERS:
            self._refuse("http.too_many_headers")
            return
        self._write_held_head()
        super().send_400_response(msg)

    def on_response_complete(self) -> None:
        self._write_held_head()
        last = not self.pipeline
        super().on_response_complete()
        if self._refusing and last:
            self._send_refusal()
        elif self._phase == "body" and self.cycle.response_complete:
            # answered before its body was read: the rest of it is owed within the
            # keep-alive timeout, however slowly it comes
            self._disarm()
            self._deadline = self.clock.call_later(self.timeout_keep_alive, self._expire)
        if self._ahead and not self.transport.is_closing():
            if self.pipeline:  # (uvicorn resumed reading for the one it started)
                self._read_while_ahead()
            else:
                ahead, self._ahead = self._ahead, b""
                self.data_received(ahead)  # the next requests, as if read now

    def _read_while_ahead(self) -> None:
        """While requests wait unparsed: reading paused, unless the request answered
        waits to hear of a hang-up (then what comes waits too, up to its bound)."""
        hang_up = _hang_up(self._answering_cycle)
        if hang_up is not None and hang_up.awaited:
            self.flow.resume_reading()
        else:
            self.flow.pause_reading()

    # --- the bounds -------------------------------------------------------------------------

    def _holding(self) -> bool:
        """Whether the parser is in a section whose bytes it keeps: a head, or a chunked
        body's framing and trailers."""
        return self._phase == "head" or (self._phase == "body" and self._chunked)

    def _arm_head_deadline(self) -> None:
        if self._deadline is None and self._head_since is not None:
            left = self._head_since + self.header_timeout - self.clock.monotonic()
            self._deadline = self.clock.call_later(left, self._expire)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _answering(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete

    def _expire(self) -> None:
        self._deadline = None
        if self._phase == "idle" and self._answering():
            self._head_since = None  # blank lines while a response is on its way: the
            return  # next request's time begins with its own first byte
        if not self.transport.is_closing():
            log_event("http.timeout", client=self._peer(), phase=self._phase)
            self.transport.close()

    def _refuse(self, event: str = "http.head_too_large") -> None:
        log_event(event, client=self._peer(), phase=self._phase)
        if self._phase != "head":
            self.transport.close()  # trailers: the request itself cannot be finished
        elif self._answering() or self.pipeline:
            self._refusing = True  # pipelined: answered 431 after the requests before it
            self.flow.pause_reading()
        else:
            self._send_refusal()

    def _send_refusal(self) -> None:
        self._write_held_head()
        if not self.transport.is_closing():
            self.transport.write(b"".join([
                b"HTTP/1.1 431 Request Header Fields Too Large\r\n",
                *(name + b": " + value + b"\r\n"
                  for name, value in self.server_state.default_headers),
                b"content-type: text/plain; charset=utf-8\r\n",
                b"content-length: %d\r\n" % len(_TOO_LARGE),
                b"connection: close\r\n\r\n", _TOO_LARGE]))
            self.transport.close()

    def _peer(self) -> str | None:
        return self.client[0] if self.client else None


def _hang_up(cycle: RequestResponseCycle | None) -> HangUp | None:
    """The :class:`~.hangup.HangUp` in a request's scope (None for no request)."""
    return None if cycle is None else hang_up_of(cast(dict[str, Any], cycle.scope))


class _TooManyHeaders(Exception):
    """Raised in the parser's callback to stop it (see :meth:`BoundedHttpProtocol.on_header`)."""


def bounded_http(header_timeout: float, clock: Clock, stopped_answer: ASGIApp
                 ) -> type[BoundedHttpProtocol]:
    """The protocol class to give uvicorn (``http=``) for this ``--header-timeout``, timed
    by Core's ``clock``; a request cut off by the server's stop is answered
    ``stopped_answer``."""

    class Protocol(BoundedHttpProtocol):
        pass

    Protocol.header_timeout = header_timeout
    Protocol.clock = clock
    Protocol.stopped_answer = staticmethod(stopped_answer)
    return Protocol
