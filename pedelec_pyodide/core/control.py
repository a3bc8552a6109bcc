"""The control API (``/pedelec/v1/...``, ``Authorization: Bearer <admin token>``) and health.

Errors are JSON: ``{"error": {"code", "message"}}`` with a 4xx status.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import secrets
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .. import __version__, protocol
from ..tools import NAME_PATTERN
from .config import MAX_TIMEOUT_MS, is_timeout_ms
from .log import log_event
from .sessions import (
    TURN_BUSY,
    CoreSession,
    Registry,
    checked_request_frame,
    new_request_id,
)
from .turns import start_turn

UNAUTHORIZED = "UNAUTHORIZED"
BAD_REQUEST = "BAD_REQUEST"
SESSION_NOT_FOUND = "SESSION_NOT_FOUND"
PAYLOAD_TOO_LARGE = "PAYLOAD_TOO_LARGE"


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message

    def response(self) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else None
        return JSONResponse({"error": {"code": self.code, "message": self.message}},
                            status_code=self.status, headers=headers)


def _registry(request: Request) -> Registry:
    registry: Registry = request.app.state.registry
    return registry


def authorize(request: Request) -> None:
    """Raise a 401 :class:`ApiError` unless the request carries the admin token."""
    expected: str = request.app.state.admin_token
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        given.strip().encode(), expected.encode()
    ):
        raise ApiError(401, UNAUTHORIZED,
                       "this API needs the header 'Authorization: Bearer <admin token>'")


def path_session(request: Request) -> CoreSession:
    """The live session named by the path's ``session_id``; a 404 :class:`ApiError` if none."""
    session_id = request.path_params["session_id"]
    session = _registry(request).get(session_id)
    if session is None or session.closed:
        raise ApiError(404, SESSION_NOT_FOUND, f"no session {session_id!r}")
    return session


async def _json_object(request: Request) -> dict[str, Any]:
    limit = _registry(request).config.max_frame_bytes
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():  # read no more than the limit allows
        size += len(chunk)
        if size > limit:
            raise ApiError(413, PAYLOAD_TOO_LARGE,
                           f"the body is over {limit} bytes, the largest frame a page takes")
        chunks.append(chunk)
    body = b"".join(chunks)
    try:
        data = json.loads(body)
        # what pages cannot take: NaN, Infinity, lone surrogates (their frames refuse them)
        json.dumps(data, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except (ValueError, UnicodeError, RecursionError) as exc:
        raise ApiError(400, BAD_REQUEST, f"the body must be a JSON object: {exc}") from None
    if not isinstance(data, dict):
        raise ApiError(400, BAD_REQUEST, "the body must be a JSON object")
    return data


def _guarded(handler: Any) -> Any:
    async def endpoint(request: Request) -> Response:
        try:
            authorize(request)
            response: Response = await handler(request)
            return response
        except ApiError as exc:
            return exc.response()

    endpoint.__name__ = handler.__name__
    return endpoint


async def health(request: Request) -> Response:
    registry = _registry(request)
    answer: dict[str, Any] = {
        "status": "ok",
        "version": __version__,
        "sessions": len(registry.sessions),
        "pyodide": request.app.state.pyodide.status,
    }
    problem = registry.store.problem
    if problem is not None:  # Core answers, but what it is told may not survive a restart
        answer["status"] = "degraded"
        answer["reason"] = f"store: {problem}"
    return JSONResponse(answer)


@_guarded
async def list_sessions(request: Request) -> Response:
    sessions = [s.describe() for s in _registry(request).sessions.values() if not s.closed]
    return JSONResponse({"sessions": sessions})


@_guarded
async def get_session(request: Request) -> Response:
    return JSONResponse(path_session(request).describe(full=True))


@_guarded
async def tool_call(request: Request) -> Response:
    session = path_session(request)
    body = await _json_object(request)
    tool = body.get("tool")
    if not isinstance(tool, str) or not NAME_PATTERN.match(tool):
        raise ApiError(400, BAD_REQUEST,
                       "'tool' must be a tool name (1 to 64 letters, digits, '_' or '-')")
    args = body.get("args", {})
    timeout_ms = body.get("timeoutMs")
    if timeout_ms is not None and not is_timeout_ms(timeout_ms):
        raise ApiError(400, BAD_REQUEST,
                       f"'timeoutMs' must be a positive integer, at most {MAX_TIMEOUT_MS} (24 h)")
    request_id = new_request_id()
    tool_request = protocol.ToolRequest(tool_request_id=request_id, tool=tool, args=args)
    try:  # the same check as every request's, answered here as the caller's HTTP error
        frame = checked_request_frame(tool_request, session.registry.config.max_frame_bytes)
    except protocol.ProtocolError as exc:
        status = 413 if exc.code == protocol.FRAME_TOO_LARGE else 400
        raise ApiError(status, PAYLOAD_TOO_LARGE if status == 413 else BAD_REQUEST,
                       f"the page would refuse this tool.request: {exc.message}") from None
    request_id, result, handled_by = await session.call_tool(
        tool, args, timeout_ms=timeout_ms, checked=(request_id, frame))
    return JSONResponse(
        {"toolRequestId": request_id, "result": result, "handledBy": handled_by})


@_guarded
async def turn(request: Request) -> Response:
    session = path_session(request)
    body = await _json_object(request)
    text = body.get("text")
    if not isinstance(text, str):
        raise ApiError(400, BAD_REQUEST, "'text' must be a string")
    if session.turn is not None:
        raise ApiError(409, TURN_BUSY,
                       f"turn {session.turn.turn_id!r} is still running; one turn at a time")
    turn_id = secrets.token_hex(8)
    log_event("control.turn", session=session.id, turn=turn_id)
    runner = start_turn(session, turn_id, text)
    assert runner.task is not None
    record = await asyncio.shield(runner.task)
    answer: dict[str, Any] = {
        "turnId": record.id, "status": record.status, "text": record.final_text,
        "toolCalls": record.tool_calls,
    }
    if record.error is not None:
        answer["error"] = record.error
    if record.usage:
        answer["usage"] = record.usage
    return JSONResponse(answer)
