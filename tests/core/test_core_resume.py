"""Resume: drops and reloads in the middle of parallel calls, restarts of Core, expiry.

Each test asserts that nothing is lost (every request gets its result, every turn ends)
and nothing is delivered twice (each handler runs once, each result reaches Core once).
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
from collections import Counter
from pathlib import Path

import pytest
import websockets
from corekit import (
    WAIT,
    GatedTools,
    Page,
    PlanAgent,
    RawClient,
    config,
    core_process,
    run,
    running_core,
    start_core,
    tool_meta,
    until,
)

from pedelec_pyodide import MemoryLedger, Session, TurnError

HERE = Path(__file__).resolve().parent


def delivered_once(pages: list[Page], results: list[dict[str, object]], count: int) -> None:
    """Each request reached the agent once. (A page may answer a request twice when
    Core's re-send crosses the result on the wire; Core ignores the second copy, with
    DUPLICATE_RESULT, and the agent never sees it.)"""
    assert len(results) == count
    ids = {f["toolRequestId"] for page in pages for f in page.frames("tool.request")}
    assert len(ids) == count


def test_drop_and_resume_in_the_middle_of_parallel_calls() -> None:
    async def main() -> None:
        plan = [[("a", {}), ("b", {}), ("c", {})]]
        async with running_core(config(agent_factory=lambda: PlanAgent(plan))) as core:
            gated = GatedTools("a", "b", "c")
            page = await Page(Session(gated.tools())).connect(core.ws_url)
            sid = page.session.session_id
            reply = asyncio.create_task(page.session.send_text("go"))
            await page.wait_frame("tool.request", 3)
            gated.gates["a"].set()  # a finishes before the drop and reaches Core
            await until(lambda: len(core.registry.get(sid).pending) == 2, "a's result")
            await page.drop()
            await until(lambda: core.registry.get(sid).connection is None, "the drop")
            assert (await core.session_info(sid))["state"] == "connecting"
            gated.gates["b"].set()  # b finishes while offline: its result waits in the ledger
            await until(lambda: page.session.state == "waiting_tool_result"
                        and gated.runs["b"] == 1)
            await page.connect(core.ws_url)
            welcome = page.frames("welcome")[-1]
            assert welcome["resumed"] is True and welcome["sessionId"] == sid
            gated.gates["c"].set()  # c was still running when its request came again
            results = json.loads(await asyncio.wait_for(reply, WAIT))
            assert [r["tool"] for r in results] == ["a", "b", "c"]
            assert gated.runs == Counter(a=1, b=1, c=1)
            requests = page.frames("tool.request")
            assert len(requests) == 5  # a, b, c, then b and c re-sent with the same ids
            delivered_once([page], results, 3)

    run(main())


def test_page_reload_resumes_with_its_ledger_and_never_runs_twice() -> None:
    async def main() -> None:
        plan = [[("a", {}), ("b", {})]]
        async with running_core(config(agent_factory=lambda: PlanAgent(plan))) as core:
            ledger = MemoryLedger()  # stands for sessionStorage, which survives a reload
            first = GatedTools("a", "b")
            page = await Page(Session(first.tools(), ledger=ledger)).connect(core.ws_url)
            sid, token = page.session.session_id, page.session.resume_token
            turn = asyncio.create_task(page.session.send_text("go"))
            await page.wait_frame("tool.request", 2)
            await asyncio.wait_for(first.started["b"].wait(), WAIT)
            first.gates["a"].set()
            await until(lambda: len(core.registry.get(sid).pending) == 1, "a's result")
            await page.drop()  # reload: b was mid-run in the old tab
            turn.cancel()
            page.session.close()

            second = GatedTools("a", "b")
            for gate in second.gates.values():
                gate.set()
            reloaded = Session(second.tools(), ledger=ledger)
            reloaded.session_id, reloaded.resume_token = sid, token
            new_page = await Page(reloaded).connect(core.ws_url)
            assert new_page.frames("welcome")[0]["resumed"] is True
            await new_page.wait_frame("turn.end")
            results = json.loads(new_page.frames("turn.end")[0]["text"])
            assert results[0] == {"tool": "a", "args": {}}
            # b is not idempotent: interrupted mid-run, it is reported, never run twice
            assert results[1]["error"]["code"] == "TOOL_OUTCOME_UNKNOWN"
            assert first.runs + second.runs == Counter(a=1, b=1)
            delivered_once([page, new_page], results, 2)

    run(main())


def test_a_second_connection_supersedes_the_first() -> None:
    async def main() -> None:
        async with running_core() as core:
            first = await RawClient.open(core.ws_url)
            welcome = await first.hello()
            second = await RawClient.open(core.ws_url)
            again = await second.hello(sessionId=welcome["sessionId"],
                                       resumeToken=welcome["resumeToken"])
            assert again["resumed"] is True
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await first.recv()
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 4001
            info = await core.session_info(welcome["sessionId"])
            assert info["connected"] is True

    run(main())


def test_expiry_fails_pending_requests_cleanly() -> None:
    async def main() -> None:
        async with running_core(config(session_ttl=0.2)) as core:
            client = await RawClient.open(core.ws_url)
            welcome = await client.hello([tool_meta("t")])
            sid = welcome["sessionId"]
            call = asyncio.create_task(core.tool_call(sid, "t"))
            assert (await client.recv())["type"] == "tool.request"
            await client.close()
            body = (await asyncio.wait_for(call, WAIT)).json()
            assert body["result"]["error"]["code"] == "SESSION_EXPIRED"
            assert (await core.http.get(f"/pedelec/v1/sessions/{sid}")).status_code == 404
            late = await RawClient.open(core.ws_url)
            refused = await late.hello(sessionId=sid, resumeToken=welcome["resumeToken"])
            assert refused["code"] == "RESUME_REFUSED"

    run(main())


def test_sqlite_graceful_restart_keeps_sessions_and_ends_the_turn_cancelled(
        tmp_path: Path) -> None:
    async def main() -> None:
        db = str(tmp_path / "core.sqlite")
        cfg = config(store=db, agent_factory=lambda: PlanAgent([[("a", {})]]))
        core = await start_core(cfg)
        gated = GatedTools("a")
        page = await Page(Session(gated.tools())).connect(core.ws_url)
        sid = page.session.session_id
        turn = asyncio.create_task(page.session.send_text("go"))
        await asyncio.wait_for(gated.started["a"].wait(), WAIT)
        await core.stop()  # like SIGTERM: the running turn ends cancelled, store flushed

        core = await start_core(config(store=db, agent_factory=lambda: PlanAgent([])),
                                core.port)
        try:
            assert (await core.session_info(sid))["state"] == "connecting"
            await page.connect(core.ws_url)
            assert page.frames("welcome")[-1]["resumed"] is True
            with pytest.raises(TurnError) as ended:
                await asyncio.wait_for(turn, WAIT)
            assert ended.value.status == "cancelled"
            info = await core.session_info(sid)
            assert [t["name"] for t in info["tools"]] == ["a"]
            gated.gates["a"].set()
            await page.wait_frame("error", where=lambda f: f["code"] == "UNKNOWN_TOOL_REQUEST")
            assert gated.runs["a"] == 1
        finally:
            await core.stop()

    run(main())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.mark.parametrize("backend", ["sqlite", "redis"])
def test_core_killed_mid_turn_resumes_the_turn_from_its_store(
        tmp_path: Path, backend: str, request: pytest.FixtureRequest) -> None:
    """kill -9 of Core while b is pending: after the restart the page resumes, b's result
    (from the handler that was still running) reaches the turn once, c runs, the turn ends
    completed, and no handler ran twice; the same on an SQLite file and on Redis."""
    db = (tmp_path / "core.sqlite" if backend == "sqlite"
          else request.getfixturevalue("redis_server").url)

    async def main() -> None:
        port = free_port()
        url = f"ws://127.0.0.1:{port}/pedelec/v1/bridge"
        gated = GatedTools("a", "b", "c")
        gated.gates["a"].set()
        gated.gates["c"].set()
        page = Page(Session(gated.tools()))
        async with core_process(db, port) as process:
            await page.connect(url)
            turn = asyncio.create_task(page.session.send_text("go"))
            await page.wait_frame("tool.request", 2)
            await asyncio.wait_for(gated.started["b"].wait(), WAIT)
            process.send_signal(signal.SIGKILL)
        async with core_process(db, port):
            await page.connect(url)
            assert page.frames("welcome")[-1]["resumed"] is True
            gated.gates["b"].set()
            results = json.loads(await asyncio.wait_for(turn, WAIT))
            assert [r["tool"] for r in results] == ["a", "b", "c"]
            assert gated.runs == Counter(a=1, b=1, c=1)
            delivered_once([page], results, 3)

    run(main())
