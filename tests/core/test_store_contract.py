"""The store contract: what every backend does, each test run against every backend.

A backend is reached through a :class:`Backend` of ``storekit.py``: ``open()`` a store,
``reopen()`` another on the same data (as a restarted Core would), and the faults a test
needs made real (``stalled``: the store takes nothing for a while; ``refusing``: it
answers every write with an error; ``damage_request``: a stored row spoiled behind Core's
back).
The memory store keeps nothing past its process, so the tests of what is stored run on the
durable backends; the rest run on all of them.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from pathlib import Path
from typing import Any

import pytest
from corekit import run, tool_meta
from storekit import (
    BACKENDS,
    DURABLE,
    Backend,
    DurableBackend,
    MemoryBackend,
    RedisBackend,
    RedisServer,
    SQLiteBackend,
)

from pedelec_pyodide.core.store import (
    RECENT_TURNS,
    IdempotencyRecord,
    RequestRecord,
    SessionRecord,
    Snapshot,
    Store,
    StoreError,
    StoreUnavailable,
    TurnRecord,
    dump_json,
    hash_token,
    open_store,
)


def session(sid: str, created_at: float = 1.0, history: str = "[]") -> SessionRecord:
    return SessionRecord(sid, hash_token("t-" + sid), "[]", history, created_at)


def request(rid: str, sid: str = "s1", args: Any = None, **fields: Any) -> RequestRecord:
    return RequestRecord(rid, sid, fields.pop("turn_id", None), 0, 0, "echo",
                         {"n": 1} if args is None else args, 1e12, **fields)


def turn(tid: str, sid: str = "s1", created_at: float = 1.0, **fields: Any) -> TurnRecord:
    fields.setdefault("status", "completed")
    fields.setdefault("end_delivered", True)
    return TurnRecord(tid, sid, "hi", created_at=created_at, **fields)


def key(name: str, sid: str, target: str, kind: Any = "turn") -> IdempotencyRecord:
    return IdempotencyRecord(hash_token(sid + name), sid, kind, "f" * 64, target, 2.0)


@pytest.fixture
def memory() -> Backend:
    return MemoryBackend()


@pytest.fixture
def sqlite(tmp_path: Path) -> DurableBackend:
    return SQLiteBackend(tmp_path / "core.sqlite")


@pytest.fixture
def redis_backend(redis_server: RedisServer) -> DurableBackend:
    return RedisBackend(redis_server)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Backend:
    made: Backend = request.getfixturevalue(request.param)
    return made


@pytest.fixture(params=DURABLE)
def durable(request: pytest.FixtureRequest) -> DurableBackend:
    made: DurableBackend = request.getfixturevalue(request.param)
    return made


async def store_all(store: Store, *records: Any) -> None:
    for record in records:
        if isinstance(record, SessionRecord):
            store.save_session(record)
        elif isinstance(record, RequestRecord):
            store.save_request(record)
        elif isinstance(record, TurnRecord):
            store.save_turn(record)
        else:
            store.save_key(record)
    await store.flush()


async def restarted(backend: Backend, store: Store) -> Snapshot:
    """What a Core started after this one stopped would load."""
    await store.close()
    other = backend.reopen()
    try:
        return await other.load()
    finally:
        await other.close()


# --- every backend ---------------------------------------------------------------------------


def test_saves_never_raise_and_a_flush_returns(backend: Backend) -> None:
    async def main() -> None:
        store = backend.open()
        await store_all(store, session("s1"), request("r1"), turn("t1"))
        store.mark_end_delivered("s1", "t1")
        store.delete_request("s1", "r1")
        store.delete_session("s1")
        store.prune_turns(RECENT_TURNS)
        await store.flush("s1", "r1")
        assert store.problem is None
        await store.close()

    run(main())


def test_the_memory_store_keeps_nothing(memory: Backend) -> None:
    async def main() -> None:
        store = memory.open()
        await store_all(store, session("s1"), request("r1"))
        assert not store.durable
        assert await store.load_session_record("s1") is None
        assert await restarted(memory, store) == Snapshot()

    run(main())


# --- what is stored ------------------------------------------------------------------------


def test_records_are_captured_when_saved(durable: DurableBackend) -> None:
    """Core goes on changing its records after it saves them: what is stored is what they
    were at ``save_*``, whenever the store writes it."""

    async def main() -> None:
        store = durable.open()
        record = session("s1")
        args = {"n": 1}
        pending = request("r1", args=args)
        ended = turn("t1", tool_calls=[{"tool": "echo"}])
        with durable.stalled():  # the writes queue up: nothing written yet
            store.save_session(record)
            store.save_request(pending)
            store.save_turn(ended)
            record.history = '[{"changed": true}]'
            args["n"] = 2
            pending.handled_by = "named"
            ended.tool_calls.append({"tool": "changed"})
            ended.status = "failed"
        await store.flush()
        snapshot = await restarted(durable, store)
        assert [s.history for s in snapshot.sessions] == ["[]"]
        assert [(r.args, r.handled_by) for r in snapshot.requests] == [({"n": 1}, None)]
        assert [(t.status, t.tool_calls) for t in snapshot.turns] == [
            ("completed", [{"tool": "echo"}])]

    run(main())


def test_every_field_comes_back_as_saved(durable: DurableBackend) -> None:
    async def main() -> None:
        store = durable.open()
        records = [
            SessionRecord("s1", hash_token("t"), "[]", '[{"role":"user","content":"é"}]',
                          12.5),
            RequestRecord("r1", "s1", "t1", 2, 3, "echo", {"a": [1, "ü"]}, 99.5),
            RequestRecord("r2", "s1", None, 0, 0, "echo", None, 98.0, {"ok": True}, "named",
                          50.25),
            TurnRecord("t1", "s1", "hello", "running", created_at=5.0),
            TurnRecord("t0", "s1", "before", "failed", "", {"code": "X", "message": "m"},
                       [{"tool": "echo", "args": {}}], False, 4.0, {"input_tokens": 7}),
            key("k", "s1", "r2", "tool-call"),
        ]
        await store_all(store, *records)
        snapshot = await restarted(durable, store)
        assert snapshot.sessions == records[:1]
        assert snapshot.requests == records[1:3]
        assert snapshot.turns == [records[4], records[3]]  # by created_at
        assert snapshot.keys == records[5:]

    run(main())


def test_order_at_load(durable: DurableBackend) -> None:
    """Sessions, turns and keys by creation; requests in the order they were last
    saved (a request saved again with its result comes after those saved since)."""

    async def main() -> None:
        store = durable.open()
        await store_all(store, session("late", 3.0), session("early", 1.0),
                        request("r1", "early"), request("r2", "early"),
                        turn("t2", "early", 2.0), turn("t1", "early", 1.0))
        store.save_request(request("r1", "early", result=1, handled_by="named",
                                   finished_at=5.0))
        snapshot = await restarted(durable, store)
        assert [s.id for s in snapshot.sessions] == ["early", "late"]
        assert [r.id for r in snapshot.requests] == ["r2", "r1"]
        assert [t.id for t in snapshot.turns] == ["t1", "t2"]

    run(main())


def test_a_record_saved_again_replaces_it_and_deletes_delete(durable: DurableBackend) -> None:
    async def main() -> None:
        store = durable.open()
        await store_all(store, session("s1"), request("r1"), request("r2"),
                        key("a", "s1", "r1", "tool-call"), key("b", "s1", "r2", "tool-call"),
                        turn("t1", end_delivered=False))
        store.save_session(session("s1", history='[{"again":1}]'))
        store.delete_request("s1", "r1")
        store.delete_key("s1", key("a", "s1", "r1").key_hash)
        store.mark_end_delivered("s1", "t1")
        store.mark_end_delivered("s1", "never-saved")  # changes nothing, creates nothing
        snapshot = await restarted(durable, store)
        assert [s.history for s in snapshot.sessions] == ['[{"again":1}]']
        assert [r.id for r in snapshot.requests] == ["r2"]
        assert [k.target_id for k in snapshot.keys] == ["r2"]
        assert [(t.id, t.end_delivered) for t in snapshot.turns] == [("t1", True)]

    run(main())


def test_a_sessions_tools_and_its_history_are_saved_each_alone(
        durable: DurableBackend) -> None:
    """``save_tools`` writes the tools, not the history the record holds by then (a
    ``tools.update``); ``save_history`` the history, not the tools (a turn's end);
    neither stores a session that is not stored."""
    tools_a, tools_b = (dump_json([tool_meta(name)]) for name in "ab")

    async def main() -> None:
        store = durable.open()
        record = session("s1")
        await store_all(store, record)
        record.tools, record.history = tools_a, '[{"turn":1}]'
        store.save_tools(record)
        await store.flush()
        other = durable.reopen()  # another node
        try:
            stored = await other.load_session_record("s1")
            assert stored is not None and (stored.tools, stored.history) == (tools_a, "[]")
        finally:
            await other.close()
        record.tools, record.history = tools_b, '[{"turn":2}]'
        store.save_history(record)
        for never in (session("s2"), session("s3")):
            store.save_tools(never)
            store.save_history(never)
        snapshot = await restarted(durable, store)
        assert [(s.id, s.tools, s.history) for s in snapshot.sessions] == [
            ("s1", tools_a, '[{"turn":2}]')]
        other = durable.reopen()
        try:
            assert await other.load_session("s2") == Snapshot()
        finally:
            await other.close()

    run(main())


def test_delete_session_takes_its_requests_turns_and_keys(durable: DurableBackend) -> None:
    async def main() -> None:
        store = durable.open()
        for sid in ("gone", "kept"):
            await store_all(store, session(sid), request(f"r-{sid}", sid),
                            request(f"k-{sid}", sid, result=1, handled_by="named",
                                    finished_at=1.0),
                            turn(f"t-{sid}", sid), turn(f"u-{sid}", sid, 2.0, status="running"),
                            key("x", sid, f"t-{sid}"))
        store.delete_session("gone")
        snapshot = await restarted(durable, store)
        assert {s.id for s in snapshot.sessions} == {"kept"}
        assert {r.id for r in snapshot.requests} == {"r-kept", "k-kept"}
        assert {t.id for t in snapshot.turns} == {"t-kept", "u-kept"}
        assert {k.session_id for k in snapshot.keys} == {"kept"}
        # and a session saved again under that id starts empty
        store = durable.reopen()
        await store_all(store, session("gone"))
        snapshot = await restarted(durable, store)
        assert {r.session_id for r in snapshot.requests} == {"kept"}

    run(main())


def test_prune_turns_keeps_the_latest_and_every_one_still_needed(durable: DurableBackend) -> None:
    """Per session: the latest ``keep`` turns stay, and older ones that are running, whose
    end the page has not had, or that an idempotency key names; nothing else. Loading
    prunes nothing: a turn stays until ``prune_turns`` says otherwise."""

    async def main() -> None:
        store = durable.open()
        await store_all(store, session("s1"), session("s2"))
        for n in range(20):
            store.save_turn(turn(f"t{n:02}", "s1", float(n)))
        store.save_turn(turn("s2-old", "s2", 0.5))
        store.save_turn(turn("running", "s1", 0.1, status="running"))
        store.save_turn(turn("undelivered", "s1", 0.2, end_delivered=False))
        store.save_turn(turn("keyed", "s1", 0.3))
        store.save_key(key("k", "s1", "keyed"))
        await store.flush()
        store = await reopened(durable, store)
        assert len((await store.load()).turns) == 24  # all of them, until pruned
        store.prune_turns(4)
        snapshot = await restarted(durable, store)
        assert sorted(t.id for t in snapshot.turns) == [
            "keyed", "running", "s2-old", "t16", "t17", "t18", "t19", "undelivered"]

    run(main())


async def reopened(backend: Backend, store: Store) -> Store:
    await store.close()
    return backend.reopen()


# --- flush ------------------------------------------------------------------------------------


def test_flush_returns_once_earlier_writes_are_stored(durable: DurableBackend) -> None:
    """A flush returns only after every earlier write is stored: read from a second store
    on the same data (another Core) as soon as it returns."""

    async def main() -> None:
        store = durable.open()
        store.save_session(session("s1"))
        for n in range(200):
            store.save_request(request(f"r{n:03}", args={"blob": "x" * 1000}))
        await store.flush()
        other = durable.reopen()
        try:
            assert len((await other.load()).requests) == 200
        finally:
            await other.close()
        await store.close()

    run(main())


def test_a_flush_has_a_deadline_and_the_writes_go_through_after(durable: DurableBackend) -> None:
    async def main() -> None:
        store = durable.open()
        await store_all(store, session("s1"))
        with durable.stalled():
            store.save_request(request("r1"))
            started = time.monotonic()
            with pytest.raises(StoreError):
                await store.flush("r1", timeout=0.5)
            assert 0.4 < time.monotonic() - started < 4
            assert store.problem is not None
        await store.flush("r1", timeout=10)
        assert store.problem is None
        assert [r.id for r in (await restarted(durable, store)).requests] == ["r1"]

    run(main())


# --- failures -------------------------------------------------------------------------------


def test_a_value_that_cannot_be_stored_fails_its_own_write(durable: DurableBackend) -> None:
    """A lone surrogate, an object JSON cannot hold and NaN: each fails the flush that
    names its write, once; the store is not "degraded" by a caller's value; the good
    writes are stored."""

    async def main() -> None:
        store = durable.open()
        store.save_session(session("s1"))
        store.save_request(request("surrogate", args={"delta": "\ud800"}))
        store.save_request(request("object", args={"when": object()}))
        store.save_request(request("nan", args={"x": math.nan}))
        store.save_request(request("good"))
        await store.flush("s1", "good")
        for name, words in (("surrogate", "surrogates not allowed"),
                            ("object", "not JSON serializable"),
                            ("nan", "Out of range float")):
            with pytest.raises(StoreError, match=words):
                await store.flush(name)
            await store.flush(name)  # reported to the flush that asked, once
        assert store.problem is None
        store.save_request(request("after"))
        await store.flush("after")
        assert [r.id for r in (await restarted(durable, store)).requests] == ["good", "after"]

    run(main())


def test_a_write_the_store_refuses_is_reported_and_the_writer_goes_on(
        durable: DurableBackend) -> None:
    """The store answers writes with an error: the flush naming one raises, at once (not
    at its deadline); ``problem`` says why (health: degraded); once the store takes writes
    again the next write is stored and ``problem`` clears."""

    async def main() -> None:
        store = durable.open()
        await store_all(store, session("s1"))
        async with durable.refusing(store):
            store.save_request(request("refused"))
            started = time.monotonic()
            with pytest.raises(StoreError, match=durable.refusal):
                await store.flush("refused", timeout=30)
            assert time.monotonic() - started < 10
            assert store.problem is not None and durable.refusal in store.problem
        store.save_request(request("after"))
        await store.flush("after")
        assert store.problem is None
        assert [r.id for r in (await restarted(durable, store)).requests] == ["after"]

    run(main())


def test_a_failure_nobody_flushed_does_not_fail_a_later_write_of_its_key(
        durable: DurableBackend) -> None:
    """A write the store refused, whose key no flush named (a key forgotten after
    STORE_FAILED), is not reported by the flush of a later write that replaces its record
    (the retry's new key): that flush says what the store holds now. A write of part of a
    record (tools, history) leaves an earlier failure standing."""

    async def main() -> None:
        store = durable.open()
        retried = key("k1", "s1", "t1")
        await store_all(store, session("s1"), turn("t1"))
        async with durable.refusing(store):
            store.delete_key("s1", retried.key_hash)
            store.save_tools(session("s1"))
            await store.flush()  # both refused; nobody named their keys
        store.save_key(retried)
        await store.flush(retried.key_hash)
        store.save_history(session("s1", history='[{"said":1}]'))
        with pytest.raises(StoreError, match=durable.refusal):
            await store.flush("s1")
        loaded = await restarted(durable, store)
        assert [k.key_hash for k in loaded.keys] == [retried.key_hash]
        assert [s.history for s in loaded.sessions] == ['[{"said":1}]']

    run(main())


def test_damaged_rows_are_skipped_at_load_with_a_warning(
        durable: DurableBackend, caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> Snapshot:
        store = durable.open()
        await store_all(store, session("s1"), request("r1"), request("bad"), request("r3"))
        await store.close()
        durable.damage_request("bad")
        other = durable.reopen()
        try:
            return await other.load()
        finally:
            await other.close()

    with caplog.at_level(logging.WARNING, logger="pedelec.core"):
        snapshot = run(main())
    assert [r.id for r in snapshot.requests] == ["r1", "r3"]
    assert sum("store.row_skipped" in r.getMessage() for r in caplog.records) == 1


def test_close_stores_what_was_queued(durable: DurableBackend) -> None:
    async def main() -> None:
        store = durable.open()
        store.save_session(session("s1"))
        store.save_request(request("r1"))
        assert [r.id for r in (await restarted(durable, store)).requests] == ["r1"]

    run(main())


def test_many_tasks_writing_and_flushing_at_once_are_all_stored_in_order(
        durable: DurableBackend) -> None:

    async def main() -> None:
        store = durable.open()
        store.save_session(session("s1"))

        async def one(n: int) -> None:
            store.save_request(request(f"r{n:03}"))
            await store.flush(f"r{n:03}")

        await asyncio.gather(*(one(n) for n in range(100)))
        ids = [r.id for r in (await restarted(durable, store)).requests]
        assert ids == [f"r{n:03}" for n in range(100)]

    run(main())


def test_load_session_gives_one_sessions_records(durable: DurableBackend) -> None:
    async def main() -> None:
        store = durable.open()
        await store_all(store, session("s1"), session("s2", 2.0), request("r1"),
                        request("r2", "s2"), turn("t1"), turn("t2", "s2"),
                        key("k", "s1", "r1", "tool-call"), key("k", "s2", "t2"))
        other = durable.reopen()  # another node
        try:
            one = await other.load_session("s2")
            assert [s.id for s in one.sessions] == ["s2"]
            assert [(r.id, t.id, k.target_id) for r, t, k in zip(
                one.requests, one.turns, one.keys, strict=True)] == [("r2", "t2", "t2")]
            assert await other.load_session("nope") == Snapshot()
        finally:
            await other.close()
            await store.close()

    run(main())


def test_load_session_record_gives_the_sessions_row_alone(durable: DurableBackend) -> None:
    async def main() -> None:
        store = durable.open()
        await store_all(store, session("s1"), session("s2", 2.0, '[{"role": "user"}]'),
                        request("r2", "s2"))
        other = durable.reopen()  # another node
        try:
            assert await other.load_session_record("s2") == session(
                "s2", 2.0, '[{"role": "user"}]')
            assert await other.load_session_record("nope") is None
        finally:
            await other.close()
            await store.close()

    run(main())


# --- leases -----------------------------------------------------------------------------------


def test_a_lease_is_claimed_renewed_released_and_expires(backend: Backend) -> None:
    async def main() -> None:
        store = backend.open()
        try:
            assert await store.holder("s1") is None
            assert await store.claim("s1", "a", 5.0) is None
            assert await store.holder("s1") == "a"
            assert await store.claim("s1", "a", 5.0) == "a"  # the node itself, again
            assert await store.claim("s1", "b", 5.0) == "a"  # taken over
            assert await store.renew(["s1"], "a", 5.0) == (["s1"], [])  # a lost it
            assert await store.holder("s1") == "b"
            await store.release("s1", "a")  # not a's: b keeps it
            assert await store.holder("s1") == "b"
            await store.release("s1", "b")
            assert await store.holder("s1") is None
            # Each sleep is only a lower bound (a stalled machine sleeps longer): a TTL
            # must pass, the other one (60 s) cannot within a test.
            assert await store.claim("s2", "a", 0.3) is None
            assert await store.renew(["s2"], "a", 60.0) == ([], [])  # renewed
            await asyncio.sleep(0.4)  # past the claim's TTL, within the renewal's
            assert await store.holder("s2") == "a"
            assert await store.renew(["s2"], "a", 0.3) == ([], [])  # renewed for a moment only
            await asyncio.sleep(0.4)  # not renewed again: expired, as when a node dies
            assert await store.holder("s2") is None
            # free (expired, or never held): taken again
            assert await store.renew(["s2", "s3"], "a", 5.0) == ([], ["s2", "s3"])
            assert await store.claim("s2", "b", 5.0) == "a"
            assert await store.holder("s3") == "a"
            assert await store.holders(["s3", "s1", "s2", "s3"]) == ["a", None, "b", "a"]
            assert await store.holders([]) == []
        finally:
            await store.close()

    run(main())


def test_unstored_names_the_sessions_a_load_would_not_find(backend: Backend) -> None:
    """What a node asks when its renewal took a lease again (the store may have lost
    the session: Redis restarted without its data). The memory store stores none."""

    async def main() -> None:
        store = backend.open()
        try:
            store.save_session(session("s1"))
            store.save_session(session("s2"))
            await store.flush()
            store.delete_session("s2")
            await store.flush()
            many = [f"x{n}" for n in range(1200)]  # asked in chunks
            found = await store.unstored(["s3", "s1", "s2", *many])
            if isinstance(backend, MemoryBackend):
                assert found == ["s3", "s1", "s2", *many]
            else:
                assert found == ["s3", "s2", *many]
            assert await store.unstored([]) == []
        finally:
            await store.close()

    run(main())


def test_redis_leases_are_seen_by_every_node_of_the_cluster_only(
        redis_server: RedisServer) -> None:
    """Two stores on one Redis URL are two nodes of one cluster; ``?cluster=`` another."""

    async def main() -> None:
        one, two = open_store(redis_server.url), open_store(redis_server.url)
        other = open_store(redis_server.url + "?cluster=other")
        try:
            assert await one.claim("s1", "node-1", 5.0) is None
            assert await two.holder("s1") == "node-1"
            assert await other.holder("s1") is None
            assert await two.claim("s1", "node-2", 5.0) == "node-1"
            many = [f"s{n}" for n in range(1200)]  # renewed in chunks
            for sid in many[2:]:  # not s0 (nobody's), nor s1 (node-2's)
                await one.claim(sid, "node-1", 5.0)
            assert await one.renew(many, "node-1", 5.0) == (["s1"], ["s0"])
            assert await two.holder("s0") == "node-1"
            assert await two.holder(many[-1]) == "node-1"
        finally:
            for store in (one, two, other):
                await store.close()

    run(main())


def test_a_lease_with_redis_out_of_reach_raises_store_unavailable(
        redis_server: RedisServer) -> None:
    async def main() -> None:
        store = open_store(redis_server.url, timeout=0.3)
        try:
            await store.claim("s1", "a", 5.0)
            redis_server.kill()
            with pytest.raises(StoreUnavailable):
                await store.claim("s1", "b", 5.0)
            with pytest.raises(StoreUnavailable):
                await store.renew(["s1"], "a", 5.0)
        finally:
            await store.close(0.3)

    run(main())


def test_a_message_reaches_the_inbox_of_the_node_it_names(backend: Backend) -> None:
    async def main() -> None:
        store = backend.open()
        inbox = store.inbox("b")
        try:
            received = asyncio.ensure_future(anext(inbox))
            for _ in range(100):  # until the inbox listens (pub/sub drops what is early)
                await store.publish("a", "not for b")
                await store.publish("b", "hello b")
                done, _ = await asyncio.wait([received], timeout=0.05)
                if done:
                    break
            assert received.result() == "hello b"
        finally:
            await inbox.aclose()
            await store.close()

    run(main())
