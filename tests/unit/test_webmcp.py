"""WebMCP: the session's tools registered for the browser's own agent, and its calls run as
Core's requests run (a fake registrar records what the page would register)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from manual_clock import ManualClock
from sessionkit import browser_page, connected, request
from web_storage import DictStorage

from pedelec_pyodide import (
    ApprovalRequest,
    Session,
    StorageLedger,
    ToolCall,
    ToolContext,
    ToolProgress,
    ToolStatus,
    define_tool,
)
from pedelec_pyodide.protocol import MAX_DEPTH
from pedelec_pyodide.webmcp import ABORT_REASON, MAX_CALLS, MAX_INPUT_BYTES, WebMCP, descriptor


class Registrar:
    """Plays the page's document.modelContext: what is registered now, and every change."""

    def __init__(self) -> None:
        self.tools: dict[str, dict[str, Any]] = {}  # registration -> descriptor
        self.log: list[tuple[str, str]] = []

    def register(self, descriptor_json: str) -> None:
        fields = json.loads(descriptor_json)
        registration = fields.pop("registration")
        assert registration not in self.tools
        assert fields["name"] not in {t["name"] for t in self.tools.values()}  # unique names
        self.tools[registration] = fields
        self.log.append(("register", fields["name"]))

    def unregister(self, registration: str) -> None:
        self.log.append(("unregister", self.tools.pop(registration)["name"]))

    def registration(self, name: str) -> str:
        (found,) = [r for r, fields in self.tools.items() if fields["name"] == name]
        return found

    @property
    def names(self) -> list[str]:
        return sorted(fields["name"] for fields in self.tools.values())


def offered(session: Session) -> tuple[WebMCP, Registrar]:
    registrar = Registrar()
    webmcp = WebMCP(session, registrar)
    webmcp.start()
    return webmcp, registrar


_ids = iter(range(1, 10**6))


async def call(webmcp: WebMCP, registrar: Registrar, name: str, args: Any = None,
               **options: Any) -> Any:
    text = options.pop("text", None)
    if text is None:
        text = json.dumps({} if args is None else args)
    answer = await webmcp.call(f"c{next(_ids)}", registrar.registration(name), text, **options)
    return json.loads(answer)


async def spin(steps: int = 10) -> None:
    for _ in range(steps):
        await asyncio.sleep(0)


@define_tool(annotations={"title": "Add numbers", "readOnlyHint": True,
                          "idempotentHint": True})
def add(a: int, b: int = 0) -> int:
    """Add two integers."""
    return a + b


@define_tool(webmcp=False)
def secret() -> str:
    """Only Core's agent may call this."""
    return "core only"


# --- what is registered -----------------------------------------------------------------


def test_a_tool_is_registered_with_its_name_description_schema_title_and_read_only_hint(
) -> None:
    assert descriptor(add) == {
        "name": "add", "description": "Add two integers.", "inputSchema": add.args_schema,
        "title": "Add numbers", "annotations": {"readOnlyHint": True}}
    plain = define_tool(name="p", description="d", args_schema={"type": "object"},
                        annotations={"destructiveHint": True})
    assert descriptor(plain) == {"name": "p", "description": "d",
                                 "inputSchema": {"type": "object"}}


def test_webmcp_false_keeps_a_tool_out_and_core_gets_the_same_metadata() -> None:
    session = Session([add, secret])
    _, registrar = offered(session)
    assert registrar.names == ["add"]
    core = connected(session)
    (hello,) = core.of_type("hello")
    assert [tool["name"] for tool in hello["tools"]] == ["add", "secret"]
    assert "webmcp" not in json.dumps(hello["tools"])
    assert define_tool(secret._function, webmcp=True).metadata() == secret.metadata()
    with pytest.raises(ValueError, match="webmcp must be True or False"):
        define_tool(name="x", description="d", args_schema={}, webmcp="no")  # type: ignore[call-overload]


async def test_registrations_follow_the_session_add_dispose_redefine_close() -> None:
    session = Session([add])
    webmcp, registrar = offered(session)
    first = registrar.registration("add")

    @define_tool(name="note")
    def note_v1(text: str) -> str:
        """Keep a note."""
        return "v1"

    dispose = session.add_tool(note_v1)
    assert registrar.names == ["add", "note"]
    old = registrar.registration("note")
    dispose()
    dispose()  # twice: nothing more happens
    assert registrar.names == ["add"]

    @define_tool(name="note", description="Keep a note, again.")
    def note_v2(text: str) -> str:
        return "v2"

    session.add_tool(note_v2)
    assert registrar.tools[registrar.registration("note")]["description"] == "Keep a note, again."
    assert registrar.log == [("register", "add"), ("register", "note"),
                             ("unregister", "note"), ("register", "note")]
    # a call through the old registration never reaches the new definition's handler
    stale = json.loads(await webmcp.call("c-old", old, "{}"))
    assert stale["error"]["code"] == "TOOL_HANDLER_NOT_FOUND"
    assert await call(webmcp, registrar, "note", {"text": "x"}) == "v2"
    assert registrar.registration("add") == first  # untouched by the others' changes
    session.close()
    assert registrar.names == []
    assert (await webmcp.call("c-late", first, "{}")).count("TOOL_HANDLER_NOT_FOUND") == 1


def test_start_registers_what_the_blocks_defined_once_and_stop_unregisters_it() -> None:
    session = Session([add])
    webmcp, registrar = offered(session)
    webmcp.start()  # again: nothing registered twice
    assert registrar.log == [("register", "add")]
    webmcp.stop()
    assert registrar.names == [] and webmcp.registered == {}
    session.add_tool(define_tool(name="n", description="d", args_schema={"type": "object"}))
    assert registrar.names == []  # stopped: it follows the session no more


# --- calls run as Core's requests run ---------------------------------------------------


async def test_a_call_answers_what_a_request_from_core_is_answered() -> None:
    async def later(args: Any) -> dict[str, Any]:
        await asyncio.sleep(0)
        return {"later": args["n"]}

    session = Session([add, define_tool(name="later", description="d",
                                        args_schema={"type": "object"}, handler=later)])
    webmcp, registrar = offered(session)
    core = connected(session)
    cases = [("add", {"a": 2, "b": 3}), ("add", {"a": "2"}), ("add", [1]), ("add", 5),
             ("later", {"n": 1})]
    for number, (name, args) in enumerate(cases):
        session.receive(request(f"q{number}", name, args))
        await spin()
        from_core = core.of_type("tool.result")[-1]["result"]
        assert await call(webmcp, registrar, name, args) == from_core
    codes = [r["result"]["error"]["code"] for r in core.of_type("tool.result")
             if isinstance(r["result"], dict) and "error" in r["result"]]
    assert codes == ["INVALID_ARGS"] * 3
    assert core.of_type("tool.result")[0]["result"] == 5
    # WebMCP's calls are the page's own: nothing of them goes to Core
    assert len(core.of_type("tool.result")) == len(cases)


async def test_handler_priority_named_then_inline_then_fallback() -> None:
    session = Session([add])
    webmcp, registrar = offered(session)
    dispose_fallback = session.on_tool(lambda tool, args: f"fallback {tool}")
    dispose_named = session.on_tool("add", lambda args: "named")
    assert await call(webmcp, registrar, "add", {"a": 1}) == "named"
    dispose_named()
    assert await call(webmcp, registrar, "add", {"a": 1}) == 1
    dispose_fallback()
    declared = define_tool(name="declared", description="d", args_schema={"type": "object"})
    session.add_tool(declared)
    assert (await call(webmcp, registrar, "declared"))["error"]["code"] == (
        "TOOL_HANDLER_NOT_FOUND")
    session.on_tool(lambda tool, args: f"fallback {tool}")
    assert await call(webmcp, registrar, "declared") == "fallback declared"


async def test_a_failing_handler_resolves_its_error_result() -> None:
    def broken(args: Any) -> Any:
        raise KeyError("title")

    session = Session([define_tool(name="broken", description="d",
                                   args_schema={"type": "object"}, handler=broken),
                       define_tool(name="unjson", description="d",
                                   args_schema={"type": "object"}, handler=lambda: {1, 2})])
    webmcp, registrar = offered(session)
    failed = await call(webmcp, registrar, "broken")
    assert failed["error"]["code"] == "TOOL_HANDLER_ERROR" and "KeyError" in (
        failed["error"]["message"])
    assert (await call(webmcp, registrar, "unjson"))["error"]["code"] == "TOOL_RESULT_INVALID"


async def test_input_that_is_not_json_too_large_or_too_deep_is_invalid_args_unrun() -> None:
    runs: list[Any] = []
    session = Session([define_tool(name="t", description="d", args_schema={"type": "object"},
                                   handler=lambda args: runs.append(args) or "ran")])
    webmcp, registrar = offered(session)
    calls: list[ToolCall] = []
    session.subscribe(lambda event: isinstance(event, ToolCall) and calls.append(event))
    huge = '{"x": "' + "y" * MAX_INPUT_BYTES + '"}'
    deep = "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1)
    for text, says in [("{", "is not JSON"), (huge, "the limit is"), (deep, "nests deeper"),
                       ('{"x": NaN}', "is not JSON"), ('"\\ud800"', "not Unicode")]:
        refused = await call(webmcp, registrar, "t", text=text)
        assert refused["error"]["code"] == "INVALID_ARGS", text[:20]
        assert says in refused["error"]["message"]
        assert refused["error"]["retryable"] is True
    no_json = json.loads(await webmcp.call("c-none", registrar.registration("t"), None))
    assert no_json["error"]["code"] == "INVALID_ARGS"
    assert runs == [] and calls == []  # never a request: nothing ran, nothing to report
    assert await call(webmcp, registrar, "t", {"ok": 1}) == "ran"


# --- approval -----------------------------------------------------------------------------


async def test_the_approver_is_asked_knowing_the_call_is_the_browser_agents() -> None:
    runs: list[str] = []

    @define_tool(needs_approval=True)
    def delete(note: str) -> str:
        """Delete a note."""
        runs.append(note)
        return f"deleted {note}"

    session = Session([delete])
    webmcp, registrar = offered(session)
    asked: list[ApprovalRequest] = []

    def approver(request: ApprovalRequest) -> bool:
        asked.append(request)
        return request.args["note"] == "a" or request.deny("not that one")

    session.on_approval(approver)
    assert await call(webmcp, registrar, "delete", {"note": "a"}) == "deleted a"
    denied = await call(webmcp, registrar, "delete", {"note": "b"})
    assert denied["error"]["code"] == "TOOL_DENIED"
    assert denied["error"]["details"] == {"reason": "not that one"}
    assert [(r.source, r.tool_request_id.startswith("webmcp-")) for r in asked] == [
        ("webmcp", True)] * 2
    assert runs == ["a"]
    # the page decides what the browser's agent may do: an approver may refuse its calls
    session.on_approval(lambda request: request.source != "webmcp")
    assert (await call(webmcp, registrar, "delete", {"note": "c"}))["error"]["code"] == (
        "TOOL_DENIED")
    assert runs == ["a"]


# --- cancel ----------------------------------------------------------------------------


async def test_an_abort_sets_ctx_cancelled_and_one_ignored_is_cancelled_after_the_grace(
) -> None:
    clock = ManualClock()
    release = asyncio.Event()
    seen: list[bool] = []

    async def polite(args: Any, ctx: ToolContext) -> str:
        while not ctx.cancelled:
            await asyncio.sleep(0)
        seen.append(True)
        return "stopped early"

    async def stubborn(args: Any) -> str:
        await release.wait()
        return "late"

    session = Session([define_tool(name=name, description="d", args_schema={"type": "object"},
                                   handler=handler)
                       for name, handler in [("polite", polite), ("stubborn", stubborn)]],
                      scheduler=clock, cancel_grace=0.5)
    webmcp, registrar = offered(session)
    first = asyncio.ensure_future(webmcp.call("c1", registrar.registration("polite"), "{}"))
    second = asyncio.ensure_future(webmcp.call("c2", registrar.registration("stubborn"), "{}"))
    await spin()
    assert webmcp.abort("c1") and webmcp.abort("c2")
    assert not webmcp.abort("c3")
    await spin()
    assert json.loads(await first) == "stopped early" and seen == [True]
    assert not second.done()
    clock.advance(0.5)
    cancelled = json.loads(await second)
    assert cancelled["error"]["code"] == "TOOL_CANCELLED"
    assert cancelled["error"]["details"] == {"reason": ABORT_REASON}
    assert not webmcp.abort("c2")  # answered: no longer in flight
    release.set()
    await spin()


async def test_an_abort_before_the_call_reached_the_page_runs_nothing() -> None:
    runs: list[int] = []
    session = Session([define_tool(name="t", description="d", args_schema={"type": "object"},
                                   handler=lambda: runs.append(1))])
    webmcp, registrar = offered(session)
    answer = await call(webmcp, registrar, "t", aborted=True)
    assert answer["error"]["code"] == "TOOL_CANCELLED" and runs == []


async def test_an_abort_while_approval_is_asked_withdraws_it() -> None:
    session = Session([define_tool(name="t", description="d", args_schema={"type": "object"},
                                   handler=lambda: "ran", needs_approval=True)])
    webmcp, registrar = offered(session)
    asked: list[ApprovalRequest] = []
    never: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    session.on_approval(lambda request: asked.append(request) or never)
    pending = asyncio.ensure_future(webmcp.call("c1", registrar.registration("t"), "{}"))
    await spin()
    assert webmcp.abort("c1")
    assert json.loads(await pending)["error"]["code"] == "TOOL_CANCELLED"
    assert asked[0].withdrawn and never.cancelled()


# --- events, bounds, Core --------------------------------------------------------------


async def test_the_calls_events_say_their_source() -> None:
    async def steps(args: Any, ctx: ToolContext) -> str:
        ctx.progress(1, 2)
        await asyncio.sleep(0)
        return "done"

    session = Session([define_tool(name="steps", description="d",
                                   args_schema={"type": "object"}, handler=steps)])
    webmcp, registrar = offered(session)
    events: list[Any] = []
    session.subscribe(lambda e: events.append(e) if isinstance(
        e, ToolStatus | ToolCall | ToolProgress) else None)
    assert await call(webmcp, registrar, "steps") == "done"
    core = connected(session)
    session.receive(request("q1", "steps"))
    await spin()
    assert core.of_type("tool.result")[0]["result"] == "done"
    sources = [(type(e).__name__, e.source) for e in events]
    assert sources == [(kind, "webmcp") for kind in
                       ["ToolStatus", "ToolProgress", "ToolStatus", "ToolCall"]] + [
                      (kind, "core") for kind in
                       ["ToolStatus", "ToolProgress", "ToolStatus", "ToolCall"]]
    assert events[0].tool_request_id.startswith("webmcp-")


async def test_calls_are_bounded_and_not_kept_in_the_delivery_ledger() -> None:
    release = asyncio.Event()

    async def waits(args: Any) -> str:
        await release.wait()
        return "ok"

    storage = DictStorage()
    session = Session([define_tool(name="waits", description="d",
                                   args_schema={"type": "object"}, handler=waits)],
                      ledger=StorageLedger(storage, "p:"))
    webmcp, registrar = offered(session)
    running = [asyncio.ensure_future(webmcp.call(f"c{n}", registrar.registration("waits"), "{}"))
               for n in range(MAX_CALLS)]
    refused = asyncio.ensure_future(webmcp.call("c-over", registrar.registration("waits"), "{}"))
    await spin()
    assert refused.done()  # answered at once, not queued
    over = json.loads(refused.result())
    assert over["error"]["code"] == "TOO_MANY_PENDING" and over["error"]["retryable"] is True
    assert len(session.pending) == MAX_CALLS
    release.set()
    assert [json.loads(answer) for answer in await asyncio.gather(*running)] == (
        ["ok"] * MAX_CALLS)
    assert await call(webmcp, registrar, "waits") == "ok"  # room again
    assert storage.items == {}


async def test_calls_run_with_no_connection_to_core() -> None:
    session = Session([add])  # never connected: Core is down
    webmcp, registrar = offered(session)
    assert not session.connected
    assert await call(webmcp, registrar, "add", {"a": 4, "b": 1}) == 5


# --- the page's side (browser.PageSession, with a stand-in for the js module) ----------


@pytest.fixture
def page(monkeypatch: pytest.MonkeyPatch) -> Any:
    return browser_page(monkeypatch)


async def test_the_page_registers_on_start_runs_calls_and_reports_them(page: Any) -> None:
    page.session.add_tool(add)
    page.session.add_tool(secret)
    assert [kind for kind, _ in page.emitted if kind.startswith("webmcp")] == []
    assert json.loads(page.webmcp_start()) == {"maxInputBytes": MAX_INPUT_BYTES}
    assert json.loads(page.webmcp_start()) == {"maxInputBytes": MAX_INPUT_BYTES}  # once
    (registered,) = [detail for kind, detail in page.emitted if kind == "webmcpregister"]
    assert registered == {"registration": "1", **descriptor(add)}
    answer = await page.webmcp_call("1", registered["registration"], '{"a": 1, "b": 2}')
    assert json.loads(answer) == 3
    (toolcall,) = [detail for kind, detail in page.emitted if kind == "toolcall"]
    assert toolcall["source"] == "webmcp" and toolcall["result"] == 3
    assert page.webmcp_abort("1") is False
    page.close()
    assert page.emitted[-1] == ("webmcpunregister", {"registration": "1"})
