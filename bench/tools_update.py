"""What a page's ``tools.update`` costs Redis (issue 22: "1 MiB frames → 736 MiB of Redis
writes in 10 s").

One Core on a redis-server of the bench's own (``--appendonly yes``), a page (this
process, speaking the wire protocol) whose session holds ``--history-bytes`` of the
agent's history; the page sends ``--frames`` tools.update frames of ``--tool-bytes`` of
tools each, the same tools every time or new ones every time, each taken by Core (it
answers a frame sent after it) and stored before the next. Prints the bytes Redis
received (``INFO stats`` ``total_net_input_bytes``) per frame, and how many a page
sending for ``--seconds`` as fast as Core takes them makes Redis receive (writes a later
one replaces in the same batch are not sent).

Run: ``.venv/bin/python bench/tools_update.py [--frames 40 --tool-bytes 1000000
--history-bytes 300000 --seconds 10]``
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# the test kits, as pytest finds them (pyproject.toml's pythonpath: tests/unit too)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "unit"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "core"))

from corekit import RawClient, config, running_core, tool_meta
from storekit import RedisServer

MIB = 1024 * 1024


class HistoryAgent:
    """Keeps each turn's text in the agent's history."""

    async def run(self, turn: Any) -> str:
        turn.history.append({"turn": turn.turn_id, "text": turn.text})
        return "noted"


def tools(n: int, size: int) -> list[dict[str, Any]]:
    return [dict(tool_meta("echo"), description=f"{n}:" + "d" * size)]


async def taken(page: RawClient) -> None:
    """Until Core took every frame the page sent before (it answers this one)."""
    await page.send({"type": "tool.result", "toolRequestId": "none",
                     "result": {"ok": True, "data": None}, "handledBy": "named"})
    while (await page.recv()).get("code") != "UNKNOWN_TOOL_REQUEST":
        pass


async def measure(server: RedisServer, frames: int, size: int, history: int,
                  seconds: float) -> None:
    def received() -> int:
        with server.client() as client:
            return int(client.info("stats")["total_net_input_bytes"])

    cfg = config(store=server.url, agent_factory=HistoryAgent, rate_limit=1e6,
                 rate_burst=1_000_000)
    async with running_core(cfg) as core:
        page = await RawClient.open(core.ws_url, max_size=None)
        sid = (await page.hello(tools(0, size)))["sessionId"]
        if history:
            turn = await core.turn(sid, "h" * history)
            assert turn.json()["status"] == "completed", turn.text
        version = 0
        for mode in ("same", "changed"):
            await core.registry.store.flush()
            before = received()
            for _ in range(frames):  # each one taken and stored before the next
                version += mode == "changed"
                await page.send({"type": "tools.update", "tools": tools(version, size)})
                await taken(page)
                await core.registry.store.flush()
            per_frame = (received() - before) / frames
            print(f"{mode:8} tools: {per_frame / 1000:9.1f} kB to Redis per tools.update "
                  f"({size / 1000:.0f} kB of tools, {history / 1000:.0f} kB of history)")
        for mode in ("same", "changed"):
            await core.registry.store.flush()
            before, sent = received(), 0
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                version += mode == "changed"
                await page.send({"type": "tools.update", "tools": tools(version, size)})
                sent += 1
                if sent % 10 == 0:
                    await taken(page)  # as fast as Core takes them, no faster
            await taken(page)
            await core.registry.store.flush()
            print(f"{mode:8} tools for {seconds:g} s: {sent} frames, "
                  f"{(received() - before) / MIB:.1f} MiB to Redis")
        await page.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=40)
    parser.add_argument("--tool-bytes", type=int, default=1_000_000)
    parser.add_argument("--history-bytes", type=int, default=300_000)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        server = RedisServer(Path(workdir))
        server.start()
        try:
            asyncio.run(measure(server, args.frames, args.tool_bytes, args.history_bytes,
                                args.seconds))
        finally:
            server.stop()


if __name__ == "__main__":
    main()
