"""Reading stored rows back: each column checked, a damaged row skipped with a warning
(bad JSON, a wrong type, a NULL, a row of an unknown session), whatever the backend."""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Iterable
from typing import Any

from ... import strictjson
from ...protocol import MAX_ID_LENGTH, TURN_STATUSES
from ...text import lone_surrogate_in_json, not_unicode
from ...tools import check_metadata
from ..log import log_event
from .errors import MAX_REASON_CHARS, reason
from .records import (
    KEY_KINDS,
    IdempotencyRecord,
    RequestRecord,
    SessionRecord,
    TurnRecord,
)

_STORED_STATUSES = ("running", *TURN_STATUSES)
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


class _Damaged(ValueError):
    pass


def skipped(table: str, rowid: Any, why: str) -> None:
    """Say a row (or what holds it) could not be read and was left out of the load."""
    log_event("store.row_skipped", level=logging.WARNING, table=table, rowid=rowid,
              reason=why[:MAX_REASON_CHARS])


def _parsed(table: str, row: tuple[Any, ...], build: Callable[..., Any],
            *context: Any) -> Any:
    try:
        return build(row[1:], *context)
    except (ValueError, TypeError, RecursionError) as exc:  # UnicodeError is a ValueError
        skipped(table, row[0], str(exc) if isinstance(exc, _Damaged) else reason(exc))
        return None


def records(table: str, rows: Iterable[tuple[Any, ...]], build: Callable[..., Any],
            *context: Any) -> list[Any]:
    """The records ``build`` makes of ``rows`` (each: where it is stored, then its
    columns); a damaged row is skipped with a warning."""
    made = []
    for row in rows:
        record = _parsed(table, row, build, *context)
        if record is not None:
            made.append(record)
    return made


def _text(value: Any, name: str, *, null: bool = False) -> Any:
    """Text, as bytes (decoded here: bad UTF-8 spoils its row only) or already decoded."""
    if value is None and null:
        return None
    if isinstance(value, str):
        value.encode("utf-8")  # a lone surrogate
        return value
    if not isinstance(value, bytes):
        raise _Damaged(f"{name} is {'NULL' if value is None else type(value).__name__}, "
                       "not text")
    return value.decode("utf-8")


def _id(value: Any, name: str, *, null: bool = False) -> Any:
    text = _text(value, name, null=null)
    if text is not None and not 0 < len(text) <= MAX_ID_LENGTH:
        raise _Damaged(f"{name} is not an id (1 to {MAX_ID_LENGTH} characters)")
    return text


def _number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(
            value):
        raise _Damaged(f"{name} is not a number")
    return value


def _integer(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _Damaged(f"{name} is not a whole number")
    return value


def _json(value: Any, name: str, kind: type | None = None, *, null: bool = False) -> Any:
    text = _text(value, name, null=null)
    if text is None:
        return None
    try:
        data = strictjson.decode(text)
    except (ValueError, RecursionError) as exc:
        raise _Damaged(f"{name} is not valid JSON ({reason(exc)})") from None
    where = lone_surrogate_in_json(text, data)  # escaped in the JSON
    if where is not None:
        raise _Damaged(f"{name} is not valid JSON ({not_unicode(where)})")
    if kind is not None and not isinstance(data, kind):
        raise _Damaged(f"{name} is {type(data).__name__}, not {kind.__name__}")
    return data


def _objects(data: list[Any], name: str) -> list[dict[str, Any]]:
    if not all(isinstance(item, dict) for item in data):
        raise _Damaged(f"{name} holds something other than objects")
    return data


def session(row: tuple[Any, ...]) -> SessionRecord:
    id_, token_hash, tools, history, created_at = row
    token_hash = _text(token_hash, "token_hash")
    if not _SHA256_HEX.fullmatch(token_hash):
        raise _Damaged("token_hash is not a sha256 in hex")
    tools_text = _text(tools, "tools")
    names: set[str] = set()
    for index, metadata in enumerate(_objects(_json(tools, "tools", list), "tools")):
        try:
            check_metadata(metadata)
        except ValueError as exc:
            raise _Damaged(f"tools[{index}]: {exc}") from None
        if metadata["name"] in names:
            raise _Damaged(f"tools[{index}]: {metadata['name']!r} is listed twice")
        names.add(metadata["name"])
    _objects(_json(history, "history", list), "history")
    return SessionRecord(_id(id_, "id"), token_hash, tools_text, _text(history, "history"),
                         _number(created_at, "created_at"))


def request(row: tuple[Any, ...], sessions: set[str]) -> RequestRecord:
    (id_, session_id, turn_id, step, idx, tool, args, deadline, result, handled_by,
     finished_at) = row
    record = RequestRecord(
        _id(id_, "id"), _id(session_id, "session_id"), _id(turn_id, "turn_id", null=True),
        _integer(step, "step"), _integer(idx, "idx"), _text(tool, "tool"),
        _json(args, "args"), _number(deadline, "deadline"),
        _json(result, "result", null=True), _text(handled_by, "handled_by", null=True),
        None if finished_at is None else _number(finished_at, "finished_at"))
    if record.session_id not in sessions:
        raise _Damaged("a request of an unknown session")
    return record


def turn(row: tuple[Any, ...], sessions: set[str], running: set[str]) -> TurnRecord:
    """A turn; a second running turn of one session is damage (one turn at a time)."""
    (id_, session_id, text, status, final_text, error, tool_calls, end_delivered, created_at,
     usage) = row
    status = _text(status, "status")
    if status not in _STORED_STATUSES:
        raise _Damaged(f"status is not one of {list(_STORED_STATUSES)}")
    if end_delivered not in (0, 1) or isinstance(end_delivered, float):
        raise _Damaged("end_delivered is not 0 or 1")
    usage = _json(usage, "usage", dict)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in usage.values()):
        raise _Damaged("usage holds something other than whole numbers")
    record = TurnRecord(
        _id(id_, "id"), _id(session_id, "session_id"), _text(text, "text"), status,
        _text(final_text, "final_text"), _json(error, "error", dict, null=True),
        _objects(_json(tool_calls, "tool_calls", list), "tool_calls"), bool(end_delivered),
        _number(created_at, "created_at"), usage)
    if record.session_id not in sessions:
        raise _Damaged("a turn of an unknown session")
    if status == "running":
        if record.session_id in running:
            raise _Damaged("a second running turn of its session")
        running.add(record.session_id)
    return record


def key(row: tuple[Any, ...], sessions: set[str]) -> IdempotencyRecord:
    key_hash, session_id, kind, fingerprint, target_id, created_at = row
    record = IdempotencyRecord(
        _text(key_hash, "key_hash"), _id(session_id, "session_id"), _text(kind, "kind"),
        _text(fingerprint, "fingerprint"), _id(target_id, "target_id"),
        _number(created_at, "created_at"))
    if record.kind not in KEY_KINDS:
        raise _Damaged(f"kind is not one of {list(KEY_KINDS)}")
    if not (_SHA256_HEX.fullmatch(record.key_hash)
            and _SHA256_HEX.fullmatch(record.fingerprint)):
        raise _Damaged("key_hash or fingerprint is not a sha256 in hex")
    if record.session_id not in sessions:
        raise _Damaged("a key of an unknown session")
    return record
