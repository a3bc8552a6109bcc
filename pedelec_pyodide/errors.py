"""The package's exceptions: one base, :class:`PedelecError`, so a caller can catch them all.

A leaf module (it imports nothing from the package), so every other module can use it.
Exceptions that also mean something standard keep that meaning as a second base
(``RuntimeError``, ``ConnectionError``, ``ValueError``).
"""

from __future__ import annotations


class PedelecError(Exception):
    """Base of every exception pedelec-pyodide raises on purpose."""


class SessionClosedError(PedelecError, RuntimeError):
    """The session was closed; nothing more can be sent or run through it."""


class NotConnectedError(PedelecError, RuntimeError):
    """The operation needs Core, and the session has no connection to it."""


class TurnError(PedelecError):
    """A turn that ended ``failed`` or ``cancelled``; ``status``, ``code`` and ``text`` say how."""

    def __init__(self, status: str, code: str, message: str, text: str) -> None:
        super().__init__(f"turn {status}: {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.text = text


class CoreUnreachableError(PedelecError, ConnectionError):
    """The first connection to Core failed (nothing listening, wrong URL, refused)."""


class OriginRefusedError(CoreUnreachableError):
    """Core does not let pages from this origin open a session (``--allow-origin``)."""


class ApprovalUnavailable(PedelecError):
    """Raised by an approver that has nobody to ask (no approval UI is mounted): the
    request is denied ``TOOL_DENIED``, saying no approver is there."""
