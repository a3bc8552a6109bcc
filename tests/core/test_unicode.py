"""Text is valid Unicode everywhere (issue 10, class 1), and error messages quote at most a
short excerpt of a bad value (class 3).

JSON that decodes to a lone surrogate is refused where it enters Core, naming the field:
a ``/call`` line, a control-API body, MCP args, an agent's tool call or reply, a page's
frame. No frame, store row or log line is built from it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from corekit import WAIT, Page

from pedelec_pyodide import Session, define_tool
from pedelec_pyodide.session import TurnError

SURROGATE_CALL = '/call update_counter {"delta": "\\ud800"}'


def counter_session() -> tuple[Session, dict[str, int]]:
    counter = {"value": 0, "runs": 0}

    def update_counter(args: Any) -> Any:
        counter["runs"] += 1
        counter["value"] += args["delta"]
        return {"value": counter["value"]}

    session = Session()
    session.add_tool(define_tool(
        name="update_counter", description="Change the counter by delta.",
        args_schema={"type": "object", "properties": {"delta": {"type": "integer"}},
                     "required": ["delta"]},
        handler=update_counter))
    return session, counter


def serve(*args: str) -> tuple[subprocess.Popen[str], str, str]:
    """``pedelec serve`` as a user runs it; its URL and admin token."""
    env = dict(os.environ)
    env.pop("PEDELEC_ADMIN_TOKEN", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "pedelec_pyodide.core.cli", "serve", *args, "--port", "0",
         "--no-provision", "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert process.stdout is not None
    url = process.stdout.readline().split(": ", 1)[1].strip()
    token = process.stdout.readline().rsplit(" ", 1)[1].strip()
    return process, url, token


def stop(process: subprocess.Popen[str]) -> tuple[int, float]:
    """SIGTERM; the exit code and the seconds it took (killed after 15 s)."""
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    try:
        code = process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=15)
        code = -9
    return code, time.monotonic() - started


def test_a_call_line_with_a_lone_surrogate_is_refused_and_core_keeps_serving(
        tmp_path: Path) -> None:
    """The issue's scenario: with --store PATH.sqlite, the line used to kill the store's
    writer, hang every session's tool calls and make SIGTERM powerless."""
    process, url, token = serve("--agent", "offline", "--store", str(tmp_path / "core.sqlite"))
    try:
        async def main() -> None:
            ws_url = url.replace("http", "ws", 1) + "pedelec/v1/bridge"
            first, first_counter = counter_session()
            page = await Page(first).connect(ws_url)
            try:
                reply = await asyncio.wait_for(first.send_text(SURROGATE_CALL), WAIT)
            except TurnError as exc:  # a failed turn is a clear end too
                reply = f"{exc.code}: {exc}"
            assert "lone surrogate" in reply and "$.delta" in reply, reply
            assert first_counter["runs"] == 0
            assert page.frames("tool.request") == []
            # the same page goes on working
            assert "update_counter" in await asyncio.wait_for(
                first.send_text('/call update_counter {"delta": 2}'), WAIT)
            assert first_counter["value"] == 2
            # and another session's tool call
            second, second_counter = counter_session()
            await Page(second).connect(ws_url)
            assert second.session_id is not None
            async with httpx.AsyncClient(
                    base_url=url, timeout=WAIT,
                    headers={"Authorization": f"Bearer {token}"}) as http:
                answer = await http.post(
                    f"pedelec/v1/sessions/{second.session_id}/tool-calls",
                    json={"tool": "update_counter", "args": {"delta": 5}})
            assert answer.status_code == 200, answer.text
            assert answer.json()["result"] == {"value": 5}
            assert second_counter["runs"] == 1

        asyncio.run(asyncio.wait_for(main(), 60))
    finally:
        code, seconds = stop(process)
    assert code == 0 and seconds < 5, (code, seconds)
    assert process.stderr is not None
    assert "Traceback" not in process.stderr.read()
