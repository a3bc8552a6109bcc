"""The messages between nodes go out on a connection of the Redis store's own
(store/publisher.py), PUBLISH after PUBLISH without waiting: each still gets its own
answer, in order, and Redis restarted, silent or refusing one is what it is through
redis-py's client (StoreUnavailable, StoreRefused), the connection opened again after."""

from __future__ import annotations

import asyncio

import pytest
from corekit import run
from redis import exceptions as redis_errors
from redis.asyncio import Redis
from storekit import RedisServer

from pedelec_pyodide.core.store import StoreError, open_store
from pedelec_pyodide.core.store.errors import StoreRefused, StoreUnavailable
from pedelec_pyodide.core.store.publisher import error_reply
from pedelec_pyodide.core.store.redis import RedisStore

CHANNEL = "pedelec:main:node:a"


async def heard(subscriber: Redis, count: int, ready: asyncio.Event) -> list[bytes]:
    """The first ``count`` messages on node a's channel (``ready`` once subscribed)."""
    pubsub = subscriber.pubsub(ignore_subscribe_messages=True)
    await pubsub.subscribe(CHANNEL)
    got: list[bytes] = []
    ready.set()
    while len(got) < count:
        message = await pubsub.get_message(timeout=5.0)
        if message is not None:
            got.append(message["data"])
    await pubsub.aclose()  # type: ignore[no-untyped-call, unused-ignore]
    return got


def redis_store(url: str, timeout: float = 5.0) -> RedisStore:
    store = open_store(url, timeout)
    assert isinstance(store, RedisStore)
    return store


def test_publishes_on_their_way_together_each_get_their_own_answer_in_order(
        redis_server: RedisServer) -> None:
    async def main() -> None:
        ready = asyncio.Event()
        store = redis_store(redis_server.url)
        subscriber = Redis.from_url(redis_server.url)
        try:
            listening = asyncio.ensure_future(heard(subscriber, 50, ready))
            await ready.wait()
            reached = await asyncio.gather(*(store.publish("a", f"m{n}") for n in range(50)))
            assert reached == [1] * 50
            assert await store.publish("nobody", "x") == 0
            assert await listening == [f"m{n}".encode() for n in range(50)]
        finally:
            await store.close()
            await subscriber.aclose()

    run(main())


def test_a_publish_after_redis_restarted_opens_the_connection_again(
        redis_server: RedisServer) -> None:
    async def main() -> None:
        store = redis_store(redis_server.url)
        try:
            assert await store.publish("a", "before") == 0
            redis_server.stop()
            with pytest.raises(StoreUnavailable):
                await store.publish("a", "while away")
            redis_server.start()
            assert await store.publish("a", "after") == 0
        finally:
            await store.close()

    run(main())


def test_a_silent_redis_fails_a_publish_within_the_store_timeout(
        redis_server: RedisServer) -> None:
    async def main() -> None:
        store = redis_store(redis_server.url, timeout=0.5)
        try:
            assert await store.publish("a", "first") == 0
            with redis_server.paused():
                started = asyncio.get_running_loop().time()
                with pytest.raises(StoreUnavailable):
                    await store.publish("a", "unanswered")
                assert asyncio.get_running_loop().time() - started < 2.0
            assert await store.publish("a", "answered again") == 0
        finally:
            await store.close()

    run(main())


def test_a_refused_publish_is_refused_and_the_next_one_answered(
        redis_server: RedisServer) -> None:
    """A user whose channels are node a's alone: a publish to b is NOPERM
    (StoreRefused), and the connection's next answer is the next publish's."""
    with redis_server.client() as client:
        client.execute_command("ACL", "SETUSER", "one", "on", ">one-password-of-the-test",
                               "resetchannels", f"&{CHANNEL}", "+publish")
    url = f"redis://one:one-password-of-the-test@127.0.0.1:{redis_server.port}/0"

    async def main() -> None:
        store = redis_store(url)
        try:
            refused, reached = await asyncio.gather(
                store.publish("b", "not allowed"), store.publish("a", "allowed"),
                return_exceptions=True)
            assert isinstance(refused, StoreRefused), refused
            assert "NoPermissionError" in str(refused)  # as redis-py says it
            assert reached == 0
        finally:
            await store.close()

    run(main())


def test_a_wrong_password_is_redis_out_of_reach_as_with_redis_py(
        redis_server: RedisServer) -> None:
    with redis_server.client() as client:
        client.execute_command("ACL", "SETUSER", "one", "on", ">one-password-of-the-test",
                               "&*", "+publish")
    url = f"redis://one:another-password@127.0.0.1:{redis_server.port}/0"

    async def main() -> None:
        store = redis_store(url)
        try:
            with pytest.raises(StoreError) as caught:
                await store.publish("a", "x")
            assert isinstance(caught.value, StoreUnavailable)
            assert "another-password" not in str(caught.value)
        finally:
            await store.close()

    run(main())


@pytest.mark.parametrize(("reply", "kind"), [
    ("LOADING Redis is loading the dataset in memory", redis_errors.BusyLoadingError),
    ("ERR max number of clients reached", redis_errors.ConnectionError),
    ("NOPERM User u has no permissions to access the 'b' channel",
     redis_errors.NoPermissionError),
    ("NOAUTH Authentication required.", redis_errors.AuthenticationError),
    ("READONLY You can't write against a read only replica.", redis_errors.ReadOnlyError),
    ("OOM command not allowed when used memory > 'maxmemory'.",
     redis_errors.OutOfMemoryError),
    ("ERR unknown command", redis_errors.ResponseError),
])
def test_an_error_reply_is_the_exception_redis_py_raises(reply: str, kind: type) -> None:
    """Out of reach (a ConnectionError: the store's StoreUnavailable) or refused, as
    redis-py's own client tells them (its class for too many clients, newer than our
    oldest redis-py, is a ConnectionError)."""
    error = error_reply(reply)
    assert type(error) is kind and str(error) == reply
    unreachable = isinstance(error, redis_errors.ConnectionError)
    assert unreachable == reply.startswith(("LOADING", "ERR max", "NOAUTH"))
