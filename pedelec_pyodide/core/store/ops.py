"""Record-level writes, as the queue holds them: each captures its record when it is made
(serialised to the columns every backend stores, checked), so a record Core changes
after saving it is stored as it was, and a value no backend could store fails at once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from .records import (
    IdempotencyRecord,
    RequestRecord,
    SessionRecord,
    TurnRecord,
    dump_json,
    turn_key,
)

OpKind = Literal["session", "tools", "history", "delete_session", "request",
                 "delete_request", "turn", "key", "delete_key", "end_delivered",
                 "prune_turns"]
#: the columns of each record, in the order every backend keeps them
SESSION_COLUMNS = ("id", "token_hash", "tools", "history", "created_at")
REQUEST_COLUMNS = ("id", "session_id", "turn_id", "step", "idx", "tool", "args", "deadline",
                   "result", "handled_by", "finished_at")
TURN_COLUMNS = ("id", "session_id", "text", "status", "final_text", "error", "tool_calls",
                "end_delivered", "created_at", "usage")
KEY_COLUMNS = ("key_hash", "session_id", "kind", "fingerprint", "target_id", "created_at")
# the key a pruning's failure is kept under
PRUNE_KEY = "prune"


@dataclass(frozen=True)
class Op:
    """One write. ``key``: where its failure is kept for the flush that names it;
    ``target``: the record's id within its session (request id, turn id, key hash);
    ``row``: the record's columns (text, numbers and None only)."""

    kind: OpKind
    key: str
    session_id: str = ""
    target: str = ""
    row: tuple[Any, ...] = ()

    @property
    def size(self) -> int:
        """Characters of text it holds (the queue's bound counts them)."""
        return sum(len(value) for value in self.row if isinstance(value, str))


def _checked(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """The row, if every backend can take each value: text that encodes as UTF-8 (no lone
    surrogate) and numbers; raised here, on the caller's side, not in the writer."""
    for value in row:
        if isinstance(value, str):
            value.encode("utf-8")
        elif value is not None and not isinstance(value, (int, float)):
            raise TypeError(f"cannot store a value of type {type(value).__name__}")
    return row


def session_op(record: SessionRecord) -> Op:
    return Op("session", record.id, record.id, record.id, _checked((
        record.id, record.token_hash, record.tools, record.history, record.created_at)))


def tools_op(record: SessionRecord) -> Op:
    """The session's tools alone (``row``: the tools' JSON)."""
    return Op("tools", record.id, record.id, record.id, _checked((record.tools,)))


def history_op(record: SessionRecord) -> Op:
    """The session's row but its tools (``None`` in their column)."""
    return Op("history", record.id, record.id, record.id, _checked((
        record.id, record.token_hash, None, record.history, record.created_at)))


def request_op(record: RequestRecord) -> Op:
    return Op("request", record.id, record.session_id, record.id, _checked((
        record.id, record.session_id, record.turn_id, record.step, record.index, record.tool,
        dump_json(record.args), record.deadline,
        None if record.handled_by is None else dump_json(record.result), record.handled_by,
        record.finished_at)))


def turn_op(record: TurnRecord) -> Op:
    return Op("turn", turn_key(record.session_id, record.id), record.session_id, record.id,
              _checked((record.id, record.session_id, record.text, record.status,
                        record.final_text,
                        None if record.error is None else dump_json(record.error),
                        dump_json(record.tool_calls), int(record.end_delivered),
                        record.created_at, dump_json(record.usage))))


def key_op(record: IdempotencyRecord) -> Op:
    return Op("key", record.key_hash, record.session_id, record.key_hash, _checked((
        record.key_hash, record.session_id, record.kind, record.fingerprint,
        record.target_id, record.created_at)))
