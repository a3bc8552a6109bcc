"""MCP for one live page: ``/pedelec/v1/sessions/{session_id}/mcp`` (streamable HTTP).

Built on the official ``mcp`` SDK: one low-level :class:`~mcp.server.lowlevel.Server` and
one stateful :class:`~mcp.server.streamable_http_manager.StreamableHTTPSessionManager` for
all of Core; each MCP request is answered for the page session its URL names.

- ``tools/list``: the page's current tool metadata (``argsSchema`` as given, with
  ``"type": "object"`` added only when absent; annotations as MCP ``ToolAnnotations``).
- ``tools/call``: :meth:`CoreSession.call_tool`, the control API's path (deadlines,
  resume, exactly-once). See :func:`call_result` for the content.
- ``notifications/progress``: for a ``tools/call`` whose ``_meta`` has a
  ``progressToken``, each new ``tool.progress`` of its request (the latest, if the client
  reads slower than the page reports), on the call's own response stream.
- ``notifications/cancelled`` (or, at 2026-07-28, the client closing the call's stream):
  the request is cancelled and the page gets ``tool.cancel``.
- ``notifications/tools/list_changed``: sent on the client's standalone GET stream when
  the page's tool list changes, to every MCP session opened with the ``initialize``
  handshake on that page's URL; clients of the per-request protocol (2026-07-28) get it
  on their ``subscriptions/listen`` streams (the SDK's :class:`ListenHandler`, one per
  page).
- Before the SDK sees a request: the admin token (401), the session (404), the Origin
  (the WebSocket's rule, 403).
- Several Core nodes on one Redis: a page another node holds is served here all the
  same; its tool calls are relayed to that node (cluster/relay.py), ``tools/list`` reads its
  tools from Redis, and its tool changes are heard through Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import secrets
import weakref
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, NamedTuple

import anyio
from mcp import types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.lowlevel.server import NotificationOptions
from mcp.server.models import InitializationOptions
from mcp.server.session import ServerSession
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ToolsListChanged
from mcp.shared.exceptions import MCPError
from mcp.shared.jsonrpc_dispatcher import progress_token_from_params
from starlette.requests import Request
from starlette.types import Message, Receive, Scope, Send

from ... import __version__, protocol, strictjson
from ...results import TOOL_HANDLER_NOT_FOUND, is_error_result, tool_error
from ...text import quote
from ...tools import NAME_PATTERN
from ..background import read_forever
from ..cluster.relay import NoSession, ToolRelay
from ..log import log_event
from ..offload import LARGE_CHARS, collector_paused, is_large, off_loop, off_loop_when
from ..page.bridge import origin_allowed
from ..sessions import (
    CheckedRequest,
    CoreSession,
    Registry,
    RequestProgress,
    checked_call,
    refused_request,
)
from ..store import JsonText, StoreError, as_text
from .control import ApiError, authorize, path_session

FORBIDDEN_ORIGIN = "FORBIDDEN_ORIGIN"
#: pages other nodes hold whose tool changes one node passes on to its MCP clients
MAX_REMOTE_PAGES = 10_000
#: ``subscriptions/listen`` streams open at once on one page's URL
MAX_LISTENS_PER_PAGE = 16
#: events a listen stream holds for a client that does not read (each a level trigger:
#: past it the stream is ended, and the client listens again and refetches)
LISTEN_BACKLOG = 16
# the key of a page's listen streams among its session's tool listeners
_LISTEN_KEY = "mcp:subscriptions/listen"
# in an HTTP request's scope: the node holding its page, as found before the SDK saw it
_HOLDER = "pedelec.mcp_holder"
# in an HTTP request's scope: a long tools/call's args, read by Core (_ArgsAside)
_ASIDE = "pedelec.mcp_args"
# the one key of the args the SDK gets in their place
_ASIDE_KEY = "pedelec.argsAside"
# a tools/call with these headers, or to a page whose tools' schemas say this, has its
# headers checked against its args by the SDK: its args are left in its body
_PARAM_HEADER = b"mcp-param-"
_PARAM_ANNOTATION = '"x-mcp-header"'

Context = ServerRequestContext[Any, Any]


def mcp_tool(metadata: dict[str, Any]) -> types.Tool:
    """A page's tool metadata as an MCP tool."""
    schema = dict(metadata["argsSchema"])
    schema.setdefault("type", "object")
    data: dict[str, Any] = {
        "name": metadata["name"], "description": metadata["description"],
        "inputSchema": schema,
    }
    if "annotations" in metadata:
        data["annotations"] = metadata["annotations"]
    return types.Tool.model_validate(data)


async def call_result(result: Any) -> types.CallToolResult:
    """A tool result as MCP content.

    ``content`` is one text block, the result as compact JSON; ``structuredContent`` is
    the result when it is a JSON object, else ``{"result": value}`` (MCP wants an object
    there). An error result (``{"error": {...}}``) is ``isError: true``, its text
    ``"CODE: message"``, its ``structuredContent`` the whole error result (``details``,
    ``retryable`` included); when that is left out (below), a second text block has it.

    A result longer than LARGE_CHARS as compact JSON has no ``structuredContent``
    (optional in MCP for a tool with no output schema): the SDK's serializer walks that
    value item by item, several times, on the event loop (~0.2-0.4 s each for 1 MiB of
    small arrays), where the text is one string to it. Its text is encoded off the loop,
    or is the page's, as Core keeps it (:class:`JsonText`, never an error result).
    """
    if isinstance(result, JsonText):
        return types.CallToolResult(content=[types.TextContent(type="text", text=result.text)])
    compact = await off_loop_when(is_large(result), strictjson.encode, result)
    large = len(compact) > LARGE_CHARS
    if is_error_result(result):
        error = result["error"]
        said = types.TextContent(type="text", text=f"{error.get('code')}: "
                                 f"{error.get('message')}")
        if large:  # its details and retryable, as text
            return types.CallToolResult(
                content=[said, types.TextContent(type="text", text=compact)], is_error=True)
        return types.CallToolResult(content=[said], structured_content=result, is_error=True)
    content: list[types.ContentBlock] = [types.TextContent(type="text", text=compact)]
    if large:
        return types.CallToolResult(content=content)
    return types.CallToolResult(content=content, structured_content=(
        result if isinstance(result, dict) else {"result": result}))


class _ArgsAside(NamedTuple):
    """A long ``tools/call``'s args, read by Core before the SDK saw its body (which got a
    placeholder in their place): as JSON text, and checked as the page would check them."""

    token: str
    args: JsonText | None  # None when the page would refuse them (``checked`` says why)
    checked: CheckedRequest | protocol.ProtocolError


def _set_aside(body: bytes, max_frame_bytes: int) -> tuple[bytes, _ArgsAside] | None:
    """A long ``tools/call`` body, its args set aside (a worker thread runs this): the body
    the SDK gets instead, their place taken by ``{"pedelec.argsAside": token}``. The SDK
    held the args decoded for the whole call (~50 times their text for small arrays), and
    decoded them on the event loop. None for any other body: the SDK reads it as it is
    (and refuses it, if it is not JSON)."""
    try:  # as the SDK reads it (NaN, args as deep as a page takes under the envelope):
        # what the page would refuse is refused from ``checked`` below
        message = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(message, dict):
        return None
    params = message.get("params")
    if (message.get("method") != "tools/call" or not isinstance(params, dict)
            or not isinstance(params.get("name"), str)
            or not isinstance(params.get("arguments"), dict)):
        return None
    args = params["arguments"]
    try:
        checked: CheckedRequest | protocol.ProtocolError = checked_call(
            params["name"], args, max_frame_bytes)
    except protocol.ProtocolError as exc:
        checked = exc
    token = secrets.token_hex(16)
    params["arguments"] = {_ASIDE_KEY: token}
    try:  # the rest as the SDK would read it (NaN, a lone surrogate: its to refuse)
        placed = json.dumps(message, separators=(",", ":")).encode()
    except (ValueError, RecursionError):
        return None
    kept = None if isinstance(checked, protocol.ProtocolError) else as_text(args)
    return placed, _ArgsAside(token, kept, checked)


async def _args_set_aside(scope: Scope, receive: Receive, max_frame_bytes: int) -> Receive:
    """``receive`` for the SDK, with a long ``tools/call``'s args set aside
    (:func:`_set_aside`, in ``scope``): the body read here first, whole, up to the frame
    limit (a longer one goes on as it came: the SDK answers it 413)."""
    chunks: list[bytes] = []
    size, more = 0, True
    last: Message | None = None
    while more and size <= max_frame_bytes:
        message = await receive()
        if message["type"] != "http.request":  # the client went away: passed on
            last = message
            break
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        more = message.get("more_body", False)
    body = b"".join(chunks)
    if last is None and not more and LARGE_CHARS < size <= max_frame_bytes:
        set_aside = await off_loop(_set_aside, body, max_frame_bytes)
        if set_aside is not None:
            body, scope[_ASIDE] = set_aside
            scope["headers"] = [
                (name, str(len(body)).encode() if name == b"content-length" else value)
                for name, value in scope["headers"]]
    replay: list[Message] = [{"type": "http.request", "body": body, "more_body": more}]
    if last is not None:
        replay.append(last)

    async def replayed() -> Message:
        return replay.pop(0) if replay else await receive()

    return replayed


def _body_read_paused(receive: Receive) -> Receive:
    """``receive``, pausing the collector for the step that has the whole of a long body:
    the SDK decodes it there, on the loop, and json makes a container per array or
    object, which set off collections (a decode 2-5x as long)."""
    received = 0

    async def receive_body() -> Message:
        nonlocal received
        message = await receive()
        if message["type"] == "http.request":
            received += len(message.get("body", b""))
            if not message.get("more_body", False) and received > LARGE_CHARS:
                collector_paused.for_this_step()
        return message

    return receive_body


def _http_request(ctx: Context) -> Request:
    """The HTTP request an MCP message came in (streamable HTTP always has one)."""
    request = ctx.request
    assert isinstance(request, Request)
    return request


def _listen_handler() -> tuple[ListenHandler, Callable[[], Coroutine[Any, Any, None]]]:
    """One page's listen streams, and what tells them its tools changed."""
    bus = InMemorySubscriptionBus()
    handler = ListenHandler(bus, max_subscriptions=MAX_LISTENS_PER_PAGE,
                            max_buffered_events=LISTEN_BACKLOG)
    return handler, lambda: bus.publish(ToolsListChanged())


@dataclasses.dataclass
class _Listens:
    """The listen streams of a page another node holds."""

    handler: ListenHandler
    open: int = 0


def _no_session(session_id: str) -> MCPError:
    return MCPError(types.INVALID_REQUEST, f"no session {quote(session_id)}")


class _PageServer(Server[Any]):
    """Says ``tools.listChanged`` in the ``initialize`` answer."""

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        return super().create_initialization_options(
            notification_options or NotificationOptions(tools_changed=True),
            experimental_capabilities, extensions)


class McpEndpoint:
    """The ASGI app behind the MCP route; :meth:`run` it for the app's lifetime."""

    def __init__(self, registry: Registry, allowed_origins: frozenset[str],
                 relay: ToolRelay) -> None:
        self.registry = registry
        self.relay = relay
        self.allowed_origins = allowed_origins
        self.server = _PageServer(
            "pedelec", version=__version__,
            on_list_tools=self._list_tools, on_call_tool=self._call_tool,
            on_subscriptions_listen=self._listen)
        self.server.add_notification_handler(
            "notifications/initialized", types.NotificationParams, self._initialized)
        # bodies over the frame limit get 413 (the page could not take their args)
        self.manager = StreamableHTTPSessionManager(
            self.server, max_request_body_size=registry.config.max_frame_bytes)
        self._notifying: set[asyncio.Task[None]] = set()
        # the handshake clients of pages another node holds: page id -> MCP session id ->
        # listener, told by that node through Redis (at most MAX_REMOTE_PAGES pages)
        self._remote: dict[str, dict[str, Callable[[], None]]] = {}
        # their listen streams, by page id
        self._remote_listens: dict[str, _Listens] = {}
        # each page's listen streams (gone with its session)
        self._listens: weakref.WeakKeyDictionary[CoreSession, ListenHandler] = (
            weakref.WeakKeyDictionary())

    @contextlib.asynccontextmanager
    async def run(self) -> AsyncIterator[None]:
        hearing = asyncio.ensure_future(self._hear_changes())
        try:
            async with self.manager.run():
                yield
        finally:
            hearing.cancel()

    async def _hear_changes(self) -> None:
        """On a shared store: the tool changes of pages other nodes hold."""
        if self.registry.store.shared:
            await read_forever("tool_changes", self.relay.tool_changes, self._tools_changed,
                               self.registry.config.clock)

    def _tools_changed(self, session_id: str) -> None:
        for listener in list(self._remote.get(session_id, {}).values()):
            listener()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            authorize(request)
            session = await self._page(request)
            if not origin_allowed(request.headers, self.allowed_origins):
                raise ApiError(403, FORBIDDEN_ORIGIN,
                               f"Origin {quote(request.headers.get('origin'))} is not allowed")
        except ApiError as exc:
            await exc.response()(scope, receive, send)
            return
        key = request.headers.get(MCP_SESSION_ID_HEADER)
        if request.method == "DELETE" and key is not None:
            session_id = request.path_params["session_id"]
            self._forget(session_id, session.tool_listeners if session is not None else
                         self._remote.get(session_id, {}), key)
        if (request.method == "POST" and session is not None
                and _PARAM_ANNOTATION not in session.record.tools
                and not any(name.startswith(_PARAM_HEADER) for name, _ in scope["headers"])):
            receive = await _args_set_aside(scope, receive,
                                            self.registry.config.max_frame_bytes)
        await self.manager.handle_request(scope, _body_read_paused(receive), send)

    async def _page(self, request: Request) -> CoreSession | None:
        """The page's session if this node holds it; None if another node may (a shared
        store that has it: the handlers relay to it); a 404 :class:`ApiError` if none."""
        registry = self.registry
        session_id = request.path_params["session_id"]
        if not registry.store.shared or registry.get(session_id) is not None:
            return path_session(request)
        try:
            holder = await registry.store.holder(session_id)
            if holder is None and (
                    await registry.store.load_session_record(session_id)) is None:
                return path_session(request)  # no node holds it, none stored it: 404
        except StoreError as exc:
            raise ApiError(503, exc.code, "Core could not find this session's node in its "
                           f"store: {exc}") from None
        request.scope[_HOLDER] = holder  # this request's tool call asks Redis no more
        return None

    # --- MCP handlers -------------------------------------------------------------------

    def _session(self, ctx: Context) -> CoreSession:
        session_id = _http_request(ctx).path_params["session_id"]
        session = self.registry.get(session_id)
        if session is None or session.closed:
            raise _no_session(session_id)
        return session

    async def _list_tools(
        self, ctx: Context, params: types.PaginatedRequestParams | None,
    ) -> types.ListToolsResult:
        session_id = _http_request(ctx).path_params["session_id"]
        session = self.registry.get(session_id)
        if session is not None and not session.closed:
            tools = session.tools
        elif self.registry.store.shared:  # another node's page: its tools as stored (the
            # session's row alone: a 2026-07-28 client's every call reads them)
            stored = await self.registry.store.load_session_record(session_id)
            if stored is None:
                raise _no_session(session_id)
            tools = json.loads(stored.tools)
        else:
            raise _no_session(session_id)
        return types.ListToolsResult(tools=[mcp_tool(t) for t in tools])

    async def _call_tool(
        self, ctx: Context, params: types.CallToolRequestParams,
    ) -> types.CallToolResult:
        registry = self.registry
        session_id = _http_request(ctx).path_params["session_id"]
        if not registry.store.shared:
            self._session(ctx)
        if not NAME_PATTERN.match(params.name):
            return await call_result(tool_error(
                TOOL_HANDLER_NOT_FOUND, f"{quote(params.name)} is not a tool name",
                retryable=False))
        log_event("mcp.tool_call", session=session_id, tool=params.name,
                  id=str(ctx.request_id))
        aside = _http_request(ctx).scope.get(_ASIDE)
        args: Any
        checked: CheckedRequest | protocol.ProtocolError
        if aside is not None and params.arguments == {_ASIDE_KEY: aside.token}:
            args, checked = aside.args, aside.checked
        else:
            args = params.arguments or {}
            try:  # NaN or 1e999 (the SDK's parser takes them), too large, too deep
                checked = await off_loop_when(is_large(args), checked_call, params.name,
                                              args, registry.config.max_frame_bytes)
            except protocol.ProtocolError as exc:
                checked = exc
        if isinstance(checked, protocol.ProtocolError):
            return await call_result(refused_request(checked))
        token = progress_token_from_params(ctx.params)
        on_progress = None
        if token is not None:
            async def on_progress(update: RequestProgress) -> None:
                # a stream gone without a cancel: the call still waits for its result
                with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                    await ctx.session.send_notification(types.ProgressNotification(
                        params=types.ProgressNotificationParams(
                            progress_token=token, progress=update.progress,
                            total=update.total, message=update.message)),
                        related_request_id=ctx.request_id)  # on this call's stream

        if registry.store.shared:  # wherever the page is, again after its node died
            try:
                result = await self.relay.call(session_id, params.name, args, on_progress,
                                               checked, _http_request(ctx).scope.get(_HOLDER))
            except NoSession:
                raise _no_session(session_id) from None
            except StoreError as exc:  # which node holds the page cannot be known
                result = tool_error(exc.code, "Core could not find this page's node in its "
                                    f"store: {exc}", retryable=True)
            return await call_result(result)
        _, result, _ = await self._session(ctx).call_tool(
            params.name, args, checked=checked, on_progress=on_progress)
        return await call_result(result)

    async def _listen(
        self, ctx: Context, params: types.SubscriptionsListenRequestParams,
    ) -> types.SubscriptionsListenResult:
        """A ``subscriptions/listen`` stream of this page's tool list changes."""
        page = _http_request(ctx).path_params["session_id"]
        if self.registry.store.shared and self.registry.get(page) is None:
            return await self._listen_elsewhere(ctx, params, page)
        session = self._session(ctx)
        handler = self._listens.get(session)
        if handler is None:
            handler, publish = _listen_handler()
            self._listens[session] = handler
            session.tool_listeners[_LISTEN_KEY] = lambda: self._spawn(publish())
        return await handler(ctx, params)

    async def _listen_elsewhere(
        self, ctx: Context, params: types.SubscriptionsListenRequestParams, page: str,
    ) -> types.SubscriptionsListenResult:
        """A listen stream of a page another node holds, told of its changes through
        Redis; the page's handler kept while one of its streams is open."""
        held = self._remote_listens.get(page)
        if held is None:
            if len(self._remote) >= MAX_REMOTE_PAGES and page not in self._remote:
                raise MCPError(types.INTERNAL_ERROR, "this Core node passes on the tool "
                               f"changes of {MAX_REMOTE_PAGES} pages already")
            handler, publish = _listen_handler()
            held = self._remote_listens[page] = _Listens(handler)
            self._remote.setdefault(page, {})[_LISTEN_KEY] = lambda: self._spawn(publish())
        held.open += 1
        try:
            return await held.handler(ctx, params)
        finally:
            held.open -= 1
            if held.open == 0 and self._remote_listens.get(page) is held:
                del self._remote_listens[page]
                self._forget(page, self._remote.get(page, {}), _LISTEN_KEY)

    async def _initialized(self, ctx: Context, params: types.NotificationParams) -> None:
        request = _http_request(ctx)
        page = request.path_params["session_id"]
        session = self.registry.get(page)
        key = request.headers.get(MCP_SESSION_ID_HEADER)
        if key is None:
            return
        if session is not None:
            listeners = session.tool_listeners
        else:  # another node's page: that node tells this one of its changes
            if len(self._remote) >= MAX_REMOTE_PAGES and page not in self._remote:
                return
            listeners = self._remote.setdefault(page, {})
        listeners[key] = self._listener(page, listeners, key, ctx.session)
        log_event("mcp.session", session=page, clients=len(listeners))

    # --- notifications ------------------------------------------------------------------

    def _listener(self, page: str, listeners: dict[str, Callable[[], None]], key: str,
                  peer: ServerSession) -> Callable[[], None]:
        return lambda: self._spawn(self._notify(page, listeners, key, peer))

    def _spawn(self, notify: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(notify)
        self._notifying.add(task)
        task.add_done_callback(self._notifying.discard)

    async def _notify(self, page: str, listeners: dict[str, Callable[[], None]], key: str,
                      peer: ServerSession) -> None:
        try:
            await peer.send_tool_list_changed()
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            # the client's session ended without a DELETE (idle timeout): stop telling it
            self._forget(page, listeners, key)

    def _forget(self, page: str, listeners: dict[str, Callable[[], None]], key: str) -> None:
        listeners.pop(key, None)
        if not listeners and self._remote.get(page) is listeners:
            del self._remote[page]
