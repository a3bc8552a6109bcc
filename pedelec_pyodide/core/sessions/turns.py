"""Running one turn of an agent in a session: Core's side of the :class:`Turn` protocol.

``call_tools`` is one step: every call of the step becomes a ``tool.request`` sent
together (after the store has them), and the step returns when all are resolved, in the
order asked. A turn has at most ``max_steps`` steps. Cancelling the turn cancels its
pending requests (``tool.cancel`` to the page) and ends it ``cancelled``.

After a restart of Core, a turn that was running is run again from the start with its
journal (the requests it had made, stored with their results): while the agent asks for
the same calls in the same order, it gets the recorded results, or waits for the very
requests still pending (re-sent to the page on resume, same ids), and nothing is sent
twice. An agent that asks for something else (a model is not deterministic) ends the
turn ``failed`` with ``TURN_INTERRUPTED``: an honest failure, not a guess.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, NamedTuple

from ... import protocol
from ...results import INVALID_ARGS, tool_error
from ...text import excerpt, lone_surrogate_at, not_unicode
from ..agents.contract import Agent, StepLimitExceeded, ToolCallOutcome, ToolCallRequest
from ..log import log_event
from ..offload import LARGE_CHARS, is_large, off_loop, off_loop_when
from ..store import (
    IdempotencyRecord,
    JsonText,
    RequestRecord,
    Snapshot,
    StoreError,
    TurnRecord,
    kept_json,
    turn_key,
)
from .codes import SESSION_MOVED
from .frames import CheckedRequest, checked_call, delta_frames, end_frame, new_request_id
from .history import HistoryIndex, appended_history, indexed_trim, trimmed_history
from .pending import TrackedRequest
from .registry import Registry
from .session import CoreSession

STEP_LIMIT_EXCEEDED = "STEP_LIMIT_EXCEEDED"
AGENT_ERROR = "AGENT_ERROR"
TURN_INTERRUPTED = "TURN_INTERRUPTED"
TURN_CANCELLED = "TURN_CANCELLED"


class _Diverged(Exception):
    """After a restart, the agent asked for calls other than the ones it had made."""


class TurnRunner:
    """One turn: the :class:`Turn` the agent sees, and the task that runs it."""

    def __init__(self, session: CoreSession, record: TurnRecord, agent: Agent, *,
                 journal: list[RequestRecord] | None = None) -> None:
        self.session = session
        self.record = record
        self.agent = agent
        self.turn_id = record.id
        self.session_id = session.id
        self.text = record.text
        self._tools_json = session.record.tools  # the tools as the turn started
        # the agent's history, decoded when the agent first asks for it (the offline
        # agent only appends, at its end: a turn waiting on the page holds no decoded
        # history of earlier calls)
        self._history_json = session.record.history
        self._history: list[dict[str, Any]] | None = None
        # entries remembered (:meth:`remember`) while the history was not decoded
        self._remembered: list[dict[str, Any]] = []
        self.max_steps = session.registry.config.max_steps
        self.steps = 0
        self.usage: dict[str, int] = {}
        self.task: asyncio.Task[TurnRecord] | None = None
        self._journal: list[list[RequestRecord]] = _steps(journal or [])
        record.tool_calls = []  # rebuilt by the replay when the turn is resumed
        # the requests it made that are still pending, and the ids of all (its journal)
        self._requests: dict[str, TrackedRequest] = {}
        self._made: list[str] = []
        self._cancel_reason = "the turn was cancelled"
        self._ending = False  # its end is decided and being stored: too late to cancel
        self._abandoned = False  # its session moved to another node, which carries it on
        self.clock = session.registry.config.clock
        self._started = self.clock.monotonic()

    # --- the Turn protocol ------------------------------------------------------------

    @property
    def tools(self) -> list[dict[str, Any]]:
        """Decoded when asked, not held for the whole turn (see :class:`PageMetadata`)."""
        tools: list[dict[str, Any]] = json.loads(self._tools_json)
        return tools

    @property
    def history(self) -> list[dict[str, Any]]:
        if self._history is None:
            self._history = json.loads(self._history_json) + self._remembered
            self._remembered = []
        return self._history

    @history.setter
    def history(self, entries: list[dict[str, Any]]) -> None:
        self._history = entries
        self._remembered = []

    def remember(self, entry: dict[str, Any]) -> None:
        if self._history is not None:
            self._history.append(entry)
        else:  # appended to the kept text at the turn's end (appended_history)
            self._remembered.append(entry)

    async def call_tools(self, calls: list[ToolCallRequest]) -> list[ToolCallOutcome]:
        if self.steps >= self.max_steps:
            raise StepLimitExceeded(
                f"the turn reached its limit of {self.max_steps} tool-calling steps")
        step = self.steps
        self.steps += 1
        limit = self.session.registry.config.max_frame_bytes
        vetted = await off_loop_when(any(is_large(call.args) for call in calls),
                                     _vetted, calls, self.turn_id, limit)
        asked = [(call.tool, call.call_id) for call in calls]
        if step < len(self._journal):
            sent = iter(await self._replay(step, [
                call for call, checks in zip(calls, vetted, strict=True)
                if checks.refusal is None]))
        else:
            # From here on the calls' args are held as text (their frames; the journal's
            # JSON) while the page works: decoded, a page's may take ~24 times the memory.
            planned = [(call.tool, call.call_id, call.args if checks.args_json is None
                        else JsonText(checks.args_json), checks)
                       for call, checks in zip(calls, vetted, strict=True)
                       if checks.refusal is None]
            del calls
            sent = iter(await self._send(step, planned))
        return [next(sent) if checks.refusal is None
                else self._refused(tool, call_id, checks.refusal)
                for (tool, call_id), checks in zip(asked, vetted, strict=True)]

    async def _send(self, step: int, calls: list[tuple[str, str | None, Any, _Vetted]]
                    ) -> list[ToolCallOutcome]:
        """Open, store and send one step's calls (``(tool, call_id, args, checks)``); their
        outcomes."""
        session = self.session
        opened = []
        for index, (tool, _, args, checks) in enumerate(calls):
            pending = session.open_request(tool, args, turn_id=self.turn_id,
                                           step=step, index=index, checked=checks.checked)
            if checks.refused is not None:  # the page would refuse its frame: never sent
                session.refuse_request(pending, checks.refused)
            opened.append(pending)
            self._requests[pending.id] = pending
            self._made.append(pending.id)
        await session.store_requests(opened, turn_key(session.id, self.turn_id))
        for pending in opened:
            session.send_request(pending)
        session.flush()  # with the step's text (turn.delta) queued before them
        pairs = zip(opened, calls, strict=True)
        return [await self._outcome(pending, call_id) for pending, (_, call_id, _, _) in pairs]

    async def say(self, text: str) -> None:
        await _check_text(text, "the reply text")
        if self.steps < len(self._journal):
            return  # replaying after a restart: the page has seen this text already
        session = self.session
        delta = protocol.TurnDelta(turn_id=self.turn_id, text=text)
        limit = session.registry.config.max_frame_bytes
        frames = await off_loop_when(len(text) > LARGE_CHARS, delta_frames, delta, limit)
        for frame in frames:
            session.send(frame)

    # --- running ----------------------------------------------------------------------

    def start(self) -> asyncio.Task[TurnRecord]:
        self.task = asyncio.ensure_future(self._run())
        return self.task

    def cancel(self, reason: str) -> None:
        if self.task is not None and not self.task.done() and not self._ending:
            self._cancel_reason = reason
            self.task.cancel()

    def abandon(self) -> None:
        """The session moved to another node, which carries the turn on from the store:
        stop here, storing nothing; a caller waiting here gets ``SESSION_MOVED``."""
        if self.task is not None and not self.task.done() and not self._ending:
            self._abandoned = True
            self.task.cancel()

    def store_again(self) -> None:
        """The turn's record and the requests it made (its journal): the store lost them."""
        store = self.session.registry.store
        store.save_turn(self.record)
        for step in self._journal:
            for request in step:
                store.save_request(request)
        for pending in self._requests.values():
            store.save_request(pending.record)

    async def _run(self) -> TurnRecord:
        record = self.record
        session = self.session
        log_event("turn.start", session=session.id, turn=record.id)
        try:
            text = await self.agent.run(self)
            if not isinstance(text, str):
                raise TypeError(f"the agent returned {type(text).__name__}, not str")
            await _check_text(text, "the reply text")
            record.status, record.final_text = "completed", text
        except asyncio.CancelledError:
            if self._abandoned:  # not stored: the record is the other node's now
                record.status = "failed"
                record.error = {"code": SESSION_MOVED, "message": (
                    "the page's session moved to another Core node, which carries this "
                    "turn on (retry with the same Idempotency-Key for its end)")}
                return record
            record.status = "cancelled"
            record.error = {"code": TURN_CANCELLED, "message": self._cancel_reason}
        except StepLimitExceeded as exc:  # (an agent's may quote what its model asked for)
            record.status = "failed"
            record.error = {"code": STEP_LIMIT_EXCEEDED, "message": excerpt(str(exc))}
        except _Diverged as exc:
            record.status = "failed"
            record.error = {"code": TURN_INTERRUPTED, "message": str(exc)}
        except Exception as exc:
            record.status = "failed"
            detail = excerpt(str(exc))
            record.error = {
                "code": AGENT_ERROR,
                "message": f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__,
            }
            log_event("turn.agent_error", session=session.id, turn=record.id,
                      error=record.error["message"])
        self._ending = True
        config = session.registry.config
        try:
            history = await self._kept_history(config.max_history_bytes)
        except Exception as exc:  # (a stored history Core cannot write again): kept as it was
            history = None
            log_event("turn.history_failed", level=logging.WARNING, session=session.id,
                      turn=record.id, error=f"{type(exc).__name__}: {excerpt(str(exc))}")
        self._finish(history)
        # The page hears of the end only once it is stored: a Core killed right after
        # sending it would otherwise come back with the turn still running, and run it
        # again while the page has moved on (its next turn.start refused TURN_BUSY).
        # Until then the turn is still the session's: a re-sent turn.start is ignored.
        # its text is all of the end that may be long (the error is an excerpt)
        long_end = len(record.final_text or "") > LARGE_CHARS
        try:
            await session.stored(session.id, turn_key(session.id, record.id),
                                 large=long_end)
        except StoreError as exc:  # the page still hears the end; the operator, the failure
            log_event("store.failed", session=session.id, turn=record.id, error=str(exc))
        frame = await off_loop_when(long_end, end_frame, record, config.max_frame_bytes)
        if session.turn is self:
            session.turn = None
        if not session.closed:
            session.send_turn_end(record, frame)
        return record

    async def _kept_history(self, limit: int) -> str | None:
        """The history's JSON text to keep after this turn (None: the agent neither read
        nor added to it). Short work happens in place, where a thread hop would cost more;
        a pass over a long history off the event loop."""
        session = self.session
        index, session.history_index = session.history_index, None
        history = self._history
        if history is not None:  # the agent read it: trimmed whole
            large = len(self._history_json) > LARGE_CHARS or is_large(history)
            return await off_loop_when(large, trimmed_history, history, limit)
        entries = self._remembered
        if not entries:
            session.history_index = index
            return None
        if self._history_json == "[]":  # (a new session's)
            index = HistoryIndex.of(self._history_json, [], [])
        if index is not None and index.text is self._history_json:
            kept = await off_loop_when(is_large(entries), index.append, entries, limit)
            if kept is not None:
                session.history_index = index
                return kept
        kept = await off_loop_when(is_large(entries), appended_history, self._history_json,
                                   entries, limit)
        if kept is None:  # over its bound: the whole decoded and trimmed, by whole turns
            kept, session.history_index = await off_loop(
                indexed_trim, self._history_json, entries, limit)
        return kept

    def _finish(self, history: str | None) -> None:
        """Cancel what is pending, clear the journal, store the turn and the agent's
        ``history`` (its JSON text, trimmed; None: the agent did not look at it)."""
        session = self.session
        record = self.record
        for pending in list(self._requests.values()):
            session.cancel_request(pending, self._cancel_reason)
        for step in self._journal:  # restored requests the replay never reached
            for request in step:
                restored = session.pending.get(request.id)
                if restored is not None:
                    session.cancel_request(restored, "the turn ended before this request")
        store = session.registry.store
        for request_id in self._made:
            store.delete_request(session.id, request_id)
        for step in self._journal:
            for request in step:
                store.delete_request(session.id, request.id)
        if history is not None:
            session.record.history = history
        store.save_history(session.record)  # the agent's history (not the tools)
        record.usage = dict(self.usage)
        store.save_turn(record)
        log_event("turn.end", session=session.id, turn=record.id, status=record.status,
                  steps=self.steps, calls=len(record.tool_calls),
                  code=None if record.error is None else record.error["code"],
                  ms=(self.clock.monotonic() - self._started) * 1000,
                  **{f"usage_{key.removesuffix('_tokens')}": value
                     for key, value in self.usage.items()})

    # --- results ------------------------------------------------------------------------

    async def _outcome(self, pending: TrackedRequest, call_id: str | None) -> ToolCallOutcome:
        result, handled_by = await pending.future
        self._requests.pop(pending.id, None)
        return self._record(pending.record, call_id, result, handled_by,
                            (self.clock.monotonic() - pending.started) * 1000)

    def _record(self, request: RequestRecord, call_id: str | None, result: Any,
                handled_by: str, duration_ms: float) -> ToolCallOutcome:
        """The outcome for the agent (its result decoded, its args decoded when read:
        ToolCallOutcome) and the turn's record of it (as text, where Core has the text:
        its own journal's)."""
        args = request.args
        args_json = args if isinstance(args, JsonText) else None
        result_json = request.result if isinstance(request.result, JsonText) else None
        outcome = ToolCallOutcome(
            tool_request_id=request.id, tool=request.tool, args=args, result=result,
            handled_by=handled_by, call_id=call_id, duration_ms=duration_ms,
            args_json=args_json, result_json=result_json,
        )
        self.record.tool_calls.append({
            "toolRequestId": request.id, "tool": request.tool, "args": args_json or args,
            "result": result_json or result, "handledBy": handled_by,
            "durationMs": round(duration_ms, 3),
        })
        return outcome

    def _refused(self, tool: str, call_id: str | None, why: str) -> ToolCallOutcome:
        """An INVALID_ARGS outcome for a call that was never sent (its tool and args are
        recorded only as excerpts: they are not valid text)."""
        result = tool_error(INVALID_ARGS, f"{why}; the call was not made", retryable=True)
        outcome = ToolCallOutcome(tool_request_id=new_request_id(), tool=excerpt(tool),
                                  args=None, result=result, handled_by="none",
                                  call_id=call_id)
        self.record.tool_calls.append({
            "toolRequestId": outcome.tool_request_id, "tool": outcome.tool, "args": None,
            "result": result, "handledBy": "none", "durationMs": 0.0,
        })
        return outcome

    async def _replay(self, step: int, calls: list[ToolCallRequest]) -> list[ToolCallOutcome]:
        recorded = self._journal[step]
        asked = [(call.tool, call.args) for call in calls]
        if asked != [(request.tool, request.args) for request in recorded]:
            raise _Diverged(
                "Core restarted during this turn and the agent, run again, asked for "
                f"different tool calls at step {step + 1}; the turn cannot continue safely")
        outcomes = []
        for request, call in zip(recorded, calls, strict=True):
            pending = self.session.pending.get(request.id)
            if pending is not None:
                outcomes.append(await self._outcome(pending, call.call_id))
            else:  # answered before the restart, or since (its record keeps it as text)
                result = request.result
                if isinstance(result, JsonText):
                    result = result.value()
                outcomes.append(self._record(request, call.call_id, result,
                                             request.handled_by or "none", 0.0))
        return outcomes


def _steps(journal: list[RequestRecord]) -> list[list[RequestRecord]]:
    """The journal by step number (a step whose calls were all refused stored none)."""
    by_step: dict[int, list[RequestRecord]] = {}
    for request in journal:
        by_step.setdefault(request.step, []).append(request)
    return [sorted(by_step.get(step, []), key=lambda r: r.index)
            for step in range(max(by_step, default=-1) + 1)]


class _Vetted(NamedTuple):
    """A call of a turn, checked before anything of it is stored or sent."""

    #: why it cannot be sent (not valid Unicode text): answered at once, no row, no frame
    refusal: str | None
    checked: CheckedRequest | None  # its id and tool.request frame, if the page takes it
    refused: protocol.ProtocolError | None  # else why the page would refuse the frame
    args_json: str | None = None  # its args as JSON text, if the page takes it


def _vetted(calls: list[ToolCallRequest], turn_id: str, max_frame_bytes: int
            ) -> list[_Vetted]:
    """Each call checked in one pass over its args: its frame made and checked as the
    page would (:func:`checked_call`). The page's check finds a lone surrogate too, but
    not where: only a call it refuses is looked at again for one."""
    vetted = []
    for call in calls:
        try:
            vetted.append(_Vetted(None, checked_call(call.tool, call.args, max_frame_bytes,
                                                     turn_id), None, kept_json(call.args)))
        except protocol.ProtocolError as exc:
            vetted.append(_Vetted(_refusal(call), None, exc))
    return vetted


def _refusal(call: ToolCallRequest) -> str | None:
    """Why ``call`` cannot be sent, or None: its tool name or args hold a lone surrogate."""
    if lone_surrogate_at(call.tool) is not None:
        return f"the tool name holds {not_unicode()}"
    where = lone_surrogate_at(call.args)
    return None if where is None else f"the args hold {not_unicode(where)}"


async def _check_text(text: str, what: str) -> None:
    """An agent's text goes into frames and rows: refuse a lone surrogate in it (a long
    text is checked off the event loop)."""
    where = await off_loop_when(len(text) > LARGE_CHARS, lone_surrogate_at, text)
    if where is not None:
        raise ValueError(f"{what} of the agent holds {not_unicode()}")


def start_turn(session: CoreSession, turn_id: str, text: str) -> TurnRunner:
    """Start a turn; the caller has checked that none is running."""
    record = TurnRecord(id=turn_id, session_id=session.id, text=text, status="running",
                        created_at=session.registry.config.clock.time())
    runner = TurnRunner(session, record, session.registry.agent_factory())
    session.turn = runner
    session.registry.store.save_turn(record)
    runner.start()
    return runner


def restore(registry: Registry, snapshot: Snapshot) -> None:
    """Rebuild sessions from the store (at start, or a session taken over from another
    node); run the turns that were running again, with their journals."""
    for record in snapshot.sessions:  # oldest first
        session = CoreSession(registry, record)
        registry.sessions[record.id] = session
        session.await_resume()
    journals: dict[tuple[str, str], list[RequestRecord]] = {}
    kept: dict[str, list[RequestRecord]] = {}
    for request in snapshot.requests:
        owner = registry.sessions.get(request.session_id)
        if owner is None:
            continue
        if request.turn_id is not None:
            journals.setdefault((request.session_id, request.turn_id), []).append(request)
        if not request.answered:
            owner.track(request, stored=True)
        elif request.turn_id is None:
            kept.setdefault(request.session_id, []).append(request)
    for turn in snapshot.turns:
        owner = registry.sessions.get(turn.session_id)
        if owner is None:
            continue
        if turn.status == "running":
            journal = journals.get((turn.session_id, turn.id), [])
            runner = TurnRunner(owner, turn, registry.agent_factory(), journal=journal)
            owner.turn = runner
            runner.start()
            log_event("turn.resumed", session=owner.id, turn=turn.id, journal=len(journal))
        else:
            ended = owner.remember_end(turn)
            if not turn.end_delivered:
                owner.unsent_ends.append(ended)
    keys: dict[str, list[IdempotencyRecord]] = {}
    for key in snapshot.keys:
        keys.setdefault(key.session_id, []).append(key)
    turns: dict[str, dict[str, TurnRecord]] = {}
    for turn in snapshot.turns:  # the very records the resumed turns update
        turns.setdefault(turn.session_id, {})[turn.id] = turn
    for session_id in (record.id for record in snapshot.sessions):
        owner = registry.sessions[session_id]
        owner.callers.restore(kept.get(session_id, []), keys.get(session_id, []),
                              turns.get(session_id, {}), set(owner.pending))
    log_event("store.restored", sessions=len(registry.sessions),
              pending=sum(len(s.pending) for s in registry.sessions.values()))
