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

from pedelec_pyodide import ApprovalRequest, Session, ToolProgress


class Element(SimpleNamespace):
    """The few DOM element attributes the demo's tools use."""


class LocalStorage:
    """The two ``localStorage`` methods the note tools use."""

    def __init__(self) -> None:
        self.items: dict[str, str] = {}

    def getItem(self, key: str) -> str | None:
        return self.items.get(key)

    def setItem(self, key: str, value: str) -> None:
        self.items[key] = value


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
    fake_js = SimpleNamespace(document=document, localStorage=LocalStorage(),
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


# --- the note list and its interactive tools ----------------------------------------------


def stored_ids() -> list[str]:
    return [note["id"] for note in tools.load_notes()]


def test_notes_start_with_the_defaults_and_add_note_stores_one(page: dict[str, Element]) -> None:
    s = session()
    listed = asyncio.run(s.dispatch("list_notes", {}))["notes"]
    assert [note["text"] for note in listed] == list(tools.DEFAULT_NOTES)
    added = asyncio.run(s.dispatch("add_note", {"text": "Oil the chain."}))
    assert added == {"note": {"id": f"n{len(tools.DEFAULT_NOTES) + 1}", "text": "Oil the chain."}}
    assert stored_ids()[-1] == added["note"]["id"]
    too_long = asyncio.run(s.dispatch("add_note", {"text": "x" * (tools.NOTE_CHARS + 1)}))
    assert too_long["error"]["code"] == "INVALID_ARGS"


def test_add_note_keeps_the_list_bounded(page: dict[str, Element]) -> None:
    tools.store_notes([{"id": f"n{i}", "text": "t"} for i in range(tools.MAX_NOTES)])
    full = asyncio.run(session().dispatch("add_note", {"text": "one more"}))
    assert full["error"]["code"] == "NOTES_FULL"
    assert len(stored_ids()) == tools.MAX_NOTES


def test_a_hand_edited_store_keeps_only_well_formed_notes(page: dict[str, Element]) -> None:
    sys.modules["js"].localStorage.setItem(
        tools.NOTES_KEY, '[{"id": "n7", "text": "ok"}, {"id": 3, "text": "bad"}, "junk"]')
    assert stored_ids() == ["n7"]
    assert asyncio.run(session().dispatch("add_note", {"text": "x"}))["note"]["id"] == "n8"


def test_delete_note_asks_first_and_runs_only_when_approved(page: dict[str, Element]) -> None:
    s = session()
    assert asyncio.run(s.dispatch("delete_note", {"id": "n1"}))["error"]["code"] == "TOOL_DENIED"
    assert "n1" in stored_ids()  # no approver: denied, nothing deleted

    asked: list[ApprovalRequest] = []
    s.on_approval(lambda request: asked.append(request) or request.args["id"] == "n2")
    assert asyncio.run(s.dispatch("delete_note", {"id": "n2"})) == {
        "deleted": "n2", "left": len(tools.DEFAULT_NOTES) - 1}
    denied = asyncio.run(s.dispatch("delete_note", {"id": "n3"}))
    assert denied["error"]["code"] == "TOOL_DENIED"
    assert [(r.tool, r.args) for r in asked] == [("delete_note", {"id": "n2"}),
                                                  ("delete_note", {"id": "n3"})]
    assert "n2" not in stored_ids() and "n3" in stored_ids()

    s.on_approval(lambda request: True)
    missing = asyncio.run(s.dispatch("delete_note", {"id": "n2"}))
    assert missing["error"]["code"] == "NOTE_NOT_FOUND"
    assert missing["error"]["details"]["ids"] == stored_ids()


def test_summarize_notes_reports_progress_per_note(
    page: dict[str, Element], monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tools, "SUMMARY_STEP_SECONDS", 0)
    s = session()
    seen: list[ToolProgress] = []
    s.subscribe(lambda event: isinstance(event, ToolProgress) and seen.append(event))
    result = asyncio.run(s.dispatch("summarize_notes", {}))
    count = len(tools.DEFAULT_NOTES)
    assert [item["id"] for item in result["summaries"]] == [f"n{i}" for i in range(1, count + 1)]
    assert result["summaries"][0]["summary"] == "Pack the rain jacket and the …"
    assert seen, "no progress reported"
    values = [event.progress for event in seen]
    assert values == sorted(values) and len(set(values)) == len(values)
    last = seen[-1]
    assert (last.progress, last.total, last.message) == (count, count,
                                                         f"summarised note {count} of {count}")


async def summarize_then_stop(s: Session) -> Any:
    task = asyncio.ensure_future(s.dispatch("summarize_notes", {}))
    for _ in range(1000):  # bounded: until the first note is summarised
        # one loop: this timer is set before the handler's next step, and is shorter, so
        # it fires first however late both are (the stop lands after the first note)
        await asyncio.sleep(0.001)
        pending = s.pending
        if pending and pending[0].progress is not None:
            break
    assert s.cancel(pending[0].tool_request_id)
    return await asyncio.wait_for(task, 5)


def test_summarize_notes_stops_when_cancelled(
    page: dict[str, Element], monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tools, "SUMMARY_STEP_SECONDS", 0.01)
    result = asyncio.run(summarize_then_stop(session()))
    error = result["error"]
    assert error["code"] == "TOOL_CANCELLED" and error["retryable"] is False
    done = error["details"]["summaries"]
    assert 1 <= len(done) < len(tools.DEFAULT_NOTES)
    assert error["message"] == (f"stopped by the user after {len(done)} of "
                                f"{len(tools.DEFAULT_NOTES)} notes")
