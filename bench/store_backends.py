"""A control-API tool call through Core on each store: memory, SQLite, Redis.

Three Cores in one process and one event loop (each with a simulated page: a real
``pedelec_pyodide.Session`` behind a websockets client), the same call to each, variants
interleaved round by round; a real ``redis-server`` (Debian's; ``--appendonly yes
--appendfsync everysec --save ""``) on a free loopback port in a temporary directory.
Prints p50 and p99 of one call at a time, and calls/s with ``--concurrency`` callers at
once, each as a ratio to the memory store's.

Run: ``.venv/bin/python bench/store_backends.py [--rounds 10 --calls 100 --concurrency 8]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import redis
from core_roundtrip import TOKEN, EchoAgent, PageClient, RawHTTP, serve

from pedelec_pyodide.core.config import CoreConfig
from pedelec_pyodide.core.server import create_app

WAIT = 10.0


@contextlib.contextmanager
def redis_server(workdir: Path) -> Iterator[str]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is missing: ./scripts/setup.sh installs it")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir),
         "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
         "--logfile", str(workdir / "redis.log")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + WAIT
        while True:
            try:
                with redis.Redis(port=port, socket_timeout=WAIT) as client:
                    client.ping()
                break
            except redis.exceptions.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.terminate()
        process.wait(WAIT)


async def main(rounds: int, calls: int, concurrency: int) -> None:
    body = json.dumps({"tool": "update_counter", "args": {"delta": 2}}).encode()
    with tempfile.TemporaryDirectory() as tmp, redis_server(Path(tmp)) as redis_url:
        stores = {"memory": "memory", "sqlite": str(Path(tmp) / "core.sqlite"),
                  "redis": redis_url}
        async with contextlib.AsyncExitStack() as stack:
            callers: dict[str, list[Callable[[], Awaitable[None]]]] = {}
            for name, url in stores.items():
                cfg = CoreConfig(port=0, admin_token=TOKEN, web_dir=None,
                                 agent_factory=EchoAgent, store=url)
                port = await stack.enter_async_context(serve(create_app(cfg), cfg))
                page = PageClient()
                await page.connect(f"ws://127.0.0.1:{port}/pedelec/v1/bridge")
                stack.push_async_callback(page.ws.close)
                path = f"/pedelec/v1/sessions/{page.session.session_id}/tool-calls"
                clients = [RawHTTP(port, f"Authorization: Bearer {TOKEN}\r\n")
                           for _ in range(concurrency)]
                for client in clients:
                    stack.callback(client.close)

                def caller(client: RawHTTP, path: str = path) -> Callable[[], Awaitable[None]]:
                    async def call() -> None:
                        answer = json.loads(await client.request("POST", path, body))
                        assert answer["result"] == {"value": 3}, answer
                    return call

                callers[name] = [caller(client) for client in clients]
            latency: dict[str, list[float]] = {name: [] for name in stores}
            rate: dict[str, list[float]] = {name: [] for name in stores}
            for calls_of in callers.values():  # warm up
                for _ in range(50):
                    await calls_of[0]()
            for _ in range(rounds):
                for name, calls_of in callers.items():
                    for _ in range(calls):
                        started = time.perf_counter()
                        await calls_of[0]()
                        latency[name].append(time.perf_counter() - started)

                    async def many(call: Callable[[], Awaitable[None]]) -> None:
                        for _ in range(calls // concurrency):
                            await call()

                    started = time.perf_counter()
                    await asyncio.gather(*(many(call) for call in calls_of))
                    elapsed = time.perf_counter() - started
                    rate[name].append(concurrency * (calls // concurrency) / elapsed)

    base_p50 = statistics.median(latency["memory"])
    base_rate = statistics.median(rate["memory"])
    print(f"{rounds} rounds x {calls} calls; calls/s with {concurrency} callers at once")
    print(f"{'store':8} {'p50 ms':>8} {'p99 ms':>8} {'p50 x':>7} {'calls/s':>9} {'x':>6}")
    for name in stores:
        ordered = sorted(latency[name])
        p50 = statistics.median(ordered)
        p99 = ordered[int(0.99 * (len(ordered) - 1))]
        per_second = statistics.median(rate[name])
        print(f"{name:8} {p50 * 1000:8.3f} {p99 * 1000:8.3f} {p50 / base_p50:7.2f} "
              f"{per_second:9.0f} {per_second / base_rate:6.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    asyncio.run(main(args.rounds, args.calls, args.concurrency))
