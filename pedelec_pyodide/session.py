"""Session: the wire and turn protocol around the dispatch engine (``dispatch.py``).

A Session works with no transport at all (tests, notebooks: ``await session.dispatch``).
An I/O adapter (the browser bridge, a test's WebSocket) attaches a :class:`Transport` and
feeds frames from Core to :meth:`Session.receive`; the Session answers through
``transport.send``, and tells the adapter what it must act on through the explicit
:class:`AdapterEvents` callbacks. Work that outlives a frame (an async handler) is spawned
through the :class:`~pedelec_pyodide.dispatch.Scheduler` the adapter chose. Nothing here
imports ``js``.
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import logging
import os
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from . import protocol
from .context import ApprovalRequest, Source, ToolContext
from .dispatch import (
    APPROVAL_REASON,
    DEFAULT_CANCEL_GRACE,
    Approver,
    Engine,
    InFlight,
    PendingRequest,
    Registration,
    RunningLoop,
    Scheduler,
    ToolCall,
    ToolProgress,
    ToolStatus,
)
from .errors import NotConnectedError, SessionClosedError, TurnError
from .ledger import Ledger, MemoryLedger
from .protocol import ProtocolError
from .results import DEFAULT_MAX_RESULT_BYTES
from .text import lone_surrogate_at, not_unicode
from .tools import Tool

logger = logging.getLogger("pedelec_pyodide")

Disposer = Callable[[], None]

#: the ``details.reason`` of a request answered ``TOOL_CANCELLED`` because its session closed
SESSION_CLOSED_REASON = "the session was closed"
#: the reason of a request cancelled because the caller of ``dispatch`` stopped waiting
CALLER_GONE_REASON = "its caller stopped waiting"
#: Core's refusals (core/sessions/session.py) of a frame about a request it has given up on: after
#: its ``tool.cancel`` they are what a frame already on its way gets, not a bug
_AFTER_CORE_CANCEL = frozenset({protocol.UNKNOWN_TOOL_REQUEST, protocol.LATE_RESULT})
#: how many of the requests Core cancelled the session remembers for that
_CORE_CANCELS_KEPT = 256

__all__ = [
    "TURN_LOST", "AdapterEvents", "ApprovalRequest", "NotConnectedError", "PendingRequest",
    "Session", "SessionClosedError", "SessionState", "ToolCall", "ToolContext",
    "ToolProgress", "ToolStatus", "ToolsChanged", "Transport", "TurnError",
]


class SessionState(enum.StrEnum):
    CONNECTING = "connecting"
    IDLE = "idle"
    RUNNING = "running"
    WAITING_TOOL_RESULT = "waiting_tool_result"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class ToolsChanged:
    """Session event: a tool was added or removed; ``tools``: the names defined now."""

    tools: tuple[str, ...]


class Transport(Protocol):
    """What an I/O adapter gives the Session: a way to send one text frame."""

    def send(self, frame: str) -> None: ...


class AdapterEvents(Protocol):
    """What the Session tells the adapter that connected it (see ``connection_made``)."""

    def welcomed(self, welcome: protocol.Welcome) -> None:
        """Core welcomed the session (new or resumed)."""

    def refused(self, error: protocol.Error) -> None:
        """Core answered an ``error`` before its welcome (e.g. an unknown session)."""

    def session_closed(self) -> None:
        """``session.close()`` was called: close the connection for good."""


#: ``TurnError.code`` of a turn whose session could not be resumed (its end is unknown)
TURN_LOST = "TURN_LOST"

Listener = Callable[[Any], None]


class Session:
    """Tool definitions, handlers, the dispatch of tool requests, and turns.

    Events passed to :meth:`subscribe` listeners: a :class:`SessionState` when the state
    changes; a :class:`ToolStatus` when a request begins, changes status or is answered;
    a :class:`ToolProgress` as progress is sent; a :class:`ToolCall` when a request
    finishes; a :class:`ToolsChanged` when a tool is added or removed; and the
    :mod:`protocol` messages ``Welcome``, ``TurnDelta``, ``TurnEnd`` and ``Error`` as they
    arrive from Core.
    """

    def __init__(
        self,
        tools: Iterable[Tool] = (),
        *,
        max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
        ledger: Ledger | None = None,
        client: Mapping[str, Any] | None = None,
        explain_error: Callable[[BaseException], str | None] | None = None,
        scheduler: Scheduler | None = None,
        cancel_grace: float = DEFAULT_CANCEL_GRACE,
        default_approver: Approver | None = None,
    ) -> None:
        if not cancel_grace >= 0:
            raise ValueError(f"cancel_grace must be a number of seconds >= 0, got "
                             f"{cancel_grace!r}")
        self.session_id: str | None = None
        self.resume_token: str | None = None
        self.client = dict(client or {"name": "pedelec-pyodide"})
        self._scheduler = scheduler if scheduler is not None else RunningLoop()
        self._listeners: list[_Subscription] = []
        # per event class, the subscriptions that take it (kept in place: the engine holds
        # these lists): an event no one takes is not built
        self._hears: dict[type, list[_Subscription]] = {
            kind: [] for kind in (SessionState, ToolStatus, ToolCall, ToolProgress,
                                  ToolsChanged)}
        #: ``explain_error`` adds a sentence to a ``TOOL_HANDLER_ERROR`` message for
        #: exceptions the runtime can explain (the browser edge: no DOM in a Web Worker)
        self._engine = Engine(
            self, _Outbox(self), ledger if ledger is not None else MemoryLedger(),
            max_result_bytes=max_result_bytes, scheduler=self._scheduler,
            cancel_grace=cancel_grace, explain_error=explain_error)
        self._engine.default_approver = default_approver
        self._turns: dict[str, asyncio.Future[str]] = {}
        self._turn_texts: dict[str, str] = {}
        self._transport: Transport | None = None
        self._adapter: AdapterEvents | None = None
        self._connecting = False
        self._closed = False
        # each request's task while it runs (the loop holds tasks only weakly)
        self._tasks: dict[InFlight, asyncio.Future[None]] = {}
        self._core_cancelled: dict[str, str] = {}  # request id -> Core's reason, oldest first
        self._last_state = self.state
        for tool in tools:
            self._define(tool)

    # --- state -----------------------------------------------------------------------

    @property
    def state(self) -> SessionState:
        if self._closed:
            return SessionState.CLOSED
        if self._engine.inflight:
            return SessionState.WAITING_TOOL_RESULT
        if self._turns:
            return SessionState.RUNNING
        if self._connecting:
            return SessionState.CONNECTING
        return SessionState.IDLE

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def connected(self) -> bool:
        return self._transport is not None and not self._connecting

    @property
    def tools(self) -> Mapping[str, Tool]:
        return dict(self._engine.tools)

    @property
    def max_result_bytes(self) -> int:
        return self._engine.max_result_bytes

    @max_result_bytes.setter
    def max_result_bytes(self, value: int) -> None:
        self._engine.max_result_bytes = value

    @property
    def pending(self) -> list[PendingRequest]:
        """The requests in flight, oldest first, each with its status and latest progress."""
        return [rec.pending() for rec in self._engine.inflight.values()]

    def subscribe(self, listener: Listener, *, kinds: Iterable[type] | None = None
                  ) -> Disposer:
        """Call ``listener(event)`` for every session event, or with ``kinds`` (event
        classes, e.g. ``(ToolCall,)``) for those only; returns its disposer. Events that
        no listener takes are not built: a tool call with no one listening to its
        :class:`ToolStatus` events costs less."""
        # distinct, so one function may subscribe twice
        token = _Subscription(listener, None if kinds is None else frozenset(kinds))
        if not self._hears[SessionState]:  # the state as it is now, for the first to hear it
            self._last_state = self.state
        self._listeners.append(token)
        self._rehear()

        def dispose() -> None:
            if token in self._listeners:
                self._listeners.remove(token)
                self._rehear()

        return dispose

    def _rehear(self) -> None:
        for kind, hearers in self._hears.items():
            hearers[:] = [token for token in self._listeners if token.takes(kind)]

    def _emit(self, event: Any) -> None:
        kind = type(event)
        for listener in list(self._listeners):
            if not listener.takes(kind):
                continue
            try:
                listener(event)
            except Exception:
                logger.exception("session listener failed on %r", event)

    def _update_state(self) -> None:
        if not self._hears[SessionState]:  # nobody to tell; subscribe() re-reads the state
            return
        state = self.state
        if state is not self._last_state:
            self._last_state = state
            self._emit(state)

    # --- definitions, handlers, approvers ----------------------------------------------

    def _define(self, tool: Tool) -> Registration | None:
        if not isinstance(tool, Tool):
            raise TypeError(f"expected a Tool (from define_tool), got {type(tool).__name__}")
        engine = self._engine
        if tool.name in engine.tools:
            raise ValueError(f"two tools are defined under the name {tool.name!r}")
        engine.tools[tool.name] = tool
        registration = None
        if tool._invoker is not None:
            registration = engine.inline[tool.name] = Registration(tool._invoker, "inline")
        return registration

    def add_tool(self, tool: Tool) -> Disposer:
        """Add a definition (and its inline handler); Core is told. Returns its disposer."""
        self._check_open()
        registration = self._define(tool)
        self._tools_changed()
        engine = self._engine

        def dispose() -> None:
            if engine.tools.get(tool.name) is not tool:
                return
            del engine.tools[tool.name]
            if registration is not None and engine.inline.get(tool.name) is registration:
                del engine.inline[tool.name]
                registration.current = False
            if not self._closed:
                self._tools_changed()

        return dispose

    def on_tool(self, name_or_handler: str | Callable[..., Any],
                handler: Callable[..., Any] | None = None) -> Disposer:
        """Register a named handler ``on_tool(name, fn)`` or the fallback ``on_tool(fn)``.

        Named: ``fn(args, ctx)``. Fallback: ``fn(tool, args, ctx)``; only one at a time,
        a new one replaces the old. Either may declare fewer parameters. The disposer
        removes only this registration, only while it is current, and may be called
        any number of times.
        """
        self._check_open()
        engine = self._engine
        if isinstance(name_or_handler, str):
            name = name_or_handler
            if handler is None:
                raise TypeError(f"on_tool({name!r}, handler): the handler is missing")
            registration = Registration(handler, "named")
            previous = engine.named.get(name)
            if previous is not None:
                previous.current = False
            engine.named[name] = registration

            def dispose_named() -> None:
                if engine.named.get(name) is registration:
                    del engine.named[name]
                    registration.current = False

            return dispose_named
        if handler is not None:
            raise TypeError("on_tool(handler) takes one function; on_tool(name, handler) two")
        registration = Registration(name_or_handler, "fallback")
        if engine.fallback is not None:
            engine.fallback.current = False
        engine.fallback = registration

        def dispose_fallback() -> None:
            if engine.fallback is registration:
                engine.fallback = None
                registration.current = False

        return dispose_fallback

    def on_approval(self, handler: Approver) -> Disposer:
        """Register the approver of tools that ``needs_approval``: ``handler(request)``
        (an :class:`ApprovalRequest`) returns, or resolves to, ``True`` to run the request;
        anything else denies it (``TOOL_DENIED``). One at a time: a new one replaces the
        old; the disposer removes only this one, only while it is current."""
        if not callable(handler):
            raise TypeError(f"on_approval(handler): expected a function, got "
                            f"{type(handler).__name__}")
        engine = self._engine
        engine.approver = handler

        def dispose() -> None:
            if engine.approver is handler:
                engine.approver = None

        return dispose

    def _check_open(self) -> None:
        if self._closed:
            raise SessionClosedError("the session is closed")

    # --- dispatch ----------------------------------------------------------------------

    async def dispatch(
        self,
        tool: str,
        args: Any,
        *,
        tool_request_id: str | None = None,
        turn_id: str | None = None,
    ) -> Any:
        """Run one tool request exactly as a request from Core would run; return its result."""
        rec = self._engine.begin(tool, args, tool_request_id, turn_id, reply=False,
                                 timed=bool(self._hears[ToolCall]))
        if not rec.answered:  # (a sync handler's answer returns here, with no await)
            await self._settle(rec)
        return rec.result

    async def run_request(
        self,
        tool: str,
        args: Any,
        *,
        tool_request_id: str | None = None,
        turn_id: str | None = None,
    ) -> ToolCall:
        """Like :meth:`dispatch`, returning the whole :class:`ToolCall` (tier, timing)."""
        rec = self._engine.begin(tool, args, tool_request_id, turn_id, reply=False,
                                 timed=True)
        if not rec.answered:
            await self._settle(rec)
        return rec.call()

    def start_request(self, tool: str, args: Any, *, source: Source) -> InFlight:
        """For adapters of other callers than Core (WebMCP): begin a request as
        :meth:`dispatch` does, under a fresh id (``"{source}-N"``, not kept in the
        delivery ledger), its rest spawned. The record returned has ``tool_request_id``
        (for :meth:`cancel`), ``answered``, ``result`` and ``result_json``; ``await
        record.wait()`` until it is answered."""
        rec = self._engine.begin(tool, args, None, None, reply=False,
                                 timed=bool(self._hears[ToolCall]), source=source)
        self._spawn(rec)
        return rec

    async def _settle(self, rec: InFlight) -> None:
        """Until the request is answered: by its handler, or by ``TOOL_CANCELLED`` once
        a cancel's grace period has passed. What is left of one begun here runs as a task
        of its own (a handler that ignores ``ctx.cancelled`` goes on after the answer); a
        caller that gives up (its task cancelled) cancels the request it began."""
        began = rec.rest is not None
        self._spawn(rec)
        try:
            await rec.wait()
        except asyncio.CancelledError:
            if began:
                self._engine.cancel(rec.tool_request_id, CALLER_GONE_REASON, grace=True)
            raise

    def _spawn(self, rec: InFlight) -> None:
        """Run what is left of a request (an async handler, an approval) as a task."""
        rest, rec.rest = rec.rest, None
        if rest is None:
            return
        held = self._run_held(rec, rest)
        task = self._scheduler.create_task(held)
        if isinstance(task, asyncio.Future) and not task.done():
            self._tasks[rec] = task
            if inspect.getcoroutinestate(held) == inspect.CORO_CREATED:
                # Its first step is to come: a task cancelled before it never runs the
                # body of _run_held (nor its ``finally``).
                task.add_done_callback(lambda _: self._let_go(rec, rest))

    async def _run_held(self, rec: InFlight, rest: Coroutine[Any, Any, None]) -> None:
        # The task lets itself go when done: a done callback would cost the page one more
        # JS task per request (each turn of its loop is one).
        try:
            await rest
        finally:
            self._tasks.pop(rec, None)

    def _let_go(self, rec: InFlight, rest: Coroutine[Any, Any, None]) -> None:
        self._tasks.pop(rec, None)
        rest.close()  # not started if its task was cancelled first: never to run

    def cancel(self, tool_request_id: str, reason: str = "cancelled by the user") -> bool:
        """Cancel a request in flight: ``ctx.cancelled`` becomes True. One awaiting approval
        is answered ``TOOL_CANCELLED`` at once; a running one is, if its handler has not
        finished within ``cancel_grace`` seconds (its late outcome is logged, not sent).
        Returns False when no such request is in flight."""
        return self._engine.cancel(tool_request_id, reason, grace=True)

    # --- the wire side (used by I/O adapters) ------------------------------------------

    def connection_made(self, transport: Transport, adapter: AdapterEvents | None = None
                        ) -> None:
        """An adapter opened a connection to Core: say hello (resuming when we can).
        ``adapter`` is told of the welcome, a refusal, and ``close()``."""
        self._check_open()
        self._transport = transport
        if adapter is not None:
            self._adapter = adapter
        self._connecting = True
        self._update_state()
        self._send(protocol.Hello(
            protocol=protocol.PROTOCOL_VERSION,
            tools=[tool.metadata() for tool in self._engine.tools.values()],
            client=self.client,
            session_id=self.session_id,
            resume_token=self.resume_token,
        ).encode())

    def connection_lost(self) -> None:
        """The connection dropped; pending work continues and is re-sent on resume."""
        self._transport = None
        self._connecting = not self._closed
        self._update_state()

    def receive(self, frame: str | bytes) -> None:
        """Handle one frame from Core. Never raises: bad frames are answered with an error."""
        try:
            message = protocol.parse_server_frame(frame)
        except ProtocolError as exc:
            logger.warning("bad frame from Core: %s", exc)
            self._send(protocol.error_frame(exc.code, exc.message))
            return
        if isinstance(message, protocol.ToolRequest):
            self._receive_request(message)
        elif isinstance(message, protocol.Welcome):
            self.session_id = message.session_id
            self.resume_token = message.resume_token
            self._connecting = False
            self._update_state()
            if self._adapter is not None:
                self._adapter.welcomed(message)
            self._emit(message)
            self._resume_requests()
            self._resume_turns(message.resumed)
        elif isinstance(message, protocol.ToolCancel):
            self._core_cancelled[message.tool_request_id] = message.reason
            while len(self._core_cancelled) > _CORE_CANCELS_KEPT:
                del self._core_cancelled[next(iter(self._core_cancelled))]
            self._engine.cancel(message.tool_request_id, message.reason, grace=False)
        elif isinstance(message, protocol.TurnEnd):
            self._end_turn(message)
        else:  # TurnDelta, Error
            if isinstance(message, protocol.Error):
                self._log_refusal(message)
                if message.turn_id is not None:  # Core refused a frame about that turn
                    self._fail_turn(message.turn_id, message.code, message.message)
                if self._connecting and self._adapter is not None:
                    self._adapter.refused(message)
            self._emit(message)

    def _log_refusal(self, error: protocol.Error) -> None:
        reason = self._core_cancelled.get(error.tool_request_id or "")
        if reason is not None and error.code in _AFTER_CORE_CANCEL:
            logger.debug("tool request %s: Core had already given up on it (%s) when this "
                         "page's word on it arrived; nothing is wrong (%s)",
                         error.tool_request_id, reason, error.code)
        else:
            logger.warning("Core reported %s: %s", error.code, error.message)

    def _receive_request(self, request: protocol.ToolRequest) -> None:
        if request.tool_request_id in self._engine.inflight or self._closed:
            return  # re-sent while still running: its one result goes out when it is done
        rec = self._engine.begin(request.tool, request.args, request.tool_request_id,
                                 request.turn_id, reply=True, timed=bool(self._hears[ToolCall]),
                                 source="core")
        self._spawn(rec)  # answered by the engine when it is done

    def _resume_requests(self) -> None:
        """After a welcome, tell Core again what its requests in flight are doing: a
        restarted Core has lost their waiting (its paused deadline) and progress."""
        for rec in self._engine.inflight.values():
            if not rec.reply:
                continue
            if rec.waiting or rec.status == "awaiting_approval":
                reason = APPROVAL_REASON if rec.status == "awaiting_approval" else None
                self._send(protocol.ToolWaiting(tool_request_id=rec.tool_request_id,
                                                waiting=True, reason=reason).encode())
            if rec.latest is not None:
                self._send_progress(rec)

    def _send_progress(self, rec: InFlight) -> None:
        assert rec.latest is not None
        progress, total, message = rec.latest
        if rec.reply:
            self._send(protocol.ToolProgressMessage(tool_request_id=rec.tool_request_id,
                                                    progress=progress, total=total,
                                                    message=message).encode())

    def _send_result(self, rec: InFlight) -> None:
        self._send(protocol.encode_tool_result(rec.tool_request_id, rec.result_json, rec.tier))

    def _send(self, frame: str) -> None:
        transport = self._transport
        if transport is not None:
            try:
                transport.send(frame)
            except Exception:  # the adapter will report the drop; the ledger keeps the result
                logger.warning("sending a frame to Core failed", exc_info=True)

    def _tools_changed(self) -> None:
        """Tell Core (``tools.update``) and the listeners that a tool came or went."""
        if self.connected:
            self._send(protocol.ToolsUpdate(
                tools=[tool.metadata() for tool in self._engine.tools.values()]
            ).encode())
        if self._hears[ToolsChanged]:
            self._emit(ToolsChanged(tuple(self._engine.tools)))

    # --- turns -------------------------------------------------------------------------

    async def send_text(self, text: str) -> str:
        """Start a turn with the user's ``text``; return the agent's final reply."""
        self._check_open()
        if not self.connected:
            raise NotConnectedError("send_text needs a connection to Core (see connect())")
        if lone_surrogate_at(text) is not None:  # a browser would send U+FFFD instead
            raise ValueError(f"send_text: the text holds {not_unicode()}")
        # 128 random bits as hex, like uuid4().hex, without importing uuid (~15-20 ms
        # of the page's start in Pyodide)
        turn_id = os.urandom(16).hex()
        done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._turns[turn_id] = done
        self._turn_texts[turn_id] = text
        self._update_state()
        try:
            self._send(protocol.TurnStart(turn_id=turn_id, text=text).encode())
            return await done
        finally:
            self._turns.pop(turn_id, None)
            self._turn_texts.pop(turn_id, None)
            self._update_state()

    def _resume_turns(self, resumed: bool) -> None:
        """After a welcome, turns still awaiting their end: their ``turn.start`` (or the
        ``turn.end``) may have been lost with the old connection or a restart of Core.
        Re-send the ``turn.start``: Core ignores it for a running turn, answers an ended
        one with its ``turn.end`` again, and starts one it never got. A new session (the
        old one could not be resumed) will never end them: they fail ``TURN_LOST``."""
        for turn_id, done in list(self._turns.items()):
            if done.done():
                continue
            if resumed:
                self._send(protocol.TurnStart(
                    turn_id=turn_id, text=self._turn_texts[turn_id]).encode())
            else:
                self._fail_turn(turn_id, TURN_LOST,
                                "the session could not be resumed, so this turn's end is unknown")

    def _end_turn(self, message: protocol.TurnEnd) -> None:
        self._emit(message)
        done = self._turns.get(message.turn_id)
        if done is None or done.done():
            return
        if message.status == "completed":
            done.set_result(message.text)
        else:
            error = message.error or {}
            done.set_exception(TurnError(
                message.status,
                str(error.get("code", message.status.upper())),
                str(error.get("message", "")),
                message.text,
            ))

    def _fail_turn(self, turn_id: str, code: str, message: str) -> None:
        done = self._turns.get(turn_id)
        if done is not None and not done.done():
            done.set_exception(TurnError("failed", code, message, ""))

    def close(self) -> None:
        """Close the session: turns fail; every request in flight is settled. One awaiting
        approval is withdrawn and answered ``TOOL_CANCELLED`` at once; running handlers see
        ``ctx.cancelled`` (and ``ctx.active`` False), and one still running after
        ``cancel_grace`` seconds is answered ``TOOL_CANCELLED``."""
        if self._closed:
            return
        self._closed = True
        self._transport = None
        self._connecting = False
        self._engine.close(SESSION_CLOSED_REASON)
        for done in self._turns.values():
            if not done.done():
                done.set_exception(SessionClosedError("the session was closed"))
        self._update_state()
        adapter, self._adapter = self._adapter, None
        if adapter is not None:
            adapter.session_closed()


class _Outbox:
    """The engine's view of its Session (see :class:`~pedelec_pyodide.dispatch.Outbox`)."""

    __slots__ = ("_session",)

    def __init__(self, session: Session) -> None:
        self._session = session

    def send_result(self, record: InFlight) -> None:
        self._session._send_result(record)

    def send_progress(self, record: InFlight) -> None:
        session = self._session
        session._send_progress(record)
        if session._hears[ToolProgress]:
            assert record.latest is not None
            progress, total, message = record.latest
            session._emit(ToolProgress(record.tool_request_id, record.tool, record.turn_id,
                                       progress, total, message, record.source))

    def send_waiting(self, record: InFlight, waiting: bool, reason: str | None) -> None:
        if record.reply:
            self._session._send(protocol.ToolWaiting(
                tool_request_id=record.tool_request_id, waiting=waiting,
                reason=reason).encode())

    def emit(self, event: Any) -> None:
        self._session._emit(event)

    def hearers(self, kind: type) -> list[Any]:
        return self._session._hears[kind]

    def state_hearers(self) -> list[Any]:
        return self._session._hears[SessionState]

    def pending_changed(self, count: int) -> None:
        if count <= 1:
            self._session._update_state()

    def closed(self) -> bool:
        return self._session._closed


class _Subscription:
    __slots__ = ("kinds", "listener")

    def __init__(self, listener: Listener, kinds: frozenset[type] | None) -> None:
        self.listener = listener
        self.kinds = kinds

    def takes(self, kind: type) -> bool:
        return self.kinds is None or kind in self.kinds

    def __call__(self, event: Any) -> None:
        self.listener(event)
