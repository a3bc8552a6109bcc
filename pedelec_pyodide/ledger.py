"""The delivery ledger: which tool requests this tab has approved, started and finished.

Keyed by ``toolRequestId``. An approval given is recorded with its request, so a request
re-sent after a reload is not asked about again (and, approved but never started, runs
once). A request Core re-sends after a reconnect or a reload is never
run twice: a finished one gets its stored result, and one that was interrupted mid-run
runs again only if its tool is read-only or idempotent. The browser keeps the ledger in
``sessionStorage`` (see :class:`StorageLedger`) so it survives a reload.
"""

from __future__ import annotations

import json
import logging
import re
from collections import OrderedDict
from typing import Any, Protocol

from .protocol import HANDLED_BY, HandledBy, nests_too_deep

logger = logging.getLogger(__name__)

DEFAULT_MAX_ENTRIES = 1024
INDEX_CHUNK = 32
# results a MemoryLedger keeps (32 results at the 1 MiB limit)
DEFAULT_MAX_BYTES = 32 * 1024 * 1024
# what an entry whose result gave way to room keeps: it was started (see StorageLedger)
_STARTED = "{}"
# how a StorageLedger entry approved but not started begins (checked without parsing)
_APPROVED_PREFIX = '{"approved":'
# how a StorageLedger entry holding a result begins: only those can give way to room
_RESULT_PREFIX = '{"result":'


class Ledger(Protocol):
    def start(self, tool_request_id: str, tool: str, *, resumable: bool = False) -> None:
        """The request's handler starts. A ``resumable`` one (its tool read-only or
        idempotent) runs again if a reload interrupts it, as one never started would: its
        start need not outlive the page."""
        ...

    def finish(self, tool_request_id: str, result_json: str, handled_by: HandledBy) -> None: ...

    def get(self, tool_request_id: str) -> tuple[str, HandledBy] | None:
        """The stored ``(result JSON, handledBy)`` of a finished request."""
        ...

    def was_started(self, tool_request_id: str) -> bool: ...

    def approve(self, tool_request_id: str, tool: str) -> None:
        """The user approved the request; its handler has not started yet."""
        ...

    def was_approved(self, tool_request_id: str) -> bool:
        """Approved, started or finished: in each case never to be asked about again."""
        ...


class _Approved:
    """A MemoryLedger entry: approved, not started."""


_APPROVED = _Approved()


class MemoryLedger:
    """The last ``max_entries`` requests, in memory, keeping at most ``max_bytes`` of
    results: past that, the oldest give up their stored results and stay started only
    (as in :class:`StorageLedger` when its storage is full)."""

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES,
                 max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, tuple[str, HandledBy] | _Approved | None] = (
            OrderedDict())
        self._bytes = 0  # the length of the results kept

    def start(self, tool_request_id: str, tool: str, *, resumable: bool = False) -> None:
        self._put(tool_request_id, None)

    def finish(self, tool_request_id: str, result_json: str, handled_by: HandledBy) -> None:
        self._put(tool_request_id, (result_json, handled_by))

    def approve(self, tool_request_id: str, tool: str) -> None:
        self._put(tool_request_id, _APPROVED)

    def _put(self, tool_request_id: str, entry: tuple[str, HandledBy] | _Approved | None
             ) -> None:
        # A request that never ran (no handler, invalid args) is finished without a start.
        entries = self._entries
        replaced = entries.get(tool_request_id)
        if isinstance(replaced, tuple):
            self._bytes -= len(replaced[0])
        if isinstance(entry, tuple):
            self._bytes += len(entry[0])
        entries[tool_request_id] = entry
        if len(entries) > self.max_entries:
            evicted = entries.popitem(last=False)[1]
            if isinstance(evicted, tuple):
                self._bytes -= len(evicted[0])
        if self._bytes > self.max_bytes:
            for key, kept in entries.items():  # oldest first
                if isinstance(kept, tuple) and key != tool_request_id:
                    entries[key] = None
                    self._bytes -= len(kept[0])
                    if self._bytes <= self.max_bytes:
                        break

    def get(self, tool_request_id: str) -> tuple[str, HandledBy] | None:
        entry = self._entries.get(tool_request_id)
        return entry if isinstance(entry, tuple) else None

    def was_started(self, tool_request_id: str) -> bool:
        return (tool_request_id in self._entries
                and self._entries[tool_request_id] is not _APPROVED)

    def was_approved(self, tool_request_id: str) -> bool:
        return tool_request_id in self._entries

    def __len__(self) -> int:
        return len(self._entries)


class Storage(Protocol):
    """The Web Storage API's shape (``sessionStorage``), or any stand-in for it."""

    @property
    def length(self) -> int: ...

    def key(self, index: int) -> str | None: ...

    def getItem(self, key: str) -> str | None: ...

    def setItem(self, key: str, value: str) -> None: ...

    def removeItem(self, key: str) -> None: ...


class StorageLedger:
    """A ledger kept in Web Storage under ``prefix``, so it survives a page reload.

    Bounded to ``max_entries``, oldest first. The ids are indexed in chunks of up to 32
    (``<prefix>index:<n>``, with ``<prefix>index`` naming the live chunks), so recording a
    request rewrites one small chunk, not an index of every id (that cost ~0.2 ms a call in
    Chromium with 1,024 ids); the oldest chunk is evicted whole. A chunk also says which of
    its requests were approved and which started (``{"s": [ids], "a": [ids]}``): starting
    a request is one write, of its chunk, and a finished one's result is one more
    (``<prefix><id>``). The index is read once, when the ledger is made, and kept in
    memory: a request this tab has not recorded costs no read.

    A resumable request's start is kept in memory only (see :meth:`Ledger.start`): its
    call costs one write, its result's, and its chunk says it started the next time the
    chunk is written (when it is made, when it is full, or for another request). The first
    such start marks the index ``loose``: results may stand where no chunk names them. A
    ledger made on a loose index finds them among the storage's keys (read then, once)
    and indexes them as an earlier version's entries (their stored values say what they
    are), in the newest chunk, where they were.

    When the storage is full (``QuotaExceededError``: a few results near the 1 MiB limit
    fill ``sessionStorage``), the oldest entries give up their stored results, oldest
    first, until the write fits. Such a request still counts as started: re-sent after a
    reload, it is run again only if its tool is resumable, else it is
    ``TOOL_OUTCOME_UNKNOWN``; it is never run twice by mistake.

    Entries an earlier version wrote (chunks that are lists of ids, entries that say
    ``{"tool"}`` or ``{"approved"}``) are read as they were meant. A damaged index (or one
    of another bound) is made again from what the storage holds, as a loose one is; a
    damaged entry holds no result.
    """

    def __init__(self, storage: Storage, prefix: str,
                 max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        # the storage's methods, taken once (in the page each is a JS method: looking it up again
        # on every call costs more than the call)
        self._get_item = storage.getItem
        self._set_item = storage.setItem
        self._remove_item = storage.removeItem
        self._prefix = prefix
        self.max_entries = max_entries
        self._chunk_size = max(1, min(INDEX_CHUNK, max_entries // 4))
        # full chunks hold the bound with one to spare; one more, for those that are not
        # full (their resumable requests never finished, see start)
        self._max_chunks = max_entries // self._chunk_size + 2
        self._first = 0  # the number of the oldest chunk
        # oldest first; each: id -> _APPROVED_MARK, _STARTED_MARK or _EARLIER (an earlier
        # version's entry: its stored value says), in the order recorded
        self._chunks: list[dict[str, str]] = []
        self._chunk_of: dict[str, dict[str, str]] = {}  # id -> its chunk
        # ids whose entry key may hold a result (finished here, or recorded before this
        # ledger was made): only those are read, and removed on eviction
        self._results: set[str] = set()
        self._shrunk: set[str] = set()  # entries whose stored result gave way to room
        # False once the index was found damaged: its entries may be anywhere, so an id
        # not indexed is looked up in the storage too
        self._complete = True
        # the stored index says results may stand where no chunk names them (see start)
        self._loose = False
        # the stored index does not name every chunk in memory, or names evicted ones (its
        # write failed): written with the next chunk that is
        self._index_owed = False
        earlier: list[str] = []
        loose = False
        try:
            meta = _decoded(storage.getItem(prefix + "index"))
            if isinstance(meta, dict):
                self._first, end = meta["first"], meta["next"]
                if not (type(self._first) is int and type(end) is int and self._first >= 0
                        and 0 <= end - self._first <= self._max_chunks):
                    raise ValueError("not an index of this bound")
                for number in range(self._first, end):
                    stored = _decoded(storage.getItem(self._chunk_key(number)))
                    self._chunks.append(_read_chunk([] if stored is None else stored))
                loose = meta.get("loose") is True
            elif isinstance(meta, list):  # an earlier version's index: one list of ids
                earlier = [str(tool_request_id) for tool_request_id in meta]
            elif meta is not None:
                raise ValueError("not an index")
        except (ValueError, TypeError, KeyError):  # not ours, or damaged: index afresh
            self._first, self._chunks, self._complete = 0, [], False
        for chunk in reversed(self._chunks):  # an id in two chunks (damage) is the newest's
            for tool_request_id in list(chunk):
                if tool_request_id in self._chunk_of:
                    del chunk[tool_request_id]
                else:
                    self._chunk_of[tool_request_id] = chunk
                    self._results.add(tool_request_id)
        # the newest chunk's ids, each encoded, while all of them are started (see start)
        self._newest_ids: list[str] | None = (
            _encoded_ids(self._chunks[-1]) if self._chunks else None)
        try:
            if earlier:
                self._adopt(dict.fromkeys(earlier, _EARLIER))
            elif loose or not self._complete:  # (a damaged index: its entries found again)
                found, unnamed_chunks = self._unindexed(storage)
                self._adopt(found)
                live = range(self._first, self._first + len(self._chunks))
                for number in unnamed_chunks:  # what they held is in the live ones now
                    if number not in live:
                        self._remove_item(self._chunk_key(number))
            self._complete = True
        except Exception:  # the storage is full: indexed in memory; the next ledger again
            # (an id not indexed is looked up in the storage until then)
            logger.warning("the delivery ledger could not index its entries in storage",
                           exc_info=True)

    def _unindexed(self, storage: Storage) -> tuple[dict[str, str], list[int]]:
        """What ``storage`` holds that the index does not name: the requests in chunks it
        does not name (a damaged index's), oldest first, each with its state, then the
        entries no chunk names, as an earlier version's (only keys holding a value a
        ledger writes: anything else under the prefix is not an entry); and the numbers
        of those chunks."""
        prefix, key_at = self._prefix, storage.key
        entries: list[str] = []
        unnamed_chunks: list[int] = []
        live = range(self._first, self._first + len(self._chunks))
        for at in range(storage.length):
            key = key_at(at)
            if isinstance(key, str) and key.startswith(prefix):  # (not JS null)
                name = key[len(prefix):]
                index_key = _INDEX_KEY.fullmatch(name)
                if index_key:  # the index's own, or a chunk's (named by it, or not)
                    number = None if index_key["number"] is None else int(index_key["number"])
                    if number is not None and number not in live:
                        unnamed_chunks.append(number)
                    continue
                tool_request_id = name[:-1] if _ESCAPED_ID.fullmatch(name) else name
                if (tool_request_id not in self._chunk_of
                        and str(self._get_item(key) or "").startswith(_ENTRY_PREFIXES)):
                    entries.append(tool_request_id)
        unnamed_chunks.sort()
        found: dict[str, str] = {}
        for number in unnamed_chunks:
            try:
                stored = _decoded(self._get_item(self._chunk_key(number)))
                found.update(_read_chunk([] if stored is None else stored))
            except (ValueError, TypeError):  # damaged: what it said is lost
                continue
        for tool_request_id in entries:
            found.setdefault(tool_request_id, _EARLIER)
        return found, unnamed_chunks

    def start(self, tool_request_id: str, tool: str, *, resumable: bool = False) -> None:
        if resumable and not self._loose:  # once: before any result no chunk names
            self._write_index(loose=True)
        chunk = self._chunk_of.get(tool_request_id)
        if chunk is not None:
            if chunk[tool_request_id] != _STARTED_MARK:
                self._mark(tool_request_id, _STARTED_MARK, write=not resumable)
            return
        newest, encoded = self._chunks[-1] if self._chunks else None, self._newest_ids
        if newest is None or encoded is None or len(newest) >= self._chunk_size:
            self._mark(tool_request_id, _STARTED_MARK, write=not resumable)
            return
        # A tool call's path: a new request joins the newest chunk, whose requests all
        # started; its text grows by one id, encoded alone (not the chunk again).
        newest[tool_request_id] = _STARTED_MARK
        self._chunk_of[tool_request_id] = newest
        encoded.append(_COMPACT.encode(tool_request_id))
        if not resumable or len(newest) >= self._chunk_size:  # (see _mark)
            self._set(self._chunk_key(self._first + len(self._chunks) - 1),
                      f'{{"{_STARTED_MARK}":[{",".join(encoded)}]}}', tool_request_id)
        if len(self._chunk_of) > self.max_entries or self._index_owed:
            self._evict()

    def finish(self, tool_request_id: str, result_json: str, handled_by: HandledBy) -> None:
        # A request that never ran (no handler, invalid args, denied) is finished without
        # a start: marked started first, so that its result never stands where no chunk
        # names it (no eviction would find it), and if it gives way to room the request is
        # still never run again.
        if self._state(tool_request_id) != _STARTED_MARK:
            self._mark(tool_request_id, _STARTED_MARK)
        self._set(self._entry_key(tool_request_id),
                  json.dumps({"result": result_json, "handledBy": handled_by}),
                  tool_request_id)
        self._results.add(tool_request_id)
        self._shrunk.discard(tool_request_id)  # a result stored now may give way later

    def approve(self, tool_request_id: str, tool: str) -> None:
        if self._state(tool_request_id) != _STARTED_MARK:
            self._mark(tool_request_id, _APPROVED_MARK)

    def _state(self, tool_request_id: str) -> str | None:
        chunk = self._chunk_of.get(tool_request_id)
        return None if chunk is None else chunk[tool_request_id]

    def _mark(self, tool_request_id: str, state: str, *, write: bool = True) -> None:
        """Record the request's state in its chunk (a new id goes in the newest), and
        write the chunk unless told not to."""
        chunks = self._chunks
        chunk = self._chunk_of.get(tool_request_id)
        added = chunk is None
        if chunk is None:
            if not chunks or len(chunks[-1]) >= self._chunk_size:
                chunks.append({})
                self._index_owed = True  # (written after the chunk: see _evict)
            chunk = self._chunk_of[tool_request_id] = chunks[-1]
        chunk[tool_request_id] = state
        new_chunk = added and len(chunk) == 1
        # A chunk is written when it is made (so no older one stands under its key) and
        # when it is full, even for resumable starts: then only the newest chunk can lack
        # some of its requests, and the next ledger puts them back in it (see _adopt).
        if write or new_chunk or (added and len(chunk) >= self._chunk_size):
            self._set(self._chunk_key(self._number(chunk)), _write_chunk(chunk),
                      tool_request_id)
        self._newest_ids = _encoded_ids(chunks[-1]) if chunks else None
        self._evict()

    def _adopt(self, ids: dict[str, str]) -> None:
        """Index requests no chunk names (``ids``, each with its state: for an earlier
        version's entry, its stored value says), as the newest: in the newest chunk while
        it has room, then in new ones. Each chunk that takes some is written once, then
        the index, no longer loose (it stays loose in storage until all of that is
        written). No stored result gives way to room for these writes: in a full storage
        the next ledger tries again."""
        chunks, size = self._chunks, self._chunk_size
        self._loose = True  # (its index writes stay loose until the chunks are written)
        taking: list[dict[str, str]] = []
        for tool_request_id, state in ids.items():
            if tool_request_id in self._chunk_of:
                continue
            if not chunks or len(chunks[-1]) >= size:
                chunks.append({})
                self._index_owed = True
            chunk = self._chunk_of[tool_request_id] = chunks[-1]
            chunk[tool_request_id] = state
            self._results.add(tool_request_id)
            if not taking or taking[-1] is not chunk:
                taking.append(chunk)
        self._newest_ids = _encoded_ids(chunks[-1]) if chunks else None
        self._evict(write_index=False)  # (the index is written below)
        for chunk in taking:
            if any(kept is chunk for kept in chunks):  # (not evicted)
                self._set_item(self._chunk_key(self._number(chunk)), _write_chunk(chunk))
        self._write_index(loose=False, room=False)

    def _number(self, chunk: dict[str, str]) -> int:
        """The chunk's number (its key's), found from the newest."""
        chunks = self._chunks
        return self._first + next(i for i in range(len(chunks) - 1, -1, -1)
                                  if chunks[i] is chunk)

    def _evict(self, *, write_index: bool = True) -> None:
        """Drop the oldest chunks while over the bound, and write the index if it is owed
        (a chunk made or dropped), unless told not to."""
        remove, chunks = self._remove_item, self._chunks
        while len(self._chunk_of) > self.max_entries or len(chunks) > self._max_chunks:
            for old in chunks.pop(0):
                del self._chunk_of[old]
                if old in self._results:
                    self._results.discard(old)
                    remove(self._entry_key(old))
                self._shrunk.discard(old)
            remove(self._chunk_key(self._first))
            self._first += 1
            self._index_owed = True
        if write_index and self._index_owed:
            self._write_index()

    def _write_index(self, *, loose: bool | None = None, room: bool = True) -> None:
        """Write the index, ``loose`` or not (None: as it is), and keep it so once it is
        written (``room``: making room if the storage is full, see _set)."""
        loose = self._loose if loose is None else loose
        index: dict[str, int | bool] = {"first": self._first,
                                        "next": self._first + len(self._chunks)}
        if loose:
            index["loose"] = True
        (self._set if room else self._set_item)(self._prefix + "index", json.dumps(index))
        self._loose = loose
        self._index_owed = False

    def _set(self, key: str, value: str, keep: str | None = None) -> None:
        """``setItem``, making room when the storage is full; raises if it cannot."""
        while True:
            try:
                self._set_item(key, value)
                return
            except Exception:  # QuotaExceededError (a JsException in the page)
                if not self._shrink_oldest(keep):
                    raise

    def _shrink_oldest(self, keep: str | None) -> bool:
        """Give up the oldest stored result (not ``keep``): its request stays started
        (its chunk says so; an earlier version's entry becomes a bare "started" mark). An
        entry with no result (approved, or started) has nothing to give: it is kept as is
        (made "started", an approved request would never run)."""
        for chunk in self._chunks:
            for tool_request_id, state in chunk.items():
                if (tool_request_id == keep or tool_request_id in self._shrunk
                        or tool_request_id not in self._results):
                    continue
                self._shrunk.add(tool_request_id)
                key = self._entry_key(tool_request_id)
                if not str(self._get_item(key) or "").startswith(_RESULT_PREFIX):
                    continue
                if state == _STARTED_MARK:
                    self._remove_item(key)
                    self._results.discard(tool_request_id)
                else:
                    self._set_item(key, _STARTED)
                return True
        return False

    def _chunk_key(self, number: int) -> str:
        return f"{self._prefix}index:{number}"

    def _entry_key(self, tool_request_id: str) -> str:
        """The key of a request's entry: ``<prefix><id>``, but ``<prefix><id>/`` for an id
        that is one of the index's keys (``index``, ``index:<n>``) followed by any number
        of ``/``: no entry's key is the index's or another entry's."""
        if tool_request_id.startswith("index") and _ESCAPED_ID.fullmatch(tool_request_id):
            return f"{self._prefix}{tool_request_id}/"
        return self._prefix + tool_request_id

    def get(self, tool_request_id: str) -> tuple[str, HandledBy] | None:
        if tool_request_id not in self._results and (
                self._complete or tool_request_id in self._chunk_of):
            return None  # nothing stored for it: not read
        try:  # (as stored: a result JSON text, which may be "null", and who handled it)
            entry: Any = _decoded(self._get_item(self._entry_key(tool_request_id)))
            result, handled_by = entry["result"], entry["handledBy"]
            if type(result) is str and result and handled_by in HANDLED_BY:
                _decoded(result)  # (raises if it is not JSON the engine can decode)
                return result, handled_by
        except (ValueError, TypeError, KeyError):  # started only, or damaged: no result
            pass
        return None

    def was_started(self, tool_request_id: str) -> bool:
        state = self._state(tool_request_id)
        if state is not None and state != _EARLIER:
            return state == _STARTED_MARK
        if state is None and self._complete:
            return False
        raw = self._get_item(self._entry_key(tool_request_id))
        if not raw:  # None, "", or JS null (a JsNull in Pyodide, not None)
            return False
        return not str(raw).startswith(_APPROVED_PREFIX)

    def was_approved(self, tool_request_id: str) -> bool:
        state = self._state(tool_request_id)
        if state is not None and state != _EARLIER:
            return True
        if state is None and self._complete:
            return False
        return bool(self._get_item(self._entry_key(tool_request_id)))


# a request's state in a StorageLedger chunk
_STARTED_MARK = "s"
_APPROVED_MARK = "a"
_EARLIER = "?"  # an earlier version's chunk (a list of ids): the entry itself says
_MARKS = (_STARTED_MARK, _APPROVED_MARK, _EARLIER)
# how each value a ledger writes under an entry's key begins (an earlier version's
# "started" said which tool)
_ENTRY_PREFIXES = (_RESULT_PREFIX, _APPROVED_PREFIX, _STARTED, '{"tool":')


def _decoded(raw: object) -> object:
    """A stored value decoded (None for none): JSON, not nested deeper than a frame may
    be, which none of a ledger's values is (in the page json's decoder would overflow the
    JS stack on a deep one rather than raise); ValueError if it is not."""
    if not raw:  # None, "", or JS null (a JsNull in Pyodide, not None)
        return None
    if type(raw) is not str or nests_too_deep(raw):
        raise ValueError("not a value a ledger writes")
    return json.loads(raw)


# the index's keys after a ledger's prefix
_INDEX_KEY = re.compile(r"index(:(?P<number>[0-9]+))?")
# the ids whose entry's key is the id and one "/" more (see StorageLedger._entry_key)
_ESCAPED_ID = re.compile(r"index(:[0-9]+)?/*")


def _read_chunk(stored: object) -> dict[str, str]:
    if isinstance(stored, list):  # an earlier version's: ids only
        return {str(tool_request_id): _EARLIER for tool_request_id in stored}
    if not isinstance(stored, dict):
        raise ValueError("not a chunk")
    chunk: dict[str, str] = {}
    for state in _MARKS:
        for tool_request_id in stored.get(state, ()):
            chunk[str(tool_request_id)] = state
    return chunk


def _encoded_ids(chunk: dict[str, str]) -> list[str] | None:
    """The chunk's ids, each as JSON, if every one is started; else None."""
    if not set(chunk.values()) <= {_STARTED_MARK}:
        return None
    return [_COMPACT.encode(tool_request_id) for tool_request_id in chunk]


def _write_chunk(chunk: dict[str, str]) -> str:
    """``{"s": [started ids]}``, with ``"a"`` (approved) and ``"?"`` only when not empty."""
    if set(chunk.values()) <= {_STARTED_MARK}:  # the common case, at C speed
        return f'{{"{_STARTED_MARK}":{_COMPACT.encode(list(chunk))}}}'
    by_state: dict[str, list[str]] = {_STARTED_MARK: []}
    for tool_request_id, state in chunk.items():
        by_state.setdefault(state, []).append(tool_request_id)
    return _COMPACT.encode(by_state)


# built once: json.dumps with separators= builds a new encoder on every call
_COMPACT = json.JSONEncoder(separators=(",", ":"))
