"""One page session as Core holds it.

A session outlives its connections: when a page's WebSocket drops, the session keeps its
pending requests (their deadlines keep running) and waits ``session_ttl`` seconds to be
resumed by id and token. Results are keyed by ``toolRequestId``: each pending request is
resolved exactly once (by the page's result, its deadline, a cancellation or expiry);
whatever arrives after that is refused with an ``error`` frame and changes nothing.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from ... import protocol
from ...results import TOOL_CANCELLED, TOOL_TIMEOUT, tool_error
from ..agents.contract import Agent
from ..clock import Timer
from ..config import CoreConfig
from ..log import log_event
from ..offload import LARGE_CHARS
from ..store import (
    RECENT_TURNS,
    STORE_FAILED,
    IdempotencyRecord,
    JsonText,
    RequestRecord,
    SessionRecord,
    Store,
    StoreError,
    TurnRecord,
    as_text,
)
from .codes import (
    DUPLICATE_RESULT,
    LATE_RESULT,
    MAX_PROGRESS_MESSAGE_CHARS,
    SESSION_CLOSED,
    SESSION_EXPIRED,
    SESSION_MOVED,
    TOO_MANY_PENDING,
    UNKNOWN_TOOL_REQUEST,
)
from .frames import (
    CheckedRequest,
    EndedTurn,
    checked_request_frame,
    end_frame,
    new_request_id,
    refused_request,
)
from .history import HistoryIndex
from .idempotency import CallerMemory
from .metadata import PageMetadata
from .pending import RequestProgress, TrackedRequest


class Connection(Protocol):
    """A page's live connection, as sessions see it."""

    def send(self, frame: str) -> None: ...

    def send_request(self, request_id: str) -> None:
        """A pending request goes out, after what was sent before it: its frame is taken
        as it does (:meth:`CoreSession.request_frame`)."""

    def flush(self) -> None:
        """The frames sent so far go out now (else at the end of the loop's step)."""

    def close(self, code: int, reason: str) -> None: ...


class SessionOwner(Protocol):
    """The registry holding a session (:class:`~.registry.Registry`), as the session and
    those working with it (turns, the control API) see it."""

    config: CoreConfig
    store: Store
    agent_factory: Callable[[], Agent]
    on_tools_changed: Callable[[str], None] | None

    def waits(self, session: CoreSession) -> None: ...

    def waits_no_more(self, session: CoreSession) -> None: ...

    def remove(self, session: CoreSession) -> None: ...

    def forget(self, session: CoreSession) -> bool: ...


class RunningTurn(Protocol):
    """A session's running turn (:class:`~.turns.TurnRunner`), as sessions see it."""

    turn_id: str
    record: TurnRecord
    task: asyncio.Task[TurnRecord] | None

    def cancel(self, reason: str) -> None: ...

    def abandon(self) -> None: ...

    def store_again(self) -> None:
        """Write the turn and its requests again (the store lost them)."""


class CoreSession:
    """One page session as Core holds it."""

    def __init__(self, registry: SessionOwner, record: SessionRecord,
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
        self.pending: dict[str, TrackedRequest] = {}
        # requests resolved lately: id -> how ("delivered", "timeout", "cancelled", ...)
        self.finished: OrderedDict[str, str] = OrderedDict()
        self.turn: RunningTurn | None = None
        # where the turns of the agent's history (record.history) begin, while it is a
        # text Core can cut without decoding it
        self.history_index: HistoryIndex | None = None
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
                                    config.result_retention, config.clock)
        self._expiry: Timer | None = None
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
    def state(self) -> protocol.SessionStateName:
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
            # (one whose store write is under way goes out once that is done)
            if pending.released and not pending.record.answered:
                connection.send_request(pending.id)
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
        clock = self.registry.config.clock
        self.disconnected_at = clock.time()
        self.registry.waits(self)
        self._expiry = clock.call_later(self.registry.config.session_ttl, self.expire)

    def send(self, frame: str) -> bool:
        connection = self.connection
        if connection is None:
            return False
        connection.send(frame)
        return True

    def flush(self) -> None:
        """What this step sent goes out now: its caller waits for the page next."""
        if self.connection is not None:
            self.connection.flush()

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
    ) -> TrackedRequest:
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
    ) -> TrackedRequest:
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
        self.flush()
        return pending

    async def stored(self, *keys: str, large: bool = False) -> None:
        """Return once the writes of ``keys`` are stored (:class:`StoreError` if they
        cannot be). A store that keeps nothing has nothing to wait for: there only work
        that was ``large`` yields to the loop, as every store's flush does (other clients'
        work comes in between), not every call or turn."""
        store = self.registry.store
        if store.durable or large:
            await store.flush(*keys)

    async def store_requests(self, opened: list[TrackedRequest], *keys: str) -> None:
        """Flush the store before ``opened`` go out (with the writes of ``keys``, e.g.
        their turn's). If it cannot take them, each is answered ``STORE_FAILED`` and never
        sent: a page must not run what a restart of Core would not know of."""
        try:
            await self.stored(*(pending.id for pending in opened), *keys, large=any(
                len(pending.frame or "") > LARGE_CHARS for pending in opened))
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
        on_progress: Callable[[RequestProgress], Awaitable[None]] | None = None,
    ) -> tuple[str, Any, str]:
        """:meth:`start_call`, then its result → ``(toolRequestId, result, handledBy)``
        (a long result that is not an error result as the page's JSON text, a
        :class:`JsonText`); a timeout is the result ``TOOL_TIMEOUT``. If the caller goes
        away (its task is cancelled), the request is cancelled and the page told.
        ``on_progress`` is awaited with each new progress (the latest, if it is slower
        than the page)."""
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
               idle: float | None = None, limit: float | None = None, *,
               stored: bool = False) -> TrackedRequest:
        """Hold ``record`` pending (``stored``: restored from the store, so released to
        the page at once). Restored after a restart, it has no ``idle`` or ``limit`` of its
        own: its tool's timeout, and the default limit past its stored deadline."""
        config = self.registry.config
        if idle is None:
            idle = config.timeout_for(record.tool)
        if limit is None:
            limit = record.deadline + config.max_total_for(idle) - idle
        pending = TrackedRequest(record, frame, idle, limit, config.clock.monotonic())
        pending.released = stored
        self.pending[record.id] = pending
        self._schedule(pending)
        limit = self.registry.config.max_pending
        if len(self.pending) > limit:  # answered at once; kept in a turn's journal
            self._resolve(pending, tool_error(
                TOO_MANY_PENDING,
                f"this session already has {limit} tool requests pending (--max-pending)",
                retryable=True), "none", "refused")
        return pending

    def send_request(self, pending: TrackedRequest) -> None:
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
        pending.released = True
        if self.connection is not None:
            self.connection.send_request(pending.id)

    def request_frame(self, request_id: str) -> str | None:
        """The frame of a request that is still pending and unanswered, as it goes out to
        the page; None if it was answered, cancelled or timed out since it was queued."""
        pending = self.pending.get(request_id)
        if pending is None or pending.record.answered:
            return None
        if pending.frame is None:  # restored after a restart: made once, kept to send again
            pending.frame = pending.message().encode()
        return pending.frame

    def refuse_request(self, pending: TrackedRequest, exc: protocol.ProtocolError) -> None:
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

    def accept_progress(self, message: protocol.ToolProgressMessage) -> None:
        """Keep the latest progress of a pending request (the caller checked it is) and
        move its idle deadline. A value that does not increase is dropped: a handler run
        again after a reload starts over, and no caller may see progress go back."""
        pending = self.pending[message.tool_request_id]
        last = pending.progress
        if last is not None and message.progress <= last.progress:
            return
        text = message.message
        pending.progressed(RequestProgress(
            message.progress, message.total,
            None if text is None else text[:MAX_PROGRESS_MESSAGE_CHARS]),
            self.registry.config.clock.time())

    def accept_waiting(self, message: protocol.ToolWaiting) -> None:
        """The page waits for the user (or no longer) on a pending request: its deadline
        stops (up to ``--user-wait-limit``), or runs again from where it stopped."""
        pending = self.pending[message.tool_request_id]
        if not message.waiting:
            self._stop_waiting(pending)
            return
        pending.status = ("awaiting_approval" if message.reason == protocol.APPROVAL_REASON
                          else "waiting_for_user")
        if pending.pause(self.registry.config.clock.time()):
            self._schedule(pending)
        pending.wake()  # a caller's event stream says it waits

    def _stop_waiting(self, pending: TrackedRequest) -> None:
        pending.status = "running"
        pending.wake()
        if pending.unpause(self.registry.config.clock.time()):
            self._schedule(pending)

    def _schedule(self, pending: TrackedRequest) -> None:
        """Have the timer fire at the request's next deadline (the user-wait limit while
        paused); a timer due no later is kept, :meth:`_timeout` looks again then."""
        due = pending.due(self.registry.config.user_wait_limit)
        timer = pending.timer
        if timer is not None:
            if pending.timer_due <= due:
                return
            timer.cancel()
        clock = self.registry.config.clock
        pending.timer = clock.call_later(max(0.0, due - clock.time()), self._timeout, pending)
        pending.timer_due = due

    def _timeout(self, pending: TrackedRequest) -> None:
        if self.pending.get(pending.id) is not pending:
            return
        pending.timer = None
        now = self.registry.config.clock.time()
        paused_at = pending.paused_at
        # progress moved it, or the page waits for the user
        if now < pending.due(self.registry.config.user_wait_limit):
            self._schedule(pending)
            return
        seconds = max(0.0, self.registry.config.clock.monotonic() - pending.started)
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

    def cancel_request(self, pending: TrackedRequest, reason: str) -> None:
        """Nobody wants this result any more (cancelled turn, shutdown): tell the page."""
        if self.pending.get(pending.id) is not pending:
            return
        self._resolve(pending, tool_error(
            TOOL_CANCELLED, f"the request was cancelled: {reason}", retryable=False,
        ), "none", "cancelled")
        self.send(protocol.ToolCancel(tool_request_id=pending.id, reason=reason).encode())

    def _resolve(self, pending: TrackedRequest, result: Any, handled_by: str, how: str,
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
                  ms=(self.registry.config.clock.monotonic() - pending.started) * 1000)
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
