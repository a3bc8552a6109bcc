"""MCP tool calls for a page another node holds (several Core nodes on one Redis):
relayed, through Redis, to the node that does, with their progress and cancellation.

The node the MCP client reached serves the MCP protocol itself (its sessions, its
streams); only the tool call travels, as Socket.IO's and Channels' Redis layers send
messages rather than sockets. Each call is given an idempotency key
(``pedelec-mcp-...``), stored with its request: when the holder dies or lets go and the
page resumes on another node, the call is relayed again there (or taken over here) and
waits for the same request instead of sending a new one, so its handler runs once.

Messages (JSON, to a node's inbox): ``{"mcpCall": {...}, "ask", "from"}`` to the holder;
``{"mcpProgress": key, "progress": {...}}`` back, for each new progress; the holder's
``{"reply": ask, "result": ...}`` (``"moved": true`` if it does not hold the page);
``{"mcpCancel": key}`` to the holder when the client cancels. A page's tool change is
published, as its id, to one channel all nodes with MCP clients hear (``list_changed``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from .. import protocol
from ..results import tool_error
from .idempotency import fingerprint, key_hash
from .log import log_event
from .routing import ADOPT_RETRY_SECONDS, ROUTE_LIMIT_SECONDS, ROUTE_TIMEOUT
from .sessions import (
    LEASE_SECONDS,
    SESSION_MOVED,
    CoreSession,
    Progress,
    Registry,
    checked_call,
    refused_request,
)
from .store import TOOL_CALL, IdempotencyRecord, StoreError

OnProgress = Callable[[Progress], Awaitable[None]]
_KEY_PREFIX = "pedelec-mcp-"
# the channel every node with MCP clients hears pages' tool changes on (a node's own
# channel is named by 16 hex digits: no node has this name)
_TOOL_CHANGES = "mcp-tool-changes"


class NoSession(Exception):
    """No node holds, and the store has no, session of that id."""


def _moved(result: Any) -> bool:
    error = result.get("error") if isinstance(result, dict) else None
    return isinstance(error, dict) and error.get("code") == SESSION_MOVED


async def keyed_call(session: CoreSession, key: str, tool: str, args: Any,
                     on_progress: OnProgress | None) -> Any:
    """``tool`` on the page (this node holds it) under ``key``: a key the session has
    seen waits for that request (or gives its kept result), never sending another.
    Cancelled, the request is cancelled and the page told (``tool.cancel``)."""
    hashed = key_hash(session.id, key)
    known = session.callers.key(hashed)
    if known is not None:
        request_id = known.target_id
    else:
        try:
            checked = checked_call(tool, args, session.registry.config.max_frame_bytes)
        except protocol.ProtocolError as exc:
            return refused_request(exc)
        claim = IdempotencyRecord(hashed, session.id, TOOL_CALL, fingerprint(
            TOOL_CALL, {"tool": tool, "args": args, "timeoutMs": None}), "", time.time())
        request_id = (await session.start_call(tool, args, checked=checked, key=claim)).id
    pending = session.pending.get(request_id)
    if pending is None:
        done = session.callers.result(request_id)
        return None if done is None else done.result
    try:
        if on_progress is not None:
            async for progress in pending.updates():
                await on_progress(progress)
        # shielded: a call relayed again may wait for the same request here
        result, _ = await asyncio.shield(pending.future)
    except BaseException:  # the client cancelled, or its progress stream failed
        session.cancel_request(pending, "the MCP client cancelled the call")
        raise
    return result


class ToolRelay:
    """Both ends: :meth:`call` on the node the client reached, the holder's side run
    from its inbox (registered with the registry)."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        # calls relayed from here, by key: their latest progress, and a wake-up
        self._watching: dict[str, tuple[list[Progress], asyncio.Event]] = {}
        # calls relayed to here, by key
        self._serving: dict[str, asyncio.Task[None]] = {}
        registry.handlers["mcpCall"] = self._serve
        registry.handlers["mcpProgress"] = self._on_progress
        registry.handlers["mcpCancel"] = self._on_cancel
        registry.on_tools_changed = self._tools_changed

    # --- the node the MCP client reached --------------------------------------------------

    async def call(self, session_id: str, tool: str, args: Any,
                   on_progress: OnProgress | None) -> Any:
        """The call's result, from whichever node holds the page, again after a holder
        died or let go, until :data:`ROUTE_LIMIT_SECONDS`; nobody holding it: this node
        takes the session (and waits for its page). :class:`NoSession` if none has it."""
        registry = self.registry
        key = _KEY_PREFIX + secrets.token_hex(16)
        deadline = time.monotonic() + ROUTE_LIMIT_SECONDS
        while time.monotonic() < deadline:
            # held here: no need to ask Redis (a session this node lost is handed over)
            holder = registry.node if session_id in registry.sessions else (
                await registry.store.holder(session_id))
            if holder is None or holder == registry.node:
                if not await registry.adopt(session_id):
                    await asyncio.sleep(ADOPT_RETRY_SECONDS)
                    continue
                session = registry.get(session_id)
                if session is None or session.closed:
                    raise NoSession(session_id)
                result = await keyed_call(session, key, tool, args, on_progress)
            else:
                log_event("mcp.relay", session=session_id, node=holder)
                reply = await self._relayed(session_id, holder, key, tool, args,
                                            on_progress, deadline)
                if reply is None:
                    continue
                if reply.get("moved"):  # the holder is still taking it over, or let go
                    await asyncio.sleep(ADOPT_RETRY_SECONDS)
                    continue
                result = reply.get("result")
            if not _moved(result):
                return result
        return tool_error(ROUTE_TIMEOUT, f"no node answered this call within "
                          f"{ROUTE_LIMIT_SECONDS:g} s", retryable=True)

    async def _relayed(self, session_id: str, holder: str, key: str, tool: str, args: Any,
                       on_progress: OnProgress | None, deadline: float
                       ) -> dict[str, Any] | None:
        """``holder``'s reply, its progress passed on meanwhile; None once another node
        (or none) holds the session."""
        registry = self.registry
        latest: list[Progress] = []
        woken = asyncio.Event()
        self._watching[key] = (latest, woken)
        call = {"session": session_id, "tool": tool, "args": args, "key": key}
        try:
            with registry.asking(holder, {"mcpCall": call}) as reply:
                await registry.send(reply)
                checked = time.monotonic()
                while time.monotonic() < deadline:
                    wake = asyncio.ensure_future(woken.wait())
                    either: list[asyncio.Future[Any]] = [reply.future, wake]
                    try:
                        await asyncio.wait(either, timeout=LEASE_SECONDS / 3,
                                           return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        wake.cancel()
                    if woken.is_set():  # sent before the reply: passed on before it
                        woken.clear()
                        if on_progress is not None:
                            await on_progress(latest[-1])
                    if reply.future.done():
                        return reply.future.result()
                    if time.monotonic() - checked >= LEASE_SECONDS / 3:
                        checked = time.monotonic()
                        if await registry.store.holder(session_id) != holder:
                            return None  # it died or let go: the call is routed again
        except asyncio.CancelledError:  # the client cancelled: the holder cancels it
            registry.spawn(registry.store.publish(holder, json.dumps({"mcpCancel": key})))
            raise
        finally:
            del self._watching[key]
        return None

    def _on_progress(self, message: dict[str, Any]) -> None:
        watching = self._watching.get(str(message["mcpProgress"]))
        if watching is not None:
            data = message["progress"]
            watching[0][:] = [Progress(float(data["progress"]), data.get("total"),
                                       data.get("message"))]
            watching[1].set()

    async def tool_changes(self) -> AsyncIterator[str]:
        """The ids of pages whose tools changed, on any node, for Core's life."""
        async for text in self.registry.store.inbox(_TOOL_CHANGES):
            yield text

    # --- the node holding the page ------------------------------------------------------

    def _tools_changed(self, session_id: str) -> None:
        if self.registry.store.shared:  # nodes with MCP clients of the page hear it
            self.registry.spawn(self._announce(session_id))

    async def _announce(self, session_id: str) -> None:
        store = self.registry.store
        await store.flush()  # stored first: what another node's tools/list reads
        await store.publish(_TOOL_CHANGES, session_id)

    def _serve(self, message: dict[str, Any]) -> None:
        call = message["mcpCall"]
        key = str(call["key"])
        if key in self._serving:  # sent again while it runs (Registry._resend)
            return
        task = self._serving[key] = self.registry.spawn(self._run(message, call, key))
        task.add_done_callback(lambda _: self._serving.pop(key, None))

    async def _run(self, message: dict[str, Any], call: dict[str, Any], key: str) -> None:
        registry = self.registry
        caller = str(message["from"])
        session = registry.get(str(call["session"]))
        if session is None or session.closed:
            answer: dict[str, Any] = {"moved": True}
        else:
            async def relay_progress(update: Progress) -> None:
                # best effort, as pub/sub is: Redis out of reach cancels nothing
                with contextlib.suppress(StoreError):
                    await registry.store.publish(caller, json.dumps(
                        {"mcpProgress": key, "progress": update.as_json()}))

            answer = {"result": await keyed_call(session, key, str(call["tool"]),
                                                 call["args"], relay_progress)}
        await registry.store.publish(caller, json.dumps({"reply": message["ask"], **answer}))

    def _on_cancel(self, message: dict[str, Any]) -> None:
        task = self._serving.get(str(message["mcpCancel"]))
        if task is not None:
            task.cancel()
