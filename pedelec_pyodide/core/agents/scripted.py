"""A scripted agent for tests: it makes exactly the calls and says exactly the text given."""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeAlias

from .contract import AgentInfo, ToolCallOutcome, ToolCallRequest, Turn

Step: TypeAlias = (
    "list[ToolCallRequest] | str | BaseException"
    " | Callable[[list[ToolCallOutcome]], Step | Awaitable[Step]]"
)
"""One step of a script:

* a list of :class:`ToolCallRequest` — one ``turn.call_tools`` step (sent together);
* a ``str`` — said with ``turn.say``; the reply is all the text said, joined;
* an exception — raised, so the turn fails;
* a callable — given the outcomes of the latest call step (``[]`` before any), it returns
  (or, if async, resolves to) the step to take: this is how a script reacts to results,
  or waits on an event a test controls.
"""


class ScriptedAgent:
    """Runs ``steps`` in order on every turn, through ``turn.call_tools`` and ``turn.say``.

    A list of steps starts from the beginning on each run; an iterator is consumed across
    runs. Every call step's outcomes are appended to :attr:`outcomes`.
    """

    def __init__(self, steps: Iterable[Step]) -> None:
        self._steps = steps
        self.outcomes: list[list[ToolCallOutcome]] = []
        self.info = AgentInfo(name="scripted")

    @classmethod
    def forever(cls, tool: str, args: dict[str, Any] | None = None) -> ScriptedAgent:
        """An agent that calls ``tool`` once per step and never stops on its own: it runs
        until the turn's step limit (``StepLimitExceeded``) or a cancel ends it."""
        return cls(itertools.repeat([ToolCallRequest(tool, {} if args is None else args)]))

    async def run(self, turn: Turn) -> str:
        said: list[str] = []
        latest: list[ToolCallOutcome] = []
        for step in self._steps:
            while callable(step):
                produced = step(latest)
                step = await produced if inspect.isawaitable(produced) else produced
            if isinstance(step, BaseException):
                raise step
            if isinstance(step, str):
                await turn.say(step)
                said.append(step)
            else:
                latest = await turn.call_tools(list(step))
                self.outcomes.append(latest)
        return "".join(said)
