"""Exactly once for control-API callers: ``Idempotency-Key`` and the results Core keeps.

A caller that gives ``Idempotency-Key`` on ``POST .../tool-calls`` or ``POST .../turns``
can send the same request again (after a timeout, a dropped connection, a restart of
Core) and gets the result of the one run the first request started. Core keeps the key
as a hash of the session id and the key, with a fingerprint of what was asked, next to
the request or turn it started (durably with the SQLite store).

The results of requests made outside turns (control API, MCP) are kept too, so that
``GET .../tool-calls/{toolRequestId}`` and a retry can give them: per session, at most
``kept_results`` of those a caller's own key started and as many of the others, each for
``result_retention`` seconds after it came in. A key
lives as long as what it started is kept: a tool call's key goes with its result; a
turn's key (and the turn's record) is kept ``result_retention`` seconds after the turn
started, never while it runs, at most ``kept_results`` per session. After that the key
is unknown again: a request with it starts a new run.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from typing import Any

from ...errors import PedelecError
from ..clock import Clock
from ..store import (
    TOOL_CALL,
    TURN,
    IdempotencyRecord,
    JsonText,
    KeyKind,
    RequestRecord,
    Store,
    TurnRecord,
    as_text,
)

HEADER = "Idempotency-Key"
#: the longest key a caller may give, in characters
MAX_KEY_CHARS = 128
#: a key sent again with a request that asks for something else (the control API's HTTP
#: 422, as the IETF draft on the header says: the key is not for this request)
IDEMPOTENCY_KEY_REUSED = "IDEMPOTENCY_KEY_REUSED"


def key_hash(session_id: str, key: str) -> str:
    """What is stored of a key: it is the caller's secret as much as a resume token is.
    A newline is in neither a session id nor a header value, so the pair is unambiguous."""
    return hashlib.sha256(f"{session_id}\n{key}".encode()).hexdigest()


def fingerprint(kind: KeyKind, asked: dict[str, Any]) -> str:
    """The same for two requests that ask for the same thing (whatever their JSON's key
    order or spacing, or whether Core holds a value as text: :class:`JsonText`): their
    kind and the fields Core acts on."""
    text = json.dumps([kind, asked], sort_keys=True, separators=(",", ":"),
                      default=_decoded)
    return hashlib.sha256(text.encode()).hexdigest()


def _decoded(value: Any) -> Any:
    if not isinstance(value, JsonText):
        raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")
    return value.value()


class KeyReused(PedelecError):
    """A key this session has seen for another request (:func:`claim`)."""

    def __init__(self, known: IdempotencyRecord) -> None:
        super().__init__(f"the key was used for another {known.kind} request")
        self.known = known


def claim(callers: CallerMemory, session_id: str, key: str, kind: KeyKind,
          digest: str) -> tuple[IdempotencyRecord | None, IdempotencyRecord | None]:
    """The one rule for a key, whoever gives it (a caller, or Core: a forwarding node's,
    an MCP relay's): ``(known, new)``, the record of ``key`` if this session has seen it
    for the same request (same kind, same ``digest``: the :func:`fingerprint` of what it
    asks), else a new record to store with what this request starts (its ``target_id``
    still to fill). :class:`KeyReused` if the session has seen it for another request."""
    hashed = key_hash(session_id, key)
    known = callers.key(hashed)
    if known is None:
        return None, IdempotencyRecord(hashed, session_id, kind, digest, "",
                                        callers.clock.time())
    if known.kind != kind or known.fingerprint != digest:
        raise KeyReused(known)
    return known, None


class CallerMemory:
    """One session's keys and kept results, bounded in count and in time (see above)."""

    def __init__(self, store: Store, limit: int, retention: float, clock: Clock) -> None:
        self._store = store
        self.clock = clock  # when a key was claimed, a result kept; what is past retention
        self._limit = limit
        self._retention = retention
        # finished requests made outside turns, oldest first, in two lots of at most
        # ``limit`` each: those a caller's own key started, and the others (no key, or
        # Core's own: a forwarding node's, an MCP relay's), so that a flood of the
        # others never pushes out what a caller's retry with its key needs
        self.results: OrderedDict[str, RequestRecord] = OrderedDict()
        self.others: OrderedDict[str, RequestRecord] = OrderedDict()
        # turns started with a key, oldest first
        self.turns: OrderedDict[str, TurnRecord] = OrderedDict()
        self.keys: dict[str, IdempotencyRecord] = {}
        self._key_of: dict[str, str] = {}  # target id -> key hash
        self._callers_targets: set[str] = set()  # the targets of callers' own keys

    def key(self, hashed: str) -> IdempotencyRecord | None:
        self.sweep()
        return self.keys.get(hashed)

    def add_key(self, record: IdempotencyRecord, turn: TurnRecord | None = None) -> None:
        self.keys[record.key_hash] = record
        self._key_of[record.target_id] = record.key_hash
        if record.kind == TOOL_CALL:  # a caller's own (CORE_CALL: Core's, see above)
            self._callers_targets.add(record.target_id)
        if turn is not None:
            self.turns[turn.id] = turn
        self._store.save_key(record)
        self.sweep()

    def keep(self, request: RequestRecord) -> None:
        """A request made outside any turn has its result: keep it, in the store too."""
        request.finished_at = self.clock.time()
        lot = self.results if request.id in self._callers_targets else self.others
        lot[request.id] = request
        self._store.save_request(request)
        # kept for a day for its result alone (GET .../tool-calls/{id}, a key's retry):
        # its args, up to a frame, are never read again (its row, written now, keeps them;
        # written again after the store lost it, it holds null)
        request.args = None
        self.sweep()

    def kept(self, request_id: str) -> RequestRecord | None:
        """A kept result's record, its result as kept: JSON text (:class:`JsonText`;
        decoded, what a page sends may take ~24 times the memory, and decoding it is
        the reader's work, off the loop when it is long)."""
        self.sweep()
        kept = self.results.get(request_id)
        return self.others.get(request_id) if kept is None else kept

    def restore(self, results: list[RequestRecord], keys: list[IdempotencyRecord],
                turns: dict[str, TurnRecord], pending: set[str]) -> None:
        """After a restart: what the store kept. A key whose target is gone is dropped."""
        finished = {request.id for request in results}
        for record in keys:
            turn = turns.get(record.target_id) if record.kind == TURN else None
            known = turn is not None if record.kind == TURN else (
                record.target_id in pending or record.target_id in finished)
            if not known:
                self._store.delete_key(record.session_id, record.key_hash)
                continue
            self.keys[record.key_hash] = record
            self._key_of[record.target_id] = record.key_hash
            if turn is not None:
                self.turns[turn.id] = turn
            elif record.kind == TOOL_CALL:
                self._callers_targets.add(record.target_id)
        for request in sorted(results, key=lambda r: r.finished_at or 0.0):
            lot = self.results if request.id in self._callers_targets else self.others
            request.result, request.args = as_text(request.result), None  # (see keep)
            lot[request.id] = request
        self.sweep()

    def store_again(self) -> None:
        """Write what is kept (results, keys, keyed turns) again: the store lost it."""
        for lot in (self.results, self.others):
            for request in lot.values():
                self._store.save_request(request)
        for turn in self.turns.values():
            self._store.save_turn(turn)
        for record in self.keys.values():
            self._store.save_key(record)

    def sweep(self) -> None:
        """Forget what is past its retention or over the count, oldest first: each call
        does work only for what it forgets."""
        horizon = self.clock.time() - self._retention
        for results in (self.results, self.others):
            while results:
                request = next(iter(results.values()))
                if len(results) <= self._limit and (request.finished_at or 0.0) > horizon:
                    break
                del results[request.id]
                self._store.delete_request(request.session_id, request.id)
                self.forget_key(request.id)
        turns = self.turns
        while turns:
            turn = next(iter(turns.values()))
            if turn.status == "running" or (
                    len(turns) <= self._limit and turn.created_at > horizon):
                break
            del turns[turn.id]
            self.forget_key(turn.id)

    def forget_key(self, target_id: str) -> None:
        """Drop the key that started ``target_id`` (if one did): a retry with it starts
        afresh. Its result, if kept, is one of the others' from now on."""
        self._callers_targets.discard(target_id)
        kept = self.results.pop(target_id, None)
        if kept is not None:
            self.others[target_id] = kept
        hashed = self._key_of.pop(target_id, None)
        if hashed is not None:
            record = self.keys.pop(hashed)
            self._store.delete_key(record.session_id, hashed)
