"""The WebSocket endpoint ``/pedelec/v1/bridge``: carries one page's frames between its
socket and a :class:`~.connection.PageConnection`, which speaks the protocol.

Here: the Origin check before the handshake (Core's own origin, plus the
``--allow-origin`` list; a request without Origin, i.e. not from a browser, is let in),
the hello deadline (``--hello-timeout``, kept by the WebSocket protocol, :mod:`.ws_limits`,
which also charges the frames that are not messages to the connection's rate limit),
long frames parsed in a worker thread, the store's round trip before a first hello, and
sending what the connection queues. Every frame received before the socket closed is
handled, even when sending to the page failed first: only Core's own close ends reading.

Once the page's session is set up, a short frame (a tool's result, mostly) is handled as
the WebSocket protocol parses it (:meth:`BridgeConnection.take`), in the step that read
it: the request it resolves wakes its waiter one loop step sooner, with no wake-up of
the serve loop's task in between. A frame that needs a wait (a long one parsed in a
thread, one with new regular expressions), or arrives while one is handled, goes the
serve loop's way, in order.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from urllib.parse import urlsplit

from starlette.websockets import WebSocket

from ... import protocol
from ..clock import wait_for
from ..cluster import Node
from ..log import log_event
from ..offload import LARGE_CHARS, WorkerThreads
from .clients import client_key
from .connection import CLOSE_POLICY, PageConnection
from .ws_limits import frame_guard

# how long Core offers a close frame to a page before it stops waiting for the page to read
CLOSE_WAIT = 10.0
#: frames queued in one step of the event loop go out in one write of about this many
#: characters at most (a page's burst: one system call; a larger one: one copy at a time)
WRITE_BATCH_CHARS = 64 * 1024
#: frames longer than this (characters) are parsed off the event loop. Parsing is linear,
#: but a 1 MiB hello of tiny subschemas or patterns takes ~0.5 s to check: the other
#: connections and /health must not wait for it (a thread gives the loop the GIL every
#: few ms). Two threads for all connections: a flood of big frames queues, nothing else
#: (Core's own work on large values has threads of its own, offload.py). The garbage
#: collector is paused while a frame is parsed (offload.py says why).
PARSE_IN_THREAD_CHARS = LARGE_CHARS
_PARSER = WorkerThreads(2, "pedelec-parse")
#: a short frame with more new regular expressions than the loop checks goes to a thread
#: of its own: a flood of them (each client's bounded by --pattern-rate) then holds at
#: most one thread against the event loop, and never delays other pages' long frames
_PATTERNS = WorkerThreads(1, "pedelec-parse-patterns")


def normal_origin(origin: str) -> str:
    """An origin as the allow-list holds it and a request's ``Origin`` is compared."""
    return origin.rstrip("/").lower()


def origin_allowed(headers: Mapping[str, str], allowed: frozenset[str]) -> bool:
    """Same origin as the Host the request came to, or listed, or no Origin at all.

    The one Origin rule: the bridge, MCP and ``GET /pedelec/v1/origin-check`` (which the
    page asks before it connects) all apply it. ``allowed``: :func:`normal_origin`'s.
    """
    origin = headers.get("origin")
    if origin is None:
        return True
    origin = normal_origin(origin)
    if origin in allowed or "*" in allowed:
        return True
    host = headers.get("host", "").lower()
    parts = urlsplit(origin)
    return bool(host) and parts.scheme in ("http", "https") and parts.netloc == host


class BridgeConnection:
    """One page's WebSocket, served: the :class:`~.connection.Output` of its connection."""

    def __init__(self, websocket: WebSocket, node: Node) -> None:
        self.websocket = websocket
        self.registry = registry = node.registry
        # a resume of a session another node holds takes it over (a shared store)
        self.leases = node.leases
        #: the protocol under the socket: the rate limit it shares, the hello deadline
        self.guard = frame_guard(websocket.scope)
        address = websocket.client
        self.page = PageConnection(
            registry, self, bucket=None if self.guard is None else self.guard.bucket,
            client=client_key(None if address is None else address.host))
        #: counted among the connections that have not said hello (Arrivals) until it has
        self._awaiting_hello = False
        self._flusher: asyncio.Task[None] | None = None
        self._planned: asyncio.Handle | None = None  # the call of _write_out on its way
        self._handling = False  # the serve loop is handling a frame (it may be waiting)
        #: the frame the serve loop gets next was begun on the loop (take) and holds new
        #: regular expressions: it goes straight to a thread
        self._patterns_next = False
        #: the frame the serve loop gets next was charged to its client's reading
        #: (take): how long it waits before it is handled
        self._delay_next: float | None = None

    # --- the Output side ----------------------------------------------------------------

    def wake(self) -> None:
        if self._flusher is not None or self._planned is not None:
            return  # what is under way sends this frame too, in order
        if self.guard is None or self.page.closing is not None:
            self._flusher = asyncio.ensure_future(self._flush())
        else:  # at the end of this step, the frames queued in it together
            self._planned = asyncio.get_running_loop().call_soon(self._write_out)

    def flush(self) -> None:
        """The step that queued frames waits for the page next: they go out now, not at
        the end of the step (one turn of the event loop less before the page has them)."""
        planned = self._planned
        if planned is not None:
            planned.cancel()
            self._write_out()

    def _write_out(self) -> None:
        """Write what the outbox holds at once, without a task: one write per
        :data:`WRITE_BATCH_CHARS`. What cannot go now (the page reads too slowly, a close
        to send) is left to :meth:`_flush`, which waits."""
        self._planned = None
        page = self.page
        guard = self.guard
        if self._flusher is not None or guard is None or not page.open:
            return
        drained = False
        try:
            while not drained and page.closing is None and guard.can_send():
                frames: list[str] = []
                size = 0
                while size < WRITE_BATCH_CHARS:
                    frame = page.next_frame()
                    if frame is None:
                        drained = True
                        break
                    frames.append(frame)
                    size += len(frame)
                if frames:
                    guard.send_texts(frames)
        except Exception:  # the peer is gone; the receive loop sees the disconnect
            page.ended()
            return
        if not drained or page.closing is not None:
            self._flusher = asyncio.ensure_future(self._flush())

    def abort(self) -> None:
        stuck = self._flusher  # waiting for the page to read; the close replaces it
        if stuck is not None:
            stuck.cancel()
        self._flusher = asyncio.ensure_future(self._flush())

    async def _flush(self) -> None:
        send = self.websocket.send
        page = self.page
        try:
            while (frame := page.next_frame()) is not None:
                await send({"type": "websocket.send", "text": frame})
            if page.closing is not None:
                code, reason = page.closing
                await wait_for(
                    self.registry.config.clock,
                    send({"type": "websocket.close", "code": code, "reason": reason}),
                    CLOSE_WAIT)
                page.ended()
        except Exception:  # the peer is gone; the receive loop sees the disconnect
            page.ended()
        finally:
            if self._flusher is asyncio.current_task():
                self._flusher = None

    # --- the receive side ---------------------------------------------------------------

    async def serve(self, allowed_origins: frozenset[str]) -> None:
        websocket = self.websocket
        page = self.page
        try:  # whatever happens, the connection ends here (its client's share with it)
            if not origin_allowed(websocket.headers, allowed_origins):
                log_event("bridge.origin_refused", origin=websocket.headers.get("origin"),
                          host=websocket.headers.get("host"))
                await websocket.close(code=CLOSE_POLICY)
                return
            await websocket.accept()
            if not self.registry.arrivals.enter(page.client, self, self._make_room):
                self._turn_away("bridge.too_many_arriving", "too many connections of this "
                                "client (or in all) have not said hello yet; try again")
                return
            self._awaiting_hello = True
            if self.guard is not None:
                timeout = self.registry.config.hello_timeout
                self.guard.start_deadline(timeout, "bridge.hello_timeout",
                                          f"no hello within {timeout:g} s (--hello-timeout)")
                self.guard.take = self.take
            # not `page.open`: a failed send (the page is gone) leaves frames to read
            while page.closing is None:
                message = await websocket.receive()
                if message["type"] == "websocket.disconnect" or page.closing is not None:
                    break
                data = message.get("text")
                if data is None:
                    data = message.get("bytes") or b""
                self._handling = True
                going_on = await self.receive(data)
                self._handling = False
                if not going_on:
                    break
                del message, data  # an idle connection keeps no frame (each up to MiBs)
        finally:
            self._arrived()
            if self.guard is not None:
                self.guard.take = None
            self.flush()  # the frames queued last, before they are dropped
            flusher = self._flusher
            if flusher is not None:  # let the last frames (and a close) go out
                with contextlib.suppress(Exception):
                    await wait_for(self.registry.config.clock, asyncio.shield(flusher), 2.0)
            page.disconnected()

    def take(self, data: str) -> bool:
        """A text frame as the WebSocket protocol parses it: handled now when it can be
        without waiting (the session is set up, the frame is short and needs no new
        regular expression checked) and nothing is being handled before it; else False,
        and it is queued for the serve loop. A frame that cuts the connection off closes
        it (``page.closing``), and the serve loop stops at its next wake-up, as when Core
        closes a connection for any other reason."""
        page = self.page
        if (self._handling or page.session is None or page.closing is not None
                or len(data) > PARSE_IN_THREAD_CHARS):
            return False
        delay = page.read_delay(data)
        if delay > 0:  # queued first (nothing else is): the serve loop waits, then handles
            self._delay_next = delay
            return False
        parsed = page.parse_on_loop(data)
        if parsed is None:  # queued first (nothing else is): the serve loop's next
            self._patterns_next = True
            self._delay_next = 0.0  # charged already
            return False
        page.receive(data, parsed)
        return True

    async def receive(self, data: str | bytes) -> bool:
        """:meth:`PageConnection.receive`, a long frame parsed in a worker thread (frames
        of one connection are still handled one after the other, in order)."""
        page = self.page
        delay, self._delay_next = self._delay_next, None
        if delay is None:
            delay = page.read_delay(data)
        if delay > 0:
            await self.registry.config.clock.sleep(delay)
            if page.closing is not None:  # Core closed it meanwhile
                return False
        short = len(data) <= PARSE_IN_THREAD_CHARS
        begun, self._patterns_next = self._patterns_next, False
        # before hello, a frame that is not one is refused from a look at its type
        parsed = (page.parse_on_loop(data)
                  if not begun and (short or page.refuses_unparsed(data)) else None)
        if parsed is None:  # long, or short with many new regular expressions to check
            parsed = await (_PATTERNS if short else _PARSER).run(page.parse, data)
        hello = page.first_hello(parsed)
        if hello is not None:
            if hello.session_id is not None:
                if not await self.leases.take_over(hello.session_id, hello.resume_token):
                    # the store is out of reach: the page reconnects (with backoff) and
                    # resumes once it is back, keeping its session
                    log_event("session.resume_later", session=hello.session_id)
                    page.close(protocol.CLOSE_TRY_AGAIN, "the store is out of reach; resume again")
                    return False
            else:
                page.new_id = await self.leases.new_session_id()
        going_on = page.receive(data, parsed)
        if self._awaiting_hello and page.session is not None:  # a valid hello
            self._arrived()
            if self.guard is not None:
                self.guard.cancel_deadline()
        return going_on

    def _arrived(self) -> None:
        """No longer one of the connections that have not said hello (it has, or it
        closed)."""
        if self._awaiting_hello:
            self._awaiting_hello = False
            self.registry.arrivals.leave(self.page.client, self)

    def _make_room(self) -> None:
        """Closed, before its hello, for another client's new connection (Arrivals)."""
        self._awaiting_hello = False  # (no longer counted)
        self._turn_away("bridge.arrival_closed",
                        "Core makes room for other clients' pages; try again")

    def _turn_away(self, event: str, reason: str) -> None:
        """Close a connection before its hello: 1013 (try again), nothing more it sends
        read where Core's own protocol serves it."""
        log_event(event, client=self.page.client)
        if self.guard is not None:
            self.guard.cut_off(protocol.CLOSE_TRY_AGAIN, reason)
        else:
            self.page.close(protocol.CLOSE_TRY_AGAIN, reason)
