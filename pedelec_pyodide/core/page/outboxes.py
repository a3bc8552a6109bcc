"""The bytes queued for all connections together, capped (``--max-queued-total-bytes``).

Each connection's queue has its own bound (``--max-queued-bytes``), but pages that never
read, each kept just under it, would add up to gigabytes. So the total is capped too:
a frame that would take it over makes room by closing the connection that holds the
most (the sender's own, counting the new frame, if that is the one), as many times as it
takes. The total never grows past the cap; a page that reads holds little and is closed
last.
"""

from __future__ import annotations

from typing import Protocol


class Holder(Protocol):
    """A connection's queue, as the total sees it."""

    @property
    def queued(self) -> int:
        """Bytes of memory it holds now."""

    def shed(self) -> None:
        """Close the connection, giving its bytes back (:meth:`Outboxes.release`)."""


class Outboxes:
    """The total of every connection's queue; the holders are those with bytes queued."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.total = 0
        self._holders: set[Holder] = set()

    def make_room(self, holder: Holder, size: int) -> bool:
        """Room for ``size`` more bytes in ``holder``'s queue: True once taken (the caller
        queues them), False if ``holder`` was the one that held the most (then it is not
        shed here: the caller closes it, with its own reason)."""
        while self.total + size > self.limit and self._holders:
            largest = max(self._holders, key=lambda h: h.queued)
            if largest is holder or largest.queued <= holder.queued + size:
                return False
            largest.shed()
        self.total += size
        self._holders.add(holder)
        return True

    def release(self, holder: Holder, size: int) -> None:
        """``holder`` gave back ``size`` bytes (sent, or dropped)."""
        self.total -= size
        if holder.queued == 0:
            self._holders.discard(holder)

    def holders(self) -> int:
        return len(self._holders)
