"""Several Core nodes (processes of their own) on one redis-server, behind Debian's
HAProxy running ``deploy/haproxy.cfg``: everything on loopback ports, stopped by the test;
and what the cluster tests share: two nodes on one Redis with the page on one
(``page_on_a``), a page answering its tool requests (``answer_requests``, ``answer``)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import websockets
from clockkit import FakeClock
from corekit import TOKEN, WAIT, Core, RawClient, config, next_of, running_core, tool_meta, until
from mcpkit import mcp_at, modern_client
from storekit import RedisServer, free_port

HERE = Path(__file__).parent
CONFIG = HERE.parent.parent / "deploy" / "haproxy.cfg"


def haproxy_config(bind: str, nodes: list[int]) -> str:
    """``deploy/haproxy.cfg`` for HAProxy on ``bind`` in front of Core nodes on ``nodes``."""
    servers = "\n".join(f"    server node{n} 127.0.0.1:{port} check"
                        for n, port in enumerate(nodes, 1))
    return CONFIG.read_text().replace("{{BIND}}", bind).replace("{{SERVERS}}", servers)


class Node:
    """``python core_process.py REDIS PORT [PYODIDE]``: killed and started again on its
    port; with ``pyodide`` (a provisioned runtime) it serves the demo too. Its log lines
    go to ``workdir/node-PORT.log`` (every start's, one after another)."""

    def __init__(self, store: str, workdir: Path, pyodide: Path | None = None) -> None:
        self.store = store
        self.port = free_port()
        self.pyodide = pyodide
        self.log = workdir / f"node-{self.port}.log"
        self.process: subprocess.Popen[str] | None = None

    async def start(self) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), *sys.path]))
        demo = [] if self.pyodide is None else [str(self.pyodide)]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, str(HERE / "core_process.py"), self.store, str(self.port),
                 *demo], stdout=subprocess.PIPE, stderr=log, text=True, env=env)
        assert self.process.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(self.process.stdout.readline), WAIT)
        assert line.startswith("http://127.0.0.1:"), line

    async def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            await asyncio.to_thread(self.process.wait, WAIT)


class Cluster:
    def __init__(self, nodes: list[Node], port: int) -> None:
        self.nodes = nodes
        self.port = port
        self.http = httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=WAIT,
                                      headers={"Authorization": f"Bearer {TOKEN}"})

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/pedelec/v1/bridge"

    async def up(self) -> None:
        """Until HAProxy answers, through each node in turn (round robin), 200 in a row."""
        ok = 0
        for _ in range(int(WAIT / 0.1)):
            try:
                response = await self.http.get("/pedelec/v1/health")
                ok = ok + 1 if response.status_code == 200 else 0
            except httpx.HTTPError:
                ok = 0
            if ok >= 2 * len(self.nodes):
                return
            await asyncio.sleep(0.1)
        raise AssertionError("HAProxy did not answer through every node")


@contextlib.asynccontextmanager
async def cluster(store: str, count: int, workdir: Path, pyodide: Path | None = None
                  ) -> AsyncIterator[Cluster]:
    """``count`` Core nodes on ``store`` behind HAProxy, all stopped at the end; with
    ``pyodide``, each serving the demo on that runtime."""
    binary = shutil.which("haproxy") or "/usr/sbin/haproxy"
    if not os.path.exists(binary):
        raise RuntimeError("haproxy is missing: ./scripts/setup.sh installs it")
    nodes = [Node(store, workdir, pyodide) for _ in range(count)]
    port = free_port()
    config = workdir / "haproxy.cfg"
    config.write_text(haproxy_config(f"127.0.0.1:{port}", [node.port for node in nodes]))
    proxy: subprocess.Popen[bytes] | None = None
    made = Cluster(nodes, port)
    try:
        await asyncio.gather(*(node.start() for node in nodes))
        with open(workdir / "haproxy.log", "wb") as log:
            proxy = subprocess.Popen([binary, "-db", "-f", str(config)],
                                     stdout=log, stderr=subprocess.STDOUT)
        await made.up()
        yield made
    finally:
        await made.http.aclose()
        if proxy is not None:
            proxy.kill()
            await asyncio.to_thread(proxy.wait, WAIT)
        for node in nodes:
            await node.kill()


async def answer_requests(page: RawClient, ran: list[str]) -> None:
    """The page's handlers: each tool.request answered with its args (ids in ``ran``)."""
    while True:
        frame = await page.recv()
        if frame["type"] == "tool.request":
            ran.append(frame["toolRequestId"])
            await page.send({"type": "tool.result", "toolRequestId": frame["toolRequestId"],
                             "result": {"ok": True, "data": frame["args"]},
                             "handledBy": "named"})


async def answer(page: RawClient, frame: dict[str, Any]) -> None:
    await page.send({"type": "tool.result", "toolRequestId": frame["toolRequestId"],
                     "result": {"ok": True, "data": frame["args"]}, "handledBy": "named"})


async def request_on_open_page(page: RawClient) -> dict[str, Any]:
    """The page's next ``tool.request``; an AssertionError naming the close code if Core
    closed the page's socket instead."""
    try:
        return await next_of(page, "tool.request")
    except websockets.ConnectionClosed as exc:
        code = exc.rcvd.code if exc.rcvd is not None else None
        raise AssertionError(f"the page was closed ({code})") from None


def subscribers(redis_server: RedisServer, core: Core) -> int:
    """How many of Redis's clients listen to ``core``'s inbox."""
    with contextlib.closing(redis_server.client()) as client:
        [(_, count)] = client.pubsub_numsub(
            f"{core.registry.store.prefix}node:{core.registry.node}")
        return int(count)


def pubsub_clients(redis_server: RedisServer) -> set[int]:
    """The ids of Redis's clients that are subscribed to something (the nodes' inboxes)."""
    with contextlib.closing(redis_server.client()) as client:
        return {int(entry["id"]) for entry in client.client_list(_type="pubsub")}


@dataclass
class PageOnA:
    """Two nodes on one Redis, the page's session on A, a caller at B."""

    a: Core
    b: Core
    page: RawClient
    sid: str
    of_a: set[int]  # A's clients subscribed in Redis (its inbox)
    call: Callable[[], Awaitable[Any]]  # B's call of ``a`` with {"n": 1}: its result


@contextlib.asynccontextmanager
async def page_on_a(redis_server: RedisServer, kind: str, key: str | None = None,
                    clock: FakeClock | None = None, **a_config: Any) -> AsyncIterator[PageOnA]:
    """``kind``: B's call is a control-API call (``key``: with that Idempotency-Key),
    or an MCP call; ``clock``: both nodes' (else the system's)."""
    cfg: dict[str, Any] = {"store": redis_server.url}
    if clock is not None:
        cfg["clock"] = clock
    async with running_core(config(**cfg, **a_config)) as a, \
            contextlib.AsyncExitStack() as stack:
        await until(lambda: subscribers(redis_server, a) == 1, "A's inbox subscribed")
        of_a = pubsub_clients(redis_server)
        b = await stack.enter_async_context(running_core(config(**cfg)))
        await until(lambda: subscribers(redis_server, b) == 1, "B's inbox subscribed")
        page = await RawClient.open(a.ws_url)
        stack.push_async_callback(page.close)
        sid = (await page.hello([tool_meta("a")]))["sessionId"]
        await until(lambda: sid in a.registry.sessions)
        if kind == "mcp":
            client = await stack.enter_async_context(modern_client(mcp_at(b.port, sid)))
            await client.list_tools()

        async def call() -> Any:
            if kind == "control":
                response = await b.http.post(
                    f"/pedelec/v1/sessions/{sid}/tool-calls",
                    json={"tool": "a", "args": {"n": 1}},
                    headers={} if key is None else {"Idempotency-Key": key})
                assert response.status_code == 200, response.text
                return response.json()["result"]
            answer = await client.call_tool("a", {"n": 1})
            return answer.structured_content

        yield PageOnA(a, b, page, sid, of_a, call)
