"""Runs ``async def`` tests without plugins, so this suite runs unchanged in CPython and in
Pyodide, whose WebLoop cannot block without JSPI: there, tests/pyodide/run-unit.mjs puts
``noio_loop`` (a timers-only loop) on ``sys.path``."""

from __future__ import annotations

import asyncio
import inspect
import sys
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

run: Callable[[Coroutine[Any, Any, Any]], Any]
if sys.platform == "emscripten":
    from noio_loop import run
else:
    run = asyncio.run


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    names = pyfuncitem._fixtureinfo.argnames
    run(pyfuncitem.obj(**{name: pyfuncitem.funcargs[name] for name in names}))
    return True
