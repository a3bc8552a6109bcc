"""A scheduler whose clock moves only when a test says so (CPython and Pyodide alike):
the page session's throttles and grace periods are tested by advancing it, never by
sleeping (Core's clock has its own: tests/core/clockkit.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any


class Timer:
    def __init__(self, when: float, callback: Callable[[], object]) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock:
    """``time()``, ``call_later`` on a clock that ``advance`` moves, from ``start``; tasks
    go to the running loop (``create_task``), or are only collected with
    ``collect_tasks=True`` (for a Session used with no event loop at all)."""

    def __init__(self, *, start: float = 0.0, collect_tasks: bool = False) -> None:
        self.now = start
        self.timers: list[Timer] = []
        self.collect_tasks = collect_tasks
        self.collected: list[Coroutine[Any, Any, None]] = []

    def time(self) -> float:
        return self.now

    def call_later(self, delay: float, callback: Callable[..., object],
                   *args: Any) -> Timer:
        timer = Timer(self.now + delay, lambda: callback(*args))
        self.timers.append(timer)
        return timer

    def create_task(self, coro: Coroutine[Any, Any, None]) -> Any:
        if self.collect_tasks:
            self.collected.append(coro)
            return None
        return asyncio.get_running_loop().create_task(coro)

    def advance(self, seconds: float) -> None:
        """Move the clock, running the timers that fall due (also those they set), in
        order."""
        self.now += seconds
        while True:
            due = [t for t in self.timers if not t.cancelled and t.when <= self.now]
            if not due:
                break
            timer = min(due, key=lambda t: t.when)
            self.timers.remove(timer)
            timer.callback()
        self.timers = [t for t in self.timers if not t.cancelled]

    @property
    def waiting(self) -> int:
        return sum(1 for t in self.timers if not t.cancelled)
