"""The demo's tools (web/demo/tools.py) under plain CPython pytest: the module the page
runs, imported as a module (``web/demo`` is on pytest's ``pythonpath``, see pyproject.toml),
with a stand-in for the browser's ``js`` module. Each test drives a tool through
``Session.dispatch``, exactly as a request from Core would run it (schema, handler, result
rules), on the event loop of ``asyncio.run``."""

from __future__ import annotations

import asyncio
import sys
from types import SimpleNamespace
from typing import Any

import pytest
import tools  # web/demo/tools.py

from pedelec_pyodide import Session


class Element(SimpleNamespace):
    """The few DOM element attributes the demo's tools use."""


@pytest.fixture
def page(monkeypatch: pytest.MonkeyPatch) -> dict[str, Element]:
    """A stand-in ``js`` module: what ``tools.page()`` imports in the browser."""
    elements = {
        "counter-value": Element(dataset=SimpleNamespace(value="0"), textContent="0"),
        "editor": Element(value="one two\n\nthree", selectionStart=0, selectionEnd=3),
        "doc-title": Element(value="Trip notes"),
        "save-state": Element(textContent=""),
    }
    document = SimpleNamespace(title="Pedelec Notes", getElementById=elements.__getitem__)
    fake_js = SimpleNamespace(document=document,
                              location=SimpleNamespace(href="http://127.0.0.1:8765/"))
    monkeypatch.setitem(sys.modules, "js", fake_js)
    return elements


def session() -> Session:
    s = Session()
    tools.register(s)
    return s


def test_importing_the_module_needs_no_page() -> None:
    assert "js" not in vars(tools) and "session" not in vars(tools)
    assert {tool.name for tool in tools.TOOLS} == set(session().tools)


def test_update_counter_through_dispatch(page: dict[str, Element]) -> None:
    s = session()
    assert asyncio.run(s.dispatch("update_counter", {"delta": 2})) == {"value": 2}
    assert page["counter-value"].textContent == "2"
    # a Session holds no event loop: another asyncio.run may use it (nothing in flight)
    assert asyncio.run(s.dispatch("update_counter", {"delta": -5})) == {"value": -3}


@pytest.mark.parametrize("delta", [99999999999999999999999, 2**53, -(2**53), 1.5, "2"])
def test_update_counter_refuses_deltas_the_counter_cannot_hold_exactly(
    page: dict[str, Element], delta: Any,
) -> None:
    call = asyncio.run(session().run_request("update_counter", {"delta": delta}))
    assert call.result["error"]["code"] == "INVALID_ARGS"
    assert call.handled_by == "none"  # the handler never ran
    assert page["counter-value"].textContent == "0"


def test_update_counter_keeps_the_counter_in_range(page: dict[str, Element]) -> None:
    page["counter-value"].dataset.value = str(tools.SAFE_INTEGER)
    result = asyncio.run(session().dispatch("update_counter", {"delta": 1}))
    assert result["error"]["code"] == "COUNTER_OUT_OF_RANGE"
    assert page["counter-value"].dataset.value == str(tools.SAFE_INTEGER)


async def save_and_read(s: Session) -> tuple[Any, Any]:
    return await s.dispatch("save_document", {}), await s.dispatch("get_selection", {})


def test_async_and_erroring_tools(page: dict[str, Element]) -> None:
    saved, selection = asyncio.run(save_and_read(session()))
    assert saved["id"].startswith("doc-")
    assert page["save-state"].textContent.startswith("Saved ")
    assert selection == {"text": "one", "start": 0, "end": 3}
    page["editor"].value = "no empty line"  # word_stats divides by the empty lines
    broken = asyncio.run(session().dispatch("word_stats", {}))
    assert broken["error"]["code"] == "TOOL_HANDLER_ERROR"
