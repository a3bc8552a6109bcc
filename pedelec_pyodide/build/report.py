"""How a build step reports: progress lines to a :data:`Log`; when something it needs is
missing, a :class:`ProvisionError` saying what and how to get it."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable

from ..errors import PedelecError

__all__ = ["LiteError", "Log", "ProvisionError", "check_pip", "tail"]

#: where a step writes its progress, one line per call
Log = Callable[[str], None]


class ProvisionError(PedelecError, RuntimeError):
    """Something needed is missing; the message says what and how to get it."""


class LiteError(PedelecError, RuntimeError):
    """The JupyterLite site cannot be built; the message says what is missing and how to
    get it."""


def tail(text: str, lines: int = 15) -> str:
    """The last ``lines`` of a failed command's output, for the error's message."""
    return "\n".join(text.strip().splitlines()[-lines:])


def check_pip() -> None:
    """Raise :class:`ProvisionError` unless this Python has pip (wheels come through it)."""
    if importlib.util.find_spec("pip") is None:
        raise ProvisionError(
            f"pip is not available for {sys.executable}: it is needed to fetch wheels "
            f"from PyPI. Install it with `{sys.executable} -m ensurepip --upgrade` "
            "(Debian: `apt install python3-pip`)."
        )
