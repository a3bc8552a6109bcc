"""Messages between the nodes of a cluster, sealed with the cluster secret.

Anyone who can publish on the cluster's Redis could otherwise act as a node: forward a
call, answer one, have a node hand a session over. With a secret (``--cluster-secret``)
each message a node publishes carries who sent it, a sequence number, the time and an
HMAC-SHA256 over those, the channel and the message; a node reads only what opens:

- the MAC is checked first, over the bytes as Redis delivered them: nothing of a message
  that fails it (its JSON, its fields) is read, and it costs no state;
- bound to the channel (``pedelec:CLUSTER:node:ID``): a message sealed for one node, or
  one cluster, is refused on another's channel;
- against replay, a sliding window per sender (as IPsec's): each sender (one per Core
  process) numbers its messages; a number seen, or :data:`REPLAY_WINDOW` behind the
  highest seen, is refused. Memory does not grow with traffic, whatever its rate, and
  messages overtaking each other (two of Redis's connections) are taken;
- a message stamped more than :data:`CLOCK_WINDOW_SECONDS` from the receiver's clock is
  refused: the replay of a sender the receiver has forgotten (quiet for three windows:
  it died) is too old by then. The nodes' clocks must agree within that (NTP).

A refused message is dropped and logged (``cluster.message_refused``), at most once per
:data:`LOG_EVERY_SECONDS` with the count since the last line: a stranger flooding a
channel does not flood the log.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Literal, NamedTuple

from ...errors import PedelecError
from ..clock import Clock, SystemClock
from ..log import log_event

#: the first word of a sealed message (its format's version)
VERSION = b"p1"
#: the fewest characters a cluster secret may have
MIN_SECRET_CHARS = 32
#: seconds a message's stamp may differ from the receiver's clock
CLOCK_WINDOW_SECONDS = 30.0
#: message numbers behind a sender's highest that are still taken (once each)
REPLAY_WINDOW = 1 << 14
#: senders a node keeps the window of (the least recently heard go first): one per
#: Core process of the cluster, each forgotten once quiet for three clock windows
MAX_SENDERS = 1024
#: seconds between two log lines of refused messages
LOG_EVERY_SECONDS = 10.0

Refusal = Literal["unsealed", "forged", "stale", "replayed"]
_DIGITS = 20  # a sequence number or a stamp in ms has at most this many digits


class Refused(PedelecError, ValueError):
    """A message that does not open; ``reason`` says why."""

    def __init__(self, reason: Refusal) -> None:
        super().__init__(reason)
        self.reason: Refusal = reason


def check_secret(secret: str) -> str:
    """``secret`` if it may seal a cluster's messages, else ``ValueError`` saying why."""
    if len(secret) < MIN_SECRET_CHARS:
        raise ValueError(f"a cluster secret has at least {MIN_SECRET_CHARS} characters "
                         "(make one with: openssl rand -base64 32)")
    secret.encode("utf-8")  # a lone surrogate: refused here, not at the first message
    return secret


class Opened(NamedTuple):
    """A message whose seal holds (:meth:`Seal.verify`), not yet admitted."""

    sender: bytes
    number: int
    text: str


@dataclass
class _Sender:
    highest: int  # the highest number taken
    seen: int  # bit i: number ``highest - i`` was taken
    heard: float  # the receiver's clock (monotonic) when last taken from


class Seal:
    """Seals what one Core process publishes and opens what it reads."""

    def __init__(self, secret: str, clock: Clock | None = None) -> None:
        self._key = hmac.new(check_secret(secret).encode(), b"pedelec cluster messages",
                             hashlib.sha256).digest()
        # stamps are wall-clock (they cross nodes); quiet senders and log gaps monotonic
        self._clock = clock or SystemClock()
        self._sender = secrets.token_hex(8).encode()
        self._next = 0
        self._senders: OrderedDict[bytes, _Sender] = OrderedDict()
        #: messages refused since the start, by why
        self.refusals: Counter[Refusal] = Counter()
        self._refused = _RefusalLog()

    def _mac(self, channel: bytes, head: bytes, message: bytes) -> bytes:
        mac = hmac.new(self._key, VERSION + b"\n" + channel + b"\n" + head + b"\n",
                       hashlib.sha256)
        mac.update(message)
        return mac.hexdigest().encode()

    def seal(self, channel: str, message: str) -> bytes:
        """``message`` as published on ``channel``: ``p1 SENDER SEQ MS MAC MESSAGE``."""
        self._next += 1
        head = b"%s %d %d" % (self._sender, self._next, round(self._clock.time() * 1000))
        body = message.encode()
        return b" ".join((VERSION, head, self._mac(channel.encode(), head, body), body))

    def open(self, channel: str, sealed: bytes) -> str:
        """The message ``sealed`` holds, read on ``channel``; :class:`Refused` if it is
        not sealed with this secret for this channel, or was taken before."""
        return self.admit(self.verify(channel, sealed))

    def verify(self, channel: str, sealed: bytes) -> Opened:
        """:meth:`open`'s checks of ``sealed`` alone (format, MAC, stamp): they change
        nothing, so a large message may be checked off the event loop."""
        parts = sealed.split(b" ", 5)
        if len(parts) != 6 or parts[0] != VERSION or not all(
                part.isdigit() and len(part) <= _DIGITS for part in parts[2:4]):
            raise Refused("unsealed")
        _, sender, number, stamp, mac, body = parts
        head = b" ".join((sender, number, stamp))
        if not hmac.compare_digest(mac, self._mac(channel.encode(), head, body)):
            raise Refused("forged")
        if abs(int(stamp) / 1000 - self._clock.time()) > CLOCK_WINDOW_SECONDS:
            raise Refused("stale")
        try:
            text = body.decode()
        except UnicodeDecodeError:  # sealed by a node, so never: but never a traceback
            raise Refused("forged") from None
        return Opened(sender, int(number), text)

    def admit(self, opened: Opened) -> str:
        """The text of a verified message, unless its number was taken before."""
        self._take(opened.sender, opened.number)
        return opened.text

    def _take(self, sender: bytes, number: int) -> None:
        """Number ``number`` of ``sender`` once, within the window (or :class:`Refused`)."""
        now = self._clock.monotonic()
        senders = self._senders
        while senders:  # forget the senders quiet for three windows (they died)
            oldest = next(iter(senders.values()))
            if now - oldest.heard <= 3 * CLOCK_WINDOW_SECONDS:
                break
            senders.popitem(last=False)
        known = senders.get(sender)
        if known is None:
            if len(senders) >= MAX_SENDERS:
                senders.popitem(last=False)
            senders[sender] = _Sender(number, 1, now)
            return
        behind = known.highest - number
        if behind >= REPLAY_WINDOW:
            raise Refused("stale")
        if behind >= 0:
            if known.seen >> behind & 1:
                raise Refused("replayed")
            known.seen |= 1 << behind
        elif -behind >= REPLAY_WINDOW:  # far ahead: the whole window slides past
            known.seen, known.highest = 1, number
        else:  # a new highest: the window slides on
            known.seen = (known.seen << -behind | 1) & ((1 << REPLAY_WINDOW) - 1)
            known.highest = number
        known.heard = now
        senders.move_to_end(sender)

    def refused(self, channel: str, reason: Refusal, size: int) -> None:
        """Say that a message read on ``channel`` was dropped (rate-limited)."""
        self.refusals[reason] += 1
        self._refused.note(channel, reason, size, self._clock.monotonic())


class _RefusalLog:
    """``cluster.message_refused`` at once for the first refusal, then at most once per
    :data:`LOG_EVERY_SECONDS`, counting those it did not log."""

    def __init__(self) -> None:
        self._last: float | None = None
        self._unsaid = 0

    def note(self, channel: str, reason: Refusal, size: int, now: float) -> None:
        if self._last is not None and now - self._last < LOG_EVERY_SECONDS:
            self._unsaid += 1
            return
        log_event("cluster.message_refused", level=logging.WARNING, channel=channel,
                  reason=reason, bytes=size, refused=self._unsaid + 1,
                  hint="a message on the cluster's Redis not sealed with this node's "
                  "--cluster-secret: another cluster's node, or a stranger")
        self._last = now
        self._unsaid = 0
