"""Who a client is, and the work Core does for one: what bounds per client rest on.

"Any single client" means one client address (``scope["client"]``; uvicorn takes it from
``X-Forwarded-For`` only for a proxy in ``--forwarded-allow-ips``). An IPv6 client is its
/64 network: one host is usually given a whole /64, so each of its addresses counting as
a client of its own would make every per-client bound 2**64 times larger.

:class:`ClientBudgets` holds each client's bucket for a kind of work Core does for it (the
regular expressions it checks, the tool metadata it checks), kept after its last
connection until it has filled up again (a client that reconnects does not get a fresh
burst). :class:`Arrivals` counts each client's
connections that have not said ``hello`` yet.
"""

from __future__ import annotations

import ipaddress
import threading
from collections import OrderedDict
from collections.abc import Callable

from ..clock import Clock
from .ratelimit import TokenBucket

#: the client of a connection whose address the server does not know (a Unix socket)
UNKNOWN = "unknown"


def client_key(host: str | None) -> str:
    """The client a connection from ``host`` belongs to (see the module's text)."""
    if not host:
        return UNKNOWN
    try:
        address = ipaddress.ip_address(host)
    except ValueError:  # not an IP address (a proxy's name for it): as given
        return host
    if isinstance(address, ipaddress.IPv6Address):
        mapped = address.ipv4_mapped
        if mapped is not None:
            return str(mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


class ClientBudgets:
    """Per client: characters of some work Core does for it (new regular expressions
    checked, tool metadata checked), ``rate`` a second with a burst of ``burst``."""

    def __init__(self, rate: float, burst: float, clock: Clock) -> None:
        self.rate = rate
        self.burst = burst
        self.clock = clock
        self._lock = threading.Lock()
        self._live: dict[str, tuple[TokenBucket, int]] = {}  # bucket, connections
        # buckets of clients with no connection left, until full again (oldest first:
        # they all fill at the same rate, so the first ones are full first)
        self._idle: OrderedDict[str, TokenBucket] = OrderedDict()

    def open(self, client: str) -> TokenBucket:
        """A connection of ``client`` opened: its client's bucket."""
        with self._lock:
            while self._idle and next(iter(self._idle.values())).full():
                self._idle.popitem(last=False)
            held = self._live.get(client)
            if held is None:
                bucket = self._idle.pop(client, None) or TokenBucket(self.rate, self.burst,
                                                                     self.clock)
                self._live[client] = (bucket, 1)
                return bucket
            self._live[client] = (held[0], held[1] + 1)
            return held[0]

    def close(self, client: str) -> None:
        """A connection of ``client`` closed."""
        with self._lock:
            bucket, count = self._live[client]
            if count > 1:
                self._live[client] = (bucket, count - 1)
                return
            del self._live[client]
            if not bucket.full():
                self._idle[client] = bucket

    def clients(self) -> int:
        """Clients whose bucket is kept (for tests and the memory bound)."""
        with self._lock:
            return len(self._live) + len(self._idle)


class Arrivals:
    """WebSocket connections that have not said ``hello`` yet, per client and in all.

    No session counts them, yet each may hold a frame of up to four times
    ``--max-frame-bytes`` being received until ``--hello-timeout``: without a bound, one
    client opening them by the hundred, each sending a frame it never finishes, held GiBs.
    They are bounded as sessions are, apart from them: ``per_client`` for each client (one
    more is refused), ``in_all`` together. At that cap a new one takes the place of the
    oldest of the client that has the most, so that clients at their own cap cannot keep
    every other client's pages out (a page that reloads says ``hello`` within
    milliseconds); it is refused only when its own client has as many as any."""

    def __init__(self, per_client: int, in_all: int) -> None:
        self.per_client = per_client
        self.in_all = in_all
        # each client's arrivals, oldest first: what closes each
        self._of: dict[str, OrderedDict[object, Callable[[], None]]] = {}
        self._total = 0

    def enter(self, client: str, arrival: object, close: Callable[[], None]) -> bool:
        """``arrival``, a connection of ``client``, opens (``close`` closes it, should it
        have to make room): False, and not counted, when it may not."""
        mine = self._of.get(client)
        count = 0 if mine is None else len(mine)
        if count >= self.per_client:
            return False
        if self._total >= self.in_all:
            biggest, most = max(self._of.items(), key=lambda item: len(item[1]))
            if len(most) <= count + 1:  # no client has more than this one would
                return False
            _, closing = most.popitem(last=False)
            if not most:
                del self._of[biggest]
            self._total -= 1
            closing()
        self._of.setdefault(client, OrderedDict())[arrival] = close
        self._total += 1
        return True

    def leave(self, client: str, arrival: object) -> None:
        """``arrival`` said ``hello``, or closed (nothing, if it made room already)."""
        mine = self._of.get(client)
        if mine is not None and mine.pop(arrival, None) is not None:
            self._total -= 1
            if not mine:
                del self._of[client]

    def __len__(self) -> int:
        return self._total
