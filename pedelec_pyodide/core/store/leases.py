"""Session leases (which Core node holds a page's session) and messages between nodes
(see :class:`~.interface.Store`).

A lease names a node and expires ``ttl`` seconds after it was last taken or renewed, so
the session of a node that died is free again without anyone releasing it. The memory and
SQLite stores serve one process: their leases live in this process (:class:`LocalLeases`);
the Redis store keeps them in Redis, where every node of the cluster sees them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import NamedTuple

from ..clock import Clock

#: most leases one renewal names (a node renews its sessions in chunks of this many)
RENEW_CHUNK = 500
#: messages an inbox holds for a node slower to read them (more are dropped, as pub/sub
#: drops what nobody reads)
INBOX_LIMIT = 1000


class Renewal(NamedTuple):
    """What a renewal of a node's leases found (:meth:`~.interface.Store.renew`)."""

    #: the sessions another node holds: left untouched
    lost: list[str]
    #: the sessions whose lease was missing (it expired, or the store lost it): taken again
    retaken: list[str]


class LocalLeases:
    """Leases and inboxes in this process's memory, with the Redis store's rules."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        # session id -> (node, monotonic expiry); bounded by the sessions Core holds
        self._leases: dict[str, tuple[str, float]] = {}
        self._inboxes: dict[str, list[asyncio.Queue[str]]] = {}

    async def publish(self, node: str, message: str) -> int:
        reached = 0
        for queue in self._inboxes.get(node, []):
            if queue.qsize() < INBOX_LIMIT:
                queue.put_nowait(message)
                reached += 1
        return reached

    async def inbox(self, node: str) -> AsyncIterator[str]:
        queue: asyncio.Queue[str] = asyncio.Queue()
        self._inboxes.setdefault(node, []).append(queue)
        try:
            while True:
                yield await queue.get()
        finally:
            self._inboxes[node].remove(queue)
            if not self._inboxes[node]:
                del self._inboxes[node]

    def _live(self, session_id: str) -> str | None:
        held = self._leases.get(session_id)
        if held is None:
            return None
        if held[1] <= self.clock.monotonic():
            del self._leases[session_id]
            return None
        return held[0]

    async def claim(self, session_id: str, node: str, ttl: float) -> str | None:
        previous = self._live(session_id)
        self._leases[session_id] = (node, self.clock.monotonic() + ttl)
        return previous

    async def renew(self, session_ids: list[str], node: str, ttl: float) -> Renewal:
        renewal = Renewal([], [])
        until = self.clock.monotonic() + ttl
        for session_id in session_ids:
            held = self._live(session_id)
            if held not in (node, None):
                renewal.lost.append(session_id)
                continue
            if held is None:
                renewal.retaken.append(session_id)
            self._leases[session_id] = (node, until)
        return renewal

    async def release(self, session_id: str, node: str) -> None:
        if self._live(session_id) == node:
            del self._leases[session_id]

    async def holder(self, session_id: str) -> str | None:
        return self._live(session_id)

    async def holders(self, session_ids: list[str]) -> list[str | None]:
        return [self._live(session_id) for session_id in session_ids]
