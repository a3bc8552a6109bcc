"""Long-running and interactive tools, Core's side: a real Core, the page spoken by hand.

The page sends ``tool.progress`` and ``tool.waiting`` for a pending request; Core keeps the
latest progress, moves the request's idle deadline (up to ``maxTotalMs``), pauses it while
the page waits for the user (up to ``--user-wait-limit``) and shows it all in
``GET .../sessions/{id}``. Every wait is bounded. Deadlines run on a clock
(:func:`fake_clock`) the test moves once Core has taken the frame before
(``until``), never on a sleep that must land before or after one.
"""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

from clockkit import FakeClock
from corekit import (
    TOKEN,
    WAIT,
    Core,
    RawClient,
    config,
    fake_clock,
    hang_up,
    http_handlers_done,
    next_of,
    page_with,
    progress,
    result,
    run,
    running_core,
    status_of,
    tool_meta,
    until,
)

from pedelec_pyodide.core.sessions import MAX_PROGRESS_MESSAGE_CHARS


async def waiting(client: RawClient, request_id: str, flag: bool, **extra: Any) -> None:
    await client.send({"type": "tool.waiting", "toolRequestId": request_id,
                       "waiting": flag, **extra})


async def progressed(core: Core, client: RawClient, session_id: str, request_id: str,
                     value: float) -> None:
    """Send a progress and wait until Core has taken it."""
    await progress(client, request_id, value)

    def taken() -> bool:
        pending = core.registry.get(session_id).pending.get(request_id)
        return (pending is None
                or (pending.progress is not None and pending.progress.progress == value))

    await until(taken, f"progress {value} to arrive")


async def pending_of(core: Core, session_id: str) -> list[dict[str, Any]]:
    info = await core.session_info(session_id)
    listed: list[dict[str, Any]] = info["pendingToolRequests"]
    return listed


def test_progress_is_kept_shown_and_never_goes_back() -> None:
    async def main() -> None:
        async with running_core() as core:
            client, welcome = await page_with(core)
            sid = welcome["sessionId"]
            call = asyncio.create_task(core.tool_call(sid, "slow"))
            request = await next_of(client, "tool.request")
            rid = request["toolRequestId"]
            info = await core.session_info(sid)
            assert info["state"] == "waiting_tool_result"
            assert info["pendingToolRequests"] == [
                {"toolRequestId": rid, "tool": "slow", "status": "running", "progress": None}]
            await progress(client, rid, 1, total=10, message="one of ten")
            await progress(client, rid, 0.5, message="back")  # dropped: never goes back
            await progress(client, rid, 1, message="again")  # dropped: not an increase
            await progress(client, rid, 2)
            await until(lambda: core.registry.get(sid).pending[rid].progress is not None
                        and core.registry.get(sid).pending[rid].progress.progress == 2,
                        "the progress to arrive")
            [shown] = await pending_of(core, sid)
            assert shown["progress"] == {"progress": 2, "total": None, "message": None}
            await result(client, rid, "done")
            answer = (await asyncio.wait_for(call, WAIT)).json()
            assert answer["result"] == "done"
            info = await core.session_info(sid)
            assert info["pendingToolRequests"] == []
            assert info["state"] == "idle"
            listed = (await core.http.get("/pedelec/v1/sessions")).json()["sessions"]
            assert listed[0]["pendingToolRequests"] == []
            # progress for a request that is not pending is refused, naming it
            await progress(client, rid, 3)
            error = await next_of(client, "error")
            assert error["code"] == "UNKNOWN_TOOL_REQUEST"
            assert error["toolRequestId"] == rid

    run(main())


async def kept_alive_for(core: Core, clock: FakeClock, client: RawClient, sid: str,
                         rid: str, every: float) -> float:
    """Progress every ``every`` seconds (of ``clock``) until Core times the request out;
    how long that took."""
    started = clock.time()
    step = 0
    while status_of(core, sid, rid) is not None:
        assert clock.time() - started < 5, "progress kept the request alive past its limit"
        step += 1
        await progressed(core, client, sid, rid, step)
        await clock.advance(every)
    return clock.time() - started


def test_progress_keeps_a_request_alive_up_to_max_total_ms() -> None:
    async def main() -> None:
        clock = fake_clock()
        async with running_core(config(clock=clock)) as core:
            client, welcome = await page_with(core)
            sid = welcome["sessionId"]
            # an idle deadline of 0.4 s, kept alive 1.2 s by progress every 0.1 s
            call = asyncio.create_task(core.tool_call(sid, "slow", timeoutMs=400))
            rid = (await next_of(client, "tool.request"))["toolRequestId"]
            for step in range(12):
                await progressed(core, client, sid, rid, step)
                await clock.advance(0.1)
            assert status_of(core, sid, rid) == "running"
            await clock.advance(0.25)  # 0.35 s after the last progress: under 0.4 s
            assert status_of(core, sid, rid) == "running"
            await result(client, rid, "kept alive")
            assert (await asyncio.wait_for(call, WAIT)).json()["result"] == "kept alive"

            # progress cannot keep it past maxTotalMs
            call = asyncio.create_task(core.tool_call(sid, "slow", timeoutMs=300,
                                                      maxTotalMs=900))
            rid = (await next_of(client, "tool.request"))["toolRequestId"]
            elapsed = await kept_alive_for(core, clock, client, sid, rid, 0.05)
            error = (await asyncio.wait_for(call, WAIT)).json()["result"]["error"]
            assert error["code"] == "TOOL_TIMEOUT"
            assert 0.9 <= elapsed < 0.96, elapsed

    run(main())


def test_without_progress_the_idle_deadline_ends_a_request() -> None:
    async def main() -> None:
        clock = fake_clock()
        async with running_core(config(clock=clock)) as core:
            client, welcome = await page_with(core)
            sid = welcome["sessionId"]
            call = asyncio.create_task(core.tool_call(sid, "slow", timeoutMs=400))
            rid = (await next_of(client, "tool.request"))["toolRequestId"]
            await progressed(core, client, sid, rid, 1)
            await clock.advance(0.39)
            assert status_of(core, sid, rid) == "running"
            await clock.advance(0.02)
            assert status_of(core, sid, rid) is None
            error = (await asyncio.wait_for(call, WAIT)).json()["result"]["error"]
            assert error["code"] == "TOOL_TIMEOUT"
            assert "before its deadline" in error["message"]

    run(main())


def test_the_default_total_is_max_total_factor_times_the_timeout() -> None:
    async def main() -> None:
        clock = fake_clock()
        async with running_core(config(max_total_factor=2.0, clock=clock)) as core:
            client, welcome = await page_with(core)
            sid = welcome["sessionId"]
            call = asyncio.create_task(core.tool_call(sid, "slow", timeoutMs=500))
            rid = (await next_of(client, "tool.request"))["toolRequestId"]
            elapsed = await kept_alive_for(core, clock, client, sid, rid, 0.05)
            assert (await asyncio.wait_for(call, WAIT)).json()[
                "result"]["error"]["code"] == "TOOL_TIMEOUT"
            assert 1.0 <= elapsed < 1.06, elapsed  # 2 x 0.5 s, not the default 10 x

    run(main())


def test_max_total_ms_is_checked() -> None:
    async def main() -> None:
        async with running_core() as core:
            _, welcome = await page_with(core)
            sid = welcome["sessionId"]
            for bad in (0, -1, 1.5, "10", True, 24 * 60 * 60 * 1000 + 1):
                response = await core.tool_call(sid, "slow", maxTotalMs=bad)
                assert response.status_code == 400
                assert "'maxTotalMs'" in response.json()["error"]["message"]

    run(main())


def test_waiting_for_the_user_pauses_the_deadline() -> None:
    async def main() -> None:
        clock = fake_clock()
        async with running_core(config(clock=clock)) as core:
            client, welcome = await page_with(core)
            sid = welcome["sessionId"]
            call = asyncio.create_task(core.tool_call(sid, "slow", timeoutMs=300))
            rid = (await next_of(client, "tool.request"))["toolRequestId"]
            await clock.advance(0.1)
            await waiting(client, rid, True, reason="approval")
            await until(lambda: status_of(core, sid, rid) == "awaiting_approval",
                        "the approval to be shown")
            [shown] = await pending_of(core, sid)
            assert shown["status"] == "awaiting_approval"
            await clock.advance(0.8)  # well past its deadline: paused
            assert status_of(core, sid, rid) == "awaiting_approval"
            await waiting(client, rid, False)
            await waiting(client, rid, True, reason="a dialog is open")
            await until(lambda: status_of(core, sid, rid) == "waiting_for_user",
                        "the dialog to be shown")
            await clock.advance(0.5)
            assert status_of(core, sid, rid) == "waiting_for_user"
            await waiting(client, rid, False)
            await until(lambda: status_of(core, sid, rid) == "running",
                        "the request to run again")
            # the deadline runs again from where it stopped: 0.2 s were left
            await clock.advance(0.19)
            assert status_of(core, sid, rid) == "running"
            assert not call.done()
            await clock.advance(0.02)
            assert status_of(core, sid, rid) is None
            answer = (await asyncio.wait_for(call, WAIT)).json()
            assert answer["result"]["error"]["code"] == "TOOL_TIMEOUT"

    run(main())


def test_a_user_who_never_answers_times_out_at_the_user_wait_limit() -> None:
    async def main() -> None:
        clock = fake_clock()
        async with running_core(config(user_wait_limit=0.6, clock=clock)) as core:
            client, welcome = await page_with(core)
            sid = welcome["sessionId"]
            call = asyncio.create_task(core.tool_call(sid, "slow", timeoutMs=200))
            rid = (await next_of(client, "tool.request"))["toolRequestId"]
            await waiting(client, rid, True, reason="approval")
            await until(lambda: status_of(core, sid, rid) == "awaiting_approval",
                        "the approval to be shown")
            await clock.advance(0.59)
            assert status_of(core, sid, rid) == "awaiting_approval"
            await clock.advance(0.02)
            error = (await asyncio.wait_for(call, WAIT)).json()["result"]["error"]
            assert error["code"] == "TOOL_TIMEOUT"
            assert "--user-wait-limit" in error["message"]
            cancel = await next_of(client, "tool.cancel")
            assert cancel["toolRequestId"] == rid

    run(main())


def test_a_reload_while_awaiting_approval_asks_again_and_progress_continues() -> None:
    async def main() -> None:
        async with running_core() as core:
            client, welcome = await page_with(core)
            sid = welcome["sessionId"]
            call = asyncio.create_task(core.tool_call(sid, "slow", timeoutMs=5000))
            rid = (await next_of(client, "tool.request"))["toolRequestId"]
            await progress(client, rid, 5, total=10)
            await waiting(client, rid, True, reason="approval")
            await until(lambda: core.registry.get(sid).pending[rid].status
                        == "awaiting_approval", "the approval")
            await client.close()  # the page reloads
            await until(lambda: core.registry.get(sid).connection is None, "the drop")
            [shown] = await pending_of(core, sid)
            assert shown["status"] == "running"  # nobody can answer without a page
            assert core.registry.get(sid).pending[rid].paused_at is None
            again = await RawClient.open(core.ws_url)
            resumed = await again.hello([tool_meta("slow")], sessionId=sid,
                                        resumeToken=welcome["resumeToken"])
            assert resumed["resumed"] is True
            resent = await next_of(again, "tool.request")
            assert resent["toolRequestId"] == rid  # asked again, same id
            await waiting(again, rid, True, reason="approval")
            await until(lambda: core.registry.get(sid).pending[rid].status
                        == "awaiting_approval", "the approval asked again")
            await waiting(again, rid, False)
            await progress(again, rid, 1, total=10)  # the run starts over: not shown
            await progress(again, rid, 6, total=10)
            await until(lambda: core.registry.get(sid).pending[rid].progress.progress == 6,
                        "progress past the last value")
            [shown] = await pending_of(core, sid)
            assert shown == {"toolRequestId": rid, "tool": "slow", "status": "running",
                             "progress": {"progress": 6, "total": 10, "message": None}}
            await result(again, rid, "once")
            assert (await asyncio.wait_for(call, WAIT)).json()["result"] == "once"

    run(main())


def test_a_flood_of_progress_frames_costs_constant_memory() -> None:
    async def main() -> None:
        # (60 MB of frames, read at once: --read-rate would pace them over 30 s)
        async with running_core(config(rate_limit=1e6, rate_burst=10**6,
                                       read_rate=1e12)) as core:
            client, welcome = await page_with(core)
            sid = welcome["sessionId"]
            call = asyncio.create_task(core.tool_call(sid, "slow"))
            rid = (await next_of(client, "tool.request"))["toolRequestId"]
            pending = core.registry.get(sid).pending[rid]
            message = "x" * 20_000
            count = 3000
            for step in range(count):
                await progress(client, rid, step, message=message)
            await until(lambda: pending.progress is not None
                        and pending.progress.progress == count - 1, "the last progress")
            kept = pending.progress
            assert kept.message == "x" * MAX_PROGRESS_MESSAGE_CHARS
            assert pending.watchers == []
            await result(client, rid, "ok")
            assert (await asyncio.wait_for(call, WAIT)).json()["result"] == "ok"

    run(main())


# --- the control API's event stream ---------------------------------------------------------

STREAM = {"Accept": "text/event-stream"}


def calls_path(session_id: str) -> str:
    return f"/pedelec/v1/sessions/{session_id}/tool-calls"


async def read_events(response: Any, events: list[tuple[str, Any]]) -> None:
    """Server-sent events as (name, data) until the stream ends."""
    name = None
    async for line in response.aiter_lines():
        if line.startswith("event: "):
            name = line[len("event: "):]
        elif line.startswith("data: "):
            events.append((str(name), json.loads(line[len("data: "):])))


def test_a_call_that_accepts_an_event_stream_gets_progress_then_its_result() -> None:
    async def main() -> None:
        async with running_core() as core:
            client, welcome = await page_with(core)
            sid = welcome["sessionId"]
            events: list[tuple[str, Any]] = []

            async def call() -> Any:
                async with core.http.stream(
                        "POST", calls_path(sid), headers=STREAM,
                        json={"tool": "slow", "args": {}, "maxTotalMs": 60_000}) as response:
                    assert response.status_code == 200
                    assert response.headers["content-type"].startswith("text/event-stream")
                    await read_events(response, events)

            task = asyncio.create_task(call())
            rid = (await next_of(client, "tool.request"))["toolRequestId"]
            await progress(client, rid, 1, total=3, message="first")
            await until(lambda: len(events) == 1, "the first progress event")
            await progress(client, rid, 2)
            await until(lambda: len(events) == 2, "the second progress event")
            await progress(client, rid, 3, total=3)
            await result(client, rid, {"done": True})
            await asyncio.wait_for(task, WAIT)
            assert events == [
                ("progress", {"progress": 1, "total": 3, "message": "first"}),
                ("progress", {"progress": 2}),
                ("progress", {"progress": 3, "total": 3}),  # the last one before the result
                ("result", {"toolRequestId": rid, "result": {"done": True},
                            "handledBy": "named"}),
            ]

    run(main())


def test_an_event_stream_says_when_the_call_waits_for_the_user() -> None:
    """A call awaiting the user's approval (or a dialog) would look hung on a stream of
    progress alone: a waiting event says it waits, and another when it runs again."""
    async def main() -> None:
        async with running_core() as core:
            client, welcome = await page_with(core)
            sid = welcome["sessionId"]
            events: list[tuple[str, Any]] = []

            async def call() -> None:
                async with core.http.stream("POST", calls_path(sid), headers=STREAM,
                                            json={"tool": "slow"}) as response:
                    await read_events(response, events)

            task = asyncio.create_task(call())
            rid = (await next_of(client, "tool.request"))["toolRequestId"]
            await waiting(client, rid, True, reason="approval")
            await until(lambda: len(events) == 1, "the waiting event")
            await waiting(client, rid, False)
            await until(lambda: len(events) == 2, "the running event")
            await waiting(client, rid, True, reason="a dialog is open")
            await until(lambda: len(events) == 3, "the second waiting event")
            await waiting(client, rid, False)
            await until(lambda: len(events) == 4, "running again")
            await progress(client, rid, 1)
            await result(client, rid, "done")
            await asyncio.wait_for(task, WAIT)
            assert events == [
                ("waiting", {"waiting": True, "status": "awaiting_approval"}),
                ("waiting", {"waiting": False, "status": "running"}),
                ("waiting", {"waiting": True, "status": "waiting_for_user"}),
                ("waiting", {"waiting": False, "status": "running"}),
                ("progress", {"progress": 1}),
                ("result", {"toolRequestId": rid, "result": "done", "handledBy": "named"}),
            ]

    run(main())


def test_an_event_stream_caller_that_hangs_up_cancels_unless_it_gave_a_key() -> None:
    async def main() -> None:
        async with running_core() as core:
            client, welcome = await page_with(core)
            sid = welcome["sessionId"]
            events: list[tuple[str, Any]] = []

            async def call(headers: dict[str, str]) -> None:
                async with core.http.stream("POST", calls_path(sid), headers=headers,
                                            json={"tool": "slow"}) as response:
                    await read_events(response, events)

            task = asyncio.create_task(call(STREAM))
            rid = (await next_of(client, "tool.request"))["toolRequestId"]
            await progress(client, rid, 1)
            await until(lambda: len(events) == 1, "a progress event")
            task.cancel()  # the caller goes away
            cancel = await next_of(client, "tool.cancel")
            assert cancel["toolRequestId"] == rid
            assert "hung up" in cancel["reason"]

            # with a key, the request runs on; a retry with the key streams it again
            keyed = {**STREAM, "Idempotency-Key": "k-stream"}
            baseline = len(core.server.server_state.tasks)
            sent: list[str] = []

            async def requested() -> None:
                sent.append((await next_of(client, "tool.request"))["toolRequestId"])
                await progress(client, sent[0], 1)
                await until(lambda: core.registry.get(sid).pending[sent[0]].watchers != [],
                            "the stream to wait for more")

            await hang_up(core.port, calls_path(sid), {"tool": "slow"}, keyed, requested)
            await http_handlers_done(core, baseline)
            [rid] = sent
            assert rid in core.registry.get(sid).pending
            # the caller that left keeps no place among the request's watchers
            assert core.registry.get(sid).pending[rid].watchers == []
            events.clear()
            events.clear()
            retry = asyncio.create_task(call(keyed))
            await until(lambda: len(events) == 1, "the latest progress, on the retry")
            assert events == [("progress", {"progress": 1})]
            await result(client, rid, "ran once")
            await asyncio.wait_for(retry, WAIT)
            assert events[-1] == ("result", {"toolRequestId": rid, "result": "ran once",
                                             "handledBy": "named"})
            # and once it is done, a retry's stream is its result alone
            events.clear()
            await asyncio.wait_for(call(keyed), WAIT)
            assert [name for name, _ in events] == ["result"]

    run(main())


def test_a_slow_event_stream_reader_gets_the_latest_progress_not_a_backlog() -> None:
    """A caller that stops reading: Core's send waits on the socket and the request keeps
    only its latest progress, so what the caller reads later skips the values it missed
    (were every event queued for it, Core's memory would grow with the page's frames)."""
    async def main() -> None:
        async with running_core(config(rate_limit=1e6, rate_burst=10**6)) as core:
            client, welcome = await page_with(core)
            sid = welcome["sessionId"]
            body = json.dumps({"tool": "slow"}).encode()
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.setblocking(False)
            loop = asyncio.get_running_loop()
            await loop.sock_connect(sock, ("127.0.0.1", core.port))
            reader, writer = await asyncio.open_connection(sock=sock)
            writer.write(
                f"POST {calls_path(sid)} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                f"Authorization: Bearer {TOKEN}\r\nAccept: text/event-stream\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                .encode() + body)
            await writer.drain()
            rid = (await next_of(client, "tool.request"))["toolRequestId"]
            pending = core.registry.get(sid).pending[rid]
            count = 20_000
            message = "m" * MAX_PROGRESS_MESSAGE_CHARS
            for step in range(1, count + 1):
                await progress(client, rid, step, message=message)
            await until(lambda: pending.progress is not None
                        and pending.progress.progress == count, "the last progress")
            assert len(pending.watchers) <= 1
            await result(client, rid, "end")
            received = b""
            while not received.endswith(b"0\r\n\r\n"):  # the chunked body's end
                chunk = await asyncio.wait_for(reader.read(1 << 20), WAIT)
                assert chunk, "the stream ended early"
                received += chunk
            writer.close()
            values = [json.loads(line[len(b"data: "):])
                      for line in received.split(b"\n") if line.startswith(b"data: ")]
            *updates, last = values
            assert last["result"] == "end"
            assert updates[-1]["progress"] == count
            assert len(updates) < count / 2  # most were replaced by later ones, unsent

    run(main())


# --- turns ----------------------------------------------------------------------------------


def test_the_offline_agents_turn_waits_for_the_user_and_reports_a_denial() -> None:
    """A turn of the offline agent (Core's default) calls a tool the page asks the user to
    approve for longer than its deadline: the turn waits; the denial is its reply."""
    async def main() -> None:
        clock = fake_clock()
        cfg = config(agent="offline", agent_factory=None, tool_timeout_ms=300, clock=clock)
        async with running_core(cfg) as core:
            client, welcome = await page_with(core, "delete_note")
            sid = welcome["sessionId"]
            turn = asyncio.create_task(core.turn(sid, '/call delete_note {"id": 7}'))
            rid = (await next_of(client, "tool.request"))["toolRequestId"]
            await waiting(client, rid, True, reason="approval")
            await until(lambda: status_of(core, sid, rid) == "awaiting_approval",
                        "the approval to be shown")
            await clock.advance(0.9)  # three deadlines
            assert status_of(core, sid, rid) == "awaiting_approval"
            assert not turn.done()
            await result(client, rid, {"error": {
                "code": "TOOL_DENIED", "message": "the user denied this call",
                "retryable": False, "details": {"reason": "not now"}}})
            answer = (await asyncio.wait_for(turn, WAIT)).json()
            assert answer["status"] == "completed"
            assert answer["text"] == "delete_note → error TOOL_DENIED: the user denied this call"

    run(main())


def test_waits_for_the_user_together_are_bounded_by_the_user_wait_limit() -> None:
    """A page that ends each wait just before the limit and starts another (a handler
    opening dialog after dialog, or a hostile page) does not hold its caller forever: the
    limit bounds the request's waits together."""
    async def main() -> None:
        clock = fake_clock()
        async with running_core(config(user_wait_limit=0.6, clock=clock)) as core:
            client, welcome = await page_with(core)
            sid = welcome["sessionId"]
            call = asyncio.create_task(core.tool_call(sid, "slow", timeoutMs=300))
            rid = (await next_of(client, "tool.request"))["toolRequestId"]
            waits = 0
            while status_of(core, sid, rid) is not None:
                assert waits < 20, "20 waits of 0.4 s (8 s) and the request still held"
                waits += 1
                await waiting(client, rid, True, reason="a dialog is open")
                await until(lambda: status_of(core, sid, rid) != "running",
                            "the dialog to be shown")
                await clock.advance(0.4)  # each wait under the limit
                await waiting(client, rid, False)
                await until(lambda: status_of(core, sid, rid) in ("running", None),
                            "the dialog to close")
            # 0.6 s of waiting together: the second wait ends it
            assert waits == 2
            error = (await asyncio.wait_for(call, WAIT)).json()["result"]["error"]
            assert error["code"] == "TOOL_TIMEOUT"
            assert "--user-wait-limit" in error["message"]

    run(main())
