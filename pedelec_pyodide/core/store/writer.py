"""The write queue every durable backend shares: ordering, batching, failures, flushes.

``save_*`` and ``delete_*`` turn a record into an :class:`~.ops.Op` at once (so what is
stored is the record as it was then) and queue it; one writer task on the event loop
takes everything queued so far as one batch and hands it to the backend, which stores it
as one transaction. ``flush`` queues a marker and waits for the writer to pass it.

A write that fails fails alone: a value that cannot be stored fails when it is queued; a
batch the backend refuses is tried again one write at a time; the failure is kept under
the write's key (a session's id, a request's id, a turn's :func:`~.records.turn_key`)
for the flush that names that key. A backend that cannot be reached at all raises
:class:`~.errors.StoreUnavailable`: the writer keeps the batch and tries it again (every
write is idempotent, so a batch that was stored before the connection broke may be
stored twice) until the store is back; meanwhile flushes fail at their deadline and
:attr:`QueuedStore.unavailable` is true. If the writer itself ever stops (a bug), every
flush fails at once and :attr:`~QueuedStore.problem` says why.
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

from ..clock import Clock, SystemClock, wait, wait_for
from ..log import log_event
from .errors import (
    FlushTimeout,
    StoreError,
    StoreUnavailable,
    WriteFailed,
    WriterStopped,
    reason,
)
from .ops import (
    PRUNE_KEY,
    Op,
    OpKind,
    history_op,
    key_op,
    request_op,
    session_op,
    tools_op,
    turn_op,
)
from .records import (
    RECENT_TURNS,
    IdempotencyRecord,
    RequestRecord,
    SessionRecord,
    Snapshot,
    TurnRecord,
    turn_key,
)

#: seconds a flush waits for the writer before it fails (``--store-timeout``)
DEFAULT_STORE_TIMEOUT = 5.0
# failed writes kept for the flush that names their key; the oldest are forgotten
MAX_REMEMBERED_FAILURES = 1024
# characters of text queued for the writer, not yet written: past it (a stuck or slow store), a new
# write fails at once rather than holding its values in memory
MAX_QUEUED_CHARS = 64 * 1024 * 1024
# writes in one batch (one transaction) at most
MAX_BATCH = 1000
# waits between two tries of a batch while the store cannot be reached
RETRY_FIRST_SECONDS = 0.05
RETRY_MAX_SECONDS = 1.0
# seconds the writer is idle before it checks that the store can be reached
PROBE_SECONDS = 2.0
# writes that replace their record whole: once one is queued, an earlier write's failure
# under its key no longer says what the store will hold (a tools or history write, or
# end_delivered, changes part of a record, so an earlier failure still stands)
_REPLACING: frozenset[OpKind] = frozenset({
    "session", "delete_session", "request", "delete_request", "turn", "key", "delete_key"})

_Item = Op | asyncio.Future[None] | None  # None: close


class QueuedStore(ABC):
    """The queue and its writer; a backend subclasses it with :meth:`_load`,
    :meth:`_apply` and :meth:`_release`."""

    durable = True

    def __init__(self, label: str, timeout: float = DEFAULT_STORE_TIMEOUT,
                 clock: Clock | None = None) -> None:
        self.label = label
        self.timeout = timeout
        #: the time of flushes' deadlines, retries and idle probes (Core's clock)
        self.clock = clock or SystemClock()
        self._queue: deque[_Item] = deque()
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._failures: OrderedDict[str, str] = OrderedDict()
        self._dead: str | None = None
        self._unreachable: str | None = None  # while the store cannot be reached
        self._last_failure: str | None = None  # cleared by the next batch that is stored
        self._queued_chars = 0

    # --- what a backend provides --------------------------------------------------------

    @abstractmethod
    async def _load(self) -> Snapshot:
        """Every stored record that makes sense (see :mod:`.rows`)."""

    @abstractmethod
    async def _apply(self, ops: list[Op]) -> None:
        """Store ``ops`` as one transaction, all or none; raise
        :class:`~.errors.StoreUnavailable` if the store cannot be reached."""

    def _whole_batch(self, exc: Exception) -> bool:
        """Whether ``exc`` would fail every write of the batch again (no use trying them
        one at a time)."""
        return False

    def _of_store(self, exc: Exception) -> bool:
        """Whether ``exc`` is the store's failure (health: degraded), not one value's."""
        return True

    @abstractmethod
    async def _probe(self) -> None:
        """Raise :class:`~.errors.StoreUnavailable` if the store cannot be reached (the
        writer asks when it has been idle a while, so health tells without a write)."""

    @abstractmethod
    async def _release(self) -> None:
        """Let go of the connection (the writer has stopped, or been given up on)."""

    # --- the interface --------------------------------------------------------------------

    @property
    def problem(self) -> str | None:
        return self._dead or self._unreachable or self._last_failure

    @property
    def unavailable(self) -> bool:
        return self._unreachable is not None

    #: one process uses it unless a backend says otherwise
    shared = False

    async def load(self) -> Snapshot:
        return await self._load()

    async def load_session(self, session_id: str) -> Snapshot:
        """From the whole :meth:`load` (a store one process uses has no need of it)."""
        whole = await self._load()
        return Snapshot(
            [record for record in whole.sessions if record.id == session_id],
            [record for record in whole.requests if record.session_id == session_id],
            [record for record in whole.turns if record.session_id == session_id],
            [record for record in whole.keys if record.session_id == session_id])

    async def load_session_record(self, session_id: str) -> SessionRecord | None:
        """From :meth:`load_session` (a store one process uses has no need of it)."""
        return next(iter((await self.load_session(session_id)).sessions), None)

    def save_session(self, record: SessionRecord) -> None:
        self._submit(record.id, session_op, record)

    def save_tools(self, record: SessionRecord) -> None:
        self._submit(record.id, tools_op, record)

    def save_history(self, record: SessionRecord) -> None:
        self._submit(record.id, history_op, record)

    def delete_session(self, session_id: str) -> None:
        self._submit(session_id, Op, "delete_session", session_id, session_id)

    def save_request(self, record: RequestRecord) -> None:
        self._submit(record.id, request_op, record)

    def delete_request(self, session_id: str, request_id: str) -> None:
        self._submit(request_id, Op, "delete_request", request_id, session_id, request_id)

    def save_turn(self, record: TurnRecord) -> None:
        self._submit(turn_key(record.session_id, record.id), turn_op, record)

    def mark_end_delivered(self, session_id: str, turn_id: str) -> None:
        self._submit(turn_key(session_id, turn_id), Op, "end_delivered",
                     turn_key(session_id, turn_id), session_id, turn_id)

    def save_key(self, record: IdempotencyRecord) -> None:
        self._submit(record.key_hash, key_op, record)

    def delete_key(self, session_id: str, key_hash: str) -> None:
        self._submit(key_hash, Op, "delete_key", key_hash, session_id, key_hash)

    def prune_turns(self, keep: int = RECENT_TURNS) -> None:
        self._submit(PRUNE_KEY, Op, "prune_turns", PRUNE_KEY, "", "", (keep,))

    async def flush(self, *keys: str, timeout: float | None = None) -> None:
        if self._dead is None:
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._put(done)
            limit = self.timeout if timeout is None else timeout
            try:
                await wait_for(self.clock, done, limit)
            except TimeoutError:
                why = self._unreachable or (f"{self.label} is locked by another process, "
                                            "slow or stuck")
                text = (f"the store did not store the writes within {limit:g} s "
                        f"(--store-timeout): {why}")
                if self._unreachable is None:
                    self._last_failure = text  # until a batch is stored again
                log_event("store.flush_timeout", level=logging.WARNING, seconds=limit)
                raise FlushTimeout(text) from None
        if self._dead is not None:
            raise WriterStopped(self._dead)
        failed = [self._failures.pop(key) for key in keys if key in self._failures]
        if failed:
            raise WriteFailed(failed[0])

    async def close(self, timeout: float | None = None) -> None:
        """Store what is queued and let go of the store, waiting at most ``timeout``
        seconds for the writer: what is still queued then is given up, and logged."""
        if self._closed:
            return
        self._put(None)
        self._closed = True
        limit = self.timeout if timeout is None else timeout
        deadline = self.clock.monotonic() + limit
        task = self._task
        if task is not None:
            await wait(self.clock, {task}, limit)
            if not task.done():
                task.cancel()
                unwritten = sum(isinstance(item, Op) for item in self._queue)
                log_event("store.close_timeout", level=logging.WARNING, seconds=limit,
                          unwritten=unwritten)
        try:  # whatever is left of the deadline, and a little for the sockets
            await wait_for(self.clock, self._release(),
                           max(0.1, deadline - self.clock.monotonic()))
        except TimeoutError:
            log_event("store.release_timeout", level=logging.WARNING, store=self.label)

    # --- queueing -------------------------------------------------------------------------

    def _submit(self, key: str, make: Callable[..., Op], *args: Any) -> None:
        """Queue the write ``make(*args)`` makes; if it cannot be made (a value that
        cannot be stored), it fails under ``key`` without reaching the writer."""
        if self._dead is not None:
            self._fail(key, self._dead)
            return
        if self._closed:
            self._fail(key, "the store is closed")
            return
        try:
            op = make(*args)
        except Exception as exc:  # unserialisable, NaN, a lone surrogate, too deep
            self._fail(key, f"a value cannot be stored ({reason(exc)})")
            return
        size = op.size
        if self._queued_chars + size > MAX_QUEUED_CHARS:
            self._fail(key, f"the store is over {MAX_QUEUED_CHARS} characters behind: "
                       f"{self.label} is stuck or too slow", of_store=True)
            return
        self._queued_chars += size
        if op.kind in _REPLACING:
            self._failures.pop(key, None)
        self._put(op)

    def _put(self, item: _Item) -> None:
        self._queue.append(item)
        self._wakeup.set()
        if self._task is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no loop yet: the first flush or close starts the writer
                return
            self._task = loop.create_task(self._run(), name="pedelec-store")

    def _fail(self, key: str, why: str, *, of_store: bool = False) -> None:
        """Keep ``why`` for the flush that names ``key``; ``of_store``: the store itself
        failed (not one bad value), so :attr:`problem` reports it."""
        self._failures[key] = why
        self._failures.move_to_end(key)
        while len(self._failures) > MAX_REMEMBERED_FAILURES:
            self._failures.popitem(last=False)
        if of_store:
            self._last_failure = why
        log_event("store.write_failed", level=logging.WARNING,
                  key=key.encode("utf-8", "backslashreplace").decode(), error=why)

    # --- the writer -----------------------------------------------------------------------

    async def _run(self) -> None:
        waiters: list[asyncio.Future[None]] = []
        try:
            while True:
                while not self._queue:
                    self._wakeup.clear()
                    try:  # (a timeout block: no task per wait, unlike wait_for)
                        async with self.clock.timeout(PROBE_SECONDS):
                            await self._wakeup.wait()
                    except TimeoutError:  # idle: is the store still there?
                        await self._idle_probe()
                ops: list[Op] = []
                stop = False
                while self._queue and len(ops) < MAX_BATCH and not stop:
                    item = self._queue.popleft()
                    if item is None:
                        stop = True
                    elif isinstance(item, Op):
                        ops.append(item)
                    else:
                        waiters.append(item)
                if ops:
                    await self._write(_live(ops))
                    self._queued_chars -= sum(op.size for op in ops)
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_result(None)
                waiters = []
                if stop:
                    return
        except asyncio.CancelledError:  # closing, given up on: nobody is left waiting
            self._settle_all(waiters, WriterStopped("the store was closed"))
            raise
        except Exception as exc:  # a bug, not a write: never leave a flush waiting
            self._dead = f"the store's writer stopped ({reason(exc)}); nothing is stored"
            log_event("store.writer_died", level=logging.ERROR, error=self._dead)
            self._settle_all(waiters, WriterStopped(self._dead))

    async def _idle_probe(self) -> None:
        """The idle check (:meth:`_probe`); a store that answers but refuses it (Redis
        busy with a script, an ACL) is said, and the writer carries on: its writes
        report their own failures."""
        try:
            await self._retrying([])
        except StoreError as exc:
            log_event("store.probe_failed", level=logging.WARNING, error=str(exc))

    def _settle_all(self, waiters: list[asyncio.Future[None]], error: Exception) -> None:
        waiters.extend(item for item in self._queue if isinstance(item, asyncio.Future))
        for waiter in waiters:
            if not waiter.done():
                waiter.set_exception(error)

    async def _write(self, ops: list[Op]) -> None:
        """The batch as one transaction; if the store refuses it, each write on its own,
        so that only the bad one fails."""
        try:
            await self._retrying(ops)
        except Exception as exc:
            if len(ops) == 1 or self._whole_batch(exc):
                for op in ops:
                    self._fail(op.key, f"the write failed ({reason(exc)})",
                               of_store=self._of_store(exc))
                return
            for op in ops:
                try:
                    await self._retrying([op])
                except Exception as single:
                    self._fail(op.key, f"the write failed ({reason(single)})",
                               of_store=self._of_store(single))
            return
        self._last_failure = None

    async def _retrying(self, ops: list[Op]) -> None:
        """:meth:`_apply` (no ops: :meth:`_probe`), again and again while the store cannot
        be reached."""
        delay = RETRY_FIRST_SECONDS
        while True:
            try:
                await (self._apply(ops) if ops else self._probe())
            except StoreUnavailable as exc:
                if self._unreachable is None:
                    log_event("store.unreachable", level=logging.WARNING, error=str(exc))
                self._unreachable = str(exc)
                await self.clock.sleep(delay)
                delay = min(2 * delay, RETRY_MAX_SECONDS)
                continue
            if self._unreachable is not None:
                log_event("store.reachable", store=self.label)
                self._unreachable = None
            return


def _live(ops: list[Op]) -> list[Op]:
    """The batch without the tools writes a later write of the same batch replaces (a
    page's tools.update flood costs a store that falls behind one write per batch): the
    batch is one transaction, so nobody reads between them."""
    replaced: set[str] = set()
    live: list[Op] = []
    for op in reversed(ops):
        if op.kind in ("tools", "session"):
            if op.kind == "tools" and op.session_id in replaced:
                continue
            replaced.add(op.session_id)
        live.append(op)
    live.reverse()
    return live
