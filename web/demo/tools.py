"""The demo's tools: all Python, all running in this page.

One module for the page and for plain pytest (tests/demo/test_demo_tools.py):

- the page loads it as a ``src=`` block, which runs in the blocks' namespace (not as a
  module); the next block calls ``register(session)``;
- pytest imports it (``import tools``, with ``web/demo`` on pytest's ``pythonpath``) and
  calls ``register(Session())``.

So nothing runs at import time that needs the page: ``session`` is never a global here,
and ``js`` (the browser) is imported inside the functions that touch the DOM.
"""

import asyncio
import uuid
from datetime import UTC, datetime

from pedelec_pyodide import ToolError, define_tool

#: the counter is also a JS number (its +/- buttons): beyond this an integer is not exact
SAFE_INTEGER = 2**53 - 1


def page():
    """The browser's ``js`` module (the page's globals); a test puts a stand-in in sys.modules."""
    import js

    return js


def element(element_id):
    return page().document.getElementById(element_id)


@define_tool(annotations={"readOnlyHint": True})
def get_current_page() -> dict:
    """Read the current page title and URL."""
    js = page()
    return {"title": js.document.title, "url": js.location.href}


def update_counter(args):
    output = element("counter-value")
    current, delta = int(output.dataset.value), int(args["delta"])
    value = current + delta
    if abs(value) > SAFE_INTEGER:
        raise ToolError("COUNTER_OUT_OF_RANGE",
                        f"{current} + {delta} leaves the counter's range ±{SAFE_INTEGER}",
                        details={"value": current})
    output.dataset.value = str(value)
    output.textContent = str(value)
    return {"value": value}


update_counter_tool = define_tool(
    name="update_counter",
    description="Add delta (may be negative) to the counter shown on the page; "
                "returns the new value.",
    args_schema={
        "type": "object",
        "properties": {"delta": {"type": "integer", "minimum": -SAFE_INTEGER,
                                 "maximum": SAFE_INTEGER}},
        "required": ["delta"],
        "additionalProperties": False,
    },
    handler=update_counter,
)


@define_tool(annotations={"readOnlyHint": True})
def get_selection() -> dict:
    """Read the text selected in the notes editor."""
    editor = element("editor")
    start, end = editor.selectionStart, editor.selectionEnd
    if start == end:
        raise ToolError("NO_SELECTION", "There is no active editor selection.",
                        details={"documentId": "notes"})
    return {"text": editor.value[start:end], "start": start, "end": end}


@define_tool(annotations={"idempotentHint": True})
async def save_document() -> dict:
    """Save the notes (title and text); returns the saved document's id and time."""
    state = element("save-state")
    state.textContent = "Saving…"
    await asyncio.sleep(0.4)  # stands in for the round trip to a storage API
    saved_at = datetime.now(UTC).isoformat(timespec="seconds")
    doc_id = "doc-" + uuid.uuid5(uuid.NAMESPACE_URL, element("doc-title").value).hex[:8]
    state.textContent = f"Saved {saved_at[11:19]} UTC as {doc_id}"
    return {"id": doc_id, "savedAt": saved_at}


@define_tool
def word_stats() -> dict:
    """Count the words per line of the notes (deliberately broken: shows TOOL_HANDLER_ERROR)."""
    lines = element("editor").value.splitlines()
    empty = [line for line in lines if not line.strip()]
    return {"wordsPerLine": sum(len(line.split()) for line in lines) / len(empty)}


TOOLS = (get_current_page, update_counter_tool, get_selection, save_document, word_stats)


def register(session):
    """Add the demo's tools to ``session`` (the page's, or a test's ``Session()``)."""
    for tool in TOOLS:
        session.add_tool(tool)
