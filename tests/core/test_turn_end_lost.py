"""Regressions found by the fault-injection harness (tests/core/faultkit.py): a ``turn.end``
lost with a dropped connection or a killed Core (or a ``turn.start`` lost the same way) left
the page's ``send_text`` waiting forever. The page now re-sends the ``turn.start`` of its
waiting turns after a resume; Core ignores it for the running turn and answers an ended
one with its ``turn.end`` again (never a second run); an ended turn is remembered across a
restart; a turn whose session could not be resumed fails ``TURN_LOST``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest
from corekit import WAIT, PlanAgent, RawClient, config, run, running_core, start_core, tool_meta

from pedelec_pyodide import Session, TurnError
from pedelec_pyodide.session import TURN_LOST


class Wire:
    """A transport that keeps what the Session sends."""

    def __init__(self) -> None:
        self.frames: list[dict[str, Any]] = []

    def send(self, frame: str) -> None:
        self.frames.append(json.loads(frame))


def welcome(resumed: bool) -> str:
    return json.dumps({"type": "welcome", "sessionId": "s1", "resumeToken": "t1",
                       "resumed": resumed, "state": "idle"})


async def turn_across_a_drop(session: Session) -> asyncio.Future[str]:
    """``send_text("hi")`` on a welcomed session, then its connection lost."""
    session.connection_made(Wire())
    session.receive(welcome(False))
    turn = asyncio.ensure_future(session.send_text("hi"))
    await asyncio.sleep(0)
    session.connection_lost()
    return turn


def test_page_resends_turn_start_of_waiting_turns_after_resume() -> None:
    async def main() -> None:
        session = Session()
        turn = await turn_across_a_drop(session)
        wire = Wire()
        session.connection_made(wire)
        session.receive(welcome(True))
        starts = [f for f in wire.frames if f["type"] == "turn.start"]
        assert len(starts) == 1 and starts[0]["text"] == "hi"
        session.receive(json.dumps({"type": "turn.end", "turnId": starts[0]["turnId"],
                                    "status": "completed", "text": "done"}))
        assert await asyncio.wait_for(turn, WAIT) == "done"

    run(main())


def test_a_turn_whose_session_is_not_resumed_fails_instead_of_hanging() -> None:
    async def main() -> None:
        session = Session()
        turn = await turn_across_a_drop(session)
        session.connection_made(Wire())
        session.receive(welcome(False))  # a fresh session: Core never heard of the turn
        with pytest.raises(TurnError) as failed:
            await asyncio.wait_for(turn, WAIT)
        assert failed.value.code == TURN_LOST

    run(main())


async def finished_turn(client: RawClient, turn_id: str) -> dict[str, Any]:
    """Start a turn with one call of tool ``a``, answer it, return the turn.end."""
    await client.send({"type": "turn.start", "turnId": turn_id, "text": "go"})
    request = await client.recv()
    assert request["type"] == "tool.request"
    await client.send({"type": "tool.result", "toolRequestId": request["toolRequestId"],
                       "result": 1, "handledBy": "named"})
    while True:
        frame = await client.recv()
        if frame["type"] == "turn.end":
            return frame


async def resend_gets_the_end_again(client: RawClient, turn_id: str,
                                    end: dict[str, Any]) -> None:
    await client.send({"type": "turn.start", "turnId": turn_id, "text": "go"})
    again = await client.recv()
    assert again == end  # the same end, no new tool.request: the turn did not run twice


def test_core_answers_a_resent_turn_start_of_an_ended_turn_with_its_end() -> None:
    async def main() -> None:
        cfg = config(agent_factory=lambda: PlanAgent([[("a", {})]]))
        async with running_core(cfg) as core:
            client = await RawClient.open(core.ws_url)
            hello = await client.hello([tool_meta("a")])
            end = await finished_turn(client, "turn-1")
            await client.close()  # as if turn.end had been lost with this connection
            client = await RawClient.open(core.ws_url)
            await client.hello([tool_meta("a")], sessionId=hello["sessionId"],
                               resumeToken=hello["resumeToken"])
            await resend_gets_the_end_again(client, "turn-1", end)
            # and a re-sent turn.start of the running turn is ignored, not TURN_BUSY
            await client.send({"type": "turn.start", "turnId": "turn-2", "text": "go"})
            request = await client.recv()
            await client.send({"type": "turn.start", "turnId": "turn-2", "text": "go"})
            await client.send({"type": "tool.result", "toolRequestId": request["toolRequestId"],
                               "result": 2, "handledBy": "named"})
            frame = await client.recv()
            assert frame["type"] == "turn.end" and frame["turnId"] == "turn-2", frame
            await client.close()

    run(main())


def test_an_ended_turn_is_remembered_across_a_restart_of_core(tmp_path: Path) -> None:
    async def main() -> None:
        cfg = config(store=str(tmp_path / "core.sqlite"),
                     agent_factory=lambda: PlanAgent([[("a", {})]]))
        core = await start_core(cfg)
        try:
            client = await RawClient.open(core.ws_url)
            hello = await client.hello([tool_meta("a")])
            end = await finished_turn(client, "turn-1")
            await client.close()
        finally:
            await core.stop()
        core = await start_core(cfg, core.port)
        try:
            client = await RawClient.open(core.ws_url)
            await client.hello([tool_meta("a")], sessionId=hello["sessionId"],
                               resumeToken=hello["resumeToken"])
            await resend_gets_the_end_again(client, "turn-1", end)
            await client.close()
        finally:
            await core.stop()

    run(main())


class HeldEnd:
    """The store's SQLite connection, holding the commit that stores a turn's end until
    the test releases it (a busy disk, as long as the test needs: no sleep to time)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db
        self.ending = False
        self.holding = threading.Event()
        self.release = threading.Event()

    def execute(self, sql: str, params: Any = ()) -> sqlite3.Cursor:
        if sql.startswith("INSERT OR REPLACE INTO turns") and params[3] != "running":
            self.ending = True
        if sql == "COMMIT" and self.ending:
            self.ending = False
            self.holding.set()
            self.release.wait(WAIT)  # the writer thread; a deadline all the same
        return self.db.execute(sql, params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.db, name)


def test_the_page_hears_of_a_turn_end_only_once_it_is_stored(tmp_path: Path) -> None:
    """Found by the harness: Core sent turn.end before the store had it. Killed in
    between, Core came back with the turn running and ran it again while the page had
    moved on, so the page's next turn.start was refused TURN_BUSY."""
    async def main() -> None:
        path = tmp_path / "core.sqlite"
        cfg = config(store=str(path), agent_factory=lambda: PlanAgent([[("a", {})]]))
        async with running_core(cfg) as core:
            store = core.registry.store
            held = HeldEnd(store._db)
            store._db = held
            client = await RawClient.open(core.ws_url)
            await client.hello([tool_meta("a")])
            await client.send({"type": "turn.start", "turnId": "turn-1", "text": "go"})
            request = await client.recv()
            await client.send({"type": "tool.result", "toolRequestId": request["toolRequestId"],
                               "result": 1, "handledBy": "named"})
            try:
                # the turn's end is being stored: re-sent now, the turn.start is ignored
                assert await asyncio.to_thread(held.holding.wait, WAIT)
                await client.send({"type": "turn.start", "turnId": "turn-1", "text": "go"})
                # frames are handled in order: this one's answer comes after the re-send
                # was handled, and before the end, which waits for the store
                await client.send({"type": "turn.cancel", "turnId": "turn-x"})
                refused = await client.recv()
                assert refused["type"] == "error" and refused["turnId"] == "turn-x", refused
            finally:
                held.release.set()
            end = await client.recv()
            assert end["type"] == "turn.end" and end["turnId"] == "turn-1", end
            with contextlib.closing(sqlite3.connect(path)) as reader:
                rows = reader.execute("SELECT status FROM turns WHERE id = 'turn-1'").fetchall()
            assert rows == [("completed",)]
            # what comes next is the next turn's, not a second run of the first
            await client.send({"type": "turn.start", "turnId": "turn-2", "text": "go"})
            following = await client.recv()
            assert following["type"] == "tool.request" and following["turnId"] == "turn-2"
            await client.close()

    run(main())
