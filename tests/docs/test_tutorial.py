"""docs/tutorial.md runs as written.

Its blocks run in order (:mod:`docrun` says how each is marked) in a fresh directory, as a
reader's terminal would run them: the project and its own ``.venv`` with pedelec-pyodide
installed from this checkout, the pytest step, Core (``pedelec serve --allow-origin``), the
static server and every ``curl``, on free ports instead of the tutorial's 8765 and 3000.
The page itself needs a browser: here a real ``Session`` with the tutorial's ``tools.py``
stands in for it (its DOM a small stand-in), connecting from the app's origin as the
loader would. The real page in Chromium: tests/e2e/tutorial.spec.js, and the Playwright
test of it in docs/how-to/testing.md (tests/docs/test_howto.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import shutil
import sys
import threading
from pathlib import Path
from types import ModuleType, SimpleNamespace

import httpx
import pytest
import websockets
from docrun import DOCS, PORTS, blocks, dependencies_dir, free_port, run_doc, same_python_as_tests

from pedelec_pyodide import Session

TUTORIAL = DOCS / "tutorial.md"
WAIT = 30.0  # seconds: the bound on any one step of the page
PROVISION_WAIT = 240.0  # seconds: Core provisioning the Pyodide runtime (maybe downloading)


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
    Core's bridge from the app's origin, on an event loop of its own thread (the
    tutorial's commands meanwhile block this one, as a reader's terminal does)."""

    def __init__(self, tools: ModuleType, core: str, origin: str) -> None:
        self.session = Session()
        tools.register(self.session)
        self.core, self.origin = core, origin
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.tasks: list[asyncio.Task[None]] = []
        self.ws: websockets.ClientConnection | None = None

    def open(self) -> None:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._open(), self.loop).result(WAIT)

    def close(self) -> None:
        if self.thread.is_alive():
            asyncio.run_coroutine_threadsafe(self._close(), self.loop).result(WAIT)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(WAIT)

    async def _open(self) -> None:
        async with httpx.AsyncClient(timeout=WAIT) as http:
            answer = await http.get(f"{self.core}/pedelec/v1/origin-check",
                                    headers={"Origin": self.origin})
        assert answer.json() == {"allowed": True}, answer.text
        ws_url = self.core.replace("http://", "ws://") + "/pedelec/v1/bridge"
        ws = self.ws = await websockets.connect(ws_url, open_timeout=WAIT,
                                                additional_headers={"Origin": self.origin})
        outbox: asyncio.Queue[str] = asyncio.Queue()
        welcome = asyncio.Event()

        async def write() -> None:
            while True:
                await ws.send(await outbox.get())

        async def read() -> None:
            with contextlib.suppress(websockets.ConnectionClosed):
                async for frame in ws:
                    self.session.receive(str(frame))
                    if json.loads(frame)["type"] == "welcome":
                        welcome.set()

        self.tasks = [asyncio.create_task(write()), asyncio.create_task(read())]
        self.session.connection_made(SimpleNamespace(send=outbox.put_nowait))
        await asyncio.wait_for(welcome.wait(), WAIT)

    async def _close(self) -> None:
        for task in self.tasks:
            task.cancel()
        if self.ws is not None:
            await self.ws.close()


def load_tools(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("tutorial_tools", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def runtime_ready(core: str) -> None:
    """As the tutorial says, Core's health turns ``"ready": true`` once it has provisioned the
    runtime pages load (from the cache: seconds; a first download: longer). Waiting for it
    also means Core is never stopped in the middle of writing the cache."""
    health: dict[str, object] = {}
    with httpx.Client(timeout=5.0) as http:
        for _ in range(int(PROVISION_WAIT / 0.5)):
            health = http.get(f"{core}/pedelec/v1/health").json()
            if health.get("ready") or health.get("pyodide") == "error":
                break
            threading.Event().wait(0.5)
    assert health.get("ready") is True, health


@pytest.mark.skipif(shutil.which("curl") is None, reason="the tutorial's steps use curl")
@pytest.mark.skipif(not same_python_as_tests(),
                    reason="the tutorial's python3 is not this test's Python version")
def test_the_tutorial_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ports = {reader: free_port() for reader in PORTS}
    core, origin = f"http://127.0.0.1:{ports['8765']}", f"http://127.0.0.1:{ports['3000']}"
    kinds = [block.kind for block in blocks(TUTORIAL)]
    assert kinds.count("file") >= 3 and kinds.count("background") == 2 and "output" in kinds
    assert "not run:" not in kinds  # the tutorial runs whole
    items = Element()
    document = SimpleNamespace(getElementById={"items": items}.__getitem__,
                               createElement=lambda tag: Element())
    monkeypatch.setitem(sys.modules, "js", SimpleNamespace(document=document))
    pages: list[Page] = []

    def started(url: str, cwd: Path) -> None:
        if url.startswith(core):
            runtime_ready(core)
        elif url.startswith(origin):  # the app is served: open "the page"
            index = httpx.get(url, timeout=WAIT).text
            assert f'src="{core}/pedelec/pedelec-pyodide.js"' in index
            pages.append(Page(load_tools(cwd / "public" / "tools.py"), core, origin))
            pages[-1].open()

    try:
        ran = run_doc(TUTORIAL, tmp_path, dependencies_dir(tmp_path), ports=ports,
                      started=started)
    finally:
        for page in pages:
            page.close()
    assert len(ran) == len(kinds) and len(pages) == 1
    assert [item.textContent for item in items.children] == ["buy milk"]
