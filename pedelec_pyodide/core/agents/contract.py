"""The agent interface: one small async protocol every agent implements.

Core gives an agent a :class:`Turn` and awaits :meth:`Agent.run`. The agent decides
which tools to call; ``turn.call_tools`` sends them to the page together (they may finish
in any order) and returns their results in the order asked, error results included.
Core enforces the turn's step limit there, and deadlines per call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from ...errors import PedelecError
from ...results import is_error_result
from ..store import JsonText


@dataclass(frozen=True)
class ToolCallRequest:
    """One tool call an agent wants made."""

    tool: str
    args: Any
    call_id: str | None = None  # the model's own id for the call, when it has one


class _DecodedWhenRead:
    """A field given JSON text (:class:`JsonText`) decodes it the first time it is read,
    and keeps the value: an agent that never reads the field (a model agent reads its
    results) costs no decoding of what it holds, up to a frame of a page's arguments."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._slot = f"_{name}"

    def __get__(self, outcome: object, owner: type | None = None) -> Any:
        if outcome is None:
            return None  # (to dataclasses: the field's default)
        held = outcome.__dict__[self._slot]
        if isinstance(held, JsonText):
            held = outcome.__dict__[self._slot] = held.value()
        return held

    def __set__(self, outcome: object, value: Any) -> None:
        outcome.__dict__[self._slot] = value


@dataclass(frozen=True)
class ToolCallOutcome:
    """A tool call as it went: what was asked and the result the page (or Core) gave."""

    tool_request_id: str
    tool: str
    result: Any
    handled_by: str
    call_id: str | None = None
    duration_ms: float = 0.0
    #: ``args`` and ``result`` as Core keeps them, JSON text: an agent that keeps them
    #: past its step keeps these (decoded, what a page sends may take ~24 times the
    #: memory of its JSON)
    args_json: JsonText | None = None
    result_json: JsonText | None = None
    #: the call's args; given as JSON text (a :class:`JsonText`), decoded the first time
    #: they are read
    args: Any = _DecodedWhenRead()

    @property
    def is_error(self) -> bool:
        return is_error_result(self.result)


class StepLimitExceeded(PedelecError):
    """The agent asked for more tool-calling steps than the turn allows."""


class Turn(Protocol):
    """What Core gives an agent for one turn."""

    turn_id: str
    session_id: str  # the same for every turn of a session, across restarts of Core
    text: str
    history: list[dict[str, Any]]  # the agent's own record of earlier turns; it may append
    max_steps: int
    usage: dict[str, int]  # token counts the agent adds to; Core logs them in turn.end

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The session's tool metadata, as the page sent it when the turn started (a
        fresh copy on each access: Core keeps it as JSON, see ``PageMetadata``)."""
        ...

    async def call_tools(self, calls: list[ToolCallRequest]) -> list[ToolCallOutcome]:
        """Run one step's calls in parallel; raises StepLimitExceeded past ``max_steps``."""
        ...

    async def say(self, text: str) -> None:
        """Stream a piece of the reply to the page (``turn.delta``)."""
        ...

    def remember(self, entry: dict[str, Any]) -> None:
        """Add ``entry`` to ``history`` without reading it: an agent that never reads its
        history spares Core decoding it every turn (the same as ``history.append``)."""
        ...


class Agent(Protocol):
    async def run(self, turn: Turn) -> str:
        """Run the turn; return the final reply text. Raise to fail the turn."""
        ...


@dataclass
class AgentInfo:
    """How an agent describes itself in logs and the control API."""

    name: str
    details: dict[str, Any] = field(default_factory=dict)
