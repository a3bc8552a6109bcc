"""A clock for Core (``CoreConfig.clock``) whose time moves only when a test says so.

Every read of the time and every wait in Core goes through its clock, so with a
:class:`FakeClock` a test moves past a deadline, a session's expiry, a lease or a resend
gap with ``await clock.advance(seconds)`` instead of sleeping until it: a stalled machine
neither fails the test nor lets it pass untested, and the test takes no real time.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

#: turns of the event loop :meth:`FakeClock.advance` gives after each timer, so the tasks
#: it woke run up to their next wait (a sleep sets its next timer) before time moves on
SETTLE_TURNS = 20


class FakeTimer:
    """One ``call_later`` of a :class:`FakeClock`, due at ``when`` (its elapsed time)."""

    def __init__(self, when: float, order: int, callback: Callable[..., object],
                 args: tuple[Any, ...]) -> None:
        self.when = when
        self.order = order  # timers due at the same time fire in the order they were set
        self.callback = callback
        self.args = args
        self.cancelled = False

    def __lt__(self, other: FakeTimer) -> bool:
        return (self.when, self.order) < (other.when, other.order)

    def cancel(self) -> None:
        self.cancelled = True


class FakeTimeout:
    """``clock.timeout(seconds)``: ``asyncio.timeout``'s rules on a fake clock's timer
    (the block's task cancelled when it falls due, that cancel turned into
    ``TimeoutError``; a cancel from elsewhere passes through)."""

    def __init__(self, clock: FakeClock, seconds: float) -> None:
        self.clock = clock
        self.seconds = seconds
        self.expired = False

    async def __aenter__(self) -> FakeTimeout:
        task = asyncio.current_task()
        assert task is not None, "a timeout needs a task"
        self.task = task
        self.cancelling = task.cancelling()
        self.timer = self.clock.call_later(self.seconds, self._expire)
        return self

    def _expire(self) -> None:
        self.expired = True
        self.task.cancel()

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        traceback: TracebackType | None) -> None:
        self.timer.cancel()
        if (self.expired and self.task.uncancel() <= self.cancelling
                and kind is asyncio.CancelledError):
            raise TimeoutError from exc


class FakeClock:
    """Core's :class:`~pedelec_pyodide.core.clock.Clock`, moved by :meth:`advance` only.
    Wall time starts at the real wall clock's (deadlines and records are wall-clock,
    like those Core stores), monotonic time at ``MONOTONIC_START``; both move together."""

    MONOTONIC_START = 1000.0

    def __init__(self, *, start: float | None = None) -> None:
        self.start = time.time() if start is None else start
        self.elapsed = 0.0
        self._timers: list[FakeTimer] = []
        self._order = itertools.count()

    def time(self) -> float:
        return self.start + self.elapsed

    def monotonic(self) -> float:
        return self.MONOTONIC_START + self.elapsed

    def call_later(self, delay: float, callback: Callable[..., object],
                   *args: Any) -> FakeTimer:
        timer = FakeTimer(self.elapsed + max(0.0, delay), next(self._order), callback, args)
        heapq.heappush(self._timers, timer)
        return timer

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        timer = self.call_later(seconds, _wake, woken)
        try:
            await woken
        finally:
            timer.cancel()

    def timeout(self, seconds: float) -> FakeTimeout:
        return FakeTimeout(self, seconds)

    async def advance(self, seconds: float) -> None:
        """Move the clock ``seconds`` on: each timer due meanwhile fires at its own time,
        in order (those they set too), and the loop runs the tasks it woke before time
        moves on."""
        end = self.elapsed + seconds
        await _settle()
        while self._timers and self._timers[0].when <= end:
            timer = heapq.heappop(self._timers)
            if timer.cancelled:
                continue
            self.elapsed = max(self.elapsed, timer.when)
            timer.callback(*timer.args)
            await _settle()
        self.elapsed = end
        await _settle()

    @property
    def waiting(self) -> int:
        """Timers (sleeps and timeouts too) set and not yet fired nor cancelled."""
        return sum(1 for timer in self._timers if not timer.cancelled)


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def _settle() -> None:
    for _ in range(SETTLE_TURNS):
        await asyncio.sleep(0)


#: real seconds :func:`advance_through_io` pauses after each step, for I/O the step's
#: tasks started (a Redis command, a frame on a loopback socket) to be answered
IO_PAUSE = 0.02


async def advance_through_io(clock: FakeClock, seconds: float, step: float = 0.25) -> None:
    """Move ``clock`` ``seconds`` on, ``step`` at a time, with a short real pause after
    each: Core's loops that wait on Redis between their sleeps (renewals, resends, polls)
    run each round before time moves past their next one. Redis's own expiry (a lease's
    PX) stays on real time: a test moves it by setting a key's TTL."""
    while seconds > 1e-9:
        await clock.advance(min(step, seconds))
        seconds -= step
        await asyncio.sleep(IO_PAUSE)


async def advance_until(clock: FakeClock, predicate: Callable[[], bool],
                        what: str = "condition", step: float = 0.25,
                        limit: float = 120.0) -> None:
    """Move ``clock`` on (as :func:`advance_through_io`) until ``predicate()`` holds;
    AssertionError after ``limit`` seconds of the clock."""
    moved = 0.0
    while not predicate():
        assert moved < limit, f"timed out waiting for {what} ({limit:g} s of the clock)"
        await advance_through_io(clock, step, step)
        moved += step
