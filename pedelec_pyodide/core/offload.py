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

While these threads and the parse threads work, the cyclic garbage collector is paused
(:class:`CollectorPause`): json makes a container per array or object it reads, and every
few hundred set off a collection, the full ones walking all it has made so far, with the
GIL held. 1 MiB of ``[[],[],...]`` decodes in about half the time without them
(``bench/big_decode.py``), and a page's flood of such frames holds ``/health`` up about a
third as long (docs/records/reliability.md, ``array_frames``).
"""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

#: texts, frames and values longer than this as JSON (characters) are worked on off the
#: event loop
LARGE_CHARS = 16 * 1024

T = TypeVar("T")


class CollectorPause:
    """The cyclic garbage collector paused while Core's threads work on large values.

    The collector is one for the process: it is paused by the first work to begin and
    goes on once none is left (a work begins when the event loop hands it to a thread,
    and ends when the loop has its answer). It is never paused for long, whatever the
    clients send: once ``most_joining`` more works have begun within one pause, the next
    to end ends it, and the works still running go on with the collector, as does every
    work begun until none is left (only then does a new pause begin). A pause so lasts a
    few works at most, each bounded by the frame limit; the cycles left meanwhile are
    collected after it. A collector someone else disabled is left alone."""

    def __init__(self, most_joining: int = 4) -> None:
        self.most_joining = most_joining
        self._lock = threading.Lock()
        self._working = 0
        self._joined = 0
        self._paused = False

    def begin(self) -> None:
        """A work begins (each is ended once with :meth:`end`)."""
        with self._lock:
            self._working += 1
            if self._paused:
                self._joined += 1
            elif self._working == 1 and gc.isenabled():
                gc.disable()
                self._paused, self._joined = True, 0

    def end(self) -> None:
        with self._lock:
            self._working -= 1
            if self._paused and (self._working == 0 or self._joined >= self.most_joining):
                gc.enable()
                self._paused = False

    @contextmanager
    def __call__(self) -> Iterator[None]:
        """One work, the ``with`` block."""
        self.begin()
        try:
            yield
        finally:
            self.end()

    def for_this_step(self) -> None:
        """Paused until the event loop's current step ends: for a library that decodes
        its input on the loop in the step that reads it (the MCP SDK its request body).
        A step's work is bounded by what it was given."""
        self.begin()
        asyncio.get_running_loop().call_soon(self.end)


collector_paused = CollectorPause()


class WorkerThreads:
    """A few threads for work off the event loop. A work waits on the loop for a free
    thread, not in the threads' queue, and the collector is paused once it has one
    (paused from the loop: a frame more in the thread would cost a deeply nested value's
    decode a level of the recursion limit): so a pause counts the works that run, and a
    flood of queued works does not end it early, the collector then going on for the
    flood's every decode."""

    def __init__(self, threads: int, name: str) -> None:
        self._threads = threads
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=name)
        # each event loop's free threads (a test suite runs many loops, one at a time)
        self._free: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop,
                                              asyncio.Semaphore] = weakref.WeakKeyDictionary()

    async def run(self, work: Callable[..., T], *args: object) -> T:
        """``work(*args)`` in one of the threads, the collector paused meanwhile. A caller
        cancelled meanwhile leaves the work to end in its thread, which it holds till then
        (the pause too)."""
        loop = asyncio.get_running_loop()
        free = self._free.get(loop)
        if free is None:
            free = self._free[loop] = asyncio.Semaphore(self._threads)
        await free.acquire()
        collector_paused.begin()
        running = loop.run_in_executor(self._executor, work, *args)

        def ended(_: asyncio.Future[T]) -> None:
            collector_paused.end()
            free.release()

        running.add_done_callback(ended)
        return await asyncio.shield(running)


_JSON_THREADS = WorkerThreads(2, "pedelec-json")


async def off_loop(work: Callable[..., T], *args: object) -> T:
    """``work(*args)`` in one of Core's worker threads (two), the collector paused
    meanwhile."""
    return await _JSON_THREADS.run(work, *args)


async def off_loop_when(large: bool, work: Callable[..., T], *args: Any) -> T:
    """``work(*args)``: off the loop (:func:`off_loop`) when ``large``, else in place (a
    thread hop would cost a small value more than the work)."""
    return await off_loop(work, *args) if large else work(*args)


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
