"""Wire protocol v1: build, parse and validate the JSON text frames between page and Core.

Pure Python, shared by the page runtime and Core. Every message is a JSON object with a
``type``; field names are camelCase on the wire and snake_case here. Each message type is
declared once, as a list of fields, and everything else is derived from that declaration
(by :mod:`pedelec_pyodide.declare`, which this protocol's kinds and errors plug into): the
parser, the encoder and the JSON Schema published in docs/reference/protocol.md.

Parsing never raises anything but :class:`ProtocolError`, whose ``code`` says what was
wrong with the frame; the receiver answers it with an ``error`` frame and carries on.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any, ClassVar, Literal, TypeAlias, get_args

from . import declare, strictjson
from .errors import PedelecError
from .metadata import check_metadata
from .text import lone_surrogate_in_json, not_unicode, quote

PROTOCOL_VERSION = 1
#: where Core serves the bridge (the page connects there; Core routes it)
BRIDGE_PATH = "/pedelec/v1/bridge"
#: Core's public answer to "may pages from my origin open a session?" (``{"allowed"}``)
ORIGIN_CHECK_PATH = "/pedelec/v1/origin-check"
MAX_FRAME_BYTES = 1024 * 1024
#: WebSocket close code: another connection resumed this session (a duplicated tab, a
#: second connect() in the page); the closed side must not take it back
CLOSE_SUPERSEDED = 4001
#: WebSocket close code: try again later, keeping the session (Core is full, or on a
#: cluster cannot reach its store): the page reconnects with backoff and resumes
CLOSE_TRY_AGAIN = 1013
MAX_DEPTH = 100
MAX_ID_LENGTH = 128

# The closed sets page and Core share, each spelled once: the tuples are derived, and the
# JS loader and its .d.ts are checked against them (tests/unit/test_protocol.py).
#: which handler tier answered a request (``tool.result``'s ``handledBy``)
HandledBy: TypeAlias = Literal["named", "inline", "fallback", "none"]
HANDLED_BY: tuple[HandledBy, ...] = get_args(HandledBy)
#: how a turn ended (``turn.end``'s ``status``)
TurnStatus: TypeAlias = Literal["completed", "failed", "cancelled"]
TURN_STATUSES: tuple[TurnStatus, ...] = get_args(TurnStatus)
#: a session's state: the page's ``SessionState``, Core's session, ``welcome``'s ``state``
SessionStateName: TypeAlias = Literal[
    "connecting", "idle", "running", "waiting_tool_result", "closed"]
SESSION_STATES: tuple[SessionStateName, ...] = get_args(SessionStateName)
#: what a request in flight is doing: the page's ``session.pending``, Core's
#: ``pendingToolRequests``
PendingStatus: TypeAlias = Literal["awaiting_approval", "running", "waiting_for_user"]
PENDING_STATUSES: tuple[PendingStatus, ...] = get_args(PendingStatus)


class ProtocolError(PedelecError):
    """A frame that breaks the protocol. ``code`` is stable; ``message`` is for people."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


# Error codes carried by `error` frames. Parsing problems first, then session-level ones.
FRAME_TOO_LARGE = "FRAME_TOO_LARGE"
FRAME_NOT_JSON = "FRAME_NOT_JSON"
FRAME_NOT_OBJECT = "FRAME_NOT_OBJECT"
FRAME_TOO_DEEP = "FRAME_TOO_DEEP"
MISSING_TYPE = "MISSING_TYPE"
UNKNOWN_TYPE = "UNKNOWN_TYPE"
WRONG_DIRECTION = "WRONG_DIRECTION"
MISSING_FIELD = "MISSING_FIELD"
INVALID_FIELD = "INVALID_FIELD"
INVALID_TOOL = "INVALID_TOOL"
UNSUPPORTED_PROTOCOL = "UNSUPPORTED_PROTOCOL"
# Session-level codes (core/sessions/codes.py has the rest) the page reads too: Core's
# refusal of a frame about a request it has given up on
UNKNOWN_TOOL_REQUEST = "UNKNOWN_TOOL_REQUEST"
LATE_RESULT = "LATE_RESULT"


# --- field declarations -------------------------------------------------------------------

_Kind = Literal["id", "str", "bool", "int", "number", "object", "array", "any", "tools"]


@dataclass(frozen=True)
class _Field(declare.Field):
    kind: _Kind
    choices: tuple[Any, ...] | None = None
    nullable: bool = False


def _f(wire: str, attr: str, kind: _Kind, **options: Any) -> _Field:
    return _Field(wire, attr, kind, **options)


# --- messages -----------------------------------------------------------------------------


class Message(declare.Declared):
    """Base of every wire message. Subclasses declare ``type``, ``direction`` and ``fields``."""

    direction: ClassVar[Literal["client", "server"]]
    fields: ClassVar[tuple[_Field, ...]]

    def encode(self) -> str:
        """The frame's JSON text; :class:`ProtocolError` ``FRAME_NOT_JSON`` if a value in
        it has none (NaN, an infinity): the other side would refuse the frame."""
        try:
            return strictjson.encode(self.to_wire())
        except ValueError as exc:
            raise ProtocolError(FRAME_NOT_JSON, f"frame is not JSON: {exc}") from None


# Browser -> Core


@dataclass(frozen=True, slots=True)
class Hello(Message):
    protocol: int
    tools: list[dict[str, Any]]
    client: dict[str, Any] | None = None
    session_id: str | None = None
    resume_token: str | None = None

    type: ClassVar[str] = "hello"
    direction: ClassVar[Literal["client", "server"]] = "client"
    description: ClassVar[str] = (
        "First frame of a connection: opens a session, or resumes one by id and token."
    )
    fields: ClassVar[tuple[_Field, ...]] = (
        _f("protocol", "protocol", "int", choices=(PROTOCOL_VERSION,)),
        _f("tools", "tools", "tools"),
        _f("client", "client", "object", required=False),
        _f("sessionId", "session_id", "id", required=False),
        _f("resumeToken", "resume_token", "id", required=False),
    )


@dataclass(frozen=True, slots=True)
class ToolsUpdate(Message):
    tools: list[dict[str, Any]]

    type: ClassVar[str] = "tools.update"
    direction: ClassVar[Literal["client", "server"]] = "client"
    description: ClassVar[str] = "Replaces the session's tool metadata."
    fields: ClassVar[tuple[_Field, ...]] = (_f("tools", "tools", "tools"),)


@dataclass(frozen=True, slots=True)
class TurnStart(Message):
    turn_id: str
    text: str

    type: ClassVar[str] = "turn.start"
    direction: ClassVar[Literal["client", "server"]] = "client"
    description: ClassVar[str] = "Starts a turn of the agent with the user's text."
    fields: ClassVar[tuple[_Field, ...]] = (
        _f("turnId", "turn_id", "id"),
        _f("text", "text", "str"),
    )


@dataclass(frozen=True, slots=True)
class ToolResult(Message):
    tool_request_id: str
    result: Any
    handled_by: str

    type: ClassVar[str] = "tool.result"
    direction: ClassVar[Literal["client", "server"]] = "client"
    description: ClassVar[str] = (
        "The result of one tool request (error results included), and which handler tier "
        "produced it."
    )
    fields: ClassVar[tuple[_Field, ...]] = (
        _f("toolRequestId", "tool_request_id", "id"),
        _f("result", "result", "any"),
        _f("handledBy", "handled_by", "str", choices=HANDLED_BY),
    )


# not ToolProgress: that is the session event users subscribe to (dispatch.py)
@dataclass(frozen=True, slots=True)
class ToolProgressMessage(Message):
    tool_request_id: str
    progress: float
    total: float | None = None
    message: str | None = None

    type: ClassVar[str] = "tool.progress"
    direction: ClassVar[Literal["client", "server"]] = "client"
    description: ClassVar[str] = (
        "How far a running request has got (optional; sent at most ~10 times a second). "
        "`progress` increases with each message; `total` when the handler knows it. Resets "
        "the request's idle deadline."
    )
    fields: ClassVar[tuple[_Field, ...]] = (
        _f("toolRequestId", "tool_request_id", "id"),
        _f("progress", "progress", "number"),
        _f("total", "total", "number", required=False),
        _f("message", "message", "str", required=False),
    )


#: the ``reason`` of a ``tool.waiting`` the page sends while it asks the user to approve a
#: request (``needs_approval``): Core shows that request as ``awaiting_approval``
APPROVAL_REASON = "approval"


@dataclass(frozen=True, slots=True)
class ToolWaiting(Message):
    tool_request_id: str
    waiting: bool
    reason: str | None = None

    type: ClassVar[str] = "tool.waiting"
    direction: ClassVar[Literal["client", "server"]] = "client"
    description: ClassVar[str] = (
        "A request is waiting for a person (an approval, a dialog): `waiting: true` pauses "
        "its deadline, `waiting: false` resumes it (optional)."
    )
    fields: ClassVar[tuple[_Field, ...]] = (
        _f("toolRequestId", "tool_request_id", "id"),
        _f("waiting", "waiting", "bool"),
        _f("reason", "reason", "str", required=False),
    )


@dataclass(frozen=True, slots=True)
class TurnCancel(Message):
    turn_id: str

    type: ClassVar[str] = "turn.cancel"
    direction: ClassVar[Literal["client", "server"]] = "client"
    description: ClassVar[str] = "Asks Core to cancel a running turn."
    fields: ClassVar[tuple[_Field, ...]] = (_f("turnId", "turn_id", "id"),)


# Core -> browser


@dataclass(frozen=True, slots=True)
class Welcome(Message):
    session_id: str
    resume_token: str
    resumed: bool
    state: str

    type: ClassVar[str] = "welcome"
    direction: ClassVar[Literal["client", "server"]] = "server"
    description: ClassVar[str] = "Core's answer to hello: the session's id and resume token."
    fields: ClassVar[tuple[_Field, ...]] = (
        _f("sessionId", "session_id", "id"),
        _f("resumeToken", "resume_token", "id"),
        _f("resumed", "resumed", "bool"),
        _f("state", "state", "str", choices=SESSION_STATES),
    )


@dataclass(frozen=True, slots=True)
class ToolRequest(Message):
    tool_request_id: str
    tool: str
    args: Any
    turn_id: str | None = None

    type: ClassVar[str] = "tool.request"
    direction: ClassVar[Literal["client", "server"]] = "server"
    description: ClassVar[str] = (
        "Asks the page to run one tool. `turnId` is null for calls made outside a turn "
        "(control API, MCP)."
    )
    fields: ClassVar[tuple[_Field, ...]] = (
        _f("toolRequestId", "tool_request_id", "id"),
        _f("turnId", "turn_id", "id", nullable=True),
        _f("tool", "tool", "str"),
        _f("args", "args", "any"),
    )

    def to_wire(self) -> dict[str, Any]:
        # turnId is always present on the wire, null outside a turn.
        return {
            "type": self.type,
            "toolRequestId": self.tool_request_id,
            "turnId": self.turn_id,
            "tool": self.tool,
            "args": self.args,
        }


@dataclass(frozen=True, slots=True)
class ToolCancel(Message):
    tool_request_id: str
    reason: str

    type: ClassVar[str] = "tool.cancel"
    direction: ClassVar[Literal["client", "server"]] = "server"
    description: ClassVar[str] = (
        "Core no longer wants this request's result (deadline passed, turn cancelled)."
    )
    fields: ClassVar[tuple[_Field, ...]] = (
        _f("toolRequestId", "tool_request_id", "id"),
        _f("reason", "reason", "str"),
    )


@dataclass(frozen=True, slots=True)
class TurnDelta(Message):
    turn_id: str
    text: str

    type: ClassVar[str] = "turn.delta"
    direction: ClassVar[Literal["client", "server"]] = "server"
    description: ClassVar[str] = "A piece of the agent's reply text, streamed."
    fields: ClassVar[tuple[_Field, ...]] = (
        _f("turnId", "turn_id", "id"),
        _f("text", "text", "str"),
    )


@dataclass(frozen=True, slots=True)
class TurnEnd(Message):
    turn_id: str
    status: str
    text: str
    error: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None

    type: ClassVar[str] = "turn.end"
    direction: ClassVar[Literal["client", "server"]] = "server"
    description: ClassVar[str] = (
        "The turn is over: its status and the agent's final text; `error` when it failed; "
        "`usage`, the model's token counts for the turn, when the agent reports them."
    )
    fields: ClassVar[tuple[_Field, ...]] = (
        _f("turnId", "turn_id", "id"),
        _f("status", "status", "str", choices=TURN_STATUSES),
        _f("text", "text", "str"),
        _f("error", "error", "object", required=False),
        _f("usage", "usage", "object", required=False),
    )


@dataclass(frozen=True, slots=True)
class Error(Message):
    code: str
    message: str
    tool_request_id: str | None = None
    turn_id: str | None = None
    details: Any = field(default=None)

    type: ClassVar[str] = "error"
    direction: ClassVar[Literal["client", "server"]] = "server"
    description: ClassVar[str] = (
        "A protocol error: the frame it answers was refused. The connection stays open "
        "unless the code says otherwise. `toolRequestId` or `turnId` name the request or "
        "turn the refused frame was about; a refused `turn.start` ends that turn."
    )
    fields: ClassVar[tuple[_Field, ...]] = (
        _f("code", "code", "str"),
        _f("message", "message", "str"),
        _f("toolRequestId", "tool_request_id", "id", required=False),
        _f("turnId", "turn_id", "id", required=False),
        _f("details", "details", "any", required=False),
    )


ClientMessage: TypeAlias = (
    Hello | ToolsUpdate | TurnStart | ToolResult | ToolProgressMessage | ToolWaiting | TurnCancel
)
ServerMessage: TypeAlias = Welcome | ToolRequest | ToolCancel | TurnDelta | TurnEnd | Error

MESSAGE_TYPES: dict[str, type[Message]] = {
    cls.type: cls
    for cls in (
        Hello, ToolsUpdate, TurnStart, ToolResult, ToolProgressMessage, ToolWaiting, TurnCancel,
        Welcome, ToolRequest, ToolCancel, TurnDelta, TurnEnd, Error,
    )
}


# --- parsing ------------------------------------------------------------------------------


def parse_client_frame(text: str | bytes, *, max_bytes: int = MAX_FRAME_BYTES) -> ClientMessage:
    """Parse a frame sent by the page to Core."""
    return _parse(text, "client", max_bytes)  # type: ignore[return-value]


def parse_server_frame(text: str | bytes, *, max_bytes: int = MAX_FRAME_BYTES) -> ServerMessage:
    """Parse a frame sent by Core to the page."""
    return _parse(text, "server", max_bytes)  # type: ignore[return-value]


def frame_size(text: str) -> int:
    """UTF-8 length of ``text`` without encoding it when the answer is obvious."""
    if text.isascii():
        return len(text)
    return len(text.encode("utf-8", "surrogatepass"))


def decode_json(text: str | bytes, *, max_bytes: int = MAX_FRAME_BYTES,
                what: str = "frame") -> Any:
    """A JSON text from outside, decoded within bounds: at most ``max_bytes`` of UTF-8,
    nested at most ``MAX_DEPTH`` deep (checked before decoding), JSON's own numbers, valid
    Unicode. Raises :class:`ProtocolError` (``FRAME_*``) naming ``what`` otherwise."""
    size = len(text) if isinstance(text, bytes) else frame_size(text)
    if size > max_bytes:
        raise ProtocolError(FRAME_TOO_LARGE, f"{what} is {size} bytes; the limit is {max_bytes}")
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ProtocolError(FRAME_NOT_JSON, f"{what} is not UTF-8 text: {exc}") from None
    refuse_too_deep(text, what)
    try:
        data = strictjson.decode(text)
    except RecursionError:  # pragma: no cover - the scan above comes first
        raise ProtocolError(FRAME_TOO_DEEP, f"{what} nests deeper than {MAX_DEPTH}") from None
    except ValueError as exc:
        raise ProtocolError(FRAME_NOT_JSON, f"{what} is not JSON: {exc}") from None
    where = lone_surrogate_in_json(text, data)
    if where is not None:
        raise ProtocolError(FRAME_NOT_JSON, f"{what} is not Unicode text: {not_unicode(where)}")
    return data


def _parse(text: str | bytes, direction: str, max_bytes: int) -> Message:
    data = decode_json(text, max_bytes=max_bytes)
    if not isinstance(data, dict):
        raise ProtocolError(
            FRAME_NOT_OBJECT, f"frame must be a JSON object, got {_json_type(data)}"
        )
    kind = data.get("type")
    if kind is None:
        raise ProtocolError(MISSING_TYPE, "frame has no 'type'")
    if not isinstance(kind, str):
        raise ProtocolError(INVALID_FIELD, f"'type' must be a string, got {_json_type(kind)}")
    cls = MESSAGE_TYPES.get(kind)
    if cls is None:
        known = sorted(t for t, c in MESSAGE_TYPES.items() if c.direction == direction)
        raise ProtocolError(
            UNKNOWN_TYPE, f"unknown message type {quote(kind)}; expected one of {known}")
    if cls.direction != direction:
        sender = "Core" if cls.direction == "server" else "the page"
        raise ProtocolError(WRONG_DIRECTION, f"{kind!r} is sent by {sender}, not received by it")
    if cls is ToolRequest:
        request = well_formed_request(data)
        if request is not None:
            return request
    return declare.build(cls, data, _check_field, _missing_field)


def well_formed_request(data: dict[str, Any]) -> ToolRequest | None:
    """The ``tool.request`` a page gets on every tool call, checked at a glance: the one
    its declared fields' checks would build, when they would build it; else None (those
    checks then refuse it with their own messages)."""
    if "turnId" not in data or "args" not in data:
        return None
    request_id, turn_id, tool = data.get("toolRequestId"), data["turnId"], data.get("tool")
    if (type(request_id) is str and 0 < len(request_id) <= MAX_ID_LENGTH
            and type(tool) is str
            and (turn_id is None or (type(turn_id) is str
                                     and 0 < len(turn_id) <= MAX_ID_LENGTH))):
        return ToolRequest(tool_request_id=request_id, tool=tool, args=data["args"],
                           turn_id=turn_id)
    return None


def _missing_field(message: str) -> ProtocolError:
    return ProtocolError(MISSING_FIELD, message)


def _check_field(kind_name: str, spec: _Field, value: Any) -> Any:
    where = f"{kind_name}.{spec.wire}"
    # declare.build leaves out an optional field's null: a null here is a required field's
    if value is None and spec.nullable:
        return None
    ok: bool
    if spec.kind == "id":
        ok = isinstance(value, str) and 0 < len(value) <= MAX_ID_LENGTH
        if not ok:
            raise ProtocolError(
                INVALID_FIELD,
                f"{where} must be a non-empty string of at most {MAX_ID_LENGTH} characters",
            )
        return value
    if spec.kind == "str":
        ok = isinstance(value, str)
    elif spec.kind == "bool":
        ok = isinstance(value, bool)
    elif spec.kind == "int":
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif spec.kind == "number":
        # the decoder already refuses NaN and infinities; an int beyond a double is not a number
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if ok and isinstance(value, int):
            ok = abs(value) <= 2**53
    elif spec.kind == "object":
        ok = isinstance(value, dict)
    elif spec.kind == "array":
        ok = isinstance(value, list)
    elif spec.kind == "tools":
        return _check_tools(where, value)
    else:  # any
        return value
    if not ok:
        raise ProtocolError(
            INVALID_FIELD, f"{where} must be {_KIND_NAMES[spec.kind]}, got {_json_type(value)}"
        )
    if spec.choices is not None and value not in spec.choices:
        if spec.wire == "protocol":
            raise ProtocolError(
                UNSUPPORTED_PROTOCOL,
                f"protocol {quote(value)} is not supported; this side speaks {PROTOCOL_VERSION}",
            )
        raise ProtocolError(
            INVALID_FIELD, f"{where} must be one of {list(spec.choices)}, got {quote(value)}"
        )
    return value


def _check_tools(where: str, value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise ProtocolError(INVALID_FIELD, f"{where} must be an array, got {_json_type(value)}")
    seen: set[str] = set()
    for index, metadata in enumerate(value):
        try:
            check_metadata(metadata)
        except ValueError as exc:
            raise ProtocolError(INVALID_TOOL, f"{where}[{index}]: {exc}") from None
        name = metadata["name"]
        if name in seen:
            raise ProtocolError(INVALID_TOOL, f"{where}[{index}]: tool {name!r} is listed twice")
        seen.add(name)
    return value


# A JSON string, or an unterminated one running to the end of the text: possessive, and
# never failing once it starts, so removing strings stays linear on any input.
_JSON_STRING = re.compile(r'"(?:[^"\\]++|\\.)*+(?:"|\\?\Z)', re.DOTALL)
# every byte but the brackets: UTF-8 multi-byte characters hold no ASCII byte, so deleting
# these from the encoded text keeps exactly the brackets (bytes.translate: C speed)
_NOT_BRACKET_BYTES = bytes(b for b in range(256) if b not in b"[]{}")
# the brackets as signed bytes: +1 opening, -1 closing
_BRACKET_STEPS = bytes.maketrans(b"[]{}", b"\x01\xff\x01\xff")


def outside_strings(text: str) -> str:
    """The JSON text without its strings (keys and values): what is left of its structure
    to count, in linear time on any input."""
    return _JSON_STRING.sub("", text)


def refuse_too_deep(text: str, what: str = "frame") -> None:
    """Raise the :class:`ProtocolError` (``FRAME_TOO_DEEP``) a JSON text nested deeper
    than MAX_DEPTH gets, naming ``what``: :func:`nests_too_deep`, the check made before
    decoding."""
    if nests_too_deep(text):
        raise ProtocolError(FRAME_TOO_DEEP, f"{what} nests deeper than {MAX_DEPTH}")


def nests_too_deep(text: str) -> bool:
    """Whether the JSON text nests deeper than MAX_DEPTH, checked *before* decoding it.

    Decoding first is not safe everywhere: in Pyodide, json's C decoder on a deeply nested
    frame overflows the JS stack (a fatal error) instead of raising RecursionError. The
    depth counted is the most brackets open at any point outside strings, what a decoder
    would recurse (in a text that is not JSON it may count more, never less: such a text
    is refused as too deep rather than as not JSON).
    Linear in the text's length.
    """
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return False
    brackets = outside_strings(text).encode("utf-8", "surrogatepass").translate(
        None, _NOT_BRACKET_BYTES)
    # Strip every innermost pair at once (in C, a level a pass: "[]" marked first so that
    # "{[]}" loses one level only), while that takes a fifth of what is left at least:
    # most JSON is gone within a few passes, and they cost five full ones at most in all.
    # A pass lowers the deepest point by one at most.
    levels = 0
    while brackets:
        stripped = brackets.replace(b"[]", b"\0").replace(b"{}", b"").replace(b"\0", b"")
        if 5 * (len(brackets) - len(stripped)) < len(brackets):
            break
        brackets = stripped
        levels += 1
    # The rest counted at C speed: +1 an opening bracket, -1 a closing one, summed.
    return levels + max(accumulate(memoryview(brackets.translate(_BRACKET_STEPS)).cast("b")),
                        default=0) > MAX_DEPTH


_KIND_NAMES = {
    "str": "a string",
    "bool": "a boolean",
    "int": "an integer",
    "number": "a number",
    "object": "an object",
    "array": "an array",
}


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


# --- encoding -----------------------------------------------------------------------------


def frame_head(cls: type[Message]) -> str:
    """How this module writes every frame of ``cls``, up to the value of its first field
    (a required one): ``{"type":"tool.result","toolRequestId":``. Core traces a frame it
    refuses unparsed (too large) back to its request or turn by this head
    (core/connection.py), so both read it from here."""
    first = cls.fields[0]
    assert first.required, f"{cls.type}'s first field is not always written"
    return ('{"type":' + strictjson.encode(cls.type) + ","
            + strictjson.encode(first.wire) + ":")


_TOOL_RESULT_HEAD = frame_head(ToolResult)


def encode_tool_result(tool_request_id: str, result_json: str, handled_by: str) -> str:
    """A ``tool.result`` frame around a result that is already JSON text.

    The runtime encodes every result once, to check it; the frame reuses that text.
    """
    return (
        _TOOL_RESULT_HEAD
        + strictjson.encode(tool_request_id)
        + ',"result":'
        + result_json
        + ',"handledBy":"'
        + handled_by
        + '"}'
    )


def error_frame(code: str, message: str, *, tool_request_id: str | None = None,
                turn_id: str | None = None) -> str:
    return Error(code=code, message=message, tool_request_id=tool_request_id,
                 turn_id=turn_id).encode()


# --- JSON Schemas (published in docs/reference/protocol.md; a test keeps them in sync) ------------


def message_schema(cls: type[Message]) -> dict[str, Any]:
    """The JSON Schema of one message type, derived from its field declaration."""
    return declare.message_schema(cls, _field_schema)


def _field_schema(spec: _Field) -> dict[str, Any]:
    schema: dict[str, Any]
    if spec.kind == "id":
        schema = {"type": "string", "minLength": 1, "maxLength": MAX_ID_LENGTH}
    elif spec.kind == "tools":
        schema = {"type": "array", "items": {"$ref": "#/$defs/toolMetadata"}}
    else:
        schema = declare.kind_schema(spec.kind)
        if spec.choices is not None:
            schema["enum"] = list(spec.choices)
    if spec.nullable:
        schema = {"anyOf": [schema, {"type": "null"}]}
    return schema


TOOL_METADATA_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"},
        "description": {"type": "string", "minLength": 1},
        "argsSchema": {"type": "object", "description": "A JSON Schema (draft 2020-12)."},
        "annotations": {
            "type": "object",
            "properties": {
                "title": {"type": "string"},
                "readOnlyHint": {"type": "boolean"},
                "idempotentHint": {"type": "boolean"},
                "destructiveHint": {"type": "boolean"},
                "openWorldHint": {"type": "boolean"},
            },
            "additionalProperties": False,
        },
    },
    "required": ["name", "description", "argsSchema"],
}


def all_schemas() -> dict[str, dict[str, Any]]:
    """Every message's schema by type, tool metadata's included as ``$defs``."""
    schemas: dict[str, dict[str, Any]] = {}
    for kind, cls in MESSAGE_TYPES.items():
        schema = message_schema(cls)
        if any(spec.kind == "tools" for spec in cls.fields):
            schema["$defs"] = {"toolMetadata": TOOL_METADATA_SCHEMA}
        schemas[kind] = schema
    return schemas
