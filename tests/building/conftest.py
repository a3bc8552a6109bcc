"""The build tests' fixtures."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest


@pytest.fixture
def no_subprocess(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Fail loudly if npm or pip would be run; records the attempted commands."""
    calls: list[list[str]] = []

    def fake_run(command: list[str], *args: Any, **kwargs: Any) -> Any:
        calls.append(command)
        raise AssertionError(f"unexpected subprocess: {command}")

    monkeypatch.setattr(subprocess, "run", fake_run)
    return calls
