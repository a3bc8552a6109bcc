"""Fixtures shared by Core's tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from storekit import RedisServer


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A real redis-server of the test's own, stopped (and its files removed) after it."""
    workdir = tmp_path / "redis"
    workdir.mkdir()
    server = RedisServer(workdir)
    server.start()
    try:
        yield server
    finally:
        server.stop()
