"""Where Core writes what a restart (or another Core process) needs: sessions, resume-token
hashes, turns, pending requests, kept results and idempotency keys.

One interface (:class:`Store`), three backends chosen by ``--store``'s URL in
:func:`open_store`: ``memory`` (keeps nothing), an SQLite file (one durable process) and
Redis (several processes). Core's session, turn and request logic sees only the interface.
Writes are queued and never block; ``await store.flush(*keys)`` returns once everything
queued before it is stored: Core flushes before it sends a tool request, so a request a
page may run is always stored. The queue, shared by the durable backends: :mod:`.writer`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from ..clock import Clock
from ..log import log_event
from .errors import (
    STORE_FAILED,
    STORE_UNAVAILABLE,
    FlushTimeout,
    StoreError,
    StoreUnavailable,
    WriteFailed,
    WriterStopped,
)
from .interface import Store
from .leases import Renewal
from .memory import MemoryStore
from .records import (
    CORE_CALL,
    KEY_KINDS,
    PRUNE_SECONDS,
    RECENT_TURNS,
    TOOL_CALL,
    TURN,
    IdempotencyRecord,
    JsonText,
    KeyKind,
    RequestRecord,
    SessionRecord,
    Snapshot,
    TurnRecord,
    as_text,
    char_width,
    dump_json,
    hash_token,
    kept_json,
    kept_size,
    turn_key,
)
from .sqlite import SQLiteStore
from .writer import DEFAULT_STORE_TIMEOUT

__all__ = [
    "CORE_CALL", "DEFAULT_STORE_TIMEOUT", "KEY_KINDS", "PRUNE_SECONDS", "RECENT_TURNS",
    "STORE_FAILED",
    "STORE_UNAVAILABLE", "TOOL_CALL", "TURN", "FlushTimeout", "IdempotencyRecord", "JsonText",
    "KeyKind", "MemoryStore", "Renewal", "RequestRecord", "SQLiteStore", "SessionRecord",
    "Snapshot", "Store", "StoreError", "StoreSpec", "StoreUnavailable", "TurnRecord",
    "WriteFailed", "WriterStopped", "as_text", "char_width", "check_reachable", "dump_json",
    "hash_token", "kept_json", "kept_size", "open_store", "parse_store", "turn_key",
]

SQLITE_SCHEME = "sqlite:"


@dataclass(frozen=True)
class StoreSpec:
    """What ``--store`` names: ``memory``, an SQLite file (a path, or ``sqlite:PATH``)
    or a Redis server (``redis://[:PASSWORD@]HOST[:PORT][/DB]``, or ``rediss://``)."""

    kind: Literal["memory", "sqlite", "redis"]
    target: str  # the SQLite file's path, the Redis URL; "" for memory

    @property
    def label(self) -> str:
        """What to call it in a message or a log: no password."""
        if self.kind == "redis":
            from .redis import public_url

            return public_url(self.target)
        return self.target or self.kind


def parse_store(url: str) -> StoreSpec:
    """The backend ``url`` names; ``ValueError`` (saying why) for one that names none."""
    if url == "memory":
        return StoreSpec("memory", "")
    scheme = urlsplit(url).scheme.lower() if "://" in url else ""
    if scheme in ("redis", "rediss"):
        # redis-py takes 0.15 s or more to import: only when a Redis URL is given
        from .redis import check_url

        check_url(url)
        return StoreSpec("redis", url)
    if url.startswith(SQLITE_SCHEME):
        path = url[len(SQLITE_SCHEME):].removeprefix("//")
    elif scheme:
        raise ValueError(f"{scheme}:// is not a store: use memory, a file path, "
                         "sqlite:PATH or redis://HOST:PORT/DB")
    else:
        path = url
    if not path:
        raise ValueError("the SQLite store's path is empty")
    return StoreSpec("sqlite", str(Path(path).expanduser()))


async def check_reachable(url: str, timeout: float = DEFAULT_STORE_TIMEOUT,
                          clock: Clock | None = None) -> None:
    """Raise :class:`StoreUnavailable` if the store ``url`` names cannot be reached within
    ``timeout`` seconds (Core checks before it announces its URL; a file is opened then)."""
    spec = parse_store(url)
    if spec.kind == "redis":
        from .redis import RedisStore

        store = RedisStore(spec.target, timeout, clock=clock)
        try:
            await store.reachable()
        finally:
            await store.close(timeout)


def open_store(url: str, timeout: float = DEFAULT_STORE_TIMEOUT,
               cluster_secret: str | None = None, clock: Clock | None = None) -> Store:
    """The store ``url`` names (see :func:`parse_store`), on Core's ``clock`` (the
    system's by default); an SQLite
    file is created ``0600`` when missing; Redis is connected to when first used, its
    messages between nodes sealed with ``cluster_secret`` (a store of one process has no
    use for it)."""
    spec = parse_store(url)
    if spec.kind == "memory":
        return MemoryStore(clock)
    if spec.kind == "redis":
        from .redis import RedisStore

        if cluster_secret is None:
            log_event("cluster.unauthenticated", level=logging.WARNING, hint=(
                "no --cluster-secret: any client that can publish on this Redis can act "
                "as a node of the cluster (set PEDELEC_CLUSTER_SECRET on every node)"))
        return RedisStore(spec.target, timeout, cluster_secret, clock)
    return SQLiteStore(spec.target, timeout, clock)
