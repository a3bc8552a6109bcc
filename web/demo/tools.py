"""The demo's tools: all Python, all running in this page. `session` is given by the loader."""

import asyncio
import uuid
from datetime import UTC, datetime

import js

from pedelec_pyodide import ToolError, define_tool


def element(element_id):
    return js.document.getElementById(element_id)


@define_tool(annotations={"readOnlyHint": True})
def get_current_page() -> dict:
    """Read the current page title and URL."""
    return {"title": js.document.title, "url": js.location.href}


@define_tool
def update_counter(delta: int) -> dict:
    """Add delta (may be negative) to the counter shown on the page; returns the new value."""
    output = element("counter-value")
    value = int(output.dataset.value) + delta
    output.dataset.value = str(value)
    output.textContent = str(value)
    return {"value": value}


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


for tool in (get_current_page, update_counter, get_selection, save_document, word_stats):
    session.add_tool(tool)
