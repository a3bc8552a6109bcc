"""The closed sets page and Core share (session states, request statuses, handler tiers,
turn statuses, request sources) and the paths they both name are spelled once in Python,
in ``protocol`` (and ``context.Source``); the hand-written JS loader and its TypeScript
declarations spell them again, and are read here so that they cannot drift."""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_args

import pytest

from pedelec_pyodide import protocol
from pedelec_pyodide.context import Source

WEB = Path(__file__).resolve().parents[2] / "web"
DTS = (WEB / "pedelec-pyodide.d.ts").read_text(encoding="utf-8")
LOADER = (WEB / "pedelec-pyodide.js").read_text(encoding="utf-8")


def union(text: str) -> set[str]:
    """The string literals of a TypeScript union, ``"a" | "b"``."""
    parts = [part.strip() for part in text.split("|")]
    assert all(re.fullmatch(r'"[a-z_.]+"', part) for part in parts), text
    return {part.strip('"') for part in parts}


def declared_type(name: str) -> set[str]:
    found = re.search(rf"^export type {name} = ([^;]+);$", DTS, re.MULTILINE)
    assert found, f"the .d.ts declares no type {name}"
    return union(found.group(1))


@pytest.mark.parametrize(("name", "values"), [
    ("SessionState", protocol.SESSION_STATES),
    ("PendingStatus", protocol.PENDING_STATUSES),
    ("HandledBy", protocol.HANDLED_BY),
    ("ToolSource", get_args(Source)),
])
def test_the_declarations_unions_are_the_protocols(name: str, values: tuple[str, ...]) -> None:
    assert declared_type(name) == set(values)


def test_the_declared_turn_end_status_is_the_protocols() -> None:
    found = re.search(r"interface TurnEndDetail \{[^}]*?\bstatus: ([^;]+);", DTS)
    assert found
    assert union(found.group(1)) == set(protocol.TURN_STATUSES)


def test_the_loaders_session_states_are_the_protocols() -> None:
    documented = re.search(r"/\*\* ((?:[a-z_]+ \| )+[a-z_]+) \*/\s*this\._state = \"([a-z_]+)\"",
                           LOADER)
    assert documented, "the loader's session documents its states beside this._state"
    assert set(documented.group(1).split(" | ")) == set(protocol.SESSION_STATES)
    assert documented.group(2) == "connecting" and "connecting" in protocol.SESSION_STATES


def test_the_loaders_pending_statuses_are_the_protocols() -> None:
    documented = re.search(r"status\s+\*?\s*((?:`[a-z_]+` \| )+`[a-z_]+`)", LOADER)
    assert documented, "the loader's pending getter documents the statuses"
    assert ({part.strip("`") for part in documented.group(1).split(" | ")}
            == set(protocol.PENDING_STATUSES))


def test_the_loader_asks_core_where_core_answers() -> None:
    """The loader's admission and Python's check_origin ask the one rule, Core's, at the
    path Core serves it (protocol.ORIGIN_CHECK_PATH)."""
    assert f'new URL("{protocol.ORIGIN_CHECK_PATH}", config.core)' in LOADER
