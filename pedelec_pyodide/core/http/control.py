"""The control API (``/pedelec/v1/...``, ``Authorization: Bearer <admin token>``) and health.

Errors are JSON: ``{"error": {"code", "message"}}`` with a 4xx status.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import secrets
from collections.abc import AsyncIterator
from typing import Any, NamedTuple

from starlette import responses
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ... import __version__, protocol, strictjson
from ...errors import PedelecError
from ...text import lone_surrogate_in_json, not_unicode, quote
from ...tools import NAME_PATTERN
from ..config import MAX_TIMEOUT_MS, is_timeout_ms
from ..log import log_event
from ..offload import LARGE_CHARS, is_large, off_loop_when
from ..sessions import (
    TURN_BUSY,
    CheckedRequest,
    CoreSession,
    Registry,
    RequestProgress,
    TrackedRequest,
    checked_call,
)
from ..sessions.idempotency import (
    HEADER,
    IDEMPOTENCY_KEY_REUSED,
    MAX_KEY_CHARS,
    KeyReused,
    claim,
    fingerprint,
)
from ..sessions.turns import start_turn
from ..store import (
    CORE_CALL,
    STORE_UNAVAILABLE,
    TOOL_CALL,
    TURN,
    IdempotencyRecord,
    KeyKind,
    StoreError,
    TurnRecord,
    as_text,
    dump_json,
)
from .hangup import hang_up_of

UNAUTHORIZED = "UNAUTHORIZED"
BAD_REQUEST = "BAD_REQUEST"
SESSION_NOT_FOUND = "SESSION_NOT_FOUND"
PAYLOAD_TOO_LARGE = "PAYLOAD_TOO_LARGE"
TOOL_REQUEST_NOT_FOUND = "TOOL_REQUEST_NOT_FOUND"
# a tool call with "waitForPage": false to a session whose page is not connected (HTTP 409)
PAGE_NOT_CONNECTED = "PAGE_NOT_CONNECTED"
# a request Core was still answering when it stopped (HTTP 503)
CORE_STOPPING = "CORE_STOPPING"
# the longest excerpt of a caller's value quoted in an error message
EXCERPT_CHARS = 40
#: the media type a caller accepts to have a tool call's progress streamed
EVENT_STREAM = "text/event-stream"
#: set in the ASGI scope of a call whose ``Idempotency-Key`` the cluster router made
#: (cluster/routing.py), not the caller: only that router retries with it, while it waits
ROUTE_KEY = "pedelec.route_key"


class JSONResponse(responses.JSONResponse):
    """Starlette's, writing what Core keeps as JSON text (a turn's tool calls) as the
    values they are."""

    def render(self, content: Any) -> bytes:
        return dump_json(content).encode("utf-8")


# what a 503 (the store out of reach) tells the caller to wait before trying again
RETRY_AFTER_SECONDS = "1"


class ApiError(PedelecError):
    """A control-API answer other than success: its HTTP ``status`` and error ``code``."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message

    def response(self) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else (
            {"Retry-After": RETRY_AFTER_SECONDS} if self.status == 503 else None)
        return JSONResponse({"error": {"code": self.code, "message": self.message}},
                            status_code=self.status, headers=headers)


def _store_reachable(session: CoreSession) -> None:
    """A 503 :class:`ApiError` while the store cannot be reached: what Core would start
    now it could not keep (a request must be stored before it is sent)."""
    store = session.registry.store
    if store.unavailable:
        raise ApiError(503, STORE_UNAVAILABLE, f"Core cannot reach its store, so it started "
                       f"nothing: {store.problem}; try again later")


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
        raise ApiError(404, SESSION_NOT_FOUND, f"no session {quote(session_id)}")
    return session


async def read_body(request: Request, limit: int) -> bytes:
    """The request's body, read no further than ``limit`` (the largest frame a page takes)
    allows: over it a 413 :class:`ApiError`; a caller who hangs up before its end gets a
    400 that nobody reads (and the log no traceback)."""
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ApiError(413, PAYLOAD_TOO_LARGE,
                               f"the body is over {limit} bytes, the largest frame a page takes")
            chunks.append(chunk)
    except ClientDisconnect:
        raise ApiError(400, BAD_REQUEST, "the caller hung up before the body ended") from None
    return b"".join(chunks)


async def _body_text(request: Request) -> str:
    body = await read_body(request, _registry(request).config.max_frame_bytes)
    try:
        return body.decode("utf-8")  # strict: no encoded surrogates either
    except UnicodeDecodeError as exc:
        raise ApiError(400, BAD_REQUEST, f"the body is not UTF-8 text: {exc}") from None


def _decoded_object(text: str) -> dict[str, Any]:
    try:
        data = strictjson.decode(text)  # no NaN, no Infinity: a page's frames refuse them
    except (ValueError, RecursionError) as exc:
        raise ApiError(400, BAD_REQUEST, f"the body must be a JSON object: {exc}") from None
    where = lone_surrogate_in_json(text, data)
    if where is not None:
        raise ApiError(400, BAD_REQUEST, f"the body is not Unicode text: {not_unicode(where)}")
    if not isinstance(data, dict):
        raise ApiError(400, BAD_REQUEST, "the body must be a JSON object")
    return data


async def _json_object(request: Request) -> dict[str, Any]:
    text = await _body_text(request)
    return await off_loop_when(len(text) > LARGE_CHARS, _decoded_object, text)


def _idempotency_key(request: Request) -> str | None:
    """The caller's ``Idempotency-Key``, if it gave one: 1 to ``MAX_KEY_CHARS``
    characters of UTF-8 text, given once; anything else is a 400 naming the header."""
    given: list[bytes] = [
        value for name, value in request.scope["headers"] if name == b"idempotency-key"]
    if not given:
        return None
    if len(given) > 1:
        problem = "must be given once"
    else:
        try:
            key = given[0].decode("utf-8")
        except UnicodeDecodeError:
            problem = "must be UTF-8 text"
        else:
            if 0 < len(key) <= MAX_KEY_CHARS:
                return key
            problem = f"must be 1 to {MAX_KEY_CHARS} characters long (it has {len(key)})"
    raise ApiError(400, BAD_REQUEST, f"the header '{HEADER}' {problem}")


def _claim(session: CoreSession, key: str | None, kind: KeyKind,
           asked: str | None) -> tuple[IdempotencyRecord | None, IdempotencyRecord | None]:
    """:func:`~..sessions.idempotency.claim` for a caller's key (``asked``: the request's
    :func:`~..sessions.idempotency.fingerprint`): a key seen for another request is a 422
    :class:`ApiError`. Both None without a key (and only then ``asked``)."""
    if key is None:
        return None, None
    assert asked is not None
    try:
        known, new = claim(session.callers, session.id, key, kind, asked)
    except KeyReused as exc:
        what = "a turn" if exc.known.kind == TURN else "a tool call"
        raise ApiError(422, IDEMPOTENCY_KEY_REUSED,
                       f"this '{HEADER}' was used in this session for {what} with another "
                       "body; a retry must send the same body, a new request a new key"
                       ) from None
    if known is not None:
        log_event("control.retry", session=session.id, kind=kind, target=known.target_id)
    return known, new


async def hung_up(request: Request) -> None:
    """Return once the caller has hung up. Uvicorn cancels nothing when that happens: once
    the body is read, ``receive`` waits until it can say ``http.disconnect``."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _gone(request: Request) -> tuple[asyncio.Future[None], bool]:
    """A future done once the caller has hung up, and whether it is a task of its own
    (cancel it when done with it): only where Core's own protocols do not tell
    (:mod:`.hangup`)."""
    hang_up = hang_up_of(request.scope)
    if hang_up is not None:
        return hang_up.done(), False
    return asyncio.ensure_future(hung_up(request)), True


async def _answered(request: Request, session: CoreSession, pending: TrackedRequest, *,
                    cancels: bool) -> bool:
    """Wait for the request's result; False if the caller hung up first. ``cancels``: a
    hang-up cancels the request (``tool.cancel`` to the page); else it runs on, its future
    shared with retries and never cancelled here."""
    future = pending.future
    gone, watching = _gone(request)
    try:
        if cancels and not watching:
            # Nobody else awaits this future (no key: no retry can find it), so it is
            # awaited as it is, and the hang-up resolves it: one event-loop step less
            # than waiting for either.
            def hang_up(_: asyncio.Future[None]) -> None:
                session.cancel_request(pending, "the caller hung up")

            gone.add_done_callback(hang_up)
            try:
                await future
            finally:
                gone.remove_done_callback(hang_up)
            return not gone.done()
        await asyncio.wait((future, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        if watching:
            gone.cancel()
    if future.done():
        return True
    if cancels:
        session.cancel_request(pending, "the caller hung up")
    return False


def _request_state(session: CoreSession, request_id: str) -> dict[str, Any]:
    """``GET .../tool-calls/{id}``: a pending request of the session, or a kept result."""
    pending = session.pending.get(request_id)
    if pending is not None:
        return {"toolRequestId": request_id, "tool": pending.record.tool, "state": "pending",
                "turnId": pending.record.turn_id}
    done = session.callers.kept(request_id)  # (its result written as it is kept)
    if done is None:
        raise ApiError(404, TOOL_REQUEST_NOT_FOUND,
                       f"no tool request {request_id[:EXCERPT_CHARS]!r} is pending in this "
                       "session or has its result kept")
    return {"toolRequestId": request_id, "tool": done.tool, "state": "done", "turnId": None,
            "result": done.result, "handledBy": done.handled_by}


def _wants_events(request: Request) -> bool:
    """The caller's ``Accept`` names ``text/event-stream``."""
    accept = request.headers.get("accept", "")
    return any(part.split(";", 1)[0].strip().lower() == EVENT_STREAM
               for part in accept.split(","))


def _event(name: str, data: dict[str, Any]) -> bytes:
    """One server-sent event (compact JSON has no line breaks)."""
    text = dump_json(data)
    return f"event: {name}\ndata: {text}\n\n".encode()


async def _events(pending: TrackedRequest) -> AsyncIterator[bytes]:
    """A request's events until it is resolved: ``progress`` for each new progress (the
    latest only), ``waiting`` each time it begins or ends waiting for the user (an
    approval, a dialog): nothing queues up for a slow caller."""
    progress: RequestProgress | None = None
    status = "running"
    while True:
        latest = pending.progress
        if latest is not None and latest is not progress:
            progress = latest
            yield _event("progress", latest.as_json())
            continue
        if pending.future.done():
            return
        if pending.status != status:
            status = pending.status
            yield _event("waiting", {"waiting": status != "running", "status": status})
            continue
        await pending.changed()


class _EventStream(Response):
    """``POST .../tool-calls`` with ``Accept: text/event-stream``: :func:`_events`, then
    the request's ``result`` event. One that hangs up is treated as :func:`_tool_answer`
    treats it."""

    media_type = EVENT_STREAM

    def __init__(self, request: Request, session: CoreSession, request_id: str, *,
                 keyed: bool) -> None:
        # no super().__init__: it would give the empty body a Content-Length
        self.status_code = 200
        self.background = None
        self.init_headers({"Cache-Control": "no-store", "X-Accel-Buffering": "no"})
        self.request = request
        self.session = session
        self.request_id = request_id
        self.keyed = keyed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        session = self.session
        await send({"type": "http.response.start", "status": 200,
                    "headers": self.raw_headers})
        pending = session.pending.get(self.request_id)
        if pending is None:
            state = _request_state(session, self.request_id)
            result, handled_by = state["result"], state["handledBy"]
        else:
            try:
                answered = await self._pump(pending, send)
            except asyncio.CancelledError:  # the server gave up waiting for this answer
                if not _registry(self.request).stopping:
                    raise
                stopping = stopping_error()
                await send({"type": "http.response.body", "more_body": False, "body": _event(
                    "error", {"error": {"code": stopping.code, "message": stopping.message}})})
                return
            if not answered:
                return
            result, handled_by = pending.future.result()
        await _stored(self.request, session, self.request_id, keyed=self.keyed)
        await send({"type": "http.response.body", "more_body": False, "body": _event(
            "result", {"toolRequestId": self.request_id, "result": result,
                       "handledBy": handled_by})})

    async def _pump(self, pending: TrackedRequest, send: Send) -> bool:
        """Send the progress events until the request is resolved; False if the caller
        hung up (or Core stopped) first."""
        async def events() -> None:
            async for event in _events(pending):
                await send({"type": "http.response.body", "more_body": True, "body": event})

        pump = asyncio.ensure_future(events())
        gone, watching = _gone(self.request)
        try:
            await asyncio.wait((pump, gone), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # Core is stopping and gave up waiting for us
            self._gone(pending, "Core is stopping")
            raise
        finally:
            if watching:
                gone.cancel()
            pump.cancel()
        if pump.done() and not pump.cancelled() and pump.exception() is None:
            return True
        self._gone(pending, "the caller hung up")
        return False

    def _gone(self, pending: TrackedRequest, reason: str) -> None:
        if not self.keyed:
            self.session.cancel_request(pending, reason)


async def _tool_answer(request: Request, session: CoreSession, request_id: str, *,
                       keyed: bool) -> Response:
    """The caller's answer: the request's result once it is in. A caller that hangs up
    first cancels the request (``tool.cancel`` to the page), unless it gave a key: then
    the request runs on, for a retry with that key (or a GET) to fetch. A caller that
    accepts ``text/event-stream`` gets it as :class:`_EventStream`."""
    if _wants_events(request):
        if request_id not in session.pending:
            _request_state(session, request_id)  # a 404 before the stream starts
        return _EventStream(request, session, request_id, keyed=keyed)
    pending = session.pending.get(request_id)
    if pending is not None:
        # a router's own key (cluster/routing.py) serves only that router: its caller hung
        # up there, so the request goes as an unkeyed one's does
        cancels = not keyed or bool(request.scope.get(ROUTE_KEY))
        try:
            answered = await _answered(request, session, pending, cancels=cancels)
        except asyncio.CancelledError:  # Core is stopping and gave up waiting for us
            if cancels:
                session.cancel_request(pending, "Core is stopping")
            raise
        if not answered:
            return JSONResponse(_request_state(session, request_id), status_code=202)
        result, handled_by = pending.future.result()
        await _stored(request, session, request_id, keyed=keyed)
        return JSONResponse(
            {"toolRequestId": request_id, "result": result, "handledBy": handled_by})
    state = _request_state(session, request_id)
    await _stored(request, session, request_id, keyed=keyed)
    return JSONResponse({"toolRequestId": request_id, "result": state["result"],
                         "handledBy": state["handledBy"]})


async def _stored(request: Request, session: CoreSession, request_id: str, *,
                  keyed: bool) -> None:
    """Before a keyed caller gets a result: its write is done, so a retry with the key
    gets the same result after a crash. A retry can find the result kept while its write
    is still queued (the page answered before the retry came), so this holds for results
    found done too. Not for a router's key: its retry comes only while this answer is on
    its way, after this node died, and then the request (stored before it went out) is
    sent again and the page's ledger answers it."""
    if keyed and not request.scope.get(ROUTE_KEY):
        with contextlib.suppress(StoreError):  # the store logs why
            await session.stored(request_id)


def stopping_error() -> ApiError:
    """What a request Core was still answering when it stopped is told."""
    return ApiError(503, CORE_STOPPING, (
        "Core stopped before this request's answer was in. Retry with the same "
        f"'{HEADER}' once Core is back (with a store that keeps it, not memory) for what "
        "became of it; a tool call sent without one was cancelled."))


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
        # pages can load: the runtime under /pedelec/pyodide/ is served (not a 503)
        "ready": request.app.state.pyodide.status == "ready",
    }
    if not answer["ready"]:  # why pages cannot load (yet): what /pedelec/pyodide/ answers
        answer["pyodideDetail"] = request.app.state.pyodide.detail
    problem = registry.store.problem
    if problem is not None:  # Core answers, but what it is told may not survive a restart
        answer["status"] = "degraded"
        answer["reason"] = f"store: {problem}"
    return JSONResponse(answer)


def _liveness(session: CoreSession) -> tuple[bool, float]:
    """Sort key: connected sessions first, newest first; then the disconnected ones,
    the latest to go first (the one most likely to come back)."""
    if session.connection is not None:
        return False, -session.record.created_at
    return True, -(session.disconnected_at or 0.0)


@_guarded
async def list_sessions(request: Request) -> Response:
    wanted = request.query_params.get("connected")
    if wanted not in (None, "true", "false"):
        raise ApiError(400, BAD_REQUEST, "'connected' must be true or false, got "
                       f"{wanted[:EXCERPT_CHARS]!r}")
    live = [s for s in _registry(request).sessions.values() if not s.closed]
    if wanted is not None:
        live = [s for s in live if (s.connection is not None) == (wanted == "true")]
    live.sort(key=_liveness)
    return JSONResponse({"sessions": [s.describe() for s in live]})


@_guarded
async def get_session(request: Request) -> Response:
    return JSONResponse(path_session(request).describe(full=True))


class _CallBody(NamedTuple):
    """A tool call's body, read and checked (:func:`_read_call`)."""

    tool: str
    args: Any  # kept as JSON text (JsonText) when long
    timeout_ms: int | None
    max_total_ms: int | None
    wait_for_page: bool
    fingerprint: str | None  # of what it asks, when it came with an Idempotency-Key
    checked: CheckedRequest | protocol.ProtocolError  # its frame, or why the page refuses it


def _read_call(text: str, kind: KeyKind | None, max_frame_bytes: int) -> _CallBody:
    """The body of ``POST .../tool-calls`` decoded and checked, its ``tool.request`` frame
    made: pure, so that a long body is read in a worker thread, where its decoded args
    (1 MiB of small arrays: ~15 to 45 ms to decode, ~8 to free, ~24 MiB held) are made,
    used and dropped, and only texts come back. ``kind``: its key's, if it has one."""
    body = _decoded_object(text)
    tool = body.get("tool")
    if not isinstance(tool, str) or not NAME_PATTERN.match(tool):
        raise ApiError(400, BAD_REQUEST,
                       "'tool' must be a tool name (1 to 64 letters, digits, '_' or '-')")
    args = body.get("args", {})
    timeout_ms = body.get("timeoutMs")
    if timeout_ms is not None and not is_timeout_ms(timeout_ms):
        raise ApiError(400, BAD_REQUEST,
                       f"'timeoutMs' must be a positive integer, at most {MAX_TIMEOUT_MS} (24 h)")
    max_total_ms = body.get("maxTotalMs")
    if max_total_ms is not None and not is_timeout_ms(max_total_ms):
        raise ApiError(400, BAD_REQUEST, "'maxTotalMs' must be a positive integer, at most "
                       f"{MAX_TIMEOUT_MS} (24 h)")
    wait_for_page = body.get("waitForPage", True)
    if not isinstance(wait_for_page, bool):
        raise ApiError(400, BAD_REQUEST, "'waitForPage' must be true or false")
    asked = {"tool": tool, "args": args, "timeoutMs": timeout_ms}
    if max_total_ms is not None:  # keys given before maxTotalMs existed keep their prints
        asked["maxTotalMs"] = max_total_ms
    checked: CheckedRequest | protocol.ProtocolError
    try:  # the same check as every request's, answered as the caller's HTTP error
        checked = checked_call(tool, args, max_frame_bytes)
    except protocol.ProtocolError as exc:
        checked = exc
    kept = as_text(args) if is_large(args) else args
    return _CallBody(tool, kept, timeout_ms, max_total_ms, wait_for_page,
                     None if kind is None else fingerprint(kind, asked), checked)


@_guarded
async def tool_call(request: Request) -> Response:
    key = _idempotency_key(request)
    session = path_session(request)
    limit = session.registry.config.max_frame_bytes
    text = await _body_text(request)
    # a forwarding node's own key: its result is kept apart from callers' (idempotency.py)
    kind = CORE_CALL if request.scope.get(ROUTE_KEY) else TOOL_CALL
    keyed = None if key is None else kind
    call = await off_loop_when(len(text) > LARGE_CHARS, _read_call, text, keyed, limit)
    del text
    known, claim = _claim(session, key, kind, call.fingerprint)
    if known is not None:  # a retry: the first request's result, never a second run
        return await _tool_answer(request, session, known.target_id, keyed=True)
    _store_reachable(session)
    if not call.wait_for_page and session.connection is None:
        gone = session.disconnected_at
        now = session.registry.config.clock.time()
        since = f" for {now - gone:.0f} s" if gone is not None else ""
        raise ApiError(409, PAGE_NOT_CONNECTED, (
            f"session {session.id!r} has had no page connected{since} (it waits for its page "
            "to resume until --session-ttl): the connected ones are listed by "
            "GET /pedelec/v1/sessions?connected=true"))
    if isinstance(call.checked, protocol.ProtocolError):
        status = 413 if call.checked.code == protocol.FRAME_TOO_LARGE else 400
        raise ApiError(status, PAYLOAD_TOO_LARGE if status == 413 else BAD_REQUEST,
                       f"the page would refuse this tool.request: {call.checked.message}")
    pending = await session.start_call(
        call.tool, call.args, timeout_ms=call.timeout_ms, max_total_ms=call.max_total_ms,
        checked=call.checked, key=claim)
    return await _tool_answer(request, session, pending.id, keyed=claim is not None)


@_guarded
async def tool_request(request: Request) -> Response:
    session = path_session(request)
    return JSONResponse(_request_state(session, request.path_params["tool_request_id"]))


async def _turn_answer(session: CoreSession, record: TurnRecord) -> Response:
    """The turn's final record, once it has ended (a turn runs on whoever hangs up: the
    page waits for its end too)."""
    runner = session.turn
    if runner is not None and runner.record is record and runner.task is not None:
        await asyncio.shield(runner.task)
    answer: dict[str, Any] = {
        "turnId": record.id, "status": record.status, "text": record.final_text,
        "toolCalls": record.tool_calls,
    }
    if record.error is not None:
        answer["error"] = record.error
    if record.usage:
        answer["usage"] = record.usage
    return JSONResponse(answer)


@_guarded
async def turn(request: Request) -> Response:
    key = _idempotency_key(request)
    session = path_session(request)
    body = await _json_object(request)
    text = body.get("text")
    if not isinstance(text, str):
        raise ApiError(400, BAD_REQUEST, "'text' must be a string")
    known, claim = _claim(session, key, TURN,
                          None if key is None else fingerprint(TURN, {"text": text}))
    if known is not None:  # a retry: that turn's end, waiting for it if it runs
        return await _turn_answer(session, session.callers.turns[known.target_id])
    _store_reachable(session)
    if session.turn is not None:
        raise ApiError(409, TURN_BUSY,
                       f"turn {session.turn.turn_id!r} is still running; one turn at a time")
    turn_id = secrets.token_hex(8)
    log_event("control.turn", session=session.id, turn=turn_id)
    runner = start_turn(session, turn_id, text)
    if claim is not None:  # stored before the turn's first request is
        claim.target_id = turn_id
        session.callers.add_key(claim, turn=runner.record)
    return await _turn_answer(session, runner.record)
