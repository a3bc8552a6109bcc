"""The example notebook of ``pedelec lite``'s site: tools over the notebook's own state,
registered with the Core that serves the site."""

from __future__ import annotations

from typing import Any

__all__ = ["EXAMPLE_NOTEBOOK", "example_notebook"]

#: the example notebook's name in the site's files
EXAMPLE_NOTEBOOK = "pedelec-example.ipynb"

_CELLS: tuple[tuple[str, str], ...] = (
    ("markdown", """\
# pedelec-pyodide in a notebook

The tools below are Python functions over this notebook's state (a shopping list).
`connect` registers them with Core, which serves this site: the agent (Core's offline
agent, or anyone with the admin token through the control API) calls them, and they run
here, in the Pyodide kernel.

The kernel runs in a **Web Worker**: there is no DOM (`js.document` does not exist), so
a tool that touches it gets a `TOOL_HANDLER_ERROR` saying so."""),
    ("code", "%pip install pedelec-pyodide"),
    ("code", """\
import js
from pedelec_pyodide import ToolCall, connect, define_tool

# Core's URL. This works when Core serves this site (`pedelec serve --app SITE`): the
# same origin (js.location is the kernel worker's URL). If the site is served elsewhere,
# put Core's URL here instead, e.g. CORE_URL = "http://127.0.0.1:8765", and start Core
# with --allow-origin set to this site's origin.
CORE_URL = js.location.origin
shopping = []
log = []


@define_tool
def add_item(name: str, quantity: int = 1) -> list:
    \"\"\"Add an item to the notebook's shopping list; returns the list.\"\"\"
    shopping.append({"name": name, "quantity": quantity})
    return shopping


@define_tool
def list_items() -> list:
    \"\"\"The notebook's shopping list.\"\"\"
    return shopping


@define_tool
def page_title() -> str:
    \"\"\"The page's title (needs the DOM, which a notebook kernel has not).\"\"\"
    return js.document.title


def record(event):
    if isinstance(event, ToolCall):
        log.append(f"{event.tool} {event.args} -> {event.result} [{event.handled_by}]")


def show_log():
    print(f"{len(log)} tool call(s)")
    for line in log:
        print(line)"""),
    ("code", """\
session = await connect(CORE_URL, tools=[add_item, list_items, page_title])
session.subscribe(record)
print("session:", session.session_id, session.state.value)"""),
    ("code", """\
reply = await session.send_text('/call add_item {"name": "apples", "quantity": 3}')
print("agent:", reply)"""),
    ("code", """\
result = await session.dispatch("page_title", {})
print("page_title:", result["error"]["code"], "-", result["error"]["message"])"""),
    ("code", """\
print("shopping:", shopping)
show_log()"""),
)


def example_notebook() -> dict[str, Any]:
    """The example notebook (nbformat 4) as a dict."""
    cells: list[dict[str, Any]] = []
    for index, (kind, source) in enumerate(_CELLS):
        cell: dict[str, Any] = {
            "cell_type": kind, "id": f"pedelec-{index}", "metadata": {},
            "source": source.splitlines(keepends=True),
        }
        if kind == "code":
            cell.update(execution_count=None, outputs=[])
        cells.append(cell)
    return {
        "cells": cells,
        "metadata": {
            "kernelspec": {"display_name": "Python (Pyodide)", "language": "python",
                           "name": "python"},
            "language_info": {"name": "python"},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }
