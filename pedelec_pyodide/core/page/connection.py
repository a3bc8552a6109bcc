"""Core's side of one page connection, wire protocol v1, without I/O.

A :class:`PageConnection` takes the page's frames in (:meth:`~PageConnection.receive`)
and queues Core's frames out (:meth:`~PageConnection.next_frame`, then a close): no
sockets, no Starlette, no waiting; the time comes from an injected clock. bridge.py
carries the frames between it and a WebSocket. Per connection: a frame-size limit, a
rate limit (a token bucket: over it a frame is refused with ``RATE_LIMITED``; a flood
that goes on is cut off with close code 1008), a bound on the frames queued for a page
that does not read them (and on those of all connections together: outboxes.py), and the
protocol itself. Per client address (clients.py): the new regular expressions in its tool
metadata that Core checks per second. Every bad frame gets an ``error`` frame; the
connection stays open. Before ``hello``, Core reads no more of a frame than its leading
``type``: anything but a hello is refused ``HELLO_REQUIRED`` unparsed.
"""

from __future__ import annotations

import dataclasses
import math
import re
import sys
from collections import deque
from collections.abc import Callable
from typing import Literal, NamedTuple, Protocol

from ... import protocol
from ...protocol import ProtocolError
from ...results import TOOL_RESULT_TOO_LARGE, is_error_result, tool_error
from ...schemas import PatternsOverBudget, charging_patterns
from ..log import log_event
from ..offload import LARGE_CHARS
from ..sessions import (
    DUPLICATE_HELLO,
    HELLO_REQUIRED,
    RATE_LIMITED,
    RESUME_REFUSED,
    TOO_MANY_SESSIONS,
    TURN_BUSY,
    TURN_ID_TAKEN,
    UNKNOWN_TOOL_REQUEST,
    UNKNOWN_TURN,
    CoreSession,
    Registry,
    SessionRefused,
    page_metadata,
)
from ..sessions.turns import start_turn
from ..store import JsonText, kept_json
from .ratelimit import TokenBucket

CLOSE_POLICY = 1008
# The limit is on a result, as the page checks it: its tool.result frame may exceed the
# frame limit by the envelope around it (type, id, handledBy).
RESULT_ENVELOPE_BYTES = 1024


def _frame_of(cls: type[protocol.Message]) -> re.Pattern[str]:
    """A frame of ``cls`` as the page's runtime writes it (the protocol's own head, not a
    copy of its key order), and the id it begins with: a frame Core refuses unparsed is
    traced back to its request or turn by it, so that that ends now rather than waiting
    for ever. Ids as Core and the runtime make them (URL-safe base64, hex)."""
    return re.compile(re.escape(protocol.frame_head(cls))
                      + rf'"([0-9A-Za-z_-]{{1,{protocol.MAX_ID_LENGTH}}})"')


_RESULT_FRAME = _frame_of(protocol.ToolResult)
_TURN_START_FRAME = _frame_of(protocol.TurnStart)
#: the frames whose tool metadata Core checks (charged to --metadata-rate)
_METADATA_FRAMES = frozenset({protocol.Hello.type, protocol.ToolsUpdate.type})
#: a turn a page starts is charged to its client's reading (--read-rate) this many times
#: its text's length: the work it sets off is several passes over the text (its /call
#: lines read, their requests made and checked, its history kept), the frame's one
TURN_WORK = 4
#: before hello, the most of a frame Core looks at (characters, or bytes of a binary frame)
PEEK_CHARS = 256
# a frame's leading "type" member, JSON whitespace allowed: all Core reads before hello
_LEADING_TYPE = re.compile(r'[ \t\n\r]*\{[ \t\n\r]*"type"[ \t\n\r]*:[ \t\n\r]*'
                           r'"([0-9A-Za-z._-]{1,64})"')


def leading_type(data: str | bytes) -> str | None:
    """The ``type`` a frame starts with (``{"type":"hello",...``), from its first
    :data:`PEEK_CHARS` only; None when it does not start so."""
    head = data[:PEEK_CHARS]
    found = _LEADING_TYPE.match(head if isinstance(head, str)
                                else head.decode("utf-8", "replace"))
    return found.group(1) if found else None


class _OffLoop(Exception):
    """A frame parsed on the event loop holds a regular expression Core has not checked."""


def _off_loop(characters: int) -> None:
    raise _OffLoop


class Output(Protocol):
    """Whoever sends a :class:`PageConnection`'s frames: the serve loop, or a test."""

    def wake(self) -> None:
        """Frames, or a close, wait in the outbox."""

    def abort(self) -> None:
        """The page does not read: give up the frame being sent; the close is next."""

    def flush(self) -> None:
        """What :meth:`wake` asked to send goes out now if it can (not at the step's end)."""


class Parsed(NamedTuple):
    """A frame as :meth:`PageConnection.parse` made it ready to handle."""

    message: protocol.ClientMessage | ProtocolError
    #: a hello's or tools.update's tools as the JSON text a session keeps, made with the
    #: parse, so off the event loop for a long frame (other messages have none)
    tools_json: str = ""
    client_json: str = "{}"  # a hello's client info, the same way
    result_json: str = ""  # a tool.result's result, the same way (Core keeps it as text)


class _Request(NamedTuple):
    """A pending request in a connection's queue, by its id."""

    id: str


class PageConnection:
    """Speaks protocol v1 with one page; a :class:`~.sessions.Connection` for its session."""

    def __init__(self, registry: Registry, output: Output,
                 bucket: TokenBucket | None = None, *, client: str) -> None:
        self.registry = registry
        self._output = output
        config = registry.config
        self.max_bytes = config.max_frame_bytes
        #: the rate limit; shared with the WebSocket protocol under the connection, which
        #: charges the frames that are not messages (bridge.py)
        self.bucket = bucket or TokenBucket(config.rate_limit, float(config.rate_burst),
                                            config.clock)
        #: the client (clients.client_key) this connection is from
        self.client = client
        # its client's budget for checking new regular expressions, until disconnected
        self._patterns: TokenBucket | None = registry.patterns.open(client)
        # and for checking tool metadata (hello, tools.update)
        self._metadata: TokenBucket | None = registry.metadata.open(client)
        # and for reading its frames (read_delay)
        self._reading: TokenBucket | None = registry.reading.open(client)
        self.session: CoreSession | None = None
        # refused frames are logged one a second at most: when the last line was, and how
        # many were refused since
        self._refusal_logged = -math.inf
        self._refusals_unlogged = 0
        self._outbox: deque[str | _Request] = deque()
        self.max_queued = config.max_queued_bytes
        # bytes of memory the outbox holds, with the frame being sent (next_frame)
        self._queued = 0
        self._sending = 0  # of which the frame being sent
        #: the close to send once the outbox is empty
        self.closing: tuple[int, str] | None = None
        #: False once frames no longer go out (the page's frames, already received, still
        #: count until Core closes the connection: ``closing``)
        self.open = True
        self._took_over = False  # this connection has asked for a take-over already
        #: the id (and lease) of the session it may create, from the store (bridge.py)
        self.new_id: str | None = None

    # --- the Connection side (sessions call these) --------------------------------------

    def send(self, frame: str) -> None:
        self._queue(frame, sys.getsizeof(frame))

    def send_request(self, request_id: str) -> None:
        # Queued by its id, its frame taken as it goes out: the pending request holds that
        # frame anyway (to send it again after a reload), so the queue counts only the id.
        # Counted whole, a session's pending frames sent again at a resume (up to
        # --max-pending of --max-frame-bytes each) went over --max-queued-bytes at once,
        # before the page could read any: it was cut off at every reconnection.
        self._queue(_Request(request_id), sys.getsizeof(request_id))

    def _queue(self, entry: str | _Request, size: int) -> None:
        if not self.open or self.closing is not None:
            return
        if self._queued and self._queued + size > self.max_queued:  # one frame always fits
            self._cut_off(CLOSE_POLICY, f"not reading: over {self.max_queued} bytes queued "
                          "(--max-queued-bytes)", "connection", size)
            return
        if not self.registry.outboxes.make_room(self, size):
            self.shed()
            return
        self._queued += size
        self._outbox.append(entry)
        self._output.wake()

    def flush(self) -> None:
        """The frames queued so far go out now: the caller waits for the page next."""
        self._output.flush()

    @property
    def queued(self) -> int:
        """Bytes of memory queued for the page (outboxes.Holder)."""
        return self._queued

    def shed(self) -> None:
        """Core's queues for all connections are full and this one holds the most."""
        limit = self.registry.outboxes.limit
        self._cut_off(protocol.CLOSE_TRY_AGAIN, f"Core's queues are full (over {limit} bytes "
                      "for all connections, --max-queued-total-bytes) and this connection "
                      "held the most", "all", 0)

    def _cut_off(self, code: int, reason: str, bound: Literal["connection", "all"],
                 frame: int) -> None:
        """The page does not read what Core sends (or reads too little of it): close its
        connection rather than buffer for it. Its session is detached now and waits for
        a resume (what it missed, pending requests and turn ends, is sent again then).
        ``bound``: whose queue was full, this connection's or all connections'."""
        session = self.session
        log_event("bridge.not_reading", session=None if session is None else session.id,
                  queued=self._queued, frame=frame or None, bound=bound)
        self._drop_outbox()
        self.closing = (code, reason)
        self.open = False  # the receive loop stops at the next frame
        if session is not None:
            session.detach(self)
        self._output.abort()

    def _drop_outbox(self) -> None:
        self._outbox.clear()
        self.registry.outboxes.release(self, self._set_queued(0))

    def _set_queued(self, queued: int) -> int:
        """``_queued`` set to ``queued``; the bytes given back."""
        given_back = self._queued - queued
        self._queued = queued
        if not queued:
            self._sending = 0
        return given_back

    def close(self, code: int, reason: str) -> None:
        if not self.open or self.closing is not None:
            return
        self.closing = (code, reason)
        self._output.wake()

    # --- the output side (the serve loop calls these) -----------------------------------

    def next_frame(self) -> str | None:
        """The next frame to send, or None when the outbox is empty. The frame handed
        out last has been sent by then: its bytes are given back now (until then, while
        the socket waits for the page to read, they count as queued)."""
        given_back = self._sending
        self._sending = 0
        frame = None
        while frame is None and self._outbox:
            entry = self._outbox.popleft()
            if isinstance(entry, _Request):  # counted as its id, while it goes out too
                size = sys.getsizeof(entry.id)
                frame = None if self.session is None else self.session.request_frame(entry.id)
            else:
                frame, size = entry, sys.getsizeof(entry)
            if frame is None:  # answered, cancelled or timed out since: not sent
                given_back += size
            else:
                self._sending = size
        self.registry.outboxes.release(self, self._set_queued(self._queued - given_back))
        return frame

    def ended(self) -> None:
        """No more frames go out: the close went, or the page is gone."""
        self.open = False
        self._drop_outbox()
        self._release_client()

    def _release_client(self) -> None:
        if self._patterns is not None:
            self._patterns = None
            self.registry.patterns.close(self.client)
        if self._metadata is not None:
            self._metadata = None
            self.registry.metadata.close(self.client)
        if self._reading is not None:
            self._reading = None
            self.registry.reading.close(self.client)

    # --- the input side -----------------------------------------------------------------

    def first_hello(self, parsed: Parsed) -> protocol.Hello | None:
        """The hello the serve loop must first take to the store, once per connection (a
        hello costs the store a round trip, and the rate limit charges after): for a
        session another node of the cluster holds, or for a new session's id with its
        lease this node's before the welcome."""
        hello = parsed.message
        if isinstance(hello, protocol.Hello) and self.session is None and not self._took_over:
            self._took_over = True
            return hello
        return None

    def disconnected(self) -> None:
        """The page's socket is closed: its session waits for a resume."""
        self.open = False
        self._release_client()
        if self.session is not None:
            self.session.detach(self)
            log_event("bridge.disconnected", session=self.session.id)

    def read_delay(self, data: str | bytes) -> float:
        """Seconds to wait before ``data`` is handled: the frames of one client, all its
        connections together, are read at ``--read-rate`` characters a second (a burst
        of 1 s of it). Charged once per frame, results Core waits for included (their
        size is the page's); a client over the rate waits its turn, nothing is refused.
        Other clients' frames do not wait for it, and the work its frames set off (each
        decoded with the GIL held, which the event loop then waits for) is bounded.

        Two frames are charged without waiting: a result Core waits for (its request has
        a deadline, and a caller that is not this client waits for it: the client's next
        frames pay instead), and a frame before ``hello`` (the hello deadline runs; a
        hello is bounded by ``--metadata-rate``, anything else is refused unparsed)."""
        owed = -self._charge_reading(len(data))
        if owed <= 0 or self.session is None or self._awaited_result(data):
            return 0.0
        return owed / self.registry.config.read_rate

    def _awaited_result(self, data: str | bytes) -> bool:
        """Whether ``data`` starts as a ``tool.result`` for a request Core waits for."""
        result_of = _RESULT_FRAME.match(data) if isinstance(data, str) else None
        return (result_of is not None and self.session is not None
                and result_of.group(1) in self.session.pending)

    def _charge_reading(self, characters: int) -> float:
        """``characters`` charged to the client's reading: what its bucket holds after."""
        bucket = self._reading
        return 0.0 if bucket is None else bucket.spend(characters)

    def refuses_unparsed(self, data: str | bytes) -> bool:
        """Before hello, a frame that does not start as one (``{"type":"hello"``) is
        refused unparsed: a stranger's frame costs Core a look at its first characters,
        whatever it holds (:meth:`parse` answers it ``HELLO_REQUIRED`` at once)."""
        return self.session is None and leading_type(data) != "hello"

    def parse_on_loop(self, data: str | bytes) -> Parsed | None:
        """:meth:`parse` on the event loop, or None when the frame holds a regular
        expression Core has not checked: checking one costs ~0.2 to 2.5 µs a character
        (re's parser), so it is done in a worker thread, never on the loop (a frame full
        of known ones is parsed here: their verdicts are cached)."""
        try:
            return self._parse(data, _off_loop)
        except _OffLoop:
            return None

    def parse(self, data: str | bytes) -> Parsed:
        """``data`` checked and decoded; reads only the limits and thread-safe budgets,
        so a worker thread may run it (bridge.py does for long frames)."""
        return self._parse(data, self._charge_patterns)

    def _charge_patterns(self, characters: int) -> None:
        """A new regular expression is to be checked: its client pays, or the frame is
        refused."""
        budget = self._patterns
        if budget is not None and not budget.take(characters):
            raise PatternsOverBudget(
                f"more than {budget.rate:g} characters of new regular expressions per "
                f"second (burst {budget.burst:g}) from this client (--pattern-rate); frame "
                "dropped")

    def _parse(self, data: str | bytes, charge: Callable[[int], None]) -> Parsed:
        if self.refuses_unparsed(data):
            kind = leading_type(data)
            return Parsed(ProtocolError(HELLO_REQUIRED, f"send hello before {kind!r}" if kind
                                        else "send hello first; before hello, Core reads "
                                        "no more of a frame than its leading \"type\""))
        text = data if isinstance(data, str) else ""
        limit = self.max_bytes + (RESULT_ENVELOPE_BYTES if _RESULT_FRAME.match(text) else 0)
        budget = self._metadata
        if (budget is not None and leading_type(data) in _METADATA_FRAMES
                and not budget.take(len(data))):
            # (checking metadata is linear, yet ~3 ms for 16 KiB of $ref chain: 200 such
            # frames a second from each of a client's pages would take the loop)
            return Parsed(ProtocolError(RATE_LIMITED, (
                f"more than {budget.rate:g} characters of tool metadata per second (burst "
                f"{budget.burst:g}) from this client (--metadata-rate); frame dropped")))
        try:
            with charging_patterns(charge):
                message = protocol.parse_client_frame(data, max_bytes=limit)
        except ProtocolError as exc:
            return Parsed(exc)
        except PatternsOverBudget as exc:
            return Parsed(ProtocolError(RATE_LIMITED, str(exc)))
        if isinstance(message, protocol.Hello):
            return Parsed(message, kept_json(message.tools), kept_json(message.client or {}))
        if isinstance(message, protocol.ToolsUpdate):
            return Parsed(message, kept_json(message.tools))
        if isinstance(message, protocol.ToolResult):
            result_json = kept_json(message.result)
            if len(result_json) > LARGE_CHARS and self._answered_as_text(message):
                message = dataclasses.replace(message, result=JsonText(result_json))
            return Parsed(message, result_json=result_json)
        return Parsed(message)

    def _answered_as_text(self, message: protocol.ToolResult) -> bool:
        """Whether a long result goes on as its JSON text, its value dropped here (in the
        parse's thread, for a long frame): the result of a call (control API, MCP), not
        an error result, whose caller writes it out as it is. Decoded values that outlive
        the thread's work are walked by the collector on the loop once it goes on (~0.1 s
        for 1 MiB of small arrays); a turn's results are the agent's to read, decoded.
        (The session's pending requests are read, not changed: a result whose request
        is resolved meanwhile is refused as late, text or value.)"""
        session = self.session
        pending = None if session is None else session.pending.get(message.tool_request_id)
        return (pending is not None and pending.record.turn_id is None
                and not is_error_result(message.result))

    def receive(self, data: str | bytes, parsed: Parsed) -> bool:
        """One frame from the page, as :meth:`parse` made it; False when the connection
        is cut off. Never raises.

        A result Core is waiting for is not charged to the rate limit (Core sets that
        pace itself); every other frame is, bad ones included."""
        message = parsed.message
        text = data if isinstance(data, str) else ""
        result_of = _RESULT_FRAME.match(text)
        if isinstance(message, ProtocolError):
            exc = message
            if result_of and exc.code == protocol.FRAME_TOO_LARGE and self._too_large(
                    result_of.group(1), protocol.frame_size(result_of.string)):
                return True
            charge = self._charge()
            if charge == "ok":  # a turn.start refused names its turn: the page fails it
                turn_of = _TURN_START_FRAME.match(text)
                # logged only when answered: a flood is cut by the rate limit, not logged;
                # before hello, a refusal costs no more than the look at the type
                if exc.code != HELLO_REQUIRED:
                    self._log_refusal(exc.code, len(data) if isinstance(data, bytes)
                                      else protocol.frame_size(text),
                                      turn_of.group(1) if turn_of else None)
                self.send(protocol.error_frame(
                    exc.code, exc.message, turn_id=turn_of.group(1) if turn_of else None))
            return charge != "cut"
        session = self.session
        awaited = (isinstance(message, protocol.ToolResult) and session is not None
                   and message.tool_request_id in session.pending)
        charge = "ok" if awaited else self._charge()
        if charge == "ok":
            self._dispatch(message, parsed)
        return charge != "cut"

    def _charge(self) -> str:
        """The rate limit: ``ok``, ``refused`` (an error frame went out) or ``cut``."""
        bucket = self.bucket
        tokens = bucket.spend()
        if tokens >= 0:
            return "ok"
        if bucket.flooded(tokens):
            log_event("bridge.flood", session=None if self.session is None else self.session.id)
            self.close(CLOSE_POLICY, "rate limit exceeded")
            return "cut"
        self.send(protocol.error_frame(
            RATE_LIMITED,
            f"more than {bucket.rate:g} frames per second (burst {bucket.burst:g}); "
            "frame dropped",
        ))
        return "refused"

    def _log_refusal(self, code: str, size: int, turn: str | None) -> None:
        """``bridge.frame_refused``, one a second at most (a page may be refused 200
        frames a second, each answered: 50,000 lines a second over 256 of them), with
        ``more``: how many were refused since the last line, unlogged."""
        now = self.registry.config.clock.monotonic()
        if now - self._refusal_logged < 1.0:
            self._refusals_unlogged += 1
            return
        log_event("bridge.frame_refused",
                  session=None if self.session is None else self.session.id, code=code,
                  bytes=size, turn=turn, more=self._refusals_unlogged or None)
        self._refusal_logged = now
        self._refusals_unlogged = 0

    def _too_large(self, request_id: str, size: int) -> bool:
        """A result too large for Core, for a request it awaits: the caller gets
        ``TOOL_RESULT_TOO_LARGE`` now, not a timeout later (a page whose result limit is
        above Core's frame limit)."""
        session = self.session
        if session is None or request_id not in session.pending:
            return False
        log_event("tool.result.too_large", session=session.id, toolRequestId=request_id)
        message = (f"the page's tool.result frame is {size} bytes; Core takes results up "
                   f"to {self.max_bytes} bytes (--max-frame-bytes)")
        session.accept_result(protocol.ToolResult(
            tool_request_id=request_id, result=tool_error(
                TOOL_RESULT_TOO_LARGE, message, retryable=False),
            handled_by="none"))
        self.send(protocol.error_frame(protocol.FRAME_TOO_LARGE, message,
                                       tool_request_id=request_id))
        return True

    def _dispatch(self, message: protocol.ClientMessage, parsed: Parsed) -> None:
        session = self.session
        if isinstance(message, protocol.Hello):
            self._hello(message, parsed)
        elif session is None:
            self.send(protocol.error_frame(
                HELLO_REQUIRED, f"send hello before {message.type!r}"))
        elif isinstance(message, protocol.ToolResult):
            refused = session.accept_result(message, JsonText(parsed.result_json))
            if refused is not None:
                self.send(protocol.error_frame(
                    refused[0], refused[1], tool_request_id=message.tool_request_id))
        elif isinstance(message, protocol.TurnStart):
            running = session.turn
            if running is not None and running.turn_id == message.turn_id:
                pass  # re-sent by the page after a resume: the turn is running
            elif message.turn_id in session.ended:  # its turn.end was lost on the way
                session.send_ended(session.ended[message.turn_id])
            elif message.turn_id in session.callers.turns:  # kept for a caller's retries
                self.send(protocol.error_frame(
                    TURN_ID_TAKEN, "that turn id is a control-API caller's turn, kept for its "
                    "retries; start a turn with a new id", turn_id=message.turn_id))
            elif running is not None:
                self.send(protocol.error_frame(
                    TURN_BUSY,
                    f"turn {running.turn_id!r} is still running; one turn at a time",
                    turn_id=message.turn_id,
                ))
            else:
                self._charge_reading((TURN_WORK - 1) * len(message.text))
                start_turn(session, message.turn_id, message.text)
        elif isinstance(message, protocol.TurnCancel):
            if session.turn is not None and session.turn.turn_id == message.turn_id:
                session.turn.cancel("the page cancelled the turn")
            else:
                self.send(protocol.error_frame(
                    UNKNOWN_TURN, f"turn {message.turn_id!r} is not running",
                    turn_id=message.turn_id))
        elif isinstance(message, (protocol.ToolProgressMessage, protocol.ToolWaiting)):
            if message.tool_request_id not in session.pending:
                self.send(protocol.error_frame(
                    UNKNOWN_TOOL_REQUEST,
                    f"no tool request {message.tool_request_id!r} is pending in this session",
                    tool_request_id=message.tool_request_id))
            elif isinstance(message, protocol.ToolProgressMessage):
                session.accept_progress(message)
            else:
                session.accept_waiting(message)
        else:  # ToolsUpdate
            try:
                session.update_tools(page_metadata(
                    message.tools, parsed.tools_json, session.client_json,
                    self.registry.config.max_metadata_bytes))
            except SessionRefused as exc:
                self.send(protocol.error_frame(exc.code, exc.message))
                return
            log_event("session.tools", session=session.id, tools=len(message.tools))

    def _hello(self, hello: protocol.Hello, parsed: Parsed) -> None:
        if self.session is not None:
            self.send(protocol.error_frame(
                DUPLICATE_HELLO, "this connection has already said hello"))
            return
        registry = self.registry
        try:
            metadata = page_metadata(hello.tools, parsed.tools_json, parsed.client_json,
                                     registry.config.max_metadata_bytes)
            if hello.session_id is None:
                session = registry.create(metadata, self.client, self.new_id)
        except SessionRefused as exc:
            self.send(protocol.error_frame(exc.code, exc.message))
            if exc.code == TOO_MANY_SESSIONS:
                self.close(protocol.CLOSE_TRY_AGAIN, "too many sessions")
            return
        if hello.session_id is None:
            resumed = False
        else:
            found = registry.resume(hello.session_id, hello.resume_token, self.client)
            if found is None:
                log_event("session.resume_refused")
                self.send(protocol.error_frame(
                    RESUME_REFUSED,
                    "that session cannot be resumed; send hello without sessionId to start "
                    "a new one",
                ))
                return
            session = found
            session.update_tools(metadata)
            resumed = True
            log_event("session.resumed", session=session.id, pending=len(session.pending))
        self.session = session
        session.attach(self)
        token = session.resume_token
        assert token is not None  # set by create and by a good resume
        self.send(protocol.Welcome(
            session_id=session.id, resume_token=token, resumed=resumed, state=session.state,
        ).encode())
        session.resend()
