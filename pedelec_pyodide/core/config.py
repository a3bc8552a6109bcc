"""Core's configuration: one dataclass, filled by the CLI or by code that embeds Core."""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..build.web import default_web_dir
from ..protocol import MAX_FRAME_BYTES
from ..results import DEFAULT_MAX_PENDING
from .agents.contract import Agent
from .clock import Clock, SystemClock
from .store import DEFAULT_STORE_TIMEOUT

ADMIN_TOKEN_ENV = "PEDELEC_ADMIN_TOKEN"
CLUSTER_SECRET_ENV = "PEDELEC_CLUSTER_SECRET"
DEFAULT_PORT = 8765


def admin_token_from_env() -> tuple[str, bool]:
    """``(token, generated)``: ``$PEDELEC_ADMIN_TOKEN`` when set, else a fresh random one."""
    token = os.environ.get(ADMIN_TOKEN_ENV, "").strip()
    if token:
        return token, False
    return secrets.token_urlsafe(32), True


def cluster_secret_from_env() -> str | None:
    """``$PEDELEC_CLUSTER_SECRET`` when set (checked by the CLI: ``store.seal.check_secret``)."""
    return os.environ.get(CLUSTER_SECRET_ENV, "").strip() or None


#: the longest deadline a tool request may have (24 h): longer waits are refused up front
MAX_TIMEOUT_MS = 24 * 60 * 60 * 1000
#: a client's burst of new regular expressions, or of tool metadata, to check: this many
#: seconds' worth of ``--pattern-rate`` or ``--metadata-rate``
BURST_SECONDS = 4.0
#: a client's burst of frames read: this many seconds' worth of ``--read-rate`` (its work
#: comes in at once from all its connections)
READ_BURST_SECONDS = 1.0


def is_timeout_ms(value: object) -> bool:
    """A deadline Core takes: whole milliseconds, 1 to ``MAX_TIMEOUT_MS``."""
    return (isinstance(value, int) and not isinstance(value, bool)
            and 0 < value <= MAX_TIMEOUT_MS)


@dataclass
class CoreConfig:
    """Everything Core can be told. Durations are in seconds unless the name says ms."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    admin_token: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    #: the web app served at ``/`` (``--app DIR``)
    app_dir: Path | None = None
    #: the JS bridge and demo served under ``/pedelec/``
    web_dir: Path | None = field(default_factory=default_web_dir)
    #: a Pyodide runtime + lock + wheels served under ``/pedelec/pyodide/`` (``--pyodide``)
    pyodide_dir: Path | None = None
    #: with no ``pyodide_dir``: provision one in the background on start (CLI default)
    provision: bool = False
    #: serve the bundled demo app at ``/`` (``pedelec demo``)
    demo: bool = False
    #: ``offline`` | ``openai:MODEL`` | ``anthropic:MODEL`` | ``ag-ui:URL``
    agent: str = "offline"
    #: headers sent to an AG-UI agent with every run (``--agent-header``): its auth, so
    #: never shown
    agent_headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    #: overrides ``agent``: builds the agent used for every turn (embedding, tests)
    agent_factory: Callable[[], Agent] | None = None
    #: ``memory`` or a path to an SQLite file
    store: str = "memory"
    #: how long a request waits for the store to commit it before it fails STORE_FAILED
    store_timeout: float = DEFAULT_STORE_TIMEOUT
    #: seals the messages between the nodes of a cluster on Redis (``--cluster-secret``,
    #: ``$PEDELEC_CLUSTER_SECRET``); None: unsealed, any Redis publisher can act as a node
    cluster_secret: str | None = None
    #: extra WebSocket origins allowed besides Core's own (``--allow-origin``)
    allow_origins: tuple[str, ...] = ()
    #: host names Core answers to besides its bind address and loopback names
    #: (``--allow-host``; ``*``: any)
    allow_hosts: tuple[str, ...] = ()
    max_frame_bytes: int = MAX_FRAME_BYTES
    #: seconds an HTTP request head (a WebSocket's upgrade request too) may take to
    #: arrive, from the connection's opening or the head's first byte, and a client may
    #: leave its response unread (``--header-timeout``)
    header_timeout: float = 10.0
    #: proxies whose ``X-Forwarded-For`` names the client (``--forwarded-allow-ips``:
    #: addresses, networks or ``*``); none by default, whoever connects is the client
    forwarded_allow_ips: tuple[str, ...] = ()
    #: frames a connection may send per second, and the burst it may save up
    rate_limit: float = 200.0
    rate_burst: int = 400
    #: seconds a WebSocket may stay open without a valid hello (``--hello-timeout``)
    hello_timeout: float = 10.0
    #: a tool request's deadline unless the call or ``tool_timeouts_ms`` says otherwise
    tool_timeout_ms: int = 30_000
    tool_timeouts_ms: dict[str, int] = field(default_factory=dict)
    #: how far, in multiples of its timeout, a request's progress may push its deadline
    #: unless its caller sets ``maxTotalMs`` (``--max-total-factor``)
    max_total_factor: float = 10.0
    #: how long a request may wait for the user (``tool.waiting``) with its deadline
    #: paused, all its waits together, in seconds (``--user-wait-limit``)
    user_wait_limit: float = 600.0
    #: Core's one clock: every deadline, expiry, lease, retry and duration is kept by it
    #: (embedding, tests: one they move)
    clock: Clock = field(default_factory=SystemClock)
    #: tool-calling steps a turn may take
    max_steps: int = 8
    #: how long a disconnected session waits to be resumed before it expires
    session_ttl: float = 120.0
    #: sessions Core holds, connected or awaiting a resume, in all and per client
    #: address; when full, the new page's own client's session disconnected longest is
    #: dropped to make room (never another client's), else the new one is refused
    max_sessions: int = 256
    max_sessions_per_client: int = 32
    #: a session's tool metadata and client info, as JSON bytes (hello, tools.update)
    max_metadata_bytes: int = MAX_FRAME_BYTES
    #: frames queued for a connection that is not reading them (bytes of memory), and
    #: for all connections together (over it, the one holding the most is closed)
    max_queued_bytes: int = 8 * MAX_FRAME_BYTES
    max_queued_total_bytes: int = 64 * MAX_FRAME_BYTES
    #: characters of regular expressions in tool metadata, not checked before, that Core
    #: checks per second for one client address (a burst of 4 s of it); over it a hello
    #: or tools.update is refused RATE_LIMITED
    pattern_rate: float = 16384.0
    #: characters of tool metadata (hello and tools.update frames) Core checks per second
    #: for one client address (a burst of 4 s of it); over it such a frame is refused
    #: RATE_LIMITED
    metadata_rate: float = float(MAX_FRAME_BYTES)
    #: characters of frames Core reads per second from one client address, all its
    #: connections together (a burst of 1 s of it); past it, Core reads that client's
    #: connections more slowly: nothing is refused (a frame's work, JSON decoded with the
    #: GIL held, is up to ~50 ms a MiB, and one client's 32 sessions shared it)
    read_rate: float = 2.0 * MAX_FRAME_BYTES
    #: tool requests pending at once per session
    max_pending: int = DEFAULT_MAX_PENDING
    #: an agent's history per session, as JSON bytes (oldest turns dropped first)
    max_history_bytes: int = 512 * 1024
    #: results of delivered requests remembered per session, to tell duplicates apart
    remembered_results: int = 256
    #: results of requests made outside turns (control API, MCP) kept per session for
    #: ``GET .../tool-calls/{id}`` and Idempotency-Key retries; also the most turns
    #: started with a key whose records are kept (``--kept-results``)
    kept_results: int = 64
    #: how long such a result (or a turn's key) is kept, in seconds (``--result-retention``)
    result_retention: float = 24 * 60 * 60.0

    def timeout_for(self, tool: str, timeout_ms: int | None = None) -> float:
        """The deadline, in seconds, of a request for ``tool``."""
        if timeout_ms is None:
            timeout_ms = self.tool_timeouts_ms.get(tool, self.tool_timeout_ms)
        return timeout_ms / 1000.0

    def max_total_for(self, timeout: float, max_total_ms: int | None = None) -> float:
        """How long, in seconds, progress may keep a request of ``timeout`` seconds going."""
        if max_total_ms is None:
            return timeout * self.max_total_factor
        return max_total_ms / 1000.0
