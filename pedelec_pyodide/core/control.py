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

from .. import __version__
from ..tools import NAME_PATTERN
from .log import log_event
from .sessions import TURN_BUSY, CoreSession, Registry
from .turns import start_turn

UNAUTHORIZED = "UNAUTHORIZED"
BAD_REQUEST = "BAD_REQUEST"
SESSION_NOT_FOUND = "SESSION_NOT_FOUND"


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


def _authorize(request: Request) -> None:
    expected: str = request.app.state.admin_token
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        given.strip().encode(), expected.encode()
    ):
        raise ApiError(401, UNAUTHORIZED,
                       "this API needs the header 'Authorization: Bearer <admin token>'")


def _session(request: Request) -> CoreSession:
    session_id = request.path_params["session_id"]
    session = _registry(request).get(session_id)
    if session is None or session.closed:
        raise ApiError(404, SESSION_NOT_FOUND, f"no session {session_id!r}")
    return session


async def _json_object(request: Request) -> dict[str, Any]:
    body = await request.body()
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, BAD_REQUEST, f"the body must be a JSON object: {exc}") from None
    if not isinstance(data, dict):
        raise ApiError(400, BAD_REQUEST, "the body must be a JSON object")
    return data


def _guarded(handler: Any) -> Any:
    async def endpoint(request: Request) -> Response:
        try:
            _authorize(request)
            response: Response = await handler(request)
            return response
        except ApiError as exc:
            return exc.response()

    endpoint.__name__ = handler.__name__
    return endpoint


async def health(request: Request) -> Response:
    registry = _registry(request)
    return JSONResponse({
        "status": "ok",
        "version": __version__,
        "sessions": len(registry.sessions),
        "pyodide": request.app.state.pyodide.status,
    })


@_guarded
async def list_sessions(request: Request) -> Response:
    sessions = [s.describe() for s in _registry(request).sessions.values() if not s.closed]
    return JSONResponse({"sessions": sessions})


@_guarded
async def get_session(request: Request) -> Response:
    return JSONResponse(_session(request).describe(full=True))


@_guarded
async def tool_call(request: Request) -> Response:
    session = _session(request)
    body = await _json_object(request)
    tool = body.get("tool")
    if not isinstance(tool, str) or not NAME_PATTERN.match(tool):
        raise ApiError(400, BAD_REQUEST,
                       "'tool' must be a tool name (1 to 64 letters, digits, '_' or '-')")
    args = body.get("args", {})
    timeout_ms = body.get("timeoutMs")
    if timeout_ms is not None and (
        isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or timeout_ms <= 0
    ):
        raise ApiError(400, BAD_REQUEST, "'timeoutMs' must be a positive integer")
    pending = session.open_request(tool, args, timeout_ms=timeout_ms)
    await session.registry.store.flush()
    session.send_request(pending)
    result, handled_by = await pending.future
    return JSONResponse(
        {"toolRequestId": pending.id, "result": result, "handledBy": handled_by})


@_guarded
async def turn(request: Request) -> Response:
    session = _session(request)
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
    return JSONResponse(answer)
