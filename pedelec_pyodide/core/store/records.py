"""What Core stores: its records, as dataclasses, and the rules of their keys."""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import sys
from dataclasses import dataclass, field
from typing import Any, Literal

from ... import strictjson

# Ended turns remembered per session (in memory, and in the store until pruned), so a
# page that re-sends the ``turn.start`` of a turn whose ``turn.end`` it never got (lost
# with a dropped connection or a killed Core) gets that end again, not a second run.
RECENT_TURNS = 8
#: seconds between two prunings of old turns (Core calls ``Store.prune_turns``)
PRUNE_SECONDS = 60.0


def hash_token(token: str) -> str:
    """What the store keeps of a resume token: its sha256, in hex."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def turn_key(session_id: str, turn_id: str) -> str:
    """The key of a turn's writes (turn ids are the page's, unique per session only)."""
    return f"{session_id}/{turn_id}"


class JsonText:
    """A JSON value Core keeps as its compact text: decoded, what a page sends can take
    ~24 times the memory of its JSON (``[{}, {}, ...]``), so what Core holds beyond the
    moment it works on it (results, a turn's tool calls) is kept as text.
    :func:`dump_json` writes it as the value it is."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def value(self) -> Any:
        return json.loads(self.text)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, JsonText) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)

    def __repr__(self) -> str:
        return f"JsonText({self.text[:60]!r})"


def as_text(value: Any) -> JsonText:
    """``value`` as a :class:`JsonText` (itself, if it is one)."""
    return value if isinstance(value, JsonText) else JsonText(kept_json(value))


#: the size of a non-ASCII text without its characters (PEP 393: ``é`` and its NUL)
_NON_ASCII_BASE = sys.getsizeof("\xe9") - 2


def char_width(text: str) -> int:
    """Bytes of memory each character of ``text`` takes (1, 2 or 4: Python stores a
    text at the width of its widest character). Read off the text's size, which holds
    its characters and a NUL at that width: finding the widest character is a pass over
    the text (~40 µs for 4,000 characters), and a history is thousands of entries."""
    if text.isascii():
        return 1
    if type(text) is str:  # (a subclass's instance is larger by its own fields)
        width, rest = divmod(sys.getsizeof(text) - _NON_ASCII_BASE, len(text) + 1)
        if rest == 0 and width in (1, 2, 4):
            return width
    widest = max(text)  # (nor is every text stored in the one block PEP 393 describes)
    return 1 if widest <= "\xff" else 2 if widest <= "\uffff" else 4


def kept_json(value: Any) -> str:
    """Compact JSON text as Core keeps it: its characters as they are, or ASCII with
    escapes when that takes less memory (mostly ASCII text with one emoji in it takes 4
    bytes a character as it is)."""
    text = dump_json(value)
    if char_width(text) == 1:
        return text
    escaped = dump_json(value, ascii=True)
    return escaped if len(escaped) < char_width(text) * len(text) else text


def kept_size(text: str) -> int:
    """What a bound on kept JSON counts of ``text``: its UTF-8 bytes, or its bytes of
    memory where those are more."""
    if text.isascii():
        return len(text)
    return max(len(text.encode("utf-8", "surrogatepass")), char_width(text) * len(text))


_MARKER_BYTES = 8
# a JsonText's placeholder as the encoder writes it: one pattern for every marker (a
# pattern per marker was compiled anew by every dump of a value holding JsonText)
_PLACEHOLDER = re.compile(rf'"\\u0000([0-9a-f]{{{2 * _MARKER_BYTES}}})(\d+)\\u0000"')


def dump_json(value: Any, *, ascii: bool = False) -> str:
    """Compact JSON text (:func:`~pedelec_pyodide.strictjson.encode`: NaN and the
    infinities refused, no page or model could read them back), as Core keeps metadata
    and history in memory; a :class:`JsonText` inside is written as it is. ``ascii``:
    other characters escaped."""
    if isinstance(value, JsonText):
        return value.text
    kept: list[str] = []
    marker = ""  # made with the first JsonText: a value without one costs no randomness

    def raw(item: Any) -> str:
        nonlocal marker
        if not isinstance(item, JsonText):
            raise TypeError(f"Object of type {type(item).__name__} is not JSON serializable")
        if not marker:
            marker = secrets.token_hex(_MARKER_BYTES)  # no value can have guessed it
        kept.append(item.text)
        return f"\0{marker}{len(kept) - 1}\0"

    text = strictjson.encoder(ascii=ascii, default=raw).encode(value)
    if not kept:
        return text

    def kept_text(found: re.Match[str]) -> str:
        # a value's own string shaped like a placeholder has not this call's marker
        return kept[int(found[2])] if found[1] == marker else found[0]

    # each placeholder string, with its quotes, becomes the text it stands for
    return _PLACEHOLDER.sub(kept_text, text)


@dataclass
class SessionRecord:
    """A session as stored. Its tool metadata and the agent's history are kept as compact
    JSON text: decoded, they take up to ~24 times the memory of their JSON."""

    id: str
    token_hash: str  # hash_token(resume token): the token itself is never stored
    tools: str  # JSON: the page's tool metadata
    history: str  # JSON: the agent's own record of earlier turns
    created_at: float


@dataclass
class RequestRecord:
    """A tool request that has not been delivered to its caller yet."""

    id: str
    session_id: str
    turn_id: str | None
    step: int
    index: int
    tool: str
    args: Any
    deadline: float  # wall-clock seconds (Core's clock.time())
    result: Any = None
    handled_by: str | None = None  # set once the result is in
    # wall-clock time the result came in; kept (outside turns) until the retention ends
    finished_at: float | None = None

    @property
    def answered(self) -> bool:
        return self.handled_by is not None


#: what an ``Idempotency-Key`` started: a control-API tool call with the caller's own
#: key, a tool call with a key Core gave it (a forwarding node's, an MCP relay's: its
#: result is kept apart, see core/sessions/idempotency.py), or a turn
KeyKind = Literal["tool-call", "core-call", "turn"]
TOOL_CALL: KeyKind = "tool-call"
CORE_CALL: KeyKind = "core-call"
TURN: KeyKind = "turn"
KEY_KINDS: tuple[KeyKind, ...] = (TOOL_CALL, CORE_CALL, TURN)


@dataclass
class IdempotencyRecord:
    """An ``Idempotency-Key`` a control-API caller gave, and what it started. The key is
    kept only as ``key_hash`` (sha256 of the session id and the key), never in clear."""

    key_hash: str
    session_id: str
    kind: KeyKind
    fingerprint: str  # sha256 of what the request asked for (see core/sessions/idempotency.py)
    target_id: str  # the toolRequestId or turnId it started
    created_at: float


@dataclass
class TurnRecord:
    id: str
    session_id: str
    text: str
    status: str  # running | completed | failed | cancelled
    final_text: str = ""
    error: dict[str, Any] | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    end_delivered: bool = False
    created_at: float = 0.0
    usage: dict[str, int] = field(default_factory=dict)  # the model's token counts


@dataclass
class Snapshot:
    """What a store holds at start: sessions (oldest first), their open requests and the
    kept results of requests made outside turns (in the order last saved), their turns
    (by start; old ones leave by ``prune_turns``) and the idempotency keys."""

    sessions: list[SessionRecord] = field(default_factory=list)
    requests: list[RequestRecord] = field(default_factory=list)
    turns: list[TurnRecord] = field(default_factory=list)
    keys: list[IdempotencyRecord] = field(default_factory=list)
