"""The Starlette app (``create_app``) and running it under uvicorn (``run``).

Routes: ``/pedelec/v1/health``, ``/pedelec/v1/origin-check``, the control API, MCP, the
WebSocket bridge, then static files: the Pyodide runtime at ``/pedelec/pyodide/``, the JS
bridge (``web/``) at ``/pedelec/`` (both public), and the app (``--app DIR``, or the demo,
with the agent it talks to at ``/agent.json``) at ``/``. Every request first passes the
Host check (:mod:`.http.public`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import html
import importlib
import json
import logging
import mimetypes
import signal
import socket
import sys
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import FrameType
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import (
    FileResponse,
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    Response,
)
from starlette.routing import BaseRoute, Mount, Route, WebSocketRoute
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket
from uvicorn.server import HANDLED_SIGNALS

from .. import protocol
from ..build.snapshot import MANIFEST_NAME, SNAPSHOT_NAME, SnapshotError, stored_file
from . import accept
from .agents import make_agent
from .agents.contract import Agent
from .clock import Clock
from .cluster import ClusterRouter, Node, ToolRelay, serve_forwarded
from .config import CoreConfig
from .http import control
from .http.http_limits import bounded_http
from .http.public import (
    HostCheck,
    PublicFiles,
    origin_check,
    own_hosts,
    serve_public,
    store_files,
)
from .http.snapshot import choose_encoding, identity_file, make_identity
from .http.tool_call_lane import ToolCallLane
from .log import log_event
from .page.bridge import BridgeConnection, normal_origin
from .page.ws_limits import bounded_websocket
from .sessions import SHUTDOWN_SECONDS, Registry
from .sessions.turns import restore
from .store import PRUNE_SECONDS, RECENT_TURNS, Store, check_reachable, open_store

for _suffix, _type in ((".mjs", "text/javascript"), (".js", "text/javascript"),
                       (".wasm", "application/wasm"), (".whl", "application/zip"),
                       (".json", "application/json"), (".zip", "application/zip")):
    mimetypes.add_type(_type, _suffix)

# On SIGTERM: open connections get GRACEFUL_SECONDS to finish, then turns and the store
# get SHUTDOWN_SECONDS, then the store's writer CLOSE_SECONDS: Core stops within 5 s
# whatever a page, a caller or the store is doing.
GRACEFUL_SECONDS = 1
CLOSE_SECONDS = 0.5
#: how long a thread holds the GIL while another waits for it (Python's default: 5 ms)
GIL_SWITCH_SECONDS = 0.0005


def agent_factory_for(config: CoreConfig) -> Callable[[], Agent]:
    """The factory of the agent named by ``--agent`` (with its ``--agent-header``s; an
    AG-UI agent's events may be ``--tool-timeout`` apart, and keep its run going as
    progress keeps a tool's, up to ``--max-total-factor`` times that; retries wait on
    Core's clock);
    raises ``ValueError`` (with :class:`~.agents.AgentUnavailable` for a known agent this
    build cannot run) at once, so a bad spec stops Core at start rather than failing every
    turn."""
    spec, headers, clock = config.agent, config.agent_headers, config.clock
    event_timeout = config.tool_timeout_ms / 1000
    factory = functools.partial(make_agent, spec, clock, headers=headers,
                                event_timeout=event_timeout,
                                run_limit=config.max_total_for(event_timeout))
    factory()
    return factory


#: the snapshot is revalidated on every load (304 by ETag when unchanged): its file
#: changes in place whenever the runtime or a wheel does
SNAPSHOT_CACHE_CONTROL = "no-cache"
#: the longest If-None-Match read (one tag is ~40 characters)
MAX_IF_NONE_MATCH = 4096


class InflatedSnapshot:
    """The snapshot's identity form, for clients that take neither stored encoding: made
    once per key, in a thread, shared by the requests that wait for it (:func:`make_identity`).
    A failure is remembered until the stored ``.gz`` changes, so no request inflates it
    twice."""

    def __init__(self) -> None:
        self._made: dict[tuple[Path, str, int, int], asyncio.Task[Path]] = {}

    async def file(self, directory: Path, key: str) -> Path:
        target = identity_file(directory, key)
        if target.is_file():
            return target
        stored = stored_file(directory, "gzip").stat()
        made = (directory, key, stored.st_mtime_ns, stored.st_size)
        task = self._made.get(made)
        if task is None:
            task = self._made[made] = asyncio.create_task(
                asyncio.to_thread(make_identity, directory, key))
        return await asyncio.shield(task)


async def serve_snapshot(directory: Path, request: Request,
                         inflated: InflatedSnapshot) -> Response:
    """``GET /pedelec/pyodide/pedelec-snapshot.bin``: the stored snapshot in the encoding the
    browser takes (``Content-Encoding: br`` or ``gzip``; inflated for one that takes
    neither), ``Vary: Accept-Encoding``, ``ETag`` by the snapshot's key and encoding,
    ``Cache-Control: no-cache``. 404 when there is none (pages then start without one).
    Every answer is a stored file: no request (a HEAD, a 304) compresses or inflates."""
    missing = PlainTextResponse("no memory snapshot here: pages start without one\n", 404,
                                headers={"cache-control": SNAPSHOT_CACHE_CONTROL})
    try:
        key = json.loads((directory / MANIFEST_NAME).read_text("utf-8"))["key"]
    except (OSError, ValueError, KeyError, TypeError):
        return missing
    encoding = choose_encoding(request.headers.get("accept-encoding", ""))
    if encoding is None:
        return PlainTextResponse("the snapshot is stored as br and gzip, and this request "
                                 "refuses both and identity\n", 406,
                                 headers={"cache-control": SNAPSHOT_CACHE_CONTROL,
                                          "vary": "Accept-Encoding"})
    stored = stored_file(directory, "gzip" if encoding == "identity" else encoding)
    if not isinstance(key, str) or not stored.is_file():
        return missing
    etag = f'"{key}-{encoding}"'
    headers = {"cache-control": SNAPSHOT_CACHE_CONTROL, "etag": etag,
               "vary": "Accept-Encoding"}
    if_none_match = request.headers.get("if-none-match", "")[:MAX_IF_NONE_MATCH]
    # weak comparison (RFC 9110 13.1.2): a proxy that recompresses marks the tag weak
    if if_none_match.strip() == "*" or etag in (
            tag.strip().removeprefix("W/") for tag in if_none_match.split(",")):
        return Response(status_code=304, headers=headers)
    if encoding == "identity":
        try:
            stored = await inflated.file(directory, key)
        except (SnapshotError, OSError) as exc:
            return PlainTextResponse(f"the snapshot cannot be served inflated ({exc}); "
                                     "ask for gzip or br\n", 503,
                                     headers={"cache-control": SNAPSHOT_CACHE_CONTROL,
                                              "vary": "Accept-Encoding"})
    else:
        headers["content-encoding"] = encoding
    return FileResponse(stored, media_type="application/octet-stream", headers=headers)


class PyodideFiles:
    """``/pedelec/pyodide/``: the runtime directory, once it is there; public (any origin
    may load it); its memory snapshot by :func:`serve_snapshot`.

    Until then (being provisioned, or missing) it answers 503 with what is going on.
    """

    def __init__(self, directory: Path | None, private: tuple[Path, ...] = ()) -> None:
        self._static: PublicFiles | None = None
        self._directory: Path | None = None
        self._inflated = InflatedSnapshot()
        self._private = private
        self.status = "missing"
        self.detail = (
            "no Pyodide runtime is configured: pass --pyodide DIR (a provisioned runtime), "
            "or let `pedelec serve`/`pedelec demo` provision one"
        )
        if directory is not None:
            self.ready(directory)

    def ready(self, directory: Path) -> None:
        self._static = PublicFiles(directory=directory, private=self._private)
        self._directory = directory
        self.status = "ready"
        self.detail = str(directory)

    def failed(self, message: str) -> None:
        self.status = "error"
        self.detail = message

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await serve_public(self._serve, scope, receive, send)

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (self._directory is not None and scope["type"] == "http"
                and scope["path"].endswith(f"/pyodide/{SNAPSHOT_NAME}")
                and scope["method"] in ("GET", "HEAD")):
            response = await serve_snapshot(self._directory, Request(scope), self._inflated)
            await response(scope, receive, send)
            return
        if self._static is not None:
            await self._static(scope, receive, send)
            return
        text = f"Pyodide runtime {self.status}: {self.detail}\n"
        await PlainTextResponse(text, status_code=503)(scope, receive, send)


def _missing_demo_page(config: CoreConfig) -> str:
    web = config.web_dir
    lines = [
        "Core is running, but the demo page is not in this build.",
        f"Looked for it in: {web / 'demo' if web else '(no web/ directory found)'}.",
        "The page is built from the repository's web/demo/ directory; run pedelec demo "
        "from a checkout that has it, or serve your own app with pedelec serve --app DIR.",
    ]
    items = "".join(f"<p>{html.escape(line)}</p>" for line in lines)
    return f"<!doctype html><title>pedelec demo</title><h1>pedelec demo</h1>{items}"


#: what the demo's chat header calls each kind of ``--agent``
AGENT_LABELS = {"offline": "offline agent", "openai": "model {} (OpenAI API)",
                "anthropic": "model {} (Anthropic API)", "ag-ui": "AG-UI agent"}


def demo_agent(spec: str) -> dict[str, str]:
    """``GET /agent.json`` of ``pedelec demo``: the kind of agent its chat talks to, and a
    label naming it. A model's name is shown; an AG-UI agent's URL never is (it may hold a
    password or a token in its query)."""
    kind, _, rest = spec.strip().partition(":")
    label = AGENT_LABELS.get(kind, "agent")  # (an agent made by an embedding app's factory)
    return {"kind": kind, "label": label.format(rest.strip())}


def _index_page(request: Request) -> Response:
    return HTMLResponse(
        "<!doctype html><title>pedelec Core</title><h1>pedelec Core</h1>"
        "<p>Core is running. Serve a web app here with <code>pedelec serve --app DIR</code>."
        "</p><p>Health: <a href='/pedelec/v1/health'>/pedelec/v1/health</a></p>"
    )


class LazyMcp:
    """The MCP route. The ``mcp`` SDK costs ~0.4 s and ~35 MiB to import, so it loads on
    the first MCP request, not when Core starts. Its session manager runs in a task of its
    own (anyio's task group must be left by the task that entered it) until :meth:`stop`.
    """

    def __init__(self, node: Node, allowed_origins: frozenset[str]) -> None:
        self.registry = node.registry
        self.allowed_origins = allowed_origins
        # serves relayed calls from the start, whether or not the SDK is loaded here
        self.relay = ToolRelay(node)
        self._endpoint: ASGIApp | None = None
        self._loading: asyncio.Task[ASGIApp] | None = None
        self._stopping = asyncio.Event()
        self._runner: asyncio.Task[None] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = self._endpoint
        if endpoint is None:
            if self._loading is None:
                self._loading = asyncio.ensure_future(self._load())
            endpoint = await asyncio.shield(self._loading)
        await endpoint(scope, receive, send)

    async def _load(self) -> ASGIApp:
        # imported in a thread: ~0.4 s of Python that would hold the event loop, and so
        # every other client, that long (the thread hands the loop the GIL every 5 ms)
        await asyncio.to_thread(importlib.import_module, f"{__package__}.http.mcp")
        from .http.mcp import McpEndpoint  # (imported: a lookup now)

        endpoint = McpEndpoint(self.registry, self.allowed_origins, self.relay)
        running = asyncio.get_running_loop().create_future()

        async def run() -> None:
            async with endpoint.run():
                running.set_result(None)
                await self._stopping.wait()

        runner = self._runner = asyncio.create_task(run())
        await asyncio.wait({runner, running}, return_when=asyncio.FIRST_COMPLETED)
        if not running.done():  # the SDK failed to start: say why, and try again next time
            self._loading = None
            runner.result()
            raise RuntimeError("the MCP session manager stopped before it started")
        self._endpoint = endpoint
        return endpoint

    async def stop(self) -> None:
        self._stopping.set()
        if self._runner is not None:
            await self._runner


async def _prune_turns(store: Store, clock: Clock) -> None:
    """Old turns leave the store on a schedule, not at load: a session that lives long
    keeps its latest turns only."""
    while True:
        store.prune_turns(RECENT_TURNS)
        await clock.sleep(PRUNE_SECONDS)


def create_app(config: CoreConfig) -> Starlette:
    """The whole of Core as an ASGI app; start and stop it with its lifespan."""
    agent_factory = config.agent_factory or agent_factory_for(config)
    store = open_store(config.store, config.store_timeout, config.cluster_secret, config.clock)
    registry = Registry(config, store, agent_factory, restore)
    node = Node(registry)
    private = store_files(config.store)  # never served, wherever --store points
    pyodide = PyodideFiles(config.pyodide_dir, private)
    allowed = frozenset(normal_origin(origin) for origin in config.allow_origins)
    mcp_endpoint = LazyMcp(node, allowed)

    async def bridge(websocket: WebSocket) -> None:
        await BridgeConnection(websocket, node).serve(allowed)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        snapshot = node.leases.restorable(await store.load())
        restore(registry, snapshot)
        pruning = asyncio.create_task(_prune_turns(store, config.clock))
        cluster = asyncio.create_task(node.serve())
        provisioning: asyncio.Task[None] | None = None
        if config.pyodide_dir is None and config.provision:
            provisioning = asyncio.create_task(_provision(pyodide))
        log_event("core.started", host=config.host, port=config.port, store=store.label,
                  node=registry.node if store.shared else None)
        try:
            yield
        finally:
            pruning.cancel()
            cluster.cancel()
            if provisioning is not None:
                provisioning.cancel()
            await mcp_endpoint.stop()
            await mcp_endpoint.relay.stop()  # its calls' cancels, passed on meanwhile
            await registry.shutdown(SHUTDOWN_SECONDS)
            await store.close(CLOSE_SECONDS)
            log_event("core.stopped")

    routes: list[BaseRoute] = [
        Route("/pedelec/v1/health", control.health),
        Route(protocol.ORIGIN_CHECK_PATH, origin_check(allowed)),
        Route("/pedelec/v1/sessions", control.list_sessions),
        Route("/pedelec/v1/sessions/{session_id}", control.get_session),
        Route("/pedelec/v1/sessions/{session_id}/tool-calls", control.tool_call,
              methods=["POST"]),
        Route("/pedelec/v1/sessions/{session_id}/tool-calls/{tool_request_id}",
              control.tool_request),
        Route("/pedelec/v1/sessions/{session_id}/turns", control.turn, methods=["POST"]),
        Route("/pedelec/v1/sessions/{session_id}/mcp", mcp_endpoint,
              methods=["GET", "POST", "DELETE"]),
        WebSocketRoute(protocol.BRIDGE_PATH, bridge),
        Mount("/pedelec/pyodide", app=pyodide),
    ]
    if config.web_dir is not None:
        routes.append(Mount("/pedelec", app=PublicFiles(directory=config.web_dir,
                                                        private=private, cors=True)))
    if config.app_dir is not None:
        routes.append(Mount("/", app=PublicFiles(directory=config.app_dir, html=True,
                                                 private=private)))
    elif config.demo:
        demo_dir = config.web_dir / "demo" if config.web_dir is not None else None
        if demo_dir is not None and (demo_dir / "index.html").is_file():
            # no-store: the next demo on this port may run another agent
            agent = demo_agent(config.agent)
            routes.append(Route("/agent.json", lambda request: JSONResponse(
                agent, headers={"cache-control": "no-store"})))
            routes.append(Mount("/", app=PublicFiles(directory=demo_dir, html=True,
                                                     private=private)))
        else:
            page = _missing_demo_page(config)
            routes.append(Route("/", lambda request: HTMLResponse(page, status_code=503)))
    else:
        routes.append(Route("/", _index_page))

    hosts = own_hosts(config.host, config.allow_hosts)
    # a control-API call for a session another node holds goes there (cluster/routing.py);
    # a tool call for one held here, straight to its handler (http/tool_call_lane.py)
    app = Starlette(routes=routes, lifespan=lifespan,
                    middleware=[Middleware(HostCheck, hosts=hosts),
                                Middleware(ClusterRouter, node=node),
                                Middleware(ToolCallLane)])
    node.serve_forwarded = functools.partial(serve_forwarded, app)
    app.state.registry = registry
    app.state.node = node
    app.state.admin_token = config.admin_token
    app.state.pyodide = pyodide
    return app


async def _provision(pyodide: PyodideFiles) -> None:
    """Provision the Pyodide runtime into the cache, in a thread; /health answers meanwhile."""
    from ..build import provision as provisioning

    pyodide.status = "provisioning"
    pyodide.detail = "fetching the Pyodide runtime and wheels (first start only)"
    out_dir = provisioning.cache_dir() / "site"
    try:
        result = await asyncio.to_thread(
            provisioning.provision, out_dir,
            log=lambda line: log_event("provision", message=line))
    except provisioning.ProvisionError as exc:
        pyodide.failed(str(exc))
        # pages cannot load: shown with --quiet too (health's pyodideDetail has it)
        log_event("provision.failed", level=logging.WARNING, error=str(exc))
        return
    pyodide.ready(result.pyodide_dir)
    log_event("provision.ready", directory=str(result.pyodide_dir))


def uvicorn_config(app: Starlette, config: CoreConfig) -> uvicorn.Config:
    """uvicorn settings for Core. Requests' heads are bounded in size and time
    (:mod:`.http.http_limits`); the loop does not spin when file descriptors run out
    (:mod:`.accept`). The WebSocket library refuses frames over four times
    the limit outright (close 1009) without buffering them; up to that, Core reads the
    frame and answers ``FRAME_TOO_LARGE``, keeping the connection. No permessage-deflate:
    its zlib state costs ~50 KiB per connection, most of an idle session's memory. The
    WebSocket protocol counts every frame and keeps no pongs for a client that does not
    read (:mod:`.page.ws_limits`)."""
    return uvicorn.Config(
        app, host=config.host, port=config.port, log_level="warning", access_log=False,
        ws=bounded_websocket(config),
        ws_max_size=4 * config.max_frame_bytes, ws_per_message_deflate=False, lifespan="on",
        timeout_graceful_shutdown=GRACEFUL_SECONDS,
        http=bounded_http(config.header_timeout, config.clock,
                          control.stopping_error().response()),
        loop=f"{accept.__name__}:new_event_loop",
        # the client's address from X-Forwarded-For only when the peer is a proxy named by
        # --forwarded-allow-ips (uvicorn alone would trust 127.0.0.1 by default)
        proxy_headers=bool(config.forwarded_allow_ips),
        # uvicorn trusts any peer for "*" alone, not for "*" among others
        forwarded_allow_ips="*" if "*" in config.forwarded_allow_ips
        else list(config.forwarded_allow_ips),
    )


def freeze_start_heap() -> None:
    """Keep what Core's start made (its modules, classes and app: ~50,000 objects, as
    long-lived as Core) out of the garbage collector's full passes. A pass walks every
    object the collector tracks, and a large value decoded (a page's frame, a model's
    arguments: json holds the GIL) sets off several of them: 1 MiB of small arrays
    decoded ~3 times as fast with these out of view (``bench/big_decode.py``)."""
    gc.collect()
    gc.freeze()


def run(config: CoreConfig, announce: Callable[[str], None] = print) -> None:
    """Bind, ``announce`` the URL, serve until Ctrl-C or SIGTERM (the lifespan cancels
    running turns and flushes the store). A stop signal before the server exists ends the
    start with KeyboardInterrupt."""
    with _StopSignals() as stop:
        family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
        # proto=TCP: asyncio sets TCP_NODELAY only on sockets that say so (else Nagle
        # and delayed ACKs add ~40 ms to every small answer)
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((config.host, config.port))
            sock.listen(2048)  # connections made once the URL is out wait for the server
        except OSError:
            sock.close()
            raise
        config.port = sock.getsockname()[1]
        # Core's worker threads (long frames, new regular expressions, large values) hold
        # the GIL for CPU work, and at Python's 5 ms switch interval each of the loop's
        # system calls may wait that long to get it back (the convoy effect): one client
        # keeping the pattern thread busy added 200+ ms to everyone's /health p99. 0.5 ms
        # bounds the wait.
        sys.setswitchinterval(GIL_SWITCH_SECONDS)
        app = create_app(config)
        asyncio.run(check_reachable(config.store, config.store_timeout, config.clock))
        shown = "127.0.0.1" if config.host in ("0.0.0.0", "") else config.host
        if ":" in shown:
            shown = "[::1]" if shown == "::" else f"[{shown}]"
        server = _Server(uvicorn_config(app, config), app.state.registry)
        freeze_start_heap()
        stop.hand_to(server)
        announce(f"http://{shown}:{config.port}/")
        server.run(sockets=[sock])


def _gave_up(record: logging.LogRecord) -> bool:
    """uvicorn's ``ERROR`` line for the requests it cancels at a stop, logged as Core's
    event instead: giving up on them after GRACEFUL_SECONDS is how Core stops (each is
    answered ``CORE_STOPPING``: http_limits), not an error for an operator's alerts."""
    if isinstance(record.msg, str) and record.msg.startswith("Cancel %s running task(s)"):
        args = record.args
        log_event("core.gave_up", level=logging.WARNING,
                  waiting=args[0] if isinstance(args, tuple) and args else None)
        return False
    return True


class _Server(uvicorn.Server):
    """uvicorn's, telling the registry when it begins to stop (a streamed tool call it
    gives up on after GRACEFUL_SECONDS ends with CORE_STOPPING; any other request is
    answered so by the HTTP protocol: http_limits), and stopping Core's own work (turns,
    the store) even when told twice to stop: uvicorn's force exit skips the lifespan's
    end, which is bounded."""

    def __init__(self, config: uvicorn.Config, registry: Registry) -> None:
        super().__init__(config)
        self.registry = registry
        logging.getLogger("uvicorn.error").addFilter(_gave_up)  # (once: the same filter)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.registry.stopping = True
        await super().shutdown(sockets)
        if self.force_exit:
            await self.lifespan.shutdown()


class _StopSignals:
    """SIGINT and SIGTERM while :func:`run` runs, in the main thread (elsewhere the
    caller's handlers stay). Until the server exists a stop signal ends the start
    (KeyboardInterrupt); from then on it tells the server to stop, as uvicorn's own
    handlers do once installed. A signal must not be lost on the way, though a handler's
    exception raised inside a finalizer is printed and dropped by Python: one received
    before the server existed stops it as soon as it does."""

    def __init__(self) -> None:
        self._server: uvicorn.Server | None = None
        self._received: list[int] = []
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _StopSignals:
        if threading.current_thread() is threading.main_thread():
            self._previous = {stop: signal.signal(stop, self._handle)
                              for stop in HANDLED_SIGNALS}
        return self

    def __exit__(self, *exc_info: object) -> None:
        for stop, handler in self._previous.items():
            signal.signal(stop, handler)

    def hand_to(self, server: uvicorn.Server) -> None:
        self._server = server
        for number in self._received:
            server.handle_exit(number, None)

    def _handle(self, number: int, frame: FrameType | None) -> None:
        if self._server is not None:
            self._server.handle_exit(number, frame)
            return
        self._received.append(number)
        raise KeyboardInterrupt
