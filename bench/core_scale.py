"""1,000 simulated pages on one Core: memory per idle session, tool calls/s, p99 latency.

Core runs as ``pedelec serve`` in a process of its own (so its memory is its own); this
process opens the pages (websockets clients that say hello with two tools and answer
every ``tool.request`` at once) and drives tool calls through the control API with a
few concurrent raw HTTP/1.1 keep-alive connections, spread over all the sessions.

* memory per idle session = (Core's RSS with N sessions - its RSS with 1) / (N - 1);
* throughput: calls/s across the sessions, and p50/p99 latency of a call.

Run: ``.venv/bin/python bench/core_scale.py [--pages 1000 --calls 5000 --concurrency 32]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

import websockets

TOKEN = "bench-scale"
TOOLS = [
    {"name": "get_current_page", "description": "title and URL",
     "argsSchema": {"type": "object", "properties": {}}},
    {"name": "update_counter", "description": "adds delta to the counter",
     "argsSchema": {"type": "object", "properties": {"delta": {"type": "integer"}},
                    "required": ["delta"]}},
]


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


class SimPage:
    """A page that answers every tool request at once with a tiny result."""

    def __init__(self) -> None:
        self.ws: Any = None
        self.session_id = ""
        self.task: asyncio.Task[None] | None = None

    async def open(self, url: str) -> None:
        self.ws = await websockets.connect(url, max_queue=4)
        await self.ws.send(json.dumps({"type": "hello", "protocol": 1, "tools": TOOLS}))
        self.session_id = json.loads(await self.ws.recv())["sessionId"]
        self.task = asyncio.create_task(self._answer())

    async def _answer(self) -> None:
        with contextlib.suppress(websockets.ConnectionClosed):
            async for frame in self.ws:
                request = json.loads(frame)
                if request["type"] == "tool.request":
                    await self.ws.send(json.dumps({
                        "type": "tool.result", "toolRequestId": request["toolRequestId"],
                        "result": {"value": 1}, "handledBy": "named"}))


async def http_worker(port: int, jobs: asyncio.Queue[str], latencies: list[float]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = json.dumps({"tool": "update_counter", "args": {"delta": 1}}).encode()
    try:
        while True:
            try:
                session_id = jobs.get_nowait()
            except asyncio.QueueEmpty:
                return
            started = time.perf_counter()
            writer.write(
                f"POST /pedelec/v1/sessions/{session_id}/tool-calls HTTP/1.1\r\n"
                f"Host: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                .encode() + body)
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:"))
            answer = json.loads(await reader.readexactly(length))
            assert answer["result"] == {"value": 1}, answer
            latencies.append(time.perf_counter() - started)
    finally:
        writer.close()


async def main(pages: int, calls: int, concurrency: int) -> None:
    env = dict(os.environ, PEDELEC_ADMIN_TOKEN=TOKEN)
    core = subprocess.Popen(
        [sys.executable, "-m", "pedelec_pyodide.core.cli", "serve", "--port", "0",
         "--no-provision", "--quiet"], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert core.stdout is not None
        url = core.stdout.readline().split(": ", 1)[1].strip()
        port = int(url.rstrip("/").rsplit(":", 1)[1])
        ws_url = f"ws://127.0.0.1:{port}/pedelec/v1/bridge"
        first = SimPage()
        await first.open(ws_url)
        await asyncio.sleep(0.5)  # let Core settle before the baseline reading
        base_rss = rss_kib(core.pid)
        sims = [first]
        started = time.perf_counter()
        for batch in range(0, pages - 1, 100):
            group = [SimPage() for _ in range(min(100, pages - 1 - batch))]
            await asyncio.gather(*(page.open(ws_url) for page in group))
            sims.extend(group)
        connect_s = time.perf_counter() - started
        await asyncio.sleep(0.5)
        full_rss = rss_kib(core.pid)
        per_session = (full_rss - base_rss) * 1024 / (pages - 1)

        jobs: asyncio.Queue[str] = asyncio.Queue()
        for _ in range(calls):
            jobs.put_nowait(random.choice(sims).session_id)
        latencies: list[float] = []
        started = time.perf_counter()
        await asyncio.gather(*(http_worker(port, jobs, latencies) for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
        latencies.sort()
        p50 = statistics.median(latencies)
        p99 = latencies[int(len(latencies) * 0.99) - 1]
        print(f"{pages} pages connected in {connect_s:.1f}s; Core RSS {base_rss / 1024:.1f} MiB "
              f"-> {full_rss / 1024:.1f} MiB")
        print(f"memory per idle session: {per_session / 1024:.1f} KiB (target <= 50 KB)")
        print(f"{calls} tool calls, {concurrency} concurrent, spread over {pages} sessions: "
              f"{calls / elapsed:.0f} calls/s; p50 {p50 * 1000:.2f} ms, p99 {p99 * 1000:.2f} ms "
              f"(p99/p50 {p99 / p50:.1f}x)")
        for page in sims:
            await page.ws.close()
    finally:
        core.terminate()
        core.wait(timeout=30)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=1000)
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=32)
    options = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    asyncio.run(main(options.pages, options.calls, options.concurrency))
