"""An outside review of the performance pass on Core's hot path: what it must not have
broken (see docs/explanation/performance.md)."""

from __future__ import annotations

import json

import pytest

from pedelec_pyodide.core.sessions.turns import appended_history


@pytest.mark.parametrize("kept", ["[ ]", "[]\n", ' [{"turn_id": "t0"}] ', '[{"turn_id": "t0"}\n]'])
def test_appending_to_a_kept_history_not_in_compact_form_stays_json(kept: str) -> None:
    """A stored history is taken as any JSON list of objects (store/rows.py), so it may
    hold whitespace (a row written by hand or by another tool). Appending the offline
    agent's entry as text must still give JSON, or the session's row is damaged at the
    next start and the session lost."""
    new = [{"agent": "offline", "turn_id": "t1", "user": "hi"}]
    appended = appended_history(kept, new, 10_000)
    assert appended is not None
    assert json.loads(appended) == json.loads(kept) + new
