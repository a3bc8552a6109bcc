"""A pending tool request: its deadline, its progress, the callers waiting on it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any, NamedTuple

from ... import protocol
from ..clock import Timer
from ..store import RequestRecord
from .codes import RequestStatus


class RequestProgress(NamedTuple):
    """The latest ``tool.progress`` of a request, as Core keeps it."""

    progress: float
    total: float | None
    message: str | None

    def as_json(self) -> dict[str, Any]:
        """``{"progress", "total"?, "message"?}``: what callers are sent."""
        data: dict[str, Any] = {"progress": self.progress}
        if self.total is not None:
            data["total"] = self.total
        if self.message is not None:
            data["message"] = self.message
        return data


class TrackedRequest:
    """A tool request whose result has not reached its caller yet.

    Its deadline (``record.deadline``) is an idle deadline: each new progress moves it to
    ``idle`` seconds from now, never past ``limit``; while the page waits for the user
    (``paused_at``) it does not run, and its waits together are bounded by
    ``--user-wait-limit`` (``waited``: a page that ends each wait and starts another
    cannot hold its caller forever). One timer checks it, rescheduled when it fires early (a
    progress frame costs no timer work)."""

    __slots__ = ("frame", "future", "idle", "limit", "paused_at", "progress", "record",
                 "released", "started", "status", "timer", "timer_due", "waited",
                 "watchers")

    def __init__(self, record: RequestRecord, frame: str | None, idle: float,
                 limit: float, started: float) -> None:
        self.record = record
        # the checked ``tool.request`` frame, once made (re-sends reuse it)
        self.frame = frame
        #: stored, so it may go to the page (a resume re-sends only those): a new one once
        #: its write is done, one restored from the store at once
        self.released = False
        self.future: asyncio.Future[tuple[Any, str]] = (
            asyncio.get_running_loop().create_future()
        )
        self.started = started  # monotonic (Core's clock): its ``waitedMs``
        self.timer: Timer | None = None
        self.timer_due = 0.0  # wall-clock: when ``timer`` fires
        self.idle = idle  # seconds: the call's timeout
        self.limit = limit  # wall-clock: the latest progress may move the deadline to
        self.paused_at: float | None = None  # wall-clock, while waiting for the user
        self.waited = 0.0  # seconds of the waits for the user that have ended
        self.status: RequestStatus = "running"
        self.progress: RequestProgress | None = None
        # futures of callers waiting for the next progress (or the result)
        self.watchers: list[asyncio.Future[None]] = []

    @property
    def id(self) -> str:
        return self.record.id

    # --- its deadline (wall-clock seconds) ------------------------------------------------

    def due(self, user_wait_limit: float) -> float:
        """When it times out, as things stand: its deadline; while the page waits for the
        user, once ``user_wait_limit`` less the waits before is over."""
        if self.paused_at is None:
            return self.record.deadline
        return self.paused_at + user_wait_limit - self.waited

    def progressed(self, progress: RequestProgress, now: float) -> None:
        """A new progress at ``now``: kept, and the deadline moved to ``idle`` from now
        (never past ``limit``, nor while the page waits for the user)."""
        self.progress = progress
        if self.paused_at is None:
            deadline = min(now + self.idle, self.limit)
            if deadline > self.record.deadline:  # the timer sees it when it fires
                self.record.deadline = deadline
        self.wake()

    def pause(self, now: float) -> bool:
        """The page waits for the user from ``now``; False if it did already."""
        if self.paused_at is not None:
            return False
        self.paused_at = now
        return True

    def unpause(self, now: float) -> bool:
        """The wait for the user ended at ``now``: the deadline and the limit move on by
        its length, which counts towards ``--user-wait-limit``; False if none ran."""
        paused_at = self.paused_at
        if paused_at is None:
            return False
        self.paused_at = None
        waited = max(0.0, now - paused_at)
        self.waited += waited
        self.record.deadline += waited
        self.limit += waited
        return True

    def describe(self) -> dict[str, Any]:
        progress = self.progress
        return {"toolRequestId": self.id, "tool": self.record.tool, "status": self.status,
                "progress": None if progress is None else progress._asdict()}

    def wake(self) -> None:
        watchers, self.watchers = self.watchers, []
        for watcher in watchers:
            if not watcher.done():
                watcher.set_result(None)

    async def updates(self) -> AsyncIterator[RequestProgress]:
        """Each new progress until the request is resolved; a caller slower than the
        page gets only the latest (nothing queues up for it)."""
        seen: RequestProgress | None = None
        while True:
            latest = self.progress
            if latest is not None and latest is not seen:
                seen = latest
                yield latest
                continue
            if self.future.done():
                return
            await self.changed()

    async def changed(self) -> None:
        """Return at the request's next change: a progress, a wait for the user begun or
        ended (``status``), its result."""
        watcher = asyncio.get_running_loop().create_future()
        self.watchers.append(watcher)
        try:
            await watcher
        finally:
            if watcher.cancelled():  # its caller left: it holds no place in the list
                with contextlib.suppress(ValueError):
                    self.watchers.remove(watcher)

    def message(self) -> protocol.ToolRequest:
        record = self.record
        return protocol.ToolRequest(
            tool_request_id=record.id, tool=record.tool, args=record.args,
            turn_id=record.turn_id,
        )

