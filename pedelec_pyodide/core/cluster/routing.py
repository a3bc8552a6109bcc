"""Control-API calls that arrive at a node that does not hold the page's session (several
Core nodes on one Redis): forwarded, through Redis, to the node that does.

An ASGI middleware in front of Core's routes, as Socket.IO's Redis adapter and Channels'
Redis layer do it: the request (method, path, the headers that matter, the body) goes to
the holder's pub/sub inbox (:class:`~.messages.HttpCall`), the holder runs it through its
own routes (authorization checked there again) and publishes the response to the
caller's node. A call without an
``Idempotency-Key`` is given one (``pedelec-route-...``), so when its holder dies and the
page resumes on another node, the call is forwarded again there and waits for the same
request (stored with its key) instead of sending a new one: nothing runs twice. The
holder answers a call with such a key of the router's own without waiting for its
result to be stored (:data:`~..http.control.ROUTE_KEY`): only this router retries with it.
Nor does such a key keep the call running for a caller who hangs up: the router tells
the holder (:class:`~.messages.HungUp`), whose route sees its own caller hang up, as on one node.

Each node remembers which node answered for a session (a bounded cache), so a call
crossing nodes costs no lease lookup in Redis. A remembered holder that let go answers
that the session moved (or is not there) and a dead one stops holding the lease: either
way the entry is dropped and the call routed again through the lease, with its key, so a
stale entry costs a retry, never a lost or doubled call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import secrets
from collections import OrderedDict
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ... import strictjson
from ..clock import wait
from ..http.control import (
    RETRY_AFTER_SECONDS,
    ROUTE_KEY,
    SESSION_NOT_FOUND,
    ApiError,
    authorize,
    hung_up,
    read_body,
)
from ..http.hangup import EXTENSION, HangUp, hang_up_of
from ..log import log_event
from ..sessions import SESSION_MOVED
from ..store import StoreError
from .leases import LEASE_SECONDS
from .messages import BadMessage, HttpCall, HttpReply, HungUp
from .node import Node, new_ask_id

# the control-API paths that name a session (MCP keeps per-client state on its node)
_SESSION_PATH = re.compile(r"^/pedelec/v1/sessions/([^/]+)(?:/tool-calls(?:/[^/]+)?|/turns)?$")
#: the longest a forwarded call waits for its answer, whatever the nodes do
ROUTE_LIMIT_SECONDS = 600.0
# how soon a call for a session this node is still taking over looks again
ADOPT_RETRY_SECONDS = 0.1
#: the control API's code (HTTP 504) when no node answered within ROUTE_LIMIT_SECONDS
ROUTE_TIMEOUT = "ROUTE_TIMEOUT"
# the request headers forwarded (the rest are the hop's own)
_FORWARDED = (b"authorization", b"idempotency-key", b"content-type")
_KEY_HEADER = b"idempotency-key"
_ROUTE_KEY_PREFIX = "pedelec-route-"
#: most sessions whose holder a node remembers (the least recently used go first)
HOLDER_CACHE_LIMIT = 10_000


class ClusterRouter:
    """Forwards the control-API calls of sessions another node holds (a shared store)."""

    def __init__(self, app: ASGIApp, node: Node) -> None:
        self.app = app
        self.node = node
        # session id -> the other node that last answered for it
        self._holders: OrderedDict[str, str] = OrderedDict()

    def _remember(self, session_id: str, holder: str) -> None:
        self._holders[session_id] = holder
        self._holders.move_to_end(session_id)
        if len(self._holders) > HOLDER_CACHE_LIMIT:
            self._holders.popitem(last=False)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        registry = self.node.registry
        match = _SESSION_PATH.match(scope.get("path", "")) if scope["type"] == "http" else None
        if match is None or not registry.store.shared or match.group(1) in registry.sessions:
            await self.app(scope, receive, send)
            return
        try:  # nothing reaches Redis for a caller without the token, or a body too large
            authorize(Request(scope))
            body = await read_body(Request(scope, receive), registry.config.max_frame_bytes)
        except ApiError as exc:
            await exc.response()(scope, receive, send)
            return
        headers = [(name, value) for name, value in scope["headers"] if name in _FORWARDED]
        own_key = scope["method"] == "POST" and not any(n == _KEY_HEADER for n, _ in headers)
        if own_key:
            headers.append((_KEY_HEADER, (_ROUTE_KEY_PREFIX + secrets.token_hex(16)).encode()))
        # the ask's id is the same wherever and however often the call is forwarded
        request = HttpCall(
            ask=new_ask_id(), sender=self.node.name, method=scope["method"],
            path=scope["path"], query=scope.get("query_string", b"").decode("latin-1"),
            headers=[[n.decode("latin-1"), v.decode("latin-1")] for n, v in headers],
            body=body.decode("utf-8", "surrogateescape"), route_key=own_key)
        # the router's own key is the router's alone: a caller who hangs up cancels the
        # call, as on one node (a caller's own key keeps it running for its retry)
        hang_up = hang_up_of(scope) if own_key else None
        if hang_up is not None:  # Core's own protocol tells: no task watches
            gone = hang_up.done()
        elif own_key:
            gone = asyncio.ensure_future(hung_up(Request(scope, receive)))
        else:
            gone = asyncio.get_running_loop().create_future()  # never done
        try:
            answered = await self._route(scope["app"], match.group(1), request, gone)
        finally:
            if hang_up is None:
                gone.cancel()
        if answered is None:
            return  # nobody to answer
        status, answer = answered
        headers = [(b"content-type", b"application/json")]
        if status == 503:  # as the control API says it (ApiError.response)
            headers.append((b"retry-after", RETRY_AFTER_SECONDS.encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": answer.encode("utf-8",
                                                                        "surrogateescape")})

    async def _route(self, core: Starlette, session_id: str, request: HttpCall,
                     gone: asyncio.Future[None]) -> tuple[int, str] | None:
        """To whichever node holds the session, again after a holder died or let go,
        until an answer or :data:`ROUTE_LIMIT_SECONDS`; nobody holding it: this node.
        None once ``gone`` is done (the caller hung up), the node running it told."""
        node = self.node
        clock = node.clock
        deadline = clock.monotonic() + ROUTE_LIMIT_SECONDS
        while clock.monotonic() < deadline and not gone.done():
            try:
                holder = self._holders.get(session_id)
                if holder is None:
                    holder = await node.store.holder(session_id)
                if holder is None or holder == node.name:
                    if not await node.leases.adopt(session_id):
                        await clock.sleep(ADOPT_RETRY_SECONDS)
                        continue
                    status, answer = await run_here(core, request, gone)
                    if gone.done():
                        return None
                    if not _moved(status, answer, here=True):
                        return status, answer
                    continue
                reply = await self._forwarded(session_id, holder, request, deadline, gone)
            except StoreError as exc:  # Redis out of reach or refusing: as the control API
                # says it
                return 503, strictjson.encode({"error": {"code": exc.code, "message": str(exc)}})
            if reply is not None:
                status, answer = reply.status, reply.body
                if not _moved(status, answer, here=False):
                    self._remember(session_id, holder)
                    return status, answer
            if gone.done():
                return None
            self._holders.pop(session_id, None)  # route it again through the lease
        if gone.done():
            return None
        return 504, strictjson.encode({"error": {"code": ROUTE_TIMEOUT, "message": (
            f"no node answered for this session within {ROUTE_LIMIT_SECONDS:g} s")}})

    async def _forwarded(self, session_id: str, holder: str, request: HttpCall,
                         deadline: float, gone: asyncio.Future[None]) -> HttpReply | None:
        """``holder``'s reply; None once another node (or none) holds the session, or
        once ``gone`` is done (then ``holder`` is told the caller hung up)."""
        node = self.node
        with node.asking(holder, request, HttpReply) as reply:
            await node.send(reply)
            # logged once it is on its way: the holder works on it meanwhile. At debug
            # level: a line per call is a tenth of this node's work on it, and the
            # holder logs the call's request and result (tool.request, tool.result)
            log_event("route.forward", level=logging.DEBUG, session=session_id,
                      node=holder)
            while node.clock.monotonic() < deadline:
                either: list[asyncio.Future[Any]] = [reply.future, gone]
                try:
                    await wait(node.clock, either, LEASE_SECONDS / 3,
                               return_when=asyncio.FIRST_COMPLETED)
                except asyncio.CancelledError:  # this node is stopping: its caller is
                    if request.route_key:  # told so, and a call without a key cancelled
                        await self._hung_up(holder, reply.ask_id)
                    raise
                if reply.future.done():
                    return reply.future.result()
                if gone.done():
                    await self._hung_up(holder, reply.ask_id)
                    return None
                if not await node.leases.still_held(session_id, holder):
                    return None  # it died or let go: the caller routes the call again
        return None

    async def _hung_up(self, holder: str, ask: str) -> None:
        """Tell ``holder`` that the caller of ``ask`` is gone: best effort, as pub/sub is
        (a lost one cancels nothing)."""
        with contextlib.suppress(StoreError):
            await self.node.tell(holder, HungUp(ask=ask))


def _check_request(call: HttpCall) -> HttpCall:
    """A forwarded call whose texts HTTP can carry (as :func:`run_here` encodes them), or
    :class:`BadMessage`: nothing of a forged one reaches Core's routes."""
    try:
        call.path.encode()
        call.body.encode("utf-8", "surrogateescape")
        for text in (call.query, *(part for header in call.headers for part in header)):
            text.encode("latin-1")
    except UnicodeEncodeError:
        raise BadMessage("an http.call holds text HTTP cannot carry") from None
    return call


def _error_code(answer: str) -> str | None:
    """The code of the error a control-API answer is (``{"error": {"code"}}``), or of
    the error result a tool call's answer carries (``{"result": {"error": {"code"}}}``);
    None for any other answer."""
    try:
        data = strictjson.decode(answer)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    result = data.get("result")
    error = result.get("error") if isinstance(result, dict) else None
    if not isinstance(error, dict):
        error = data.get("error")
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else None


def _moved(status: int, answer: str, *, here: bool) -> bool:
    """The node that ran it let the session go meanwhile: route the call again (a 404
    ``SESSION_NOT_FOUND`` from another node: it let go before the call arrived). The
    code is read from the answer's JSON, never matched in its text (a tool request's id,
    a result, may hold any text); only an answer naming the code is decoded."""
    if SESSION_MOVED not in answer and SESSION_NOT_FOUND not in answer:
        return False  # (most answers: not decoded again)
    code = _error_code(answer)
    return code == SESSION_MOVED or (not here and status == 404 and code == SESSION_NOT_FOUND)


async def serve_forwarded(core: Starlette, call: HttpCall, hung_up: asyncio.Future[None]
                          ) -> HttpReply:
    """Another node's call, run here: its status and body; :class:`BadMessage` if HTTP
    cannot carry it. ``hung_up`` is done once its caller hung up at that node."""
    status, body = await run_here(core, _check_request(call), hung_up)
    return HttpReply(ask=call.ask, status=status, body=body)


async def run_here(core: Starlette, request: HttpCall, hung_up: asyncio.Future[None]
                   ) -> tuple[int, str]:
    """``request`` through Core's routes on this node (not forwarded again), its caller
    hanging up once ``hung_up`` is done."""
    hang_up = HangUp()  # the control API hears of it from the scope, as from a socket
    hung_up.add_done_callback(lambda done: None if done.cancelled() else hang_up.hung_up())
    scope: Scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "app": core,
        "method": request.method, "path": request.path,
        "raw_path": request.path.encode(), "query_string": request.query.encode(
            "latin-1"), "root_path": "", "scheme": "http", "server": None, "client": None,
        "headers": [(n.encode("latin-1"), v.encode("latin-1")) for n, v in request.headers],
        ROUTE_KEY: request.route_key,
        "extensions": {EXTENSION: hang_up},
    }
    body = request.body.encode("utf-8", "surrogateescape")
    sent = False
    response: dict[str, Any] = {"status": 500, "body": []}

    async def receive() -> Message:
        nonlocal sent
        if sent:  # the caller is a node: it hangs up when its own caller did
            await asyncio.wait([hung_up])  # (never cancelling it)
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            response["status"] = message["status"]
        elif message["type"] == "http.response.body":
            response["body"].append(message.get("body", b""))

    await core.router(scope, receive, send)
    return response["status"], b"".join(response["body"]).decode("utf-8", "surrogateescape")
