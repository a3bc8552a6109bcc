"""Wall time and timers for tool requests' deadlines: the system's, or one a test moves
(``CoreConfig.clock``), so a deadline, its pause and its limits are tested without
waiting on real time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Protocol


class Timer(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    def time(self) -> float:
        """Wall-clock seconds (deadlines are stored, and outlive a restart of Core)."""

    def call_later(self, delay: float, callback: Callable[..., object],
                   *args: Any) -> Timer:
        """Call ``callback(*args)`` on the running loop in ``delay`` seconds."""


class SystemClock:
    """The default: ``time.time`` and the running event loop's timers."""

    def time(self) -> float:
        return time.time()

    def call_later(self, delay: float, callback: Callable[..., object],
                   *args: Any) -> Timer:
        return asyncio.get_running_loop().call_later(delay, callback, *args)
