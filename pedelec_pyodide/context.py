"""What a handler and an approver see of a request: :class:`ToolContext` and
:class:`ApprovalRequest`.

A leaf module (it imports nothing from the package): ``tools`` needs ``ToolContext`` to
derive a typed handler's signature, and the dispatch engine builds both. A context is a
view of the engine's private record of a request in flight; it holds no state of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any, Literal, Protocol

#: Who asked for a request: Core (its agent, MCP clients, the control API), the browser's
#: own agent through WebMCP, or the page's own code (``session.dispatch``).
Source = Literal["core", "webmcp", "local"]


class _Record(Protocol):
    """The part of the engine's in-flight record a context reads."""

    tool: str
    tool_request_id: str
    turn_id: str | None

    @property
    def session(self) -> Any: ...

    @property
    def active(self) -> bool: ...

    @property
    def cancelled(self) -> bool: ...

    def report(self, progress: float, total: float | None = None,
               message: str | None = None) -> None: ...

    def wait_begin(self, reason: str | None) -> None: ...

    def wait_end(self) -> None: ...


class Progress(Protocol):
    def __call__(self, progress: float, total: float | None = None,
                 message: str | None = None) -> None: ...


class ToolContext:
    """What a handler knows about the request it is running, and how it reports on it.

    ``ctx.progress(progress, total=None, message=None)`` reports how far the request has
    got. Never blocks; sent to Core (and the page's ``toolprogress`` event) at most ~10
    times a second, the latest value kept and the last one sent before the result.
    ``progress`` must be a finite number greater than the one before (``ValueError``
    otherwise); ``total`` a finite number when known; ``message`` a short text (cut to
    1,000 characters). Ignored once the request has been answered. (An attribute bound
    to the request's record, not a method: a handler may call it for every item, and a
    call through a method would cost a second Python call each time.)
    """

    __slots__ = ("_record", "progress")

    def __init__(self, record: _Record) -> None:
        self._record = record
        self.progress: Progress = record.report

    @property
    def tool(self) -> str:
        return self._record.tool

    @property
    def tool_request_id(self) -> str:
        return self._record.tool_request_id

    @property
    def turn_id(self) -> str | None:
        return self._record.turn_id

    @property
    def session(self) -> Any:
        """The :class:`~pedelec_pyodide.Session` running the request."""
        return self._record.session

    @property
    def active(self) -> bool:
        """The handler's registration is still current and the session still open."""
        return self._record.active

    @property
    def cancelled(self) -> bool:
        """The request was cancelled (``session.cancel``, Core's deadline, a cancelled
        turn) or the session closed: stop early and return what makes sense."""
        return self._record.cancelled

    def waiting_for_user(self, reason: str | None = None) -> WaitingForUser:
        """``async with ctx.waiting_for_user("confirm the address"): ...`` around code that
        waits for a person: Core pauses the request's deadline meanwhile."""
        return WaitingForUser(self._record, reason)

    def __repr__(self) -> str:
        return f"<ToolContext {self.tool} {self.tool_request_id}>"


class WaitingForUser:
    """The async context manager of :meth:`ToolContext.waiting_for_user`; the request's
    status is ``waiting_for_user`` inside it, and it is left on any exit (an exception,
    a cancellation)."""

    __slots__ = ("_reason", "_record")

    def __init__(self, record: _Record, reason: str | None) -> None:
        if reason is not None and not isinstance(reason, str):
            raise TypeError(f"waiting_for_user: reason must be a string, got "
                            f"{type(reason).__name__}")
        self._record = record
        self._reason = reason

    async def __aenter__(self) -> None:
        self._record.wait_begin(self._reason)

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        traceback: TracebackType | None) -> None:
        self._record.wait_end()


class ApprovalRequest:
    """A request that needs the user's approval before its handler runs: what an approver
    (``session.on_approval(handler)``) is asked about. ``handler(request)`` returns (or
    resolves to) ``True`` to run it; anything else denies it. ``return request.deny(
    "reason")`` denies with a reason the agent sees (``details.reason``).

    A request can be answered while its approver is still asking: cancelled
    (``session.cancel``, Core's deadline, a cancelled turn) or its session closed. Then
    :attr:`withdrawn` is True, an ``async`` approver's wait is cancelled
    (``asyncio.CancelledError``), and a verdict given later is ignored."""

    __slots__ = ("_on_approve", "_on_withdrawn", "approved", "args", "reason", "source", "tool",
                 "tool_request_id", "turn_id", "withdrawn")

    def __init__(self, tool: str, args: Any, tool_request_id: str, turn_id: str | None,
                 on_approve: Callable[[], None] | None = None,
                 source: Source = "local") -> None:
        self.tool = tool
        self.args = args
        self.tool_request_id = tool_request_id
        self.turn_id = turn_id
        #: who asked: ``core``, ``webmcp`` (the browser's agent) or ``local``; an approver
        #: may decide by it (``return request.source != "webmcp"``)
        self.source: Source = source
        #: why it was denied, when the approver said (see :meth:`deny`)
        self.reason: str | None = None
        self.approved = False
        #: answered without the approver's verdict (cancelled, the session closed): a
        #: question still shown to the user should be taken down
        self.withdrawn = False
        self._on_approve = on_approve
        self._on_withdrawn: list[Callable[[], None]] = []

    def approve(self) -> bool:
        """Record the approval at once (it survives a reload from this moment, before the
        handler runs) and return ``True``: ``return request.approve()``."""
        if not self.approved and not self.withdrawn:
            self.approved = True
            if self._on_approve is not None:
                self._on_approve()
        return True

    def withdraw(self) -> None:
        """Answered without the approver's verdict: :attr:`withdrawn` becomes True, and
        each :meth:`on_withdrawn` hook is called now, before the request's answer goes out
        (a question is taken down before the request reads as done)."""
        if self.withdrawn:
            return
        self.withdrawn = True
        hooks, self._on_withdrawn = self._on_withdrawn, []
        for hook in hooks:
            hook()

    def on_withdrawn(self, hook: Callable[[], None]) -> None:
        """Call ``hook()`` once, when the request is withdrawn (see :meth:`withdraw`)."""
        self._on_withdrawn.append(hook)

    def deny(self, reason: str | None = None) -> bool:
        """Record why, and return ``False``: ``return request.deny("not on Fridays")``."""
        self.reason = reason
        return False

    def __repr__(self) -> str:
        return f"<ApprovalRequest {self.tool} {self.tool_request_id}>"
