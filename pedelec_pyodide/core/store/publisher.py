"""The messages between nodes published on a connection of their own to Redis: each
``PUBLISH`` written at once on one asyncio stream (pipelined: many may be on their way),
its reply read back in order by one reader.

Two are published for every call crossing nodes (the ask and its reply). Through
redis-py's client one costs ~90 µs of CPU here, through this ~16 µs (measured on the
2-core machine of docs/records/benchmarks.md, a 400-byte message): the client takes a
pooled connection, wraps the write in a task of its own (``wait_for``, Python 3.11), the
read in a timeout, and records metrics. Plain TCP only; for ``rediss://`` the store
publishes through redis-py (its TLS settings are the client's).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque

from redis import exceptions as redis_errors
from redis.asyncio import Redis
from redis.asyncio.connection import Connection

from ..clock import Clock, Timer


def _bulk(part: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(part), part)


# Error replies a PUBLISH may get, as redis-py's client raises them (the store tells
# "out of reach" from "refused" by these classes); any other is a refusal
_ERRORS: dict[str, type[redis_errors.RedisError]] = {
    "LOADING": redis_errors.BusyLoadingError,
    "NOPERM": redis_errors.NoPermissionError,
    "NOAUTH": redis_errors.AuthenticationError,
    "WRONGPASS": redis_errors.AuthenticationError,
    "READONLY": redis_errors.ReadOnlyError,
    "OOM": redis_errors.OutOfMemoryError,
}


def error_reply(text: str) -> redis_errors.RedisError:
    """The exception for an error reply (``-CODE message``)."""
    if text == "ERR max number of clients reached":  # to a new connection's first command
        return redis_errors.ConnectionError(text)  # (redis-py's is one, in newer releases)
    return _ERRORS.get(text.split(" ", 1)[0], redis_errors.ResponseError)(text)


def command(*parts: bytes) -> bytes:
    """A command in Redis's wire format (RESP)."""
    return b"*%d\r\n%s" % (len(parts), b"".join(_bulk(part) for part in parts))


class _Connection:
    """One stream to Redis and the replies it owes, in the order they are owed."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 timeout: float, clock: Clock) -> None:
        self.writer = writer
        self.clock = clock
        self.owed: deque[asyncio.Future[int]] = deque()
        self.timeout = timeout
        # while replies are owed, Redis has ``timeout`` seconds for the next one; then
        # the connection is dropped (the waiting publishes fail as Redis out of reach)
        self._timer: Timer | None = None
        self._timed_out = False
        self.reading = asyncio.ensure_future(self._read(reader))

    @property
    def open(self) -> bool:
        return not self.reading.done()

    def send(self, packed: bytes) -> asyncio.Future[int]:
        reply: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        if not self.owed:
            self._wait_for_reply()
        self.owed.append(reply)
        self.writer.write(packed)
        return reply

    def _wait_for_reply(self) -> None:
        self._timer = self.clock.call_later(self.timeout, self._expired)

    def _expired(self) -> None:
        self._timed_out = True
        self.writer.transport.abort()  # the reader sees the end of the stream

    async def _read(self, reader: asyncio.StreamReader) -> None:
        failure: Exception = redis_errors.ConnectionError("Redis closed the connection")
        try:
            while line := await reader.readline():
                reply = self.owed.popleft()  # (Redis says nothing unasked)
                if self._timer is not None:
                    self._timer.cancel()
                if self.owed:
                    self._wait_for_reply()
                if reply.done():  # its publisher gave up waiting
                    continue
                if line.startswith(b":"):
                    reply.set_result(int(line[1:]))
                else:  # an error (PUBLISH answers nothing else)
                    text = line[1:].decode("utf-8", "replace").strip()
                    reply.set_exception(error_reply(text))
        except (OSError, ValueError, IndexError) as exc:  # cut, or a reply not understood
            failure = redis_errors.ConnectionError(str(exc) or type(exc).__name__)
        finally:
            if self._timer is not None:
                self._timer.cancel()
            if self._timed_out:
                failure = redis_errors.TimeoutError(
                    f"Redis did not answer a publish within {self.timeout:g} s")
            self.writer.close()
            while self.owed:
                reply = self.owed.popleft()
                if not reply.done():
                    reply.set_exception(failure)

    async def close(self) -> None:
        self.reading.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.reading


class Publisher:
    """``PUBLISH`` on a connection of its own, opened when first needed and again once
    it failed; errors raised as redis-py's (the store says what they mean)."""

    def __init__(self, host: str, port: int, username: str | None, password: str | None,
                 timeout: float, clock: Clock) -> None:
        self._clock = clock
        self._address = (host, port)
        self._login = None if password is None else command(
            b"AUTH", *([username.encode()] if username else []), password.encode())
        self._timeout = timeout
        self._connection: _Connection | None = None
        self._connecting = asyncio.Lock()

    @classmethod
    def of(cls, client: Redis, timeout: float, clock: Clock) -> Publisher | None:
        """The publisher of a redis-py client's server (its URL as the client read it);
        None over TLS or a Unix socket."""
        pool = client.connection_pool
        kwargs = pool.connection_kwargs
        if pool.connection_class is not Connection or "host" not in kwargs:
            return None
        return cls(kwargs["host"], int(kwargs.get("port", 6379)), kwargs.get("username"),
                   kwargs.get("password"), timeout, clock)

    async def publish(self, channel: str, data: bytes | str) -> int:
        """How many subscribers ``data`` reached on ``channel``."""
        packed = command(b"PUBLISH", channel.encode(),
                         data.encode() if isinstance(data, str) else data)
        connection = self._connection
        if connection is None or not connection.open:
            connection = await self._connect()
        return await connection.send(packed)

    async def _connect(self) -> _Connection:
        async with self._connecting:
            connection = self._connection
            if connection is not None and connection.open:
                return connection  # another publish opened it meanwhile
            writer = None
            try:
                async with self._clock.timeout(self._timeout):
                    reader, writer = await asyncio.open_connection(*self._address)
                    if self._login is not None:
                        writer.write(self._login)
                        answer = await reader.readline()
                        if not answer.startswith(b"+"):
                            raise redis_errors.AuthenticationError(
                                answer[1:].decode("utf-8", "replace").strip()
                                or "Redis closed the connection")
            except BaseException as exc:
                if writer is not None:  # a connection half set up is not kept
                    writer.close()
                if isinstance(exc, TimeoutError):
                    raise redis_errors.TimeoutError(
                        f"Redis did not accept a connection within {self._timeout:g} s"
                    ) from None
                raise
            self._connection = _Connection(reader, writer, self._timeout, self._clock)
            return self._connection

    async def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            await connection.close()
