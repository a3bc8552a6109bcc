"""Several Core nodes (processes of their own) on one redis-server, behind Debian's
HAProxy running ``deploy/haproxy.cfg``: everything on loopback ports, stopped by the test."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
from corekit import TOKEN, WAIT
from storekit import free_port

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
