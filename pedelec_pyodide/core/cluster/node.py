"""This process as a node of the cluster sharing a store (Redis): its inbox, the asks it
sends other nodes and their replies, sent again until heard, and its leases
(:class:`~.leases.Leases`).

Every message goes through the store's pub/sub, sealed (store/seal.py), and is one of
:mod:`.messages`; one that does not parse is dropped and logged, and the inbox reads on.
On a store of one process (memory, SQLite) a node sends and hears nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import secrets
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, Generic, TypeVar

from ..background import background_failed, read_forever, spawn
from ..log import log_event
from ..offload import LARGE_CHARS, off_loop_when
from ..sessions import Registry
from ..store import StoreError
from .leases import Leases
from .messages import (
    Ask,
    BadMessage,
    HandedOver,
    HandOver,
    HttpCall,
    HttpReply,
    HungUp,
    NodeMessage,
    Reply,
    bad_message,
    parse,
)

#: how soon a call forwarded to another node is first sent again while its reply has not
#: come (Redis may have dropped the ask or the reply: Node._resend); each gap after is
#: twice the last, up to RESEND_MAX_SECONDS (a long call's body is not sent every second)
RESEND_SECONDS = 1.0
RESEND_MAX_SECONDS = 8.0
#: replies to other nodes' asks that reached no inbox, kept for the ask sent again: at
#: most this many, and this many characters in all (the oldest dropped first)
UNHEARD_REPLIES = 1024
UNHEARD_REPLY_CHARS = 16 * 1024 * 1024

R = TypeVar("R", bound=Reply)
M = TypeVar("M", bound=NodeMessage)
#: runs a control-API call another node forwarded here (routing.serve_forwarded)
ServeForwarded = Callable[[HttpCall, asyncio.Future[None]], Awaitable[HttpReply]]


def new_ask_id() -> str:
    return secrets.token_hex(12)


@dataclasses.dataclass(frozen=True)
class Asked(Generic[R]):
    """An ask to another node (its JSON) and the future of its reply."""

    message: str
    future: asyncio.Future[R]
    ask_id: str


@dataclasses.dataclass
class _Ask:
    """An ask waiting for its reply (:meth:`Node.send`)."""

    node: str
    message: str
    future: asyncio.Future[Any]
    reply: type[Reply]  # a reply of another type (a forged one) is dropped
    gap: float  # how long after ``sent`` it is sent again
    sent: float | None = None  # when last sent (monotonic); None: not yet


class Node:
    """The cluster's side of one Core process: its inbox, asks, replies and leases."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.store = registry.store
        self.clock = registry.config.clock
        #: this node's name, its inbox's channel and the holder of its leases
        self.name = registry.node
        self.leases = Leases(registry)
        # calls this node forwarded to another, waiting for its reply, by id
        self._asked: dict[str, _Ask] = {}
        # replies that reached no inbox (Redis away, or the asker not subscribed again
        # after a restart of Redis), by ask id, oldest first; and their characters
        self._unheard: OrderedDict[str, str] = OrderedDict()
        self._unheard_chars = 0
        # the ask ids of the calls another node forwarded here, while they run: each
        # one's future is done once its caller hung up at that node
        self._answering: dict[str, asyncio.Future[None]] = {}
        # runs a call another node forwarded here (set by the router, routing.py)
        self.serve_forwarded: ServeForwarded | None = None
        # the other messages a node hears, by type (relay.py's)
        self.handlers: dict[type[NodeMessage], Callable[[Any], None]] = {}

    def on(self, kind: type[M], handle: Callable[[M], None]) -> None:
        """Have ``handle`` hear each message of type ``kind``."""
        self.handlers[kind] = handle

    def spawn(self, work: Awaitable[Any]) -> asyncio.Task[None]:
        """``work`` on its own: a failure is logged (a message of the wrong shape as
        such: :func:`~.messages.bad_message`)."""
        return spawn(work, on_error=_bad_message)

    # --- asks and replies -----------------------------------------------------------------

    @contextlib.contextmanager
    def asking(self, node: str, message: Ask, reply: type[R]) -> Iterator[Asked[R]]:
        """``message`` to ``node``, a ``reply`` expected; the reply's future while inside.
        ``message.ask``: from :func:`new_ask_id`, one per call however often it is routed
        again: a holder that kept its reply to it (nobody heard it: :meth:`reply`)
        answers the call routed to it again from that, not by running it again. A reply
        of another type is dropped (logged) and the future waits on for the real one."""
        text = message.encode()
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        ask_id = message.ask
        self._asked[ask_id] = _Ask(node, text, future, reply, RESEND_SECONDS)
        try:
            yield Asked(text, future, ask_id)
        finally:
            del self._asked[ask_id]

    async def send(self, asked: Asked[Any]) -> None:
        """Publish an ask of :meth:`asking`; :meth:`_resend` sends it again while it
        waits for its reply."""
        ask = self._asked[asked.ask_id]
        await self.store.publish(ask.node, ask.message)
        ask.sent = self.clock.monotonic()

    async def tell(self, node: str, message: NodeMessage) -> None:
        """Publish ``message`` to ``node``, no reply expected (nor is it sent again)."""
        await self.store.publish(node, message.encode())

    async def _resend(self) -> None:
        """Pub/sub delivers a message only to the inboxes subscribed at that moment, and
        a subscriber cut off loses what it had not read: after Redis dropped its
        subscribers (a restart, a network cut), an ask sent before its holder's inbox
        subscribed again, or a reply sent before this node's did, is lost, and its caller
        would wait until its limit with the holder alive. So every ask is sent again
        until its reply comes, :data:`RESEND_SECONDS` after it was sent, then at twice the
        last gap up to :data:`RESEND_MAX_SECONDS`: the holder ignores one it is still
        answering (:meth:`_on_message`) and answers a later one from the same request
        (the call's key), which runs once."""
        while True:
            await self.clock.sleep(RESEND_SECONDS / 2)
            now = self.clock.monotonic()
            try:
                for ask in list(self._asked.values()):
                    if ask.sent is None or now - ask.sent < ask.gap or ask.future.done():
                        continue
                    await self.store.publish(ask.node, ask.message)
                    ask.sent = self.clock.monotonic()
                    ask.gap = min(2 * ask.gap, RESEND_MAX_SECONDS)
            except Exception as exc:  # out of reach, refused: again next time
                background_failed("resend", exc)

    async def _answer(self, call: HttpCall, hung_up: asyncio.Future[None]) -> None:
        """A call another node forwarded: run it here (its caller hanging up once
        ``hung_up`` is done), send the reply back."""
        serve = self.serve_forwarded
        if serve is None:
            return
        await self.reply(call.sender, await serve(call, hung_up))

    async def reply(self, node: str, answer: Reply) -> None:
        """Publish ``answer`` to its ask, of ``node``. One that reached no inbox is kept
        (:data:`UNHEARD_REPLIES`) and published again when the ask comes again
        (:meth:`_resend`): it is not run again, so a call runs once even when its kept
        result is gone (``--kept-results``) by the time Redis is back."""
        await self._deliver(node, answer.ask, answer.encode())

    async def _deliver(self, node: str, ask_id: str, text: str) -> None:
        try:
            reached = await self.store.publish(node, text)
        except StoreError:
            reached = 0
        self._unheard_chars -= len(self._unheard.pop(ask_id, ""))
        if reached:
            return
        self._unheard[ask_id] = text
        self._unheard_chars += len(text)
        while len(self._unheard) > UNHEARD_REPLIES or (
                self._unheard_chars > UNHEARD_REPLY_CHARS and len(self._unheard) > 1):
            _, dropped = self._unheard.popitem(last=False)
            self._unheard_chars -= len(dropped)
        log_event("cluster.reply_unheard", level=logging.WARNING, node=node,
                  kept=len(self._unheard))

    # --- the inbox ------------------------------------------------------------------------

    async def serve(self) -> None:
        """For Core's life, on a shared store: this node's inbox (asks of other nodes,
        their replies, sessions they take over) and its leases (:class:`Leases`); asks
        unanswered are sent again."""
        if not self.store.shared:
            return
        leases = self.leases
        background = [asyncio.ensure_future(work) for work in (
            leases.renew_forever(), self._resend(), leases.take_vacant())]
        try:
            await read_forever("inbox", self._inbox,
                               lambda parsed: self._on_message(parsed), self.clock)
        finally:
            for task in background:
                task.cancel()

    async def _inbox(self) -> AsyncIterator[NodeMessage | Exception]:
        """This node's messages in the order they came, each parsed, or what is wrong with
        it; a long one (a relayed call's args or result) in a worker thread."""
        async for text in self.store.inbox(self.name):
            yield await off_loop_when(len(text) > LARGE_CHARS, _parsed, text)

    def _on_message(self, parsed: NodeMessage | Exception) -> None:
        # whatever a message holds (JSON nested past the recursion limit, a field of the
        # wrong kind): dropped, the inbox serves on
        if isinstance(parsed, Exception):
            bad_message(parsed)
            return
        try:
            self._dispatch(parsed)
        except Exception as exc:
            bad_message(exc)

    def _dispatch(self, message: NodeMessage) -> None:
        if isinstance(message, Ask):
            unheard = self._unheard.get(message.ask)
            if unheard is not None:  # an ask sent again, answered already: that answer
                self.spawn(self._deliver(message.sender, message.ask, unheard))
                return
        if isinstance(message, Reply):
            asked = self._asked.get(message.ask)
            if asked is not None and not asked.future.done():
                if not isinstance(message, asked.reply):
                    raise BadMessage(f"a {message.type} answers an ask of another kind")
                asked.future.set_result(message)
        elif isinstance(message, HttpCall):
            ask_id = message.ask
            if ask_id not in self._answering:  # else an ask sent again (_resend)
                hung_up = self._answering[ask_id] = (
                    asyncio.get_running_loop().create_future())
                self.spawn(self._answer(message, hung_up)).add_done_callback(
                    lambda _: self._answering.pop(ask_id, None))
        elif isinstance(message, HungUp):  # the caller of a call answered here hung up
            answering = self._answering.get(message.ask)
            if answering is not None and not answering.done():
                answering.set_result(None)
        elif isinstance(message, HandOver):
            self.spawn(self.leases.let_go(message.session, message.to))
        elif isinstance(message, HandedOver):
            self.leases.handed_over(message.session)
        else:
            handle = self.handlers.get(type(message))
            if handle is not None:
                handle(message)


def _bad_message(exc: Exception) -> bool:
    if isinstance(exc, BadMessage):
        bad_message(exc)
        return True
    return False


def _parsed(text: str) -> NodeMessage | Exception:
    """:func:`parse`, what it raises returned (a worker thread hands it back as a value)."""
    try:
        return parse(text)
    except Exception as exc:
        return exc
