"""Core's work in the background: tasks nobody awaits, and loops that must not die."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from ..text import excerpt
from .clock import Clock
from .log import log_event

# tasks nobody awaits, held until done (the event loop keeps only weak references)
_BACKGROUND: set[asyncio.Task[None]] = set()
# seconds an inbox waits before it is read again after it failed
INBOX_RETRY_SECONDS = 0.5

M = TypeVar("M")


def background_failed(task: str, exc: Exception) -> None:
    """A round of one of Core's background loops failed: said, and the loop carries on
    (none may die: a node whose lease renewal stopped would lose all its pages)."""
    log_event("cluster.failed", level=logging.WARNING, task=task,
              error=excerpt(f"{type(exc).__name__}: {exc}"))


def spawn(work: Awaitable[Any], *,
          on_error: Callable[[Exception], bool] | None = None) -> asyncio.Task[None]:
    """``work`` on its own: a failure is logged (a store out of reach: the lease
    expires). ``on_error`` sees a failure first, and says whether it dealt with it."""
    async def run() -> None:
        try:
            await work
        except Exception as exc:
            if on_error is None or not on_error(exc):
                background_failed("spawned", exc)
    _BACKGROUND.add(task := asyncio.ensure_future(run()))
    task.add_done_callback(_BACKGROUND.discard)
    return task


async def read_forever(task: str, inbox: Callable[[], AsyncIterator[M]],
                       on_message: Callable[[M], None], clock: Clock) -> None:
    """Each message of ``inbox()`` to ``on_message``, for Core's life: if reading fails,
    that is said, and the inbox read again after a pause."""
    while True:
        try:
            async for message in inbox():
                on_message(message)
        except Exception as exc:
            background_failed(task, exc)
        await clock.sleep(INBOX_RETRY_SECONDS)
