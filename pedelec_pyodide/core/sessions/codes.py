"""Core's codes for session-level problems, and the constants sessions share.

The ``error`` frames' codes for a page (parse errors use those of
:mod:`pedelec_pyodide.protocol`), and the error results Core itself gives a caller.
"""

from __future__ import annotations

from typing import TypeAlias

from ... import protocol, results

# Codes of the `error` frames Core sends for session-level problems (parse errors use
# the codes in pedelec_pyodide.protocol).
HELLO_REQUIRED = "HELLO_REQUIRED"
DUPLICATE_HELLO = "DUPLICATE_HELLO"
RESUME_REFUSED = "RESUME_REFUSED"
TURN_BUSY = "TURN_BUSY"
UNKNOWN_TURN = "UNKNOWN_TURN"
TURN_ID_TAKEN = "TURN_ID_TAKEN"
UNKNOWN_TOOL_REQUEST = protocol.UNKNOWN_TOOL_REQUEST
DUPLICATE_RESULT = "DUPLICATE_RESULT"
LATE_RESULT = protocol.LATE_RESULT
RATE_LIMITED = "RATE_LIMITED"
SESSION_CLOSED = "SESSION_CLOSED"
TOO_MANY_SESSIONS = "TOO_MANY_SESSIONS"  # then the connection is closed (CLOSE_TRY_AGAIN)
METADATA_TOO_LARGE = "METADATA_TOO_LARGE"

# Error results Core itself gives a caller (besides TOOL_TIMEOUT and TOOL_CANCELLED).
SESSION_EXPIRED = "SESSION_EXPIRED"
TOO_MANY_PENDING = results.TOO_MANY_PENDING
#: a caller was waiting on a node that handed the page's session over to another node
SESSION_MOVED = "SESSION_MOVED"

#: where a pending request is, as ``GET .../sessions/{id}`` shows it: what the page's
#: ``session.pending`` says
RequestStatus: TypeAlias = protocol.PendingStatus
#: characters of a progress message Core keeps (a frame may hold a MiB of it)
MAX_PROGRESS_MESSAGE_CHARS = 500
# Core's stop: at most this long for running turns to end, then for the store
SHUTDOWN_SECONDS = 1.5
