"""Core's one clock: every read of the time and every wait in Core goes through the
:class:`Clock` of ``CoreConfig.clock`` (deadlines, session expiry, leases, backoff and
retries, durations, transport timeouts). The system's by default; a test gives one it
moves (tests/core/clockkit.py), so a deadline, a lease or a resend is tested without
waiting on real time."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class Timer(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    def time(self) -> float:
        """Wall-clock seconds: what is stored, or outlives a restart of Core (deadlines,
        when a session was made or disconnected, when a result came in)."""

    def monotonic(self) -> float:
        """Seconds that only go forward: intervals and durations in this process
        (leases held here, resend gaps, ``waitedMs``)."""

    def call_later(self, delay: float, callback: Callable[..., object],
                   *args: Any) -> Timer:
        """Call ``callback(*args)`` on the running loop in ``delay`` seconds."""

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds``."""

    def timeout(self, seconds: float) -> contextlib.AbstractAsyncContextManager[Any]:
        """A block cancelled after ``seconds``, raising ``TimeoutError`` then (as
        ``asyncio.timeout``)."""


class SystemClock:
    """The default: the system's time and the running event loop's timers."""

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def call_later(self, delay: float, callback: Callable[..., object],
                   *args: Any) -> Timer:
        return asyncio.get_running_loop().call_later(delay, callback, *args)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def timeout(self, seconds: float) -> contextlib.AbstractAsyncContextManager[Any]:
        return asyncio.timeout(seconds)


async def wait_for(clock: Clock, awaitable: Awaitable[T], seconds: float) -> T:
    """``asyncio.wait_for`` on ``clock``: ``awaitable``'s result, or ``TimeoutError``
    (the awaitable cancelled) after ``seconds``."""
    async with clock.timeout(seconds):
        return await awaitable


async def wait(clock: Clock, tasks: Iterable[asyncio.Future[Any]], seconds: float, *,
               return_when: str = asyncio.ALL_COMPLETED) -> None:
    """``asyncio.wait`` with its timeout on ``clock``: returns when ``tasks`` are done (or
    the first of them, by ``return_when``) or after ``seconds``, cancelling none."""
    with contextlib.suppress(TimeoutError):
        async with clock.timeout(seconds):
            await asyncio.wait(tasks, return_when=return_when)

