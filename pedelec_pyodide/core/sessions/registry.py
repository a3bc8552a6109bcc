"""Every session one Core process holds, by id, and each client's share of them.

Memory is bounded per session, per client and in all: ``max_sessions`` in all and
``max_sessions_per_client`` per client address (a new page may take the place of its own
client's session disconnected longest, never another client's), metadata as JSON text
of at most ``max_metadata_bytes``, ``max_pending`` requests, the texts of ended turns;
the agent's history is bounded in turns.py.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import secrets
from collections import OrderedDict
from collections.abc import Callable

from ..agents.contract import Agent
from ..background import spawn
from ..clock import wait, wait_for
from ..config import BURST_SECONDS, READ_BURST_SECONDS, CoreConfig
from ..log import log_event
from ..page.clients import Arrivals, ClientBudgets
from ..page.outboxes import Outboxes
from ..store import SessionRecord, Snapshot, Store, StoreError, hash_token
from .codes import SHUTDOWN_SECONDS, TOO_MANY_SESSIONS
from .metadata import PageMetadata, SessionRefused
from .session import CoreSession

# What a wrong resume token is compared with when the session is unknown: the same
# work as for a known one, so timing says nothing about which sessions exist.
NO_SESSION_HASH = hash_token("")


class ClientSessions:
    """One client's sessions here: how many it holds, and which of them await a resume
    (the longest disconnected first)."""

    __slots__ = ("held", "waiting")

    def __init__(self) -> None:
        self.held = 0
        self.waiting: OrderedDict[str, CoreSession] = OrderedDict()


class Registry:
    """Every session Core knows, by id; on a shared store (Redis), every session this
    node holds a lease on (the leases themselves are :class:`~..cluster.Leases`)."""

    def __init__(self, config: CoreConfig, store: Store, agent_factory: Callable[[], Agent],
                 restore: Callable[[Registry, Snapshot], None]) -> None:
        self.config = config
        self.store = store
        self.agent_factory = agent_factory
        # rebuilds sessions and their turns from the store (turns.restore: turns.py builds
        # on this package, so it is handed in rather than imported)
        self._restore = restore
        self.sessions: dict[str, CoreSession] = {}
        # each client's sessions here (restored ones nobody resumed yet count for none)
        self.clients: dict[str, ClientSessions] = {}
        # bytes queued for all connections, and each client's budget for new patterns
        self.outboxes = Outboxes(config.max_queued_total_bytes)
        # connections that have not said hello yet, bounded as sessions are
        self.arrivals = Arrivals(config.max_sessions_per_client, config.max_sessions)
        self.metadata = ClientBudgets(config.metadata_rate, BURST_SECONDS
                                      * config.metadata_rate, config.clock)
        self.patterns = ClientBudgets(config.pattern_rate, BURST_SECONDS
                                       * config.pattern_rate, config.clock)
        self.reading = ClientBudgets(config.read_rate, READ_BURST_SECONDS * config.read_rate,
                                     config.clock)
        # this process's name as a node of the cluster sharing the store (Redis): the
        # holder of its sessions' leases (cluster.Node does the rest)
        self.node = secrets.token_hex(8)
        # told of every change of a session's tools, by its id (the MCP relay, for other
        # nodes)
        self.on_tools_changed: Callable[[str], None] | None = None
        #: the server has begun to stop: a streamed call it cancels then ends CORE_STOPPING
        self.stopping = False

    def create(self, metadata: PageMetadata, client: str,
               session_id: str | None = None) -> CoreSession:
        """A new session for ``client`` (its id ``session_id``, from
        :meth:`~..cluster.Leases.new_session_id`, if given); :class:`SessionRefused` when
        Core holds ``max_sessions``, or the client ``max_sessions_per_client``, and no
        session of this client awaits a resume (else the one of them disconnected longest
        is expired to make room: another client's session never is)."""
        config = self.config
        mine = self.clients.get(client)
        while mine is not None and mine.waiting and (
                len(self.sessions) >= config.max_sessions
                or mine.held >= config.max_sessions_per_client):
            _, oldest = mine.waiting.popitem(last=False)
            log_event("session.evicted", session=oldest.id, sessions=len(self.sessions),
                      client=client)
            oldest.expire()
            mine = self.clients.get(client)
        if len(self.sessions) >= config.max_sessions:
            log_event("session.refused", sessions=len(self.sessions), client=client)
            raise SessionRefused(TOO_MANY_SESSIONS, (
                f"Core already holds {config.max_sessions} sessions (--max-sessions), none "
                "of this client's awaiting a resume; try again later"))
        if mine is not None and mine.held >= config.max_sessions_per_client:
            log_event("session.refused", sessions=len(self.sessions), client=client,
                      held=mine.held)
            raise SessionRefused(TOO_MANY_SESSIONS, (
                f"this client already holds {config.max_sessions_per_client} sessions, all "
                "connected (--max-sessions-per-client); try again later"))
        token = secrets.token_urlsafe(32)
        record = SessionRecord(
            id=session_id or secrets.token_urlsafe(18), token_hash=hash_token(token),
            tools=metadata.tools_json, history="[]", created_at=config.clock.time(),
        )
        session = CoreSession(self, record, metadata.client_json, metadata.names)
        session.resume_token = token
        self.sessions[record.id] = session
        self._count(session, client)
        self.store.save_session(record)
        log_event("session.created", session=record.id, tools=len(metadata.names))
        return session

    def resume(self, session_id: str, resume_token: str | None,
               client: str) -> CoreSession | None:
        """The session, if the token is right; None says nothing about why. A session
        restored from the store counts for the first client to resume it (a resume is
        never refused for a client's count: it makes no new session)."""
        session = self.sessions.get(session_id)
        expected = session.record.token_hash if session is not None else NO_SESSION_HASH
        given = resume_token or ""
        # compare even when the session is unknown, so timing says nothing either
        ok = hmac.compare_digest(expected.encode(), hash_token(given).encode())
        if session is None or not ok or session.closed:
            return None
        session.resume_token = given
        if session.client is None:
            self._count(session, client)
        return session

    def _count(self, session: CoreSession, client: str) -> None:
        session.client = client
        share = self.clients.get(client)
        if share is None:
            share = self.clients[client] = ClientSessions()
        share.held += 1
        if session.connection is None and session.disconnected_at is not None:
            share.waiting[session.id] = session

    def _share(self, session: CoreSession) -> ClientSessions | None:
        return None if session.client is None else self.clients.get(session.client)

    def waits(self, session: CoreSession) -> None:
        """``session`` is disconnected: it waits for a resume (the longest first)."""
        share = self._share(session)
        if share is not None:
            share.waiting[session.id] = session

    def waits_no_more(self, session: CoreSession) -> None:
        share = self._share(session)
        if share is not None:
            share.waiting.pop(session.id, None)

    def get(self, session_id: str) -> CoreSession | None:
        return self.sessions.get(session_id)

    def remove(self, session: CoreSession) -> None:
        if self.forget(session):
            self.store.delete_session(session.id)
            if self.store.shared:
                spawn(self.store.release(session.id, self.node))

    def forget(self, session: CoreSession) -> bool:
        """Let go of ``session`` here (the store is left as it is); False if it was gone."""
        session.close()
        if self.sessions.get(session.id) is not session:
            return False
        del self.sessions[session.id]
        client = session.client
        share = None if client is None else self.clients.get(client)
        if client is not None and share is not None:
            share.waiting.pop(session.id, None)
            share.held -= 1
            if not share.held:
                del self.clients[client]
        return True

    def restore(self, snapshot: Snapshot) -> None:
        """Rebuild the sessions of ``snapshot`` here, and their turns."""
        self._restore(self, snapshot)

    async def shutdown(self, timeout: float = SHUTDOWN_SECONDS) -> None:
        """Cancel running turns (they end ``cancelled``), stop timers, flush the store:
        all within ``timeout`` seconds, whatever the store is doing."""
        clock = self.config.clock
        deadline = clock.monotonic() + timeout
        runners = [s.turn for s in self.sessions.values() if s.turn is not None]
        for runner in runners:
            runner.cancel("Core is shutting down")
        tasks = [r.task for r in runners if r.task is not None]
        if tasks:
            await wait(clock, tasks, timeout)
        for session in self.sessions.values():
            session.close()
        try:
            await self.store.flush(timeout=max(0.0, deadline - clock.monotonic()))
            if self.store.shared:  # other nodes take its sessions over at once
                await wait_for(clock, asyncio.gather(*(
                    self.store.release(session_id, self.node) for session_id in self.sessions
                )), max(0.0, deadline - clock.monotonic()))
        except (StoreError, TimeoutError) as exc:
            log_event("store.shutdown_failed", level=logging.WARNING, error=str(exc))
