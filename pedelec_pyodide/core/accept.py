"""The event loop Core runs in: asyncio's, with its accept loop bounded.

When ``accept()`` fails for want of file descriptors (or memory), asyncio removes the
listening socket's reader and tries again a second later; but its accept loop does not
stop there (CPython gh-151615, fixed upstream after 3.11): it calls ``accept()`` again for
every slot of the backlog (2,048 here), each failure logged with its traceback and
scheduling one more retry. At the limit Core spent ~95% of a core writing those logs.
:class:`CoreEventLoop` ends each round of accepts at the first such failure: one retry a
second, one log line, and the rest of Core keeps its CPU.

A round also takes at most :data:`ACCEPTS_PER_ROUND` connections (asyncio takes up to
the backlog, 2,048): the connections of a burst are set up a batch per turn of the loop,
between the work of the connections already there, not all in one turn of ~0.1 ms each.
"""

from __future__ import annotations

import asyncio
import errno
import socket
from typing import Any

#: accept() errors after which asyncio waits a second before accepting again
OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
#: connections accepted per turn of the event loop; the rest wait in the kernel's backlog
ACCEPTS_PER_ROUND = 32


class _ListeningSocket:
    """The listening socket as one round of asyncio's accept loop sees it: after
    :data:`ACCEPTS_PER_ROUND` connections, or one out-of-resources failure, the round's
    other accepts find nothing waiting."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._left = ACCEPTS_PER_ROUND
        self._exhausted = False

    def accept(self) -> tuple[socket.socket, Any]:
        if self._exhausted or self._left == 0:
            raise BlockingIOError(errno.EAGAIN, "accepting more on the loop's next turn")
        self._left -= 1
        try:
            return self.sock.accept()
        except OSError as exc:
            if exc.errno in OUT_OF_RESOURCES:
                self._exhausted = True
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)


class CoreEventLoop(asyncio.SelectorEventLoop):
    """asyncio's selector loop whose accept rounds are bounded (see the module's
    docstring)."""

    def _accept_connection(self, protocol_factory: Any, sock: Any,
                           *args: Any, **kwargs: Any) -> None:
        if isinstance(sock, _ListeningSocket):  # the retry asyncio scheduled with it
            sock = sock.sock
        super()._accept_connection(  # type: ignore[misc]  # private in typeshed
            protocol_factory, _ListeningSocket(sock), *args, **kwargs)


def new_event_loop() -> asyncio.AbstractEventLoop:
    """The loop factory uvicorn runs Core in (``loop=``)."""
    return CoreEventLoop()
