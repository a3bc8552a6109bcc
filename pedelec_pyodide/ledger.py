"""The delivery ledger: which tool requests this tab has started and finished.

Keyed by ``toolRequestId``. A request Core re-sends after a reconnect or a reload is never
run twice: a finished one gets its stored result, and one that was interrupted mid-run
runs again only if its tool is read-only or idempotent. The browser keeps the ledger in
``sessionStorage`` (see :class:`StorageLedger`) so it survives a reload.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Protocol

from .protocol import HandledBy

DEFAULT_MAX_ENTRIES = 1024


class Ledger(Protocol):
    def start(self, tool_request_id: str, tool: str) -> None: ...

    def finish(self, tool_request_id: str, result_json: str, handled_by: HandledBy) -> None: ...

    def get(self, tool_request_id: str) -> tuple[str, HandledBy] | None:
        """The stored ``(result JSON, handledBy)`` of a finished request."""
        ...

    def was_started(self, tool_request_id: str) -> bool: ...


class MemoryLedger:
    """The last ``max_entries`` requests, in memory."""

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[str, tuple[str, HandledBy] | None] = OrderedDict()

    def start(self, tool_request_id: str, tool: str) -> None:
        self._put(tool_request_id, None)

    def finish(self, tool_request_id: str, result_json: str, handled_by: HandledBy) -> None:
        self._put(tool_request_id, (result_json, handled_by))

    def _put(self, tool_request_id: str, entry: tuple[str, HandledBy] | None) -> None:
        # A request that never ran (no handler, invalid args) is finished without a start.
        self._entries[tool_request_id] = entry
        if len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def get(self, tool_request_id: str) -> tuple[str, HandledBy] | None:
        return self._entries.get(tool_request_id)

    def was_started(self, tool_request_id: str) -> bool:
        return tool_request_id in self._entries

    def __len__(self) -> int:
        return len(self._entries)


class Storage(Protocol):
    """The Web Storage API's shape (``sessionStorage``), or any stand-in for it."""

    def getItem(self, key: str) -> str | None: ...

    def setItem(self, key: str, value: str) -> None: ...

    def removeItem(self, key: str) -> None: ...


class StorageLedger:
    """A ledger kept in Web Storage under ``prefix``, so it survives a page reload.

    An index of ids (oldest first) bounds it to ``max_entries``.
    """

    def __init__(self, storage: Storage, prefix: str,
                 max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        self._storage = storage
        self._prefix = prefix
        self.max_entries = max_entries
        raw = storage.getItem(prefix + "index")
        self._index: list[str] = json.loads(raw) if raw else []

    def start(self, tool_request_id: str, tool: str) -> None:
        self._put(tool_request_id, json.dumps({"tool": tool}))

    def finish(self, tool_request_id: str, result_json: str, handled_by: HandledBy) -> None:
        self._put(tool_request_id, json.dumps({"result": result_json, "handledBy": handled_by}))

    def _put(self, tool_request_id: str, entry: str) -> None:
        # A request that never ran (no handler, invalid args) is finished without a start.
        self._storage.setItem(self._prefix + tool_request_id, entry)
        if tool_request_id not in self._index:
            self._index.append(tool_request_id)
            while len(self._index) > self.max_entries:
                self._storage.removeItem(self._prefix + self._index.pop(0))
            self._storage.setItem(self._prefix + "index", json.dumps(self._index))

    def get(self, tool_request_id: str) -> tuple[str, HandledBy] | None:
        raw = self._storage.getItem(self._prefix + tool_request_id)
        if not raw:
            return None
        entry = json.loads(raw)
        if "result" not in entry:
            return None
        return entry["result"], entry["handledBy"]

    def was_started(self, tool_request_id: str) -> bool:
        return bool(self._storage.getItem(self._prefix + tool_request_id))
