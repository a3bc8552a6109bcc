"""The Redis backend: every Core process given the same Redis URL shares what it stores.

Keys (``P`` is ``pedelec:CLUSTER:``, ``?cluster=NAME`` in the URL, ``main`` by default, so
several clusters can share one Redis database); a session's keys hold nothing of the node
that wrote them, so any node can load and carry on a session:

- ``P:sessions``: sorted set, each session's id by its creation time
- ``P:session:ID``: the session's row (JSON) but its tools (``null`` in their column),
  and ``P:tools:ID`` its tools (JSON): a ``tools.update`` writes these alone, a turn's
  end the row alone (a row of an older Core holds its tools: it is rewritten so at load)
- ``P:requests:ID`` and ``P:order:ID``: hash of request id -> row, and sorted set of
  request id -> when it was last saved (requests load in that order)
- ``P:turns:ID``, ``P:delivered:ID``: hash of turn id -> row, and the turns whose end
  the page has had since their row was saved; ``P:turnorder:ID`` (sorted set of turn id
  -> start), ``P:running:ID`` and ``P:undelivered:ID`` (sets of turn ids): what pruning
  needs, without reading the rows
- ``P:keys:ID``: hash of an idempotency key's hash -> row
- ``P:lease:ID``: the node holding the session, with a TTL (:mod:`.leases`)
- ``P:node:NODE``: the pub/sub channel of a node's inbox

A row is the JSON array of the record's columns (:mod:`.ops`), checked at load as the
SQLite backend checks its rows. A batch of writes is one ``MULTI``/``EXEC`` transaction;
every write sets whole values, so a batch sent again after a lost connection is harmless.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit, urlunsplit

from redis import exceptions as redis_errors
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline, PubSub
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from ... import strictjson
from ..clock import Clock
from ..log import log_event
from ..offload import LARGE_CHARS
from . import rows
from .errors import StoreError, StoreRefused, StoreUnavailable, reason
from .leases import RENEW_CHUNK, Renewal
from .ops import KEY_COLUMNS, REQUEST_COLUMNS, SESSION_COLUMNS, TURN_COLUMNS, Op
from .publisher import Publisher
from .records import TURN, SessionRecord, Snapshot
from .seal import Refused, Seal
from .writer import DEFAULT_STORE_TIMEOUT, QueuedStore

# seconds an inbox waits for a message before it looks again (and a lost Redis is
# tried again after)
INBOX_POLL = 0.5
#: the cluster of a Redis URL without ``?cluster=``
DEFAULT_CLUSTER = "main"
# sessions read per round trip at load, and per pruning's round trip
CHUNK = 200
# what "cannot reach the store" is: the writer keeps the writes and tries again
_UNREACHABLE = (redis_errors.ConnectionError, redis_errors.TimeoutError,
                redis_errors.ReadOnlyError, OSError, TimeoutError)
_T = TypeVar("_T")
# every key of one session (deleted with it)
_SESSION_KEYS = ("session", "tools", "requests", "order", "turns", "delivered", "turnorder",
                 "running", "undelivered", "keys")
# ARGV: node, ttl in ms; KEYS: leases. A lease the node holds is extended, one nobody
# holds taken again; returns the 1-based places of those another node holds (left be),
# and of those taken again.
_RENEW = """
local lost, retaken = {}, {}
for i, key in ipairs(KEYS) do
  local held = redis.call('GET', key)
  if held == ARGV[1] then
    redis.call('PEXPIRE', key, ARGV[2])
  elseif not held then
    redis.call('SET', key, ARGV[1], 'PX', ARGV[2])
    retaken[#retaken + 1] = i
  else
    lost[#lost + 1] = i
  end
end
return {lost, retaken}
"""
# KEYS[1]: a lease; ARGV[1]: the node. Deleted only if that node holds it.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
_STATUS, _DELIVERED, _CREATED = (TURN_COLUMNS.index(name) for name in (
    "status", "end_delivered", "created_at"))
_TOOLS = SESSION_COLUMNS.index("tools")
_PER_SESSION = 7  # keys read per session at load


def check_url(url: str) -> tuple[str, str]:
    """The URL to connect to (without ``cluster``) and the cluster; ``ValueError`` saying
    what is wrong with ``url``."""
    parts = urlsplit(url)
    if not parts.hostname:
        raise ValueError("a Redis URL needs a host: redis://HOST:PORT/DB")
    try:
        parts.port  # noqa: B018 (raises for a port that is not a number)
    except ValueError:
        raise ValueError("the Redis port is not a number") from None
    db = parts.path.strip("/")
    if db and not db.isdigit():
        raise ValueError(f"the Redis database must be a number, not {db[:20]!r}")
    query = parse_qs(parts.query, keep_blank_values=True)
    unknown = sorted(set(query) - {"cluster"})
    if unknown:
        raise ValueError(f"a Redis store takes only ?cluster=NAME, not {unknown[0][:20]!r}")
    cluster = query.get("cluster", [DEFAULT_CLUSTER])[-1]
    if not cluster or not all(c.isalnum() or c in "-_." for c in cluster):
        raise ValueError("the cluster name must be letters, digits, '-', '_' or '.'")
    return urlunsplit(parts._replace(query="")), cluster


def public_url(url: str) -> str:
    """``url`` without its password, to log."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urlunsplit(parts._replace(netloc=user + netloc))


class RedisStore(QueuedStore):
    """Redis through redis-py's asyncio client, connected to when first used."""

    shared = True

    def __init__(self, url: str, timeout: float = DEFAULT_STORE_TIMEOUT,
                 secret: str | None = None, clock: Clock | None = None) -> None:
        target, cluster = check_url(url)
        super().__init__(public_url(url), timeout, clock)
        self.prefix = f"pedelec:{cluster}:"
        # each call has a deadline (the socket's), and fails rather than retrying: the
        # writer decides what to try again
        self._redis = Redis.from_url(
            target, socket_timeout=timeout, socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0), health_check_interval=0)
        self._last_order = 0
        self._renew = self._redis.register_script(_RENEW)
        self._release_lease = self._redis.register_script(_RELEASE)
        # the cluster secret's seal of the messages between nodes (None: unsealed)
        self.seal = None if secret is None else Seal(secret, self.clock)
        # the messages between nodes go out on a connection of their own (None: TLS)
        self._publisher = Publisher.of(self._redis, timeout, self.clock)

    def _key(self, kind: str, session_id: str = "") -> str:
        return f"{self.prefix}{kind}:{session_id}" if session_id else f"{self.prefix}{kind}"

    async def _call(self, make: Callable[[], Awaitable[_T]]) -> _T:
        """``make()`` awaited; a store out of reach raised as StoreUnavailable, a command
        Redis refused (WRONGTYPE, OOM, NOREPLICAS, MISCONF...) as StoreRefused: callers
        see only StoreErrors."""
        try:  # a deadline, not wait_for: no task per command (a crossing call makes four)
            async with self.clock.timeout(2 * self.timeout):
                return await make()
        except (*_UNREACHABLE, redis_errors.RedisError) as exc:
            raise self._failure(exc) from None

    def _failure(self, exc: BaseException) -> StoreError:
        """What a Redis client's error is to the store's callers."""
        if isinstance(exc, _UNREACHABLE):
            return StoreUnavailable(f"cannot reach {self.label} ({reason(exc)})")
        return StoreRefused(f"{self.label} refused a command ({reason(exc)})")

    # --- reading ------------------------------------------------------------------------

    async def reachable(self) -> None:
        """Return once Redis answers; :class:`~.errors.StoreUnavailable` if it has not
        within the store's timeout."""
        await self._patiently(self._probe)

    async def _load(self) -> Snapshot:
        """Every session's rows, checked (Core starts only with what it stored)."""
        return await self._patiently(lambda: self._read())

    async def _patiently(self, make: Callable[[], Awaitable[_T]]) -> _T:
        """``make()``, tried again until the store's deadline while Redis is out of reach."""
        deadline = self.clock.monotonic() + self.timeout
        while True:
            try:
                return await make()
            except StoreUnavailable:
                if self.clock.monotonic() >= deadline:
                    raise
                await self.clock.sleep(0.1)

    async def load_session(self, session_id: str) -> Snapshot:
        return await self._patiently(lambda: self._read([session_id]))

    async def load_session_record(self, session_id: str) -> SessionRecord | None:
        keys = [self._key("session", session_id), self._key("tools", session_id)]
        row, tools = await self._patiently(lambda: self._call(lambda: self._redis.mget(keys)))
        if row is None:
            return None
        made = self._sessions([(keys[0], row, tools)])
        return made[0] if made else None

    def _sessions(self, stored: list[tuple[str, Any, Any]]) -> list[SessionRecord]:
        """Session records of (where, row, tools) as stored; a row an older Core wrote,
        its tools inside, is queued to be written as this one writes rows."""
        made: list[SessionRecord] = rows.records("sessions", stored, _session_columns)
        legacy = {where for where, _, tools in stored if tools is None}
        for record in made:
            if self._key("session", record.id) in legacy:
                self.save_session(record)
        return made

    async def _read(self, only: list[str] | None = None) -> Snapshot:
        ids = await self._listed() if only is None else only
        found: dict[str, list[tuple[Any, ...]]] = {
            "sessions": [], "requests": [], "turns": [], "idempotency_keys": []}
        for start in range(0, len(ids), CHUNK):
            chunk = ids[start:start + CHUNK]
            pipe = self._redis.pipeline(transaction=False)
            for sid in chunk:
                pipe.get(self._key("session", sid))
                pipe.get(self._key("tools", sid))
                pipe.hgetall(self._key("requests", sid))
                pipe.zrange(self._key("order", sid), 0, -1)
                pipe.hgetall(self._key("turns", sid))
                pipe.hgetall(self._key("delivered", sid))
                pipe.hgetall(self._key("keys", sid))
            replies = await self._call(partial(pipe.execute, raise_on_error=False))
            for n, sid in enumerate(chunk):
                replied = replies[_PER_SESSION * n:_PER_SESSION * (n + 1)]
                if _refused(replied, self._key("session", sid)):
                    continue
                session, tools, requests, order, turns, delivered, keys = replied
                if session is not None:
                    found["sessions"].append((self._key("session", sid), session, tools))
                ordered = set(order)
                for rid in [*order, *(rid for rid in requests if rid not in ordered)]:
                    if rid in requests:
                        found["requests"].append((_where(self._key("requests", sid), rid),
                                                  requests[rid]))
                for tid, row in turns.items():
                    found["turns"].append((_where(self._key("turns", sid), tid), row,
                                           tid in delivered))
                for hashed, row in keys.items():
                    found["idempotency_keys"].append((_where(self._key("keys", sid), hashed),
                                                      row))
        snapshot = Snapshot()
        snapshot.sessions = self._sessions(found["sessions"])
        known = {session.id for session in snapshot.sessions}
        snapshot.requests = rows.records("requests", found["requests"],
                                         _columns(rows.request, len(REQUEST_COLUMNS)), known)
        snapshot.turns = sorted(rows.records("turns", found["turns"], _turn_columns, known,
                                             set()), key=lambda turn: turn.created_at)
        snapshot.keys = sorted(rows.records("idempotency_keys", found["idempotency_keys"],
                                            _columns(rows.key, len(KEY_COLUMNS)), known),
                               key=lambda record: record.created_at)
        return snapshot

    # --- leases -------------------------------------------------------------------------

    async def claim(self, session_id: str, node: str, ttl: float) -> str | None:
        key = self._key("lease", session_id)
        previous = await self._call(lambda: self._redis.set(
            key, node, px=_ms(ttl), get=True))
        return _text(previous)

    async def renew(self, session_ids: list[str], node: str, ttl: float) -> Renewal:
        renewal = Renewal([], [])
        for start in range(0, len(session_ids), RENEW_CHUNK):
            chunk = session_ids[start:start + RENEW_CHUNK]
            keys = [self._key("lease", sid) for sid in chunk]
            lost, retaken = await self._call(
                lambda keys=keys: self._renew(keys=keys, args=[node, _ms(ttl)]))  # type: ignore[misc]
            renewal.lost.extend(chunk[int(place) - 1] for place in lost)
            renewal.retaken.extend(chunk[int(place) - 1] for place in retaken)
        return renewal

    async def release(self, session_id: str, node: str) -> None:
        key = self._key("lease", session_id)
        await self._call(lambda: self._release_lease(keys=[key], args=[node]))

    async def holder(self, session_id: str) -> str | None:
        held = await self._call(lambda: self._redis.get(self._key("lease", session_id)))
        return _text(held)

    async def holders(self, session_ids: list[str]) -> list[str | None]:
        found: list[str | None] = []
        for start in range(0, len(session_ids), RENEW_CHUNK):
            keys = [self._key("lease", sid) for sid in session_ids[start:start + RENEW_CHUNK]]
            held = await self._call(lambda keys=keys: self._redis.mget(keys))  # type: ignore[misc]
            found.extend(_text(each) for each in held)
        return found

    async def unstored(self, session_ids: list[str]) -> list[str]:
        missing: list[str] = []
        for start in range(0, len(session_ids), RENEW_CHUNK):
            chunk = session_ids[start:start + RENEW_CHUNK]
            pipe = self._redis.pipeline(transaction=False)
            for sid in chunk:
                pipe.exists(self._key("session", sid))
            found = await self._call(pipe.execute)
            missing.extend(sid for sid, there in zip(chunk, found, strict=True) if not there)
        return missing

    async def publish(self, node: str, message: str) -> int:
        channel = self._key("node", node)
        data = message if self.seal is None else self.seal.seal(channel, message)
        publisher = self._publisher
        if publisher is None:
            return int(await self._call(lambda: self._redis.publish(channel, data)))
        return await self._call(lambda: publisher.publish(channel, data))

    async def inbox(self, node: str) -> AsyncIterator[str]:
        channel = self._key("node", node)
        while True:
            pubsub: PubSub = self._redis.pubsub(ignore_subscribe_messages=True)
            try:
                await self._call(partial(pubsub.subscribe, channel))
                while True:
                    try:  # a read with its own deadline (INBOX_POLL): no timer of _call's
                        # per message, two on a call crossing nodes
                        message = await pubsub.get_message(timeout=INBOX_POLL)
                    except (*_UNREACHABLE, redis_errors.RedisError) as exc:
                        raise self._failure(exc) from None
                    if message is not None and message["type"] == "message":
                        text = await self._opened(channel, bytes(message["data"]))
                        if text is not None:
                            yield text
            except StoreUnavailable:
                await self.clock.sleep(INBOX_POLL)  # subscribed again once Redis is back
            except StoreRefused as exc:  # the writer does not see it: said here
                log_event("store.inbox_failed", level=logging.WARNING, error=str(exc))
                await self.clock.sleep(INBOX_POLL)
            finally:
                with contextlib.suppress(*_UNREACHABLE, redis_errors.RedisError):
                    await pubsub.aclose()  # type: ignore[no-untyped-call, unused-ignore]  # typed from redis 8.2

    async def _opened(self, channel: str, data: bytes) -> str | None:
        """A message as read on ``channel``; None if its seal does not hold (dropped,
        logged). A large one is checked off the event loop (its MAC is linear work), in a
        thread of asyncio's own: a flood of large forgeries holds up none of Core's JSON
        work (:mod:`..offload`), and hashing lets go of the GIL."""
        seal = self.seal
        if seal is None:
            return data.decode("utf-8", "replace")
        try:
            opened = (seal.verify(channel, data) if len(data) <= LARGE_CHARS
                      else await asyncio.to_thread(seal.verify, channel, data))
            return seal.admit(opened)
        except Refused as exc:
            seal.refused(channel, exc.reason, len(data))
            return None

    # --- writing ------------------------------------------------------------------------

    async def _apply(self, ops: list[Op]) -> None:
        """The batch as one transaction; a pruning (it reads first) between them."""
        start = 0
        for end, op in enumerate(ops):
            if op.kind == "prune_turns":
                await self._transaction(ops[start:end])
                await self._prune(op.row[0])
                start = end + 1
        await self._transaction(ops[start:])

    async def _transaction(self, ops: list[Op]) -> None:
        if not ops:
            return
        pipe = self._redis.pipeline(transaction=True)
        for op in ops:
            self._queue_write(pipe, op)
        await self._call(pipe.execute)

    def _queue_write(self, pipe: Pipeline, op: Op) -> None:
        sid, target = op.session_id, op.target
        if op.kind == "session":
            untooled = (*op.row[:_TOOLS], None, *op.row[_TOOLS + 1:])  # as "history"
            pipe.set(self._key("session", sid), _json(untooled))
            pipe.set(self._key("tools", sid), op.row[_TOOLS])
            pipe.zadd(self._key("sessions"), {sid: op.row[4]})
        elif op.kind == "tools":  # (xx: of a stored session only, as SQLite's UPDATE)
            pipe.set(self._key("tools", sid), op.row[0], xx=True)
        elif op.kind == "history":
            pipe.set(self._key("session", sid), _row(op), xx=True)
        elif op.kind == "delete_session":
            pipe.delete(*(self._key(kind, sid) for kind in _SESSION_KEYS))
            pipe.zrem(self._key("sessions"), sid)
        elif op.kind == "request":
            self._last_order = max(self._last_order + 1, int(self.clock.time() * 1_000_000))
            pipe.hset(self._key("requests", sid), target, _row(op))
            pipe.zadd(self._key("order", sid), {target: self._last_order})
        elif op.kind == "delete_request":
            pipe.hdel(self._key("requests", sid), target)
            pipe.zrem(self._key("order", sid), target)
        elif op.kind == "turn":
            pipe.hset(self._key("turns", sid), target, _row(op))
            pipe.hdel(self._key("delivered", sid), target)  # the row says, until marked
            pipe.zadd(self._key("turnorder", sid), {target: op.row[_CREATED]})
            for kind, present in (("running", op.row[_STATUS] == "running"),
                                  ("undelivered", not op.row[_DELIVERED])):
                if present:
                    pipe.sadd(self._key(kind, sid), target)
                else:
                    pipe.srem(self._key(kind, sid), target)
        elif op.kind == "end_delivered":
            pipe.hset(self._key("delivered", sid), target, 1)
            pipe.srem(self._key("undelivered", sid), target)
        elif op.kind == "key":
            pipe.hset(self._key("keys", sid), target, _row(op))
        elif op.kind == "delete_key":
            pipe.hdel(self._key("keys", sid), target)
        else:
            raise ValueError(f"no such write: {op.kind}")

    async def _listed(self) -> list[str]:
        """The stored sessions' ids; none if the list of them is of another type (it is
        reported as a damaged row is: the node starts, its writes of sessions fail)."""
        try:
            return await self._session_ids()
        except StoreRefused as exc:
            rows.skipped("sessions", self._key("sessions"), str(exc))
            return []

    async def _session_ids(self) -> list[str]:
        raw: list[bytes] = await self._call(
            lambda: self._redis.zrange(self._key("sessions"), 0, -1))  # type: ignore[arg-type,return-value]
        return [value.decode("utf-8", "replace") for value in raw]

    async def _prune(self, keep: int) -> None:
        """Per session: the turns past the ``keep`` latest (by ``P:turnorder``) that are
        not running, not undelivered and not named by a key; no turn row is read."""
        ids = await self._session_ids()
        for start in range(0, len(ids), CHUNK):
            chunk = ids[start:start + CHUNK]
            pipe = self._redis.pipeline(transaction=False)
            for sid in chunk:
                pipe.zrange(self._key("turnorder", sid), 0, -(keep + 1))
                pipe.smembers(self._key("running", sid))
                pipe.smembers(self._key("undelivered", sid))
                pipe.hvals(self._key("keys", sid))
            replies = await self._call(partial(pipe.execute, raise_on_error=False))
            deletes = self._redis.pipeline(transaction=True)
            for n, sid in enumerate(chunk):
                if _refused(replies[4 * n:4 * n + 4], self._key("session", sid)):
                    continue  # left as it is
                older, running, undelivered, keys = replies[4 * n:4 * n + 4]
                kept = running | undelivered | _keyed_turns(keys)
                gone = [tid for tid in older if tid not in kept]
                if gone:
                    deletes.hdel(self._key("turns", sid), *gone)
                    deletes.zrem(self._key("turnorder", sid), *gone)
                    deletes.hdel(self._key("delivered", sid), *gone)
            if len(deletes):
                await self._call(deletes.execute)

    async def _probe(self) -> None:
        await self._call(self._redis.ping)

    async def _release(self) -> None:
        if self._publisher is not None:
            await self._publisher.close()
        with contextlib.suppress(*_UNREACHABLE, redis_errors.RedisError):
            await self._redis.aclose()  # the connection is gone either way


def _refused(replies: list[Any], where: str) -> bool:
    """Whether Redis refused a read of one session's keys (one of them is of another
    type): the whole session is left out, as a damaged row is (read without its
    requests or keys, a call could run twice)."""
    for reply in replies:
        if isinstance(reply, redis_errors.RedisError):
            rows.skipped("sessions", where, f"Redis refused to read it ({reason(reply)})")
            return True
    return False


def _text(value: Any) -> str | None:
    """A node's name as Redis returns it (bytes), or None."""
    return None if value is None else bytes(value).decode("utf-8", "replace")


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def _where(key: str, field: bytes) -> str:
    return f"{key}/{field.decode('utf-8', 'backslashreplace')}"


def _row(op: Op) -> str:
    return _json(op.row)


def _json(row: tuple[Any, ...]) -> str:
    return strictjson.encode(row)


def _decoded(value: Any, width: int) -> list[Any]:
    columns = json.loads(value)
    if not isinstance(columns, list) or len(columns) != width:
        raise ValueError(f"the row is not a list of {width} columns")
    return columns


def _columns(build: Callable[..., Any], width: int) -> Callable[..., Any]:
    """``build`` of a row stored as the JSON array of its columns."""
    def built(stored: tuple[Any, ...], *context: Any) -> Any:
        return build(tuple(_decoded(stored[0], width)), *context)
    return built


def _session_columns(stored: tuple[Any, ...]) -> SessionRecord:
    """A session of its row and its tools as stored (an older Core's row: tools inside)."""
    columns = _decoded(stored[0], len(SESSION_COLUMNS))
    if stored[1] is not None:
        columns[_TOOLS] = stored[1]
    return rows.session(tuple(columns))


def _turn_columns(stored: tuple[Any, ...], *context: Any) -> Any:
    columns = _decoded(stored[0], len(TURN_COLUMNS))
    if stored[1]:  # marked delivered since the row was saved
        columns[TURN_COLUMNS.index("end_delivered")] = 1
    return rows.turn(tuple(columns), *context)


def _keyed_turns(keys: list[bytes]) -> set[bytes]:
    """The turn ids the idempotency-key rows ``keys`` name (a row that cannot be read
    names none: the load reports it)."""
    named = set()
    kind, target = KEY_COLUMNS.index("kind"), KEY_COLUMNS.index("target_id")
    for value in keys:
        try:
            row = json.loads(value)
            if row[kind] == TURN:
                named.add(str(row[target]).encode())
        except (ValueError, TypeError, IndexError, KeyError):
            continue
    return named
