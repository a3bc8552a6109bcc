"""A tool call that crosses Core nodes vs one that does not (issue 13), one run.

Three Core nodes (``pedelec serve``-equivalent processes, tests/core/core_process.py) on
one redis-server of the bench's own, on loopback ports. A page (this process, speaking
the wire protocol) is connected to node 1 and answers every ``tool.request`` at once.
Calls go, one at a time and interleaved, to node 1 (local: the page's socket is there)
and to node 2 (crossing: forwarded to node 1 through Redis pub/sub and back). Prints p50
and p99 of each and their ratio (goal: crossing at most 1.5x local at p50).

Interleaved with those, the same two calls on two nodes of ``bench/bare_core.py`` on the
same Redis (a page of their own on bare node 1): a relay through Redis with none of
Core's work, whose crossing against its local call is what a crossing costs any Python
node that relays through Redis pub/sub.

Run: ``.venv/bin/python bench/cluster_route.py [--calls N]``
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

import httpx
from clusterkit import Node, answer_requests
from corekit import TOKEN, RawClient, tool_meta
from simpages import server_process
from storekit import RedisServer


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main(calls: int) -> None:
    with tempfile.TemporaryDirectory() as workdir:
        redis = RedisServer(Path(workdir))
        redis.start()
        nodes = [Node(redis.url, Path(workdir)) for _ in range(3)]
        bare = [[sys.executable, str(Path(__file__).resolve().parent / "bare_core.py"),
                 "--redis", redis.url]] * 2
        try:
            with contextlib.ExitStack() as stack:
                bare_ports = [stack.enter_context(server_process(command))[1]
                              for command in bare]
                await asyncio.gather(*(node.start() for node in nodes))
                times = await measure(calls, [node.port for node in nodes[:2]], bare_ports)
        finally:
            for node in nodes:
                await node.kill()
            redis.stop()
    print(f"calls: {calls} each, interleaved; 3 nodes, the page on node 1; "
          "2 bare nodes, their page on bare node 1")
    report(times, "local", "crossing")
    report(times, "bare local", "bare crossing")
    report(times, "bare crossing", "crossing")


async def measure(calls: int, ports: list[int], bare_ports: list[int]
                  ) -> dict[str, list[float]]:
    """Each kind of call's times (ms): to the page's node and to the other, on Core's
    nodes (``ports``) and on the bare ones."""
    pages: list[tuple[RawClient, asyncio.Future[None]]] = []
    sessions: list[str] = []
    ran: list[list[str]] = []
    for port in ports[0], bare_ports[0]:
        page = await RawClient.open(f"ws://127.0.0.1:{port}/pedelec/v1/bridge")
        sessions.append((await page.hello([tool_meta("a")]))["sessionId"])
        ran.append([])
        pages.append((page, asyncio.ensure_future(answer_requests(page, ran[-1]))))
    targets = {name: (httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}",
                                        headers={"Authorization": f"Bearer {TOKEN}"},
                                        timeout=30), sessions[name.startswith("bare")])
               for name, port in zip(("local", "crossing", "bare local", "bare crossing"),
                                     [*ports, *bare_ports], strict=True)}
    times: dict[str, list[float]] = {name: [] for name in targets}
    for n in range(calls + 20):  # the first 20 of each warm up
        for name, (client, sid) in targets.items():
            started = time.perf_counter()
            response = await client.post(f"/pedelec/v1/sessions/{sid}/tool-calls",
                                         json={"tool": "a", "args": {"n": n}})
            elapsed = time.perf_counter() - started
            assert response.json()["result"]["ok"], response.text
            if n >= 20:
                times[name].append(elapsed * 1000)
    assert all(len(ids) == len(set(ids)) == 2 * (calls + 20) for ids in ran)
    for client, _ in targets.values():
        await client.aclose()
    for page, handler in pages:
        handler.cancel()
        await page.close()
    return times


def report(times: dict[str, list[float]], base: str, other: str) -> None:
    """p50 and p99 of each kind of call (ms), and ``other``'s against ``base``'s."""
    print(f"{'':14} {'p50 ms':>8} {'p99 ms':>8}")
    for name in base, other:
        values = times[name]
        print(f"{name:14} {statistics.median(values):8.2f} {quantile(values, 0.99):8.2f}")
    ratio50 = statistics.median(times[other]) / statistics.median(times[base])
    ratio99 = quantile(times[other], 0.99) / quantile(times[base], 0.99)
    print(f"{other}/{base}: p50 {ratio50:.2f}x, p99 {ratio99:.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main(parser.parse_args().calls))
