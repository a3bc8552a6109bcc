"""The browser edge: binds a :class:`Session` to Core through a JS ``WebSocket``.

The only module that touches ``js`` / ``pyodide.ffi`` (imported inside functions, so
CPython can import the package). Only strings cross the bridge: frames go out as
``json.dumps`` text and come in as text; events for the page's JS go out as a type and a
JSON string. It works in a Web Worker too: nothing here touches ``document``.

Proxies: one ``create_proxy`` per WebSocket connection (its event handler), destroyed
when that connection closes. Nothing is proxied per frame or per tool call.

Persistence (when ``sessionStorage`` is available, i.e. not in a worker): the session id
and resume token, and the delivery ledger, are kept under a key made from the Core URL,
so a reload resumes the session and never re-runs a request that already ran in the tab.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import random
import sys
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from . import protocol
from .context import ApprovalRequest
from .dispatch import ToolCall, ToolProgress, ToolStatus
from .errors import (
    ApprovalUnavailable,
    CoreUnreachableError,
    NotConnectedError,
    OriginRefusedError,
    SessionClosedError,
    TurnError,
)
from .ledger import Storage, StorageLedger
from .protocol import BRIDGE_PATH, ORIGIN_CHECK_PATH
from .session import Session, SessionState
from .tools import Tool
from .webmcp import MAX_INPUT_BYTES, WebMCP

logger = logging.getLogger("pedelec_pyodide")


__all__ = ["CoreUnreachableError", "OriginRefusedError", "PageSession", "bridge_of", "connect",
           "create_session"]


def bridge_url(core_url: str, base: str | None = None) -> str:
    """The WebSocket URL of Core's bridge: ``http(s)://host[:port][/]`` → ``ws(s)://…/bridge``.

    A relative ``core_url`` is resolved against ``base`` (the page's URL). A ``ws(s)://``
    URL with a path is used as it is. Parsed by the JS ``URL`` class, the parser the
    WebSocket itself uses; ``urllib.parse`` would import ``ipaddress`` on the path to
    ready (~50 ms in the page).
    """
    try:
        url = _js().URL.new(core_url, base)
    except Exception:  # a JS TypeError: not a URL (e.g. relative with no base)
        url = None
    scheme = url and {"http:": "ws", "https:": "wss", "ws:": "ws", "wss:": "wss"}.get(
        url.protocol)
    if not scheme or not url.host:
        raise ValueError(f"Core URL must be http(s):// or ws(s)://, got {core_url!r}")
    path = url.pathname
    if url.protocol in ("http:", "https:") or path in ("", "/"):
        path = BRIDGE_PATH
    return f"{scheme}://{url.host}{path}{url.search}"


async def check_origin(url: str) -> None:
    """Ask Core (``GET /pedelec/v1/origin-check``) whether the bridge at ``url`` takes this
    page's (or worker's) origin, when that is not Core's own: a refused WebSocket
    handshake tells Python nothing but "closed". Raises :class:`OriginRefusedError` naming
    the origin and ``--allow-origin``; returns when allowed, or when Core cannot say
    (unreachable, or without the check: connecting says why)."""
    scope = _js()
    location = getattr(scope, "location", None)
    page = str(location.origin) if location is not None else "null"
    core = scope.URL.new(url.replace("ws", "http", 1)).origin  # ws(s):// -> http(s)://
    # Not asked: Core's rule (core/bridge.py origin_allowed, the only one) lets in an
    # Origin whose host is the Host it was reached at, so a page of Core's own origin
    # always; an opaque origin cannot be named in --allow-origin. The JS loader's
    # admission() is this, for a page that starts from a script tag.
    if page == "null" or page == core:
        return
    try:
        response = await scope.fetch(core + ORIGIN_CHECK_PATH)
        if not response.ok:
            return
        answer = json.loads(await response.text())
    except Exception:  # unreachable, or not JSON: the WebSocket will say more
        return
    if isinstance(answer, dict) and answer.get("allowed") is False:
        raise OriginRefusedError(
            f"Core at {core} does not let pages from {page} open a session: start it with "
            f"--allow-origin {page}")


def storage_prefix(url: str, nth: int = 1) -> str:
    """The sessionStorage key prefix of the ``nth`` session this page made for one Core
    (its bridge URL). A page that runs the same code after a reload makes its sessions in
    the same order, so each finds its own id again."""
    return f"pedelec:{url}:" if nth == 1 else f"pedelec:{url}:{nth}:"


def _js() -> Any:
    """The ``js`` module (Pyodide only): the page's (or the worker's) global scope."""
    import js  # type: ignore[import-not-found]

    return js


def session_storage() -> Storage | None:
    """``window.sessionStorage`` when the page has one (not in a worker, not blocked)."""
    try:
        storage = getattr(_js(), "sessionStorage", None)
        if storage is None:
            return None
        storage.getItem("pedelec:probe")
    except Exception:  # a sandboxed frame throws SecurityError on access
        return None
    return storage  # type: ignore[no-any-return]


def page_url() -> str | None:
    location = getattr(_js(), "location", None)
    return str(location.href) if location is not None else None


class ConsoleHandler(logging.Handler):
    """Each record to the JS console (the browser's developer tools), as one message with
    its traceback. Without a handler, Python's fallback writes records to ``sys.stderr``,
    which in a notebook kernel is the output of whichever cell ran last: every handler's
    traceback would appear there, in red, as if that cell had failed."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            console = _js().console
            if record.levelno >= logging.ERROR:
                method = console.error
            elif record.levelno >= logging.WARNING:
                method = console.warn
            else:
                method = console.info
            method(self.format(record))
        except Exception:
            self.handleError(record)


def log_to_console() -> None:
    """Send the package's log (``logging.getLogger("pedelec_pyodide")``) to the JS console
    only. Done once, when a session connects; ``propagate = True`` on that logger brings
    the records to one's own handlers as well."""
    if any(isinstance(h, ConsoleHandler) for h in logger.handlers):
        return
    handler = ConsoleHandler()
    handler.setFormatter(logging.Formatter("pedelec: %(message)s"))
    logger.addHandler(handler)
    logger.propagate = False


def in_worker() -> bool:
    """True in a Web Worker (e.g. a JupyterLite Pyodide kernel): no ``document`` there."""
    scope = _js()
    return (getattr(scope, "WorkerGlobalScope", None) is not None
            and getattr(scope, "document", None) is None)


def explain_worker_error(exc: BaseException) -> str | None:
    """The hint for a handler that reached for the DOM in a Web Worker, else None."""
    if isinstance(exc, AttributeError) and exc.name in ("document", "window"):
        return ("the notebook kernel has no DOM: this Python runs in a Web Worker, where "
                "js.document and js.window do not exist")
    return None


class PageLoop:
    """The page's scheduler: Pyodide's WebLoop spawns async handlers and times progress
    and cancels, looked up at each call (``get_event_loop`` is the WebLoop).

    Each turn of the WebLoop is a JS task, which costs a request more than a short handler
    does. So a task's first step runs at once (``eager``), up to its first ``await``, in
    the JS task its request arrived in, as a sync handler runs: unless this Pyodide can
    switch stacks (JSPI, on a page started without the memory snapshot), where a handler
    may suspend on a JS promise (``run_sync``, Pyodide's ``time.sleep``) only in a turn of
    the loop, not in the socket's message handler. Tasks are not made by
    ``loop.create_task``, which ignores ``eager_start`` and adds a done callback of its
    own to each task (one more JS task when it ends)."""

    def __init__(self, *, eager: bool | None = None) -> None:
        self.eager = not _can_switch_stacks() if eager is None else eager

    def time(self) -> float:
        return asyncio.get_event_loop().time()

    def call_later(self, delay: float, callback: Callable[[], object]) -> asyncio.TimerHandle:
        return asyncio.get_event_loop().call_later(delay, callback)

    def create_task(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        loop = asyncio.get_event_loop()
        # (Python 3.12+, as Pyodide's is; and only on the running loop, as eager start
        # requires)
        if sys.version_info >= (3, 12) and self.eager and asyncio._get_running_loop() is loop:
            return asyncio.Task(coro, loop=loop, eager_start=True)
        return asyncio.Task(coro, loop=loop)


@functools.cache  # the runtime's, the same for every session
def _can_switch_stacks() -> bool:
    """Whether this Pyodide can suspend Python on a JS promise (JSPI: a browser that has
    it, and a runtime not restored from a snapshot made without it); when unsure, yes (a
    handler's first step then waits for a turn of the loop, as it always may)."""
    try:
        from pyodide.ffi import can_run_sync, run_sync  # type: ignore[import-not-found]
    except ImportError:  # not Pyodide
        return True
    if can_run_sync():  # a call that may suspend: it has JSPI
        return True
    try:  # here it cannot suspend: run_sync refuses at once, saying why
        run_sync(_js().Promise.resolve())
    except Exception as exc:
        return "not supported" not in str(exc)
    return True


def create_session(
    core_url: str,
    tools: Iterable[Tool] = (),
    *,
    storage: Storage | bool | None = True,
    **session_options: Any,
) -> Session:
    """A Session for Core at ``core_url`` whose id, token and ledger live in ``storage``.

    ``storage=True`` (default) uses ``sessionStorage`` when there is one; ``False`` or
    ``None`` keeps everything in memory. Not connected yet: see :func:`connect`.
    """
    url = bridge_url(core_url, page_url())
    store = session_storage() if storage is True else storage or None
    _SESSIONS_MADE[url] = nth = _SESSIONS_MADE.get(url, 0) + 1
    prefix = storage_prefix(url, nth)
    if store is not None:
        session_options.setdefault("ledger", StorageLedger(store, prefix + "ledger:"))
    if in_worker():
        session_options.setdefault("explain_error", explain_worker_error)
    session_options.setdefault("scheduler", PageLoop())
    session = Session(tools, **session_options)
    session.client.setdefault("runtime", "pyodide")
    if store is not None:
        raw = store.getItem(prefix + "session")
        if raw:
            saved = json.loads(raw)
            session.session_id = saved.get("sessionId")
            session.resume_token = saved.get("resumeToken")
    _BRIDGE_CONFIG[id(session)] = (url, store, prefix)
    return session


_BRIDGE_CONFIG: dict[int, tuple[str, Storage | None, str]] = {}
# sessions made per bridge URL in this page, for their storage prefixes
_SESSIONS_MADE: dict[str, int] = {}


class CoreLink:
    """One Session's link to Core: a JS WebSocket, reopened with backoff when it drops."""

    def __init__(
        self,
        session: Session,
        url: str,
        storage: Storage | None,
        prefix: str,
        *,
        reconnect: bool = True,
        min_delay: float = 0.25,
        max_delay: float = 10.0,
    ) -> None:
        self.session = session
        self.url = url
        self.reconnect = reconnect
        self.min_delay = min_delay
        self.max_delay = max_delay
        self._storage = storage
        self._prefix = prefix
        self._socket: Any = None
        # the open socket's send (its JS method, taken once: every tool result goes through
        # it), None while no connection is open
        self._send_frame: Callable[[str], Any] | None = None
        self._handlers: tuple[Any, ...] = ()
        self._welcomed: asyncio.Future[None] | None = None
        self._failures = 0
        self._retry: asyncio.TimerHandle | None = None
        self._stopped = False
        self._refused = False
        self.connections = 0

    # Transport -----------------------------------------------------------------------

    def send(self, frame: str) -> None:
        send = self._send_frame
        if send is None:
            raise ConnectionError("the connection to Core is not open")
        send(frame)

    # lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Open the first connection and wait for Core's ``welcome``."""
        self._welcomed = asyncio.get_running_loop().create_future()
        self._open()
        try:
            await self._welcomed
        finally:
            self._welcomed = None

    def _open(self) -> None:
        from pyodide.ffi import create_proxy  # type: ignore[import-not-found, unused-ignore]

        self._retry = None
        if self._stopped:
            return
        try:
            socket = _js().WebSocket.new(self.url)
        except Exception as exc:  # a malformed URL or a blocked port throws at once
            self._fail_first(CoreUnreachableError(f"cannot open {self.url}: {exc}"))
            return
        # A message has a handler of its own: it reads only the frame (each property read
        # crosses into JS).
        on_message = create_proxy(self._on_message)
        on_other = create_proxy(self._on_socket_event)
        socket.onmessage = on_message
        socket.onopen = socket.onclose = socket.onerror = on_other
        self._socket = socket
        self._handlers = (on_message, on_other)

    def _on_message(self, event: Any) -> None:
        data = event.data
        if isinstance(data, str):
            self.session.receive(data)
        else:
            logger.warning("ignoring a binary frame from Core")

    def _on_socket_event(self, event: Any) -> None:
        kind = event.type
        if kind == "open":
            self.connections += 1
            self._send_frame = self._socket.send
            if not self.session.closed:
                self.session.connection_made(self, self)
        elif kind == "close":
            self._closed(int(event.code), str(event.reason))
        # "error" is always followed by "close", which carries what there is to know

    def _detach(self) -> None:
        socket, handlers = self._socket, self._handlers
        self._socket = self._send_frame = None
        self._handlers = ()
        if socket is not None:
            socket.onopen = socket.onmessage = socket.onclose = socket.onerror = None
        for handler in handlers:
            # not from inside its own call: destroy on the next turn of the loop
            asyncio.get_event_loop().call_soon(handler.destroy)

    def _closed(self, code: int, reason: str) -> None:
        was_welcomed = self.session.connected
        self._detach()
        if not self.session.closed:
            self.session.connection_lost()
        detail = f"code {code}" + (f", {reason}" if reason else "")
        refused = self._refused or (rejected_resume(code) and not was_welcomed)
        self._refused = False
        if code == protocol.CLOSE_SUPERSEDED and not self._stopped:
            # Taking it back would take it from the other side, which would do the same:
            # a reconnect storm. The other connection keeps the session; this one starts
            # afresh (its waiting turns end TURN_LOST).
            logger.warning("another connection (a duplicated tab?) resumed session %s; "
                           "starting a new one", self.session.session_id)
            self._forget()
            self._open()
            return
        if refused and self.session.session_id is not None and not self._stopped:
            logger.warning("Core refused to resume session %s (%s); starting a new one",
                           self.session.session_id, detail)
            self._forget()
            self._open()
            return
        # Core asked to try again later (1013: on a cluster, a node that cannot reach its
        # store neither knows nor refuses the session): even the first connection backs
        # off and resumes, keeping the session, rather than failing connect().
        try_again = code == protocol.CLOSE_TRY_AGAIN and self.reconnect
        if self._welcomed is not None and not was_welcomed and not try_again:
            self._fail_first(CoreUnreachableError(
                f"cannot connect to Core at {self.url} ({detail}): is `pedelec serve` "
                "running there, and does it allow this page's origin?"
            ))
            return
        if self._stopped or not self.reconnect or self.session.closed:
            return
        delay = min(self.max_delay, self.min_delay * 2 ** self._failures)
        delay *= 0.5 + random.random() / 2
        self._failures += 1
        logger.warning("connection to Core lost (%s); reconnecting in %.2fs", detail, delay)
        self._retry = asyncio.get_event_loop().call_later(delay, self._open)

    def _fail_first(self, error: Exception) -> None:
        self._stopped = True
        welcomed = self._welcomed
        if welcomed is not None and not welcomed.done():
            welcomed.set_exception(error)

    # AdapterEvents: what the Session tells this adapter --------------------------------

    def welcomed(self, welcome: protocol.Welcome) -> None:
        self._failures = 0
        self._save()
        if self._welcomed is not None and not self._welcomed.done():
            self._welcomed.set_result(None)

    def refused(self, error: protocol.Error) -> None:
        # refused before welcome (e.g. an unknown or expired session): start afresh
        if self.session.session_id is not None:
            logger.warning("Core refused the hello (%s: %s)", error.code, error.message)
            self._refused = True
            socket = self._socket
            self._send_frame = None
            if socket is not None:
                socket.close(4000, "retrying without resume")
        elif self._welcomed is not None and not self._welcomed.done():
            self._fail_first(CoreUnreachableError(
                f"Core at {self.url} refused the session: {error.code}: {error.message}"
            ))
            socket = self._socket
            self._send_frame = None
            if socket is not None:
                socket.close(1000, "refused")

    def session_closed(self) -> None:
        self.stop(forget=True)

    def _save(self) -> None:
        if self._storage is not None and self.session.session_id:
            self._storage.setItem(self._prefix + "session", json.dumps({
                "sessionId": self.session.session_id,
                "resumeToken": self.session.resume_token,
            }))

    def _forget(self) -> None:
        self.session.session_id = None
        self.session.resume_token = None
        if self._storage is not None:
            self._storage.removeItem(self._prefix + "session")

    def stop(self, *, forget: bool = False) -> None:
        """Close the connection for good (no reconnect); ``forget`` drops the stored id."""
        self._stopped = True
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        socket = self._socket
        self._detach()
        if socket is not None:
            socket.close(1000, "closed by the page")
            if not self.session.closed:
                self.session.connection_lost()
        if forget:
            self._forget()
        _BRIDGES.pop(id(self.session), None)


def rejected_resume(code: int) -> bool:
    """Close codes 4000-4999 are application codes: Core refused this session's resume."""
    return 4000 <= code < 5000


_BRIDGES: dict[int, CoreLink] = {}


def bridge_of(session: Session) -> CoreLink | None:
    """The :class:`CoreLink` of ``session``, if it is connected to Core through one."""
    return _BRIDGES.get(id(session))


async def connect(
    core_url: str,
    tools: Iterable[Tool] = (),
    *,
    session: Session | None = None,
    storage: Storage | bool | None = True,
    reconnect: bool = True,
    check_origin_first: bool = True,
    **session_options: Any,
) -> Session:
    """Connect a Session to Core at ``core_url`` (``http(s)://host:port`` or a ``ws(s)`` URL).

    Without ``session`` a new one is made (see :func:`create_session`); with it, that
    Session (made by :func:`create_session`, or any Session, which then keeps nothing in
    storage) is connected, and ``tools`` are added to it. Returns once Core has welcomed
    the session; raises :class:`CoreUnreachableError` if the first connection fails, and
    its :class:`OriginRefusedError` if Core on another origin says it does not allow this
    one (:func:`check_origin`; ``check_origin_first=False`` skips that question).
    After that, a dropped connection is reopened with exponential backoff and the session
    resumed; ``session.close()`` closes the connection for good.
    """
    log_to_console()
    if session is None:
        session = create_session(core_url, tools, storage=storage, **session_options)
    else:
        if session_options:
            raise TypeError("session options apply only when connect() makes the session")
        for tool in tools:
            session.add_tool(tool)
    if session.closed:
        raise SessionClosedError("the session is closed")
    if id(session) in _BRIDGES:
        raise RuntimeError("this session is already connected")
    config = _BRIDGE_CONFIG.get(id(session)) or (bridge_url(core_url, page_url()), None, "")
    url, store, prefix = config
    if check_origin_first:  # before the session's storage config is taken: a retry has it
        await check_origin(url)
    _BRIDGE_CONFIG.pop(id(session), None)
    bridge = CoreLink(session, url, store, prefix, reconnect=reconnect)
    _BRIDGES[id(session)] = bridge
    try:
        await bridge.start()
    except BaseException:
        bridge.stop()
        raise
    return session


# --- the page's JS API (web/pedelec-pyodide.js) -------------------------------------------


def _call_event(call: ToolCall) -> str:
    # the result is JSON text already (encoded once, to check it): spliced in, not
    # encoded again
    head = json.dumps({
        "toolRequestId": call.tool_request_id,
        "turnId": call.turn_id,
        "tool": call.tool,
        "args": call.args,
        "handledBy": call.handled_by,
        "durationMs": round(call.duration_ms, 3),
        "source": call.source,
    }, ensure_ascii=False)
    return f'{head[:-1]}, "result": {call.result_json}}}'


#: the page's JS event each kind of session event becomes
_EVENT_TYPES: dict[type, str] = {
    SessionState: "statechange",
    ToolCall: "toolcall",
    protocol.TurnDelta: "delta",
    protocol.TurnEnd: "turnend",
    protocol.Welcome: "welcome",
    protocol.Error: "error",
    ToolProgress: "toolprogress",
    ToolStatus: "toolstatus",
}


def _event_json(session: Session, kind: str, event: Any) -> str:
    """The ``detail`` of the page's JS event ``kind`` (see :data:`_EVENT_TYPES`), as JSON."""
    if kind == "toolcall":
        return _call_event(event)
    detail: dict[str, Any]
    if kind == "statechange":
        detail = {"state": event.value, "id": session.session_id}
    elif kind == "toolstatus":
        detail = {"toolRequestId": event.tool_request_id, "tool": event.tool,
                  "turnId": event.turn_id, "status": event.status, "source": event.source}
    elif kind == "toolprogress":
        detail = {"toolRequestId": event.tool_request_id, "tool": event.tool,
                  "turnId": event.turn_id, "progress": event.progress, "total": event.total,
                  "message": event.message, "source": event.source}
    elif kind == "delta":
        detail = {"turnId": event.turn_id, "text": event.text}
    elif kind == "turnend":
        detail = {"turnId": event.turn_id, "status": event.status, "text": event.text,
                  "error": event.error}
    elif kind == "welcome":
        detail = {"id": event.session_id, "resumed": event.resumed,
                  "state": session.state.value}
    else:  # error
        detail = {"code": event.code, "message": event.message}
    return json.dumps(detail, ensure_ascii=False)


class PageSession:
    """What web/pedelec-pyodide.js holds: the page's Session and its JS-facing calls.

    ``emit(type, json)`` is a JS function; it receives every session event as a type
    (``statechange``, ``toolcall``, ``toolstatus``, ``toolprogress``, ``approval``,
    ``approvalwithdrawn``, ``delta``, ``turnend``, ``welcome``, ``error``) and a JSON
    string, and, once :meth:`webmcp_start` was called, the registrations the loader makes
    with ``document.modelContext`` (``webmcpregister``, ``webmcpunregister``).
    ``namespace`` is the globals of the page's Python blocks (``session`` is bound
    there).

    Session events cost the page's one thread on every tool call (the event built, its
    JSON, the JS call, ``JSON.parse``, ``dispatchEvent``), so with ``"events"`` in the
    options (the loader's list of the types its JS listens to) only those are emitted,
    and :meth:`listen` adds a type when the page's JS first listens to it; the session
    builds only the events of those types (none at all when none is listened to).
    Without ``"events"``, every type is emitted. The JS reads the session's state and id when asked
    (:meth:`state`, :meth:`session_id`), not from events.

    Approvals: unless the page's Python registers ``session.on_approval``, a request that
    needs approval is an ``approval`` event for the page's JS, answered by
    :meth:`decide`. Those asked before the page is ready (a request Core re-sends as the
    page reloads) wait for :meth:`ready`: the app's listeners are not attached before.
    The JS answers at once, "no approver", when nothing listens.
    """

    def __init__(self, core_url: str, emit: Callable[[str, str], Any],
                 options_json: str = "{}") -> None:
        options = json.loads(options_json)
        self.core_url = core_url
        self.session = create_session(core_url, storage=options.get("storage", True),
                                      default_approver=self._ask_page)
        self.namespace: dict[str, Any] = {"__name__": "__main__", "session": self.session}
        self._emit = emit
        events = options.get("events")
        # None: every type (no list given)
        self._wanted: set[str] | None = None if events is None else {str(e) for e in events}
        self._unsubscribe: Callable[[], None] | None = None
        self._subscribe()
        self._is_ready = False
        self._ready_waiters: list[asyncio.Future[None]] = []
        # tool request id -> the request and the JS decision awaited: (approved, reason,
        # no approver)
        self._asking: dict[str, tuple[ApprovalRequest,
                                      asyncio.Future[tuple[bool, str | None, bool]]]] = {}
        self._webmcp: WebMCP | None = None

    async def _ask_page(self, request: ApprovalRequest) -> bool:
        if not self._is_ready:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._ready_waiters.append(waiter)
            await waiter
        decision: asyncio.Future[tuple[bool, str | None, bool]] = (
            asyncio.get_running_loop().create_future())
        self._asking[request.tool_request_id] = (request, decision)
        about = json.dumps({"toolRequestId": request.tool_request_id, "tool": request.tool,
                            "args": request.args, "turnId": request.turn_id,
                            "source": request.source},
                           ensure_ascii=False)
        shown = True

        def withdrawn() -> None:
            # answered without the page's verdict (cancelled, the session closed): the
            # page takes its question down, before it hears the request is done
            nonlocal shown
            if shown:
                shown = False
                self._emit("approvalwithdrawn", about)

        request.on_withdrawn(withdrawn)
        try:
            self._emit("approval", about)
            approved, reason, nobody = await decision
        except asyncio.CancelledError:
            withdrawn()
            raise
        finally:
            self._asking.pop(request.tool_request_id, None)
        if nobody:
            raise ApprovalUnavailable("no approval listener on the page")
        return approved or request.deny(reason)

    def ready(self) -> None:
        """The page is ready and its listeners attached: ask what was held back."""
        self._is_ready = True
        waiters, self._ready_waiters = self._ready_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def decide(self, tool_request_id: str, decision_json: str) -> bool:
        """The page's answer to an ``approval`` event: ``{"approved", "reason"?,
        "noApprover"?}``. False if that request is not awaiting one (decided already,
        withdrawn)."""
        asked = self._asking.get(str(tool_request_id))
        if asked is None or asked[1].done() or asked[0].withdrawn:
            return False
        request, decision = asked
        answer = json.loads(decision_json)
        if answer.get("approved") is True:
            request.approve()  # recorded now: a reload before the handler runs keeps it
        reason = answer.get("reason")
        decision.set_result((answer.get("approved") is True,
                             reason if isinstance(reason, str) else None,
                             answer.get("noApprover") is True))
        return True

    def cancel(self, tool_request_id: str) -> bool:
        """``session.cancelTool(id)``: False if no such request is in flight."""
        return self.session.cancel(str(tool_request_id))

    def pending(self) -> str:
        """``session.pending`` as JSON."""
        return json.dumps([
            {"toolRequestId": item.tool_request_id, "tool": item.tool, "turnId": item.turn_id,
             "status": item.status, "progress": item.progress, "source": item.source}
            for item in self.session.pending], ensure_ascii=False)

    # WebMCP: the page's tools on document.modelContext (web/pedelec-pyodide.js registers
    # them as told here, and passes the browser's agent's calls in)

    def webmcp_start(self) -> str:
        """Register every offered tool now (``webmcpregister`` events) and follow the
        session's tools from now on. Returns ``{"maxInputBytes"}`` as JSON: a longer
        input the loader cuts short (it is refused, unread, as too large)."""
        if self._webmcp is None:
            self._webmcp = WebMCP(self.session, _Registrar(self._emit))
            self._webmcp.start()
        return json.dumps({"maxInputBytes": MAX_INPUT_BYTES})

    def webmcp_call(self, call_id: str, registration: str, input_json: str | None,
                    signal: str = "") -> Any:
        """A call of the browser's agent (see :meth:`WebMCP.call`; ``signal`` is
        ``"aborted"`` when its signal was aborted before the call reached the page);
        awaited by the loader's ``execute``: resolves to the result's JSON text."""
        if self._webmcp is None:
            raise RuntimeError("webmcp_start() was not called")
        return self._webmcp.call(str(call_id), str(registration),
                                 None if input_json is None else str(input_json),
                                 aborted=signal == "aborted")

    def webmcp_abort(self, call_id: str) -> bool:
        """The call's signal aborted: ``ctx.cancelled``, ``TOOL_CANCELLED`` after the
        grace period. False if it is not in flight."""
        return self._webmcp is not None and self._webmcp.abort(str(call_id))

    def listen(self, kind: str) -> None:
        """The page's JS listens to events of type ``kind`` from now on."""
        wanted = self._wanted
        if wanted is None or kind in wanted:
            return
        wanted.add(str(kind))
        if not self.session.closed:
            self._subscribe()

    def _subscribe(self) -> None:
        """(Again) to the session events the page's JS listens to: only those are built."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        wanted = self._wanted
        if wanted is None:
            self._unsubscribe = self.session.subscribe(self._forward)
            return
        kinds = [cls for cls, kind in _EVENT_TYPES.items() if kind in wanted]
        if kinds:
            self._unsubscribe = self.session.subscribe(self._forward, kinds=kinds)

    def state(self) -> str:
        """``session.state`` for the page's JS."""
        return self.session.state.value

    def session_id(self) -> str | None:
        """``session.id`` for the page's JS: Core's session id (None before the first)."""
        return self.session.session_id

    def _forward(self, event: Any) -> None:
        kind = _EVENT_TYPES.get(type(event))
        wanted = self._wanted
        if kind is not None and (wanted is None or kind in wanted):
            self._emit(kind, _event_json(self.session, kind, event))

    async def connect(self) -> str:
        """Connect; returns ``{"id", "state"}`` as JSON."""
        # the page's loader asked Core about the origin already, while Pyodide loaded
        await connect(self.core_url, session=self.session, check_origin_first=False)
        return json.dumps({"id": self.session.session_id, "state": self.session.state.value})

    def send_text(self, text: str) -> asyncio.Future[str]:
        """Start a turn; the future (a JS Promise) resolves to JSON: ``{"reply": text}``,
        or ``{"error": {"name", "code", "status", "message"}}`` for a turn that failed, was
        cancelled or could not start. The loader rejects ``sendText`` with that error: a
        page shows its message, never a Python class path and traceback."""
        return asyncio.ensure_future(self._turn(str(text)))

    async def _turn(self, text: str) -> str:
        error: dict[str, Any]
        try:
            reply = await self.session.send_text(text)
        except TurnError as exc:
            error = {"name": "TurnError", "code": exc.code, "status": exc.status,
                     "message": str(exc)}
        except (NotConnectedError, SessionClosedError) as exc:
            error = {"name": type(exc).__name__, "code": None, "status": None,
                     "message": str(exc)}
        else:
            return json.dumps({"reply": reply}, ensure_ascii=False)
        return json.dumps({"error": error}, ensure_ascii=False)

    def close(self) -> None:
        # closed first: the page hears the requests it settles and the state ``closed``
        # (on which the WebMCP registrations go)
        self.session.close()
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None


class _Registrar:
    """WebMCP registrations, told to the page's loader as events."""

    def __init__(self, emit: Callable[[str, str], Any]) -> None:
        self._emit = emit

    def register(self, descriptor_json: str) -> None:
        self._emit("webmcpregister", descriptor_json)

    def unregister(self, registration: str) -> None:
        self._emit("webmcpunregister", json.dumps({"registration": registration}))
