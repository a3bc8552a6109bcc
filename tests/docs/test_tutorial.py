"""docs/tutorial.md runs as written.

The tutorial marks its runnable code blocks with an HTML comment just before the fence:

- ``<!-- tutorial: file PATH -->``: the block is the file PATH of the reader's project;
- ``<!-- tutorial: run -->``: shell commands, run with bash in the project (variables carry
  over to the next ``run`` block, as in one terminal); they must succeed;
- ``<!-- tutorial: output -->``: what the previous ``run`` block printed (``...`` matches
  anything);
- ``<!-- tutorial: background URL -->``: a server, started in the background until URL
  answers.

This test runs them in order in a temporary project whose ``.venv`` is this checkout's, with
the tutorial's ports (8765, 3000) replaced by free ones: the pytest step, Core
(``pedelec serve --allow-origin``), the static server and every ``curl``. The page itself
needs a browser: here a real ``Session`` with the tutorial's ``tools.py`` stands in for it
(its DOM a small stand-in), connecting from the app's origin as the loader would. The real
page in Chromium: tests/e2e/tutorial.spec.js.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType, SimpleNamespace

import httpx
import pytest
import websockets

from pedelec_pyodide import Session

REPO = Path(__file__).resolve().parents[2]
TUTORIAL = REPO / "docs" / "tutorial.md"
CORE_PORT, APP_PORT = "8765", "3000"  # as the tutorial writes them
WAIT = 30.0  # seconds: the bound on any one step
PROVISION_WAIT = 240.0  # seconds: Core provisioning the Pyodide runtime (maybe downloading)
STEP = re.compile(r"<!-- tutorial: (file|run|output|background)\s*(\S*) -->\n"
                  r"```[^\n]*\n(.*?)\n```", re.S)


@dataclass
class Step:
    kind: str
    arg: str
    text: str


def steps(core_port: int, app_port: int) -> list[Step]:
    text = TUTORIAL.read_text(encoding="utf-8")
    found = []
    for kind, arg, body in STEP.findall(text):
        def ports(s: str) -> str:
            s = re.sub(rf"\b{CORE_PORT}\b", str(core_port), s)
            return re.sub(rf"\b{APP_PORT}\b", str(app_port), s)
        found.append(Step(kind, ports(arg), ports(body)))
    return found


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def matches(expected: str, actual: str) -> bool:
    """``expected`` with ``...`` for any text, against ``actual`` (ends trimmed)."""
    pattern = ".*?".join(re.escape(part) for part in expected.strip().split("..."))
    return re.fullmatch(pattern, actual.strip(), re.S) is not None


class Element:
    """The few DOM calls the tutorial's render() makes."""

    def __init__(self) -> None:
        self.children: list[Element] = []
        self.textContent = ""

    def replaceChildren(self) -> None:  # the DOM's names
        self.children = []

    def appendChild(self, child: Element) -> None:
        self.children.append(child)


class Page:
    """The tutorial's page without a browser: its tools in a real Session, connected to
    Core's bridge from the app's origin."""

    def __init__(self, tools: ModuleType, core: str, origin: str) -> None:
        self.session = Session()
        tools.register(self.session)
        self.core, self.origin = core, origin
        self.welcome = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []

    async def check_origin(self) -> None:
        async with httpx.AsyncClient(timeout=WAIT) as http:
            answer = await http.get(f"{self.core}/pedelec/v1/origin-check",
                                    headers={"Origin": self.origin})
        assert answer.json() == {"allowed": True}, answer.text

    @contextlib.asynccontextmanager
    async def connected(self) -> AsyncIterator[Page]:
        await self.check_origin()
        ws_url = self.core.replace("http://", "ws://") + "/pedelec/v1/bridge"
        async with websockets.connect(ws_url, open_timeout=WAIT,
                                      additional_headers={"Origin": self.origin}) as ws:
            outbox: asyncio.Queue[str] = asyncio.Queue()

            async def write() -> None:
                while True:
                    await ws.send(await outbox.get())

            async def read() -> None:
                with contextlib.suppress(websockets.ConnectionClosed):
                    async for frame in ws:
                        self.session.receive(str(frame))
                        if json.loads(frame)["type"] == "welcome":
                            self.welcome.set()

            self.tasks = [asyncio.create_task(write()), asyncio.create_task(read())]
            self.session.connection_made(SimpleNamespace(send=outbox.put_nowait))
            await asyncio.wait_for(self.welcome.wait(), WAIT)
            try:
                yield self
            finally:
                for task in self.tasks:
                    task.cancel()


def load_tools(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("tutorial_tools", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def run_shell(script: str, cwd: Path, env: dict[str, str]) -> tuple[str, dict[str, str]]:
    """Run ``script`` as one terminal would; returns its output and the variables it left."""
    dump = cwd / ".tutorial-env"
    process = await asyncio.create_subprocess_exec(
        "bash", "-c", f'set -euo pipefail -a\n{script}\nenv -0 > "{dump}"',
        cwd=cwd, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(process.communicate(), WAIT * 4)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise AssertionError(f"this tutorial step did not finish:\n{script}") from None
    assert process.returncode == 0, (
        f"this tutorial step failed ({process.returncode}):\n{script}\n"
        f"stdout: {out.decode()[-2000:]}\nstderr: {err.decode()[-2000:]}")
    left = dict(item.split("=", 1) for item in dump.read_text().split("\0") if "=" in item)
    return out.decode(), left


async def wait_until_answers(url: str, process: subprocess.Popen[bytes]) -> None:
    async with httpx.AsyncClient(timeout=2.0) as http:
        for _ in range(int(WAIT / 0.2)):
            assert process.poll() is None, f"the server for {url} exited ({process.returncode})"
            with contextlib.suppress(httpx.HTTPError):
                if (await http.get(url)).status_code == 200:
                    return
            await asyncio.sleep(0.2)
    raise AssertionError(f"{url} did not answer within {WAIT} s")


async def runtime_ready(core: str) -> None:
    """As the tutorial says, Core's health turns ``"ready": true`` once it has provisioned the
    runtime pages load (from the cache: seconds; a first download: longer). Waiting for it
    also means Core is never stopped in the middle of writing the cache."""
    async with httpx.AsyncClient(timeout=5.0) as http:
        for _ in range(int(PROVISION_WAIT / 0.5)):
            health = (await http.get(f"{core}/pedelec/v1/health")).json()
            if health.get("ready") or health.get("pyodide") == "error":
                break
            await asyncio.sleep(0.5)
    assert health.get("ready") is True, health


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


@pytest.mark.skipif(shutil.which("curl") is None, reason="the tutorial's steps use curl")
def test_the_tutorial_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project = tmp_path / "todo"
    project.mkdir()
    (project / ".venv").symlink_to(REPO / ".venv")
    core_port, app_port = free_port(), free_port()
    core, origin = f"http://127.0.0.1:{core_port}", f"http://127.0.0.1:{app_port}"
    found = steps(core_port, app_port)
    kinds = [step.kind for step in found]
    assert kinds.count("file") >= 3 and kinds.count("background") == 2 and "output" in kinds
    items = Element()
    document = SimpleNamespace(getElementById={"items": items}.__getitem__,
                               createElement=lambda tag: Element())
    monkeypatch.setitem(sys.modules, "js", SimpleNamespace(document=document))
    servers: list[subprocess.Popen[bytes]] = []

    async def main() -> None:
        env = {key: value for key, value in os.environ.items()
               if not key.startswith(("PEDELEC_", "PYTEST_"))}
        output: str | None = None
        async with contextlib.AsyncExitStack() as stack:
            for step in found:
                if step.kind == "file":
                    path = project / step.arg
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text(step.text + "\n", encoding="utf-8")
                elif step.kind == "run":
                    output, env = await run_shell(step.text, project, env)
                elif step.kind == "output":
                    assert output is not None, "an output block before any run block"
                    assert matches(step.text, output), (
                        f"the tutorial shows:\n{step.text}\nthe command printed:\n{output}")
                    output = None
                else:
                    log = (tmp_path / f"server-{len(servers)}.log").open("wb")
                    servers.append(subprocess.Popen(
                        ["bash", "-c", step.text], cwd=project, env=env,
                        stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
                    await wait_until_answers(step.arg, servers[-1])
                    if step.arg.startswith(origin):  # the app is served: open "the page"
                        index = (await httpx.AsyncClient().get(step.arg)).text
                        assert f'src="{core}/pedelec/pedelec-pyodide.js"' in index
                        tools = load_tools(project / "public" / "tools.py")
                        await stack.enter_async_context(Page(tools, core, origin).connected())
            await runtime_ready(core)
        assert [item.textContent for item in items.children] == ["buy milk"]

    try:
        asyncio.run(asyncio.wait_for(main(), WAIT * 10 + PROVISION_WAIT))
    finally:
        for process in servers:
            stop(process)
