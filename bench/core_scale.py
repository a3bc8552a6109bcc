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
import random
import resource
import statistics
import time

from simpages import core_process, open_pages, post_tool_call, rss_kib

TOKEN = "bench-scale"


async def http_worker(port: int, jobs: asyncio.Queue[str], latencies: list[float]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        while True:
            try:
                session_id = jobs.get_nowait()
            except asyncio.QueueEmpty:
                return
            started = time.perf_counter()
            status, answer = await post_tool_call(reader, writer, TOKEN, session_id,
                                                  "update_counter", {"delta": 1})
            assert status == 200 and answer["result"] == {"echo": {"delta": 1}}, answer
            latencies.append(time.perf_counter() - started)
    finally:
        writer.close()


async def main(pages: int, calls: int, concurrency: int) -> None:
    # every simulated page comes from this one process's address: one client to Core
    with core_process(TOKEN, "--max-sessions", str(max(pages, 256)),
                      "--max-sessions-per-client", str(max(pages, 32))) as (core, port):
        ws_url = f"ws://127.0.0.1:{port}/pedelec/v1/bridge"
        sims = await open_pages(ws_url, 1)
        await asyncio.sleep(0.5)  # let Core settle before the baseline reading
        base_rss = rss_kib(core.pid)
        started = time.perf_counter()
        sims += await open_pages(ws_url, pages - 1)
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
            await page.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=1000)
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=32)
    options = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    asyncio.run(main(options.pages, options.calls, options.concurrency))
