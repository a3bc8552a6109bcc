"""The dispatch engine: handlers, and one tool request's run from its arrival to its result.

Order: find the handler (named, inline, fallback) → validate the args against the tool's
definition → ask for approval (a tool that ``needs_approval``) → run → check and encode the
result. Knows nothing of frames or turns: it tells its owner (the Session) through an
:class:`Outbox` what to send and what happened, and spawns and times work through a
:class:`Scheduler` the I/O adapter chose (nothing here needs a running event loop).
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from . import strictjson
from .context import ApprovalRequest, Source, ToolContext
from .errors import ApprovalUnavailable, SessionClosedError
from .ledger import Ledger
from .protocol import HandledBy, PendingStatus
from .results import (
    INVALID_ARGS,
    TOOL_CANCELLED,
    TOOL_DENIED,
    TOOL_HANDLER_ERROR,
    TOOL_HANDLER_NOT_FOUND,
    TOOL_OUTCOME_UNKNOWN,
    ResultError,
    ToolError,
    encode_result,
    is_error_result,
    tool_error,
)
from .signatures import Invoker, leading_arity
from .text import excerpt
from .tools import Tool

logger = logging.getLogger("pedelec_pyodide")

#: progress is sent at most this often per request (seconds): ~10 a second
PROGRESS_INTERVAL = 0.1
#: a progress message or a waiting reason is cut to this many characters
MAX_STATUS_TEXT = 1000
#: how long a handler cancelled by the user may take to finish before it is answered
#: ``TOOL_CANCELLED`` (seconds)
DEFAULT_CANCEL_GRACE = 2.0
#: the ``reason`` of ``tool.waiting`` while a request awaits its approval
APPROVAL_REASON = "approval"

Approver = Callable[[ApprovalRequest], "bool | Awaitable[bool]"]


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class Scheduler(Protocol):
    """How the engine spawns and times work; an asyncio event loop is one."""

    def time(self) -> float: ...

    def call_later(self, delay: float, callback: Callable[[], object]) -> Cancellable: ...

    def create_task(self, coro: Coroutine[Any, Any, None]) -> Any: ...


class RunningLoop:
    """The default scheduler: the event loop running at the time of each call (the
    page's WebLoop is always running; in CPython, the caller's loop)."""

    def time(self) -> float:
        return time.monotonic()

    def call_later(self, delay: float, callback: Callable[[], object]) -> Cancellable:
        return asyncio.get_running_loop().call_later(delay, callback)

    def create_task(self, coro: Coroutine[Any, Any, None]) -> Any:
        return asyncio.get_running_loop().create_task(coro)


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
    #: who asked: ``core`` (Core's agent, MCP clients, the control API), ``webmcp`` (the
    #: browser's agent), ``local`` (``session.dispatch`` in the page's own code)
    source: Source = "local"

    @property
    def is_error(self) -> bool:
        return is_error_result(self.result)


@dataclass(frozen=True, slots=True)
class PendingRequest:
    """A request in flight (``session.pending``); ``progress`` is the latest reported,
    ``{"progress", "total", "message"}``, or None."""

    tool_request_id: str
    tool: str
    turn_id: str | None
    status: PendingStatus
    progress: dict[str, Any] | None
    source: Source = "local"


@dataclass(frozen=True, slots=True)
class ToolProgress:
    """Session event: a request's progress, as sent to Core (throttled)."""

    tool_request_id: str
    tool: str
    turn_id: str | None
    progress: float
    total: float | None
    message: str | None
    source: Source = "local"


@dataclass(frozen=True, slots=True)
class ToolStatus:
    """Session event: a request began (``running`` or ``awaiting_approval``), changed
    status, or was answered (``done``)."""

    tool_request_id: str
    tool: str
    turn_id: str | None
    status: PendingStatus | Literal["done"]
    source: Source = "local"


class Outbox(Protocol):
    """What the engine tells its owner. ``reply`` requests (Core's) are answered on the
    wire; every request's events go to the session's listeners."""

    def send_result(self, record: InFlight) -> None: ...

    def send_progress(self, record: InFlight) -> None: ...

    def send_waiting(self, record: InFlight, waiting: bool, reason: str | None) -> None: ...

    def emit(self, event: Any) -> None: ...

    def hearers(self, kind: type) -> list[Any]:
        """The session's listeners that take events of class ``kind`` (the same list,
        kept up to date): events are built only when there are some."""
        ...

    def state_hearers(self) -> list[Any]:
        """Those that take the session's state changes (see :meth:`pending_changed`)."""
        ...

    def pending_changed(self, count: int) -> None: ...

    def closed(self) -> bool: ...


class Registration:
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


class InFlight:
    """The engine's private record of one request, from its arrival to its answer.
    A handler sees it through its :class:`ToolContext`.

    No ``__slots__``: most fields keep their class defaults for most requests (no
    approval, progress or cancel), and setting only the others halves the cost of a
    record on the dispatch hot path."""

    runs: Registration | None = None
    handled_by: HandledBy | None = None  # a replayed request's stored tier
    source: Source = "local"  # who asked (set by begin when not the page's own code)
    status: PendingStatus = "running"
    answered = False
    result: Any = None
    result_json = ""
    finished_at = 0.0
    rest: Coroutine[Any, Any, None] | None = None  # what is left to run
    waiters: list[asyncio.Future[None]] | None = None
    _ctx: ToolContext | None = None
    # interactive state
    cancelled_by: str | None = None
    grace: Cancellable | None = None
    asking: asyncio.Future[Any] | None = None
    approval: ApprovalRequest | None = None  # what its approver is being asked
    waiting = 0
    # the latest progress reported, its total and message (fields, not one tuple: a
    # handler's hot path then allocates nothing the garbage collector has to track)
    last_progress: float = -math.inf  # none reported yet (any finite number is above it)
    last_total: float | None = None
    last_message: str | None = None
    unsent = False
    next_progress_at = 0.0
    progress_timer: Cancellable | None = None

    def __init__(self, engine: Engine, tool: str, tool_request_id: str, turn_id: str | None,
                 args: Any, record: bool, reply: bool, timed: bool) -> None:
        self._engine = engine
        self.tool = tool
        self.tool_request_id = tool_request_id
        self.turn_id = turn_id
        self.args = args
        self.record = record  # a caller-given id: kept in the ledger
        self.reply = reply  # Core's request: answered on the wire
        # perf_counter is not free in the page: time only when someone will see the figure
        self.started_at = time.perf_counter() if timed else 0.0

    @property
    def ctx(self) -> ToolContext:
        ctx = self._ctx
        if ctx is None:
            ctx = self._ctx = ToolContext(self)
        return ctx

    # what ToolContext reads

    @property
    def session(self) -> Any:
        return self._engine.session

    @property
    def active(self) -> bool:
        runs = self.runs
        return runs is not None and runs.current and not self._engine.outbox.closed()

    @property
    def cancelled(self) -> bool:
        return self.cancelled_by is not None or self._engine.outbox.closed()

    def report(self, progress: Any, total: Any = None, message: Any = None) -> None:
        # On a handler's hot path (it may call this for every item). The steady state
        # first: a send is due already (the throttle's timer is armed, so not answered),
        # an int or float above the last and in range, the same total and message objects
        # as the last call's (checked then): store it for the timer, nothing else.
        if (self.progress_timer is not None and total is self.last_total
                and message is self.last_message and type(progress) in _PLAIN_NUMBERS
                and self.last_progress < progress <= _MAX_SAFE_INT):
            self.last_progress = progress
            self.unsent = True
            return
        # Otherwise: a plain int or float costs a few comparisons, and a total or message
        # the same object as the last one's is not checked again.
        if self.answered:
            return
        kind = type(progress)
        if kind is float:
            number = progress - progress == 0.0  # False for NaN and the infinities
        elif kind is int:
            number = -_MAX_SAFE_INT <= progress <= _MAX_SAFE_INT
        else:
            number = _is_number(progress)
        if not number:
            raise ValueError(f"ctx.progress: progress must be a finite number, got "
                             f"{excerpt(repr(progress))}")
        if progress <= self.last_progress:
            raise ValueError(f"ctx.progress: progress must increase: {progress!r} after "
                             f"{self.last_progress!r}")
        total_checked = total is None or total is self.last_total
        message_checked = message is None or message is self.last_message
        if not total_checked and not _is_number(total):
            raise ValueError(f"ctx.progress: total must be a finite number or None, got "
                             f"{excerpt(repr(total))}")
        if not message_checked:
            if not isinstance(message, str):
                raise ValueError(f"ctx.progress: message must be a string or None, got "
                                 f"{type(message).__name__}")
            if len(message) > MAX_STATUS_TEXT:
                message = message[:MAX_STATUS_TEXT]
        self.last_progress, self.last_total, self.last_message = progress, total, message
        if self.progress_timer is not None:  # a send is due already: it takes the latest
            self.unsent = True
        else:
            self._engine.progressed(self)

    def wait_begin(self, reason: str | None) -> None:
        self.waiting += 1
        if self.waiting == 1 and not self.answered:
            self._engine.set_waiting(self, True, reason)

    def wait_end(self) -> None:
        self.waiting -= 1
        if self.waiting == 0 and not self.answered:
            self._engine.set_waiting(self, False, None)

    # what the engine and the session read

    @property
    def tier(self) -> HandledBy:
        if self.handled_by is not None:
            return self.handled_by
        return self.runs.tier if self.runs is not None else "none"

    @property
    def latest(self) -> tuple[float, float | None, str | None] | None:
        """The latest progress reported, its total and message; None before the first."""
        if self.last_progress == -math.inf:
            return None
        return self.last_progress, self.last_total, self.last_message

    def progress_detail(self) -> dict[str, Any] | None:
        latest = self.latest
        if latest is None:
            return None
        progress, total, message = latest
        return {"progress": progress, "total": total, "message": message}

    def pending(self) -> PendingRequest:
        return PendingRequest(self.tool_request_id, self.tool, self.turn_id, self.status,
                              self.progress_detail(), self.source)

    def call(self) -> ToolCall:
        """The answered request's record."""
        duration = (self.finished_at - self.started_at) * 1000 if self.started_at else 0.0
        return ToolCall(self.tool_request_id, self.tool, self.args, self.turn_id, self.result,
                        self.result_json, self.tier, duration, self.source)

    async def wait(self) -> None:
        """Until the request is answered (for a second caller of the same id)."""
        if self.answered:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.waiters is None:
            self.waiters = []
        self.waiters.append(waiter)
        await waiter

    def __repr__(self) -> str:
        return f"<InFlight {self.tool} {self.tool_request_id} {self.status}>"


class Engine:
    """Registrations, the requests in flight, and the rules of their run."""

    def __init__(self, session: Any, outbox: Outbox, ledger: Ledger, *,
                 max_result_bytes: int, scheduler: Scheduler, cancel_grace: float,
                 explain_error: Callable[[BaseException], str | None] | None) -> None:
        self.session = session
        self.outbox = outbox
        self.ledger = ledger
        self.max_result_bytes = max_result_bytes
        self.scheduler = scheduler
        self.cancel_grace = cancel_grace
        self.explain_error = explain_error
        self.tools: dict[str, Tool] = {}
        self.inline: dict[str, Registration] = {}
        self.named: dict[str, Registration] = {}
        self.fallback: Registration | None = None
        self.approver: Approver | None = None
        #: the adapter's approver, asked when the application registered none (the page:
        #: its JS ``approval`` event)
        self.default_approver: Approver | None = None
        self.inflight: dict[str, InFlight] = {}  # every request not yet answered
        # the session's listeners of each kind of event (the same lists): events are built
        # only for someone
        self.hears_status: list[Any] = outbox.hearers(ToolStatus)
        self.hears_calls: list[Any] = outbox.hearers(ToolCall)
        self.hears_state: list[Any] = outbox.state_hearers()
        self._local_ids = itertools.count(1)

    # --- starting a request ------------------------------------------------------------

    def begin(self, tool: str, args: Any, tool_request_id: str | None, turn_id: str | None,
              *, reply: bool, timed: bool, source: Source = "local") -> InFlight:
        """Start a request. The record returned is answered already (a sync handler, a
        stored result, a refusal), or has its remaining work in ``rest`` for the caller to
        run or spawn, or is one already in flight under that id (``rest`` None: await
        ``wait()``). ``reply`` requests are Core's (their source is ``core``)."""
        if tool_request_id is None:
            # A generated id can never be re-sent, so the delivery ledger need not record it.
            request_id, record = f"{source}-{next(self._local_ids)}", False
        else:
            request_id, record = tool_request_id, True
            running = self.inflight.get(request_id)
            if running is not None:
                return running
        if self.outbox.closed():
            raise SessionClosedError("the session is closed")
        registration = self.named.get(tool) or self.inline.get(tool) or self.fallback
        rec = InFlight(self, tool, request_id, turn_id, args, record, reply, timed)
        if source != "local":
            rec.source = source
        if record:
            stored = self.ledger.get(request_id)
            if stored is not None:  # this tab ran it already: its stored result, never twice
                rec.result_json, rec.handled_by = stored
                rec.result = json.loads(rec.result_json)
                rec.answered = True
                rec.started_at = 0.0
                if reply:
                    self.outbox.send_result(rec)
                return rec
            if reply and self.ledger.was_started(request_id) and not self._resumable(tool):
                return self._interrupted(rec)
        self.inflight[request_id] = rec
        # A request refused before its handler runs (no handler, bad args) is handled by
        # no tier: its record carries no registration, so it says handledBy "none".
        definition = self.tools.get(tool)
        refused = self._refusal(tool, args, registration, definition)
        if refused is not None:
            self._started(rec)
            return self._answer(rec, refused)
        rec.runs = registration
        if definition is not None and definition.needs_approval is not False and (
                self._needs_approval(definition, args)) and not (
                record and self.ledger.was_approved(request_id)):
            rec.status = "awaiting_approval"
            self._started(rec)
            rec.rest = self._approve_then_run(rec)
            return rec
        self._started(rec)
        return self._call(rec)

    def _started(self, rec: InFlight) -> None:
        if self.hears_state:
            self.outbox.pending_changed(len(self.inflight))
        if self.hears_status:
            self.outbox.emit(ToolStatus(rec.tool_request_id, rec.tool, rec.turn_id, rec.status,
                                        rec.source))

    def _call(self, rec: InFlight) -> InFlight:
        """Call the handler; answered at once unless its outcome is awaitable."""
        runs = rec.runs
        assert runs is not None
        if rec.record and not runs.body_runs_later:
            self._ledger_start(rec.tool_request_id, rec.tool)
        try:
            handler, takes = runs.handler, runs.takes
            if runs.tier == "fallback":
                outcome = handler(*(rec.tool, rec.args, rec.ctx)[:takes])
            elif takes == 2:
                outcome = handler(rec.args, rec.ctx)
            else:
                outcome = handler(rec.args) if takes else handler()
        except (Exception, SystemExit) as exc:  # a handler must never end the session
            outcome = _handler_failure(rec.tool, exc, self.explain_error)
        if type(outcome) not in _PLAIN_TYPES and inspect.isawaitable(outcome):
            rec.rest = self._finish_later(rec, outcome)
            return rec
        return self.finish(rec, outcome)

    async def _finish_later(self, rec: InFlight, awaitable: Awaitable[Any]) -> None:
        runs = rec.runs
        if rec.record and runs is not None and runs.body_runs_later:
            self._ledger_start(rec.tool_request_id, rec.tool)  # its body runs in this step
        try:
            outcome = await awaitable
        except (Exception, SystemExit) as exc:
            outcome = _handler_failure(rec.tool, exc, self.explain_error)
        self.finish(rec, outcome)

    def _refusal(self, name: str, args: Any, registration: Registration | None,
                 definition: Tool | None) -> _Failure | None:
        """Why a request cannot reach a handler (none registered, args failing the tool's
        schema), or None when it can."""
        if registration is None:
            return _Failure(tool_error(
                TOOL_HANDLER_NOT_FOUND,
                f"no handler for tool {name!r}: no named handler, no inline handler, "
                "no fallback",
            ))
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

    def _interrupted(self, rec: InFlight) -> InFlight:
        """A side-effecting request that was running when this tab went away."""
        return self._answer(rec, _Failure(tool_error(
            TOOL_OUTCOME_UNKNOWN,
            f"{rec.tool!r} was interrupted (page reload or crash) after it started; it "
            "may or may not have taken effect, and it is not run twice",
            retryable=False,
        )), counted=False)

    # --- approval ----------------------------------------------------------------------

    def _needs_approval(self, definition: Tool, args: Any) -> bool:
        rule = definition.needs_approval
        if isinstance(rule, bool):
            return rule
        try:
            return rule(args) is not False
        except Exception:  # fail closed: a rule that cannot say asks the user
            logger.exception("the needs_approval rule of tool %s failed; asking for approval",
                             definition.name)
            return True

    async def _approve_then_run(self, rec: InFlight) -> None:
        if rec.answered:  # cancelled before this step ran
            return
        try:
            denial = await self._ask(rec)
        except asyncio.CancelledError:  # answered meanwhile (cancelled): nothing to run
            return
        if rec.answered:
            return
        if denial is not None:
            self.finish(rec, denial)
            return
        rec.status = "running"
        if self.hears_status:
            self.outbox.emit(ToolStatus(rec.tool_request_id, rec.tool, rec.turn_id, "running",
                                        rec.source))
        self._call(rec)
        rest, rec.rest = rec.rest, None
        if rest is not None:
            await rest

    async def _ask(self, rec: InFlight) -> _Failure | None:
        """None when approved, else the ``TOOL_DENIED`` result."""
        approver = self.approver or self.default_approver
        if approver is None:
            return _no_approver(rec.tool)
        request = rec.approval = ApprovalRequest(
            rec.tool, rec.args, rec.tool_request_id, rec.turn_id,
            lambda: self._record_approval(rec), rec.source)
        self.set_waiting(rec, True, APPROVAL_REASON, status=False)
        try:
            verdict: Any = approver(request)
            if inspect.isawaitable(verdict):
                rec.asking = asyncio.ensure_future(verdict)
                verdict = await rec.asking
        except ApprovalUnavailable:
            return _no_approver(rec.tool)
        except Exception as exc:  # fail closed: an approver that fails denies
            logger.error("the approver failed on %s; denied", rec.tool, exc_info=exc)
            request.reason = f"the approver failed: {type(exc).__name__}"
            verdict = False
        finally:
            rec.asking = None
            if not rec.answered:
                self.set_waiting(rec, False, None, status=False)
        if verdict is True:
            request.approve()
            return None
        reason = request.reason or "denied"
        return _Failure(tool_error(
            TOOL_DENIED, f"the user denied running {rec.tool!r}: {excerpt(reason)}",
            details={"reason": reason[:MAX_STATUS_TEXT]}, retryable=False))

    def _record_approval(self, rec: InFlight) -> None:
        """In the ledger with its request: a reload from now on does not ask again."""
        if rec.record and not rec.answered:
            try:
                self.ledger.approve(rec.tool_request_id, rec.tool)
            except Exception:
                _ledger_failed(rec.tool_request_id)

    # --- while it runs -----------------------------------------------------------------

    def progressed(self, rec: InFlight) -> None:
        """Send the latest progress now, or once the interval since the last has passed
        (no flush is due: see ``InFlight.report``)."""
        now = self.scheduler.time()
        if now >= rec.next_progress_at:
            rec.next_progress_at = now + PROGRESS_INTERVAL
            self._send_progress(rec)
        else:
            rec.unsent = True
            rec.progress_timer = self.scheduler.call_later(
                rec.next_progress_at - now, lambda: self._flush_progress(rec))

    def _flush_progress(self, rec: InFlight) -> None:
        rec.progress_timer = None
        if rec.unsent and not rec.answered:
            rec.next_progress_at = self.scheduler.time() + PROGRESS_INTERVAL
            self._send_progress(rec)

    def _send_progress(self, rec: InFlight) -> None:
        rec.unsent = False
        self.outbox.send_progress(rec)

    def set_waiting(self, rec: InFlight, waiting: bool, reason: str | None, *,
                    status: bool = True) -> None:
        if status:
            rec.status = "waiting_for_user" if waiting else "running"
        elif waiting:
            rec.status = "awaiting_approval"
        if reason is not None:
            reason = reason[:MAX_STATUS_TEXT]
        self.outbox.send_waiting(rec, waiting, reason)
        if status and self.hears_status:
            self.outbox.emit(ToolStatus(rec.tool_request_id, rec.tool, rec.turn_id, rec.status,
                                        rec.source))

    def cancel(self, tool_request_id: str, reason: str, *, grace: bool) -> bool:
        """Mark a request cancelled. One awaiting approval is answered ``TOOL_CANCELLED``
        at once (nothing ran); a running one, with ``grace``, once the grace period has
        passed if its handler has not finished by then. False if it is not in flight (none,
        or answered already: its result is on its way)."""
        rec = self.inflight.get(tool_request_id)
        if rec is None or rec.answered:
            return False
        if rec.cancelled_by is None:
            rec.cancelled_by = reason
        if rec.status == "awaiting_approval":
            asking = rec.asking
            if not grace:  # Core's cancel: Core has answered its caller and forgotten it
                rec.reply = False
            if rec.approval is not None:  # its verdict is no longer wanted
                rec.approval.withdraw()
            self._answer(rec, _cancelled(rec, reason, "before it was approved"))
            if asking is not None:  # the approver's wait ends (CancelledError)
                asking.cancel()
        elif grace and rec.grace is None:
            rec.grace = self.scheduler.call_later(self.cancel_grace,
                                                  lambda: self._give_up(rec))
        return True

    def close(self, reason: str) -> None:
        """The session closed: settle every request in flight, as :meth:`cancel` with the
        grace period does (one awaiting approval is withdrawn and answered at once; a
        running one sees ``ctx.cancelled`` and is answered once it finishes or the grace
        period has passed), so no caller of ``dispatch`` waits for ever."""
        for request_id in list(self.inflight):
            self.cancel(request_id, reason, grace=True)

    def _give_up(self, rec: InFlight) -> None:
        rec.grace = None
        if not rec.answered:
            self._answer(rec, _cancelled(
                rec, rec.cancelled_by or "cancelled",
                f"its handler did not finish within {self.cancel_grace:g} s"))

    # --- the answer --------------------------------------------------------------------

    def finish(self, rec: InFlight, outcome: Any) -> InFlight:
        """The handler's outcome: the request's answer, unless it was answered already
        (cancelled past its grace period): then it is logged, not sent."""
        if rec.answered:
            logger.warning("tool request %s (%s) finished after it was answered %s; its "
                           "outcome is not sent", rec.tool_request_id, rec.tool, TOOL_CANCELLED)
            return rec
        return self._answer(rec, outcome)

    def _answer(self, rec: InFlight, outcome: Any, *, counted: bool = True) -> InFlight:
        """Check and encode the outcome; record, send, notify."""
        if rec.started_at:
            rec.finished_at = time.perf_counter()
        result = outcome.result if isinstance(outcome, _Failure) else outcome
        try:
            rec.result, rec.result_json = encode_result(result, self.max_result_bytes)
        except ResultError as exc:  # the runtime's own error result, small and always sent
            rec.result = exc.result
            rec.result_json = strictjson.encode(exc.result)
        rec.answered = True
        if rec.grace is not None:
            rec.grace.cancel()
            rec.grace = None
        if rec.progress_timer is not None:
            rec.progress_timer.cancel()
            rec.progress_timer = None
        if rec.unsent:  # the last progress goes before the result
            self._send_progress(rec)
        request_id = rec.tool_request_id
        # The result goes out before the ledger keeps it: both happen in this one step (a
        # page's one JS task), which a reload cannot come between, and the write then
        # overlaps the frame's way to Core instead of delaying it. Until it is kept the
        # record stays in flight, answered (what a transport's send may run meanwhile
        # finds it so), and it is kept even if the send raised (an interrupt).
        try:
            if rec.reply:
                self.outbox.send_result(rec)
        finally:
            if rec.record:
                self._ledger_finish(request_id, rec.result_json, rec.tier)
            if counted:
                del self.inflight[request_id]
        waiters = rec.waiters
        if waiters:
            rec.waiters = None
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)
        if counted:
            if self.hears_status:
                self.outbox.emit(ToolStatus(request_id, rec.tool, rec.turn_id, "done",
                                            rec.source))
            if self.hears_calls:
                self.outbox.emit(rec.call())
            if self.hears_state:
                self.outbox.pending_changed(len(self.inflight))
        return rec

    # Delivery-ledger writes. One that fails (storage full or gone) costs that record,
    # never the request: the handler still runs and its result still goes to Core.

    def _resumable(self, tool: str) -> bool:
        """Whether a request to ``tool`` cut short may run again (its definition says)."""
        definition = self.tools.get(tool)
        return definition is not None and definition.resumable

    def _ledger_start(self, tool_request_id: str, tool: str) -> None:
        try:
            self.ledger.start(tool_request_id, tool, resumable=self._resumable(tool))
        except Exception:
            _ledger_failed(tool_request_id)

    def _ledger_finish(self, tool_request_id: str, result_json: str,
                       handled_by: HandledBy) -> None:
        try:
            self.ledger.finish(tool_request_id, result_json, handled_by)
        except Exception:
            _ledger_failed(tool_request_id)


def _is_number(value: Any) -> bool:
    """A finite int or float, not a bool (JSON's numbers, as the wire takes them)."""
    kind = type(value)
    if kind is int:
        return bool(abs(value) <= _MAX_SAFE_INT)
    if kind is float:
        return math.isfinite(value)
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and abs(value) <= _MAX_SAFE_INT)


_MAX_SAFE_INT = 2**53  # the largest integer a JSON reader's double holds exactly
_PLAIN_NUMBERS = frozenset({int, float})  # not bool: JSON's true is not a number


# Handler outcomes that are certainly not awaitable: checked before inspect.isawaitable.
_PLAIN_TYPES = frozenset({dict, list, str, int, float, bool, type(None), tuple})


class _Failure:
    """A result the runtime produced instead of the handler's value."""

    __slots__ = ("result",)

    def __init__(self, result: dict[str, Any]) -> None:
        self.result = result


def _no_approver(tool: str) -> _Failure:
    return _Failure(tool_error(
        TOOL_DENIED,
        f"{tool!r} needs the user's approval and no approver is registered "
        "(session.on_approval, or the page's approval event): it was not run",
        details={"reason": "no approver"}, retryable=False))


def _cancelled(rec: InFlight, reason: str, when: str) -> _Failure:
    return _Failure(tool_error(
        TOOL_CANCELLED, f"{rec.tool!r} was cancelled ({excerpt(reason)}); {when}",
        details={"reason": reason[:MAX_STATUS_TEXT]}, retryable=False))


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
