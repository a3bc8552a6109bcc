"""Stateful fuzzing of the Session on the wire (hypothesis): random interleavings of
requests, re-sent requests, results of async handlers, disposers, fallbacks, cancels,
dropped connections and bad frames.

Invariants: no handler runs twice for one toolRequestId; every result sent for an id is
the same; nothing raises out of ``receive``; and at the end, once Core re-sends every
request (as it does on resume), each has its result and the session is idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections import Counter
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from pedelec_pyodide import Session, SessionState, ToolContext, define_tool

TOOLS = ("alpha", "beta", "gamma")
EXAMPLES = int(os.environ.get("PEDELEC_FUZZ_EXAMPLES", "60"))


def new_loop() -> asyncio.AbstractEventLoop:
    if sys.platform == "emscripten":
        from noio_loop import NoIOEventLoop

        return NoIOEventLoop()
    return asyncio.new_event_loop()


def no_running_loop() -> contextlib.AbstractContextManager[None]:
    """Pyodide's WebLoop counts as running at top level; hide it while ours runs."""
    if sys.platform == "emscripten":
        from noio_loop import _no_running_loop

        return _no_running_loop()
    return contextlib.nullcontext()


class Wire:
    def __init__(self) -> None:
        self.frames: list[dict[str, Any]] = []

    def send(self, frame: str) -> None:
        self.frames.append(json.loads(frame))


class SessionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = new_loop()
        self.runs: Counter[str] = Counter()
        self.results: dict[str, list[Any]] = {}
        self.requested: dict[str, str] = {}
        self.gates: list[asyncio.Event] = []
        self.disposers: list[Any] = []
        self.wire: Wire | None = None
        tools = [define_tool(name=name, description=f"tool {name}",
                             args_schema={"type": "object",
                                          "properties": {"n": {"type": "integer"}}},
                             handler=self.handler(f"inline:{name}"))
                 for name in TOOLS[:2]]
        self.session = Session(tools)
        self.connect()

    # --- helpers -----------------------------------------------------------------------

    def handler(self, label: str, *, slow: bool = False) -> Any:
        if not slow:
            def sync(args: Any, ctx: ToolContext) -> Any:
                self.runs[ctx.tool_request_id] += 1
                return {"by": label, "args": args}
            return sync

        async def asynchronous(args: Any, ctx: ToolContext) -> Any:
            self.runs[ctx.tool_request_id] += 1
            gate = asyncio.Event()
            self.gates.append(gate)
            await gate.wait()
            return {"by": label, "args": args, "active": ctx.active}
        return asynchronous

    def drive(self, ticks: int = 3) -> None:
        async def spin() -> None:
            for _ in range(ticks):
                await asyncio.sleep(0)

        with no_running_loop():
            self.loop.run_until_complete(spin())
        self.collect()

    def collect(self) -> None:
        if self.wire is None:
            return
        for frame in self.wire.frames:
            if frame["type"] == "tool.result":
                self.results.setdefault(frame["toolRequestId"], []).append(frame["result"])
        self.wire.frames.clear()

    def connect(self) -> None:
        self.collect()
        self.wire = Wire()
        self.session.connection_made(self.wire)
        self.session.receive(json.dumps({"type": "welcome", "sessionId": "s",
                                         "resumeToken": "t", "resumed": True,
                                         "state": "idle"}))

    def send_request(self, request_id: str, tool: str, n: int) -> None:
        with no_running_loop(), contextlib.closing(_Entered(self.loop)):
            self.session.receive(json.dumps({
                "type": "tool.request", "toolRequestId": request_id, "turnId": None,
                "tool": tool, "args": {"n": n},
            }))
        self.drive(1)

    # --- rules -------------------------------------------------------------------------

    @rule(tool=st.sampled_from(TOOLS), slow=st.booleans())
    def register_named(self, tool: str, slow: bool) -> None:
        self.disposers.append(self.session.on_tool(tool, self.handler(f"named:{tool}",
                                                                      slow=slow)))

    @rule(slow=st.booleans())
    def register_fallback(self, slow: bool) -> None:
        handler = self.handler("fallback", slow=slow)

        def fallback(tool: str, args: Any, ctx: ToolContext) -> Any:
            return handler(args, ctx)

        self.disposers.append(self.session.on_tool(fallback))

    @precondition(lambda self: self.disposers)
    @rule(index=st.integers(min_value=0), twice=st.booleans())
    def dispose(self, index: int, twice: bool) -> None:
        dispose = self.disposers[index % len(self.disposers)]
        dispose()
        if twice:
            dispose()

    @rule(tool=st.sampled_from(TOOLS), n=st.integers(-5, 5))
    def new_request(self, tool: str, n: int) -> None:
        request_id = f"q{len(self.requested)}"
        self.requested[request_id] = tool
        self.send_request(request_id, tool, n)

    @precondition(lambda self: self.requested)
    @rule(index=st.integers(min_value=0), n=st.integers(-5, 5))
    def resend_request(self, index: int, n: int) -> None:
        request_id = list(self.requested)[index % len(self.requested)]
        self.send_request(request_id, self.requested[request_id], n)

    @precondition(lambda self: self.gates)
    @rule(index=st.integers(min_value=0))
    def finish_one(self, index: int) -> None:
        self.gates[index % len(self.gates)].set()
        self.drive()

    @precondition(lambda self: self.requested)
    @rule(index=st.integers(min_value=0))
    def cancel(self, index: int) -> None:
        request_id = list(self.requested)[index % len(self.requested)]
        self.session.receive(json.dumps({"type": "tool.cancel", "toolRequestId": request_id,
                                         "reason": "deadline"}))

    @rule()
    def drop_connection(self) -> None:
        self.collect()
        self.session.connection_lost()
        self.wire = None

    @precondition(lambda self: self.wire is None)
    @rule()
    def reconnect(self) -> None:
        self.connect()

    @rule(frame=st.sampled_from(["", "{", "[]", '{"type":"tool.request"}',
                                 '{"type":"hello","protocol":1,"tools":[]}',
                                 '{"type":"tool.result","toolRequestId":"q0","result":1,'
                                 '"handledBy":"named"}']))
    def bad_frame(self, frame: str) -> None:
        self.session.receive(frame)

    # --- invariants --------------------------------------------------------------------

    @invariant()
    def no_handler_ran_twice(self) -> None:
        assert all(count <= 1 for count in self.runs.values()), self.runs

    @invariant()
    def handlers_never_fail(self) -> None:
        for results in self.results.values():
            for result in results:
                assert not (isinstance(result, dict) and "error" in result
                            and result["error"]["code"] == "TOOL_HANDLER_ERROR"), result

    @invariant()
    def every_result_for_an_id_is_the_same(self) -> None:
        for request_id, results in self.results.items():
            assert all(result == results[0] for result in results), (request_id, results)

    def teardown(self) -> None:
        if self.wire is None:
            self.connect()
        for gate in self.gates:
            gate.set()
        self.drive(10)
        for request_id, tool in self.requested.items():  # Core re-sends on resume
            self.send_request(request_id, tool, 0)
        self.drive(10)
        assert set(self.results) == set(self.requested)
        self.no_handler_ran_twice()
        self.every_result_for_an_id_is_the_same()
        assert self.session.state == SessionState.IDLE
        self.loop.close()


class _Entered:
    """Makes ``loop`` the running loop while a frame is received, as in the page."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        asyncio.events._set_running_loop(loop)

    def close(self) -> None:
        asyncio.events._set_running_loop(None)


SessionMachine.TestCase.settings = settings(max_examples=EXAMPLES, stateful_step_count=30,
                                            deadline=None)
TestSessionMachine = SessionMachine.TestCase
