"""What Core serves, and to whom.

- :class:`PublicFiles`: static files that never serve a dot-path (``.env``, ``.git/``, any
  segment starting with ``.``) or one of Core's own store files, whatever the URL's
  spelling (``%2e``, ``..``, ``%2F``, backslashes, double slashes, symlinks, case);
- :func:`serve_public`: the CORS headers that let a page on any origin load Core's own
  files under ``/pedelec/`` (the loader, Pyodide, our lock and wheels), and preflights;
- :func:`origin_check`: ``GET /pedelec/v1/origin-check``, public, tells a page on another
  origin whether the bridge will take it (a refused WebSocket handshake tells JS nothing);
- :class:`HostCheck`: every request (HTTP and WebSocket) must name one of Core's own hosts
  in its ``Host`` header (DNS rebinding).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..log import log_event
from ..page.bridge import origin_allowed
from ..store import parse_store

#: names Core always answers to, besides its bind address and ``--allow-host``
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
#: ``--allow-host *``: any Host (a reverse proxy in front checks it)
ANY_HOST = "*"
#: what SQLite writes next to a database file
SQLITE_SUFFIXES = ("", "-wal", "-shm", "-journal")
#: headers on every response of Core's public files: any page may load them
PUBLIC_HEADERS = {
    "access-control-allow-origin": "*",
    # a page with Cross-Origin-Embedder-Policy: require-corp may embed them too
    "cross-origin-resource-policy": "cross-origin",
}
PREFLIGHT_MAX_AGE = 86_400
#: how much of a refused Host a response or log line quotes
EXCERPT_CHARS = 64

#: the longest Host header taken: a 253-character DNS name, a final dot and a port
MAX_HOST_CHARS = 260

# a DNS name (or an IPv4 address), labels separated by single dots; then, in a Host header,
# an optional final dot and port; an IPv6 address is in brackets (RFC 9110 7.2, RFC 3986)
_NAME = r"[A-Za-z0-9_-]{1,63}(?:\.[A-Za-z0-9_-]{1,63})*"
_HOST_HEADER = re.compile(rf"(?:\[([0-9A-Fa-f:.]{{2,45}})\]|({_NAME}\.?))(?::[0-9]{{1,5}})?")
_HOST_NAME = re.compile(_NAME)


def store_files(store: str) -> tuple[Path, ...]:
    """The files the store ``store`` (``--store``) may have on disk: an SQLite file's."""
    spec = parse_store(store)
    if spec.kind != "sqlite":
        return ()
    return tuple(Path(f"{spec.target}{suffix}") for suffix in SQLITE_SUFFIXES)


def _hidden(path: str) -> bool:
    """A path with a segment that starts with a dot (either slash separates segments);
    ``.``, the directory itself, is not one."""
    return any(part.startswith(".") and part != "." for part in re.split(r"[\\/]", path))


class PublicFiles(StaticFiles):
    """StaticFiles that answers a dot-path, or a file that is one of ``private`` (compared
    by device and inode, so a hard link, a symlink or another spelling of its name is the
    same file), with 404 exactly as for a missing file. Symlinks out of the directory are
    not followed (StaticFiles' default). With ``cors``, its responses are public
    (:func:`serve_public`)."""

    def __init__(self, *, directory: Path, html: bool = False,
                 private: Iterable[Path] = (), cors: bool = False) -> None:
        super().__init__(directory=directory, html=html)
        self.private = tuple(private)
        self.cors = cors
        self._root = os.path.realpath(directory)

    def lookup_path(self, path: str) -> tuple[str, os.stat_result | None]:
        if _hidden(path):
            return "", None
        full_path, found = super().lookup_path(path)
        if found is None:
            return full_path, found
        if _hidden(os.path.relpath(full_path, self._root)) or self._is_private(found):
            return "", None
        return full_path, found

    def _is_private(self, found: os.stat_result) -> bool:
        for path in self.private:
            try:
                other = os.stat(path)
            except OSError:
                continue
            if (other.st_dev, other.st_ino) == (found.st_dev, found.st_ino):
                return True
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.cors:
            await serve_public(super().__call__, scope, receive, send)
        else:
            await super().__call__(scope, receive, send)


async def serve_public(app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
    """Run ``app`` with :data:`PUBLIC_HEADERS` on its response, errors included (so a page
    on another origin can read why); answer a CORS preflight (``OPTIONS``) itself."""
    if scope["type"] == "http" and scope["method"] == "OPTIONS":
        requested = dict(scope["headers"]).get(b"access-control-request-headers", b"")
        headers = {**PUBLIC_HEADERS, "access-control-allow-methods": "GET, HEAD, OPTIONS",
                   "access-control-max-age": str(PREFLIGHT_MAX_AGE)}
        if requested:
            headers["access-control-allow-headers"] = requested.decode("latin-1")
        await Response(status_code=204, headers=headers)(scope, receive, send)
        return

    async def send_public(message: Message) -> None:
        if message["type"] == "http.response.start":
            names = {name.lower() for name, _ in message.get("headers", [])}
            extra = [(name.encode(), value.encode()) for name, value in PUBLIC_HEADERS.items()
                     if name.encode() not in names]
            message = {**message, "headers": [*message.get("headers", []), *extra]}
        await send(message)

    try:
        await app(scope, receive, send_public)
    except HTTPException as exc:  # StaticFiles' 404 and 405: rendered here, headers and all
        response = PlainTextResponse(exc.detail, exc.status_code, exc.headers)
        await response(scope, receive, send_public)


def origin_check(allowed_origins: frozenset[str]) -> Callable[[Request], Awaitable[Response]]:
    """The endpoint that answers ``{"allowed": bool}``: whether the request's ``Origin``
    may open the bridge (the bridge's own rule), readable from any origin."""

    async def check(request: Request) -> Response:
        return JSONResponse(
            {"allowed": origin_allowed(request.headers, allowed_origins)},
            headers={**PUBLIC_HEADERS, "cache-control": "no-store", "vary": "Origin"})

    return check


def host_name(value: str) -> str | None:
    """The host of a ``Host`` header, lower case, without port or IPv6 brackets; None
    when it is not a well-formed Host."""
    value = value.strip()
    match = _HOST_HEADER.fullmatch(value) if len(value) <= MAX_HOST_CHARS else None
    if match is None:
        return None
    if match.group(1) is not None:  # an IPv6 address: in one spelling, as --allow-host's
        try:
            return ipaddress.IPv6Address(match.group(1)).compressed
        except ValueError:
            return None
    return match.group(2).lower()


def check_allow_host(value: str) -> str:
    """An ``--allow-host`` value: a host name or IP address (no scheme, no port), or ``*``;
    ``ValueError`` otherwise."""
    if value == ANY_HOST:
        return value
    bare = value[1:-1] if value.startswith("[") and value.endswith("]") else value
    with contextlib.suppress(ValueError):
        return ipaddress.ip_address(bare).compressed
    if len(value) < MAX_HOST_CHARS and _HOST_NAME.fullmatch(value):
        return value.lower()
    raise ValueError(f"{value[:EXCERPT_CHARS]!r}: expected a host name or IP address "
                     "(e.g. my-laptop.local or 192.168.1.20), without scheme or port, or *")


def own_hosts(bind: str, allowed: Iterable[str]) -> frozenset[str] | None:
    """The names Core answers to, or None for any (``--allow-host *``)."""
    names = {*LOOPBACK_NAMES, check_allow_host(bind or "0.0.0.0")}
    for name in allowed:
        if name == ANY_HOST:
            return None
        names.add(check_allow_host(name))
    return frozenset(names)


class HostCheck:
    """ASGI middleware: a request whose ``Host`` is not one of ``hosts`` is refused with
    421 (a WebSocket handshake too, as an HTTP response where the server can send one,
    else 403); a missing, repeated or malformed ``Host`` with 400. Everything is checked,
    health included: a page on an attacker's name that resolves to this machine (DNS
    rebinding) must reach nothing of Core."""

    def __init__(self, app: ASGIApp, hosts: frozenset[str] | None) -> None:
        self.app = app
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.hosts is None or scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        values = [value.decode("latin-1") for name, value in scope["headers"]
                  if name == b"host"]
        name = host_name(values[0]) if len(values) == 1 else None
        if name is not None and name in self.hosts:
            await self.app(scope, receive, send)
            return
        shown = values[0][:EXCERPT_CHARS] if values else ""
        log_event("http.host_refused", host=shown, path=scope["path"][:EXCERPT_CHARS])
        if name is None:
            response = PlainTextResponse(
                "400 Bad Request: a request to pedelec Core needs one well-formed Host "
                "header.\n", status_code=400)
        else:
            response = PlainTextResponse(
                f"421 Misdirected Request: {shown!r} is not a name of this pedelec Core, "
                "which refuses other names (DNS rebinding). If you reach Core by this "
                f"name, start it with --allow-host {name}\n", status_code=421)
        if scope["type"] == "websocket" and (
                "websocket.http.response" not in scope.get("extensions", {})):
            await send({"type": "websocket.close", "code": 1008, "reason": ""})
            return
        await response(scope, receive, send)
