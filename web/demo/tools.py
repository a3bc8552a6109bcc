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
import json
import re
import uuid
from datetime import UTC, datetime

from pedelec_pyodide import ToolContext, ToolError, define_tool
from pedelec_pyodide.results import TOOL_CANCELLED

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


# --- the note list: kept in the page's localStorage, so it survives a reload -------------

#: localStorage key of the note list (JSON: ``[{"id", "text"}]``); app.js renders it
NOTES_KEY = "pedelec-demo:notes"
#: bounds of the list, so a chatty agent cannot fill the page's storage
MAX_NOTES = 50
NOTE_CHARS = 500
#: the note list's ids are short: refuse long ones before any lookup
NOTE_ID_CHARS = 16
NOTE_ID = re.compile(r"n[0-9]{1,9}")
#: a summary is the note's first words
SUMMARY_WORDS = 6
#: summarize_notes' time per note: stands in for a model call, and lets a person watch the
#: bar and press Stop
SUMMARY_STEP_SECONDS = 0.8

DEFAULT_NOTES = (
    "Pack the rain jacket and the spare inner tube.",
    "Check the bike battery: 80% is enough for the hill.",
    "Book the campsite by the lake for two nights.",
    "Buy bread, cheese and apples at the market on Saturday.",
    "Ask Sam to water the plants while we are away.",
)


def load_notes():
    """The note list; the defaults on a first visit (or if the stored value is not a list)."""
    stored = page().localStorage.getItem(NOTES_KEY)
    if isinstance(stored, str):  # JS null arrives as pyodide's JsNull, not None
        try:
            notes = json.loads(stored)
        except ValueError:
            notes = None
        if isinstance(notes, list):  # edited by hand? keep only well-formed notes
            return [note for note in notes if isinstance(note, dict)
                    and isinstance(note.get("id"), str) and isinstance(note.get("text"), str)]
    return [{"id": f"n{number}", "text": text}
            for number, text in enumerate(DEFAULT_NOTES, start=1)]


def store_notes(notes):
    page().localStorage.setItem(NOTES_KEY, json.dumps(notes))


@define_tool(annotations={"readOnlyHint": True})
def list_notes() -> dict:
    """List the notes (each with its id and text)."""
    return {"notes": load_notes()}


def add_note(args):
    notes = load_notes()
    if len(notes) >= MAX_NOTES:
        raise ToolError("NOTES_FULL", f"the list holds at most {MAX_NOTES} notes; delete one first",
                        details={"count": len(notes)})
    number = 1 + max((int(note["id"][1:]) for note in notes
                      if NOTE_ID.fullmatch(note["id"])), default=0)
    note = {"id": f"n{number}", "text": args["text"]}
    store_notes([*notes, note])
    return {"note": note}


add_note_tool = define_tool(
    name="add_note",
    description="Add a note (text) to the note list; returns the new note with its id.",
    args_schema={
        "type": "object",
        "properties": {"text": {"type": "string", "minLength": 1, "maxLength": NOTE_CHARS}},
        "required": ["text"],
        "additionalProperties": False,
    },
    handler=add_note,
)


def delete_note(args):
    notes = load_notes()
    kept = [note for note in notes if note["id"] != args["id"]]
    if len(kept) == len(notes):
        raise ToolError("NOTE_NOT_FOUND", f"there is no note {args['id']}",
                        details={"ids": [note["id"] for note in notes]})
    store_notes(kept)
    return {"deleted": args["id"], "left": len(kept)}


delete_note_tool = define_tool(
    name="delete_note",
    description="Delete the note with this id (asks the user first).",
    args_schema={
        "type": "object",
        "properties": {"id": {"type": "string", "minLength": 1, "maxLength": NOTE_ID_CHARS}},
        "required": ["id"],
        "additionalProperties": False,
    },
    handler=delete_note,
    needs_approval=True,  # destructive: the page shows an approval card (app.js)
    annotations={"destructiveHint": True},
)


@define_tool(annotations={"readOnlyHint": True})
async def summarize_notes(ctx: ToolContext) -> dict:
    """Summarise every note, one by one (reports progress; the user can stop it)."""
    notes = load_notes()
    summaries = []
    for done, note in enumerate(notes, start=1):
        await asyncio.sleep(SUMMARY_STEP_SECONDS)  # stands in for a model call per note
        if ctx.cancelled:  # the user pressed Stop: say so, with the work done so far
            raise ToolError(TOOL_CANCELLED,
                            f"stopped by the user after {len(summaries)} of {len(notes)} notes",
                            details={"summaries": summaries}, retryable=False)
        words = note["text"].split()
        summary = " ".join(words[:SUMMARY_WORDS]) + (" …" if len(words) > SUMMARY_WORDS else "")
        summaries.append({"id": note["id"], "summary": summary})
        ctx.progress(done, len(notes), f"summarised note {done} of {len(notes)}")
    return {"summaries": summaries}


TOOLS = (get_current_page, update_counter_tool, get_selection, save_document, word_stats,
         list_notes, add_note_tool, delete_note_tool, summarize_notes)


def register(session):
    """Add the demo's tools to ``session`` (the page's, or a test's ``Session()``)."""
    for tool in TOOLS:
        session.add_tool(tool)
