"""Sessions: the registry, each session's state, and its pending tool requests.

A session outlives its connections: when a page's WebSocket drops, the session keeps its
pending requests (their deadlines keep running) and waits ``session_ttl`` seconds to be
resumed by id and token. Results are keyed by ``toolRequestId``: each pending request is
resolved exactly once (by the page's result, its deadline, a cancellation or expiry);
whatever arrives after that is refused with an ``error`` frame and changes nothing.

Memory is bounded per session, per client and in all: ``max_sessions`` in all and
``max_sessions_per_client`` per client address (a new page may take the place of its own
client's session disconnected longest, never another client's), metadata as JSON text
of at most ``max_metadata_bytes``, ``max_pending`` requests, the texts of ended turns;
the agent's history is bounded in turns.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import json
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, Literal, NamedTuple, Protocol

from .. import protocol
from ..errors import PedelecError
from ..results import INVALID_ARGS, TOOL_CANCELLED, TOOL_TIMEOUT, tool_error
from ..text import excerpt
from .agent import Agent
from .clients import PatternBudgets
from .clock import Timer
from .config import CoreConfig
from .idempotency import CallerMemory
from .log import log_event
from .outboxes import Outboxes
from .store import (
    RECENT_TURNS,
    STORE_FAILED,
    IdempotencyRecord,
    JsonText,
    RequestRecord,
    SessionRecord,
    Snapshot,
    Store,
    StoreError,
    TurnRecord,
    as_text,
    hash_token,
    kept_size,
)

# Codes of the `error` frames Core sends for session-level problems (parse errors use
# the codes in pedelec_pyodide.protocol).
HELLO_REQUIRED = "HELLO_REQUIRED"
DUPLICATE_HELLO = "DUPLICATE_HELLO"
RESUME_REFUSED = "RESUME_REFUSED"
TURN_BUSY = "TURN_BUSY"
UNKNOWN_TURN = "UNKNOWN_TURN"
TURN_ID_TAKEN = "TURN_ID_TAKEN"
UNKNOWN_TOOL_REQUEST = "UNKNOWN_TOOL_REQUEST"
DUPLICATE_RESULT = "DUPLICATE_RESULT"
LATE_RESULT = "LATE_RESULT"
RATE_LIMITED = "RATE_LIMITED"
SESSION_CLOSED = "SESSION_CLOSED"
TOO_MANY_SESSIONS = "TOO_MANY_SESSIONS"  # then the connection is closed (CLOSE_TRY_AGAIN)
METADATA_TOO_LARGE = "METADATA_TOO_LARGE"

# Error results Core itself gives a caller (besides TOOL_TIMEOUT and TOOL_CANCELLED).
SESSION_EXPIRED = "SESSION_EXPIRED"
TOO_MANY_PENDING = "TOO_MANY_PENDING"
#: a caller was waiting on a node that handed the page's session over to another node
SESSION_MOVED = "SESSION_MOVED"

#: where a pending request is, as ``GET .../sessions/{id}`` shows it
RequestStatus = Literal["running", "waiting_for_user", "awaiting_approval"]
#: characters of a progress message Core keeps (a frame may hold a MiB of it)
MAX_PROGRESS_MESSAGE_CHARS = 500


class SessionRefused(PedelecError):
    """A hello or tools.update Core will not take; ``code`` is the error frame's."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class PageMetadata(NamedTuple):
    """What a page told Core about itself, as a session keeps it: JSON text (decoded,
    metadata takes up to ~24 times the memory of its JSON) and the tools' names."""

    tools_json: str
    client_json: str
    names: tuple[str, ...]


def page_metadata(tools: list[dict[str, Any]], tools_json: str, client_json: str,
                  limit: int) -> PageMetadata:
    """A hello's or tools.update's metadata, or :class:`SessionRefused` when the tools
    and client info together are over ``limit`` bytes of JSON. ``tools_json``: the tools
    as :func:`kept_json` text (made with the frame's parse: off the event loop). The
    limit counts their UTF-8 bytes, or their bytes of memory where those are more."""
    size = kept_size(tools_json) + kept_size(client_json)
    if size > limit:
        raise SessionRefused(METADATA_TOO_LARGE, (
            f"the tool metadata and client info are {size} bytes as JSON; a session may "
            f"hold at most {limit} (--max-metadata-bytes)"))
    return PageMetadata(tools_json, client_json, tuple(str(tool["name"]) for tool in tools))

# What a wrong resume token is compared with when the session is unknown: the same
# work as for a known one, so timing says nothing about which sessions exist.
_NO_SESSION_HASH = hash_token("")
# Core's stop: at most this long for running turns to end, then for the store
SHUTDOWN_SECONDS = 1.5
#: seconds a node's lease on a session lasts (Redis store); renewed every third of it, so
#: a dead node's sessions are free again within this long
LEASE_SECONDS = 6.0
#: how soon a call forwarded to another node is first sent again while its reply has not
#: come (Redis may have dropped the ask or the reply: Registry._resend); each gap after is
#: twice the last, up to RESEND_MAX_SECONDS (a long call's body is not sent every second)
RESEND_SECONDS = 1.0
RESEND_MAX_SECONDS = 8.0
#: replies to other nodes' asks that reached no inbox, kept for the ask sent again: at
#: most this many, and this many characters in all (the oldest dropped first)
UNHEARD_REPLIES = 1024
UNHEARD_REPLY_CHARS = 16 * 1024 * 1024
#: how long a node taking a session over waits for its holder to let go of it (a dead
#: holder never answers: the node goes on without it)
HANDOVER_SECONDS = 2.0
#: how long a session's lease must stay missing before a call takes the session (adopt):
#: two renewals, since a live holder whose lease lapsed (Redis was away, or the node
#: stalled, past a lease) takes it back at its next renewal
VACANT_SECONDS = 2 * LEASE_SECONDS / 3
# how often adopt, and a node's start (_take_vacant), look whether a holder took a
# missing lease back
_VACANT_POLL = 0.25


class Connection(Protocol):
    """A page's live connection, as sessions see it."""

    def send(self, frame: str) -> None: ...

    def close(self, code: int, reason: str) -> None: ...


class RunningTurn(Protocol):
    """A session's running turn (:class:`~.turns.TurnRunner`), as sessions see it."""

    turn_id: str
    record: TurnRecord
    task: asyncio.Task[TurnRecord] | None

    def cancel(self, reason: str) -> None: ...

    def abandon(self) -> None: ...

    def store_again(self) -> None:
        """Write the turn and its requests again (the store lost them)."""


class Progress(NamedTuple):
    """The latest ``tool.progress`` of a request, as Core keeps it."""

    progress: float
    total: float | None
    message: str | None

    def as_json(self) -> dict[str, Any]:
        """``{"progress", "total"?, "message"?}``: what callers are sent."""
        data: dict[str, Any] = {"progress": self.progress}
        if self.total is not None:
            data["total"] = self.total
        if self.message is not None:
            data["message"] = self.message
        return data


class PendingRequest:
    """A tool request whose result has not reached its caller yet.

    Its deadline (``record.deadline``) is an idle deadline: each new progress moves it to
    ``idle`` seconds from now, never past ``limit``; while the page waits for the user
    (``paused_at``) it does not run, and its waits together are bounded by
    ``--user-wait-limit`` (``waited``: a page that ends each wait and starts another
    cannot hold its caller forever). One timer checks it, rescheduled when it fires early (a
    progress frame costs no timer work)."""

    __slots__ = ("frame", "future", "idle", "limit", "paused_at", "progress", "record",
                 "started", "status", "timer", "timer_due", "waited", "watchers")

    def __init__(self, record: RequestRecord, frame: str | None, idle: float,
                 limit: float) -> None:
        self.record = record
        # the checked ``tool.request`` frame, once made (re-sends reuse it)
        self.frame = frame
        self.future: asyncio.Future[tuple[Any, str]] = (
            asyncio.get_running_loop().create_future()
        )
        self.started = time.perf_counter()
        self.timer: Timer | None = None
        self.timer_due = 0.0  # wall-clock: when ``timer`` fires
        self.idle = idle  # seconds: the call's timeout
        self.limit = limit  # wall-clock: the latest progress may move the deadline to
        self.paused_at: float | None = None  # wall-clock, while waiting for the user
        self.waited = 0.0  # seconds of the waits for the user that have ended
        self.status: RequestStatus = "running"
        self.progress: Progress | None = None
        # futures of callers waiting for the next progress (or the result)
        self.watchers: list[asyncio.Future[None]] = []

    @property
    def id(self) -> str:
        return self.record.id

    def describe(self) -> dict[str, Any]:
        progress = self.progress
        return {"toolRequestId": self.id, "tool": self.record.tool, "status": self.status,
                "progress": None if progress is None else progress._asdict()}

    def wake(self) -> None:
        watchers, self.watchers = self.watchers, []
        for watcher in watchers:
            if not watcher.done():
                watcher.set_result(None)

    async def updates(self) -> AsyncIterator[Progress]:
        """Each new progress until the request is resolved; a caller slower than the
        page gets only the latest (nothing queues up for it)."""
        seen: Progress | None = None
        while True:
            latest = self.progress
            if latest is not None and latest is not seen:
                seen = latest
                yield latest
                continue
            if self.future.done():
                return
            await self.changed()

    async def changed(self) -> None:
        """Return at the request's next change: a progress, a wait for the user begun or
        ended (``status``), its result."""
        watcher = asyncio.get_running_loop().create_future()
        self.watchers.append(watcher)
        try:
            await watcher
        finally:
            if watcher.cancelled():  # its caller left: it holds no place in the list
                with contextlib.suppress(ValueError):
                    self.watchers.remove(watcher)

    def message(self) -> protocol.ToolRequest:
        record = self.record
        return protocol.ToolRequest(
            tool_request_id=record.id, tool=record.tool, args=record.args,
            turn_id=record.turn_id,
        )


# a request's id and its tool.request frame, through checked_request_frame
CheckedRequest = tuple[str, str]


#: what a re-sent ``turn.end`` says in place of a reply Core no longer keeps
FORGOTTEN_REPLY = ("[Core no longer keeps the reply of this earlier turn for a re-sent "
                   "turn.end; the whole text is in the turn's record]")


class EndedTurn:
    """An ended turn as its session remembers it, to send its ``turn.end`` again: its
    record without its texts and tool calls (they went to the store and the turn's
    caller), and its ``turn.end`` frame as UTF-8 while the session's budget keeps it
    (:meth:`CoreSession.remember_end`)."""

    __slots__ = ("frame", "record", "replied")

    def __init__(self, turn: TurnRecord, frame: str) -> None:
        self.record = dataclasses.replace(turn, text="", final_text="", tool_calls=[])
        self.replied = bool(turn.final_text)
        self.frame: bytes | None = frame.encode()

    def end_frame(self, max_frame_bytes: int) -> str:
        """The ``turn.end`` frame as first sent, or one saying its reply is not kept."""
        if self.frame is not None:
            return self.frame.decode()
        return end_frame(dataclasses.replace(
            self.record, final_text=FORGOTTEN_REPLY if self.replied else ""), max_frame_bytes)


def new_request_id() -> str:
    return secrets.token_hex(16)


def _escaped(text: str) -> bytes:
    """``text`` as it is inside a frame: its JSON string form without the quotes, as
    UTF-8 (each character's escape is the same wherever it stands, so the bytes of a
    prefix of the text are a prefix of these)."""
    return json.dumps(text, ensure_ascii=False)[1:-1].encode("utf-8", "surrogatepass")


def _backslashes_before(escaped: bytes, start: int, end: int) -> int:
    """How many backslashes ``escaped[start:end]`` ends with."""
    piece = escaped[start:end]
    return len(piece) - len(piece.rstrip(b"\\"))


def _piece_end(escaped: bytes, start: int, budget: int) -> int:
    """The end of the longest piece ``escaped[start:end]`` of at most ``budget`` bytes
    that ends between two characters of the text: not inside a UTF-8 sequence nor a JSON
    escape (``\\x``, ``\\uXXXX``). ``start`` is such a place."""
    end = start + max(0, budget)
    if end >= len(escaped):
        return len(escaped)
    while end > start and escaped[end] & 0xC0 == 0x80:  # a UTF-8 continuation byte
        end -= 1
    # A run of backslashes starts between characters and pairs up ("\\\\" is one
    # backslash), so an odd run ends with the start of an escape that was cut.
    if _backslashes_before(escaped, start, end) % 2:
        return end - 1
    unicode = escaped.rfind(b"\\u", max(start, end - 5), end)  # "\\uXXXX" cut short?
    if unicode >= 0 and _backslashes_before(escaped, start, unicode + 1) % 2:
        return unicode
    return end


def _unescaped(piece: bytes) -> str:
    """The text of a piece of :func:`_escaped` bytes that :func:`_piece_end` cut."""
    text: str = json.loads('"' + piece.decode("utf-8", "surrogatepass") + '"')
    return text


def fitted_end_frame(end: protocol.TurnEnd, max_frame_bytes: int) -> str:
    """The ``turn.end`` frame; if its text makes it too large for the page, the longest
    start of the text that fits, with a note of what was cut (the turn's record, in the
    store and the control API, keeps the whole text).

    Linear: the text is encoded once more to measure each character's bytes in the
    frame, and the start that fits is cut from those bytes (a bisection encoded the
    whole frame ~20 times)."""
    frame = end.encode()
    size = protocol.frame_size(frame)
    if size <= max_frame_bytes:
        return frame
    text = end.text
    escaped = _escaped(text)
    envelope = size - len(escaped)  # the frame's bytes besides its text's

    def note(cut: int) -> str:
        return (f"\n[... {cut} more characters: the reply is too long for one frame; "
                "the whole text is in the turn's record]")

    def note_bytes(keep: int) -> int:
        return len(_escaped(note(len(text) - keep)))

    # With the longest note (nothing kept) the start that fits is found in the bytes.
    # A shorter note (fewer digits to count what is cut) may leave room for a few more
    # characters, one at least per byte it saves (the frame grows with every character
    # kept, so the first that does not fit ends the search).
    used = _piece_end(escaped, 0, max_frame_bytes - envelope - note_bytes(0))
    keep = len(_unescaped(escaped[:used]))
    while keep < len(text):
        more = len(_escaped(text[keep]))
        if envelope + used + more + note_bytes(keep + 1) > max_frame_bytes:
            break
        used += more
        keep += 1
    return dataclasses.replace(end, text=text[:keep] + note(len(text) - keep)).encode()


def delta_frames(delta: protocol.TurnDelta, max_frame_bytes: int) -> list[str]:
    """The ``turn.delta`` frames for one piece of streamed text: as few as fit the page's
    limit, cut between characters (the page joins deltas, so nothing is lost). Linear:
    the pieces are cut from the text's encoded bytes, measured once."""
    frame = delta.encode()
    size = protocol.frame_size(frame)
    if size <= max_frame_bytes or len(delta.text) < 2:
        return [frame]
    escaped = _escaped(delta.text)
    budget = max_frame_bytes - (size - len(escaped))
    frames = []
    start = 0
    while start < len(escaped):
        end = _piece_end(escaped, start, budget)
        if end == start:  # a limit below one character's escape: one character a frame
            end = _piece_end(escaped, start, 6)
        piece = _unescaped(escaped[start:end])
        frames.append(dataclasses.replace(delta, text=piece).encode())
        start = end
    return frames


def end_frame(turn: TurnRecord, max_frame_bytes: int) -> str:
    """The ``turn.end`` frame of an ended turn (:func:`fitted_end_frame`)."""
    return fitted_end_frame(protocol.TurnEnd(
        turn_id=turn.id, status=turn.status, text=turn.final_text, error=turn.error,
        usage=turn.usage or None,
    ), max_frame_bytes)


def checked_request_frame(request: protocol.ToolRequest, max_frame_bytes: int) -> str:
    """The ``tool.request`` frame, or the :class:`protocol.ProtocolError` the page would
    answer it with (too large, too deep, NaN or a lone surrogate in the args): such a
    request could only wait for its deadline, so it is refused before it is sent."""
    try:
        frame = request.encode()
    except RecursionError:
        raise protocol.ProtocolError(
            protocol.FRAME_TOO_DEEP, f"the args nest deeper than {protocol.MAX_DEPTH}"
        ) from None
    protocol.parse_server_frame(frame, max_bytes=max_frame_bytes)
    return frame


def checked_call(tool: str, args: Any, max_frame_bytes: int,
                 turn_id: str | None = None) -> CheckedRequest:
    """A new request's id and its checked frame (:func:`checked_request_frame`), before
    anything of it is stored: a caller's args the page would refuse never reach the store."""
    request_id = new_request_id()
    return request_id, checked_request_frame(protocol.ToolRequest(
        tool_request_id=request_id, tool=tool, args=args, turn_id=turn_id), max_frame_bytes)


def refused_request(exc: protocol.ProtocolError) -> dict[str, Any]:
    """The result of a request the page would refuse (too large, too deep, NaN, ...)."""
    return tool_error(INVALID_ARGS, f"the page would refuse this tool.request: {exc.message}",
                      retryable=True)


class CoreSession:
    """One page session as Core holds it."""

    def __init__(self, registry: Registry, record: SessionRecord,
                 client_json: str = "{}", tool_names: tuple[str, ...] | None = None) -> None:
        self.registry = registry
        self.record = record
        # the resume token in clear, known once the page created or resumed the session
        # in this process: the store keeps only its hash
        self.resume_token: str | None = None
        self.connection: Connection | None = None
        self.client_json = client_json
        self.tool_names: tuple[str, ...] = tool_names if tool_names is not None else tuple(
            str(tool["name"]) for tool in json.loads(record.tools))
        self.pending: dict[str, PendingRequest] = {}
        # requests resolved lately: id -> how ("delivered", "timeout", "cancelled", ...)
        self.finished: OrderedDict[str, str] = OrderedDict()
        self.turn: RunningTurn | None = None
        self.unsent_ends: list[EndedTurn] = []
        # turns that ended lately, by id, the oldest first (see RECENT_TURNS)
        self.ended: OrderedDict[str, EndedTurn] = OrderedDict()
        self.closed = False
        # run after the page's tool list changed, by a key their owner chooses
        # (the MCP endpoint: one per MCP client session)
        self.tool_listeners: dict[str, Callable[[], None]] = {}
        # idempotency keys and the results of requests made outside turns
        config = registry.config
        self.callers = CallerMemory(registry.store, config.kept_results,
                                    config.result_retention)
        self._expiry: asyncio.TimerHandle | None = None
        # when the page's connection went away (epoch seconds); None while it is connected
        # and before its first connection
        self.disconnected_at: float | None = None
        #: the client (clients.client_key) it counts for: the one whose hello made it, or
        #: for a session restored from the store, the first to resume it (None until then)
        self.client: str | None = None

    @property
    def id(self) -> str:
        return self.record.id

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The page's tool metadata, decoded afresh (the session keeps the JSON)."""
        tools: list[dict[str, Any]] = json.loads(self.record.tools)
        return tools

    @property
    def state(self) -> str:
        if self.closed:
            return "closed"
        if self.connection is None:
            return "connecting"
        if self.pending:
            return "waiting_tool_result"
        if self.turn is not None:
            return "running"
        return "idle"

    def describe(self, *, full: bool = False) -> dict[str, Any]:
        info: dict[str, Any] = {
            "sessionId": self.id,
            "state": self.state,
            "connected": self.connection is not None,
            "disconnectedAt": None if self.connection is not None else self.disconnected_at,
            "createdAt": self.record.created_at,
            "pendingToolRequests": [pending.describe() for pending in self.pending.values()],
            "turnId": None if self.turn is None else self.turn.turn_id,
        }
        if full:
            info["tools"] = self.tools
            info["client"] = json.loads(self.client_json)
        else:
            info["toolNames"] = list(self.tool_names)
        return info

    # --- connections --------------------------------------------------------------------

    def attach(self, connection: Connection) -> None:
        """``connection`` now speaks for this session (after a good hello)."""
        previous = self.connection
        self.connection = connection
        self.disconnected_at = None
        self.registry.waits_no_more(self)
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        if previous is not None and previous is not connection:
            previous.close(protocol.CLOSE_SUPERSEDED,
                           "the session was resumed on another connection")

    def resend(self) -> None:
        """After the welcome: re-send pending requests (same ids) and missed turn ends.
        A request the page was waiting on the user for is running again: the new page
        asks again (and says so with its own ``tool.waiting``)."""
        connection = self.connection
        if connection is None:
            return
        for pending in list(self.pending.values()):
            self._stop_waiting(pending)
            if not pending.record.answered:
                connection.send(pending.frame or pending.message().encode())
        ends, self.unsent_ends = self.unsent_ends, []
        for ended in ends:
            self.send_ended(ended)

    def detach(self, connection: Connection) -> None:
        """``connection`` is gone; if it was ours, wait for a resume until the TTL."""
        if self.connection is not connection:
            return
        self.connection = None
        for pending in self.pending.values():  # no page, nobody to answer: the clock runs
            self._stop_waiting(pending)
        if not self.closed:
            self.await_resume()

    def await_resume(self) -> None:
        """Disconnected: expire after the TTL, or sooner if Core needs the room."""
        self.disconnected_at = time.time()
        self.registry.waits(self)
        self._expiry = asyncio.get_running_loop().call_later(
            self.registry.config.session_ttl, self.expire)

    def send(self, frame: str) -> bool:
        connection = self.connection
        if connection is None:
            return False
        connection.send(frame)
        return True

    def remember_end(self, turn: TurnRecord, frame: str | None = None) -> EndedTurn:
        """Remember an ended turn (``frame``: its ``turn.end``, if made already): the
        last :data:`RECENT_TURNS`, their frames together at most ``--max-frame-bytes``
        (the newest first: the newest always fits, an older one that does not is
        forgotten, :data:`FORGOTTEN_REPLY`)."""
        budget = self.registry.config.max_frame_bytes
        if frame is None:
            frame = end_frame(turn, budget)
        ended = self.ended[turn.id] = EndedTurn(turn, frame)
        while len(self.ended) > RECENT_TURNS:
            self.ended.popitem(last=False)
        for kept in reversed(self.ended.values()):
            if kept.frame is not None:
                if len(kept.frame) <= budget:
                    budget -= len(kept.frame)
                else:
                    kept.frame = None
        return ended

    def send_turn_end(self, turn: TurnRecord, frame: str | None = None) -> None:
        """Send the turn's end (``frame``: made already, by :func:`end_frame`)."""
        if frame is None:
            frame = end_frame(turn, self.registry.config.max_frame_bytes)
        ended = self.remember_end(turn, frame)
        if self._send_end(ended, frame):
            turn.end_delivered = True

    def send_ended(self, ended: EndedTurn) -> None:
        """Send a remembered turn's end again (lost with a connection, or never sent)."""
        self._send_end(ended, ended.end_frame(self.registry.config.max_frame_bytes))

    def _send_end(self, ended: EndedTurn, frame: str) -> bool:
        record = ended.record
        if self.send(frame):
            record.end_delivered = True
            self.registry.store.mark_end_delivered(record.session_id, record.id)
            return True
        self.unsent_ends.append(ended)
        del self.unsent_ends[:-RECENT_TURNS]
        return False

    def update_tools(self, metadata: PageMetadata) -> None:
        """The page's tools (and, from a hello, its client info) changed."""
        changed = metadata.tools_json != self.record.tools
        self.record.tools = metadata.tools_json
        self.tool_names = metadata.names
        self.client_json = metadata.client_json
        if changed:  # the tools alone: the client info is not stored, nor is the
            # history written again (a page's tools.update costs the store its tools)
            self.registry.store.save_tools(self.record)
            for listener in list(self.tool_listeners.values()):
                listener()
            if self.registry.on_tools_changed is not None:
                self.registry.on_tools_changed(self.id)

    # --- requests -----------------------------------------------------------------------

    def open_request(
        self, tool: str, args: Any, *, turn_id: str | None = None, step: int = 0,
        index: int = 0, timeout_ms: int | None = None, max_total_ms: int | None = None,
        checked: CheckedRequest | None = None,
    ) -> PendingRequest:
        """Register a request (not sent yet: flush the store, then :meth:`send_request`).
        ``checked``: its id and frame, from :func:`checked_request_frame` already.
        ``max_total_ms``: how far progress may push its deadline (default
        ``--max-total-factor`` times the timeout)."""
        config = self.registry.config
        timeout = config.timeout_for(tool, timeout_ms)
        now = config.clock.time()
        limit = now + config.max_total_for(timeout, max_total_ms)
        record = RequestRecord(
            id=checked[0] if checked else new_request_id(), session_id=self.id,
            turn_id=turn_id, step=step, index=index, tool=tool, args=args,
            deadline=min(now + timeout, limit),
        )
        self.registry.store.save_request(record)
        return self.track(record, checked[1] if checked else None, timeout, limit)

    async def start_call(
        self, tool: str, args: Any, *, timeout_ms: int | None = None,
        max_total_ms: int | None = None, checked: CheckedRequest | None = None,
        key: IdempotencyRecord | None = None,
    ) -> PendingRequest:
        """Open, store and send one tool request outside any turn (control API, MCP).
        Stored before it is sent, so deadlines, resume and exactly-once apply as to an
        agent's request; its result is kept (``self.callers``) once it is in. ``key``:
        its idempotency key (a caller's, or Core's own: its ``kind``), its
        ``target_id`` filled in here, stored with it."""
        pending = self.open_request(tool, args, timeout_ms=timeout_ms,
                                    max_total_ms=max_total_ms, checked=checked)
        if key is not None:
            key.target_id = pending.id
            self.callers.add_key(key)
        await self.store_requests([pending], *([key.key_hash] if key is not None else []))
        self.send_request(pending)
        return pending

    async def store_requests(self, opened: list[PendingRequest], *keys: str) -> None:
        """Flush the store before ``opened`` go out (with the writes of ``keys``, e.g.
        their turn's). If it cannot take them, each is answered ``STORE_FAILED`` and never
        sent: a page must not run what a restart of Core would not know of."""
        try:
            await self.registry.store.flush(*(pending.id for pending in opened), *keys)
        except StoreError as exc:
            log_event("store.requests_failed", session=self.id, requests=len(opened),
                      error=str(exc))
            for pending in opened:
                if self.pending.get(pending.id) is pending:
                    self._resolve(pending, tool_error(
                        STORE_FAILED, f"Core could not store this request, so it was not "
                        f"sent to the page: {exc}", retryable=True), "none", "store_failed")
                    # it never ran: a retry with its key must run it, not get this again
                    self.callers.forget_key(pending.id)

    async def call_tool(
        self, tool: str, args: Any, *, timeout_ms: int | None = None,
        checked: CheckedRequest | None = None,
        on_progress: Callable[[Progress], Awaitable[None]] | None = None,
    ) -> tuple[str, Any, str]:
        """:meth:`start_call`, then its result → ``(toolRequestId, result, handledBy)``;
        a timeout is the result ``TOOL_TIMEOUT``. If the caller goes away (its task is
        cancelled), the request is cancelled and the page told. ``on_progress`` is
        awaited with each new progress (the latest, if it is slower than the page)."""
        pending = await self.start_call(tool, args, timeout_ms=timeout_ms, checked=checked)
        try:
            if on_progress is not None:
                async for progress in pending.updates():
                    await on_progress(progress)
            # Only this caller awaits the future, so no shield (a loop step per call): if
            # the caller is cancelled, so is the future, and _resolve leaves it be.
            result, handled_by = await pending.future
        except BaseException:  # cancelled, or its on_progress failed: nobody waits for it
            self.cancel_request(pending, "the caller went away")
            raise
        return pending.id, result, handled_by

    def track(self, record: RequestRecord, frame: str | None = None,
               idle: float | None = None, limit: float | None = None) -> PendingRequest:
        """Hold ``record`` pending. Restored after a restart, it has no ``idle`` or
        ``limit`` of its own: its tool's timeout, and the default limit past its
        stored deadline."""
        config = self.registry.config
        if idle is None:
            idle = config.timeout_for(record.tool)
        if limit is None:
            limit = record.deadline + config.max_total_for(idle) - idle
        pending = PendingRequest(record, frame, idle, limit)
        self.pending[record.id] = pending
        self._schedule(pending)
        limit = self.registry.config.max_pending
        if len(self.pending) > limit:  # answered at once; kept in a turn's journal
            self._resolve(pending, tool_error(
                TOO_MANY_PENDING,
                f"this session already has {limit} tool requests pending (--max-pending)",
                retryable=True), "none", "refused")
        return pending

    def send_request(self, pending: PendingRequest) -> None:
        if self.pending.get(pending.id) is not pending:
            return  # resolved already (cancelled, or the store could not take it)
        if self.closed:
            self._resolve(pending, tool_error(
                SESSION_CLOSED, "the session is closed", retryable=False), "none", "closed")
            return
        record = pending.record
        frame = pending.frame
        if frame is None:
            try:
                frame = checked_request_frame(pending.message(),
                                              self.registry.config.max_frame_bytes)
            except protocol.ProtocolError as exc:
                self.refuse_request(pending, exc)
                return
            pending.frame = frame
        log_event("tool.request", session=self.id, turn=record.turn_id,
                  toolRequestId=record.id, tool=record.tool,
                  connected=self.connection is not None)
        self.send(frame)

    def refuse_request(self, pending: PendingRequest, exc: protocol.ProtocolError) -> None:
        """The page would refuse this request's frame (:func:`checked_request_frame`):
        answered now, never sent."""
        if self.pending.get(pending.id) is pending:
            self._resolve(pending, refused_request(exc), "none", "refused")

    def accept_result(self, message: protocol.ToolResult,
                      kept: JsonText | None = None) -> tuple[str, str] | None:
        """Feed the page's result to its request; an ``(error code, message)`` if refused.
        ``kept``: the result as JSON text, if made already (with the frame's parse)."""
        request_id = message.tool_request_id
        pending = self.pending.get(request_id)
        if pending is None:
            how = self.finished.get(request_id)
            if how is None:
                return UNKNOWN_TOOL_REQUEST, (
                    f"no tool request {request_id!r} is pending in this session")
            if how == "delivered":
                log_event("tool.result.duplicate", session=self.id, toolRequestId=request_id)
                return DUPLICATE_RESULT, (
                    f"tool request {request_id!r} already has its result; this one is ignored")
            log_event("tool.result.late", session=self.id, toolRequestId=request_id,
                      resolved=how)
            return LATE_RESULT, (
                f"tool request {request_id!r} was already resolved ({how}); "
                "this result is dropped")
        self._resolve(pending, message.result, message.handled_by, "delivered", kept)
        return None

    def accept_progress(self, message: protocol.ToolProgress) -> None:
        """Keep the latest progress of a pending request (the caller checked it is) and
        move its idle deadline. A value that does not increase is dropped: a handler run
        again after a reload starts over, and no caller may see progress go back."""
        pending = self.pending[message.tool_request_id]
        last = pending.progress
        if last is not None and message.progress <= last.progress:
            return
        text = message.message
        pending.progress = Progress(
            message.progress, message.total,
            None if text is None else text[:MAX_PROGRESS_MESSAGE_CHARS])
        if pending.paused_at is None:
            deadline = min(self.registry.config.clock.time() + pending.idle, pending.limit)
            if deadline > pending.record.deadline:  # the timer sees it when it fires
                pending.record.deadline = deadline
        pending.wake()

    def accept_waiting(self, message: protocol.ToolWaiting) -> None:
        """The page waits for the user (or no longer) on a pending request: its deadline
        stops (up to ``--user-wait-limit``), or runs again from where it stopped."""
        pending = self.pending[message.tool_request_id]
        if not message.waiting:
            self._stop_waiting(pending)
            return
        pending.status = ("awaiting_approval" if message.reason == protocol.APPROVAL_REASON
                          else "waiting_for_user")
        if pending.paused_at is None:
            pending.paused_at = self.registry.config.clock.time()
            self._schedule(pending)
        pending.wake()  # a caller's event stream says it waits

    def _stop_waiting(self, pending: PendingRequest) -> None:
        paused_at = pending.paused_at
        pending.status = "running"
        pending.wake()
        if paused_at is None:
            return
        pending.paused_at = None
        waited = max(0.0, self.registry.config.clock.time() - paused_at)
        pending.waited += waited
        pending.record.deadline += waited
        pending.limit += waited
        self._schedule(pending)

    def _due(self, pending: PendingRequest) -> float:
        """When the request times out (wall clock), as things stand."""
        if pending.paused_at is None:
            return pending.record.deadline
        return pending.paused_at + self.registry.config.user_wait_limit - pending.waited

    def _schedule(self, pending: PendingRequest) -> None:
        """Have the timer fire at the request's next deadline (the user-wait limit while
        paused); a timer due no later is kept, :meth:`_timeout` looks again then."""
        due = self._due(pending)
        timer = pending.timer
        if timer is not None:
            if pending.timer_due <= due:
                return
            timer.cancel()
        clock = self.registry.config.clock
        pending.timer = clock.call_later(max(0.0, due - clock.time()), self._timeout, pending)
        pending.timer_due = due

    def _timeout(self, pending: PendingRequest) -> None:
        if self.pending.get(pending.id) is not pending:
            return
        pending.timer = None
        now = self.registry.config.clock.time()
        paused_at = pending.paused_at
        if now < self._due(pending):  # progress moved it, or the page waits for the user
            self._schedule(pending)
            return
        seconds = max(0.0, time.perf_counter() - pending.started)
        away = self.connection is None
        why = (" (no page was connected: its tab may be closed, or reloading; a session's "
               "`connected` says whether its page is there)" if away else "")
        if paused_at is not None:
            what = (f"the user did not answer {pending.record.tool!r} within "
                    f"{self.registry.config.user_wait_limit:g} s (--user-wait-limit)")
        else:
            what = f"the page did not answer {pending.record.tool!r} before its deadline{why}"
        self._resolve(pending, tool_error(
            TOOL_TIMEOUT, what,
            details={"waitedMs": round(seconds * 1000), "pageConnected": not away},
            retryable=True,
        ), "none", "timeout")
        self.send(protocol.ToolCancel(tool_request_id=pending.id, reason="timeout").encode())

    def cancel_request(self, pending: PendingRequest, reason: str) -> None:
        """Nobody wants this result any more (cancelled turn, shutdown): tell the page."""
        if self.pending.get(pending.id) is not pending:
            return
        self._resolve(pending, tool_error(
            TOOL_CANCELLED, f"the request was cancelled: {reason}", retryable=False,
        ), "none", "cancelled")
        self.send(protocol.ToolCancel(tool_request_id=pending.id, reason=reason).encode())

    def _resolve(self, pending: PendingRequest, result: Any, handled_by: str, how: str,
                 kept: JsonText | None = None) -> None:
        """The request's result is in: its caller gets ``result``; its record (kept, or
        its turn's journal) keeps it as JSON text (``kept``, if made already)."""
        record = pending.record
        del self.pending[record.id]
        if pending.timer is not None:
            pending.timer.cancel()
        self.finished[record.id] = how
        while len(self.finished) > self.registry.config.remembered_results:
            self.finished.popitem(last=False)
        record.result = kept if kept is not None else as_text(result)
        record.handled_by = handled_by
        if record.turn_id is None:  # kept for GET .../tool-calls/{id} and retries
            self.callers.keep(record)
        else:  # the turn's journal: kept until the turn ends (see turns.py)
            self.registry.store.save_request(record)
        log_event("tool.result", session=self.id, toolRequestId=record.id, tool=record.tool,
                  handledBy=handled_by, outcome=how,
                  ms=(time.perf_counter() - pending.started) * 1000)
        if not pending.future.done():
            pending.future.set_result((result, handled_by))
        pending.wake()

    # --- expiry -------------------------------------------------------------------------

    def expire(self) -> None:
        """Nobody resumed the session in time: fail what is pending and forget it."""
        self._expiry = None
        if self.closed or self.connection is not None:
            return
        self.closed = True
        log_event("session.expired", session=self.id, pending=len(self.pending))
        for pending in list(self.pending.values()):
            self._resolve(pending, tool_error(
                SESSION_EXPIRED,
                "the page's session expired before it came back to answer",
                retryable=False,
            ), "none", "expired")
        self.registry.remove(self)

    def hand_over(self, *, resumed: bool) -> None:
        """Another node holds the session now: close the page's socket here, end the
        waits of this node's callers (``SESSION_MOVED``) and forget the session, writing
        nothing more of it (its records are the other node's now). ``resumed``: the page
        resumed there, so a socket still open here is a duplicate (a second tab):
        ``CLOSE_SUPERSEDED``, it starts afresh. Otherwise the other node took the lease
        without the page (this node's lapsed): the page is asked to reconnect
        (``CLOSE_TRY_AGAIN``) and resumes its session, its calls and turns carrying on."""
        self.closed = True
        connection, self.connection = self.connection, None
        if connection is not None:
            if resumed:
                connection.close(protocol.CLOSE_SUPERSEDED,
                                 "the session was resumed on another Core node")
            else:
                connection.close(protocol.CLOSE_TRY_AGAIN,
                                 "the session moved to another Core node: resume it")
        if self.turn is not None:
            self.turn.abandon()
        moved = tool_error(SESSION_MOVED, "the page's session moved to another Core node "
                           "while this call waited; it carries on there (retry with the "
                           "same Idempotency-Key for its result)", retryable=True)
        pending, self.pending = list(self.pending.values()), {}
        for request in pending:
            if request.timer is not None:
                request.timer.cancel()
            if not request.future.done():
                request.future.set_result((moved, "none"))
            request.wake()
        self.close()
        self.registry.forget(self)
        log_event("session.handed_over", session=self.id, pending=len(pending))

    def close(self) -> None:
        """Shutting down: stop timers (pending requests stay in the store)."""
        for pending in self.pending.values():
            if pending.timer is not None:
                pending.timer.cancel()
                pending.timer = None
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None


def new_ask_id() -> str:
    return secrets.token_hex(12)


class Asked(NamedTuple):
    """A message to another node (JSON) and the future of its reply."""

    message: str
    future: asyncio.Future[dict[str, Any]]
    ask_id: str


@dataclasses.dataclass
class _Ask:
    """An ask waiting for its reply (:meth:`Registry.send`)."""

    node: str
    message: str
    future: asyncio.Future[dict[str, Any]]
    gap: float  # how long after ``sent`` it is sent again
    sent: float | None = None  # when last sent (monotonic); None: not yet
    # raises if a reply is not of the shape its asker reads (a forged one): dropped
    check: Callable[[dict[str, Any]], None] | None = None


class BadMessage(PedelecError, ValueError):
    """A message from another node (or whoever publishes on Redis) of the wrong shape."""


# tasks nobody awaits, held until done (the event loop keeps only weak references)
_BACKGROUND: set[asyncio.Task[None]] = set()
# seconds a node's inbox waits before it is read again after it failed
INBOX_RETRY_SECONDS = 0.5


def background_failed(task: str, exc: Exception) -> None:
    """A round of one of Core's background loops failed: said, and the loop carries on
    (none may die: a node whose lease renewal stopped would lose all its pages)."""
    log_event("cluster.failed", level=logging.WARNING, task=task,
              error=excerpt(f"{type(exc).__name__}: {exc}"))


async def read_forever(task: str, inbox: Callable[[], AsyncIterator[str]],
                       on_message: Callable[[str], None]) -> None:
    """Each message of ``inbox()`` to ``on_message``, for Core's life: if reading fails,
    that is said, and the inbox read again after a pause."""
    while True:
        try:
            async for message in inbox():
                on_message(message)
        except Exception as exc:
            background_failed(task, exc)
        await asyncio.sleep(INBOX_RETRY_SECONDS)


def bad_message(exc: Exception) -> None:
    """A message between nodes that makes no sense: said, and dropped."""
    log_event("cluster.bad_message", level=logging.WARNING,
              error=excerpt(f"{type(exc).__name__}: {exc}"))


#: a client's burst of new regular expressions to check: this many seconds' worth of
#: ``--pattern-rate``
PATTERN_BURST_SECONDS = 4.0


class ClientSessions:
    """One client's sessions here: how many it holds, and which of them await a resume
    (the longest disconnected first)."""

    __slots__ = ("held", "waiting")

    def __init__(self) -> None:
        self.held = 0
        self.waiting: OrderedDict[str, CoreSession] = OrderedDict()


class Registry:
    """Every session Core knows, by id; on a shared store (Redis), every session this
    node holds a lease on."""

    def __init__(self, config: CoreConfig, store: Store, agent_factory: Callable[[], Agent],
                 restore: Callable[[Registry, Snapshot], None]) -> None:
        self.config = config
        self.store = store
        self.agent_factory = agent_factory
        # rebuilds sessions and their turns from the store (turns.restore: turns.py builds
        # on this module, so it is handed in rather than imported)
        self._restore = restore
        self.sessions: dict[str, CoreSession] = {}
        # each client's sessions here (restored ones nobody resumed yet count for none)
        self.clients: dict[str, ClientSessions] = {}
        # bytes queued for all connections, and each client's budget for new patterns
        self.outboxes = Outboxes(config.max_queued_total_bytes)
        self.patterns = PatternBudgets(config.pattern_rate, PATTERN_BURST_SECONDS
                                       * config.pattern_rate)
        # this process, as a node of the cluster sharing the store (Redis)
        self.node = secrets.token_hex(8)
        # sessions taken over by this node, waiting for their holder to let go of them
        self._handovers: dict[str, asyncio.Future[None]] = {}
        # sessions this node is taking (take_over, adopt), each done when that ends: one
        # at a time (a second joins it), and a holder asked to let go finishes it first
        self._taking: dict[str, asyncio.Future[None]] = {}
        # the sessions the store had at this node's start (a shared store), until
        # _take_vacant looked at them
        self._stored_at_start: list[str] = []
        # calls this node forwarded to another, waiting for its reply, by id
        self._asked: dict[str, _Ask] = {}
        # replies that reached no inbox (Redis away, or the asker not subscribed again
        # after a restart of Redis), by ask id, oldest first; and their characters
        self._unheard: OrderedDict[str, str] = OrderedDict()
        self._unheard_chars = 0
        # the ask ids of the calls another node forwarded here, while they run: each
        # one's future is done once its caller hung up at that node
        self._answering: dict[str, asyncio.Future[None]] = {}
        # runs a call another node forwarded here (set by the router, routing.py)
        self.serve_forwarded: Callable[[Any, asyncio.Future[None]],
                                       Awaitable[dict[str, Any]]] | None = None
        # other messages between nodes, by the field naming their kind (relay.py's)
        self.handlers: dict[str, Callable[[dict[str, Any]], None]] = {}
        # told of every change of a session's tools, by its id (relay.py, for other nodes)
        self.on_tools_changed: Callable[[str], None] | None = None

    def create(self, metadata: PageMetadata, client: str,
               session_id: str | None = None) -> CoreSession:
        """A new session for ``client`` (its id ``session_id``, from
        :meth:`new_session_id`, if given); :class:`SessionRefused` when Core holds
        ``max_sessions``, or the client ``max_sessions_per_client``, and no session of
        this client awaits a resume (else the one of them disconnected longest is expired
        to make room: another client's session never is)."""
        config = self.config
        mine = self.clients.get(client)
        while mine is not None and mine.waiting and (
                len(self.sessions) >= config.max_sessions
                or mine.held >= config.max_sessions_per_client):
            _, oldest = mine.waiting.popitem(last=False)
            log_event("session.evicted", session=oldest.id, sessions=len(self.sessions),
                      client=client)
            oldest.expire()
            mine = self.clients.get(client)
        if len(self.sessions) >= config.max_sessions:
            log_event("session.refused", sessions=len(self.sessions), client=client)
            raise SessionRefused(TOO_MANY_SESSIONS, (
                f"Core already holds {config.max_sessions} sessions (--max-sessions), none "
                "of this client's awaiting a resume; try again later"))
        if mine is not None and mine.held >= config.max_sessions_per_client:
            log_event("session.refused", sessions=len(self.sessions), client=client,
                      held=mine.held)
            raise SessionRefused(TOO_MANY_SESSIONS, (
                f"this client already holds {config.max_sessions_per_client} sessions, all "
                "connected (--max-sessions-per-client); try again later"))
        token = secrets.token_urlsafe(32)
        record = SessionRecord(
            id=session_id or secrets.token_urlsafe(18), token_hash=hash_token(token),
            tools=metadata.tools_json, history="[]", created_at=time.time(),
        )
        session = CoreSession(self, record, metadata.client_json, metadata.names)
        session.resume_token = token
        self.sessions[record.id] = session
        self._count(session, client)
        self.store.save_session(record)
        log_event("session.created", session=record.id, tools=len(metadata.names))
        return session

    def resume(self, session_id: str, resume_token: str | None,
               client: str) -> CoreSession | None:
        """The session, if the token is right; None says nothing about why. A session
        restored from the store counts for the first client to resume it (a resume is
        never refused for a client's count: it makes no new session)."""
        session = self.sessions.get(session_id)
        expected = session.record.token_hash if session is not None else _NO_SESSION_HASH
        given = resume_token or ""
        # compare even when the session is unknown, so timing says nothing either
        ok = hmac.compare_digest(expected.encode(), hash_token(given).encode())
        if session is None or not ok or session.closed:
            return None
        session.resume_token = given
        if session.client is None:
            self._count(session, client)
        return session

    def _count(self, session: CoreSession, client: str) -> None:
        session.client = client
        share = self.clients.get(client)
        if share is None:
            share = self.clients[client] = ClientSessions()
        share.held += 1
        if session.connection is None and session.disconnected_at is not None:
            share.waiting[session.id] = session

    def _share(self, session: CoreSession) -> ClientSessions | None:
        return None if session.client is None else self.clients.get(session.client)

    def waits(self, session: CoreSession) -> None:
        """``session`` is disconnected: it waits for a resume (the longest first)."""
        share = self._share(session)
        if share is not None:
            share.waiting[session.id] = session

    def waits_no_more(self, session: CoreSession) -> None:
        share = self._share(session)
        if share is not None:
            share.waiting.pop(session.id, None)

    def get(self, session_id: str) -> CoreSession | None:
        return self.sessions.get(session_id)

    def remove(self, session: CoreSession) -> None:
        if self.forget(session):
            self.store.delete_session(session.id)
            if self.store.shared:
                self.spawn(self.store.release(session.id, self.node))

    def forget(self, session: CoreSession) -> bool:
        """Let go of ``session`` here (the store is left as it is); False if it was gone."""
        session.close()
        if self.sessions.get(session.id) is not session:
            return False
        del self.sessions[session.id]
        client = session.client
        share = None if client is None else self.clients.get(client)
        if client is not None and share is not None:
            share.waiting.pop(session.id, None)
            share.held -= 1
            if not share.held:
                del self.clients[client]
        return True

    # --- the cluster (a shared store) ----------------------------------------------------

    def spawn(self, work: Awaitable[Any]) -> asyncio.Task[None]:
        """``work`` on its own: a failure is logged (a store out of reach: the lease
        expires)."""
        async def run() -> None:
            try:
                await work
            except BadMessage as exc:
                bad_message(exc)
            except Exception as exc:
                background_failed("spawned", exc)
        _BACKGROUND.add(task := asyncio.ensure_future(run()))
        task.add_done_callback(_BACKGROUND.discard)
        return task

    async def new_session_id(self) -> str | None:
        """On a shared store: a new session's id, its lease this node's already (so a
        call for it arriving at another node right after the welcome is routed here);
        None if the store cannot be reached (the session is made anyway; renewal takes
        its lease)."""
        if not self.store.shared:
            return None
        session_id = secrets.token_urlsafe(18)
        try:
            await self.store.claim(session_id, self.node, LEASE_SECONDS)
        except StoreError as exc:
            log_event("cluster.failed", level=logging.WARNING, error=str(exc))
        return session_id

    async def take_over(self, session_id: str, resume_token: str | None) -> bool:
        """A page resumes here a session this node does not hold: if the store has it
        and the token is right, claim its lease, have the node that held it let go (and
        store what it had), then load it here as a restart of Core would. A take-over
        under way here is joined first. True once done (the session is here, or
        :meth:`resume` refuses it); False if the store could not be reached: nothing is
        known of the session, so the page must try again, not be refused."""
        if not self.store.shared:
            return True
        while (under_way := self._taking.get(session_id)) is not None:
            await asyncio.shield(under_way)
        if session_id in self.sessions:
            return True
        done = self._taking[session_id] = asyncio.get_running_loop().create_future()
        try:
            return await self._take_over(session_id, resume_token)
        except StoreError as exc:
            log_event("cluster.failed", level=logging.WARNING, session=session_id,
                      error=str(exc))
            return False
        finally:
            del self._taking[session_id]
            done.set_result(None)

    async def _take_over(self, session_id: str, resume_token: str | None) -> bool:
        # the session's own row first: a wrong token costs one small read, not the
        # whole session (its kept results and history); its lease is read with it,
        # whatever is found (timing says nothing of which sessions exist)
        record, holder = await asyncio.gather(self.store.load_session_record(session_id),
                                              self.store.holder(session_id))
        stored = record.token_hash if record is not None else _NO_SESSION_HASH
        if not (hmac.compare_digest(stored.encode(), hash_token(resume_token or "").encode())
                and record is not None):
            if record is None and holder not in (None, self.node):
                # held, but not stored: Redis lost its data and the holder has not stored
                # it again yet (its next renewal does): the page tries again
                log_event("session.not_stored_yet", session=session_id)
                return False
            return True  # refused by resume(), which says nothing more
        previous = await self.store.claim(session_id, self.node, LEASE_SECONDS)
        if previous not in (None, self.node):
            log_event("session.taking_over", session=session_id, node=previous)
            waiting = self._handovers[session_id] = (
                asyncio.get_running_loop().create_future())
            try:
                await self.store.publish(previous, json.dumps(
                    {"handOver": session_id, "to": self.node}))
                try:
                    await asyncio.wait_for(waiting, HANDOVER_SECONDS)
                except TimeoutError:
                    log_event("session.holder_silent", session=session_id, node=previous)
            finally:
                del self._handovers[session_id]
            # another page (a second tab) may have claimed it meanwhile: it is theirs
            if (await self.store.renew([session_id], self.node, LEASE_SECONDS)).lost:
                log_event("session.claimed_meanwhile", session=session_id)
                return True
        snapshot = await self.store.load_session(session_id)
        if session_id not in self.sessions and snapshot.sessions:
            self._restore(self, snapshot)
        return True

    async def adopt(self, session_id: str) -> bool:
        """A call for a session no node holds (its node died; the page is away): load
        it here and hold it, so the call waits here for the page to come back. A lease
        missing is first waited on for :data:`VACANT_SECONDS` (its live holder takes it
        back). False if the call must be routed again (another node holds it, or this
        node is taking it already)."""
        if session_id in self.sessions:
            return True
        if session_id in self._taking:
            return False
        snapshot = await self.store.load_session(session_id)
        if not snapshot.sessions:
            return True  # no such session: the routes say so
        holder = await self.store.holder(session_id)
        vacant = holder is None
        if vacant:
            loop = asyncio.get_running_loop()
            end = loop.time() + VACANT_SECONDS
            while loop.time() < end:
                await asyncio.sleep(_VACANT_POLL)
                if await self.store.holder(session_id) is not None:
                    return False
        elif holder != self.node:
            return False
        if session_id in self.sessions:
            return True
        if session_id in self._taking:
            return False
        done = self._taking[session_id] = asyncio.get_running_loop().create_future()
        try:
            if (await self.store.renew([session_id], self.node, LEASE_SECONDS)).lost:
                return False
            if vacant:  # what its last holder stored while this node waited
                snapshot = await self.store.load_session(session_id)
            if session_id not in self.sessions and snapshot.sessions:
                self._restore(self, snapshot)
            return True
        finally:
            del self._taking[session_id]
            done.set_result(None)

    async def still_held(self, session_id: str, holder: str) -> bool:
        """Whether ``holder`` still holds the session, for a call waiting for its reply;
        True while the store is out of reach: the call was sent and may have run, so it
        waits for its reply (sent again once Redis is back) rather than failing and being
        run again by a retry."""
        try:
            return await self.store.holder(session_id) == holder
        except StoreError as exc:
            log_event("cluster.failed", level=logging.WARNING, session=session_id,
                      error=str(exc))
            return True

    @contextlib.contextmanager
    def asking(self, node: str, message: dict[str, Any], ask_id: str,
               check: Callable[[dict[str, Any]], None] | None = None) -> Iterator[Asked]:
        """A message to ``node`` with a reply expected; the reply's future while inside.
        ``ask_id``: from :func:`new_ask_id`, one per call however often it is routed
        again: a holder that kept its reply to it (nobody heard it: :meth:`reply`)
        answers the call routed to it again from that, not by running it again.
        ``check`` raises for a reply not of the shape the asker reads: that one is
        dropped (logged) and the future waits on for the real one."""
        text = json.dumps({**message, "ask": ask_id, "from": self.node})
        ask = self._asked[ask_id] = _Ask(node, text, asyncio.get_running_loop().create_future(),
                                         RESEND_SECONDS, check=check)
        try:
            yield Asked(text, ask.future, ask_id)
        finally:
            del self._asked[ask_id]

    async def send(self, asked: Asked) -> None:
        """Publish an ask of :meth:`asking`; :meth:`_resend` sends it again while it
        waits for its reply."""
        ask = self._asked[asked.ask_id]
        await self.store.publish(ask.node, ask.message)
        ask.sent = time.monotonic()

    async def _resend(self) -> None:
        """Pub/sub delivers a message only to the inboxes subscribed at that moment, and
        a subscriber cut off loses what it had not read: after Redis dropped its
        subscribers (a restart, a network cut), an ask sent before its holder's inbox
        subscribed again, or a reply sent before this node's did, is lost, and its caller
        would wait until its limit with the holder alive. So every ask is sent again
        until its reply comes, :data:`RESEND_SECONDS` after it was sent, then at twice the
        last gap up to :data:`RESEND_MAX_SECONDS`: the holder ignores one it is still
        answering (:meth:`_on_message`) and answers a later one from the same request
        (the call's key), which runs once."""
        while True:
            await asyncio.sleep(RESEND_SECONDS / 2)
            now = time.monotonic()
            try:
                for ask in list(self._asked.values()):
                    if ask.sent is None or now - ask.sent < ask.gap or ask.future.done():
                        continue
                    await self.store.publish(ask.node, ask.message)
                    ask.sent = time.monotonic()
                    ask.gap = min(2 * ask.gap, RESEND_MAX_SECONDS)
            except Exception as exc:  # out of reach, refused: again next time
                background_failed("resend", exc)

    async def _answer(self, message: dict[str, Any], hung_up: asyncio.Future[None]) -> None:
        """A call another node forwarded: run it here (its caller hanging up once
        ``hung_up`` is done), send the reply back."""
        serve = self.serve_forwarded
        if serve is None:
            return
        reply = await serve(message["http"], hung_up)
        await self.reply(str(message["from"]), str(message["ask"]), reply)

    async def reply(self, node: str, ask_id: str, answer: dict[str, Any]) -> None:
        """Publish ``answer`` to ask ``ask_id`` of ``node``. One that reached no inbox
        is kept (:data:`UNHEARD_REPLIES`) and published again when the ask comes again
        (:meth:`_resend`): it is not run again, so a call runs once even when its kept
        result is gone (``--kept-results``) by the time Redis is back."""
        await self._deliver(node, ask_id, json.dumps({"reply": ask_id, **answer}))

    async def _deliver(self, node: str, ask_id: str, text: str) -> None:
        try:
            reached = await self.store.publish(node, text)
        except StoreError:
            reached = 0
        self._unheard_chars -= len(self._unheard.pop(ask_id, ""))
        if reached:
            return
        self._unheard[ask_id] = text
        self._unheard_chars += len(text)
        while len(self._unheard) > UNHEARD_REPLIES or (
                self._unheard_chars > UNHEARD_REPLY_CHARS and len(self._unheard) > 1):
            _, dropped = self._unheard.popitem(last=False)
            self._unheard_chars -= len(dropped)
        log_event("cluster.reply_unheard", level=logging.WARNING, node=node,
                  kept=len(self._unheard))

    async def _let_go(self, session_id: str, to: str) -> None:
        """Node ``to`` took the session over: hand it over, store what is queued, say so.
        A take-over of it under way here ends first (``to`` then loads what it stored)."""
        under_way = self._taking.get(session_id)
        if under_way is not None:
            await asyncio.wait([under_way], timeout=HANDOVER_SECONDS)
        session = self.sessions.get(session_id)
        if session is not None:
            session.hand_over(resumed=True)
            await self.store.flush()
        await self.store.publish(to, json.dumps({"handedOver": session_id}))

    async def serve_cluster(self) -> None:
        """For Core's life, on a shared store: this node's inbox (sessions other nodes
        take over, and their answers) and its leases, renewed every third of their TTL;
        a session another node holds now is handed over."""
        if not self.store.shared:
            return
        background = [asyncio.ensure_future(work) for work in (
            self._renew_leases(), self._resend(), self._take_vacant())]
        try:
            await read_forever("inbox", lambda: self.store.inbox(self.node),
                               lambda text: self._on_message(text))
        finally:
            for task in background:
                task.cancel()

    def _on_message(self, text: str) -> None:
        try:
            message = json.loads(text)
            ask = message.get("ask")
            unheard = self._unheard.get(ask) if isinstance(ask, str) else None
            if unheard is not None and "from" in message:  # an ask sent again: answered
                self.spawn(self._deliver(str(message["from"]), str(message["ask"]), unheard))
            elif "handOver" in message:
                self.spawn(self._let_go(str(message["handOver"]), str(message["to"])))
            elif "http" in message:
                ask_id = str(message["ask"])
                if ask_id not in self._answering:  # else an ask sent again (_resend)
                    hung_up = self._answering[ask_id] = (
                        asyncio.get_running_loop().create_future())
                    self.spawn(self._answer(message, hung_up)).add_done_callback(
                        lambda _: self._answering.pop(ask_id, None))
            elif "hungUp" in message:  # the caller of a call answered here hung up
                answering = self._answering.get(str(message["hungUp"]))
                if answering is not None and not answering.done():
                    answering.set_result(None)
            elif "reply" in message:
                asked = self._asked.get(str(message["reply"]))
                if asked is not None and not asked.future.done():
                    if asked.check is not None:
                        asked.check(message)
                    asked.future.set_result(message)
            elif "handedOver" in message:
                waiting = self._handovers.get(str(message["handedOver"]))
                if waiting is not None and not waiting.done():
                    waiting.set_result(None)
            else:
                for kind, handle in self.handlers.items():
                    if kind in message:
                        handle(message)
        except Exception as exc:  # whatever a message holds (JSON nested past the
            # recursion limit, a number no float holds): dropped, the inbox serves on
            bad_message(exc)

    async def _renew_leases(self) -> None:
        """Every third of a lease; a round that failed is tried again at once (after
        :data:`_VACANT_POLL`), once: after Redis restarted, the first command on each
        of the node's connections to it fails, and a lease has no time to lose."""
        quick = False  # the round before failed: this one comes at once
        while True:
            await asyncio.sleep(_VACANT_POLL if quick else LEASE_SECONDS / 3)
            retried, quick = quick, False
            try:
                renewal = await self.store.renew(list(self.sessions), self.node,
                                                 LEASE_SECONDS)
                for session_id in renewal.lost:
                    session = self.sessions.get(session_id)
                    if session is not None:  # taken without the page: it resumes there
                        session.hand_over(resumed=False)
                if renewal.retaken:
                    await self._store_again(renewal.retaken)
            except Exception as exc:  # out of reach, refused: renewed next round
                background_failed("renew", exc)
                quick = not retried

    async def _store_again(self, session_ids: list[str]) -> None:
        """Of the sessions whose lease was missing, those the store lost too (Redis
        restarted without its data, or it was flushed): stored again whole, from what
        this node holds, so that other nodes find them (a page resuming there, a call,
        ``tools/list``) as if nothing had happened. A lease that merely lapsed (Redis
        away, this node stalled) finds the rows there: nothing is written."""
        for session_id in await self.store.unstored(session_ids):
            session = self.sessions.get(session_id)
            if session is None or session.closed:
                continue
            store = self.store
            store.save_session(session.record)
            for pending in session.pending.values():
                store.save_request(pending.record)
            unsent = {ended.record.id for ended in session.unsent_ends}
            for ended in session.ended.values():  # as kept to send its end again
                store.save_turn(dataclasses.replace(
                    ended.record, end_delivered=ended.record.id not in unsent))
            if session.turn is not None:
                session.turn.store_again()
            session.callers.store_again()
            log_event("cluster.stored_again", level=logging.WARNING, session=session_id,
                      pending=len(session.pending))

    def restorable(self, snapshot: Snapshot) -> Snapshot:
        """At start, what of the store to restore at once: all of it on a store of this
        process's own. On a shared store nothing: the sessions no live node holds are
        taken later (:meth:`_take_vacant`). Taken at once, the session of a live node
        whose lease lapsed (Redis restarted, every lease gone) would have two holders,
        its page on one while calls go to the other."""
        if not self.store.shared:
            return snapshot
        self._stored_at_start = [record.id for record in snapshot.sessions]
        return Snapshot()

    async def _take_vacant(self) -> None:
        """The sessions stored at this node's start that no node holds (their node died,
        or the cluster stopped): taken and restored here, so that their requests time
        out and they expire as on one node, once their lease has stayed missing for
        :data:`VACANT_SECONDS` at every look (each :data:`_VACANT_POLL`). One a node holds
        at a look is left to it (a page's take-over or a call's adopt brings it here
        later). A look that fails (Redis away, or refusing) starts every wait over: a live
        holder whose lease lapsed meanwhile takes it back at its first renewal after."""
        waiting, self._stored_at_start = set(self._stored_at_start), []
        missing_since: dict[str, float] = {}
        loop = asyncio.get_running_loop()
        while waiting:
            waiting -= self.sessions.keys()
            looked = list(waiting)
            try:
                held = await self.store.holders(looked)
                now = loop.time()
                due = []
                for session_id, holder in zip(looked, held, strict=True):
                    if holder not in (None, self.node):  # (this node's: taken, not restored)
                        waiting.discard(session_id)
                    elif now - missing_since.setdefault(session_id, now) >= VACANT_SECONDS \
                            and session_id not in self._taking:
                        due.append(session_id)
                if due:
                    await self._take(due)
                    waiting -= set(due)
            except Exception as exc:  # out of reach, refused: looked at afresh later
                background_failed("take_vacant", exc)
                missing_since.clear()
            await asyncio.sleep(_VACANT_POLL)

    async def _take(self, session_ids: list[str]) -> None:
        """Take the leases of ``session_ids`` still missing (the store's conditional
        take) and restore those sessions here, in one restore (a session gone meanwhile
        is let go again)."""
        loop = asyncio.get_running_loop()
        taking = {session_id: loop.create_future() for session_id in session_ids}
        self._taking.update(taking)  # a take-over or adopt here waits for these
        try:
            held = set((await self.store.renew(session_ids, self.node, LEASE_SECONDS)).lost)
            taken = Snapshot()
            for session_id in session_ids:
                if session_id in held:
                    continue
                snapshot = await self.store.load_session(session_id)
                if not snapshot.sessions:
                    await self.store.release(session_id, self.node)
                taken.sessions += snapshot.sessions
                taken.requests += snapshot.requests
                taken.turns += snapshot.turns
                taken.keys += snapshot.keys
            if taken.sessions:
                self._restore(self, taken)
        finally:
            for session_id, done in taking.items():
                del self._taking[session_id]
                done.set_result(None)

    async def shutdown(self, timeout: float = SHUTDOWN_SECONDS) -> None:
        """Cancel running turns (they end ``cancelled``), stop timers, flush the store:
        all within ``timeout`` seconds, whatever the store is doing."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        runners = [s.turn for s in self.sessions.values() if s.turn is not None]
        for runner in runners:
            runner.cancel("Core is shutting down")
        tasks = [r.task for r in runners if r.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)
        for session in self.sessions.values():
            session.close()
        try:
            await self.store.flush(timeout=max(0.0, deadline - loop.time()))
            if self.store.shared:  # other nodes take its sessions over at once
                await asyncio.wait_for(asyncio.gather(*(
                    self.store.release(session_id, self.node) for session_id in self.sessions
                )), max(0.0, deadline - loop.time()))
        except (StoreError, TimeoutError) as exc:
            log_event("store.shutdown_failed", level=logging.WARNING, error=str(exc))
