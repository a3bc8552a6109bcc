"""What a store raises, and the error codes Core answers with because of it."""

from __future__ import annotations

from ...errors import PedelecError

#: the error code of a request that could not be stored (so it was not sent)
STORE_FAILED = "STORE_FAILED"
#: the control API's code (HTTP 503) while the store cannot be reached
STORE_UNAVAILABLE = "STORE_UNAVAILABLE"
# the longest reason quoted in an error or a log line
MAX_REASON_CHARS = 200


class StoreError(PedelecError):
    """A write the store could not make, or a flush that could not wait any longer."""

    code = STORE_FAILED


class WriteFailed(StoreError):
    """One write failed: its value cannot be stored, or the store refused it."""


class FlushTimeout(StoreError):
    """A flush's deadline passed before the writes before it were stored."""


class WriterStopped(StoreError):
    """The store's writer has stopped (a bug): nothing more is stored."""


class StoreRefused(StoreError):
    """The store answered but refused the command (Redis: a key of the wrong type,
    out of memory, too few replicas, snapshots failing): not tried again by itself."""


class StoreUnavailable(StoreError):
    """The store cannot be reached (a server down, a connection lost). Raised by a
    backend's writes: the writer keeps them and tries again until the store is back."""

    code = STORE_UNAVAILABLE


def reason(exc: BaseException) -> str:
    """An exception as one short line for an error or a log."""
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= MAX_REASON_CHARS else text[:MAX_REASON_CHARS] + "..."
