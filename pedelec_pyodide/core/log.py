"""Structured logs: one line per event, ``event=NAME key=value ...``; never a token. A
field quotes at most :data:`~pedelec_pyodide.text.MAX_EXCERPT` characters of its value
(a tool name an agent made up may be megabytes long: the line stays short, and it is
written in time bounded by that, not by the value)."""

from __future__ import annotations

import json
import logging
import re

from ..text import excerpt

# a field's value written as it is (others are JSON strings)
_BARE = re.compile(r"[\w\-.:/]+", re.ASCII)

logger = logging.getLogger("pedelec.core")


def log_event(event: str, /, *, level: int = logging.INFO, **fields: object) -> None:
    """Log one event. Fields that are None are left out; a field named like a token is
    refused outright, so a secret cannot reach a log line by accident."""
    if not logger.isEnabledFor(level):
        return
    parts = [f"event={event}"]
    for key, value in fields.items():
        if value is None:
            continue
        if "token" in key.lower():
            raise ValueError(f"log field {key!r} looks like a secret; tokens are never logged")
        parts.append(f"{key}={_format(value)}")
    logger.log(level, " ".join(parts))


def _format(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, (int, bool)):
        return str(value).lower() if isinstance(value, bool) else str(value)
    text = excerpt(str(value))
    if _BARE.fullmatch(text):
        return text
    return json.dumps(text, ensure_ascii=False)


def configure(level: int = logging.INFO) -> None:
    """Send Core's event lines to stderr (the CLI does this; embedding code may not)."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
