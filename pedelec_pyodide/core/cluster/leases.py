"""A node's leases on the sessions it holds (a shared store: Redis), and sessions moving
between nodes: a page resuming here a session another node holds (take-over), a call
for a session no node holds (adopt), the sessions of a node that died (taken at start).

A lease lasts :data:`LEASE_SECONDS` and is renewed every third of it, so a dead node's
sessions are free again within that long; a session another node holds now is handed
over (its page reconnects there).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import logging
import secrets

from ..background import background_failed
from ..clock import wait, wait_for
from ..log import log_event
from ..sessions import Registry
from ..sessions.registry import NO_SESSION_HASH
from ..store import Snapshot, StoreError, hash_token
from .messages import HandedOver, HandOver

#: seconds a node's lease on a session lasts (Redis store); renewed every third of it, so
#: a dead node's sessions are free again within this long
LEASE_SECONDS = 6.0
#: how long a node taking a session over waits for its holder to let go of it (a dead
#: holder never answers: the node goes on without it)
HANDOVER_SECONDS = 2.0
#: how long a session's lease must stay missing before a call takes the session (adopt):
#: two renewals, since a live holder whose lease lapsed (Redis was away, or the node
#: stalled, past a lease) takes it back at its next renewal
VACANT_SECONDS = 2 * LEASE_SECONDS / 3
# how often adopt, and a node's start (take_vacant), look whether a holder took a
# missing lease back
_VACANT_POLL = 0.25


class Leases:
    """The sessions this node holds a lease on, and those it is taking."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.store = registry.store
        self.clock = registry.config.clock
        self.node = registry.node
        # sessions taken over by this node, waiting for their holder to let go of them
        self._handovers: dict[str, asyncio.Future[None]] = {}
        # sessions this node is taking (take_over, adopt), each done when that ends: one
        # at a time (a second joins it), and a holder asked to let go finishes it first
        self._taking: dict[str, asyncio.Future[None]] = {}
        # the sessions the store had at this node's start (a shared store), until
        # take_vacant looked at them
        self._stored_at_start: list[str] = []

    def handed_over(self, session_id: str) -> None:
        """The holder of a session this node is taking over let go of it."""
        waiting = self._handovers.get(session_id)
        if waiting is not None and not waiting.done():
            waiting.set_result(None)

    async def new_session_id(self) -> str | None:
        """On a shared store: a new session's id, its lease this node's already (so a
        call for it arriving at another node right after the welcome is routed here);
        None if the store cannot be reached (the session is made anyway; renewal takes
        its lease)."""
        if not self.store.shared:
            return None
        session_id = secrets.token_urlsafe(18)
        try:
            await self.store.claim(session_id, self.node, LEASE_SECONDS)
        except StoreError as exc:
            log_event("cluster.failed", level=logging.WARNING, error=str(exc))
        return session_id

    async def take_over(self, session_id: str, resume_token: str | None) -> bool:
        """A page resumes here a session this node does not hold: if the store has it
        and the token is right, claim its lease, have the node that held it let go (and
        store what it had), then load it here as a restart of Core would. A take-over
        under way here is joined first. True once done (the session is here, or
        :meth:`Registry.resume` refuses it); False if the store could not be reached:
        nothing is known of the session, so the page must try again, not be refused."""
        if not self.store.shared:
            return True
        while (under_way := self._taking.get(session_id)) is not None:
            await asyncio.shield(under_way)
        if session_id in self.registry.sessions:
            return True
        done = self._taking[session_id] = asyncio.get_running_loop().create_future()
        try:
            return await self._take_over(session_id, resume_token)
        except StoreError as exc:
            log_event("cluster.failed", level=logging.WARNING, session=session_id,
                      error=str(exc))
            return False
        finally:
            del self._taking[session_id]
            done.set_result(None)

    async def _take_over(self, session_id: str, resume_token: str | None) -> bool:
        # the session's own row first: a wrong token costs one small read, not the
        # whole session (its kept results and history); its lease is read with it,
        # whatever is found (timing says nothing of which sessions exist)
        record, holder = await asyncio.gather(self.store.load_session_record(session_id),
                                              self.store.holder(session_id))
        stored = record.token_hash if record is not None else NO_SESSION_HASH
        if not (hmac.compare_digest(stored.encode(), hash_token(resume_token or "").encode())
                and record is not None):
            if record is None and holder not in (None, self.node):
                # held, but not stored: Redis lost its data and the holder has not stored
                # it again yet (its next renewal does): the page tries again
                log_event("session.not_stored_yet", session=session_id)
                return False
            return True  # refused by resume(), which says nothing more
        previous = await self.store.claim(session_id, self.node, LEASE_SECONDS)
        if previous not in (None, self.node):
            log_event("session.taking_over", session=session_id, node=previous)
            waiting = self._handovers[session_id] = (
                asyncio.get_running_loop().create_future())
            try:
                await self.store.publish(
                    previous, HandOver(session=session_id, to=self.node).encode())
                try:
                    await wait_for(self.clock, waiting, HANDOVER_SECONDS)
                except TimeoutError:
                    log_event("session.holder_silent", session=session_id, node=previous)
            finally:
                del self._handovers[session_id]
            # another page (a second tab) may have claimed it meanwhile: it is theirs
            if (await self.store.renew([session_id], self.node, LEASE_SECONDS)).lost:
                log_event("session.claimed_meanwhile", session=session_id)
                return True
        snapshot = await self.store.load_session(session_id)
        if session_id not in self.registry.sessions and snapshot.sessions:
            self.registry.restore(snapshot)
        return True

    async def adopt(self, session_id: str) -> bool:
        """A call for a session no node holds (its node died; the page is away): load
        it here and hold it, so the call waits here for the page to come back. A lease
        missing is first waited on for :data:`VACANT_SECONDS` (its live holder takes it
        back). False if the call must be routed again (another node holds it, or this
        node is taking it already)."""
        if session_id in self.registry.sessions:
            return True
        if session_id in self._taking:
            return False
        snapshot = await self.store.load_session(session_id)
        if not snapshot.sessions:
            return True  # no such session: the routes say so
        holder = await self.store.holder(session_id)
        vacant = holder is None
        if vacant:
            end = self.clock.monotonic() + VACANT_SECONDS
            while self.clock.monotonic() < end:
                await self.clock.sleep(_VACANT_POLL)
                if await self.store.holder(session_id) is not None:
                    return False
        elif holder != self.node:
            return False
        if session_id in self.registry.sessions:
            return True
        if session_id in self._taking:
            return False
        done = self._taking[session_id] = asyncio.get_running_loop().create_future()
        try:
            if (await self.store.renew([session_id], self.node, LEASE_SECONDS)).lost:
                return False
            if vacant:  # what its last holder stored while this node waited
                snapshot = await self.store.load_session(session_id)
            if session_id not in self.registry.sessions and snapshot.sessions:
                self.registry.restore(snapshot)
            return True
        finally:
            del self._taking[session_id]
            done.set_result(None)

    async def still_held(self, session_id: str, holder: str) -> bool:
        """Whether ``holder`` still holds the session, for a call waiting for its reply;
        True while the store is out of reach: the call was sent and may have run, so it
        waits for its reply (sent again once Redis is back) rather than failing and being
        run again by a retry."""
        try:
            return await self.store.holder(session_id) == holder
        except StoreError as exc:
            log_event("cluster.failed", level=logging.WARNING, session=session_id,
                      error=str(exc))
            return True

    async def let_go(self, session_id: str, to: str) -> None:
        """Node ``to`` took the session over: hand it over, store what is queued, say so.
        A take-over of it under way here ends first (``to`` then loads what it stored)."""
        under_way = self._taking.get(session_id)
        if under_way is not None:
            await wait(self.clock, [under_way], HANDOVER_SECONDS)
        session = self.registry.sessions.get(session_id)
        if session is not None:
            session.hand_over(resumed=True)
            await self.store.flush()
        await self.store.publish(to, HandedOver(session=session_id).encode())

    async def renew_forever(self) -> None:
        """Every third of a lease; a round that failed is tried again at once (after
        :data:`_VACANT_POLL`), once: after Redis restarted, the first command on each
        of the node's connections to it fails, and a lease has no time to lose."""
        quick = False  # the round before failed: this one comes at once
        while True:
            await self.clock.sleep(_VACANT_POLL if quick else LEASE_SECONDS / 3)
            retried, quick = quick, False
            try:
                renewal = await self.store.renew(list(self.registry.sessions), self.node,
                                                 LEASE_SECONDS)
                for session_id in renewal.lost:
                    session = self.registry.sessions.get(session_id)
                    if session is not None:  # taken without the page: it resumes there
                        session.hand_over(resumed=False)
                if renewal.retaken:
                    await self._store_again(renewal.retaken)
            except Exception as exc:  # out of reach, refused: renewed next round
                background_failed("renew", exc)
                quick = not retried

    async def _store_again(self, session_ids: list[str]) -> None:
        """Of the sessions whose lease was missing, those the store lost too (Redis
        restarted without its data, or it was flushed): stored again whole, from what
        this node holds, so that other nodes find them (a page resuming there, a call,
        ``tools/list``) as if nothing had happened. A lease that merely lapsed (Redis
        away, this node stalled) finds the rows there: nothing is written."""
        for session_id in await self.store.unstored(session_ids):
            session = self.registry.sessions.get(session_id)
            if session is None or session.closed:
                continue
            store = self.store
            store.save_session(session.record)
            for pending in session.pending.values():
                store.save_request(pending.record)
            unsent = {ended.record.id for ended in session.unsent_ends}
            for ended in session.ended.values():  # as kept to send its end again
                store.save_turn(dataclasses.replace(
                    ended.record, end_delivered=ended.record.id not in unsent))
            if session.turn is not None:
                session.turn.store_again()
            session.callers.store_again()
            log_event("cluster.stored_again", level=logging.WARNING, session=session_id,
                      pending=len(session.pending))

    def restorable(self, snapshot: Snapshot) -> Snapshot:
        """At start, what of the store to restore at once: all of it on a store of this
        process's own. On a shared store nothing: the sessions no live node holds are
        taken later (:meth:`take_vacant`). Taken at once, the session of a live node
        whose lease lapsed (Redis restarted, every lease gone) would have two holders,
        its page on one while calls go to the other."""
        if not self.store.shared:
            return snapshot
        self._stored_at_start = [record.id for record in snapshot.sessions]
        return Snapshot()

    async def take_vacant(self) -> None:
        """The sessions stored at this node's start that no node holds (their node died,
        or the cluster stopped): taken and restored here, so that their requests time
        out and they expire as on one node, once their lease has stayed missing for
        :data:`VACANT_SECONDS` at every look (each :data:`_VACANT_POLL`). One a node holds
        at a look is left to it (a page's take-over or a call's adopt brings it here
        later). A look that fails (Redis away, or refusing) starts every wait over: a live
        holder whose lease lapsed meanwhile takes it back at its first renewal after."""
        waiting, self._stored_at_start = set(self._stored_at_start), []
        missing_since: dict[str, float] = {}
        while waiting:
            waiting -= self.registry.sessions.keys()
            looked = list(waiting)
            try:
                held = await self.store.holders(looked)
                now = self.clock.monotonic()
                due = []
                for session_id, holder in zip(looked, held, strict=True):
                    if holder not in (None, self.node):  # (this node's: taken, not restored)
                        waiting.discard(session_id)
                    elif now - missing_since.setdefault(session_id, now) >= VACANT_SECONDS \
                            and session_id not in self._taking:
                        due.append(session_id)
                if due:
                    await self._take(due)
                    waiting -= set(due)
            except Exception as exc:  # out of reach, refused: looked at afresh later
                background_failed("take_vacant", exc)
                missing_since.clear()
            await self.clock.sleep(_VACANT_POLL)

    async def _take(self, session_ids: list[str]) -> None:
        """Take the leases of ``session_ids`` still missing (the store's conditional
        take) and restore those sessions here, in one restore (a session gone meanwhile
        is let go again)."""
        loop = asyncio.get_running_loop()
        taking = {session_id: loop.create_future() for session_id in session_ids}
        self._taking.update(taking)  # a take-over or adopt here waits for these
        try:
            held = set((await self.store.renew(session_ids, self.node, LEASE_SECONDS)).lost)
            taken = Snapshot()
            for session_id in session_ids:
                if session_id in held:
                    continue
                snapshot = await self.store.load_session(session_id)
                if not snapshot.sessions:
                    await self.store.release(session_id, self.node)
                taken.sessions += snapshot.sessions
                taken.requests += snapshot.requests
                taken.turns += snapshot.turns
                taken.keys += snapshot.keys
            if taken.sessions:
                self.registry.restore(taken)
        finally:
            for session_id, done in taking.items():
                del self._taking[session_id]
                done.set_result(None)
