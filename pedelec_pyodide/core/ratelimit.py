"""A connection's rate limit: a token bucket both layers under a page draw from.

Every frame a page sends costs one token: its messages are charged by
:class:`~.connection.PageConnection` (which knows the results Core waits for, and leaves
those free), its pings, pongs and continuation frames by the WebSocket protocol under it
(:mod:`.ws_limits`), which the app never sees.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class TokenBucket:
    """``rate`` frames a second, ``burst`` saved up. A frame over the limit leaves the
    bucket negative; below ``-burst`` the sender is flooding and is cut off."""

    __slots__ = ("_clock", "_refilled", "burst", "rate", "tokens")

    def __init__(self, rate: float, burst: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self._clock = clock
        self._refilled = clock()

    def take(self) -> float:
        """Charge one frame; the tokens left (negative: over the limit)."""
        now = self._clock()
        tokens = min(self.burst, self.tokens + (now - self._refilled) * self.rate) - 1.0
        self.tokens = tokens
        self._refilled = now
        return tokens

    def flooded(self, tokens: float) -> bool:
        """``tokens`` (what :meth:`take` left) say the sender floods: cut it off."""
        return tokens < -self.burst
