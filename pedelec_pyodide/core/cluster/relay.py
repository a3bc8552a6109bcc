"""MCP tool calls for a page another node holds (several Core nodes on one Redis):
relayed, through Redis, to the node that does, with their progress and cancellation.

The node the MCP client reached serves the MCP protocol itself (its sessions, its
streams); only the tool call travels, as Socket.IO's and Channels' Redis layers send
messages rather than sockets. Each call is given an idempotency key
(``pedelec-mcp-...``), stored with its request: when the holder dies or lets go and the
page resumes on another node, the call is relayed again there (or taken over here) and
waits for the same request instead of sending a new one, so its handler runs once.

The call's args are checked (the frame the page would take) once on the node the client
reached, so a call the page would refuse is answered at once, wherever the page is, and
once more by the node that sends the request, on its own limits; never twice on one node.

A cancel (the client's ``notifications/cancelled``) is routed as the call is: to the
node holding the page, again after that node died, until a node applies it (the page
gets ``tool.cancel``; a request not sent yet never is) or no node holds the session (this
node takes it and cancels the request there, as the call would have been taken). A node
keeps at most :data:`MAX_CANCELS` cancels on their way, each for at most
:data:`ROUTE_LIMIT_SECONDS` (as long as a call is routed), the newest when over; a holder
that gets a cancel before its call remembers the key as long, as many, and never runs
that call.

Messages (:mod:`.messages`, to a node's inbox): an :class:`~.messages.McpCall` to the
holder; an :class:`~.messages.McpProgress` back for each new progress; the holder's
:class:`~.messages.McpReply` (``moved`` if it does not hold the page); an
:class:`~.messages.McpCancel` to the holder when the client cancels, answered
:class:`~.messages.McpCancelled` once applied (``moved`` as above). A call and a cancel
are sent again until their reply comes, as every ask is (pub/sub loses what is sent
while a node's inbox reconnects: :meth:`Node.send`); a copy of a call running on the
holder is not run again, one that comes after it ended is answered from its key. A
page's tool change is published (:class:`~.messages.ToolsChanged`) to one channel all
nodes with MCP clients hear (``list_changed``). A malformed message is logged and
dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NamedTuple, TypeVar

from ... import protocol
from ...errors import PedelecError
from ...results import is_error_result, tool_error
from ..clock import wait
from ..log import log_event
from ..offload import LARGE_CHARS, is_large, off_loop_when
from ..sessions import (
    MAX_PROGRESS_MESSAGE_CHARS,
    SESSION_MOVED,
    CheckedRequest,
    CoreSession,
    RequestProgress,
    checked_call,
    refused_request,
)
from ..sessions.idempotency import (
    IDEMPOTENCY_KEY_REUSED,
    KeyReused,
    claim,
    fingerprint,
    key_hash,
)
from ..store import CORE_CALL, JsonText, StoreError
from .leases import LEASE_SECONDS
from .messages import (
    AnyAsk,
    BadMessage,
    McpCall,
    McpCancel,
    McpCancelled,
    McpProgress,
    McpReply,
    Reply,
    ToolsChanged,
    bad_message,
    parse,
)
from .node import Node, new_ask_id
from .routing import ADOPT_RETRY_SECONDS, ROUTE_LIMIT_SECONDS, ROUTE_TIMEOUT

OnProgress = Callable[[RequestProgress], Awaitable[None]]
R = TypeVar("R", bound=Reply)
_KEY_PREFIX = "pedelec-mcp-"
# the channel every node with MCP clients hears pages' tool changes on (a node's own
# channel is named by 16 hex digits: no node has this name)
_TOOL_CHANGES = "mcp-tool-changes"
#: most cancels a node passes on at once, and most keys of calls it has not seen that a
#: holder remembers cancelled (the oldest go first); each kept ROUTE_LIMIT_SECONDS
MAX_CANCELS = 1024
_CANCEL_REASON = "the MCP client cancelled the call"
# how long Core, stopping, lets the cancels on their way land (its inbox is closed by
# then: a cancel's first message goes out, its answer is not heard)
_STOP_SECONDS = 0.5


class NoSession(PedelecError):
    """No node holds, and the store has no, session of that id."""


def _moved(result: Any) -> bool:
    return is_error_result(result) and result["error"].get("code") == SESSION_MOVED


def _rising(on_progress: OnProgress) -> OnProgress:
    """``on_progress`` told only of progress that increases: a call relayed again, or
    taken over, hears the page's last progress once more (MCP: it must increase)."""
    last = -math.inf

    async def forward(update: RequestProgress) -> None:
        nonlocal last
        if update.progress > last:
            last = update.progress
            await on_progress(update)
    return forward


class PreparedCall(NamedTuple):
    """What a keyed call needs of its args before its key is claimed: their print and
    their checked frame (or why the page would refuse them)."""

    digest: str
    checked: CheckedRequest | protocol.ProtocolError


def _prepared(tool: str, args: Any, max_frame_bytes: int,
              checked: CheckedRequest | None) -> PreparedCall:
    digest = fingerprint(CORE_CALL, {"tool": tool, "args": args, "timeoutMs": None})
    if checked is not None:
        return PreparedCall(digest, checked)
    try:
        return PreparedCall(digest, checked_call(
            tool, args.value() if isinstance(args, JsonText) else args, max_frame_bytes))
    except protocol.ProtocolError as exc:
        return PreparedCall(digest, exc)


async def prepare_call(tool: str, args: Any, max_frame_bytes: int,
                       checked: CheckedRequest | None = None) -> PreparedCall:
    """:class:`PreparedCall` of these args (long ones in a worker thread; Core may hold
    them as text, an MCP call's long ones). ``checked``: made on this node already."""
    return await off_loop_when(is_large(args), _prepared, tool, args, max_frame_bytes,
                               checked)


async def keyed_call(session: CoreSession, key: str, tool: str, args: Any,
                     on_progress: OnProgress | None, prepared: PreparedCall) -> Any:
    """``tool`` on the page (this node holds it) under ``key``: a key the session has
    seen waits for that request (or gives its kept result), never sending another.
    ``prepared``: :func:`prepare_call` of the args, made before, so that nothing is
    awaited before the key is claimed (a cancel for it finds it, or comes first).
    Cancelled, the request is cancelled and the page told (``tool.cancel``)."""
    hashed = key_hash(session.id, key)
    try:
        try:  # the control API's rule: a key seen for another request starts nothing
            known, new = claim(session.callers, session.id, key, CORE_CALL, prepared.digest)
        except KeyReused:
            log_event("mcp.key_reused", level=logging.WARNING, session=session.id)
            return tool_error(IDEMPOTENCY_KEY_REUSED, "this call's key was used in this "
                              "session for another call", retryable=False)
        if known is not None:
            request_id = known.target_id
        else:
            if isinstance(prepared.checked, protocol.ProtocolError):
                return refused_request(prepared.checked)
            request_id = (await session.start_call(tool, args, checked=prepared.checked,
                                                   key=new)).id
        pending = session.pending.get(request_id)
        if pending is None:
            done = session.callers.kept(request_id)
            if done is None:
                return None
            kept = done.result  # (an error result or not: call_result reads it)
            return (await off_loop_when(len(kept.text) > LARGE_CHARS, kept.value)
                    if isinstance(kept, JsonText) else kept)
        if on_progress is not None:
            async for progress in pending.updates():
                await on_progress(progress)
        # shielded: a call relayed again may wait for the same request here
        result, _ = await asyncio.shield(pending.future)
    except BaseException:  # the client cancelled (even while the request was stored)
        _cancel_keyed(session, hashed)
        raise
    return result


def _cancel_keyed(session: CoreSession, hashed: str) -> bool:
    """Cancel the request ``hashed`` (a key's hash) started, if pending; False if the
    session has not seen the key."""
    known = session.callers.key(hashed)
    if known is None:
        return False
    pending = session.pending.get(known.target_id)
    if pending is not None:
        session.cancel_request(pending, _CANCEL_REASON)
    return True


class _Watch:
    """A relayed call's latest progress, and a wake-up for its waiter."""

    def __init__(self) -> None:
        self.latest: RequestProgress | None = None
        self.woken = asyncio.Event()


class ToolRelay:
    """Both ends: :meth:`call` on the node the client reached, the holder's side run
    from its inbox (registered with the registry)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.registry = node.registry
        # calls relayed from here, by key (one entry per MCP call in flight here)
        self._watching: dict[str, _Watch] = {}
        # calls relayed to here and running, by key (a copy sent again is not run again)
        self._serving: dict[str, asyncio.Task[None]] = {}
        # cancels on their way from here, by key, oldest first (at most MAX_CANCELS)
        self._cancelling: OrderedDict[str, asyncio.Task[None]] = OrderedDict()
        # keys cancelled here before their call came: key -> when (monotonic), oldest
        # first (at most MAX_CANCELS, each ROUTE_LIMIT_SECONDS)
        self._cancelled: OrderedDict[str, float] = OrderedDict()
        node.on(McpCall, self._serve)
        node.on(McpProgress, self._on_progress)
        node.on(McpCancel, self._on_cancel)
        node.registry.on_tools_changed = self._tools_changed

    # --- the node the MCP client reached --------------------------------------------------

    async def call(self, session_id: str, tool: str, args: Any,
                   on_progress: OnProgress | None,
                   checked: CheckedRequest | None = None, holder: str | None = None) -> Any:
        """The call's result, from whichever node holds the page, again after a holder
        died or let go, until :data:`ROUTE_LIMIT_SECONDS`; nobody holding it: this node
        takes the session (and waits for its page). :class:`NoSession` if none has it.
        ``checked``: the args checked on this node already (:func:`checked_call`).
        ``holder``: the node this call's request found holding the page a moment ago
        (http/mcp.py asks before the SDK sees it): tried first, without asking Redis again.
        Cancelled, or failed as Redis is out of reach, the call is cancelled wherever
        it reached (:meth:`_pass_cancel`, once Redis is back)."""
        registry, node = self.registry, self.node
        limit = registry.config.max_frame_bytes
        key = _KEY_PREFIX + secrets.token_hex(16)
        ask_id = new_ask_id()  # the same wherever and however often it is relayed
        clock = node.clock
        deadline = clock.monotonic() + ROUTE_LIMIT_SECONDS
        forward = None if on_progress is None else _rising(on_progress)
        watch = self._watching[key] = _Watch()
        found = holder
        sent = False  # the call may have reached a node: a cancel must follow it
        try:
            while clock.monotonic() < deadline:
                # held here: no need to ask Redis (a session this node lost is handed over)
                if session_id in registry.sessions:
                    holder = node.name
                elif found is not None:
                    holder, found = found, None
                else:
                    holder = await node.store.holder(session_id)
                if holder is None or holder == node.name:
                    if not await node.leases.adopt(session_id):
                        await clock.sleep(ADOPT_RETRY_SECONDS)
                        continue
                    session = registry.get(session_id)
                    if session is None or session.closed:
                        raise NoSession(session_id)
                    sent = True
                    # checked here for this node's first request; a key it has seen
                    # is not checked again
                    result = await keyed_call(session, key, tool, args, forward,
                                              await prepare_call(tool, args, limit, checked))
                    checked = None
                else:
                    log_event("mcp.relay", session=session_id, node=holder)
                    sent = True
                    message = McpCall(ask=ask_id, sender=node.name, session=session_id,
                                      tool=tool, args=args, key=key)
                    reply = await self._asked(session_id, holder, message, McpReply,
                                              deadline, watch, forward)
                    if reply is None:
                        continue
                    if reply.moved:  # the holder is still taking it over, or let go
                        await clock.sleep(ADOPT_RETRY_SECONDS)
                        continue
                    result = reply.result
                if not _moved(result):
                    return result
        except (asyncio.CancelledError, StoreError):
            # the client cancelled, or is told Redis is out of reach (and may retry): the
            # call it no longer waits for must not run on
            if sent:
                self._keep_cancel(session_id, key)
            raise
        finally:
            del self._watching[key]
        return tool_error(ROUTE_TIMEOUT, f"no node answered this call within "
                          f"{ROUTE_LIMIT_SECONDS:g} s", retryable=True)

    async def _asked(self, session_id: str, holder: str, message: AnyAsk, kind: type[R],
                     deadline: float, watch: _Watch | None = None,
                     on_progress: OnProgress | None = None) -> R | None:
        """``holder``'s reply to ``message`` (of type ``kind``), ``watch``'s progress
        passed on meanwhile; None once another node (or none) holds the session, or at
        ``deadline``. Sent again until its reply comes (:meth:`Node.send`): a copy is
        not run twice."""
        node, clock = self.node, self.node.clock
        with node.asking(holder, message, kind) as reply:
            await node.send(reply)
            checked = clock.monotonic()
            while (left := deadline - clock.monotonic()) > 0:
                either: list[asyncio.Future[Any]] = [reply.future]
                wake = None if watch is None else asyncio.ensure_future(watch.woken.wait())
                if wake is not None:
                    either.append(wake)
                try:
                    await wait(clock, either, min(LEASE_SECONDS / 3, left),
                               return_when=asyncio.FIRST_COMPLETED)
                finally:
                    if wake is not None:
                        wake.cancel()
                if watch is not None and watch.woken.is_set():
                    # sent before the reply: passed on before it
                    watch.woken.clear()
                    if on_progress is not None and watch.latest is not None:
                        await on_progress(watch.latest)
                if reply.future.done():
                    return reply.future.result()
                if clock.monotonic() - checked >= LEASE_SECONDS / 3:
                    checked = clock.monotonic()
                    if not await node.leases.still_held(session_id, holder):
                        return None  # it died or let go: routed again
        return None

    def _on_progress(self, message: McpProgress) -> None:
        watch = self._watching.get(message.key)
        if watch is not None:  # (its message cut as Core keeps a page's)
            text = message.message
            watch.latest = RequestProgress(
                message.progress, message.total,
                None if text is None else text[:MAX_PROGRESS_MESSAGE_CHARS])
            watch.woken.set()

    def _keep_cancel(self, session_id: str, key: str) -> None:
        """Pass the cancel of call ``key`` on, in the background (its client is gone)."""
        cancelling = self._cancelling
        if len(cancelling) >= MAX_CANCELS:
            _, task = cancelling.popitem(last=False)
            task.cancel()
            log_event("mcp.cancel_dropped", level=logging.WARNING,
                      why=f"over {MAX_CANCELS} cancels on their way")
        task = cancelling[key] = self.node.spawn(self._pass_cancel(session_id, key))
        task.add_done_callback(
            lambda done: cancelling.pop(key) if cancelling.get(key) is done else None)

    async def _pass_cancel(self, session_id: str, key: str) -> None:
        """Cancel call ``key`` wherever the session is held, again after its holder died
        or let go, until applied or :data:`ROUTE_LIMIT_SECONDS`; nobody holding it: this
        node takes the session and cancels it here."""
        node, clock = self.node, self.node.clock
        deadline = clock.monotonic() + ROUTE_LIMIT_SECONDS
        message = McpCancel(ask=new_ask_id(), sender=node.name, key=key, session=session_id)
        while clock.monotonic() < deadline:
            pause = ADOPT_RETRY_SECONDS
            try:
                holder = node.name if session_id in self.registry.sessions else (
                    await node.store.holder(session_id))
                if holder is None or holder == node.name:
                    if await node.leases.adopt(session_id):
                        # False: no such session any more (nothing to cancel)
                        self._cancel_here(session_id, key)
                        return
                else:
                    reply = await self._asked(session_id, holder, message, McpCancelled,
                                              deadline)
                    if reply is None:
                        continue  # another node (or none) holds it: at once
                    if not reply.moved:
                        return
            except StoreError as exc:  # Redis out of reach: the cancel waits for it
                log_event("cluster.failed", level=logging.WARNING, error=str(exc))
                pause = LEASE_SECONDS / 3
            await clock.sleep(pause)
        log_event("mcp.cancel_dropped", level=logging.WARNING, session=session_id,
                  why=f"no node took it within {ROUTE_LIMIT_SECONDS:g} s")

    async def stop(self) -> None:
        """Core stops: the cancels on their way get :data:`_STOP_SECONDS` to be sent,
        then end (none outlives Core's store)."""
        tasks = list(self._cancelling.values())
        if tasks:
            await wait(self.node.clock, tasks, _STOP_SECONDS)
            for task in tasks:
                task.cancel()

    async def tool_changes(self) -> AsyncIterator[str]:
        """The ids of pages whose tools changed, on any node, for Core's life."""
        async for text in self.node.store.inbox(_TOOL_CHANGES):
            try:
                message = parse(text)
                if not isinstance(message, ToolsChanged):
                    raise BadMessage(f"a {message.type} on the tool changes' channel")
            except BadMessage as exc:
                bad_message(exc)
                continue
            yield message.session

    # --- the node holding the page ------------------------------------------------------

    def _tools_changed(self, session_id: str) -> None:
        if self.node.store.shared:  # nodes with MCP clients of the page hear it
            self.node.spawn(self._announce(session_id))

    async def _announce(self, session_id: str) -> None:
        store = self.node.store
        await store.flush()  # stored first: what another node's tools/list reads
        await store.publish(_TOOL_CHANGES, ToolsChanged(session=session_id).encode())

    def _serve(self, call: McpCall) -> None:
        key = call.key
        if key in self._serving:  # a copy sent again: the run under way answers it
            return
        task = self._serving[key] = self.node.spawn(self._run(call))
        # only its own entry: a copy that came once this one ended has its own
        task.add_done_callback(
            lambda done: self._serving.pop(key) if self._serving.get(key) is done else None)

    async def _run(self, call: McpCall) -> None:
        node = self.node
        if self._was_cancelled(call.key):  # its cancel overtook it: nobody waits for it
            log_event("mcp.cancelled_before_call", session=call.session)
            return
        session = self.registry.get(call.session)
        if session is None or session.closed:
            answer = McpReply(ask=call.ask, moved=True)
        else:
            prepared = await prepare_call(call.tool, call.args,
                                          self.registry.config.max_frame_bytes)
            # looked at again: from here to its key claimed (keyed_call), nothing waits
            if self._was_cancelled(call.key):
                log_event("mcp.cancelled_before_call", session=call.session)
                return
            async def relay_progress(update: RequestProgress) -> None:
                # best effort, as pub/sub is: Redis out of reach cancels nothing
                with contextlib.suppress(StoreError):
                    await node.tell(call.sender, McpProgress(
                        key=call.key, progress=update.progress, total=update.total,
                        message=update.message))

            answer = McpReply(ask=call.ask, result=await keyed_call(
                session, call.key, call.tool, call.args, relay_progress, prepared))
        await node.reply(call.sender, answer)

    def _on_cancel(self, message: McpCancel) -> None:
        applied = self._cancel_here(message.session, message.key)
        self.node.spawn(self.node.reply(
            message.sender, McpCancelled(ask=message.ask, moved=not applied)))

    def _cancel_here(self, session_id: str, key: str) -> bool:
        """Cancel call ``key`` of a session this node holds (its request, if pending; a
        key not seen yet is remembered, so its call never runs); False if not held."""
        session = self.registry.get(session_id)
        if session is None or session.closed:
            return False
        if not _cancel_keyed(session, key_hash(session_id, key)):
            self._was_cancelled(key)  # drops what is past its time
            self._cancelled[key] = self.node.clock.monotonic()
            if len(self._cancelled) > MAX_CANCELS:
                self._cancelled.popitem(last=False)
        return True

    def _was_cancelled(self, key: str) -> bool:
        """Whether ``key`` was cancelled here before its call came (entries past
        :data:`ROUTE_LIMIT_SECONDS` are forgotten first, the oldest first)."""
        cancelled = self._cancelled
        horizon = self.node.clock.monotonic() - ROUTE_LIMIT_SECONDS
        while cancelled and next(iter(cancelled.values())) < horizon:
            cancelled.popitem(last=False)
        return key in cancelled
