"""Work on large values, done off the event loop.

Decoding, encoding and checking JSON is linear, but on a 1 MiB value of tiny objects
each pass takes 15 to 60 ms; several in one step of the event loop kept ``/health`` and every
other client waiting for a tenth of a second or more. Such work runs in two worker
threads shared by all clients (a flood of large values queues there, nothing else
does). A worker still holds the GIL while json's C code runs, but hands it back to the
loop between calls and every few ms of Python, so the loop waits for one pass at most.

Callers await :func:`off_loop` where they would have called the function: what they do
next (send a frame, store a row) still happens in the order they do it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

#: frames and texts longer than this (characters) are worked on off the event loop
LARGE_CHARS = 16 * 1024

_WORKERS = ThreadPoolExecutor(max_workers=2, thread_name_prefix="pedelec-json")

T = TypeVar("T")


async def off_loop(work: Callable[..., T], *args: object) -> T:
    """``work(*args)`` in a worker thread."""
    return await asyncio.get_running_loop().run_in_executor(_WORKERS, work, *args)
