"""An MCP tool call relayed to another Core node vs one that is not (issue 13), one run.

Two Core nodes (``pedelec serve``-equivalent processes, tests/core/core_process.py) on
one redis-server of the bench's own, on loopback ports. A page (this process, speaking
the wire protocol) is connected to node 1 and answers every ``tool.request`` at once.
Two MCP clients (the official SDK, streamable HTTP), one session on node 1 (local: the
page's socket is there) and one on node 2 (relayed: the call goes to node 1 through
Redis pub/sub, its result back), call a tool one at a time, interleaved. Prints p50 and
p99 of each and their ratio (goal: relayed at most 1.5x local at p50).

Run: ``.venv/bin/python bench/mcp_route.py [--calls N] [--era handshake|2026-07-28]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from pathlib import Path

# the test kits, as pytest finds them (pyproject.toml's pythonpath: tests/unit too)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "unit"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "core"))

from cluster_route import report
from clusterkit import Node, answer_requests
from corekit import RawClient, tool_meta
from mcpkit import mcp_at, mcp_client, modern_client
from storekit import RedisServer

WARM_UP = 20


async def main(calls: int, era: str) -> None:
    client_of = mcp_client if era == "handshake" else modern_client
    with tempfile.TemporaryDirectory() as workdir:
        redis = RedisServer(Path(workdir))
        redis.start()
        nodes = [Node(redis.url, Path(workdir)) for _ in range(2)]
        try:
            await asyncio.gather(*(node.start() for node in nodes))
            page = await RawClient.open(f"ws://127.0.0.1:{nodes[0].port}/pedelec/v1/bridge")
            sid = (await page.hello([tool_meta("a")]))["sessionId"]
            ran: list[str] = []
            handlers = asyncio.ensure_future(answer_requests(page, ran))
            times: dict[str, list[float]] = {"local": [], "relayed": []}
            try:
                async with client_of(mcp_at(nodes[0].port, sid)) as local, \
                        client_of(mcp_at(nodes[1].port, sid)) as relayed:
                    for n in range(calls + WARM_UP):  # the first WARM_UP of each warm up
                        for name, client in (("local", local), ("relayed", relayed)):
                            started = time.perf_counter()
                            answer = await client.call_tool("a", {"n": n})
                            elapsed = time.perf_counter() - started
                            assert answer.structured_content == {
                                "ok": True, "data": {"n": n}}, answer
                            if n >= WARM_UP:
                                times[name].append(elapsed * 1000)
            finally:
                handlers.cancel()
                await page.close()
            assert len(ran) == len(set(ran)) == 2 * (calls + WARM_UP)
        finally:
            for node in nodes:
                await node.kill()
            redis.stop()
    print(f"calls: {calls} each, interleaved; MCP ({era}); 2 nodes, the page on node 1")
    report(times, "local", "relayed")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--era", choices=["handshake", "2026-07-28"], default="handshake")
    arguments = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main(arguments.calls, arguments.era))
