"""``POST /pedelec/v1/sessions/{id}/tool-calls`` straight to its handler.

The control API's most frequent request skips what Starlette puts between Core's own
middleware and a route: its exception layer, the router trying each route's pattern in
turn, and the route's wrapper (another exception layer, a closure per request). Each
wraps ``send`` once more, and a call's answer passes through every wrapper. The lane is
the innermost middleware: the Host check and the cluster's router have run, as for any
request; the handler is the route's own (:func:`.control.tool_call`), so the checks and
the answers are the same. Anything else, a trailing slash or another method included,
goes on to the router as before.
"""

from __future__ import annotations

import re

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from . import control

#: the route's path (Starlette's ``{session_id}`` matches ``[^/]+``)
_TOOL_CALLS = re.compile(r"/pedelec/v1/sessions/([^/]+)/tool-calls")


class ToolCallLane:
    """ASGI middleware: a tool call goes to :func:`.control.tool_call` at once."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # (under a root path, the router strips it first: those go its way)
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path"):
            match = _TOOL_CALLS.fullmatch(scope["path"])
            if match is not None:
                scope["path_params"] = {"session_id": match.group(1)}
                response = await control.tool_call(Request(scope, receive))
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
