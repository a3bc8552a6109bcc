"""A caller hanging up, told by the server rather than watched for.

ASGI says a hang-up through ``receive()``: a request whose body is read learns of it only
by awaiting ``receive()`` until it says ``http.disconnect``, a task of its own beside the
one awaiting its answer. Core's HTTP protocol (:mod:`.http_limits`) and the cluster's
node-to-node calls (:mod:`..cluster.routing`) put a :class:`HangUp` in the scope instead:
a future the connection's loss completes, so a handler waiting for a tool's result
notices its caller going at no cost per request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from starlette.types import Scope

#: where a request's scope holds its :class:`HangUp` (``scope["extensions"][EXTENSION]``)
EXTENSION = "pedelec.hangup"


class HangUp:
    """One request's caller: :meth:`done` is complete once it has hung up."""

    __slots__ = ("_done", "_resume_reading")

    def __init__(self, resume_reading: Callable[[], None] | None = None) -> None:
        self._done: asyncio.Future[None] | None = None
        #: a connection whose reading is paused (a request pipelined behind) would not
        #: see its peer close: reading resumes while someone waits, as ``receive()`` does
        self._resume_reading = resume_reading

    def done(self) -> asyncio.Future[None]:
        """A future completed when the caller hangs up (at once, if it has)."""
        if self._done is None:
            self._done = asyncio.get_running_loop().create_future()
        if self._resume_reading is not None:
            self._resume_reading()
        return self._done

    @property
    def awaited(self) -> bool:
        """Whether a handler has asked to hear of it (:meth:`done`)."""
        return self._done is not None

    def hung_up(self) -> None:
        """The caller is gone (the server calls this once)."""
        if self._done is None:
            self._done = asyncio.get_running_loop().create_future()
        if not self._done.done():
            self._done.set_result(None)


def hang_up_of(scope: Scope) -> HangUp | None:
    """The request's :class:`HangUp`; None when Core is served other than by its own
    protocols (then ``receive()`` is the only way to hear of it)."""
    hang_up = (scope.get("extensions") or {}).get(EXTENSION)
    return hang_up if isinstance(hang_up, HangUp) else None
