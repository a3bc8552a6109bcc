"""``--agent ag-ui:URL``: turns run on the user's own agent, spoken to over AG-UI.

Core is the AG-UI client and the page's tools are the agent's frontend tools. One model
answer of :class:`~.model.ModelAgent`'s turn loop is one AG-UI run: Core POSTs a
``RunAgentInput`` (built and encoded with the official ``ag-ui-protocol`` types) and reads
the run's events from its ``text/event-stream``:

- ``TEXT_MESSAGE_CONTENT`` (and ``TEXT_MESSAGE_CHUNK``) deltas are said as they arrive;
- ``TOOL_CALL_START/ARGS/END`` (and ``TOOL_CALL_CHUNK``) are calls; a call the agent answers
  itself in the run (``TOOL_CALL_RESULT``: one of its own tools) is kept for the history
  only, every other one goes to the page once the run has finished, through the same path
  as any model's calls, and its result goes back in the next run's messages;
- ``RUN_FINISHED`` ends the run; ``RUN_ERROR``, a stream that ends before it, an event
  that is not AG-UI or is over the bounds on what Core validates (one over them that
  leads with a type Core has no use for is skipped unread), a run's stream over
  :data:`MAX_STREAM_BYTES` (a turn's streams over
  :data:`MAX_TURN_STREAM_BYTES`), an event gap over the tool timeout or a run longer than
  the run limit (events may keep a run going that long, not for ever) fail the turn with
  a message naming the agent's URL.

History messages are AG-UI messages, camelCase as on the wire: ``user``, ``assistant``
(with ``toolCalls``) and ``tool`` (``toolCallId``, the result's JSON as ``content``,
``error`` for an error result). The thread is the session: ``threadId`` is its id.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
import ssl
import uuid
from base64 import b64encode
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal
from urllib.parse import parse_qsl, unquote, urlsplit

import httpx
from ag_ui.core import (
    Event,
    EventType,
    RunAgentInput,
    RunErrorEvent,
    RunFinishedCancelledOutcome,
    RunFinishedEvent,
    RunFinishedInterruptOutcome,
    TextMessageChunkEvent,
    TextMessageContentEvent,
    ToolCallArgsEvent,
    ToolCallChunkEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
)
from pydantic import TypeAdapter, ValidationError
from pydantic_core import from_json

from ...errors import PedelecError
from ...protocol import outside_strings
from ...results import is_error_result
from ...text import excerpt
from ..clock import Clock
from ..offload import LARGE_CHARS, is_large, off_loop, off_loop_when
from .contract import Turn
from .model import (
    MAX_CALLS,
    Failure,
    ModelAgent,
    ModelAnswer,
    ModelCall,
    ModelSettings,
    Say,
    public_url,
    result_text,
    tool_description,
    tool_schema,
)

#: the spec's prefix: ``ag-ui:URL``
PREFIX = "ag-ui"
#: seconds the agent has to accept the connection
CONNECT_SECONDS = 10.0
#: bytes of one run's event stream, in all
MAX_STREAM_BYTES = 16 * 1024 * 1024
#: bytes of all of one turn's runs' streams: each run is sent what the earlier ones said
#: (nine runs of 15 MB each sent the last ~120 MB and held ~450 MiB of Core's memory)
MAX_TURN_STREAM_BYTES = 2 * MAX_STREAM_BYTES
#: bytes of one event (its ``data`` lines together), and so of one line
MAX_EVENT_BYTES = 4 * 1024 * 1024
#: lines, and bytes of events, read between two turns of the event loop: each event (two
#: lines at least) is handled before the next is read; a 64 KiB read of tiny events held
#: the loop ~100 ms, 128 events of 16 KiB (validated in place) ~90 ms
SLICE_LINES = 256
SLICE_BYTES = 16 * 1024
#: bytes of an event that Core validates: pydantic builds it with the GIL held, and never
#: hands it back within an event, so every other session waits (4 MiB of nested arrays
#: took 0.3-0.6 s)
MAX_VALIDATED_EVENT_BYTES = 1024 * 1024
#: JSON values in an event that Core validates, counted by its brackets and commas outside
#: strings (0.3-1.5 µs each to build, errors cost more: 65,536 took up to 0.2 s); an event
#: of up to 16 KiB, validated without a count, holds no more
MAX_EVENT_VALUES = 8192
#: bytes at the start of an event over those bounds where its ``type`` is looked for (the
#: AG-UI SDKs write it first): a type Core has no use for is skipped, unread
TYPE_PREFIX_BYTES = 4096
#: bytes of an error answer's body quoted in the turn's message
MAX_ERROR_BODY = 4096
#: a header value this long or longer is hidden wherever a failure's message would show it
MIN_SECRET_CHARS = 6

_EVENT: TypeAdapter[Any] = TypeAdapter(Event)
#: the events Core acts on, as :meth:`AgUiAgent._apply` does; it skips any other type
_USED = (TextMessageContentEvent, TextMessageChunkEvent, ToolCallStartEvent,
         ToolCallChunkEvent, ToolCallArgsEvent, ToolCallResultEvent, RunErrorEvent,
         RunFinishedEvent)
_USED_TYPES = frozenset(kind.model_fields["type"].default.value for kind in _USED)
_SKIPPED_TYPES = frozenset(kind.value for kind in EventType) - _USED_TYPES
_LINE_END = re.compile(rb"[\r\n]")

OutcomeKind = Literal["success", "interrupt", "cancelled"]


@functools.cache
def _tls() -> ssl.SSLContext:
    """The TLS context of every run, made once: making one loads the CA bundle, tens of
    ms of the event loop's time, which every run's client would otherwise spend."""
    return httpx.create_ssl_context()


class AgUiError(PedelecError):
    """The AG-UI agent's answer cannot be used; the message says why and names its URL."""


def check_url(url: str) -> str:
    """The agent's URL, checked: http or https with a host."""
    parts = urlsplit(url.strip())
    try:
        parts.port  # noqa: B018 (raises on a bad port)
    except ValueError:
        parts = parts._replace(netloc="")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        shown = excerpt(public_url(url)) if url.strip() else "nothing"
        raise ValueError(f"agent ag-ui:URL needs an http or https URL, e.g. "
                         f"ag-ui:http://127.0.0.1:8000/agent; got {shown}")
    return url.strip()


@dataclass
class _Call:
    """One tool call of a run, as its events built it."""

    call_id: str
    name: str
    parent: str | None  # the id of the agent's message that holds the call
    args: list[str] = field(default_factory=list)  # joined once, at the end: linear
    result: dict[str, Any] | None = None  # the agent's own tool: its tool message


@dataclass
class _Run:
    """What one run said and asked, event by event."""

    text: list[str] = field(default_factory=list)
    text_id: str | None = None  # the id of the agent's message the text began in
    calls: dict[str, _Call] = field(default_factory=dict)
    latest: str | None = None  # the call a TOOL_CALL_CHUNK without an id continues
    outcome: OutcomeKind | None = None  # set by RUN_FINISHED


class AgUiAgent(ModelAgent):
    """The AG-UI agent at one URL, for one turn (Core makes one per turn)."""

    provider = PREFIX
    key_env = "--agent-header"  # where its credentials come from, for messages

    def __init__(self, url: str, headers: Sequence[tuple[str, str]],
                 settings: ModelSettings, run_limit: float, clock: Clock | None = None
                 ) -> None:
        super().__init__(public_url(url), settings, "", url, clock)
        self._headers = list(headers)
        self._run_limit = run_limit
        self._thread_id = ""
        self._turn_id = ""
        self._runs = 0
        self._received = 0  # bytes of this turn's streams so far

    @classmethod
    def from_spec(cls, url: str, headers: Sequence[tuple[str, str]], event_timeout: float,
                  run_limit: float, settings: ModelSettings | None = None,
                  clock: Clock | None = None) -> AgUiAgent:
        """The agent at ``url``: events at most ``event_timeout`` seconds apart, a run's
        events within ``run_limit`` seconds of its answer's head, one attempt per run (a
        run may have effects on the agent's side: never sent twice)."""
        url = check_url(url)
        if (urlsplit(url).username is not None
                and any(name.lower() == "authorization" for name, _ in headers)):
            raise ValueError("agent ag-ui:URL: the URL's user and password are sent as its "
                             "Authorization header, in place of --agent-header "
                             "Authorization: give one of them")
        base = settings or ModelSettings.from_env()
        _tls()  # at start, not in a turn
        return cls(url, headers,
                   replace(base, request_timeout=event_timeout, max_attempts=1), run_limit,
                   clock)

    def secrets(self) -> list[str]:
        # the URL's password and query values are as secret as the headers (an error page
        # may echo the URL); a value too short to be a credential ("1", "blue") would blot
        # out the message
        parts = urlsplit(self.base_url)
        password = parts.password or ""
        values = [value for _, value in self._headers] + [password, unquote(password)]
        if parts.username is not None or password:  # sent as Basic auth: echoed encoded
            user = parts.username or ""
            values += [b64encode(f"{user}:{password}".encode()).decode(),
                       b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode()]
        values += [piece.partition("=")[2] for piece in parts.query.split("&")]
        values += [value for _, value in parse_qsl(parts.query)]
        return sorted({value for value in values if len(value) >= MIN_SECRET_CHARS},
                      key=len, reverse=True)

    async def run(self, turn: Turn) -> str:
        self._thread_id, self._turn_id = turn.session_id, turn.turn_id
        return await super().run(turn)

    # --- the messages ------------------------------------------------------------------

    def tool_definitions(self, tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"name": tool["name"], "description": tool_description(tool),
                 "parameters": tool_schema(tool)} for tool in tools]

    def user_message(self, text: str) -> dict[str, Any]:
        return {"id": f"{self._turn_id}-user", "role": "user", "content": text}

    def result_messages(self, answered: list[tuple[ModelCall, Any]]) -> list[dict[str, Any]]:
        messages = []
        for call, result in answered:
            # the turn in the id too: an agent may reuse its call ids in every turn, and an
            # agent that skips messages it has seen (LangGraph) would drop the next result
            message = {"id": f"{self._turn_id}-{call.call_id}-result", "role": "tool",
                       "toolCallId": call.call_id, "content": result_text(result)}
            if is_error_result(result):
                error = result["error"]
                message["error"] = f"{error.get('code')}: {error.get('message')}"
            messages.append(message)
        return messages

    def has_calls(self, message: dict[str, Any]) -> bool:
        return message.get("role") == "assistant" and bool(message.get("toolCalls"))

    # --- one run -------------------------------------------------------------------------

    async def answer(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                     say: Say) -> ModelAnswer:
        self._runs += 1
        payload = {"threadId": self._thread_id, "runId": uuid.uuid4().hex, "messages": messages,
                   "tools": tools, "context": [], "state": {}, "forwardedProps": {}}
        body = await off_loop_when(is_large(messages), _encode, payload)
        timeout = httpx.Timeout(self.settings.request_timeout, connect=CONNECT_SECONDS)
        # identity: the stream's bounds count the bytes that are parsed, and a compressed
        # stream would be inflated a chunk at a time, however much a chunk inflates to
        headers = [*self._headers, ("Content-Type", "application/json"),
                   ("Accept", "text/event-stream"), ("Accept-Encoding", "identity")]
        run = _Run()
        loop = asyncio.get_running_loop()
        wait = self.settings.request_timeout
        # every wait has a deadline, whatever the bytes trickle: the answer's head within
        # the connection's and the event timeout, an error's body within the event timeout,
        # then each event within it of the last, and all of them within the run limit
        run_end = float("inf")
        try:
            async with asyncio.timeout_at(loop.time() + CONNECT_SECONDS + wait) as deadline, \
                    httpx.AsyncClient(timeout=timeout, follow_redirects=False,
                                      verify=_tls()) as client, \
                    client.stream("POST", self.base_url, content=body, headers=headers
                                  ) as response:
                run_end = loop.time() + self._run_limit
                deadline.reschedule(min(loop.time() + wait, run_end))
                await self._check_response(response)
                async with contextlib.aclosing(self._counted(response.aiter_raw())) as chunks, \
                        contextlib.aclosing(sse_events(chunks, self.model)) as events:
                    while run.outcome is None:
                        # a gap between events, not between bytes: a trickle is no answer
                        deadline.reschedule(min(loop.time() + wait, run_end))
                        data = await anext(events, None)
                        deadline.reschedule(None)
                        if data is None:
                            raise AgUiError(f"the AG-UI agent at {self.model}: its stream "
                                            "ended before RUN_FINISHED")
                        await self._apply(run, await self._parse(data), say)
        except TimeoutError:
            if loop.time() < run_end:
                raise  # (an event's wait: failure says so)
            raise AgUiError(f"the AG-UI agent at {self.model} did not finish its run within "
                            f"{self._run_limit:g} s (the limit is --max-total-factor times "
                            "--tool-timeout)") from None
        if run.outcome != "success":
            raise AgUiError(f"the AG-UI agent at {self.model} ended the run with the outcome "
                            f"{run.outcome}" + (" (an interrupt, which Core does not answer)"
                                                if run.outcome == "interrupt" else ""))
        fallback_id = f"{self._turn_id}-{self._runs}"
        if sum(len(piece) for call in run.calls.values() for piece in call.args) > LARGE_CHARS:
            return await off_loop(_answer, run, fallback_id)  # its args parsed, encoded
        return _answer(run, fallback_id)

    async def _counted(self, chunks: AsyncIterator[bytes]) -> AsyncGenerator[bytes, None]:
        """``chunks``, counted against the turn's :data:`MAX_TURN_STREAM_BYTES`."""
        async for chunk in chunks:
            self._received += len(chunk)
            if self._received > MAX_TURN_STREAM_BYTES:
                raise AgUiError(f"the AG-UI agent at {self.model} sent over "
                                f"{MAX_TURN_STREAM_BYTES} bytes in one turn's runs")
            yield chunk

    async def _check_response(self, response: httpx.Response) -> None:
        if response.status_code // 100 != 2:
            body = bytearray()
            async for chunk in response.aiter_raw():
                body += chunk
                if len(body) >= MAX_ERROR_BODY:
                    break
            said = excerpt(bytes(body[:MAX_ERROR_BODY]).decode("utf-8", "replace").strip())
            raise AgUiError(f"the AG-UI agent at {self.model} answered HTTP "
                            f"{response.status_code}" + (f": {said}" if said else ""))
        kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind != "text/event-stream":
            raise AgUiError(f"the AG-UI agent at {self.model} answered {kind or 'no type'}"
                            ", not text/event-stream: is the URL its AG-UI endpoint?")
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding != "identity":
            raise AgUiError(f"the AG-UI agent at {self.model} sent its stream encoded "
                            f"({excerpt(encoding)}), though asked for identity")

    async def _parse(self, data: bytes) -> Any:
        """The event in ``data``, validated; None for one over Core's bounds whose type is
        one Core has no use for (:func:`_over_bounds`)."""
        try:
            if len(data) <= LARGE_CHARS:
                return _EVENT.validate_json(data)
            over = await _over_bounds(data)
            if over is None:
                return await off_loop(_EVENT.validate_json, data)
            kind = _leading_type(data)
            if kind in _SKIPPED_TYPES:
                return None
            what = f"a {excerpt(kind)} event" if kind else "an event"
            raise AgUiError(
                f"the AG-UI agent at {self.model} sent {what} of {over}: Core validates no "
                "larger event, and skips one only if it leads with a type Core has no use for")
        except ValidationError as exc:
            errors = exc.errors(include_url=False, include_input=False)
            where = ".".join(str(part) for part in errors[0]["loc"]) if errors else ""
            said = errors[0]["msg"] if errors else str(exc)
            problem = f"{where}: {said}" if where else said
            raise AgUiError(
                f"the AG-UI agent at {self.model} sent an event that is not an AG-UI event "
                f"({excerpt(str(problem))}): {excerpt(data.decode('utf-8', 'replace'))}"
            ) from None

    async def _apply(self, run: _Run, event: Any, say: Say) -> None:
        """One event's effect on the run (events Core has no use for are skipped: state,
        steps, reasoning, activity, snapshots, custom and raw events)."""
        if isinstance(event, TextMessageContentEvent | TextMessageChunkEvent):
            if event.delta:
                run.text_id = run.text_id or event.message_id
                run.text.append(event.delta)
                await say(event.delta)
        elif isinstance(event, ToolCallStartEvent):
            self._check_calls(run, event.tool_call_id)
            run.calls[event.tool_call_id] = _Call(event.tool_call_id, event.tool_call_name,
                                                  event.parent_message_id)
            run.latest = event.tool_call_id
        elif isinstance(event, ToolCallChunkEvent):
            call_id = event.tool_call_id or run.latest
            if call_id is None:
                raise AgUiError(f"the AG-UI agent at {self.model} sent a TOOL_CALL_CHUNK "
                                "with no toolCallId before any call")
            if call_id not in run.calls:
                self._check_calls(run, call_id)
                run.calls[call_id] = _Call(call_id, event.tool_call_name or "",
                                           event.parent_message_id)
            run.latest = call_id
            if event.delta:
                run.calls[call_id].args.append(event.delta)
        elif isinstance(event, ToolCallArgsEvent):
            self._started(run, event.tool_call_id).args.append(event.delta)
        elif isinstance(event, ToolCallResultEvent):
            # a result for a call of an earlier run (the page's, echoed back) is no news
            call = run.calls.get(event.tool_call_id)
            if call is not None:
                call.result = {
                    "id": event.message_id, "role": "tool", "toolCallId": event.tool_call_id,
                    "content": event.model_dump(mode="json", by_alias=True)["content"]}
        elif isinstance(event, RunErrorEvent):
            code = f" ({excerpt(event.code)})" if event.code else ""
            raise AgUiError(f"the AG-UI agent at {self.model} reported RUN_ERROR{code}: "
                            f"{excerpt(event.message)}")
        elif isinstance(event, RunFinishedEvent):
            outcome = event.outcome
            run.outcome = ("interrupt" if isinstance(outcome, RunFinishedInterruptOutcome)
                           else "cancelled" if isinstance(outcome, RunFinishedCancelledOutcome)
                           else "success")

    def _check_calls(self, run: _Run, call_id: str) -> None:
        """Refuse a new call past :data:`MAX_CALLS` in the run."""
        if call_id not in run.calls and len(run.calls) >= MAX_CALLS:
            raise AgUiError(f"the AG-UI agent at {self.model} asked for over {MAX_CALLS} "
                            "tool calls in one run")

    def _started(self, run: _Run, call_id: str) -> _Call:
        call = run.calls.get(call_id)
        if call is None:
            raise AgUiError(f"the AG-UI agent at {self.model} sent TOOL_CALL_ARGS for the "
                            f"call {excerpt(call_id)!r}, which it had not started")
        return call

    # --- failures ------------------------------------------------------------------------

    def answer_limit(self) -> float | None:
        return None  # a run is bounded by its own limit (run_limit), and says so

    def failure(self, exc: Exception) -> Failure | None:
        where = f"the AG-UI agent at {self.model}"
        if isinstance(exc, AgUiError):
            return Failure(str(exc), retryable=False)
        if isinstance(exc, httpx.ConnectTimeout):
            return Failure(f"{where} did not accept the connection within "
                           f"{CONNECT_SECONDS:g} s", retryable=False)
        if isinstance(exc, TimeoutError | httpx.TimeoutException):
            return Failure(f"{where} sent no event for {self.settings.request_timeout:g} s "
                           "(the limit is --tool-timeout)", retryable=False)
        if isinstance(exc, httpx.ConnectError):
            return Failure(f"cannot reach {where}: {excerpt(str(exc))}", retryable=False)
        if isinstance(exc, httpx.HTTPError):
            return Failure(f"{where}: its stream broke before RUN_FINISHED "
                           f"({type(exc).__name__}: {excerpt(str(exc))})", retryable=False)
        return None


def _encode(payload: dict[str, Any]) -> bytes:
    """The run's input, checked and encoded by the protocol's own types."""
    return RunAgentInput.model_validate(payload).model_dump_json(by_alias=True).encode()


def _answer(run: _Run, fallback_id: str) -> ModelAnswer:
    """The run as history messages: the agent's own calls with their results, then the
    assistant message with its text and the calls for the page. Messages keep the ids
    the agent gave them (an agent that keeps the thread's messages itself, as LangGraph
    does, adds a message whose id it has not seen: a new id would be a second copy); ids
    Core makes are derived from the turn, the same when a turn is run again after a
    restart."""
    own = [call for call in run.calls.values() if call.result is not None]
    page = [call for call in run.calls.values() if call.result is None]
    message_id = (page[0].parent if page else None) or run.text_id or fallback_id
    before: list[dict[str, Any]] = []
    if own:
        own_id = own[0].parent or f"{fallback_id}-own"
        before.append({"id": own_id if own_id != message_id else f"{own_id}-own",
                       "role": "assistant", "toolCalls": _tool_calls(_model_calls(own))})
        before.extend(call.result for call in own if call.result is not None)
    calls = _model_calls(page)
    text = "".join(run.text)
    message: dict[str, Any] | None = None
    if text or calls:
        message = {"id": message_id, "role": "assistant"}
        if text:
            message["content"] = text
        if calls:
            message["toolCalls"] = _tool_calls(calls)
    return ModelAnswer(calls, message, before=before)


def _model_calls(calls: list[_Call]) -> list[ModelCall]:
    return [ModelCall(call.call_id, call.name, "".join(call.args)) for call in calls]


def _tool_calls(calls: list[ModelCall]) -> list[dict[str, Any]]:
    """The calls as the history keeps them: their arguments read here (in a worker
    thread when long, as :func:`_answer` is), once: the agent's requests take that."""
    return [{"id": call.call_id, "type": "function", "function": {
        "name": call.name, "arguments": call.read.kept_text}} for call in calls]


async def sse_events(chunks: AsyncIterator[bytes], where: str) -> AsyncGenerator[bytes, None]:
    """The ``data`` of each server-sent event in ``chunks``, bounded: the stream in all
    by :data:`MAX_STREAM_BYTES`, one event (and so one line) by :data:`MAX_EVENT_BYTES`.
    A line ends with CR LF, LF or CR alone (the SSE rule). Every byte is looked at a
    bounded number of times: a line is searched for from where the last search stopped,
    and the buffer is compacted only when more is read. A read of many lines is parsed in
    slices of :data:`SLICE_LINES` lines or :data:`SLICE_BYTES` of events, each in a turn of
    the event loop of its own."""
    buffer = bytearray()
    start = 0  # where the current line begins in the buffer
    searched = 0  # up to where the buffer holds no line break past ``start``
    total = 0
    data = bytearray()  # the event's data lines, each ended by a line break
    ended = False  # the stream has ended: what is in the buffer is all
    lines = 0  # lines read since the last turn of the loop
    taken = 0  # bytes of events given since the last turn of the loop
    while True:
        found = _LINE_END.search(buffer, max(start, searched))
        if found is not None and found[0] == b"\r" and found.end() == len(buffer) and not ended:
            found = None  # a LF may come next: one line end, CR LF
        if found is None:
            if ended:
                return  # an event not ended by a blank line is dropped (the SSE rule)
            if len(buffer) - start > MAX_EVENT_BYTES:
                raise AgUiError(f"the AG-UI agent at {where} sent a line over "
                                f"{MAX_EVENT_BYTES} bytes")
            del buffer[:start]
            # no line ends in it, but a CR last may end one with what comes next
            start, searched = 0, max(len(buffer) - 1, 0)
            chunk = await anext(chunks, None)
            if chunk is None:
                ended = True  # (a CR last still ends its line)
                continue
            total += len(chunk)
            if total > MAX_STREAM_BYTES:
                raise AgUiError(f"the AG-UI agent at {where} sent over {MAX_STREAM_BYTES} "
                                "bytes in one run")
            buffer += chunk
            continue
        lines += 1
        if lines >= SLICE_LINES or taken >= SLICE_BYTES:
            lines = taken = 0
            await asyncio.sleep(0)  # (the buffer is not touched while others run)
        end = found.start()
        line = bytes(buffer[start:end])
        start = searched = end + (2 if buffer[end:end + 2] == b"\r\n" else 1)
        if not line:
            if data:
                del data[-1]  # the last line's break
                event = bytes(data)
                data.clear()
                _check_utf8(event, where)
                taken += len(event)
                yield event
            continue
        name, _, value = line.partition(b":")
        if name == b"data":
            # one buffer, not a list of lines: a million tiny lines are no million objects
            data += value[1:] if value.startswith(b" ") else value
            data += b"\n"
            if len(data) > MAX_EVENT_BYTES:
                raise AgUiError(f"the AG-UI agent at {where} sent an event over "
                                f"{MAX_EVENT_BYTES} bytes")
        # other fields (event, id, retry) and comments (``:``) carry nothing AG-UI uses


async def _over_bounds(data: bytes) -> str | None:
    """Which of :data:`MAX_VALIDATED_EVENT_BYTES` and :data:`MAX_EVENT_VALUES` the event
    is over, or None. Its values are counted where a count at C speed (brackets and commas
    in strings too) cannot vouch for it."""
    if len(data) > MAX_VALIDATED_EVENT_BYTES:
        return f"over {MAX_VALIDATED_EVENT_BYTES} bytes"
    if (_value_marks(data) > MAX_EVENT_VALUES
            and await off_loop(_values, data) > MAX_EVENT_VALUES):
        return f"over {MAX_EVENT_VALUES} JSON values (arrays, objects and their items)"
    return None


def _value_marks(data: bytes) -> int:
    """The JSON text's arrays and objects and the commas between their items, counted
    with those in its strings (at C speed: at least :func:`_values`)."""
    return data.count(b"[") + data.count(b"{") + data.count(b",")


def _values(data: bytes) -> int:
    """About how many JSON values ``data`` holds: :func:`_value_marks` outside strings."""
    return _value_marks(outside_strings(data.decode("utf-8")).encode("utf-8"))


def _leading_type(data: bytes) -> str | None:
    """The event's ``type``, if it is among its first :data:`TYPE_PREFIX_BYTES`: read from
    them alone, whatever follows."""
    head = data[:TYPE_PREFIX_BYTES].decode("utf-8", "ignore")  # (a character cut short)
    try:
        event = from_json(head, allow_partial=True)
    except ValueError:
        return None
    kind = event.get("type") if isinstance(event, dict) else None
    return kind if isinstance(kind, str) else None


def _check_utf8(data: bytes, where: str) -> None:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise AgUiError(f"the AG-UI agent at {where} sent an event that is not UTF-8 text "
                        f"(byte {exc.start + 1} of it)") from None
