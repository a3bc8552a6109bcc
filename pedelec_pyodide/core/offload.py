"""Core's own work on large values, done off the event loop.

Encoding, decoding and checking JSON is linear, but on a 1 MiB value of tiny objects
each pass takes 15 to 60 ms; several in one step of the event loop kept ``/health`` and
every other client waiting for a tenth of a second or more. Core's work on a large value
it holds (a turn's request frames, a long reply, the agent's history) runs in two worker
threads of its own: the frames clients send are parsed in other threads (page/bridge.py), so a
flood of them does not hold up this work. A worker still holds the GIL while json's C
code runs, but hands it back to the loop between passes and every few ms of Python, so
the loop waits for one pass at most. Small values are worked on in place (:func:`is_large`):
a thread hop would cost them more than the work.

Callers await :func:`off_loop` where they would have called the function: what they do
next (send a frame, store a row) still happens in the order they do it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

#: texts, frames and values longer than this as JSON (characters) are worked on off the
#: event loop
LARGE_CHARS = 16 * 1024

_WORKERS = ThreadPoolExecutor(max_workers=2, thread_name_prefix="pedelec-json")

T = TypeVar("T")


async def off_loop(work: Callable[..., T], *args: object) -> T:
    """``work(*args)`` in one of Core's worker threads."""
    return await asyncio.get_running_loop().run_in_executor(_WORKERS, work, *args)


def is_large(value: Any) -> bool:
    """Whether ``value`` may be longer than :data:`LARGE_CHARS` characters as JSON. Counts
    at most that many characters, whatever the value's size: a container counts one per
    item before its items are looked at."""
    budget = LARGE_CHARS
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            budget -= len(item) + 2
        elif isinstance(item, dict):
            budget -= 2 + 2 * len(item)  # braces, a colon and a comma per item
            if budget >= 0:
                pending.extend(item.keys())
                pending.extend(item.values())
        elif isinstance(item, (list, tuple)):
            budget -= 2 + len(item)
            if budget >= 0:
                pending.extend(item)
        elif isinstance(item, int):
            budget -= item.bit_length() // 3 + 1  # digits, roughly
        else:  # float, bool, None; JSON Core keeps as text (store.JsonText): its length
            text = getattr(item, "text", None)
            budget -= len(text) if isinstance(text, str) else 5
        if budget < 0:
            return True
    return False
