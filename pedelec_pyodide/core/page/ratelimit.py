"""A rate limit: the token bucket every per-connection and per-client rate draws from.

Every frame a page sends costs one token of its connection's bucket: its messages are
charged by :class:`~.connection.PageConnection` (which knows the results Core waits for,
and leaves those free), its pings, pongs and continuation frames by the WebSocket protocol
under it (:mod:`.ws_limits`), which the app never sees. A client's new regular expressions
are charged by the character to its own bucket (:mod:`.clients`).
"""

from __future__ import annotations

import threading

from ..clock import Clock


class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` saved up. A spend over the limit leaves
    the bucket negative; below ``-burst`` the sender is flooding and is cut off.
    Thread-safe: the frames parsed in worker threads charge it too."""

    __slots__ = ("_lock", "burst", "clock", "rate", "refilled", "tokens")

    def __init__(self, rate: float, burst: float, clock: Clock) -> None:
        self.rate = rate
        self.burst = burst
        self.clock = clock
        self.tokens = burst
        self.refilled = clock.monotonic()
        self._lock = threading.Lock()

    def _refill(self) -> None:
        now = self.clock.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.refilled) * self.rate)
        self.refilled = now

    def spend(self, cost: float = 1.0) -> float:
        """Take ``cost`` tokens, going into debt if need be: the tokens left after."""
        with self._lock:
            self._refill()
            self.tokens -= cost
            return self.tokens

    def take(self, cost: float) -> bool:
        """Take ``cost`` tokens if there are that many; False (nothing taken) if not."""
        with self._lock:
            self._refill()
            if self.tokens < cost:
                return False
            self.tokens -= cost
            return True

    def flooded(self, tokens: float) -> bool:
        """``tokens`` (what :meth:`spend` left) say the sender floods: cut it off."""
        return tokens < -self.burst

    def full(self) -> bool:
        with self._lock:
            self._refill()
            return self.tokens >= self.burst
