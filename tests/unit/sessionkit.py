"""A Session on the wire without a socket: a fake Core, the frames it sends, tools to drive."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from pedelec_pyodide import Session, define_tool


class FakeCore:
    """Plays Core's side: records what the page sends."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def send(self, frame: str) -> None:
        self.sent.append(json.loads(frame))

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [frame for frame in self.sent if frame["type"] == kind]


def request(request_id: str, tool: str = "t", args: Any = None, turn_id: str | None = None
            ) -> str:
    return json.dumps({"type": "tool.request", "toolRequestId": request_id, "turnId": turn_id,
                       "tool": tool, "args": {} if args is None else args})


WELCOME = json.dumps({"type": "welcome", "sessionId": "s1", "resumeToken": "tok",
                      "resumed": False, "state": "idle"})


def connected(session: Session) -> FakeCore:
    core = FakeCore()
    session.connection_made(core)
    session.receive(WELCOME)
    return core


async def spin(steps: int = 10) -> None:
    """Let the loop run its ready work (no time passes)."""
    for _ in range(steps):
        await asyncio.sleep(0)


def tool(name: str = "t", handler: Any = None, **options: Any) -> Any:
    schema = options.pop("args_schema", {"type": "object"})
    return define_tool(name=name, description="d", args_schema=schema, handler=handler,
                       **options)


def wire(core: FakeCore, *kinds: str) -> list[tuple[Any, ...]]:
    """The frames of ``kinds`` in order, each as a short tuple."""
    out: list[tuple[Any, ...]] = []
    for frame in core.sent:
        kind = frame["type"]
        if kind not in kinds:
            continue
        if kind == "tool.progress":
            out.append((kind, frame["progress"], frame.get("total"), frame.get("message")))
        elif kind == "tool.waiting":
            out.append((kind, frame["waiting"], frame.get("reason")))
        elif kind == "tool.result":
            out.append((kind, frame["result"]))
        else:
            out.append((kind,))
    return out


def approval_tool(runs: list[Any], **options: Any) -> Any:
    schema = {"type": "object", "properties": {"id": {"type": "integer"}},
              "required": ["id"]}
    return tool("delete", lambda args: runs.append(args["id"]) or {"deleted": args["id"]},
                args_schema=schema, needs_approval=options.pop("needs_approval", True),
                **options)


def browser_page(monkeypatch: Any, config: str = '{"storage": false}') -> Any:
    """A ``browser.PageSession`` on a stand-in for the ``js`` module (its ``URL`` class
    only); what it emits to the page's JS is kept in ``page.emitted``, decoded."""
    import sys
    from types import SimpleNamespace
    from urllib.parse import urlsplit

    from pedelec_pyodide.browser import PageSession

    def url(text: str, base: str | None = None) -> SimpleNamespace:  # the JS URL class
        parts = urlsplit(text)
        return SimpleNamespace(protocol=f"{parts.scheme}:", host=parts.netloc,
                               pathname=parts.path or "/", search="")

    monkeypatch.setitem(sys.modules, "js", SimpleNamespace(URL=SimpleNamespace(new=url)))
    emitted: list[tuple[str, Any]] = []
    page = PageSession("http://127.0.0.1:1",
                       lambda kind, detail: emitted.append((kind, json.loads(detail))), config)
    page.emitted = emitted
    return page


def side_effect_tool(runs: list[str]) -> Any:
    """An async tool with a side effect (must not run twice): its key goes in ``runs``
    when its body runs, its result one step of the loop later."""

    async def side_effect(key: str) -> str:
        """Writes something: must not run twice."""
        runs.append(key)
        await asyncio.sleep(0)
        return key

    return define_tool(side_effect)
