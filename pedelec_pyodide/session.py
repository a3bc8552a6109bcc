"""Session: the sans-I/O state machine that holds handlers and runs tool requests.

A Session works with no transport at all (tests, notebooks: ``await session.dispatch``).
An I/O adapter (the browser bridge, a test's WebSocket) attaches a :class:`Transport` and
feeds frames from Core to :meth:`Session.receive`; the Session answers through
``transport.send``. Nothing here imports ``js``.
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import itertools
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from . import protocol
from .ledger import Ledger, MemoryLedger
from .protocol import HandledBy, ProtocolError
from .results import (
    DEFAULT_MAX_RESULT_BYTES,
    INVALID_ARGS,
    TOOL_HANDLER_ERROR,
    TOOL_HANDLER_NOT_FOUND,
    TOOL_OUTCOME_UNKNOWN,
    ResultError,
    ToolError,
    encode_result,
    tool_error,
)
from .signatures import Invoker, leading_arity
from .text import excerpt, lone_surrogate_at, not_unicode
from .tools import Tool

logger = logging.getLogger("pedelec_pyodide")

Disposer = Callable[[], None]


class SessionState(enum.StrEnum):
    CONNECTING = "connecting"
    IDLE = "idle"
    RUNNING = "running"
    WAITING_TOOL_RESULT = "waiting_tool_result"
    CLOSED = "closed"


class Transport(Protocol):
    """What an I/O adapter gives the Session: a way to send one text frame."""

    def send(self, frame: str) -> None: ...


class SessionClosedError(RuntimeError):
    """The session was closed; nothing more can be sent or run through it."""


class NotConnectedError(RuntimeError):
    """The operation needs Core, and the session has no connection to it."""


#: ``TurnError.code`` of a turn whose session could not be resumed (its end is unknown)
TURN_LOST = "TURN_LOST"


class TurnError(Exception):
    """A turn that ended ``failed`` or ``cancelled``; ``status``, ``code`` and ``text`` say how."""

    def __init__(self, status: str, code: str, message: str, text: str) -> None:
        super().__init__(f"turn {status}: {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.text = text


@dataclass(slots=True)
class ToolCall:
    """One finished tool request: what ran, who handled it, what it returned, how long."""

    tool_request_id: str
    tool: str
    args: Any
    turn_id: str | None
    result: Any
    result_json: str
    handled_by: HandledBy
    duration_ms: float

    @property
    def is_error(self) -> bool:
        return isinstance(self.result, dict) and set(self.result) == {"error"}


class _Registration:
    """One registered handler, and how many leading arguments it takes."""

    __slots__ = ("body_runs_later", "current", "handler", "takes", "tier")

    def __init__(self, handler: Invoker, tier: HandledBy) -> None:
        self.handler = handler
        self.tier: HandledBy = tier
        self.takes = leading_arity(handler, 3 if tier == "fallback" else 2)
        # Calling an ``async def`` runs none of its body: the ledger marks such a request
        # started only when the body first runs, so a reload before then loses nothing.
        self.body_runs_later = inspect.iscoroutinefunction(handler)
        self.current = True


class ToolContext:
    """What a handler knows about the request it is running."""

    __slots__ = ("_args", "_finished", "_record", "_registration", "_result", "_result_json",
                 "_started", "session", "tool", "tool_request_id", "turn_id")

    def __init__(
        self,
        session: Session,
        tool: str,
        tool_request_id: str,
        turn_id: str | None,
        registration: _Registration | None,
        args: Any,
        record: bool,
        timed: bool,
    ) -> None:
        self.session = session
        self.tool = tool
        self.tool_request_id = tool_request_id
        self.turn_id = turn_id
        self._registration = registration
        self._args = args
        self._record = record
        # perf_counter is not free in the page: time only when someone will see the figure
        self._started = time.perf_counter() if timed else 0.0
        self._result: Any = None
        self._result_json = ""
        self._finished = 0.0

    @property
    def active(self) -> bool:
        """The handler's registration is still current and the session still open."""
        registration = self._registration
        return (
            registration is not None
            and registration.current
            and not self.session.closed
        )

    @property
    def cancelled(self) -> bool:
        """Core cancelled this request (deadline, cancelled turn) or the session closed."""
        return self.tool_request_id in self.session._cancelled or self.session.closed

    @property
    def _tier(self) -> HandledBy:
        return self._registration.tier if self._registration is not None else "none"

    def _call(self) -> ToolCall:
        """The finished request's record."""
        duration = (self._finished - self._started) * 1000 if self._started else 0.0
        return ToolCall(self.tool_request_id, self.tool, self._args, self.turn_id, self._result,
                        self._result_json, self._tier, duration)

    def __repr__(self) -> str:
        return f"<ToolContext {self.tool} {self.tool_request_id}>"


Listener = Callable[[Any], None]


class Session:
    """Tool definitions, handlers, and the dispatch of tool requests.

    Events passed to :meth:`subscribe` listeners: a :class:`SessionState` when the state
    changes, a :class:`ToolCall` when a request finishes, and the :mod:`protocol` messages
    ``Welcome``, ``TurnDelta``, ``TurnEnd`` and ``Error`` as they arrive from Core.
    """

    def __init__(
        self,
        tools: Iterable[Tool] = (),
        *,
        max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
        ledger: Ledger | None = None,
        client: Mapping[str, Any] | None = None,
        explain_error: Callable[[BaseException], str | None] | None = None,
    ) -> None:
        self.max_result_bytes = max_result_bytes
        #: adds a sentence to a ``TOOL_HANDLER_ERROR`` message for exceptions the runtime
        #: can explain (the browser edge: no DOM in a Web Worker, e.g. a notebook kernel)
        self.explain_error = explain_error
        self.session_id: str | None = None
        self.resume_token: str | None = None
        self.client = dict(client or {"name": "pedelec-pyodide"})
        self._tools: dict[str, Tool] = {}
        self._inline: dict[str, _Registration] = {}
        self._named: dict[str, _Registration] = {}
        self._fallback: _Registration | None = None
        self._ledger = ledger if ledger is not None else MemoryLedger()
        self._inflight: dict[str, ToolContext] = {}
        self._waiters: dict[str, list[asyncio.Future[ToolCall]]] = {}
        self._cancelled: set[str] = set()
        self._pending = 0
        self._turns: dict[str, asyncio.Future[str]] = {}
        self._turn_texts: dict[str, str] = {}
        self._transport: Transport | None = None
        self._connecting = False
        self._closed = False
        self._listeners: list[Listener] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._local_ids = itertools.count(1)
        self._last_state = self.state
        for tool in tools:
            self._define(tool)

    # --- state -----------------------------------------------------------------------

    @property
    def state(self) -> SessionState:
        if self._closed:
            return SessionState.CLOSED
        if self._pending:
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
        return dict(self._tools)

    def subscribe(self, listener: Listener) -> Disposer:
        """Call ``listener(event)`` for every session event; returns its disposer."""
        token = _Subscription(listener)  # distinct, so one function may subscribe twice
        if not self._listeners:
            self._last_state = self.state
        self._listeners.append(token)

        def dispose() -> None:
            if token in self._listeners:
                self._listeners.remove(token)

        return dispose

    def _emit(self, event: Any) -> None:
        for listener in list(self._listeners):
            try:
                listener(event)
            except Exception:
                logger.exception("session listener failed on %r", event)

    def _update_state(self) -> None:
        if not self._listeners:  # nobody to tell; subscribe() re-reads the state
            return
        state = self.state
        if state is not self._last_state:
            self._last_state = state
            self._emit(state)

    # --- definitions and handlers ------------------------------------------------------

    def _define(self, tool: Tool) -> _Registration | None:
        if not isinstance(tool, Tool):
            raise TypeError(f"expected a Tool (from define_tool), got {type(tool).__name__}")
        if tool.name in self._tools:
            raise ValueError(f"two tools are defined under the name {tool.name!r}")
        self._tools[tool.name] = tool
        registration = None
        if tool._invoker is not None:
            registration = self._inline[tool.name] = _Registration(tool._invoker, "inline")
        return registration

    def add_tool(self, tool: Tool) -> Disposer:
        """Add a definition (and its inline handler); Core is told. Returns its disposer."""
        self._check_open()
        registration = self._define(tool)
        self._send_tools_update()

        def dispose() -> None:
            if self._tools.get(tool.name) is not tool:
                return
            del self._tools[tool.name]
            if registration is not None and self._inline.get(tool.name) is registration:
                del self._inline[tool.name]
                registration.current = False
            if not self._closed:
                self._send_tools_update()

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
        if isinstance(name_or_handler, str):
            name = name_or_handler
            if handler is None:
                raise TypeError(f"on_tool({name!r}, handler): the handler is missing")
            registration = _Registration(handler, "named")
            previous = self._named.get(name)
            if previous is not None:
                previous.current = False
            self._named[name] = registration

            def dispose_named() -> None:
                if self._named.get(name) is registration:
                    del self._named[name]
                    registration.current = False

            return dispose_named
        if handler is not None:
            raise TypeError("on_tool(handler) takes one function; on_tool(name, handler) two")
        registration = _Registration(name_or_handler, "fallback")
        if self._fallback is not None:
            self._fallback.current = False
        self._fallback = registration

        def dispose_fallback() -> None:
            if self._fallback is registration:
                self._fallback = None
                registration.current = False

        return dispose_fallback

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
        done, later = self._begin(tool, args, tool_request_id, turn_id, bool(self._listeners))
        if later is not None:
            done = await later
        return done.result if isinstance(done, ToolCall) else done._result  # type: ignore[union-attr]

    async def run_request(
        self,
        tool: str,
        args: Any,
        *,
        tool_request_id: str | None = None,
        turn_id: str | None = None,
    ) -> ToolCall:
        """Like :meth:`dispatch`, returning the whole :class:`ToolCall` (tier, timing)."""
        done, later = self._begin(tool, args, tool_request_id, turn_id, True)
        if later is not None:
            done = await later
        return done if isinstance(done, ToolCall) else done._call()  # type: ignore[union-attr]

    def _begin(
        self, tool: str, args: Any, tool_request_id: str | None, turn_id: str | None,
        timed: bool,
    ) -> tuple[ToolContext | ToolCall | None, Awaitable[ToolContext | ToolCall] | None]:
        """Start a request: ``(finished, None)`` when it is done at once (a sync handler,
        a stored result), else ``(None, awaitable of the finished request)``."""
        if tool_request_id is None:
            # A local id can never be re-sent, so the delivery ledger need not record it.
            request_id, record = f"local-{next(self._local_ids)}", False
        else:
            request_id, record = tool_request_id, True
            running = self._inflight.get(request_id)
            if running is not None:
                return None, self._wait_for(running)
        started, outcome = self._start(tool, args, request_id, turn_id, record, timed)
        if isinstance(started, ToolCall):
            return started, None
        if type(outcome) not in _PLAIN_TYPES and inspect.isawaitable(outcome):
            return None, self._finish_later(started, outcome)
        return self._finish(started, outcome), None

    async def _finish_later(self, ctx: ToolContext, awaitable: Awaitable[Any]) -> ToolContext:
        registration = ctx._registration
        if ctx._record and registration is not None and registration.body_runs_later:
            self._ledger_start(ctx.tool_request_id, ctx.tool)  # its body runs in this step
        try:
            outcome = await awaitable
        except (Exception, SystemExit) as exc:
            outcome = _handler_failure(ctx.tool, exc, self.explain_error)
        return self._finish(ctx, outcome)

    def _wait_for(self, running: ToolContext) -> asyncio.Future[ToolCall]:
        waiter: asyncio.Future[ToolCall] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(running.tool_request_id, []).append(waiter)
        return waiter

    def _start(
        self, name: str, args: Any, request_id: str, turn_id: str | None, record: bool,
        timed: bool,
    ) -> tuple[ToolContext | ToolCall, Any]:
        """Find the handler, validate, call it. Returns a finished call, or the context and
        the handler's raw outcome (a value, an awaitable or a :class:`_Failure`)."""
        if self._closed:
            raise SessionClosedError("the session is closed")
        registration = self._named.get(name) or self._inline.get(name) or self._fallback
        if record:
            stored = self._ledger.get(request_id)
            if stored is not None:
                return self._replay(name, args, request_id, turn_id, stored), None
        # A request refused before its handler runs (no handler, bad args) is handled by
        # no tier: its context carries no registration, so it says handledBy "none".
        refused = self._refusal(name, args, registration)
        runs = None if refused is not None else registration
        if record and runs is not None and not runs.body_runs_later:
            self._ledger_start(request_id, name)
        ctx = ToolContext(self, name, request_id, turn_id, runs, args, record, timed)
        if record:  # only a caller-given id can arrive twice or be cancelled by Core
            self._inflight[request_id] = ctx
        self._pending += 1
        if self._pending == 1 and self._listeners:
            self._update_state()
        if runs is None:
            return ctx, refused
        try:
            handler, takes = runs.handler, runs.takes
            if runs.tier == "fallback":
                return ctx, handler(*(name, args, ctx)[:takes])
            if takes == 2:
                return ctx, handler(args, ctx)
            return ctx, handler(args) if takes else handler()
        except (Exception, SystemExit) as exc:  # a handler must never end the session
            return ctx, _handler_failure(name, exc, self.explain_error)

    def _refusal(
        self, name: str, args: Any, registration: _Registration | None,
    ) -> _Failure | None:
        """Why a request cannot reach a handler (none registered, args failing the tool's
        schema), or None when it can."""
        if registration is None:
            return _Failure(tool_error(
                TOOL_HANDLER_NOT_FOUND,
                f"no handler for tool {name!r}: no named handler, no inline handler, "
                "no fallback",
            ))
        definition = self._tools.get(name)
        if definition is None:
            return None
        try:
            errors = definition.validate(args)
        except Exception as exc:  # a schema the validator cannot apply: the tool's bug
            logger.error("the args_schema of tool %s could not be applied", name, exc_info=exc)
            return _Failure(tool_error(
                TOOL_HANDLER_ERROR,
                f"the args_schema of {name!r} could not be applied: "
                f"{type(exc).__name__}: {excerpt(str(exc))}",
            ))
        if not errors:
            return None
        return _Failure(tool_error(
            INVALID_ARGS,
            f"arguments for {name!r} do not match its schema: {errors[0]['path']}: "
            f"{errors[0]['message']}",
            details={"errors": errors},
            retryable=True,
        ))

    def _finish(self, ctx: ToolContext, outcome: Any) -> ToolContext:
        """Check and encode the outcome into ``ctx``; record, notify, and return it."""
        if ctx._started:
            ctx._finished = time.perf_counter()
        result = outcome.result if isinstance(outcome, _Failure) else outcome
        try:
            ctx._result, ctx._result_json = encode_result(result, self.max_result_bytes)
        except ResultError as exc:  # the runtime's own error result, small and always sent
            ctx._result = exc.result
            ctx._result_json = json.dumps(exc.result, separators=(",", ":"))
        if ctx._record:
            request_id = ctx.tool_request_id
            self._ledger_finish(request_id, ctx._result_json, ctx._tier)
            del self._inflight[request_id]
            self._cancelled.discard(request_id)
            waiters = self._waiters.pop(request_id, None)
            if waiters:
                call = ctx._call()
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_result(call)
        self._pending -= 1
        if self._listeners:
            self._emit(ctx._call())
            if not self._pending:
                self._update_state()
        return ctx

    def _replay(
        self, name: str, args: Any, request_id: str, turn_id: str | None,
        stored: tuple[str, HandledBy] | None,
    ) -> ToolCall:
        """A request this tab already ran: its stored result, never a second run."""
        assert stored is not None
        text, tier = stored
        return ToolCall(request_id, name, args, turn_id, json.loads(text), text, tier, 0.0)

    # --- the wire side (used by I/O adapters) ------------------------------------------

    def connection_made(self, transport: Transport) -> None:
        """An adapter opened a connection to Core: say hello (resuming when we can)."""
        self._check_open()
        self._transport = transport
        self._connecting = True
        self._update_state()
        self._send(protocol.Hello(
            protocol=protocol.PROTOCOL_VERSION,
            tools=[tool.metadata() for tool in self._tools.values()],
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
            self._emit(message)
            self._resume_turns(message.resumed)
        elif isinstance(message, protocol.ToolCancel):
            if message.tool_request_id in self._inflight:
                self._cancelled.add(message.tool_request_id)
        elif isinstance(message, protocol.TurnEnd):
            self._end_turn(message)
        else:  # TurnDelta, Error
            if isinstance(message, protocol.Error):
                logger.warning("Core reported %s: %s", message.code, message.message)
                if message.turn_id is not None:  # Core refused a frame about that turn
                    self._fail_turn(message.turn_id, message.code, message.message)
            self._emit(message)

    def _receive_request(self, request: protocol.ToolRequest) -> None:
        request_id = request.tool_request_id
        if request_id in self._inflight:
            return  # re-sent while still running: its one result goes out when it is done
        stored = self._ledger.get(request_id)
        if stored is None and self._ledger.was_started(request_id):
            definition = self._tools.get(request.tool)
            if definition is None or not definition.resumable:
                self._interrupted(request)
                return
        if self._closed:
            return
        done, later = self._begin(request.tool, request.args, request_id, request.turn_id,
                                  bool(self._listeners))
        if later is None:
            self._send_result(done)  # type: ignore[arg-type]
        else:
            task = asyncio.ensure_future(self._send_when_done(later))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send_when_done(self, later: Awaitable[ToolContext | ToolCall]) -> None:
        self._send_result(await later)

    def _interrupted(self, request: protocol.ToolRequest) -> None:
        """A side-effecting request that was running when this tab went away."""
        result = tool_error(
            TOOL_OUTCOME_UNKNOWN,
            f"{request.tool!r} was interrupted (page reload or crash) after it started; it "
            "may or may not have taken effect, and it is not run twice",
            retryable=False,
        )
        text = json.dumps(result)
        self._ledger_finish(request.tool_request_id, text, "none")
        self._send(protocol.encode_tool_result(request.tool_request_id, text, "none"))

    # Delivery-ledger writes. One that fails (storage full or gone) costs that record,
    # never the request: the handler still runs and its result still goes to Core.

    def _ledger_start(self, tool_request_id: str, tool: str) -> None:
        try:
            self._ledger.start(tool_request_id, tool)
        except Exception:
            _ledger_failed(tool_request_id)

    def _ledger_finish(self, tool_request_id: str, result_json: str,
                       handled_by: HandledBy) -> None:
        try:
            self._ledger.finish(tool_request_id, result_json, handled_by)
        except Exception:
            _ledger_failed(tool_request_id)

    def _send_result(self, done: ToolContext | ToolCall) -> None:
        if isinstance(done, ToolCall):
            frame = protocol.encode_tool_result(done.tool_request_id, done.result_json,
                                                done.handled_by)
        else:
            frame = protocol.encode_tool_result(done.tool_request_id, done._result_json,
                                                done._tier)
        self._send(frame)

    def _send(self, frame: str) -> None:
        transport = self._transport
        if transport is not None:
            try:
                transport.send(frame)
            except Exception:  # the adapter will report the drop; the ledger keeps the result
                logger.warning("sending a frame to Core failed", exc_info=True)

    def _send_tools_update(self) -> None:
        if self.connected:
            self._send(protocol.ToolsUpdate(
                tools=[tool.metadata() for tool in self._tools.values()]
            ).encode())

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
        """Close the session: running handlers see ``ctx.active`` False; turns fail."""
        if self._closed:
            return
        self._closed = True
        self._transport = None
        self._connecting = False
        for done in self._turns.values():
            if not done.done():
                done.set_exception(SessionClosedError("the session was closed"))
        self._update_state()


# Handler outcomes that are certainly not awaitable: checked before inspect.isawaitable.
_PLAIN_TYPES = frozenset({dict, list, str, int, float, bool, type(None), tuple})


class _Subscription:
    __slots__ = ("listener",)

    def __init__(self, listener: Listener) -> None:
        self.listener = listener

    def __call__(self, event: Any) -> None:
        self.listener(event)


class _Failure:
    """A result the runtime produced instead of the handler's value."""

    __slots__ = ("result",)

    def __init__(self, result: dict[str, Any]) -> None:
        self.result = result


def _ledger_failed(tool_request_id: str) -> None:
    logger.warning("the delivery ledger could not record tool request %s; were the page "
                   "reloaded before Core has its result, it might run again",
                   tool_request_id, exc_info=True)


def _handler_failure(
    tool: str, exc: BaseException, explain: Callable[[BaseException], str | None] | None,
) -> _Failure:
    if isinstance(exc, ToolError):
        return _Failure(exc.result)
    logger.error("tool handler %s raised", tool, exc_info=exc)
    text = excerpt(str(exc))  # the whole text is in the log; the agent gets its start
    message = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    hint = None
    if explain is not None:
        try:
            hint = explain(exc)
        except Exception:  # a failing hint must not cost the result
            logger.exception("explain_error failed on %r", exc)
    if hint:
        message = f"{message} ({hint})"
    return _Failure(tool_error(TOOL_HANDLER_ERROR, message))

