"""Runs ``async def`` tests without plugins, so this suite runs unchanged in CPython and in
Pyodide (whose WebLoop cannot block in ``run_until_complete`` without JSPI)."""

from __future__ import annotations

import asyncio
import inspect
import sys
import time
from collections.abc import Coroutine
from typing import Any

import pytest


class _TimersOnlySelector:
    """A selector for a loop with no I/O: waiting for the next timer is just sleeping."""

    def select(self, timeout: float | None) -> list[Any]:
        if timeout:
            time.sleep(min(timeout, 0.05))
        return []


class TimersOnlyLoop(asyncio.BaseEventLoop):
    """Enough of an event loop for tests that only use tasks, futures and timers."""

    def __init__(self) -> None:
        super().__init__()
        self._selector = _TimersOnlySelector()

    def _process_events(self, event_list: list[Any]) -> None:
        pass

    def _write_to_self(self) -> None:
        pass


def run(coroutine: Coroutine[Any, Any, Any]) -> Any:
    if sys.platform == "emscripten":
        with asyncio.Runner(loop_factory=TimersOnlyLoop) as runner:
            return runner.run(coroutine)
    return asyncio.run(coroutine)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    names = pyfuncitem._fixtureinfo.argnames
    run(pyfuncitem.obj(**{name: pyfuncitem.funcargs[name] for name in names}))
    return True
