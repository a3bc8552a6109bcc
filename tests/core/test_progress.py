"""Long-running and interactive tools, Core's side: a real Core, the page spoken by hand.

The page sends ``tool.progress`` and ``tool.waiting`` for a pending request; Core keeps the
latest progress, moves the request's idle deadline (up to ``maxTotalMs``), pauses it while
the page waits for the user (up to ``--user-wait-limit``) and shows it all in
``GET .../sessions/{id}``. Every wait is bounded; times are generous bounds only.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from corekit import WAIT, Core, RawClient, config, run, running_core, tool_meta, until

from pedelec_pyodide.core.sessions import MAX_PROGRESS_MESSAGE_CHARS


async def page_with(core: Core, *names: str) -> tuple[RawClient, dict[str, Any]]:
    client = await RawClient.open(core.ws_url)
    welcome = await client.hello([tool_meta(name) for name in names or ("slow",)])
    assert welcome["type"] == "welcome"
    return client, welcome


async def next_of(client: RawClient, kind: str) -> dict[str, Any]:
    """The next frame of ``kind`` (others skipped), within WAIT."""
    async def find() -> dict[str, Any]:
        while True:
            frame = await client.recv()
            if frame["type"] == kind:
                return frame

    result: dict[str, Any] = await asyncio.wait_for(find(), WAIT)
    return result


async def progress(client: RawClient, request_id: str, value: float, **extra: Any) -> None:
    await client.send({"type": "tool.progress", "toolRequestId": request_id,
                       "progress": value, **extra})


async def waiting(client: RawClient, request_id: str, flag: bool, **extra: Any) -> None:
    await client.send({"type": "tool.waiting", "toolRequestId": request_id,
                       "waiting": flag, **extra})


async def result(client: RawClient, request_id: str, value: Any) -> None:
    await client.send({"type": "tool.result", "toolRequestId": request_id,
                       "result": value, "handledBy": "named"})


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


def test_progress_keeps_a_request_alive_up_to_max_total_ms() -> None:
    async def main() -> None:
        async with running_core() as core:
            client, welcome = await page_with(core)
            sid = welcome["sessionId"]
            # an idle deadline of 0.4 s, kept alive 1.2 s by progress every 0.1 s
            call = asyncio.create_task(core.tool_call(sid, "slow", timeoutMs=400))
            rid = (await next_of(client, "tool.request"))["toolRequestId"]
            for step in range(12):
                await progress(client, rid, step)
                await asyncio.sleep(0.1)
            await result(client, rid, "kept alive")
            assert (await asyncio.wait_for(call, WAIT)).json()["result"] == "kept alive"

            # progress cannot keep it past maxTotalMs
            started = time.monotonic()
            call = asyncio.create_task(core.tool_call(sid, "slow", timeoutMs=300,
                                                      maxTotalMs=900))
            rid = (await next_of(client, "tool.request"))["toolRequestId"]
            step = 0
            while not call.done() and time.monotonic() - started < WAIT:
                step += 1
                await progress(client, rid, step)
                await asyncio.sleep(0.05)
            elapsed = time.monotonic() - started
            error = call.result().json()["result"]["error"]
            assert error["code"] == "TOOL_TIMEOUT"
            assert 0.85 <= elapsed < WAIT

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
        async with running_core() as core:
            client, welcome = await page_with(core)
            sid = welcome["sessionId"]
            call = asyncio.create_task(core.tool_call(sid, "slow", timeoutMs=300))
            rid = (await next_of(client, "tool.request"))["toolRequestId"]
            await waiting(client, rid, True, reason="approval")
            await until(lambda: core.registry.get(sid).pending[rid].status
                        == "awaiting_approval", "the approval to be shown")
            [shown] = await pending_of(core, sid)
            assert shown["status"] == "awaiting_approval"
            await asyncio.sleep(0.8)  # well past its deadline: paused
            assert not call.done()
            await waiting(client, rid, False)
            await waiting(client, rid, True, reason="a dialog is open")
            await until(lambda: core.registry.get(sid).pending[rid].status
                        == "waiting_for_user", "the dialog to be shown")
            await asyncio.sleep(0.5)
            assert not call.done()
            await waiting(client, rid, False)
            await until(lambda: core.registry.get(sid).pending[rid].status == "running",
                        "the request to run again")
            # the deadline runs again from where it stopped: it times out in ~0.3 s
            answer = (await asyncio.wait_for(call, WAIT)).json()
            assert answer["result"]["error"]["code"] == "TOOL_TIMEOUT"

    run(main())


def test_a_user_who_never_answers_times_out_at_the_user_wait_limit() -> None:
    async def main() -> None:
        async with running_core(config(user_wait_limit=0.6)) as core:
            client, welcome = await page_with(core)
            sid = welcome["sessionId"]
            started = time.monotonic()
            call = asyncio.create_task(core.tool_call(sid, "slow", timeoutMs=200))
            rid = (await next_of(client, "tool.request"))["toolRequestId"]
            await waiting(client, rid, True, reason="approval")
            error = (await asyncio.wait_for(call, WAIT)).json()["result"]["error"]
            assert error["code"] == "TOOL_TIMEOUT"
            assert "--user-wait-limit" in error["message"]
            assert time.monotonic() - started >= 0.6
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
        async with running_core(config(rate_limit=1e6, rate_burst=10**6)) as core:
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
