"""The one interface Core's session, turn and request logic uses, whatever the backend."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from .leases import Renewal
from .records import (
    RECENT_TURNS,
    IdempotencyRecord,
    RequestRecord,
    SessionRecord,
    Snapshot,
    TurnRecord,
)


class Store(Protocol):
    """Writes are queued (``save_*`` and ``delete_*`` never block and never raise) and
    stored in order; ``flush`` waits for them. See docs/reference/server.md, "The store"."""

    #: whether what is stored outlives the process
    durable: bool
    #: other Core processes use it too (Redis): a session may be held by another node
    shared: bool
    #: what the store is, safe to log (a URL without its password)
    label: str

    @property
    def problem(self) -> str | None:
        """Why the store is not storing (health reports ``degraded``), or None."""

    @property
    def unavailable(self) -> bool:
        """The store cannot be reached at all: the control API answers 503."""

    async def load(self) -> Snapshot:
        """Every stored record that makes sense; a damaged one is skipped with a warning."""

    async def load_session(self, session_id: str) -> Snapshot:
        """One session's stored records, as :meth:`load` gives them (empty if it has
        none): what a node taking over a session another node held needs."""

    async def load_session_record(self, session_id: str) -> SessionRecord | None:
        """The session's own stored row (its tools), without its requests, turns or
        keys, or None: what a node serving another node's page reads, on each MCP call
        of the per-request protocol (its tool's input schema), so it costs the same
        however many results and keys the session keeps."""

    def save_session(self, record: SessionRecord) -> None: ...

    def save_tools(self, record: SessionRecord) -> None:
        """The session's tools alone (a ``tools.update``): what changed, not its row."""

    def save_history(self, record: SessionRecord) -> None:
        """The session's row but its tools (a turn's end: the agent's history)."""

    def delete_session(self, session_id: str) -> None:
        """The session with its requests, turns and idempotency keys."""

    def save_request(self, record: RequestRecord) -> None: ...

    def delete_request(self, session_id: str, request_id: str) -> None: ...

    def save_turn(self, record: TurnRecord) -> None: ...

    def mark_end_delivered(self, session_id: str, turn_id: str) -> None:
        """The page has had the turn's end (a turn not stored stays so)."""

    def save_key(self, record: IdempotencyRecord) -> None: ...

    def delete_key(self, session_id: str, key_hash: str) -> None: ...

    def prune_turns(self, keep: int = RECENT_TURNS) -> None:
        """Delete each session's ended turns past its ``keep`` latest, but none that is
        running, whose end the page has not had, or that an idempotency key names."""

    async def flush(self, *keys: str, timeout: float | None = None) -> None:
        """Return once every write queued before is stored, within ``timeout`` seconds
        (default: the store's); raise :class:`~.errors.StoreError` past that, or if a
        write of one of ``keys`` failed since their last flush."""

    # --- leases: which node holds a page's socket (they are not queued: each answers) ---
    # Each of these raises only StoreErrors: StoreUnavailable if the store cannot be
    # reached, StoreRefused if it refused the command.

    async def claim(self, session_id: str, node: str, ttl: float) -> str | None:
        """Give ``node`` the session's lease for ``ttl`` seconds; the node that held it
        until now (a live lease of another node, or ``node`` itself), or None."""

    async def renew(self, session_ids: list[str], node: str, ttl: float) -> Renewal:
        """Extend ``node``'s leases of ``session_ids`` by ``ttl`` seconds (one nobody holds,
        expired or lost, is taken again: ``retaken``); the ids another node holds are
        left untouched (``lost``)."""

    async def release(self, session_id: str, node: str) -> None:
        """Drop the session's lease if ``node`` holds it (another node's stays)."""

    async def holder(self, session_id: str) -> str | None:
        """The node holding the session's lease, or None."""

    async def holders(self, session_ids: list[str]) -> list[str | None]:
        """:meth:`holder` of each (in as few round trips as the store allows)."""

    async def unstored(self, session_ids: list[str]) -> list[str]:
        """Those of ``session_ids`` whose own row the store does not hold (a load would
        not find them): what a Redis restarted without its data lost of a node's live
        sessions. Raises as a lease does."""

    # --- messages between the nodes of a cluster -------------------------------------

    async def publish(self, node: str, message: str) -> int:
        """Send ``message`` to ``node``'s inbox (pub/sub: lost if nobody listens); how
        many inboxes it reached."""

    def inbox(self, node: str) -> AsyncIterator[str]:
        """The messages published to ``node`` from now on; a store out of reach, or one
        refusing, is waited for (a message sent meanwhile is lost)."""

    async def close(self, timeout: float | None = None) -> None:
        """Store what is queued (at most ``timeout`` seconds) and let go of the store."""
