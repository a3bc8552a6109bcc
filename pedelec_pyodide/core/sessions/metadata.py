"""What a page tells Core about itself (its tools, its client info), as a session keeps
it, and the refusal of a hello or tools.update Core will not take."""

from __future__ import annotations

from typing import Any, NamedTuple

from ...errors import PedelecError
from ..store import kept_size
from .codes import METADATA_TOO_LARGE


class SessionRefused(PedelecError):
    """A hello or tools.update Core will not take; ``code`` is the error frame's."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class PageMetadata(NamedTuple):
    """What a page told Core about itself, as a session keeps it: JSON text (decoded,
    metadata takes up to ~24 times the memory of its JSON) and the tools' names."""

    tools_json: str
    client_json: str
    names: tuple[str, ...]


def page_metadata(tools: list[dict[str, Any]], tools_json: str, client_json: str,
                  limit: int) -> PageMetadata:
    """A hello's or tools.update's metadata, or :class:`SessionRefused` when the tools
    and client info together are over ``limit`` bytes of JSON. ``tools_json``: the tools
    as :func:`kept_json` text (made with the frame's parse: off the event loop). The
    limit counts their UTF-8 bytes, or their bytes of memory where those are more."""
    size = kept_size(tools_json) + kept_size(client_json)
    if size > limit:
        raise SessionRefused(METADATA_TOO_LARGE, (
            f"the tool metadata and client info are {size} bytes as JSON; a session may "
            f"hold at most {limit} (--max-metadata-bytes)"))
    return PageMetadata(tools_json, client_json, tuple(str(tool["name"]) for tool in tools))
