"""WebMCP: a session's tools offered to the browser's own agent (``document.modelContext``).

Nothing here touches ``js``: the browser edge (``browser.PageSession``) gives a
:class:`Registrar` that registers and unregisters tools in the page, and passes each call
of the browser's agent in as strings (a registration id, the input as JSON text). A call
runs exactly as a request from Core runs (handler priority, validation, approval, the
result rules, cancel), as a request of source ``webmcp``, and is answered with its
result's JSON text, error results included.

Registrations follow the session: every tool with a definition and ``webmcp=True`` is
registered; one removed is unregistered; one disposed and added again is registered again
with its new definition (a new registration id: a call made through the old one is
answered ``TOOL_HANDLER_NOT_FOUND``, never run by the new definition's handler).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Coroutine
from typing import Any, Protocol

from . import strictjson
from .dispatch import InFlight
from .protocol import MAX_FRAME_BYTES, ProtocolError, decode_json
from .results import (
    DEFAULT_MAX_PENDING,
    TOO_MANY_PENDING,
    TOOL_CANCELLED,
    TOOL_HANDLER_NOT_FOUND,
    invalid_args,
    tool_error,
)
from .session import Session, SessionState, ToolsChanged
from .tools import Tool

#: WebMCP calls in flight at once; more are answered ``TOO_MANY_PENDING`` (the same bound
#: as Core's ``--max-pending`` default for Core's requests)
MAX_CALLS = DEFAULT_MAX_PENDING
#: the largest input, as UTF-8 JSON text, a call may have (as a ``tool.request`` frame)
MAX_INPUT_BYTES = MAX_FRAME_BYTES
#: the reason a call aborted by the browser's agent is cancelled with (``details.reason``)
ABORT_REASON = "the browser's agent aborted the call"

__all__ = ["ABORT_REASON", "MAX_CALLS", "MAX_INPUT_BYTES", "Registrar", "WebMCP", "descriptor"]


class Registrar(Protocol):
    """How the page registers tools with its ``document.modelContext``."""

    def register(self, descriptor_json: str) -> None:
        """Register ``{"registration", "name", "description", "inputSchema", "title"?,
        "annotations"?}``; the page's ``execute`` passes ``registration`` back."""

    def unregister(self, registration: str) -> None:
        """Unregister it (abort its registration's signal)."""


def descriptor(tool: Tool) -> dict[str, Any]:
    """What the browser's agent is told of ``tool``: its name, description, ``argsSchema``
    as ``inputSchema``, and ``title`` and ``readOnlyHint`` from its annotations (WebMCP's
    only hint besides ``untrustedContentHint``, which a tool's annotations cannot hold)."""
    fields: dict[str, Any] = {"name": tool.name, "description": tool.description,
                              "inputSchema": tool.args_schema}
    hints = tool.annotations or {}
    if "title" in hints:
        fields["title"] = hints["title"]
    if "readOnlyHint" in hints:
        fields["annotations"] = {"readOnlyHint": hints["readOnlyHint"]}
    return fields


class WebMCP:
    """One session's tools on one page's ``document.modelContext``."""

    def __init__(self, session: Session, registrar: Registrar) -> None:
        self.session = session
        self._registrar = registrar
        self._ids = itertools.count(1)
        self._by_name: dict[str, str] = {}  # name -> registration
        self._by_registration: dict[str, Tool] = {}
        self._calls: dict[str, str] = {}  # the page's call id -> its tool request id
        self._unsubscribe: Any = None

    @property
    def registered(self) -> dict[str, str]:
        """The tools registered now: name -> registration id."""
        return dict(self._by_name)

    def start(self) -> None:
        """Register every tool the session offers, and follow its changes from now on."""
        if self._unsubscribe is not None or self.session.closed:
            return
        self._unsubscribe = self.session.subscribe(self._follow)
        self.sync()

    def stop(self) -> None:
        """Unregister everything and stop following the session (calls in flight go on)."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        for registration in list(self._by_name.values()):
            self._unregister(registration)
        self._by_name.clear()

    def _follow(self, event: Any) -> None:
        if isinstance(event, ToolsChanged):
            self.sync()
        elif event is SessionState.CLOSED:
            self.stop()

    def sync(self) -> None:
        """Make the registrations match the session's offered tools."""
        offered = {tool.name: tool for tool in self.session.tools.values() if tool.webmcp}
        for name, registration in list(self._by_name.items()):
            if name not in offered:  # (a tool disposed and defined anew: gone, then added)
                del self._by_name[name]
                self._unregister(registration)
        for name, tool in offered.items():
            if name in self._by_name:
                continue
            registration = str(next(self._ids))
            self._by_name[name] = registration
            self._by_registration[registration] = tool
            self._registrar.register(json.dumps({"registration": registration,
                                                 **descriptor(tool)}, ensure_ascii=False))

    def _unregister(self, registration: str) -> None:
        self._by_registration.pop(registration, None)
        self._registrar.unregister(registration)

    # --- calls -------------------------------------------------------------------------

    def call(self, call_id: str, registration: str, input_json: str | None,
             aborted: bool = False) -> Coroutine[Any, Any, str]:
        """Start the call ``call_id`` (the page's id, for :meth:`abort`) of the tool
        registered as ``registration`` with ``input_json`` (None: the input had no JSON
        form). Starts it at once (a sync handler has answered when this returns); the
        coroutine returned gives its result's JSON text. ``aborted``: the caller's signal
        was aborted before the call reached the page, so nothing runs."""
        tool = self._by_registration.get(registration)
        if tool is None:
            return _answer(_encode(tool_error(
                TOOL_HANDLER_NOT_FOUND,
                "this WebMCP tool is no longer registered (the page removed or redefined "
                "it): list the tools again", retryable=False)))
        if aborted:
            return _answer(_encode(tool_error(
                TOOL_CANCELLED, f"{tool.name!r} was cancelled ({ABORT_REASON}) before it "
                "started", details={"reason": ABORT_REASON}, retryable=False)))
        if len(self._calls) >= MAX_CALLS:
            return _answer(_encode(tool_error(
                TOO_MANY_PENDING, f"the page already runs {MAX_CALLS} WebMCP calls: wait "
                "for some to finish", retryable=True)))
        if input_json is None:
            return _answer(_encode(invalid_args(
                f"the input for {tool.name!r} has no JSON form (a cycle, a BigInt, a "
                "function?)")))
        try:
            args = decode_json(input_json, max_bytes=MAX_INPUT_BYTES, what="the input")
        except ProtocolError as exc:
            return _answer(_encode(invalid_args(f"the input for {tool.name!r} cannot be "
                                                f"used: {exc.message}")))
        rec = self.session.start_request(tool.name, args, source="webmcp")
        if rec.answered:
            return _answer(rec.result_json)
        self._calls[call_id] = rec.tool_request_id
        return self._outcome(call_id, rec)

    async def _outcome(self, call_id: str, rec: InFlight) -> str:
        try:
            await rec.wait()
        finally:
            self._calls.pop(call_id, None)
        return rec.result_json

    def abort(self, call_id: str) -> bool:
        """The caller's signal aborted: cancel the call as ``session.cancel`` does
        (``ctx.cancelled``; ``TOOL_CANCELLED`` once the grace period has passed). False
        when it is not in flight."""
        request_id = self._calls.get(call_id)
        return request_id is not None and self.session.cancel(request_id, ABORT_REASON)


async def _answer(result_json: str) -> str:
    return result_json


def _encode(result: dict[str, Any]) -> str:
    return strictjson.encode(result)
