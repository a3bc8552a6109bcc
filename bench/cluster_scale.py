"""Calls/s with 1, 2 and 3 Core nodes on one Redis behind HAProxy (issue 13), one run.

For each node count, in rounds (1, 2, 3 nodes, again...): a redis-server of the bench's
own, that many Core processes (tests/core/core_process.py) and HAProxy with
``deploy/haproxy.cfg`` (round robin, no sticky sessions), all on loopback ports. Pages
(this process, speaking the wire protocol, answering every ``tool.request`` at once)
connect through HAProxy, so they spread over the nodes; ``--concurrency`` callers post
tool calls through HAProxy, spread over the pages, so most calls arrive at a node that
does not hold their page and cross. Prints calls/s and p50 per node count, and each as a
ratio to the 1-node run of the same round.

Run: ``.venv/bin/python bench/cluster_scale.py [--rounds 2 --pages 12 --calls 600
--concurrency 16]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

# the test kits, as pytest finds them (pyproject.toml's pythonpath: tests/unit too)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "unit"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "core"))

from clusterkit import answer_requests, cluster
from corekit import RawClient, tool_meta
from storekit import RedisServer

NODE_COUNTS = (1, 2, 3)


async def measure(redis_url: str, count: int, pages: int, calls: int, concurrency: int
                  ) -> tuple[float, float]:
    """calls/s and p50 ms with ``count`` nodes."""
    with tempfile.TemporaryDirectory() as workdir:
        async with cluster(redis_url, count, Path(workdir)) as made:
            clients = [await RawClient.open(made.ws_url) for _ in range(pages)]
            sids = [(await page.hello([tool_meta("a")]))["sessionId"] for page in clients]
            ran: list[str] = []
            handlers = [asyncio.ensure_future(answer_requests(page, ran)) for page in clients]
            times: list[float] = []
            todo = iter(range(calls + 10 * concurrency))  # the first 10 per caller warm up

            async def caller() -> None:
                for n in todo:
                    started = time.perf_counter()
                    response = await made.http.post(
                        f"/pedelec/v1/sessions/{sids[n % pages]}/tool-calls",
                        json={"tool": "a", "args": {"n": n}})
                    assert response.json()["result"]["ok"], response.text
                    if n >= 10 * concurrency:
                        times.append(time.perf_counter() - started)

            await asyncio.gather(*(caller() for _ in range(concurrency)))  # warm-up too
            began = time.perf_counter()
            todo = iter(range(10 * concurrency, calls + 10 * concurrency))
            times.clear()
            await asyncio.gather(*(caller() for _ in range(concurrency)))
            elapsed = time.perf_counter() - began
            assert len(ran) == len(set(ran))
            for task in handlers:
                task.cancel()
            for page in clients:
                await page.close()
    return len(times) / elapsed, statistics.median(times) * 1000


async def main(rounds: int, pages: int, calls: int, concurrency: int) -> None:
    with tempfile.TemporaryDirectory() as workdir:
        redis = RedisServer(Path(workdir))
        redis.start()
        try:
            results: dict[int, list[tuple[float, float]]] = {n: [] for n in NODE_COUNTS}
            for _ in range(rounds):
                for count in NODE_COUNTS:
                    results[count].append(await measure(redis.url, count, pages, calls,
                                                        concurrency))
        finally:
            redis.stop()
    print(f"{pages} pages, {calls} calls, {concurrency} callers at once, through HAProxy")
    print(f"{'nodes':6} {'calls/s per round':>24} {'x 1 node':>24} {'p50 ms':>24}")
    for count in NODE_COUNTS:
        rates = [rate for rate, _ in results[count]]
        ratios = [rate / base for (rate, _), (base, _) in zip(results[count], results[1],
                                                               strict=True)]
        print(f"{count:<6} {' / '.join(f'{r:.0f}' for r in rates):>24} "
              f"{' / '.join(f'{r:.2f}' for r in ratios):>24} "
              f"{' / '.join(f'{p:.1f}' for _, p in results[count]):>24}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--pages", type=int, default=12)
    parser.add_argument("--calls", type=int, default=600)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main(args.rounds, args.pages, args.calls, args.concurrency))
