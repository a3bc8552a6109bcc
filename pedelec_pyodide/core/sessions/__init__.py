"""Sessions local to one Core process: each page's session, its pending tool requests
and their deadlines, the frames fitted to the page, and the registry holding them; the
turns run in a session (:mod:`.turns`) and the results kept for callers' retries
(:mod:`.idempotency`).

Nothing here knows of other nodes: the cluster (:mod:`..cluster`) builds on this package,
never the reverse.
"""

from .codes import (
    DUPLICATE_HELLO,
    DUPLICATE_RESULT,
    HELLO_REQUIRED,
    LATE_RESULT,
    MAX_PROGRESS_MESSAGE_CHARS,
    METADATA_TOO_LARGE,
    RATE_LIMITED,
    RESUME_REFUSED,
    SESSION_CLOSED,
    SESSION_EXPIRED,
    SESSION_MOVED,
    SHUTDOWN_SECONDS,
    TOO_MANY_PENDING,
    TOO_MANY_SESSIONS,
    TURN_BUSY,
    TURN_ID_TAKEN,
    UNKNOWN_TOOL_REQUEST,
    UNKNOWN_TURN,
    RequestStatus,
)
from .frames import (
    FORGOTTEN_REPLY,
    CheckedRequest,
    EndedTurn,
    checked_call,
    checked_request_frame,
    delta_frames,
    end_frame,
    fitted_end_frame,
    new_request_id,
    refused_request,
)
from .metadata import PageMetadata, SessionRefused, page_metadata
from .pending import RequestProgress, TrackedRequest
from .registry import Registry
from .session import Connection, CoreSession, RunningTurn, SessionOwner

__all__ = [
    "DUPLICATE_HELLO", "DUPLICATE_RESULT", "FORGOTTEN_REPLY", "HELLO_REQUIRED",
    "LATE_RESULT", "MAX_PROGRESS_MESSAGE_CHARS", "METADATA_TOO_LARGE", "RATE_LIMITED",
    "RESUME_REFUSED", "SESSION_CLOSED", "SESSION_EXPIRED", "SESSION_MOVED",
    "SHUTDOWN_SECONDS", "TOO_MANY_PENDING", "TOO_MANY_SESSIONS", "TURN_BUSY",
    "TURN_ID_TAKEN", "UNKNOWN_TOOL_REQUEST", "UNKNOWN_TURN", "CheckedRequest",
    "Connection", "CoreSession", "EndedTurn", "PageMetadata", "Registry", "RequestProgress",
    "RequestStatus", "RunningTurn", "SessionOwner", "SessionRefused", "TrackedRequest",
    "checked_call", "checked_request_frame", "delta_frames", "end_frame",
    "fitted_end_frame", "new_request_id", "page_metadata", "refused_request",
]
