"""Messages between Core nodes on one Redis: declared once, parsed, encoded.

As in :mod:`pedelec_pyodide.protocol` (and by the same machinery,
:mod:`pedelec_pyodide.declare`), each message is a JSON object with a ``type``, declared
once as a list of fields; its parser, its encoder and its JSON Schema (published in
docs/reference/cluster.md, a test keeps it in sync) derive from that declaration.

An *ask* (:class:`Ask`) expects a reply carrying its ``ask`` id; it names its sender
(``from``) for that reply. A node sends an ask again until its reply comes (pub/sub
loses what is sent while an inbox reconnects: :class:`~.node.Node`), so a reply may be
heard twice and an ask served once. Everything published is sealed with
``--cluster-secret`` first (store/seal.py); whatever does not parse here is dropped and
logged (:func:`bad_message`), and the inbox reads on.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypeAlias

from ... import strictjson
from ...declare import Declared, Field, build, kind_schema
from ...declare import message_schema as declare_schema
from ...errors import PedelecError
from ...text import excerpt
from ..log import log_event
from ..store import dump_json


class BadMessage(PedelecError, ValueError):
    """A message from another node (or whoever publishes on Redis) of the wrong shape."""


def bad_message(exc: Exception) -> None:
    """A message between nodes that makes no sense: said, and dropped."""
    log_event("cluster.bad_message", level=logging.WARNING,
              error=excerpt(f"{type(exc).__name__}: {exc}"))


# --- field declarations -------------------------------------------------------------------

#: ``id``: a non-empty string (a node, an ask, a session, a key); ``status``: an HTTP
#: status code; ``number``: a finite number; ``headers``: a list of ``[name, value]``
_Kind = Literal["id", "str", "bool", "status", "number", "headers", "any"]


def _f(wire: str, attr: str, kind: _Kind, *, required: bool = True) -> Field:
    return Field(wire, attr, kind, required)


class NodeMessage(Declared):
    """Base of every message between nodes. Subclasses declare ``type``, ``fields`` and
    ``description``."""

    def encode(self) -> str:
        # a result Core keeps as JSON text (a relayed call's) is written as it is
        return dump_json(self.to_wire())


class Ask(NodeMessage):
    """A message that expects a reply: ``ask`` names it, ``sender`` is where the reply
    goes."""

    ask: str
    sender: str


class Reply(NodeMessage):
    """The reply to the ask ``ask``."""

    ask: str


# the fields every ask starts with
_ASK = (_f("ask", "ask", "id"), _f("from", "sender", "id"))


# --- control-API calls forwarded to the node holding the page (routing.py) -------------


@dataclass(frozen=True, slots=True)
class HttpCall(Ask):
    ask: str
    sender: str
    method: str
    path: str
    query: str
    headers: list[list[str]]
    body: str
    route_key: bool

    type: ClassVar[str] = "http.call"
    description: ClassVar[str] = (
        "A control-API call for a session the receiver holds: run through its routes "
        "(authorization checked again). `routeKey`: its Idempotency-Key is the forwarding "
        "node's own.")
    fields: ClassVar[tuple[Field, ...]] = (
        *_ASK,
        _f("method", "method", "str"),
        _f("path", "path", "str"),
        _f("query", "query", "str"),
        _f("headers", "headers", "headers"),
        _f("body", "body", "str"),
        _f("routeKey", "route_key", "bool"),
    )


@dataclass(frozen=True, slots=True)
class HttpReply(Reply):
    ask: str
    status: int
    body: str

    type: ClassVar[str] = "http.reply"
    description: ClassVar[str] = "The HTTP status and body of a forwarded call."
    fields: ClassVar[tuple[Field, ...]] = (
        _f("ask", "ask", "id"),
        _f("status", "status", "status"),
        _f("body", "body", "str"),
    )


@dataclass(frozen=True, slots=True)
class HungUp(NodeMessage):
    ask: str

    type: ClassVar[str] = "http.hungUp"
    description: ClassVar[str] = (
        "The caller of a forwarded call (its ask) hung up: the node running it sees its "
        "own caller hang up.")
    fields: ClassVar[tuple[Field, ...]] = (_f("ask", "ask", "id"),)


# --- MCP tool calls relayed to the node holding the page (relay.py) ---------------------


@dataclass(frozen=True, slots=True)
class McpCall(Ask):
    ask: str
    sender: str
    session: str
    tool: str
    args: Any
    key: str

    type: ClassVar[str] = "mcp.call"
    description: ClassVar[str] = (
        "An MCP client's tool call for a page the receiver holds, under the relay's "
        "idempotency key: a copy sent again is not run again.")
    fields: ClassVar[tuple[Field, ...]] = (
        *_ASK,
        _f("session", "session", "id"),
        _f("tool", "tool", "str"),
        _f("args", "args", "any"),
        _f("key", "key", "id"),
    )


@dataclass(frozen=True, slots=True)
class McpProgress(NodeMessage):
    key: str
    progress: float
    total: float | None = None
    message: str | None = None

    type: ClassVar[str] = "mcp.progress"
    description: ClassVar[str] = "A new progress of the relayed call `key`, to its sender."
    fields: ClassVar[tuple[Field, ...]] = (
        _f("key", "key", "id"),
        _f("progress", "progress", "number"),
        _f("total", "total", "number", required=False),
        _f("message", "message", "str", required=False),
    )


@dataclass(frozen=True, slots=True)
class McpReply(Reply):
    ask: str
    result: Any = None
    moved: bool = False

    type: ClassVar[str] = "mcp.reply"
    description: ClassVar[str] = (
        "A relayed call's result; `moved`: the receiver does not hold the page (route the "
        "call again).")
    fields: ClassVar[tuple[Field, ...]] = (
        _f("ask", "ask", "id"),
        _f("result", "result", "any", required=False),
        _f("moved", "moved", "bool", required=False),
    )


@dataclass(frozen=True, slots=True)
class McpCancel(Ask):
    ask: str
    sender: str
    key: str
    session: str

    type: ClassVar[str] = "mcp.cancel"
    description: ClassVar[str] = (
        "The MCP client cancelled the call `key`: its request is cancelled (the page gets "
        "`tool.cancel`), or never runs if it has not come yet.")
    fields: ClassVar[tuple[Field, ...]] = (
        *_ASK,
        _f("key", "key", "id"),
        _f("session", "session", "id"),
    )


@dataclass(frozen=True, slots=True)
class McpCancelled(Reply):
    ask: str
    moved: bool = False

    type: ClassVar[str] = "mcp.cancelled"
    description: ClassVar[str] = (
        "A cancel was applied; `moved`: the receiver does not hold the page.")
    fields: ClassVar[tuple[Field, ...]] = (
        _f("ask", "ask", "id"),
        _f("moved", "moved", "bool", required=False),
    )


@dataclass(frozen=True, slots=True)
class ToolsChanged(NodeMessage):
    session: str

    type: ClassVar[str] = "mcp.toolsChanged"
    description: ClassVar[str] = (
        "A page's tools changed (stored already), on the channel all nodes with MCP "
        "clients hear.")
    fields: ClassVar[tuple[Field, ...]] = (_f("session", "session", "id"),)


# --- sessions moving between nodes (node.py) --------------------------------------------


@dataclass(frozen=True, slots=True)
class HandOver(NodeMessage):
    session: str
    to: str

    type: ClassVar[str] = "session.handOver"
    description: ClassVar[str] = (
        "Node `to` took the session's lease (its page resumed there): let go of it, store "
        "what is queued, and say so.")
    fields: ClassVar[tuple[Field, ...]] = (
        _f("session", "session", "id"),
        _f("to", "to", "id"),
    )


@dataclass(frozen=True, slots=True)
class HandedOver(NodeMessage):
    session: str

    type: ClassVar[str] = "session.handedOver"
    description: ClassVar[str] = "The session's former holder let go of it."
    fields: ClassVar[tuple[Field, ...]] = (_f("session", "session", "id"),)


AnyAsk: TypeAlias = HttpCall | McpCall | McpCancel
AnyReply: TypeAlias = HttpReply | McpReply | McpCancelled

MESSAGE_TYPES: dict[str, type[NodeMessage]] = {
    cls.type: cls
    for cls in (
        HttpCall, HttpReply, HungUp, McpCall, McpProgress, McpReply, McpCancel,
        McpCancelled, ToolsChanged, HandOver, HandedOver,
    )
}


# --- parsing ------------------------------------------------------------------------------


def parse(text: str) -> NodeMessage:
    """A message another node published, or :class:`BadMessage` saying what is wrong
    with it (not JSON, nested past the recursion limit, a field missing or of the wrong
    kind, an unknown type)."""
    try:
        data = strictjson.decode(text)
    except (ValueError, RecursionError) as exc:
        raise BadMessage(f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadMessage("not a JSON object")
    kind = data.get("type")
    cls = MESSAGE_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise BadMessage(f"unknown message type {excerpt(repr(kind))}")
    return build(cls, data, _checked, BadMessage)


def _checked(kind_name: str, spec: Field, value: Any) -> Any:
    where = f"{kind_name}.{spec.wire}"
    if spec.kind == "any":
        return value
    if spec.kind == "number":
        number = _finite(value)
        if number is None:
            raise BadMessage(f"{where} is not a finite number")
        return number
    ok: bool
    if spec.kind == "id":
        ok = isinstance(value, str) and bool(value)
    elif spec.kind == "str":
        ok = isinstance(value, str)
    elif spec.kind == "bool":
        ok = isinstance(value, bool)
    elif spec.kind == "status":
        ok = type(value) is int and 100 <= value <= 599
    else:  # headers
        ok = isinstance(value, list) and all(
            isinstance(header, list) and len(header) == 2
            and all(isinstance(part, str) for part in header) for header in value)
    if not ok:
        raise BadMessage(f"{where} is not {_KIND_NAMES[spec.kind]}")
    return value


def _finite(value: Any) -> float | None:
    """``value`` as a finite float; None if it is not a number or not finite (an int of
    400 digits is a JSON number, but no float)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


_KIND_NAMES = {
    "id": "a non-empty string",
    "str": "a string",
    "bool": "true or false",
    "status": "an HTTP status code",
    "headers": "a list of [name, value] strings",
}


# --- JSON Schemas (published in docs/reference/cluster.md; a test keeps them in sync) -----


def message_schema(cls: type[NodeMessage]) -> dict[str, Any]:
    """The JSON Schema of one message type, derived from its field declaration."""
    return declare_schema(cls, _field_schema)


def _field_schema(spec: Field) -> dict[str, Any]:
    if spec.kind == "id":
        return {"type": "string", "minLength": 1}
    if spec.kind == "status":
        return {"type": "integer", "minimum": 100, "maximum": 599}
    if spec.kind == "headers":
        return {"type": "array", "items": {
            "type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 2}}
    return kind_schema(spec.kind)


def all_schemas() -> dict[str, dict[str, Any]]:
    """Every message's schema, by type."""
    return {kind: message_schema(cls) for kind, cls in MESSAGE_TYPES.items()}
