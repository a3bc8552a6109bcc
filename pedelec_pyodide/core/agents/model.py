"""What the model adapters share: the turn loop, tool-call checks, retries, history, usage.

A :class:`ModelAgent` subclass speaks one provider's API through its official SDK
(``openai_agent.py``, ``anthropic_agent.py``; ``ag_ui_agent.py`` speaks AG-UI, one run per
model answer); this module runs the turn:

1. ask the model (streamed: text goes to ``turn.say`` as it arrives), with the page's tools;
2. if it asked for tools, run that step's calls as one ``turn.call_tools`` batch — a call
   with malformed JSON arguments or of a tool the session does not have is answered here
   with an error result instead — and feed every result back, then go to 1;
3. when it answers without tool calls, the turn is over.

A step is one model answer that calls tools; past ``turn.max_steps`` of them the turn
fails with :class:`StepLimitExceeded`. Provider failures raise :class:`ModelError` (the
turn fails with its message); 429, 5xx and connection errors are first retried within
``ModelSettings.max_attempts`` and ``retry_budget``. The SDKs' own retries are off.
"""

from __future__ import annotations

import json
import os
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any, ClassVar, TypeVar
from urllib.parse import urlsplit

from ... import strictjson
from ...errors import PedelecError
from ...protocol import MAX_FRAME_BYTES
from ...results import INVALID_ARGS, TOOL_HANDLER_NOT_FOUND, tool_error
from ...text import excerpt, lone_surrogate_at, not_unicode, quote
from ..clock import Clock, SystemClock, wait_for
from ..log import log_event
from ..offload import LARGE_CHARS, off_loop
from .contract import AgentInfo, StepLimitExceeded, ToolCallRequest, Turn

# --- settings ----------------------------------------------------------------------------

#: characters of a call's arguments Core reads: a tool call carries at most a page's frame
#: (json holds the GIL while it decodes, even in a worker thread: 16 MB of a model's
#: arguments held every other session for seconds and took ~1 GB)
MAX_ARGUMENTS_CHARS = MAX_FRAME_BYTES
#: tool calls in one model answer: each becomes a request, a result and two history
#: messages (an answer of 20,000 calls held Core's event loop for seconds)
MAX_CALLS = 128
#: characters of one model answer Core takes as it streams in (its text, and its calls'
#: ids, names and arguments); past them the turn fails
MAX_ANSWER_CHARS = 16 * 1024 * 1024
#: an answer streams for at most this many times ``request_timeout`` in all (that is
#: the wait for each chunk: a model trickling chunks would keep its turn forever)
ANSWER_TIMEOUTS = 10
TIMEOUT_ENV = "PEDELEC_MODEL_TIMEOUT"
ATTEMPTS_ENV = "PEDELEC_MODEL_ATTEMPTS"
RETRY_BUDGET_ENV = "PEDELEC_MODEL_RETRY_BUDGET"
HISTORY_ENV = "PEDELEC_HISTORY_MESSAGES"
MAX_TOKENS_ENV = "PEDELEC_MAX_TOKENS"


@dataclass(frozen=True)
class ModelSettings:
    """The limits of a model adapter. ``from_env`` reads them from ``PEDELEC_*`` variables."""

    #: seconds one request may take to answer (and between two streamed chunks)
    request_timeout: float = 60.0
    #: requests made for one model answer, first one included (429, 5xx, connection errors)
    max_attempts: int = 3
    #: seconds of waiting between attempts, in all, for one model answer
    retry_budget: float = 20.0
    #: messages of earlier turns kept per session (whole turns are dropped, oldest first)
    history_messages: int = 40
    #: the answer's length limit (Anthropic requires one; OpenAI is sent none)
    max_tokens: int = 4096

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ModelSettings:
        env = os.environ if environ is None else environ
        return cls(
            request_timeout=_positive(env, TIMEOUT_ENV, float, cls.request_timeout),
            max_attempts=_positive(env, ATTEMPTS_ENV, int, cls.max_attempts),
            retry_budget=_positive(env, RETRY_BUDGET_ENV, float, cls.retry_budget),
            history_messages=_positive(env, HISTORY_ENV, int, cls.history_messages),
            max_tokens=_positive(env, MAX_TOKENS_ENV, int, cls.max_tokens),
        )


_Number = TypeVar("_Number", int, float)


def _positive(env: Mapping[str, str], name: str, kind: type[_Number], default: _Number
              ) -> _Number:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = kind(raw)
    except ValueError:
        value = kind(0)
    if not value > 0 or value != value or value == float("inf"):
        raise ValueError(f"{name}={raw!r}: expected a positive {kind.__name__}")
    return value


# --- failures ----------------------------------------------------------------------------


class AgentUnavailable(PedelecError, ValueError):
    """The spec is well-formed, but this build cannot run that agent (no API key)."""


class ModelError(PedelecError):
    """The provider could not give an answer; the message says why (never an API key)."""


@dataclass(frozen=True)
class Failure:
    """A provider failure as the retry loop sees it."""

    message: str
    retryable: bool
    retry_after: float | None = None  # seconds the server asked us to wait


def scrub(text: str, secrets: list[str]) -> str:
    """``text`` with every secret replaced by ``***``."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


def retry_after(headers: Mapping[str, str], now: float) -> float | None:
    """Seconds from ``retry-after-ms`` or ``retry-after`` (seconds, or an HTTP date: from
    ``now``, wall-clock seconds)."""
    raw_ms = headers.get("retry-after-ms")
    if raw_ms is not None:
        try:
            return max(float(raw_ms), 0.0) / 1000.0
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if raw is None:
        return None
    try:
        return max(float(raw), 0.0)
    except ValueError:
        pass
    try:
        return max(parsedate_to_datetime(raw).timestamp() - now, 0.0)
    except (TypeError, ValueError):
        return None


def api_message(body: object) -> str | None:
    """The human message of an API error body: ``{"error": {"message"}}`` or
    ``{"message"}``."""
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            return str(inner["message"])
    return None


def status_failure(provider: str, key_env: str, status: int, body: object,
                   headers: Mapping[str, str], now: float) -> Failure:
    """What an HTTP error status from the provider means for the turn (``now``: wall-clock
    seconds, for a ``retry-after`` date)."""
    said = api_message(body)
    detail = f": {said}" if said else ""
    if status == 401:
        return Failure(f"authentication failed for {provider} (HTTP 401): check {key_env}"
                       f"{detail}", retryable=False)
    if status == 403:
        return Failure(f"{provider} refused access (HTTP 403){detail}", retryable=False)
    if status == 429:
        return Failure(f"{provider} is rate limiting requests (HTTP 429){detail}",
                       retryable=True, retry_after=retry_after(headers, now))
    if status < 400:  # an error event in a stream that had started well
        return Failure(f"{provider} reported an error in its answer{detail}", retryable=True)
    if status >= 500:
        return Failure(f"{provider} failed (HTTP {status}){detail}", retryable=True,
                       retry_after=retry_after(headers, now))
    return Failure(f"{provider} refused the request (HTTP {status}){detail}", retryable=False)


def public_url(url: str) -> str:
    """``url`` without credentials, for messages."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:  # an IPv6 address keeps its brackets
        host = f"[{host}]"
    port = f":{parts.port}" if parts.port else ""
    origin = f"{parts.scheme}://{host}{port}" if parts.scheme or host else ""
    return origin + parts.path


# --- one model answer ----------------------------------------------------------------------


@dataclass
class Usage:
    """Tokens a turn used, summed over its requests."""

    input_tokens: int = 0
    output_tokens: int = 0
    requests: int = 0

    def add(self, other: Usage) -> None:
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.requests += other.requests

    def as_dict(self) -> dict[str, int]:
        return {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                "requests": self.requests}


@dataclass(frozen=True)
class ModelCall:
    """A tool call as the model wrote it."""

    call_id: str
    name: str
    arguments: str  # the JSON text as streamed; read (and checked) once: :attr:`read`

    @property
    def read(self) -> Arguments:
        """The arguments read, once, whoever asks first: the adapter for the history's
        message, the agent for the request (:func:`read_calls` reads long ones off the
        event loop). Kept without a lock: ``functools.cached_property`` holds one lock
        for every instance while it computes (Python 3.11), so a call read on the event
        loop waited for another session's long one read in a worker thread."""
        reading: Arguments | None = self.__dict__.get("_reading")
        if reading is None:
            reading = read_arguments(self.arguments)
            object.__setattr__(self, "_reading", reading)
        return reading

    @property
    def is_read(self) -> bool:
        return "_reading" in self.__dict__

    def forget_reading(self) -> None:
        """Drop :attr:`read` (read again if asked): its decoded value is the request's now."""
        self.__dict__.pop("_reading", None)


@dataclass(frozen=True)
class Arguments:
    """A call's arguments as read: the object, or why the agent answers ``INVALID_ARGS``."""

    value: dict[str, Any] | None  # None: not one JSON object no page would refuse
    fault: str | None  # then what is wrong, as the error result words it
    retryable: bool  # (worth the model's trying again: not when they were too long)
    #: what the history keeps: ``value``, or ``{}`` when there is none or it is not valid
    #: Unicode text (the error result tells the model what it sent), so that a request
    #: built from the history is always valid; and as JSON text, for the providers that
    #: keep it as text
    kept: dict[str, Any]
    kept_text: str


@dataclass
class ModelAnswer:
    """One streamed answer: its calls, the assistant message for the history, its usage."""

    calls: list[ModelCall]
    message: dict[str, Any] | None  # None: the answer was empty
    usage: Usage = field(default_factory=Usage)
    #: messages for the history that come before ``message``: the calls an AG-UI agent
    #: made of its own tools in the answer, with their results
    before: list[dict[str, Any]] = field(default_factory=list)


Say = Callable[[str], Awaitable[None]]


@dataclass
class CallParts:
    """One tool call of an answer as its stream says it, piece by piece."""

    call_id: str = ""
    name: list[str] = field(default_factory=list)
    arguments: list[str] = field(default_factory=list)

    def call(self, fallback_id: str) -> ModelCall:
        return ModelCall(self.call_id or fallback_id, "".join(self.name),
                         "".join(self.arguments))


class AnswerParts:
    """What a model's stream says, taken within Core's bounds on one answer:
    :data:`MAX_ANSWER_CHARS` of it in all and :data:`MAX_CALLS` calls, else
    :class:`ModelError`. Pieces are kept in lists, joined once at the end (added to a
    ``str`` held in a dict, each piece copied all that came before it)."""

    def __init__(self, provider: str) -> None:
        self._provider = provider
        self._chars = 0
        self.calls: dict[int, CallParts] = {}  # by the stream's index of each

    def took(self, piece: str) -> str:
        """``piece`` of the answer, counted."""
        self._chars += len(piece)
        if self._chars > MAX_ANSWER_CHARS:
            raise ModelError(f"{self._provider}'s answer went over {MAX_ANSWER_CHARS} "
                             "characters (its text and tool calls); Core read no more of it")
        return piece

    def call(self, index: int) -> CallParts:
        """The call at ``index`` of the stream, begun there already or new."""
        parts = self.calls.get(index)
        return self.begin(index) if parts is None else parts

    def begin(self, index: int) -> CallParts:
        """A new call at ``index`` of the stream (in place of one begun there before)."""
        if index not in self.calls and len(self.calls) >= MAX_CALLS:
            raise ModelError(f"{self._provider} asked for over {MAX_CALLS} tool calls in "
                             "one answer")
        parts = self.calls[index] = CallParts()
        return parts


def parse_arguments(call: ModelCall, known: set[str]) -> dict[str, Any] | ToolCallRequest:
    """The request for ``call``, or the error result that answers it without the page."""
    if call.name not in known:
        listed = ", ".join(sorted(known)) if known else "none"
        return tool_error(
            TOOL_HANDLER_NOT_FOUND,
            f"there is no tool named {quote(call.name)} in this session; the tools are: {listed}",
            retryable=False,
        )
    read = call.read
    if read.value is None:
        return tool_error(INVALID_ARGS, f"the arguments for {call.name} {read.fault}",
                          retryable=read.retryable)
    return ToolCallRequest(call.name, read.value, call.call_id)


def read_arguments(arguments: str) -> Arguments:
    """A call's arguments read from their JSON text: decoded once by the strict decoder,
    unread when over :data:`MAX_ARGUMENTS_CHARS`."""
    if len(arguments) > MAX_ARGUMENTS_CHARS:
        return _faulty(f"are over {MAX_ARGUMENTS_CHARS} characters, more than a tool call "
                       "can carry; they were not read", retryable=False)
    raw = arguments.strip() or "{}"
    try:
        value = strictjson.decode(raw)
    except (ValueError, RecursionError) as exc:
        where = (f" ({exc.msg} at character {exc.pos + 1})"
                 if isinstance(exc, json.JSONDecodeError)
                 else f" ({excerpt(str(exc))})" if isinstance(exc, ValueError) else "")
        return _faulty(f"are not valid JSON{where}: {excerpt(raw)}; call the tool again "
                       "with one JSON object", retryable=True)
    if not isinstance(value, dict):
        return _faulty(f"must be a JSON object, got {type(value).__name__}", retryable=True)
    if lone_surrogate_at(value) is not None:  # refused by the turn, which says where
        return Arguments(value, None, True, {}, "{}")
    return Arguments(value, None, True, value, result_text(value))


def _faulty(fault: str, *, retryable: bool) -> Arguments:
    return Arguments(None, fault, retryable, {}, "{}")


async def read_calls(calls: list[ModelCall]) -> None:
    """Each call's arguments read (:attr:`ModelCall.read`), in a worker thread when they
    are long: json holds the GIL while it decodes, but the event loop waits for one
    reading of them, not the adapter's and then the agent's."""
    unread = [call for call in calls if not call.is_read]
    if sum(len(call.arguments) for call in unread) > LARGE_CHARS:
        await off_loop(_read_each, unread)
    else:
        _read_each(unread)


def _read_each(calls: list[ModelCall]) -> None:
    for call in calls:
        call.read  # noqa: B018 (read once, kept by the call)


class _Reply:
    """The reply text, streamed: answers of successive steps are joined by a blank line."""

    def __init__(self, turn: Turn) -> None:
        self._turn = turn
        self._parts: list[str] = []
        self._new_answer = False
        self.said_in_answer = False

    def start_answer(self) -> None:
        self._new_answer = bool(self._parts)
        self.said_in_answer = False

    async def say(self, text: str) -> None:
        if not text:
            return
        if self._new_answer:
            text = "\n\n" + text
            self._new_answer = False
        self.said_in_answer = True
        self._parts.append(text)
        await self._turn.say(text)

    @property
    def text(self) -> str:
        return "".join(self._parts)


# --- history -------------------------------------------------------------------------------


def capped(entries: list[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    """The newest whole turns of ``entries`` holding at most ``limit`` messages (always the
    newest turn), so a tool call is never separated from its result."""
    by_turn: list[list[dict[str, Any]]] = []
    for entry in entries:
        if not by_turn or by_turn[-1][0].get("turn") != entry.get("turn"):
            by_turn.append([])
        by_turn[-1].append(entry)
    kept: list[dict[str, Any]] = []
    for group in reversed(by_turn):
        if kept and len(kept) + len(group) > limit:
            break
        kept[:0] = group
    return kept


# --- the agent -----------------------------------------------------------------------------


class ModelAgent(ABC):
    """The turn loop of a model adapter; subclasses speak the provider's API."""

    provider: ClassVar[str]
    key_env: ClassVar[str]

    def __init__(self, model: str, settings: ModelSettings, api_key: str, base_url: str,
                 clock: Clock | None = None) -> None:
        self.model = model
        #: Core's clock: the waits between retries, and how long each request took
        self.clock = clock or SystemClock()
        self.settings = settings
        self._api_key = api_key
        self.base_url = base_url
        self.info = AgentInfo(name=self.provider, details={"model": model,
                                                           "base_url": public_url(base_url)})

    # --- what a provider implements --------------------------------------------------------

    @abstractmethod
    def tool_definitions(self, tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The session's tool metadata in the provider's tool format."""

    @abstractmethod
    def user_message(self, text: str) -> dict[str, Any]:
        """The user's text as a message."""

    @abstractmethod
    def result_messages(self, answered: list[tuple[ModelCall, Any]]) -> list[dict[str, Any]]:
        """The results of one step's calls, as the provider expects them back."""

    @abstractmethod
    def has_calls(self, message: dict[str, Any]) -> bool:
        """Whether an assistant message of the history asks for tool calls."""

    def request_messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The messages as sent (a provider may merge or adjust them)."""
        return messages

    def secrets(self) -> list[str]:
        """What a failure's message must never show."""
        return [self._api_key]

    @abstractmethod
    async def answer(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                     say: Say) -> ModelAnswer:
        """One request, streamed; SDK exceptions propagate to :meth:`failure`."""

    @abstractmethod
    def failure(self, exc: Exception) -> Failure | None:
        """What an SDK exception means, or None when it is not a provider failure."""

    def answer_limit(self) -> float | None:
        """Seconds one answer may stream in all: :data:`ANSWER_TIMEOUTS` times the wait
        for each chunk; None for an agent that bounds its answers itself."""
        return ANSWER_TIMEOUTS * self.settings.request_timeout

    async def _answer_within_limit(self, messages: list[dict[str, Any]],
                                   tools: list[dict[str, Any]], say: Say) -> ModelAnswer:
        limit = self.answer_limit()
        if limit is None:
            return await self.answer(messages, tools, say)
        try:
            return await wait_for(self.clock, self.answer(messages, tools, say), limit)
        except TimeoutError:
            raise ModelError(f"{self.provider} did not finish its answer within {limit:g} s "
                             f"({ANSWER_TIMEOUTS} times {TIMEOUT_ENV})") from None

    # --- the turn --------------------------------------------------------------------------

    async def run(self, turn: Turn) -> str:
        reply = _Reply(turn)
        past = self._past(turn.history)
        new: list[dict[str, Any]] = [self.user_message(turn.text)]
        tools = self.tool_definitions(turn.tools)
        known = {str(tool["name"]) for tool in turn.tools}
        usage = Usage()
        steps = 0
        answered = False
        try:
            while True:
                reply.start_answer()
                answer = await self._answer_with_retries(past + new, tools, reply, usage)
                answered = True
                new.extend(answer.before)
                if answer.message is not None:
                    new.append(answer.message)
                if not answer.calls:
                    return reply.text
                if steps >= turn.max_steps:
                    raise StepLimitExceeded(
                        f"the turn reached its limit of {turn.max_steps} tool-calling steps "
                        f"and {self.provider} still asked for "
                        + ", ".join(excerpt(call.name) for call in answer.calls))
                steps += 1
                new.extend(self.result_messages(await self._call(turn, answer.calls, known)))
        finally:
            if answered:
                self._remember(turn, new)
            self._report(turn, usage, steps)

    async def _call(self, turn: Turn, calls: list[ModelCall], known: set[str]
                    ) -> list[tuple[ModelCall, Any]]:
        await read_calls(calls)  # (an adapter has, for its message: kept)
        parsed = [parse_arguments(call, known) for call in calls]
        for call in calls:
            call.forget_reading()
        refusals = [None if isinstance(request, ToolCallRequest) else request
                    for request in parsed]
        requests = [request for request in parsed if isinstance(request, ToolCallRequest)]
        # While the page works the turn holds the calls' args as text; nothing here keeps
        # them decoded (a page's may take ~24 times the memory decoded): the step alone
        # holds the requests, and lets them go.
        step = turn.call_tools(requests) if requests else None
        del parsed, requests
        outcomes = iter([] if step is None else await step)
        answered: list[tuple[ModelCall, Any]] = []
        for call, refusal in zip(calls, refusals, strict=True):
            if refusal is None:
                answered.append((call, next(outcomes).result))
            else:
                log_event("agent.call_refused", provider=self.provider, turn=turn.turn_id,
                          tool=call.name, code=refusal["error"]["code"])
                answered.append((call, refusal))
        return answered

    async def _answer_with_retries(self, messages: list[dict[str, Any]],
                                   tools: list[dict[str, Any]], reply: _Reply, usage: Usage
                                   ) -> ModelAnswer:
        settings = self.settings
        waited = 0.0
        sent = self.request_messages(messages)
        attempt = 0
        while True:
            attempt += 1
            started = self.clock.monotonic()
            try:
                answer = await self._answer_within_limit(sent, tools, reply.say)
            except Exception as exc:
                failure = self.failure(exc)
                if failure is None:
                    raise
                message = scrub(failure.message, self.secrets())
                log_event("agent.request_failed", provider=self.provider, model=self.model,
                          attempt=attempt, error=message,
                          ms=(self.clock.monotonic() - started) * 1000)
                if not failure.retryable or reply.said_in_answer:
                    raise ModelError(message) from None
                if attempt >= settings.max_attempts:
                    raise ModelError(f"{message} (gave up after {attempt} attempts)") from None
                delay = failure.retry_after
                if delay is None:
                    delay = 0.5 * 2 ** (attempt - 1)
                if waited + delay > settings.retry_budget:
                    raise ModelError(
                        f"{message} (asked to wait {delay:g} s more, beyond the retry budget "
                        f"of {settings.retry_budget:g} s)") from None
                waited += delay
                await self.clock.sleep(delay)
                continue
            # names and ids, kept in the history
            where = lone_surrogate_at([*answer.before, answer.message])
            if where is not None:
                raise ModelError(f"{self.provider}'s answer holds {not_unicode(where)}")
            answer.usage.requests = 1
            usage.add(answer.usage)
            log_event("agent.request", provider=self.provider, model=self.model,
                      attempt=attempt, calls=len(answer.calls),
                      input=answer.usage.input_tokens, output=answer.usage.output_tokens,
                      ms=(self.clock.monotonic() - started) * 1000)
            return answer

    # --- history and usage -----------------------------------------------------------------

    def _past(self, history: list[dict[str, Any]]) -> list[dict[str, Any]]:
        mine = [entry for entry in history if entry.get("agent") == self.provider
                and isinstance(entry.get("message"), dict)]
        return [entry["message"] for entry in capped(mine, self.settings.history_messages)]

    def _remember(self, turn: Turn, new: list[dict[str, Any]]) -> None:
        """Keep this turn's messages up to the last complete one (an answer whose calls
        never ran is left out), then cap this provider's part of the history."""
        if new and self.has_calls(new[-1]):
            new = new[:-1]
        entries = [{"agent": self.provider, "turn": turn.turn_id, "message": message}
                   for message in new]
        mine = capped([entry for entry in turn.history if entry.get("agent") == self.provider]
                      + entries, self.settings.history_messages)
        kept = {id(entry) for entry in mine}
        turn.history[:] = [entry for entry in turn.history
                           if entry.get("agent") != self.provider or id(entry) in kept]
        turn.history.extend(entry for entry in entries if id(entry) in kept)

    def _report(self, turn: Turn, usage: Usage, steps: int) -> None:
        for key, value in usage.as_dict().items():
            turn.usage[key] = turn.usage.get(key, 0) + value
        log_event("agent.usage", provider=self.provider, model=self.model, turn=turn.turn_id,
                  steps=steps, requests=usage.requests, input=usage.input_tokens,
                  output=usage.output_tokens)


# --- shared by the providers -----------------------------------------------------------------


def tool_description(tool: dict[str, Any]) -> str:
    """The tool's description, led by its ``annotations.title`` when it has one."""
    description = str(tool["description"])
    annotations = tool.get("annotations")
    title = annotations.get("title") if isinstance(annotations, dict) else None
    if isinstance(title, str) and title.strip() and title.strip() not in description:
        return f"{title.strip()}: {description}"
    return description


def tool_schema(tool: dict[str, Any]) -> dict[str, Any]:
    """The tool's ``argsSchema`` as the providers accept it: an object schema (a schema
    with no ``type`` gets ``"type": "object"``; tools are always called with an object)."""
    schema = tool.get("argsSchema")
    if not isinstance(schema, dict):
        return {"type": "object"}
    return schema if "type" in schema else {"type": "object", **schema}


def result_text(result: Any) -> str:
    """A tool result as the model reads it: its JSON (an error result is
    ``{"error": {"code", "message", ...}}``)."""
    return json.dumps(result, ensure_ascii=False)


def sdk_failure(agent: ModelAgent, exc: Exception, *, status_error: type[Exception],
                timeout_error: type[Exception], connection_error: type[Exception],
                api_error: type[Exception]) -> Failure | None:
    """A failure from the exception classes both SDKs share by name: an HTTP error status
    (``status_code``, ``body``, ``response.headers``), a timeout, a connection error, any
    other API error (an error event in the stream, an answer the SDK cannot read)."""
    if isinstance(exc, status_error):
        status = int(getattr(exc, "status_code", 0))
        headers = getattr(getattr(exc, "response", None), "headers", {})
        return status_failure(agent.provider, agent.key_env, status,
                              getattr(exc, "body", None), headers, agent.clock.time())
    where = public_url(agent.base_url)
    if isinstance(exc, timeout_error):
        return Failure(
            f"{agent.provider} did not answer within {agent.settings.request_timeout:g} s "
            f"({where}; the limit is {TIMEOUT_ENV})", retryable=False)
    if isinstance(exc, connection_error):
        return Failure(f"cannot reach {agent.provider} at {where}: {exc}", retryable=True)
    if isinstance(exc, api_error):
        said = api_message(getattr(exc, "body", None)) or str(exc)
        return Failure(f"{agent.provider} failed: {said}", retryable=False)
    return None
