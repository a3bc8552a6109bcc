"""A tiny asyncio event loop for running ``async def`` tests inside Pyodide under Node.

Why: Pyodide's ``WebLoop`` cannot block in ``run_until_complete`` without JSPI
(WebAssembly stack switching), which Node 20 does not offer, so ``asyncio.run()``
fails there with ``RuntimeError: WebAssembly stack switching not supported in this
JavaScript runtime``. Pyodide also installs its ``WebLoop`` as the *running* loop for
all top-level code, so even ``asyncio.Runner(loop_factory=...)`` refuses to start
("Cannot run the event loop while another loop is running") unless the running loop is
cleared first. This module does both: a loop with no I/O whose "selector" just sleeps
until the next timer is due, and a ``run()`` that clears Pyodide's running loop for
the duration and restores it afterwards.

Verified inside Pyodide 314.0.6 (CPython 3.14.2) under Node 20 (see
tests/pyodide/run-unit.mjs): asyncio.sleep (real time passes; waits use
``Atomics.wait``, which blocks without burning CPU under Node, unlike ``time.sleep``,
which busy-waits there), create_task, gather, Event, Queue, Future + call_later,
call_soon, wait_for timeout (TimeoutError), asyncio.timeout(), task.cancel(),
TaskGroup, exceptions propagating out of run(), several run() calls in a row, and the
WebLoop being the running loop again afterwards. What does NOT work (no threads in
Pyodide): ``loop.run_in_executor`` / ``asyncio.to_thread`` raise
``RuntimeError: can't start new thread``. No sockets/subprocesses (there is no I/O).

Copy into the conftest (stdlib only, works in CPython too), e.g.::

    if sys.platform == "emscripten":
        from noio_loop import run   # or paste the code
        result = run(coro)
"""

from __future__ import annotations

import asyncio
import asyncio.base_events
import asyncio.events
import contextlib
import sys
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

_T = TypeVar("_T")


def _make_sleep() -> Callable[[float], None]:
    """``time.sleep`` spins a CPU core in Pyodide under Node (a 2 s sleep costs 2 s of
    CPU); ``Atomics.wait`` blocks for free where JS allows it (Node, Web Workers; a
    browser's main thread forbids it). Use it when it works, else time.sleep."""
    if sys.platform != "emscripten":
        return time.sleep
    try:
        from js import Atomics, Int32Array, SharedArrayBuffer  # type: ignore[import-not-found]

        cell = Int32Array.new(SharedArrayBuffer.new(4))
        Atomics.wait(cell, 0, 0, 0)  # raises where blocking is not allowed
    except Exception:
        return time.sleep

    def atomics_sleep(seconds: float) -> None:
        Atomics.wait(cell, 0, 0, seconds * 1000.0)

    return atomics_sleep


class _SleepSelector:
    """Stands in for a selector: nothing to wait for except time."""

    def __init__(self) -> None:
        self._sleep = _make_sleep()

    def select(self, timeout: float | None = None) -> list[Any]:
        if timeout is not None and timeout > 0:
            self._sleep(timeout)
        # timeout None means "no timers and nothing ready": with no I/O nothing could
        # ever wake us, so return at once (the loop then spins; only a coroutine that
        # waits forever on something no task will set does that, and it would hang
        # under any loop)
        return []

    def close(self) -> None:
        pass


class NoIOEventLoop(asyncio.base_events.BaseEventLoop):
    """A BaseEventLoop with no I/O: timers, callbacks, tasks and futures only."""

    def __init__(self) -> None:
        super().__init__()
        self._selector = _SleepSelector()

    def _process_events(self, event_list: list[Any]) -> None:
        pass

    def _write_to_self(self) -> None:
        pass


@contextlib.contextmanager
def _no_running_loop() -> Iterator[None]:
    """Hide Pyodide's WebLoop (always 'running' at top level) while our loop runs."""
    saved = asyncio.events._get_running_loop()
    asyncio.events._set_running_loop(None)
    try:
        yield
    finally:
        asyncio.events._set_running_loop(saved)


def run(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run ``coro`` to completion on a fresh NoIOEventLoop (like ``asyncio.run``)."""
    with _no_running_loop(), asyncio.Runner(loop_factory=NoIOEventLoop) as runner:
        return runner.run(coro)
