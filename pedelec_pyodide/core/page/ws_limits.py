"""The WebSocket protocol under the bridge: uvicorn's websockets (Sans-I/O) protocol,
bounded frame by frame.

uvicorn hands the app whole messages; what it does below them costs Core as much, and
the app never sees it: it answers every ping at once, into a write buffer that grows
without bound for a client that does not read, and it parses every frame of a read (up
to 256 KiB: some 40,000 empty fragments, ~0.1 s) in one step of the event loop.
:class:`BoundedWebSocket` is a thin subclass of uvicorn's class (websockets still parses
every byte) that adds, per connection:

- **every frame counts**: pings, pongs and continuation frames are charged to the
  connection's rate limit, the :class:`~.ratelimit.TokenBucket` the app charges its
  messages to, and so are messages past the close (uvicorn reads on for 10 s, for the
  client's answer to it, and drops them); past the limit's cut-off the connection is
  closed (1008), and nothing more it sends is parsed;
- **no buffered pongs**: a ping from a client whose write buffer is over its high-water
  mark (it does not read what Core sends) closes the connection, its socket dropped;
- **a bounded step**: a read is parsed in slices of :data:`SLICE_BYTES`, one slice per
  step of the event loop (reading paused meanwhile: a read of 256 KiB of pings was ~0.1 s
  in one step), and parsing stops once a message waits for the app, until the app takes
  it (uvicorn's own back-pressure, slice by slice instead of read by read). The socket's
  reading is paused only when more arrives while a message waits: uvicorn pauses and
  resumes it for every message (two ``epoll_ctl`` calls), though a page that sent a
  result mostly waits for what comes back;
- **a deadline** the app may set (the bridge's hello deadline): past it the connection
  is closed, whatever the client sends meanwhile;
- **closes that end**: a socket closed with bytes its client never reads is dropped
  after :data:`CLOSE_GRACE` seconds instead of waiting for it for ever;
- **messages taken as they are parsed**: the app may set :attr:`BoundedWebSocket.take`,
  which is offered a whole text message before it is queued for ``receive()``, while
  nothing is queued before it; a message it takes is handled there and then, in the step
  that read it, without a wake-up of the app's task (the bridge takes a page's short
  frames so, :mod:`.bridge`). One message per step at most: the others of the slice
  are queued for ``receive()``, which the app takes one per step, so a flood of small
  frames is handled at the app's pace, never a slice of them in one step;
- **nothing received is lost**: when a write meets the client's reset, asyncio drops
  the socket with what the client sent before still unread in the kernel (not read yet,
  or reading paused for the app); that (at most :data:`LEFT_BYTES`) is read and handed to
  the app before the disconnect.

The app finds its connection's :class:`BoundedWebSocket` with :func:`frame_guard`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any, ClassVar

from starlette.types import Scope
from uvicorn._types import ASGIReceiveEvent, ASGISendEvent
from uvicorn.config import Config
from uvicorn.protocols.utils import ClientDisconnected
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from uvicorn.server import ServerState
from websockets.frames import Frame
from websockets.http11 import Request
from websockets.protocol import State

from ..clock import Clock, Timer, wait_for
from ..config import CoreConfig
from ..log import log_event
from .connection import CLOSE_POLICY
from .ratelimit import TokenBucket

#: the most of a read parsed in one step (4 KiB: ~700 of the smallest frames, ~2 ms)
SLICE_BYTES = 4096
#: seconds a closing socket may keep bytes its client does not read
CLOSE_GRACE = 5.0
#: the most read from a broken connection's kernel buffer (a reloading page's last results)
LEFT_BYTES = 64 * 1024
#: the most frames one message may come in (the WebSocket library bounds its bytes, not
#: its frames: uvicorn keeps each, ~40 bytes more than its payload, empty ones too)
MAX_FRAGMENTS = 4096
#: the close codes for a text message that is not UTF-8, and for one too big to take
CLOSE_NOT_UTF8 = 1007
CLOSE_TOO_BIG = 1009
#: where the app's scope holds the guard (``scope["extensions"][EXTENSION]["guard"]``)
EXTENSION = "pedelec.frames"


def frame_guard(scope: Scope) -> BoundedWebSocket | None:
    """The :class:`BoundedWebSocket` under this WebSocket scope (None under a protocol
    of another kind: Core served other than by :func:`~.server.uvicorn_config`)."""
    guard = (scope.get("extensions") or {}).get(EXTENSION, {}).get("guard")
    return guard if isinstance(guard, BoundedWebSocket) else None


def bounded_websocket(config: CoreConfig) -> type[BoundedWebSocket]:
    """The protocol class for uvicorn's ``ws=``, with Core's rate limit."""

    class Configured(BoundedWebSocket):
        rate = config.rate_limit
        burst = float(config.rate_burst)
        clock = config.clock

    return Configured


class BoundedWebSocket(WebSocketsSansIOProtocol):
    """uvicorn's websockets protocol with every frame counted (see the module)."""

    rate: ClassVar[float] = 200.0
    burst: ClassVar[float] = 400.0
    #: Core's clock, which times the app's deadlines and the closes (set by
    #: :func:`bounded_websocket`)
    clock: ClassVar[Clock]

    def __init__(self, config: Config, server_state: ServerState, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__(config, server_state, app_state, _loop)
        #: the connection's rate limit, which the app charges its messages to
        self.bucket = TokenBucket(self.rate, self.burst, self.clock)
        self._unread: bytes | None = None  # what a read brought that is not parsed yet
        self._unread_at = 0
        self._next_slice: asyncio.Handle | None = None  # the step that parses the next one
        self._deadline: Timer | None = None
        self._reaper: Timer | None = None
        self._cut_off = False  # closed here: nothing more is parsed
        self._lost = False  # the socket is gone: what is left is read, nothing written
        #: offered each whole text message first (see the module); True: it took it
        self.take: Callable[[str], bool] | None = None
        self._handing_over = False  # receive() returns a message: none is taken meanwhile
        self._taken = False  # a message was taken in this step of the loop

    # --- what the app may set ----------------------------------------------------------

    def start_deadline(self, seconds: float, event: str, reason: str) -> None:
        """Close the connection (1008 ``reason``, logged as ``event``) in ``seconds``
        unless :meth:`cancel_deadline` comes first."""
        self.cancel_deadline()
        self._deadline = self.clock.call_later(seconds, self._expire, event, reason)

    def cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expire(self, event: str, reason: str) -> None:
        self._deadline = None
        if not self._cut_off and not self.transport.is_closing():
            log_event(event)
            self._cut(reason)

    # --- reading, slice by slice ---------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._cut_off:  # what a client sends once it is cut off is not parsed
            return
        self._taken = False
        if self._unread is None:
            if self.read_paused:  # a message waits for the app: this waits for it to take it
                self._unread, self._unread_at = data, 0
                self.transport.pause_reading()
                return
            if len(data) <= SLICE_BYTES:
                super().data_received(data)
                return
            self._unread, self._unread_at = data, 0
        else:  # reads resumed while slices waited (uvicorn, for a close): keep the order
            self._unread = self._unread[self._unread_at:] + data
            self._unread_at = 0
            if self._next_slice is not None:  # a step is already on its way
                self.transport.pause_reading()
                return
        self._feed()

    def _feed(self) -> None:
        """Parse one slice of what waits; the next in a later step of the loop, with
        reading paused until all is parsed; none while a message waits for the app."""
        self._next_slice = None
        self._taken = False
        data, at = self._unread, self._unread_at
        if data is None:  # cut off, or the socket gone, since this step was planned
            return
        transport = self.transport
        while (at < len(data) and self._unread is not None and not self.read_paused
               and not transport.is_closing()):
            super().data_received(data[at:at + SLICE_BYTES])
            at += SLICE_BYTES
            # the upgrade's head (64 KiB at most: http_limits) is parsed at once: the HTTP
            # layer reads websockets' verdict on it as it hands the connection over
            if self.handshake_initiated:
                break
        if self._unread is None or at >= len(data) or transport.is_closing():
            self._unread = None
            if not self.read_paused and not transport.is_closing() and not self._cut_off:
                transport.resume_reading()
            return
        self._unread_at = at
        transport.pause_reading()
        if not self.read_paused:  # else receive() goes on once the app takes its message
            self._next_slice = self.loop.call_soon(self._feed)

    def send_receive_event_to_app(self) -> None:
        if self.curr_msg_data_type == "text" and not self.close_sent:
            try:
                text = (self.frames[0] if len(self.frames) == 1 else b"".join(self.frames)
                        ).decode()
            except UnicodeDecodeError:  # (uvicorn logs a traceback for each)
                self.frames = []
                log_event("bridge.not_utf8", client=self._peer())
                self._cut("a text message that is not UTF-8", CLOSE_NOT_UTF8)
                return
            self.frames = []
            take = self.take
            if (take is not None and self.queue.empty() and not self._handing_over
                    and not self._taken and take(text)):
                self._taken = True
                return
            # the message waits: parsing stops, the socket reads on (see data_received)
            self.read_paused = True
            self.queue.put_nowait({"type": "websocket.receive", "text": text})
            return
        if self.close_sent:
            # uvicorn drops the message, and reads on for the client's answer to the
            # close (10 s): charged here, the app no longer charging it, so a client cut
            # off for flooding is not parsed for those 10 s at the rate it sends
            self._counted("messages past the close")
        else:
            # the message waits: parsing stops, the socket reads on (see data_received)
            self.read_paused = True
        super().send_receive_event_to_app()

    async def receive(self) -> ASGIReceiveEvent:
        if not self.queue.empty():  # one message per step: the others' work goes between
            await asyncio.sleep(0)
        message = await self.queue.get()
        if self.read_paused and self.queue.empty():
            self.read_paused = False
            if self._unread is not None:
                if self._next_slice is None:
                    # what follows it is parsed now: the message returned goes first
                    self._handing_over = True
                    try:
                        self._feed()
                    finally:
                        self._handing_over = False
            elif not self._cut_off:
                self.transport.resume_reading()
        return message

    # --- frames the app never sees --------------------------------------------------------

    def handle_cont(self, event: Frame) -> None:
        if not self._counted("continuation"):
            return
        if len(self.frames) >= MAX_FRAGMENTS:
            log_event("bridge.too_many_fragments", client=self._peer())
            self._cut(f"a message in over {MAX_FRAGMENTS} frames", CLOSE_TOO_BIG)
            return
        super().handle_cont(event)

    def handle_ping(self) -> None:
        if not self._counted("ping") or self._lost:
            return
        if not self.writable.is_set():  # over the high-water mark: it does not read
            log_event("bridge.not_reading", pong=True,
                      buffered=self.transport.get_write_buffer_size())
            self._cut("not reading: no pongs are buffered for a client that does not read")
            return
        super().handle_ping()

    def handle_pong(self, event: Frame) -> None:
        if self._counted("pong"):
            super().handle_pong(event)

    def _counted(self, frames: str) -> bool:
        """Charge one frame to the rate limit; False when the connection is (now) cut."""
        if self._cut_off:
            return False
        bucket = self.bucket
        if bucket.flooded(bucket.spend()):
            log_event("bridge.flood", frames=frames)
            self._cut("rate limit exceeded")
            return False
        return True

    def _peer(self) -> str | None:
        return self.client[0] if self.client else None

    def cut_off(self, code: int, reason: str) -> None:
        """Close now with ``code``, reading nothing more (see :meth:`_cut`): for a
        connection the app refuses outright, whose client may be sending a frame of MiBs."""
        self._cut(reason, code)

    def _cut(self, reason: str, code: int = CLOSE_POLICY) -> None:
        """Close now: a close frame (``code``) for a client that reads, and the socket in any
        case (dropped at once if bytes are still unsent: the client does not read). Past
        a close frame already sent, reading stops and the write side is shut (the client
        reads the close, then the end), and the close timer drops the socket: closed now
        with bytes unread, it would be reset, and the close frame lost."""
        self._unread = None
        if self.close_sent:
            self._cut_off = True
            self.transport.pause_reading()
            if not self._lost and not self.transport.is_closing():
                self.transport.write_eof()
            return
        self._cut_off = self.close_sent = True
        self.conn.fail(code, reason)
        self.queue.put_nowait({"type": "websocket.disconnect", "code": code, "reason": reason})
        if self._lost:
            return
        self.transport.write(b"".join(self.conn.data_to_send()))
        if self.transport.get_write_buffer_size():
            self.transport.abort()
        else:
            self.transport.close()

    # --- writing without a task ------------------------------------------------------------

    def can_send(self) -> bool:
        """Whether a message may be written now, as :meth:`send` would write it without
        waiting: open, and the client reading what it is sent (under the high-water mark)."""
        return (self.writable.is_set() and self.handshake_complete and not self.close_sent
                and self.initial_response is None and not self.disconnected
                and not self.transport.is_closing() and self.conn.state is State.OPEN)

    def send_texts(self, texts: list[str]) -> None:
        """Write text messages at once, in one write to the socket (one system call for a
        burst, e.g. a turn's delta and its next request); only when :meth:`can_send`."""
        conn = self.conn
        for text in texts:
            conn.send_text(text.encode())
        self.transport.write(b"".join(conn.data_to_send()))

    # --- closes that end ----------------------------------------------------------------

    def handle_connect(self, event: Request) -> None:
        super().handle_connect(event)
        if self.response.status_code == 101:  # the app runs: it may find the guard
            self.scope["extensions"][EXTENSION] = {"guard": self}

    async def send(self, message: ASGISendEvent) -> None:
        if message["type"] == "websocket.send" and self.transport.is_closing():
            raise ClientDisconnected  # the socket is going (asyncio logs every such write)
        closing = message["type"] == "websocket.close" and self.handshake_complete
        if closing and not self.writable.is_set():
            # the close frame would wait behind bytes the client does not read
            try:
                await wait_for(self.clock, self.writable.wait(), CLOSE_GRACE)
            except TimeoutError:
                self.close_sent = True
                self.transport.abort()
                return
        await super().send(message)
        if closing and self.close_timer is not None:  # no answer to the close: drop it
            self.close_timer.cancel()
            # uvicorn's own timer, armed again: on the loop, as uvicorn arms, cancels and
            # types it (its keep-alive pings run on the loop's time too)
            self.close_timer = self.loop.call_later(self.close_timeout, self.transport.abort)
            # uvicorn reads on for the answer: it may be here
            if self._unread is not None and self._next_slice is None:
                self._feed()

    def handle_close(self, event: Frame) -> None:
        super().handle_close(event)
        self._reap()

    def handle_parser_exception(self) -> None:
        super().handle_parser_exception()
        self._reap()

    def keepalive_timeout(self) -> None:
        super().keepalive_timeout()
        self._reap()

    async def run_asgi(self) -> None:
        await super().run_asgi()
        self._reap()

    def _reap(self) -> None:
        """uvicorn closed the transport: one with bytes unsent waits for its client to
        read them, which a client that does not read never does."""
        transport = self.transport
        if (self._reaper is None and transport.is_closing()
                and transport.get_write_buffer_size()):
            self._reaper = self.clock.call_later(CLOSE_GRACE, transport.abort)

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        try:
            if exc is not None and self.handshake_complete and not self._cut_off:
                self._read_what_is_left()
        finally:  # whatever those frames did, the app hears of the disconnect
            self._unread = None
            if self._next_slice is not None:
                self._next_slice.cancel()
                self._next_slice = None
            self.cancel_deadline()
            if self._reaper is not None:
                self._reaper.cancel()
                self._reaper = None
            super().connection_lost(exc)

    def _read_what_is_left(self) -> None:
        """The socket broke (a write met the client's reset): frames the client sent
        before may still be in the kernel (Linux keeps them readable after a reset), not
        yet read, or not read because reading was paused for the app, and asyncio will
        not read them now. Read them, before uvicorn queues the disconnect, so the app
        handles every frame that arrived."""
        sock = self.transport.get_extra_info("socket")
        left = bytearray()
        if sock is not None:
            with contextlib.suppress(OSError), sock.dup() as raw:  # asyncio's takes no recv
                while len(left) < LEFT_BYTES and (got := raw.recv(LEFT_BYTES - len(left))):
                    left += got
        data = bytes(left) if self._unread is None else self._unread[self._unread_at:] + left
        self._unread = None
        for at in range(0, len(data), SLICE_BYTES):  # the rate limit still applies
            if self._cut_off:
                break
            super().data_received(data[at:at + SLICE_BYTES])
