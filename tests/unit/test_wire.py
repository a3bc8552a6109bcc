"""The Session on the wire: frames from Core in, frames to Core out (no real socket)."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from typing import Any

import pytest
from sessionkit import (
    WELCOME,
    FakeCore,
    browser_page,
    connected,
    request,
    side_effect_tool,
    spin,
)
from web_storage import DictStorage, QuotaExceededError, QuotaStorage, RecordingStorage

from pedelec_pyodide import (
    MemoryLedger,
    NotConnectedError,
    Session,
    SessionState,
    StorageLedger,
    ToolContext,
    TurnError,
    define_tool,
)
from pedelec_pyodide.protocol import TurnDelta


def test_hello_then_welcome() -> None:
    tool = define_tool(name="t", description="d", args_schema={"type": "object"})
    session = Session([tool])
    core = FakeCore()
    session.connection_made(core)
    assert session.state == SessionState.CONNECTING
    assert core.sent == [{"type": "hello", "protocol": 1, "tools": [tool.metadata()],
                          "client": {"name": "pedelec-pyodide"}}]
    session.receive(WELCOME)
    assert (session.session_id, session.resume_token) == ("s1", "tok")
    assert session.state == SessionState.IDLE and session.connected


def test_reconnect_says_hello_with_id_and_token() -> None:
    session = Session()
    connected(session)
    session.connection_lost()
    assert session.state == SessionState.CONNECTING
    core = FakeCore()
    session.connection_made(core)
    assert core.sent[0]["sessionId"] == "s1" and core.sent[0]["resumeToken"] == "tok"


def test_sync_request_is_answered_at_once_with_its_tier() -> None:
    session = Session()
    core = connected(session)
    session.on_tool("t", lambda args: {"echo": args})
    session.receive(request("q1", args={"a": 1}))
    assert core.of_type("tool.result") == [
        {"type": "tool.result", "toolRequestId": "q1", "result": {"echo": {"a": 1}},
         "handledBy": "named"}
    ]
    session.receive(request("q2", tool="missing"))
    last = core.of_type("tool.result")[-1]
    assert last["handledBy"] == "none"
    assert last["result"]["error"]["code"] == "TOOL_HANDLER_NOT_FOUND"


@pytest.mark.parametrize("tier", ["named", "inline", "fallback"])
def test_a_request_refused_before_any_handler_ran_says_handled_by_none(tier: str) -> None:
    ran: list[Any] = []
    schema = {"type": "object", "properties": {"delta": {"type": "integer"}}}
    session = Session([define_tool(name="t", description="d", args_schema=schema,
                                   handler=ran.append if tier == "inline" else None)])
    if tier == "named":
        session.on_tool("t", ran.append)
    elif tier == "fallback":
        session.on_tool(lambda tool, args: ran.append(args))
    calls: list[Any] = []
    session.subscribe(calls.append)
    core = connected(session)
    session.receive(request("q1", args={"delta": "x"}))
    refused = core.of_type("tool.result")[-1]
    assert refused["result"]["error"]["code"] == "INVALID_ARGS"
    assert refused["handledBy"] == "none"
    assert [c.handled_by for c in calls if hasattr(c, "handled_by")] == ["none"]
    assert ran == []
    session.receive(request("q2", args={"delta": 1}))
    assert core.of_type("tool.result")[-1]["handledBy"] == tier
    assert ran == [{"delta": 1}]


async def test_async_request_is_answered_when_done_and_state_follows() -> None:
    session = Session()
    core = connected(session)
    release = asyncio.Event()

    async def slow(args: Any, ctx: ToolContext) -> str:
        await release.wait()
        return ctx.turn_id or ""

    session.on_tool("slow", slow)
    session.receive(request("q1", tool="slow", turn_id="turn-9"))
    await asyncio.sleep(0)
    assert session.state == SessionState.WAITING_TOOL_RESULT
    assert core.of_type("tool.result") == []
    release.set()
    for _ in range(10):
        await asyncio.sleep(0)
    assert core.of_type("tool.result")[0]["result"] == "turn-9"
    assert session.state == SessionState.IDLE


async def test_a_re_sent_request_never_runs_twice() -> None:
    session = Session()
    core = connected(session)
    runs: list[str] = []
    release = asyncio.Event()

    async def handler(args: Any, ctx: ToolContext) -> int:
        runs.append(ctx.tool_request_id)
        await release.wait()
        return 7

    session.on_tool("t", handler)
    session.receive(request("q1"))
    session.receive(request("q1"))  # re-sent while running: ignored
    release.set()
    for _ in range(10):
        await asyncio.sleep(0)
    session.receive(request("q1"))  # re-sent after it finished: stored result
    results = core.of_type("tool.result")
    assert [r["result"] for r in results] == [7, 7]
    assert runs == ["q1"]


@pytest.mark.parametrize("annotations", [None, {"readOnlyHint": True},
                                         {"idempotentHint": True}])
def test_after_a_reload_a_finished_request_gets_its_stored_result(annotations: Any) -> None:
    """Whatever its tool: a resumable one's start is not written, its result is."""
    storage = DictStorage()
    runs: list[int] = []
    tool = define_tool(name="t", description="d", args_schema={"type": "object"},
                       handler=lambda: runs.append(1) or len(runs), annotations=annotations)
    first = Session([tool], ledger=StorageLedger(storage, "pedelec:"))
    connected(first).sent.clear()
    first.receive(request("q1"))

    reloaded = Session([tool], ledger=StorageLedger(storage, "pedelec:"))
    core = connected(reloaded)
    reloaded.receive(request("q1"))
    assert core.of_type("tool.result")[0]["result"] == 1
    assert runs == [1]


@pytest.mark.parametrize(("annotations", "reruns"), [
    (None, False),
    ({"destructiveHint": True}, False),
    ({"readOnlyHint": True}, True),
    ({"idempotentHint": True}, True),
])
def test_interrupted_request_reruns_only_if_safe(annotations: Any, reruns: bool) -> None:
    storage = DictStorage()
    StorageLedger(storage, "p:").start("q1", "t")  # the tab died while it ran
    runs: list[int] = []
    tool = define_tool(name="t", description="d", args_schema={"type": "object"},
                       handler=lambda: runs.append(1) or "ran", annotations=annotations)
    session = Session([tool], ledger=StorageLedger(storage, "p:"))
    core = connected(session)
    session.receive(request("q1"))
    result = core.of_type("tool.result")[0]
    if reruns:
        assert result["result"] == "ran" and runs == [1]
    else:
        assert runs == []
        assert result["handledBy"] == "none"
        assert result["result"]["error"]["code"] == "TOOL_OUTCOME_UNKNOWN"
        assert result["result"]["error"]["retryable"] is False
        session.receive(request("q1"))  # asked again: the same answer, still no run
        assert core.of_type("tool.result")[1] == result and runs == []


# The first tab's handler coroutines never run: that is the point, not a leak.
@pytest.mark.filterwarnings("ignore:coroutine .* was never awaited:RuntimeWarning")
async def test_a_reload_before_an_async_body_ran_lets_the_request_run_after_it() -> None:
    storage = DictStorage()
    runs: list[str] = []
    tool = side_effect_tool(runs)
    first = Session([tool], ledger=StorageLedger(storage, "p:"))
    connected(first)
    first.receive(request("q1", "side_effect", {"key": "a"}))
    # The tab goes away before the event loop ran the handler's body: nothing has run,
    # so nothing is marked started.
    assert runs == [] and not StorageLedger(storage, "p:").was_started("q1")
    for task in list(first._tasks.values()):
        task.cancel()
    await asyncio.sleep(0)

    reloaded = Session([tool], ledger=StorageLedger(storage, "p:"))
    core = connected(reloaded)
    reloaded.receive(request("q1", "side_effect", {"key": "a"}))
    await asyncio.sleep(0)
    assert runs == ["a"] and StorageLedger(storage, "p:").was_started("q1")
    for _ in range(10):
        await asyncio.sleep(0)
    assert [r["result"] for r in core.of_type("tool.result")] == ["a"]
    assert runs == ["a"]


@pytest.mark.filterwarnings("ignore:coroutine .* was never awaited:RuntimeWarning")
async def test_a_task_cancelled_before_its_first_step_is_let_go() -> None:
    """A task cancelled before its first step (the loop shutting down, or the tests' tab
    going away) runs none of its body: the session still lets it go."""
    runs: list[str] = []
    session = Session([side_effect_tool(runs)])
    connected(session)
    session.receive(request("q1", "side_effect", {"key": "a"}))
    (task,) = session._tasks.values()
    task.cancel()
    await spin()
    assert task.cancelled() and runs == [] and session._tasks == {}


@pytest.mark.parametrize("annotations", [None, {"readOnlyHint": True}])
async def test_a_reload_after_an_async_body_began(annotations: Any) -> None:
    """A side-effecting request cut short is TOOL_OUTCOME_UNKNOWN; a read-only one (its
    start kept in memory only) runs as if never started, which its start would allow."""
    storage = DictStorage()
    runs: list[str] = []
    release = asyncio.Event()

    async def act(key: str) -> str:
        """Writes something, unless marked read-only."""
        runs.append(key)
        await release.wait()
        return key

    tool = define_tool(act, annotations=annotations)
    first = Session([tool], ledger=StorageLedger(storage, "p:"))
    connected(first)
    first.receive(request("q1", "act", {"key": "a"}))
    await asyncio.sleep(0)
    assert runs == ["a"]
    for task in list(first._tasks.values()):  # the tab goes away mid-run
        task.cancel()

    reloaded = Session([tool], ledger=StorageLedger(storage, "p:"))
    core = connected(reloaded)
    reloaded.receive(request("q1", "act", {"key": "a"}))
    release.set()
    await spin()
    result = core.of_type("tool.result")[0]["result"]
    if annotations is None:
        assert result["error"]["code"] == "TOOL_OUTCOME_UNKNOWN" and runs == ["a"]
        return
    assert result == "a" and runs == ["a", "a"]
    reloaded.receive(request("q1", "act", {"key": "a"}))  # finished: never a third run
    assert runs == ["a", "a"] and core.of_type("tool.result")[1]["result"] == "a"


def test_an_approved_resumable_request_is_not_asked_about_again_after_a_reload() -> None:
    storage = DictStorage()
    ledger = StorageLedger(storage, "p:")
    ledger.approve("q1", "t")
    ledger.start("q1", "t", resumable=True)  # (not written: the approval stays)
    assert ledger.was_started("q1")
    reloaded = StorageLedger(storage, "p:")
    assert reloaded.was_approved("q1") and not reloaded.was_started("q1")


def test_a_resumable_request_costs_its_result_one_write_and_no_read() -> None:
    """Its start is in memory only (the first such start marks the index loose, once);
    its result, stored where no chunk names it, is found by the next ledger among the
    storage's keys, read only then, and indexed once."""
    storage = RecordingStorage()
    calls = storage.calls
    ledger = StorageLedger(storage, "p:")
    ledger.start("warm", "t")  # the first chunk, and the index naming it
    calls.clear()
    ledger.start("r0", "t", resumable=True)
    assert calls == [("set", "p:index")] and json.loads(storage.items["p:index"])["loose"]
    calls.clear()
    assert ledger.get("q1") is None and not ledger.was_started("q1")
    ledger.start("q1", "t", resumable=True)
    assert ledger.was_started("q1") and calls == []
    ledger.finish("q1", "7", "named")
    assert calls == [("set", "p:q1")]

    calls.clear()
    reloaded = StorageLedger(storage, "p:")
    assert ("key", "0") in calls  # the keys read, once
    # q1 indexed, in the chunk it joined; then the index, no longer loose
    assert [call for call in calls if call[0] == "set"] == [("set", "p:index:0"),
                                                            ("set", "p:index")]
    assert "loose" not in json.loads(storage.items["p:index"])
    assert reloaded.get("q1") == ("7", "named") and reloaded.was_started("q1")
    assert reloaded.was_started("warm") and reloaded.get("warm") is None
    assert not reloaded.was_started("r0")  # never finished: as if never started
    calls.clear()
    StorageLedger(storage, "p:")  # nothing loose: no key read, nothing written
    assert [call for call in calls if call[0] != "get"] == []


def test_a_ledger_that_cannot_index_its_loose_results_still_finds_them(
        caplog: pytest.LogCaptureFixture) -> None:
    """Storage full when a ledger is made: its loose results are indexed in memory (and
    logged), the index stays loose, and the next ledger indexes them."""

    class Full(DictStorage):
        full = False

        def setItem(self, key: str, value: str) -> None:
            if self.full:
                raise QuotaExceededError(key)
            super().setItem(key, value)

    storage = Full()
    ledger = StorageLedger(storage, "p:")
    ledger.start("q0", "t", resumable=True)  # (its chunk is written, being new)
    ledger.start("q1", "t", resumable=True)
    ledger.finish("q1", "7", "named")
    storage.full = True
    with caplog.at_level(logging.WARNING):
        full = StorageLedger(storage, "p:")
    assert full.get("q1") == ("7", "named") and full.was_started("q1")
    assert "could not index" in caplog.text
    assert json.loads(storage.items["p:index"])["loose"]
    storage.full = False
    StorageLedger(storage, "p:")
    assert "loose" not in json.loads(storage.items["p:index"])
    assert StorageLedger(storage, "p:").get("q1") == ("7", "named")


@pytest.mark.parametrize("finished", [False, True])
def test_a_ledger_stays_bounded_when_its_resumable_requests_leave_no_result(
        finished: bool) -> None:
    """Reload after reload, read-only requests still running (nothing of theirs stored),
    or finished with results too large for the storage to keep: chunks stay few, each
    ledger reads only those, and the newest result is kept."""
    storage = QuotaStorage(quota=50_000)
    big = json.dumps("x" * 10_000)  # a few fill the storage
    for life in range(60):
        ledger = StorageLedger(storage, "p:", max_entries=100)
        for n in range(30):
            ledger.start(f"r{life}-{n}", "t", resumable=True)
            if finished:
                ledger.finish(f"r{life}-{n}", big, "named")
        index = json.loads(storage.items["p:index"])
        assert index["next"] - index["first"] <= ledger._max_chunks
        assert len(storage.items) <= 100 + ledger._max_chunks + 1
    if finished:
        assert StorageLedger(storage, "p:", max_entries=100).get("r59-29") == (big, "named")


def test_a_damaged_index_brings_back_no_stale_chunk() -> None:
    """Indexed afresh after damage, the chunks are numbered from 0 again: each is written
    when it is made, resumable starts too, so no chunk of before the damage is read back
    (its ids twice, an eviction failing, started requests forgotten)."""
    storage = DictStorage()
    ledger = StorageLedger(storage, "p:", max_entries=8)  # chunks of 2
    for request_id in ("p0", "p1", "a"):
        ledger.start(request_id, "t")
    storage.setItem("p:index", "{not json")
    ledger = StorageLedger(storage, "p:", max_entries=8)
    for request_id, resumable in [("a", False), ("r1", True), ("r2", True)]:
        ledger.start(request_id, "t", resumable=resumable)
    ledger = StorageLedger(storage, "p:", max_entries=8)
    started = [f"w{n}" for n in range(12)]
    for request_id in started:
        ledger.start(request_id, "t")
    reloaded = StorageLedger(storage, "p:", max_entries=8)
    assert all(reloaded.was_started(request_id) for request_id in started[-5:])


def test_an_index_over_its_bound_is_damaged_not_read_through() -> None:
    storage = DictStorage()
    StorageLedger(storage, "p:").finish("q1", "1", "named")
    storage.setItem("p:index", json.dumps({"first": 0, "next": 10**12}))
    damaged = StorageLedger(storage, "p:")  # (not 10**12 reads)
    assert damaged.get("q1") == ("1", "named") and damaged.was_started("q1")


@pytest.mark.parametrize("resumable", [False, True])
def test_requests_whose_ids_look_like_the_index_keys_leave_the_index_whole(
        resumable: bool) -> None:
    """An id may be any string: ``index`` or ``index:0`` (the keys of the index and of its
    first chunk) is a request like any other, and its result overwrites neither."""
    ids = ["w", "index", "index:0", "index:1", "index/", "index:0//", "x"]
    storage = DictStorage()
    ledger = StorageLedger(storage, "p:")
    for request_id in ids:
        ledger.start(request_id, "t", resumable=resumable)
        ledger.finish(request_id, json.dumps(request_id), "named")
    reloaded = StorageLedger(storage, "p:")
    assert reloaded._complete and json.loads(storage.items["p:index"])["first"] == 0
    for request_id in ids:
        assert reloaded.get(request_id) == (json.dumps(request_id), "named"), request_id
        assert reloaded.was_started(request_id)
    assert len(storage.items) == len(ids) + 2  # the index, its one chunk, one entry each


def test_a_start_that_returns_is_recorded_though_an_earlier_write_failed() -> None:
    """A full storage refuses a new chunk's write (or its index's): the requests that join
    that chunk afterwards write the index with it, so a start that returned normally is
    recorded; a refused request's result is never stored where no chunk names it (it
    would hold its room for good, and every later write would fail)."""
    storage = QuotaStorage(200)
    ledger = StorageLedger(storage, "p:", 16)
    with pytest.raises(QuotaExceededError):  # refused, finished without a start: too big
        ledger.finish("e", json.dumps("v" * 150), "named")
    ledger.start("f", "t")
    reloaded = StorageLedger(storage, "p:", 16)
    assert reloaded.was_started("f") and reloaded.was_started("e")
    for request_id in ["g", "h", "i"]:  # room for the ledger's own writes is still there
        reloaded.start(request_id, "t")
    assert StorageLedger(storage, "p:", 16).was_started("i")


@pytest.mark.parametrize("index", [
    '{"first": 1e400, "next": 0}', '{"first": Infinity, "next": 0}', "[" * 100_000,
    '{"first": -1, "next": -1}', '{"first": 0.5, "next": 1}', '{"first": true, "next": 1}',
])
def test_a_ledger_takes_any_damaged_index_and_keeps_its_entries(index: str) -> None:
    """Damaged (not JSON, too deep to decode safely in the page, numbers out of range): the
    ledger starts a new index, and finds again, for good (not for one reload only), what
    its chunks and entries held; an id like a chunk's key never overwrites one."""
    storage = DictStorage()
    ledger = StorageLedger(storage, "p:")
    ledger.start("a", "t")
    ledger.finish("a", '"A"', "named")
    ledger.start("running", "t")
    storage.setItem("p:index", index)
    storage.setItem("p:index:7", "[" * 100_000)  # (a chunk no index names, damaged too)
    damaged = StorageLedger(storage, "p:")
    damaged.start("index:-1", "t")
    damaged.finish("index:-1", '"r"', "named")
    damaged.start("b", "t")
    for _ in range(2):
        reloaded = StorageLedger(storage, "p:")
        assert reloaded.get("a") == ('"A"', "named") and reloaded.was_started("running")
        assert reloaded.get("index:-1") == ('"r"', "named") and reloaded.was_started("b")


@pytest.mark.parametrize("stored", [
    "[" * 100_000, '{"result": 5, "handledBy": "named"}', '{"result": "[", "handledBy": "named"}',
    '{"result": "1", "handledBy": "someone"}', '{"result": "' + "[" * 5000 + '"}', "null", "7",
])
def test_a_damaged_entry_is_no_result(stored: str) -> None:
    """What ``get`` gives the engine is a result it can send: a result text (JSON, not
    nested too deep to decode in the page) and who handled it; a damaged entry is none."""
    storage = DictStorage()
    ledger = StorageLedger(storage, "p:")
    ledger.start("q", "t")
    storage.setItem("p:q", stored)
    assert StorageLedger(storage, "p:").get("q") is None
    assert StorageLedger(storage, "p:").was_started("q")
    ledger.start("none", "t")  # a handler that returned None: its result is JSON null
    ledger.finish("none", "null", "named")
    assert StorageLedger(storage, "p:").get("none") == ("null", "named")


def test_a_loose_index_takes_only_its_own_entries_back() -> None:
    """Keys under the ledger's prefix that hold no value a ledger writes (an app's) are
    not taken for entries: they never push the ledger's own out; chunks the index does not
    name are removed."""
    storage = DictStorage()
    ledger = StorageLedger(storage, "p:", 64)
    ledger.start("real", "t")
    ledger.start("r2", "t", resumable=True)  # the index is loose from here
    for n in range(70):
        storage.setItem(f"p:other-app-{n}", "x")
    storage.setItem("p:index:99", '{"s": ["ghost"]}')
    reloaded = StorageLedger(storage, "p:", 64)
    assert reloaded.was_started("real") and not reloaded.was_approved("other-app-3")
    assert sum(key.startswith("p:other-app-") for key in storage.items) == 70
    assert "p:index:99" not in storage.items


def test_an_earlier_index_naming_an_id_twice_is_read_once() -> None:
    storage = DictStorage()
    storage.setItem("p:index", json.dumps(["a", *(f"u{n}" for n in range(40)), "a"]))
    ledger = StorageLedger(storage, "p:", 64)
    for n in range(200):  # chunks evicted past both of a's places
        ledger.start(f"n{n}", "t")
    assert StorageLedger(storage, "p:", 64).was_started("n199")


def test_a_loose_index_with_nothing_to_index_is_made_tight_quietly(
        caplog: pytest.LogCaptureFixture) -> None:
    """Marked loose by a first resumable start whose chunk was never written (the tab
    gone between the two writes): the next ledger finds nothing, and says nothing."""
    storage = DictStorage()
    storage.setItem("p:index", json.dumps({"first": 0, "next": 0, "loose": True}))
    with caplog.at_level(logging.WARNING):
        ledger = StorageLedger(storage, "p:")
    assert caplog.text == "" and json.loads(storage.items["p:index"]) == {"first": 0, "next": 0}
    ledger.start("q1", "t")
    assert StorageLedger(storage, "p:").was_started("q1")


def test_a_ledger_indexes_only_its_own_entries_and_each_chunk_once() -> None:
    """Other keys in the storage (the app's, another ledger's, the index's own) are not
    its entries; many entries no chunk names cost one write per chunk that takes them."""
    writes: list[str] = []

    class Recording(DictStorage):
        def setItem(self, key: str, value: str) -> None:
            writes.append(key)
            super().setItem(key, value)

    storage = Recording()
    for key in ["app:state", "p", "p2:ledger:x", "q:p:x"]:
        storage.setItem(key, "{}")
    ledger = StorageLedger(storage, "p:", max_entries=1000)
    for n in range(100):
        ledger.start(f"q{n}", "t", resumable=True)
        ledger.finish(f"q{n}", str(n), "named")
    ledger.start("running", "t", resumable=True)  # not finished: leaves nothing
    writes.clear()
    reloaded = StorageLedger(storage, "p:", max_entries=1000)
    # the full chunks were written as they filled; the newest takes back its own
    assert writes == ["p:index:3", "p:index"]
    assert all(reloaded.get(f"q{n}") == (str(n), "named") for n in range(100))
    assert not reloaded.was_approved("running")
    kept = {key for key in storage.items if key.startswith("p:")}
    assert kept == {"p:index", *(f"p:index:{n}" for n in range(4)),
                    *(f"p:q{n}" for n in range(100))}
    assert storage.items["app:state"] == "{}" and storage.items["q:p:x"] == "{}"


@pytest.mark.parametrize("ledger_of", [
    lambda: StorageLedger(DictStorage(), "p:", max_entries=3),
    lambda: MemoryLedger(max_entries=3),
])
def test_ledgers_stay_bounded_when_requests_finish_without_a_start(ledger_of: Any) -> None:
    ledger = ledger_of()
    for n in range(5):  # no handler or invalid args: finished, never started
        ledger.finish(f"q{n}", "1", "none")
    assert ledger.get("q0") is None and ledger.get("q1") is None
    assert ledger.get("q4") == ("1", "none")


def test_storage_ledger_is_bounded() -> None:
    storage = DictStorage()
    ledger = StorageLedger(storage, "p:", max_entries=3)
    for n in range(5):
        ledger.start(f"q{n}", "t")
        ledger.finish(f"q{n}", "1", "named")
    assert not ledger.was_started("q0") and not ledger.was_started("q1")
    assert ledger.get("q4") == ("1", "named")
    entries = [key for key in storage.items if not key.startswith("p:index")]
    assert sorted(entries) == ["p:q2", "p:q3", "p:q4"]
    assert len(storage.items) <= 3 + 3 + 1  # entries, their index chunks, the chunk list


@pytest.mark.parametrize(("every", "resumable"), [(37, False), (37, True), (1, True)])
def test_storage_ledger_stays_bounded_across_reloads_oldest_first(every: int,
                                                                  resumable: bool) -> None:
    storage = DictStorage()
    ids = [f"{n:032x}" for n in range(250)]
    for start in range(0, 250, every):  # a reload every few requests: a new ledger each time
        ledger = StorageLedger(storage, "p:", max_entries=100)
        for request_id in ids[start:start + every]:
            ledger.start(request_id, "t", resumable=resumable)
            ledger.finish(request_id, "1", "named")
    ledger = StorageLedger(storage, "p:", max_entries=100)
    kept = {key[2:] for key in storage.items if not key.startswith("p:index")}
    assert 75 <= len(kept) <= 100
    assert set(ids[-75:]) <= kept and kept <= set(ids[-100:])
    assert all(ledger.get(request_id) == ("1", "named") for request_id in kept)
    chunks = [key for key in storage.items if key.startswith("p:index:")]
    assert len(storage.items) == len(kept) + len(chunks) + 1
    index = json.loads(storage.items["p:index"])
    assert index["next"] - index["first"] <= 100 // ledger._chunk_size + 1


def test_storage_ledger_rewrites_one_small_chunk_per_request() -> None:
    """The index is not rewritten whole on every request (it was: ~0.2 ms a call in
    Chromium with 1,024 ids)."""
    written: list[int] = []

    class Recording(DictStorage):
        def setItem(self, key: str, value: str) -> None:
            if key.startswith("p:index"):
                written.append(len(value))
            super().setItem(key, value)

    ledger = StorageLedger(Recording(), "p:")
    for n in range(3000):
        ledger.start(f"{n:032x}", "t")
    assert max(written) <= 32 * 36  # one chunk: 32 ids of 32 characters, quoted, with ", "


def test_storage_ledger_costs_a_request_one_write_to_start_one_to_finish_and_no_read() -> None:
    """On a tool call's path (Chromium: ~15-30 µs a storage call from Python): a request
    the tab never recorded is looked up in memory; its start is one write (its chunk,
    which says it started), its result one more."""
    storage = RecordingStorage()
    calls = storage.calls
    ledger = StorageLedger(storage, "p:")
    ledger.start("warm", "t")  # the first chunk, and the index naming it
    calls.clear()
    assert ledger.get("q1") is None and not ledger.was_started("q1")
    assert not ledger.was_approved("q1")
    ledger.start("q1", "t")
    ledger.finish("q1", "7", "named")
    assert calls == [("set", "p:index:0"), ("set", "p:q1")]
    calls.clear()
    assert ledger.get("q1") == ("7", "named") and ledger.was_started("q1")
    assert calls == [("get", "p:q1")]

    reloaded = StorageLedger(storage, "p:")
    assert reloaded.get("q1") == ("7", "named") and reloaded.was_started("q1")
    assert reloaded.get("warm") is None and reloaded.was_started("warm")


@pytest.mark.parametrize(("max_entries", "seed"), [(7, 1), (13, 2), (100, 3), (1000, 4)])
def test_storage_ledger_keeps_each_requests_state_across_reloads(max_entries: int,
                                                                  seed: int) -> None:
    """Approvals, starts and results in any order, chunks filling and evicted, reloads
    between: what a reloaded ledger says of each recent request is what happened to it
    (a MemoryLedger of the same bound says it too)."""
    import random

    rng = random.Random(seed)
    storage = DictStorage()
    ledger = StorageLedger(storage, "p:", max_entries=max_entries)
    model = MemoryLedger(max_entries=max_entries)
    ids: list[str] = []
    # started as resumable and not finished: started in memory only, so after a reload as
    # if never started (which a resumable request's start allows) or approved, if it was
    volatile: set[str] = set()
    for step in range(3 * max_entries):
        if rng.random() < 0.1:
            ledger = StorageLedger(storage, "p:", max_entries=max_entries)  # a reload
        if ids and rng.random() < 0.3:
            request_id = rng.choice(ids[-5:])
        else:  # (some ids are the index's keys: index:1 is a chunk's while it lives)
            request_id = f"index:{step // 7}" if step % 7 == 0 else f"q{step}"
            ids.append(request_id)
        if model.get(request_id) is not None:
            continue  # answered: never recorded again
        action = rng.choice(["approve", "start", "start resumable", "finish", "finish"])
        if action == "approve" and not model.was_started(request_id):
            ledger.approve(request_id, "t")
            model.approve(request_id, "t")
        elif action.startswith("start"):
            resumable = action == "start resumable"
            if resumable:
                volatile.add(request_id)
            ledger.start(request_id, "t", resumable=resumable)
            model.start(request_id, "t")
        elif action == "finish":
            volatile.discard(request_id)
            ledger.finish(request_id, f'"{request_id}"', "named")
            model.finish(request_id, f'"{request_id}"', "named")
        indexed = sum(len(json.loads(storage.items[key]).get("s", []))
                      + len(json.loads(storage.items[key]).get("a", []))
                      for key in storage.items if key.startswith("p:index:"))
        assert indexed <= max_entries  # bounded at every step, not only once a chunk is new
    reloaded = StorageLedger(storage, "p:", max_entries=max_entries)
    recent = [i for i in ids if i in ids[-(max_entries - reloaded._chunk_size):]]
    for request_id in recent:
        assert reloaded.get(request_id) == model.get(request_id), request_id
        if request_id in volatile:
            assert reloaded.was_approved(request_id) <= model.was_approved(request_id)
            continue
        assert reloaded.was_started(request_id) == model.was_started(request_id), request_id
        assert reloaded.was_approved(request_id) == model.was_approved(request_id), request_id
    index_keys = re.compile(r"p:index(:[0-9]+)?")
    assert len([k for k in storage.items if not index_keys.fullmatch(k)]) <= max_entries


def test_storage_ledger_reads_what_an_earlier_version_wrote() -> None:
    """Chunks that were lists of ids, entries that say what they are: a page reloaded
    onto a new version keeps its requests' states."""
    storage = DictStorage()
    storage.setItem("p:index", json.dumps({"first": 0, "next": 1}))
    storage.setItem("p:index:0", json.dumps(["done", "running", "asked"]))
    storage.setItem("p:done", json.dumps({"result": "1", "handledBy": "named"}))
    storage.setItem("p:running", json.dumps({"tool": "t"}))
    storage.setItem("p:asked", json.dumps({"approved": True, "tool": "t"},
                                          separators=(",", ":")))
    ledger = StorageLedger(storage, "p:")
    assert ledger.get("done") == ("1", "named") and ledger.was_started("done")
    assert ledger.get("running") is None and ledger.was_started("running")
    assert ledger.was_approved("asked") and not ledger.was_started("asked")
    ledger.start("new", "t")  # rewrites the earlier chunk: its entries still say
    reloaded = StorageLedger(storage, "p:")
    assert reloaded.was_started("running") and not reloaded.was_started("asked")
    assert reloaded.was_approved("asked") and reloaded.was_started("new")
    assert reloaded.get("done") == ("1", "named")


def test_a_damaged_index_still_finds_the_results_stored_before() -> None:
    storage = DictStorage()
    StorageLedger(storage, "p:").finish("q1", "1", "named")
    storage.setItem("p:index", "{not json")
    damaged = StorageLedger(storage, "p:")
    assert damaged.get("q1") == ("1", "named") and damaged.was_started("q1")


def test_an_approved_request_answered_without_running_is_never_run_once_its_result_gave_way(
) -> None:
    """Approved, then answered before it ran (cancelled): a result like any other, which
    may give way to room; it must not be left "approved" (a reload would run it)."""
    storage = QuotaStorage(quota=10_000)
    ledger = StorageLedger(storage, "p:")
    ledger.approve("q0", "t")
    big = json.dumps("x" * 2_000)
    ledger.finish("q0", big, "named")
    for n in range(1, 8):
        ledger.start(f"q{n}", "t")
        ledger.finish(f"q{n}", big, "named")
    reloaded = StorageLedger(storage, "p:")
    assert reloaded.get("q0") is None and reloaded.was_started("q0")


def test_storage_ledger_takes_over_an_earlier_index_and_survives_a_damaged_one() -> None:
    storage = DictStorage()
    old_ids = [f"old{n}" for n in range(10)]
    for request_id in old_ids:
        storage.setItem("p:" + request_id, json.dumps({"result": "1", "handledBy": "named"}))
    storage.setItem("p:index", json.dumps(old_ids))  # the one-list index of 0.1
    ledger = StorageLedger(storage, "p:", max_entries=8)
    assert ledger.get("old9") == ("1", "named")
    for n in range(8):
        ledger.start(f"new{n}", "t")
    assert all(("p:" + request_id) not in storage.items for request_id in old_ids)

    storage.setItem("p:index", "{not json")
    damaged = StorageLedger(storage, "p:", max_entries=8)
    damaged.start("after", "t")
    assert damaged.was_started("after")


def test_a_full_storage_gives_up_the_oldest_results_and_keeps_them_started() -> None:
    storage = QuotaStorage(quota=10_000)
    ledger = StorageLedger(storage, "p:")
    big = json.dumps("x" * 2_000)
    for n in range(20):  # far more than fits
        ledger.start(f"q{n}", "t")
        ledger.finish(f"q{n}", big, "named")
    assert ledger.get("q19") == (big, "named")
    assert ledger.get("q0") is None and ledger.was_started("q0")  # gave way, still started
    reloaded = StorageLedger(storage, "p:")
    assert reloaded.get("q19") == (big, "named") and reloaded.was_started("q1")


def test_a_full_storage_gives_up_results_only_never_an_approval_nor_a_later_result() -> None:
    """An approved request not started yet stays approved, not "started" (re-sent after a
    reload it runs, instead of being TOOL_OUTCOME_UNKNOWN as if interrupted); a request
    started before the storage filled can give up its result once it has one."""
    storage = QuotaStorage(quota=10_000)
    ledger = StorageLedger(storage, "p:")
    ledger.approve("asked", "t")
    ledger.start("long", "t")
    big = json.dumps("x" * 2_000)
    for n in range(6):
        ledger.start(f"q{n}", "t")
        ledger.finish(f"q{n}", big, "named")
    assert ledger.was_approved("asked") and not ledger.was_started("asked")
    ledger.finish("long", big, "named")
    for n in range(6, 12):  # "long" is now the oldest result: it gives way like the others
        ledger.start(f"q{n}", "t")
        ledger.finish(f"q{n}", big, "named")
    assert ledger.get("long") is None and ledger.was_started("long")
    assert ledger.get("q11") == (big, "named")


def test_memory_ledger_keeps_at_most_max_bytes_of_results_oldest_giving_way() -> None:
    ledger = MemoryLedger(max_bytes=100)
    for n in range(5):
        ledger.start(f"q{n}", "t")
        ledger.finish(f"q{n}", "x" * 40, "named")
    assert [ledger.get(f"q{n}") for n in (3, 4)] == [("x" * 40, "named")] * 2
    assert all(ledger.get(f"q{n}") is None and ledger.was_started(f"q{n}") for n in (0, 1, 2))
    ledger.finish("big", "y" * 500, "named")  # larger than the bound alone: still kept
    assert ledger.get("big") == ("y" * 500, "named") and ledger.get("q4") is None


def test_a_full_storage_never_costs_a_result_nor_a_second_run() -> None:
    storage = QuotaStorage(quota=20_000)
    runs: list[str] = []

    def write(args: dict[str, Any], ctx: ToolContext) -> str:
        runs.append(ctx.tool_request_id)
        return "x" * 9_000  # three of these do not fit

    tool = define_tool(name="w", description="d", args_schema={"type": "object"},
                       handler=write)
    session = Session([tool], ledger=StorageLedger(storage, "p:"))
    core = connected(session)
    for n in range(6):
        session.receive(request(f"q{n}", "w"))
    assert [len(r["result"]) for r in core.of_type("tool.result")] == [9_000] * 6

    reloaded = Session([tool], ledger=StorageLedger(storage, "p:"))
    core = connected(reloaded)
    reloaded.receive(request("q5", "w"))  # the newest result was kept: sent again
    reloaded.receive(request("q0", "w"))  # the oldest gave way: not run a second time
    first, second = (r["result"] for r in core.of_type("tool.result"))
    assert len(first) == 9_000
    assert second["error"]["code"] == "TOOL_OUTCOME_UNKNOWN"
    assert runs == [f"q{n}" for n in range(6)]


def test_a_ledger_that_fails_costs_no_result(caplog: pytest.LogCaptureFixture) -> None:
    class Broken(MemoryLedger):
        def start(self, tool_request_id: str, tool: str) -> None:
            raise OSError("storage is gone")

        def finish(self, tool_request_id: str, result_json: str, handled_by: Any) -> None:
            raise OSError("storage is gone")

    session = Session(ledger=Broken())
    session.on_tool("t", lambda: "fine")
    core = connected(session)
    session.receive(request("q1"))
    assert core.of_type("tool.result")[0]["result"] == "fine"
    assert "could not record tool request q1" in caplog.text


@pytest.mark.parametrize("frame", [
    "not json", "[]", '{"type":"nope"}', '{"type":"hello","protocol":1,"tools":[]}',
    '{"type":"tool.request","toolRequestId":"q"}',
])
def test_bad_frames_get_an_error_frame_and_the_session_goes_on(frame: str) -> None:
    session = Session()
    core = connected(session)
    session.on_tool("t", lambda: "fine")
    session.receive(frame)
    errors = core.of_type("error")
    assert len(errors) == 1 and errors[0]["code"] and errors[0]["message"]
    session.receive(request("after"))
    assert core.of_type("tool.result")[0]["result"] == "fine"


async def test_tool_cancel_marks_the_context_cancelled() -> None:
    session = Session()
    core = connected(session)
    seen: list[ToolContext] = []
    release = asyncio.Event()

    async def handler(args: Any, ctx: ToolContext) -> None:
        seen.append(ctx)
        await release.wait()

    session.on_tool("t", handler)
    session.receive(request("q1"))
    await asyncio.sleep(0)
    assert not seen[0].cancelled
    session.receive('{"type":"tool.cancel","toolRequestId":"q1","reason":"deadline"}')
    assert seen[0].cancelled
    sent = len(core.sent)
    session.receive('{"type":"tool.cancel","toolRequestId":"unknown","reason":"x"}')
    assert len(core.sent) == sent  # ignored: nothing answered, nothing raised
    release.set()
    for _ in range(5):
        await asyncio.sleep(0)
    assert [frame["toolRequestId"] for frame in core.of_type("tool.result")] == ["q1"]
    # a cancel for an id not running is not remembered: a later request of that id runs
    session.receive(request("unknown"))
    await asyncio.sleep(0)
    assert seen[1].tool_request_id == "unknown" and not seen[1].cancelled


async def test_send_text_runs_a_turn() -> None:
    session = Session()
    core = connected(session)
    deltas: list[str] = []
    session.subscribe(lambda e: deltas.append(e.text) if isinstance(e, TurnDelta) else None)
    task = asyncio.ensure_future(session.send_text("hello"))
    await asyncio.sleep(0)
    start = core.of_type("turn.start")[0]
    assert start["text"] == "hello"
    assert session.state == SessionState.RUNNING
    turn_id = start["turnId"]
    session.receive(json.dumps({"type": "turn.delta", "turnId": turn_id, "text": "Hi "}))
    session.receive(json.dumps({"type": "turn.end", "turnId": turn_id, "status": "completed",
                                "text": "Hi there"}))
    assert await task == "Hi there"
    assert deltas == ["Hi "]
    assert session.state == SessionState.IDLE


async def test_failed_turn_raises_turn_error() -> None:
    session = Session()
    core = connected(session)
    task = asyncio.ensure_future(session.send_text("x"))
    await asyncio.sleep(0)
    turn_id = core.of_type("turn.start")[0]["turnId"]
    session.receive(json.dumps({"type": "turn.end", "turnId": turn_id, "status": "failed",
                                "text": "", "error": {"code": "STEP_LIMIT", "message": "m"}}))
    with pytest.raises(TurnError) as info:
        await task
    assert (info.value.status, info.value.code) == ("failed", "STEP_LIMIT")


async def test_send_text_needs_a_connection() -> None:
    with pytest.raises(NotConnectedError):
        await Session().send_text("x")


async def test_close_fails_running_turns() -> None:
    session = Session()
    connected(session)
    task = asyncio.ensure_future(session.send_text("x"))
    await asyncio.sleep(0)
    session.close()
    with pytest.raises(RuntimeError, match="closed"):
        await task


def test_tools_update_is_sent_when_tools_change() -> None:
    session = Session()
    core = connected(session)
    tool = define_tool(name="late", description="d", args_schema={"type": "object"})
    dispose = session.add_tool(tool)
    assert core.of_type("tools.update")[-1]["tools"] == [tool.metadata()]
    dispose()
    assert core.of_type("tools.update")[-1]["tools"] == []


def test_a_failing_transport_loses_nothing() -> None:
    class Broken:
        def send(self, frame: str) -> None:
            raise OSError("socket gone")

    session = Session()
    session.on_tool("t", lambda: "kept")
    session.connection_made(Broken())
    session.receive(request("q1"))  # the send fails; the result stays in the ledger
    core = FakeCore()
    session.connection_made(core)
    session.receive(request("q1"))
    assert core.of_type("tool.result")[0]["result"] == "kept"


async def test_a_refused_turn_start_ends_that_turn_instead_of_hanging() -> None:
    session = Session()
    core = connected(session)
    first = asyncio.ensure_future(session.send_text("one"))
    second = asyncio.ensure_future(session.send_text("two"))
    await asyncio.sleep(0)
    first_id, second_id = (frame["turnId"] for frame in core.of_type("turn.start"))
    session.receive(json.dumps({"type": "error", "code": "TURN_BUSY", "turnId": second_id,
                                "message": f"turn {first_id!r} is still running"}))
    with pytest.raises(TurnError) as info:
        await second
    assert (info.value.status, info.value.code) == ("failed", "TURN_BUSY")
    assert not first.done()
    session.receive(json.dumps({"type": "turn.end", "turnId": first_id, "status": "completed",
                                "text": "done"}))
    assert await first == "done"


async def test_the_pages_send_text_answers_json_without_a_python_class_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the loader's sendText gets: the reply, or an error for people (its message)
    and for code (name, code, status); never a Python traceback or class path."""
    import sys
    from types import SimpleNamespace
    from urllib.parse import urlsplit

    from pedelec_pyodide.browser import PageSession

    def url(text: str, base: str | None = None) -> SimpleNamespace:  # the JS URL class
        parts = urlsplit(text)
        return SimpleNamespace(protocol=f"{parts.scheme}:", host=parts.netloc,
                               pathname=parts.path or "/", search="")

    # a page with no location nor storage, the URL class its only global
    monkeypatch.setitem(sys.modules, "js", SimpleNamespace(URL=SimpleNamespace(new=url)))
    page = PageSession("http://127.0.0.1:1", lambda kind, detail: None, '{"storage": false}')
    unconnected = json.loads(await page.send_text("hi"))
    assert unconnected["error"]["name"] == "NotConnectedError"
    core = connected(page.session)

    async def turn(text: str, end: dict[str, Any]) -> Any:
        answer = page.send_text(text)
        await asyncio.sleep(0)
        turn_id = core.of_type("turn.start")[-1]["turnId"]
        page.session.receive(json.dumps({"turnId": turn_id, **end}))
        return json.loads(await answer)

    assert await turn("hi", {"type": "turn.end", "status": "completed", "text": "hello"}) == {
        "reply": "hello"}
    refused = await turn("x" * 100, {"type": "error", "code": "FRAME_TOO_LARGE",
                                     "message": "frame is 1600075 bytes; the limit is 1048576"})
    assert refused == {"error": {
        "name": "TurnError", "code": "FRAME_TOO_LARGE", "status": "failed",
        "message": "turn failed: FRAME_TOO_LARGE: frame is 1600075 bytes; the limit is 1048576",
    }}


def test_the_page_emits_only_the_event_types_its_js_listens_to(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The loader says which types its JS listens to (``events``) and each new one
    (``listen``): only those are emitted, and with none the session has no listener (its
    per-call events are not even built). State and id are read when asked."""
    page = browser_page(monkeypatch, '{"storage": false, "events": []}')
    emitted = page.emitted
    page.session.add_tool(define_tool(name="t", description="d", args_schema={"type": "object"},
                                      handler=lambda args: {"ok": args["n"]}))
    assert page.session._listeners == []
    core = connected(page.session)
    assert page.state() == "idle" and page.session_id() == "s1"
    page.session.receive(request("r1", "t", {"n": 1}))
    assert emitted == [] and core.of_type("tool.result")[-1]["result"] == {"ok": 1}

    page.listen("toolcall")
    page.listen("toolcall")
    page.session.receive(request("r2", "t", {"n": 2}, turn_id="turn-1"))
    (kind, detail), = emitted
    assert kind == "toolcall"
    assert detail == {"toolRequestId": "r2", "turnId": "turn-1", "tool": "t",
                      "args": {"n": 2}, "handledBy": "inline",
                      "durationMs": detail["durationMs"], "source": "core",
                      "result": {"ok": 2}}
    page.listen("statechange")
    page.listen("toolstatus")
    page.session.receive(request("r3", "t", {"n": 3}))
    assert [kind for kind, _ in emitted[1:]] == [
        "statechange", "toolstatus", "toolstatus", "toolcall", "statechange"]
    assert emitted[1][1] == {"state": "waiting_tool_result", "id": "s1"}
    page.close()
    assert page.state() == "closed"
    assert emitted[-1] == ("statechange", {"state": "closed", "id": "s1"})


async def test_a_first_connection_closed_1013_before_its_welcome_backs_off_and_resumes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A page starting with a stored session (a reload) whose first connection Core
    closes 1013 before any welcome (a cluster node that cannot reach its store): connect
    backs off and resumes the session on the next connection, rather than failing."""
    import sys
    from types import SimpleNamespace

    from pedelec_pyodide.browser import CoreLink

    sockets: list[Any] = []

    class Socket:  # the JS WebSocket, as far as the CoreLink uses it
        readyState = 1

        def __init__(self, url: str) -> None:
            self.sent: list[dict[str, Any]] = []
            self.onopen = self.onmessage = self.onclose = self.onerror = None
            sockets.append(self)

        def send(self, frame: str) -> None:
            self.sent.append(json.loads(frame))

        def close(self, code: int, reason: str) -> None:
            pass

        def fire(self, kind: str, **fields: Any) -> None:
            handler = getattr(self, f"on{kind}")
            assert handler is not None
            handler(SimpleNamespace(type=kind, **fields))

    class Proxy:  # pyodide.ffi.create_proxy's stand-in
        def __init__(self, function: Any) -> None:
            self.function = function

        def __call__(self, event: Any) -> None:
            self.function(event)

        def destroy(self) -> None:
            pass

    monkeypatch.setitem(sys.modules, "js", SimpleNamespace(WebSocket=SimpleNamespace(
        new=Socket)))
    monkeypatch.setitem(sys.modules, "pyodide.ffi", SimpleNamespace(create_proxy=Proxy))
    session = Session()
    session.session_id, session.resume_token = "s1", "tok"
    bridge = CoreLink(session, "ws://core/pedelec/v1/bridge", None, "", min_delay=0.01)
    started = asyncio.ensure_future(bridge.start())
    for _ in range(2):
        await asyncio.sleep(0)
    sockets[0].fire("open")
    assert sockets[0].sent[0]["sessionId"] == "s1"
    sockets[0].fire("close", code=1013, reason="the store is out of reach; resume again")
    for _ in range(200):  # the backoff: at most 0.01 s
        if len(sockets) > 1 or started.done():
            break
        await asyncio.sleep(0.005)
    assert not started.done(), started.exception()
    assert len(sockets) == 2
    sockets[1].fire("open")
    assert sockets[1].sent[0]["sessionId"] == "s1"
    sockets[1].fire("message", data=json.dumps({
        "type": "welcome", "sessionId": "s1", "resumeToken": "tok", "resumed": True,
        "state": "idle"}))
    await asyncio.wait_for(started, 1)
    assert session.session_id == "s1" and session.connected
    bridge.stop()


async def test_core_refusing_a_late_word_on_a_request_it_cancelled_is_no_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    """Core gave up on q1 (its caller hung up, its deadline passed) and the page's result
    arrives after: Core's LATE_RESULT (or UNKNOWN_TOOL_REQUEST for a progress frame on its
    way) says nothing is wrong, so the page logs it at debug level in words. The same
    refusal about a request Core never cancelled is still a warning."""
    session = Session()
    connected(session)
    session.receive('{"type":"tool.cancel","toolRequestId":"q1","reason":"the caller hung up"}')
    with caplog.at_level(logging.DEBUG, logger="pedelec_pyodide"):
        for code in ("LATE_RESULT", "UNKNOWN_TOOL_REQUEST"):
            session.receive(json.dumps({"type": "error", "code": code, "message": "m",
                                        "toolRequestId": "q1"}))
        session.receive(json.dumps({"type": "error", "code": "UNKNOWN_TOOL_REQUEST",
                                    "message": "no tool request 'q2'", "toolRequestId": "q2"}))
    quiet = [r for r in caplog.records if r.levelno == logging.DEBUG]
    assert len(quiet) == 2 and all("Core had already given up on it (the caller hung up)"
                                   in r.getMessage() for r in quiet)
    (loud,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert loud.getMessage() == "Core reported UNKNOWN_TOOL_REQUEST: no tool request 'q2'"
