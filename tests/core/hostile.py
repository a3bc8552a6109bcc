"""Hostile input against a real Core process: the attacks of issue 10 and their figures.

Shared by ``tests/core/test_hostile.py`` (the quick scale in CI, the full one with
``PEDELEC_LONG=1``) and ``bench/attacks.py`` (a table of every attack). Each attack runs
on a Core of its own (``pedelec serve`` on a free loopback port, so its RSS is its own):

1. a victim page connects (a websockets client that echoes every tool request's args),
   from :data:`VICTIM`'s address;
2. idle baseline: ``/pedelec/v1/health`` latency over :attr:`Scale.probes` GETs at
   :data:`PROBE_RATE` per second, Core's RSS sampled alongside (and, for an attack that
   asks, the victim's tool calls timed alongside);
3. the same probes again while one attacker client sends the attack, from
   :data:`ATTACKER`'s address (another client: per-client bounds are the attacker's);
4. the victim must still be served (a control-API tool call round-trips), health must
   answer, and ``SIGTERM`` must stop Core within :data:`STOP_LIMIT` seconds.

The probes run in a process of their own (``python hostile.py probe ...``): the attacker's
own work (building and parsing megabyte frames) never delays a probe's clock. A probe
that gets no answer within :attr:`Scale.cap` seconds counts as taking ``cap``.

The figures are issue 10's: health p99 under :data:`P99_TARGET` (:data:`P99_NOISY` allowed
on a noisy 2-core machine; the pass mark), and RSS growth under the bounds of
:data:`RSS_BOUNDS_MIB`. An attack marked ``strict`` (issue 22's) must do better: health p99
under attack within :data:`P99_TARGET` of the idle p99, and the victim's calls as fast as
idle (:data:`CALLS_SLOWER`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import httpx2
import websockets
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from pedelec_pyodide.protocol import MAX_FRAME_BYTES

KIB = 1024
TOKEN = "hostile-admin-token"
#: the addresses the victim page and the attacker connect from: two clients to Core
VICTIM = "127.0.0.1"
ATTACKER = "127.0.0.66"
#: a strict attack's mark for the victim's calls: median under attack at most this many
#: times the idle one, plus CALLS_SLACK seconds (a loaded 2-core machine's noise)
CALLS_SLOWER = 3.0
CALLS_SLACK = 0.020

PROBE_RATE = 20.0  # health GETs per second
P99_TARGET = 0.100  # seconds: issue 10's figure for health p99 under attack
P99_NOISY = 1.0  # seconds: what the issue allows under the 2-core noise; the pass mark
STOP_LIMIT = 5.0  # seconds: SIGTERM stops Core within this, whatever state it is in
#: a frame a little under Core's limit, room left for the envelope around the payload
FRAME_ROOM = MAX_FRAME_BYTES - 4 * KIB

def documented_bound(*, frame: int, metadata: int, history: int, total_queued: int,
                     steps: int, sessions: int, connections: int, running: int) -> int:
    """The worst case of Core's memory that docs/reference/server.md ("Memory") gives, in
    bytes above its idle RSS, for these options and counts: per session its metadata,
    history (and where its turns begin: an eighth more), ended turns' ends (a frame) and
    the frame on its way out; per connection what the WebSocket layer holds of what it
    was sent (the last frame received, kept until the next; while it sends, the one being
    read and the one Core reads: each up to four frames, larger ones it refuses) and 128
    KiB of its own; per running turn of the offline agent (4 + 4 x steps) frames; in all
    the queues' cap and the work in progress (four worker threads, each decoding up to
    ~24 frames' worth)."""
    per_session = metadata + history * 9 // 8 + 2 * frame
    per_connection = 12 * frame + 128 * KIB
    per_turn = (4 + 4 * steps) * frame
    return (sessions * per_session + connections * per_connection + running * per_turn
            + total_queued + 4 * 24 * frame)


def default_bound_mib(sessions: int, connections: int, running: int = 0) -> float:
    """:func:`documented_bound` at ``pedelec serve``'s defaults, in MiB."""
    return documented_bound(frame=MAX_FRAME_BYTES, metadata=MAX_FRAME_BYTES,
                            history=MAX_FRAME_BYTES // 2, total_queued=64 * MAX_FRAME_BYTES,
                            steps=8, sessions=sessions, connections=connections,
                            running=running) / (KIB * KIB)


#: RSS growth bounds (MiB) of issue 10, for the attack sizes the issue names; the quick
#: scale keeps them (not scaled down: a bounded Core has a fixed cost per attack too, and
#: today's unbounded one is over them at the quick sizes already)
RSS_BOUNDS_MIB = {"sessions": 256, "never_reads": 128, "bad_frames": 128, "turn_args": 256,
                  "http": 64}

ECHO_TOOLS = [
    {"name": "update_counter", "description": "adds delta to the counter",
     "argsSchema": {"type": "object", "properties": {"delta": {"type": "integer"}},
                    "required": ["delta"]}},
    {"name": "echo", "description": "returns its args", "argsSchema": {"type": "object"}},
]


@dataclass(frozen=True)
class Scale:
    """How big each attack is, and how long it is watched."""

    name: str
    probes: int  # health GETs per phase (baseline, attack)
    cap: float  # seconds a probe, a victim call or an attacker's wait may take
    deadline: float  # seconds an attack may take in all
    ref_chain_bytes: int  # a hello whose schema is one long $ref chain
    words_bytes: int  # tool description and turn text, each, for word matching
    fill_properties: int  # schema properties for argument filling ...
    fill_bytes: int  # ... and the turn text they are read from
    unique_items: int  # items of a uniqueItems array in args
    sessions: int  # sessions of ~1 MiB metadata each (the issue's figure: 40)
    never_read_frames: int  # frames sent by a client that never reads, ~1 MiB answer each
    arg_turns: int  # turns with ~1 MiB of /call args (the issue's figure: 25)
    bad_frames: int  # bad frames each quoting a ~1 MiB value (the issue: 300)
    flood_hellos: int  # hellos of ~1 MiB from one client, as fast as it can (issue 22: 256)
    pipelining_sockets: int  # sockets pipelining requests by the MiB, reading no answer
    header_floods: int  # requests of 15,000 header lines, one after the other
    unfinished_frames: int  # connections never saying hello, each a frame of ~4 MiB unfinished
    array_frames: int  # frames of ~1 MiB of empty arrays, per socket (two sockets)
    large_calls: int  # control-API tool calls with ~0.75 MiB of args, read again
    turn_sessions: int  # sessions of one client, each running a turn of ~1 MiB of args
    mcp_calls: int  # MCP tool calls of ~0.75 MiB of args, half empty arrays, half nested


FULL = Scale("full", probes=200, cap=30.0, deadline=180.0, ref_chain_bytes=285 * KIB,
             words_bytes=117 * KIB, fill_properties=4000, fill_bytes=400 * KIB,
             unique_items=60_000, sessions=40, never_read_frames=400, arg_turns=25,
             bad_frames=300, flood_hellos=256, pipelining_sockets=20, header_floods=2000,
             unfinished_frames=600, array_frames=40, large_calls=60, turn_sessions=32,
             mcp_calls=40)
QUICK = Scale("quick", probes=40, cap=3.0, deadline=30.0, ref_chain_bytes=96 * KIB,
              words_bytes=40 * KIB, fill_properties=1000, fill_bytes=100 * KIB,
              unique_items=20_000, sessions=12, never_read_frames=200, arg_turns=8,
              bad_frames=200, flood_hellos=48, pipelining_sockets=8, header_floods=300,
              unfinished_frames=200, array_frames=15, large_calls=8, turn_sessions=8,
              mcp_calls=8)


# --- Core in a process of its own ---------------------------------------------------------


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


@dataclass
class CoreProcess:
    process: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/pedelec/v1/bridge"

    def stop(self) -> float:
        """SIGTERM, then the seconds Core took to exit (``math.inf``: killed after
        :data:`STOP_LIMIT` seconds)."""
        if self.process.poll() is not None:
            return 0.0
        started = time.perf_counter()
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=STOP_LIMIT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=30)
            return math.inf
        return time.perf_counter() - started

    def log_tail(self, lines: int) -> str:
        """The last lines Core wrote after its start-up banner (its URL: the admin token
        from the environment is not printed)."""
        logged = self.log.read_text(errors="replace").splitlines()[1:]
        return "\n".join(logged[-lines:]) or "(nothing)"


@contextlib.contextmanager
def core_process(workdir: Path, *options: str, nofile: int | None = None,
                 quiet: bool = True) -> Iterator[CoreProcess]:
    """``pedelec serve`` on a free loopback port, its output in ``workdir/core.log``;
    killed on exit if still running. ``nofile``: its limit of open files
    (RLIMIT_NOFILE); ``quiet=False`` logs every event, not only warnings."""

    def limit_files() -> None:
        assert nofile is not None
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    log = workdir / "core.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "pedelec_pyodide.core.cli", "serve", "--host", "127.0.0.1",
             "--port", "0", "--no-provision", *(["--quiet"] if quiet else []), *options],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=dict(os.environ, PEDELEC_ADMIN_TOKEN=TOKEN),
            preexec_fn=None if nofile is None else limit_files)
    try:
        port = None
        for _ in range(300):  # 30 s for Core to listen
            found = re.search(r"http://127\.0\.0\.1:(\d+)/", log.read_text(errors="replace"))
            if found:
                port = int(found.group(1))
                break
            if process.poll() is not None:
                break
            time.sleep(0.1)
        if port is None:
            raise RuntimeError(f"Core did not start:\n{log.read_text(errors='replace')}")
        yield CoreProcess(process, port, log)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)


# --- health probes (a process of their own) -------------------------------------------------


@dataclass
class Probes:
    latencies: list[float]  # seconds, one per probe; a probe without answer counts as cap
    unanswered: int
    rss_kib: list[int]  # Core's RSS, sampled every 50 ms while probing

    def percentile(self, fraction: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


async def _health_once(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET /pedelec/v1/health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                     "Connection: close\r\n\r\n".encode())
        answer = await reader.read()
        if not answer.startswith(b"HTTP/1.1 200"):
            raise OSError(f"health answered {answer[:40]!r}")
    finally:
        writer.close()


async def _probe(port: int, pid: int, count: int, cap: float) -> Probes:
    """``count`` health GETs at PROBE_RATE, each on its own connection and on schedule
    (a stalled Core delays every probe due while it stalls, not just one)."""
    latencies: list[float] = []
    unanswered = 0
    samples: list[int] = []
    done = asyncio.Event()

    async def sample() -> None:
        while not done.is_set():
            with contextlib.suppress(OSError, RuntimeError):
                samples.append(rss_kib(pid))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), 0.05)

    async def one(delay: float) -> None:
        nonlocal unanswered
        await asyncio.sleep(delay)  # on schedule: probes pace the load
        started = time.perf_counter()
        try:
            await asyncio.wait_for(_health_once(port), cap)
            latencies.append(time.perf_counter() - started)
        except (TimeoutError, OSError):
            unanswered += 1
            latencies.append(cap)

    sampler = asyncio.create_task(sample())
    await asyncio.gather(*(one(i / PROBE_RATE) for i in range(count)))
    done.set()
    await sampler
    return Probes(latencies, unanswered, samples)


async def probe(core: CoreProcess, scale: Scale,
                during: Callable[[], Awaitable[None]] | None = None) -> Probes:
    """Probe Core from a process of its own, running ``during()`` meanwhile."""
    prober = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "probe", str(core.port), str(core.pid), str(scale.probes),
        str(scale.cap), stdout=asyncio.subprocess.PIPE)
    assert prober.stdout is not None
    try:
        ready = await asyncio.wait_for(prober.stdout.readline(), 30)
        assert ready.strip() == b"ready", ready
        if during is not None:
            await during()
        window = scale.probes / PROBE_RATE + scale.cap + 30
        output = await asyncio.wait_for(prober.stdout.read(), window)
        await asyncio.wait_for(prober.wait(), 10)
    finally:
        if prober.returncode is None:
            prober.kill()
            await prober.wait()
    data = json.loads(output)
    return Probes(data["latencies"], data["unanswered"], data["rss_kib"])


def _probe_main(port: int, pid: int, count: int, cap: float) -> None:
    async def main() -> Probes:
        print("ready", flush=True)
        return await _probe(port, pid, count, cap)

    result = asyncio.run(main())
    print(json.dumps({"latencies": result.latencies, "unanswered": result.unanswered,
                      "rss_kib": result.rss_kib}))


# --- clients ------------------------------------------------------------------------------


async def connect(url: str, **options: Any) -> Any:
    """A websockets client on loopback, from :data:`ATTACKER` unless ``local_addr`` says
    otherwise: no proxy, no size limit (Core's error frames may quote a lot), no
    compression (Core does not offer it)."""
    settings: dict[str, Any] = {"open_timeout": 10, "close_timeout": 2, "max_size": None,
                                "proxy": None, "compression": None, "ping_interval": None,
                                "local_addr": (ATTACKER, 0)}
    settings.update(options)
    return await websockets.connect(url, **settings)


async def hello(ws: Any, tools: list[dict[str, Any]], cap: float) -> dict[str, Any]:
    """Send hello; Core's answer (``welcome`` or an ``error``)."""
    await ws.send(json.dumps({"type": "hello", "protocol": 1, "tools": tools}))
    answer: dict[str, Any] = json.loads(await asyncio.wait_for(ws.recv(), cap))
    return answer


class EchoPage:
    """A page that answers every tool request with its args, wrapped: ``{"echo": args}``."""

    def __init__(self) -> None:
        self.ws: Any = None
        self.session_id = ""
        self.task: asyncio.Task[None] | None = None

    async def open(self, url: str, cap: float, address: str = VICTIM) -> EchoPage:
        self.ws = await connect(url, local_addr=(address, 0))
        welcome = await hello(self.ws, ECHO_TOOLS, cap)
        assert welcome["type"] == "welcome", welcome
        self.session_id = welcome["sessionId"]
        self.task = asyncio.create_task(self._answer())
        return self

    async def _answer(self) -> None:
        with contextlib.suppress(websockets.ConnectionClosed):
            async for frame in self.ws:
                request = json.loads(frame)
                if request["type"] == "tool.request":
                    await self.ws.send(json.dumps({
                        "type": "tool.result", "toolRequestId": request["toolRequestId"],
                        "result": {"echo": request["args"]}, "handledBy": "named"}))

    async def close(self) -> None:
        await self.ws.close()
        if self.task is not None:
            await asyncio.wait_for(self.task, 10)


async def read_until(ws: Any, cap: float,
                     stop: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
    """Frames up to and including the first one ``stop`` accepts, each within ``cap``."""
    frames: list[dict[str, Any]] = []
    while True:
        frame = json.loads(await asyncio.wait_for(ws.recv(), cap))
        frames.append(frame)
        if stop(frame):
            return frames


def ends_turn(turn_id: str) -> Callable[[dict[str, Any]], bool]:
    """The frame that ends a turn: its ``turn.end``, or an ``error`` naming it."""
    return lambda f: f.get("turnId") == turn_id and f["type"] in ("turn.end", "error")


async def run_turn(ws: Any, turn_id: str, text: str, cap: float) -> list[dict[str, Any]]:
    await ws.send(json.dumps({"type": "turn.start", "turnId": turn_id, "text": text}))
    return await read_until(ws, cap, ends_turn(turn_id))


# --- payloads -----------------------------------------------------------------------------


def ref_chain_schema(size: int) -> dict[str, Any]:
    """``d0 -> d1 -> ... -> dN`` through ``allOf``, about ``size`` bytes of JSON."""
    links = size // len('"d0000":{"allOf":[{"$ref":"#/$defs/d0000"}]},')
    defs: dict[str, Any] = {f"d{i}": {"allOf": [{"$ref": f"#/$defs/d{i + 1}"}]}
                            for i in range(links)}
    defs[f"d{links}"] = {"type": "object"}
    return {"type": "object", "allOf": [{"$ref": "#/$defs/d0"}], "$defs": defs}


def distinct_words(size: int, first_letter: int) -> str:
    """Distinct words of about ``size`` bytes in all that share their first four letters
    and differ in the fifth and sixth (CJK ideographs: letters that lowercase to themselves),
    so a matcher that buckets words by a prefix or compares stems finds them all alike."""
    out: list[str] = []
    total = 0
    span = 4000
    index = 0
    while total < size:
        word = ("qqqq" + chr(first_letter + index % span)
                + chr(first_letter + span + index // span))
        out.append(word)
        total += len(word.encode()) + 1
        index += 1
    return " ".join(out)


def dense_containers(size: int) -> list[Any]:
    """About ``size`` bytes of JSON that decode into as many Python objects as JSON can
    make of them: empty objects, 3 bytes each (``{},``)."""
    return [{} for _ in range(size // 3)]


def schema_with_default(size: int) -> dict[str, Any]:
    return {"type": "object", "properties": {"x": {"default": dense_containers(size)}}}


def one_line_description(size: int) -> str:
    """A description of ``size`` bytes on one line and without a word to match (the
    offline agent quotes a tool's first line when no tool fits; no letters, so matching
    it costs the agent little)."""
    return "1 " * (size // 2)


def quoting_frames(size: int) -> list[str]:
    """Bad frames whose natural error message would quote a ``size``-byte value, each
    cheap to find bad: an unknown type, a bad handledBy, a bad tool name, a string where
    a schema wants an integer."""
    value = "v" * size
    return [
        json.dumps({"type": value}),
        json.dumps({"type": "tool.result", "toolRequestId": "r", "result": 1,
                    "handledBy": value}),
        json.dumps({"type": "tools.update", "tools": [
            {"name": value, "description": "d", "argsSchema": {"type": "object"}}]}),
        json.dumps({"type": "tools.update", "tools": [
            {"name": "t", "description": "d",
             "argsSchema": {"type": "object", "properties": {
                 "s": {"type": "string", "minLength": value}}}}]}),
    ]


# a pattern Python's re takes exponential time on for "aaaa...!" (and its relatives)
SLOW_PATTERNS = ["^(a+)+$", "^(a|a)*$", "^(a|aa)+$", "^(([a-z])+.)+[A-Z]([a-z])+$"]


def slow_validation_tool(unique_items: int) -> dict[str, Any]:
    """A tool whose schema asks a validator for what it may be slow on: backtracking
    patterns (values, property names, patternProperties) and uniqueItems on big arrays,
    with a default and an enum that exercise the same."""
    big = [{"k": i, "v": [i]} for i in range(unique_items)]
    return {"name": "slow", "description": "a schema a validator may be slow on",
            "argsSchema": {
                "type": "object",
                "properties": {
                    **{f"s{i}": {"type": "string", "pattern": p}
                       for i, p in enumerate(SLOW_PATTERNS)},
                    "u": {"type": "array", "uniqueItems": True, "default": big},
                },
                "propertyNames": {"pattern": "^(s|u|(a+)+)[0-9]*$"},
                "patternProperties": {"^(a|aa)+$": {"type": "string", "pattern": "^(a+)+$"}},
            }}


def long_pattern_tool(size: int) -> dict[str, Any]:
    """A tool whose one pattern is ``size`` bytes of alternatives (compiling a regular
    expression is linear, but slow: ~2 s a MiB for Python's re)."""
    return {"name": "long_pattern", "description": "a long pattern",
            "argsSchema": {"type": "object", "properties": {
                "s": {"type": "string", "pattern": "(?:a|b)" * (size // 7)}}}}


def slow_validation_args(unique_items: int) -> dict[str, Any]:
    evil = "a" * 40 + "!"
    args: dict[str, Any] = {f"s{i}": evil for i in range(len(SLOW_PATTERNS))}
    args[evil] = evil
    args["u"] = [{"k": i, "v": [i]} for i in range(unique_items)]
    return args


def call_line(tool: str, size: int) -> str:
    """``/call TOOL {"a": [{}, {}, ...]}``: about ``size`` bytes of args, as many objects
    as fit."""
    return f"/call {tool} " + json.dumps({"a": dense_containers(size)}, separators=(",", ":"))


# --- an attack and what is measured ---------------------------------------------------------


@dataclass
class Context:
    """What an attack gets: Core, the scale, and a place for what it saw."""

    core: CoreProcess
    scale: Scale
    http: httpx.AsyncClient
    victim: EchoPage
    rss_kib: list[int] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def timed(self, what: str, started: float) -> None:
        """Note what an answer was and how long it took (a stalled Core shows here beyond
        the probes' cap)."""
        self.notes.append(f"{what} in {time.perf_counter() - started:.1f} s")

    def mark_rss(self) -> None:
        """Sample Core's RSS now (an attack calls this while it still holds its state)."""
        with contextlib.suppress(OSError, RuntimeError):
            self.rss_kib.append(rss_kib(self.core.pid))


@dataclass(frozen=True)
class Attack:
    name: str
    what: str
    run: Callable[[Context], Awaitable[None]]
    store: bool = False  # run Core with a temporary SQLite store
    rss_kind: str | None = None  # a key of RSS_BOUNDS_MIB when memory is the figure
    options: tuple[str, ...] = ()  # more options of pedelec serve
    strict: bool = False  # issue 22's marks (see the module's text), victim calls timed
    #: the RSS bound (MiB) for a scale, when it is the documented one (documented_bound)
    rss_bound: Callable[[Scale], float] | None = None


@dataclass
class Row:
    """One attack's figures, and what failed against issue 10's."""

    attack: str
    idle_p50: float
    idle_p99: float
    attack_p50: float
    attack_p99: float
    unanswered: int
    rss_growth_mib: float
    rss_bound_mib: float | None
    stop_seconds: float
    failures: list[str]
    notes: list[str]
    #: a strict attack's victim calls: median seconds idle and under attack
    idle_calls_p50: float | None = None
    attack_calls_p50: float | None = None

    @property
    def passed(self) -> bool:
        return not self.failures


async def attack_ref_chain(ctx: Context) -> None:
    ws = await connect(ctx.core.ws_url)
    tool = {"name": "chain", "description": "a long $ref chain",
            "argsSchema": ref_chain_schema(ctx.scale.ref_chain_bytes)}
    started = time.perf_counter()
    answer = await hello(ws, [tool], ctx.scale.deadline)
    ctx.timed(f"hello -> {answer.get('code') or answer['type']}", started)
    await ws.close()


async def attack_word_matching(ctx: Context) -> None:
    size = ctx.scale.words_bytes
    ws = await connect(ctx.core.ws_url)
    tool = {"name": "words", "description": distinct_words(size, 0x4E00),
            "argsSchema": {"type": "object"}}
    started = time.perf_counter()
    answer = await hello(ws, [tool], ctx.scale.deadline)
    ctx.timed(f"hello -> {answer.get('code') or answer['type']}", started)
    if answer["type"] == "welcome":
        started = time.perf_counter()
        frames = await run_turn(ws, "words", distinct_words(size, 0x4E00 + 9000),
                                ctx.scale.deadline)
        ctx.timed(f"turn -> {frames[-1].get('status') or frames[-1].get('code')}", started)
    await ws.close()


async def attack_call_problems(ctx: Context) -> None:
    """One ``/call`` line, then as many short lines that are not ``/call`` lines as a frame
    holds (each a problem the reply reports), from a page and from a control-API turn."""
    scale = ctx.scale
    ws = await connect(ctx.core.ws_url)
    answer = await hello(ws, ECHO_TOOLS, scale.cap)
    ctx.notes.append(f"hello -> {answer.get('code') or answer['type']}")
    lines = (FRAME_ROOM - 64) // 4  # "a\n" is 3 bytes in the frame's JSON, with escaping 4
    text = "/call echo {}\n" + "a\n" * lines
    for i in range(scale.arg_turns // 2):
        started = time.perf_counter()
        frames = await run_turn(ws, f"p{i}", text, scale.deadline)
        reply = frames[-1].get("text") or ""
        ctx.timed(f"turn -> {frames[-1].get('status') or frames[-1].get('code')}, "
                  f"{len(reply)} characters", started)
        ctx.mark_rss()
    await ws.close()


async def attack_argument_filling(ctx: Context) -> None:
    scale = ctx.scale
    properties = {f"p{i}": {"type": "integer"} for i in range(scale.fill_properties)}
    tool = {"name": "fill", "description": "fill in the numbers",
            "argsSchema": {"type": "object", "properties": properties}}
    ws = await connect(ctx.core.ws_url)
    started = time.perf_counter()
    answer = await hello(ws, [tool], ctx.scale.deadline)
    ctx.timed(f"hello -> {answer.get('code') or answer['type']}", started)
    if answer["type"] == "welcome":
        reader = asyncio.create_task(_answer_requests(ws))
        text = "fill " + "p1 " * (scale.fill_bytes // 3)
        started = time.perf_counter()
        await ws.send(json.dumps({"type": "turn.start", "turnId": "fill", "text": text}))
        end = await asyncio.wait_for(reader, scale.deadline)
        ctx.timed(f"turn -> {end.get('status') or end.get('code')}", started)
    await ws.close()


async def _answer_requests(ws: Any) -> dict[str, Any]:
    """Answer tool requests with ``{}`` until a turn ends; that frame."""
    while True:
        frame = json.loads(await ws.recv())
        if frame["type"] == "tool.request":
            await ws.send(json.dumps({"type": "tool.result", "toolRequestId":
                                      frame["toolRequestId"], "result": {},
                                      "handledBy": "named"}))
        elif frame["type"] == "turn.end" or (frame["type"] == "error" and "turnId" in frame):
            result: dict[str, Any] = frame
            return result


async def attack_validator(ctx: Context) -> None:
    scale = ctx.scale
    ws = await connect(ctx.core.ws_url)
    started = time.perf_counter()
    answer = await hello(ws, [long_pattern_tool(FRAME_ROOM)], scale.deadline)
    ctx.timed(f"long pattern hello -> {answer.get('code') or answer['type']}", started)
    await ws.close()
    page = EchoPage()
    page.ws = await connect(ctx.core.ws_url)
    started = time.perf_counter()
    answer = await hello(page.ws, [slow_validation_tool(scale.unique_items)], scale.deadline)
    ctx.timed(f"hello -> {answer.get('code') or answer['type']}", started)
    if answer["type"] == "welcome":
        page.session_id = answer["sessionId"]
        page.task = asyncio.create_task(page._answer())
        started = time.perf_counter()
        response = await ctx.http.post(
            f"/pedelec/v1/sessions/{page.session_id}/tool-calls",
            json={"tool": "slow", "args": slow_validation_args(scale.unique_items)},
            timeout=scale.deadline)
        ctx.timed(f"tool call -> HTTP {response.status_code}", started)
        if response.status_code >= 500:
            ctx.failures.append(f"the tool call got HTTP {response.status_code}")
    await page.close()


async def attack_sessions(ctx: Context) -> None:
    """Many sessions with ~1 MiB of metadata each, all held open."""
    scale = ctx.scale
    tool = {"name": "big", "description": "big metadata",
            "argsSchema": schema_with_default(FRAME_ROOM)}
    frame = json.dumps({"type": "hello", "protocol": 1, "tools": [tool]},
                       separators=(",", ":"))
    sockets: list[Any] = []
    codes: dict[str, int] = {}
    try:
        for _ in range(scale.sessions):
            try:
                ws = await connect(ctx.core.ws_url)
            except (OSError, websockets.InvalidHandshake, TimeoutError) as exc:
                codes[type(exc).__name__] = codes.get(type(exc).__name__, 0) + 1
                continue
            sockets.append(ws)
            try:
                await ws.send(frame)
                answer = json.loads(await asyncio.wait_for(ws.recv(), scale.cap))
                code = answer.get("code") or answer["type"]
            except websockets.ConnectionClosed as exc:
                code = f"closed {exc.rcvd.code if exc.rcvd else None}"
            codes[code] = codes.get(code, 0) + 1
        await asyncio.sleep(0.5)  # settle, then sample RSS (the prober samples it all along too)
        ctx.mark_rss()
        ctx.notes.append("hellos -> " + ", ".join(f"{k} x{v}" for k, v in sorted(codes.items())))
    finally:
        for ws in sockets:
            await ws.close()


async def attack_never_reads(ctx: Context) -> None:
    """A page that stops reading, then makes Core send it ~1 MiB frames: it runs one turn
    whose reply is ~1 MiB (no tool fits, so the agent lists its tool's one-line
    description), then sends that turn's ``turn.start`` again and again (Core answers a
    re-sent ``turn.start`` of an ended turn with its ``turn.end`` again: the page may
    have lost it)."""
    scale = ctx.scale
    ws = await connect(ctx.core.ws_url, max_queue=1)
    tool = {"name": "listed", "description": one_line_description(FRAME_ROOM),
            "argsSchema": {"type": "object"}}
    answer = await hello(ws, [tool], scale.cap)
    ctx.notes.append(f"hello -> {answer.get('code') or answer['type']}")
    if answer["type"] != "welcome":
        return
    frame = json.dumps({"type": "turn.start", "turnId": "n", "text": "nothing fits this"})
    end = (await run_turn(ws, "n", "nothing fits this", scale.cap))[-1]
    ctx.notes.append(f"turn -> {end.get('status') or end.get('code')}, "
                     f"{len(json.dumps(end))} bytes")
    sent = 0  # from here on nothing is read
    with contextlib.suppress(websockets.ConnectionClosed, TimeoutError):
        for i in range(scale.never_read_frames):
            await asyncio.wait_for(ws.send(frame), scale.cap)
            sent += 1
            await asyncio.sleep(0.006)  # under the default rate limit (200/s, burst 400)
            if i % 20 == 0:
                ctx.mark_rss()
    await asyncio.sleep(1.0)  # settle, then sample RSS (the prober samples it all along too)
    ctx.mark_rss()
    ctx.notes.append(f"{sent} turn.start sent again, nothing read")
    ws.transport.abort()


async def attack_bad_frames(ctx: Context) -> None:
    """Bad frames each carrying a ~1 MiB value the error could quote, sent without reading
    in between; then everything Core sent is read."""
    scale = ctx.scale
    ws = await connect(ctx.core.ws_url, max_queue=1)
    answer = await hello(ws, ECHO_TOOLS, scale.cap)
    ctx.notes.append(f"hello -> {answer.get('code') or answer['type']}")
    frames = quoting_frames(FRAME_ROOM)
    sent = 0
    with contextlib.suppress(websockets.ConnectionClosed):
        for i in range(scale.bad_frames):
            await asyncio.wait_for(ws.send(frames[i % len(frames)]), scale.cap)
            sent += 1
            if i % 20 == 0:
                ctx.mark_rss()
    await asyncio.sleep(0.5)  # settle, then sample RSS (the prober samples it all along too)
    ctx.mark_rss()
    largest = 0
    received = 0
    with contextlib.suppress(websockets.ConnectionClosed, TimeoutError):
        while received < sent:
            largest = max(largest, len(await asyncio.wait_for(ws.recv(), scale.cap)))
            received += 1
    ctx.notes.append(f"{sent} sent, {received} error frames read, largest {largest} bytes")
    await ws.close()


async def attack_progress(ctx: Context) -> None:
    """A page runs a turn that calls its own tool, then sends ``tool.progress`` for the
    request, each frame carrying a ~1 MiB message, without reading; then it answers."""
    scale = ctx.scale
    ws = await connect(ctx.core.ws_url, max_queue=1)
    tool = {"name": "slow", "description": "works a while", "argsSchema": {"type": "object"}}
    answer = await hello(ws, [tool], scale.cap)
    ctx.notes.append(f"hello -> {answer.get('code') or answer['type']}")
    if answer["type"] != "welcome":
        return
    await ws.send(json.dumps({"type": "turn.start", "turnId": "p", "text": "/call slow {}"}))
    request = (await read_until(ws, scale.cap, lambda f: f["type"] == "tool.request"))[-1]
    rid = request["toolRequestId"]
    message = "m" * FRAME_ROOM
    sent = 0
    with contextlib.suppress(websockets.ConnectionClosed):
        for i in range(scale.bad_frames):
            await asyncio.wait_for(ws.send(json.dumps({
                "type": "tool.progress", "toolRequestId": rid, "progress": i + 1,
                "total": scale.bad_frames, "message": message})), scale.cap)
            sent += 1
            if i % 20 == 0:
                ctx.mark_rss()
        await asyncio.sleep(0.5)  # settle, then sample RSS (the prober samples it all along too)
        ctx.mark_rss()
        await ws.send(json.dumps({"type": "tool.result", "toolRequestId": rid,
                                  "result": "done", "handledBy": "named"}))
        end = (await read_until(ws, scale.cap, ends_turn("p")))[-1]
        ctx.notes.append(f"{sent} progress frames of ~1 MiB; turn -> "
                         f"{end.get('status') or end.get('code')}")
    await ws.close()


async def attack_array_frames(ctx: Context) -> None:
    """Two pages of one client send frames just under the limit made of empty arrays
    (``[[],[],...]``: the costliest JSON to decode per byte), one after the other, and
    read what Core answers (each names a request it does not know). Each frame is decoded
    in Core's parse threads, and json holds the GIL while it decodes."""
    scale = ctx.scale
    frame = ('{"type":"tool.progress","toolRequestId":"none","progress":1,"x":['
             + ",".join(["[]"] * (FRAME_ROOM // 3)) + "]}")
    answered = 0

    async def page() -> int:
        nonlocal answered
        ws = await connect(ctx.core.ws_url)
        answer = await hello(ws, ECHO_TOOLS, scale.cap)
        if answer["type"] != "welcome":
            ctx.notes.append(f"hello -> {answer.get('code')}")
            return 0

        async def read() -> None:
            nonlocal answered
            with contextlib.suppress(websockets.ConnectionClosed):
                async for _ in ws:
                    answered += 1

        reader = asyncio.create_task(read())
        sent = 0
        try:
            with contextlib.suppress(websockets.ConnectionClosed):
                for _ in range(scale.array_frames):
                    await asyncio.wait_for(ws.send(frame), scale.cap)
                    sent += 1
                    ctx.mark_rss()
                await asyncio.sleep(0.5)  # the last frames parsed and answered
        finally:
            reader.cancel()
            await ws.close()
        return sent

    sent = await asyncio.gather(page(), page())
    ctx.notes.append(f"{sum(sent)} frames of {len(frame) // KIB} KiB over 2 sockets; "
                     f"{answered} answered")


async def attack_large_calls(ctx: Context) -> None:
    """The control API's caller (it holds the admin token: trusted, yet its calls must
    cost only itself) posts tool calls with ~0.75 MiB of args, one after the other, to
    the victim page, which echoes them back, and reads each result again (``GET``): every
    other call empty arrays (``[[],...]``), the others chains of arrays 90 deep."""
    scale = ctx.scale
    # (the page echoes them with json.dumps's spaces: 4 characters an array, in a frame)
    room = FRAME_ROOM * 3 // 4
    bodies = [json.dumps({"tool": "echo", "args": {"a": args}}, separators=(",", ":"))
              .encode() for args in ([[]] * (room // 4), nested_chains(room, 90))]
    url = f"/pedelec/v1/sessions/{ctx.victim.session_id}/tool-calls"
    statuses: dict[int, int] = {}
    for i in range(scale.large_calls):
        response = await ctx.http.post(url, content=bodies[i % 2], timeout=scale.cap * 3,
                                       headers={"content-type": "application/json",
                                                "Idempotency-Key": f"large-{i}"})
        if response.status_code == 200:
            response = await ctx.http.get(f"{url}/{response.json()['toolRequestId']}",
                                          timeout=scale.cap * 3)
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        ctx.mark_rss()
    ctx.notes.append(f"{scale.large_calls} calls of {len(bodies[0]) // KIB} and "
                     f"{len(bodies[1]) // KIB} KiB, each read again: {statuses}")
    if set(statuses) != {200}:
        ctx.failures.append(f"the calls were answered {statuses}")


def nested_chains(room: int, depth: int) -> list[Any]:
    """Chains of arrays ``depth`` deep (``[[[...]]]``), as many as fill ``room``
    characters of JSON: the costliest text for a depth check that strips a level at a
    time."""
    chain: list[Any] = []
    for _ in range(depth - 1):
        chain = [chain]
    return [chain] * (room // (2 * depth + 2))


async def attack_mcp_calls(ctx: Context) -> None:
    """An MCP client (the SDK's, with the admin token) calls the victim page's ``echo``
    tool with ~0.75 MiB of args, one call after the other: every other call empty arrays
    (``[[],...]``), the others chains of arrays 90 deep. Each call's args are decoded by
    the SDK, checked by Core, sent to the page and echoed back."""
    scale = ctx.scale
    room = FRAME_ROOM * 3 // 4  # (the page's echo, with json.dumps's spaces, must fit)
    shapes = [{"a": [[]] * (room // 4)}, {"a": nested_chains(room, 90)}]
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"},
                              timeout=httpx2.Timeout(scale.cap * 3), trust_env=False,
                              transport=httpx2.AsyncHTTPTransport(local_address=ATTACKER))
    url = f"{ctx.core.base_url}/pedelec/v1/sessions/{ctx.victim.session_id}/mcp"
    outcomes: dict[str, int] = {}
    async with http, Client(streamable_http_client(url, http_client=http),
                            read_timeout_seconds=scale.cap * 3) as client:
        for i in range(scale.mcp_calls):
            result = await client.call_tool("echo", shapes[i % 2])
            outcome = "error" if result.is_error else "echoed"
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
            ctx.mark_rss()
    ctx.notes.append(f"{scale.mcp_calls} MCP calls: {outcomes}")
    if outcomes != {"echoed": scale.mcp_calls}:
        ctx.failures.append(f"the MCP calls ended {outcomes}")


async def attack_turn_args(ctx: Context) -> None:
    """Turns of one ``/call`` line with ~1 MiB of args each, the page echoing them back."""
    scale = ctx.scale
    ws = await connect(ctx.core.ws_url)
    answer = await hello(ws, ECHO_TOOLS, scale.cap)
    ctx.notes.append(f"hello -> {answer.get('code') or answer['type']}")
    text = call_line("echo", FRAME_ROOM)
    statuses: dict[str, int] = {}
    for i in range(scale.arg_turns):
        turn_id = f"a{i}"
        await ws.send(json.dumps({"type": "turn.start", "turnId": turn_id, "text": text}))
        while True:
            frame = json.loads(await asyncio.wait_for(ws.recv(), scale.cap * 3))
            if frame["type"] == "tool.request":  # the args, echoed back as the result
                await ws.send('{"type":"tool.result","toolRequestId":'
                              + json.dumps(frame["toolRequestId"]) + ',"result":'
                              + json.dumps(frame["args"], separators=(",", ":"))
                              + ',"handledBy":"named"}')
            elif ends_turn(turn_id)(frame):
                status = frame.get("status") or frame.get("code")
                statuses[status] = statuses.get(status, 0) + 1
                break
        ctx.mark_rss()
    ctx.notes.append("turns -> " + ", ".join(f"{k} x{v}" for k, v in sorted(statuses.items())))
    await ws.close()


async def attack_turn_sessions(ctx: Context) -> None:
    """As many sessions as one client may have, all at once, each running a turn of one
    ``/call`` line with ~1 MiB of args (small arrays); each page answers ``{"ok": 1}``.
    Each session is within its own bounds; together they were seconds of JSON work in
    Core's threads, which the event loop waited for (the GIL)."""
    scale = ctx.scale
    text = call_line("echo", FRAME_ROOM)
    statuses: dict[str, int] = {}

    async def session(index: int) -> None:
        ws = await connect(ctx.core.ws_url)
        try:
            answer = await hello(ws, ECHO_TOOLS, scale.cap)
            if answer["type"] != "welcome":
                statuses[answer.get("code", "?")] = statuses.get(answer.get("code", "?"), 0) + 1
                return
            turn_id = f"s{index}"
            await ws.send(json.dumps({"type": "turn.start", "turnId": turn_id, "text": text}))
            while True:  # (read at --read-rate: a turn may wait for the others before it)
                frame = json.loads(await asyncio.wait_for(ws.recv(), scale.deadline))
                if frame["type"] == "tool.request":
                    await ws.send(json.dumps({"type": "tool.result", "result": {"ok": 1},
                                              "toolRequestId": frame["toolRequestId"],
                                              "handledBy": "named"}))
                elif ends_turn(turn_id)(frame):
                    status = frame.get("status") or frame.get("code")
                    statuses[status] = statuses.get(status, 0) + 1
                    ctx.mark_rss()
                    return
        finally:
            await ws.close()

    await asyncio.gather(*(session(i) for i in range(scale.turn_sessions)))
    ctx.notes.append(f"{scale.turn_sessions} sessions: turns -> "
                     + ", ".join(f"{k} x{v}" for k, v in sorted(statuses.items())))
    if statuses != {"completed": scale.turn_sessions}:
        ctx.failures.append(f"the turns ended {statuses}")


async def attack_surrogates(ctx: Context) -> None:
    """Lone surrogates that only appear once JSON is decoded: in a ``/call`` line (value
    and key), through the bridge and through a control-API turn, with the SQLite store."""
    scale = ctx.scale
    ws = await connect(ctx.core.ws_url)
    answer = await hello(ws, ECHO_TOOLS, scale.cap)
    if answer["type"] != "welcome":
        ctx.failures.append(f"a plain hello was refused: {answer}")
        return
    session_id = answer["sessionId"]
    lines = ['/call update_counter {"delta": "\\ud800"}', '/call echo {"\\udc00x": 1}']
    for i, line in enumerate(lines):
        try:
            frames = await run_turn(ws, f"s{i}", line, scale.cap)
            end = frames[-1]
            ctx.notes.append(f"bridge turn -> {end.get('status') or end.get('code')}")
        except TimeoutError:
            ctx.failures.append(f"the bridge turn {line!r} did not end within {scale.cap} s")
        except websockets.ConnectionClosed:
            ctx.failures.append(f"Core closed the connection on {line!r}")
            break
    for line in lines:
        try:
            response = await ctx.http.post(f"/pedelec/v1/sessions/{session_id}/turns",
                                           json={"text": line}, timeout=scale.cap)
        except httpx.TimeoutException:
            ctx.failures.append(f"the control-API turn {line!r} did not answer within "
                                f"{scale.cap} s")
            continue
        ctx.notes.append(f"control turn -> HTTP {response.status_code}")
        if response.status_code >= 500:
            ctx.failures.append(f"the control-API turn {line!r} got HTTP "
                                f"{response.status_code}")
    listing = await ctx.http.get("/pedelec/v1/sessions", timeout=scale.cap)
    if listing.status_code != 200:
        ctx.failures.append(f"GET /sessions answered HTTP {listing.status_code}")
    await ws.close()


# --- issue 22: patterns, a flood of hellos -------------------------------------------------

#: legal regular expressions re's parser is slow on, one per shape (issue 22: the first,
#: ~2.5 µs a character; JSON is ~0.01), made distinct by ``n`` (a cache sees each once)
PATTERN_SHAPES: dict[str, Callable[[int], str]] = {
    "groups": lambda n: "(" * 50 + "|" * 5 + ")" * 50 + f"x{n}",
    "nested_quantifiers": lambda n: "(" * 45 + "a*" + ")*" * 45 + f"{n}",
    "alternation": lambda n: "|".join(f"w{n}_{i}" for i in range(90)),
    "repeat_counts": lambda n: "(?:a{65535}){65535}" * 40 + f"{n}",
    "classes": lambda n: "(?i)" + "[\u0100-\uffff]" * 60 + f"{n}",
}
#: tools.update frames a flood sends per second (issue 22: half the rate limit)
FLOOD_RATE = 100.0
#: a flood's frames stay under this many characters: parsed on the event loop until
#: issue 22 (bridge.py's PARSE_IN_THREAD_CHARS)
SHORT_FRAME_CHARS = 16 * KIB


def pattern_frames(shape: str, count: int) -> list[str]:
    """``count`` tools.update frames just under :data:`SHORT_FRAME_CHARS`, each full of
    distinct patterns of ``shape``."""
    make = PATTERN_SHAPES[shape]
    head = ('{"type":"tools.update","tools":[{"name":"t","description":"d","argsSchema":'
            '{"type":"object","properties":{')
    tail = "}}}]}"
    frames = []
    serial = 0
    for _ in range(count):  # built piece by piece: the attacker's own CPU is Core's too
        pieces: list[str] = []
        size = len(head) + len(tail)
        while True:
            piece = (json.dumps(f"p{serial}") + ':{"type":"string","pattern":'
                     + json.dumps(make(serial)) + "}")
            if size + len(piece) + 1 >= SHORT_FRAME_CHARS - 100:
                break
            pieces.append(piece)
            size += len(piece) + 1
            serial += 1
        frames.append(head + ",".join(pieces) + tail)
    return frames


async def _drain(ws: Any, codes: dict[str, int]) -> None:
    """Read what Core sends (counting the codes of its answers) until the socket ends."""
    with contextlib.suppress(websockets.ConnectionClosed):
        async for data in ws:
            frame = json.loads(data)
            code = frame.get("code") or frame["type"]
            codes[code] = codes.get(code, 0) + 1


def flood_patterns(shape: str, *, before_hello: bool = False,
                   connections: int = 1) -> Callable[[Context], Awaitable[None]]:
    """tools.update frames full of new patterns, :data:`FLOOD_RATE` a second for the
    probes' window, from one client over ``connections`` sockets (after hello, unless
    ``before_hello``)."""
    async def attack(ctx: Context) -> None:
        window = ctx.scale.probes / PROBE_RATE
        frames = pattern_frames(shape, int(window * FLOOD_RATE) + 1)
        codes: dict[str, int] = {}
        sockets = [await connect(ctx.core.ws_url) for _ in range(connections)]
        if not before_hello:
            for ws in sockets:
                await hello(ws, ECHO_TOOLS, ctx.scale.cap)
        readers = [asyncio.create_task(_drain(ws, codes)) for ws in sockets]
        started = time.perf_counter()
        try:
            for i, frame in enumerate(frames):
                await asyncio.wait_for(sockets[i % connections].send(frame), ctx.scale.cap)
                await asyncio.sleep(max(0.0, started + (i + 1) / FLOOD_RATE
                                        - time.perf_counter()))
        finally:
            ctx.notes.append(f"{len(frames)} frames of {shape} patterns "
                             f"({len(frames[0])} characters each) -> "
                             + ", ".join(f"{k} x{v}" for k, v in sorted(codes.items())))
            for ws in sockets:
                await ws.close()
            await asyncio.gather(*readers)
    return attack


async def attack_session_flood(ctx: Context) -> None:
    """Issue 22's attack 2: hellos of ~1 MiB of tools each, as fast as one client can,
    while a page of another client reloads with a call pending; then a third client's
    new page. Before: the reloading page's session was evicted (RESUME_REFUSED, its call
    SESSION_EXPIRED) and every new page refused TOO_MANY_SESSIONS."""
    scale = ctx.scale
    reloading = await connect(ctx.core.ws_url, local_addr=("127.0.0.3", 0))
    welcome = await hello(reloading, ECHO_TOOLS, scale.cap)
    sid = welcome["sessionId"]
    call = asyncio.create_task(ctx.http.post(
        f"/pedelec/v1/sessions/{sid}/tool-calls", timeout=scale.deadline,
        json={"tool": "echo", "args": {"n": 1}, "timeoutMs": int(scale.deadline * 1000)}))
    request = (await read_until(reloading, scale.cap,
                                lambda f: f["type"] == "tool.request"))[-1]
    await reloading.close()  # the page reloads: its session waits for a resume
    tool = {"name": "big", "description": "big metadata",
            "argsSchema": schema_with_default(FRAME_ROOM)}
    frame = json.dumps({"type": "hello", "protocol": 1, "tools": [tool]},
                       separators=(",", ":"))
    codes: dict[str, int] = {}
    sockets: list[Any] = []
    started = time.perf_counter()
    try:
        for _ in range(scale.flood_hellos):
            ws = await connect(ctx.core.ws_url)
            sockets.append(ws)
            await ws.send(frame)
        for ws in sockets:
            try:
                answer = json.loads(await asyncio.wait_for(ws.recv(), scale.deadline))
                code = answer.get("code") or answer["type"]
            except websockets.ConnectionClosed as exc:
                code = f"closed {exc.rcvd.code if exc.rcvd else None}"
            codes[code] = codes.get(code, 0) + 1
        ctx.timed(f"{scale.flood_hellos} hellos -> " + ", ".join(
            f"{k} x{v}" for k, v in sorted(codes.items())), started)
        ctx.mark_rss()
        await asyncio.sleep(0.5)
        ctx.notes.append(f"RSS settled at {rss_kib(ctx.core.pid) / KIB:.0f} MiB")
        back = await connect(ctx.core.ws_url, local_addr=("127.0.0.3", 0))
        await back.send(json.dumps({"type": "hello", "protocol": 1, "tools": ECHO_TOOLS,
                                    "sessionId": sid, "resumeToken": welcome["resumeToken"]}))
        resumed = json.loads(await asyncio.wait_for(back.recv(), scale.cap))
        if resumed.get("resumed") is not True:
            ctx.failures.append(f"the reloading page could not resume: {resumed}")
        else:
            again = json.loads(await asyncio.wait_for(back.recv(), scale.cap))
            if again.get("toolRequestId") != request["toolRequestId"]:
                ctx.failures.append(f"its pending call was not sent again: {again}")
            await back.send(json.dumps({"type": "tool.result",
                                        "toolRequestId": request["toolRequestId"],
                                        "result": {"done": 1}, "handledBy": "named"}))
            result = (await asyncio.wait_for(call, scale.cap)).json().get("result")
            if result != {"done": 1}:
                ctx.failures.append(f"its pending call ended {result}")
        await back.close()
        newcomer = await connect(ctx.core.ws_url, local_addr=("127.0.0.4", 0))
        answer = await hello(newcomer, ECHO_TOOLS, scale.cap)
        if answer["type"] != "welcome":
            ctx.failures.append(f"a new page of a third client was refused: {answer}")
        await newcomer.close()
    finally:
        if not call.done():
            call.cancel()
        for ws in sockets:
            await ws.close()


async def _raw(ctx: Context) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A TCP connection to Core from :data:`ATTACKER`'s address."""
    return await asyncio.open_connection("127.0.0.1", ctx.core.port, local_addr=(ATTACKER, 0))


def _watch_window(ctx: Context) -> float:
    """When the probes' window under attack ends (``time.monotonic()``)."""
    return time.monotonic() + ctx.scale.probes / PROBE_RATE


async def attack_pipelined_unread(ctx: Context) -> None:
    """Requests pipelined by the MiB on a few sockets whose client reads no answer (found
    from outside: uvicorn queued every request of each read, ~30 times its bytes in memory,
    and read on after each answer: 20 such sockets took Core past a GiB, and health to
    seconds)."""
    request = b"GET /pedelec/v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    blob = request * (KIB * KIB // len(request))
    writers = []
    for _ in range(ctx.scale.pipelining_sockets):
        _, writer = await _raw(ctx)
        writers.append(writer)
    taken = 0  # bytes the kernel took (what Core read, and what its socket buffers hold)
    end = _watch_window(ctx)
    try:
        while time.monotonic() < end:
            for writer in writers:
                buffered = writer.transport.get_write_buffer_size()
                if not writer.transport.is_closing() and buffered < len(blob):
                    writer.write(blob)  # (ours bounded too)
                    taken += len(blob) - writer.transport.get_write_buffer_size() + buffered
            ctx.mark_rss()
            await asyncio.sleep(0.05)
    finally:
        closed = sum(writer.transport.is_closing() for writer in writers)
        for writer in writers:
            writer.transport.abort()
    ctx.notes.append(f"{taken // (KIB * KIB)} MiB of requests taken by the kernel, no "
                     f"answer read; {closed} of {len(writers)} sockets closed by Core")


async def attack_many_headers(ctx: Context) -> None:
    """Heads of 15,000 empty header lines (60 KiB: under the size bound), one after the
    other (found from outside: each cost ~4.5 ms and ~1.8 MiB kept until the garbage
    collector's rare full pass)."""
    head = (b"GET /pedelec/v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"a:\r\n" * 15_000
            + b"\r\n")
    statuses: dict[bytes, int] = {}
    for n in range(ctx.scale.header_floods):
        reader, writer = await _raw(ctx)
        writer.write(head)
        line = await asyncio.wait_for(reader.readline(), ctx.scale.cap)
        status = line[9:12]
        statuses[status] = statuses.get(status, 0) + 1
        writer.transport.abort()
        if n % 20 == 0:
            ctx.mark_rss()
    ctx.notes.append("answers: " + ", ".join(f"{k.decode() or 'none'} x{v}"
                                             for k, v in sorted(statuses.items())))
    if statuses.get(b"200"):
        ctx.failures.append("a head of 15,000 header lines was served")


async def attack_unfinished_frames(ctx: Context) -> None:
    """WebSocket connections that never say hello, each sending a frame of ~4 MiB (four
    times the frame limit, the most the WebSocket layer takes) all but its last byte, held
    until the hello deadline (found from outside: ~4 MiB each, as many as the client
    opened: 600 of them held 2.5 GiB)."""
    frame_size = 4 * MAX_FRAME_BYTES - 64
    head = bytes([0x81, 0x80 | 127]) + frame_size.to_bytes(8, "big") + b"\0\0\0\0"
    body = b"a" * (frame_size - 1)
    writers = []
    refused = 0
    try:
        for _ in range(ctx.scale.unfinished_frames):
            reader, writer = await _raw(ctx)
            writers.append(writer)
            writer.write(b"GET /pedelec/v1/bridge HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         b"Upgrade: websocket\r\nConnection: Upgrade\r\n"
                         b"Sec-WebSocket-Version: 13\r\n"
                         b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
            await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), ctx.scale.cap)
            writer.write(head + body)
            try:
                await asyncio.wait_for(writer.drain(), ctx.scale.cap)
            except (ConnectionError, TimeoutError):
                refused += 1
            ctx.mark_rss()
        await asyncio.sleep(0.5)
        ctx.mark_rss()
    finally:
        for writer in writers:
            writer.transport.abort()
    ctx.notes.append(f"{len(writers)} connections, {refused} cut off while sending")


ATTACKS = [
    Attack("ref_chain", "a $ref chain d0 -> ... -> dN (allOf) in hello", attack_ref_chain),
    Attack("word_matching", "tool description and turn text of distinct words",
           attack_word_matching),
    Attack("argument_filling", "many schema properties, a long turn message",
           attack_argument_filling),
    Attack("validator", "a 1 MiB pattern; backtracking patterns, big uniqueItems (metadata "
           "and args)",
           attack_validator),
    # (these two send their ~1 MiB hellos at once, as a slower client would in time:
    # what they measure is the memory bound, not --metadata-rate's 4 MiB burst)
    Attack("sessions", "sessions with ~1 MiB of metadata each", attack_sessions,
           rss_kind="sessions", options=("--metadata-rate", "1e9")),
    Attack("never_reads", "a client that never reads, ~1 MiB replies", attack_never_reads,
           rss_kind="never_reads"),
    # (these two flood faster than --read-rate reads a client: what they measure is the
    # memory bound and the quoting, not the pace)
    Attack("bad_frames", "bad frames each quoting a ~1 MiB value", attack_bad_frames,
           rss_kind="bad_frames", options=("--read-rate", "1e12")),
    Attack("turn_args", "turns with ~1 MiB of /call args", attack_turn_args,
           rss_kind="turn_args"),
    Attack("progress", "tool.progress frames with ~1 MiB messages, nothing read",
           attack_progress, rss_kind="bad_frames", options=("--read-rate", "1e12")),
    Attack("array_frames", "frames of ~1 MiB of empty arrays, back to back on 2 sockets",
           attack_array_frames, rss_kind="bad_frames"),
    Attack("large_calls", "control-API tool calls of ~0.75 MiB of empty arrays or 90-deep "
           "chains, echoed, read again",
           attack_large_calls, rss_kind="turn_args"),
    Attack("mcp_calls", "MCP tool calls of ~0.75 MiB of empty arrays or 90-deep chains, "
           "echoed", attack_mcp_calls, rss_kind="turn_args"),
    Attack("turn_sessions", "a client's 32 sessions at once, each a turn of ~1 MiB of "
           "/call args", attack_turn_sessions,
           rss_bound=lambda scale: default_bound_mib(scale.turn_sessions, scale.turn_sessions,
                                                     scale.turn_sessions)),
    Attack("call_problems", "a /call message of ~340,000 bad lines (a reply per line?)",
           attack_call_problems, rss_kind="turn_args"),
    Attack("surrogates", "lone surrogates in /call lines, SQLite store", attack_surrogates,
           store=True),
    Attack("session_flood", "hellos of ~1 MiB from one client; another's page reloading",
           attack_session_flood,  # it holds 32 sessions; the victims 3, all connected
           rss_bound=lambda scale: default_bound_mib(35, scale.flood_hellos + 3),
           options=("--metadata-rate", "1e9")),
    *(Attack(f"patterns_{shape}", f"tools.update frames of new {shape} patterns, "
             f"{FLOOD_RATE:g}/s", flood_patterns(shape), strict=True)
      for shape in PATTERN_SHAPES),
    Attack("patterns_before_hello", "the groups flood before hello",
           flood_patterns("groups", before_hello=True), strict=True),
    Attack("patterns_32_sockets", "the groups flood over 32 sockets of one client",
           flood_patterns("groups", connections=32), strict=True),
    Attack("pipelined_unread", "requests pipelined by the MiB, no answer read",
           attack_pipelined_unread, rss_kind="http"),
    Attack("many_headers", "heads of 15,000 empty header lines", attack_many_headers,
           rss_kind="http"),
    Attack("unfinished_frames", "connections never saying hello, each a ~4 MiB frame "
           "unfinished", attack_unfinished_frames,
           # the client's connections that may await their hello (as many as its sessions)
           rss_bound=lambda scale: default_bound_mib(0, 32)),
]


async def _victim_served(http: httpx.AsyncClient, page: EchoPage, cap: float) -> str | None:
    """None when the victim's tool call round-trips, else what went wrong."""
    try:
        response = await http.post(f"/pedelec/v1/sessions/{page.session_id}/tool-calls",
                                   json={"tool": "update_counter", "args": {"delta": 1}},
                                   timeout=cap)
    except httpx.HTTPError as exc:
        return f"the victim's tool call failed: {type(exc).__name__}"
    if response.status_code != 200 or response.json().get("result") != {"echo": {"delta": 1}}:
        return f"the victim's tool call answered {response.status_code} {response.text[:200]}"
    return None


@contextlib.asynccontextmanager
async def _clients(core: CoreProcess, cap: float) -> AsyncIterator[
        tuple[httpx.AsyncClient, EchoPage]]:
    async with httpx.AsyncClient(base_url=core.base_url, trust_env=False,
                                 headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        page = await EchoPage().open(core.ws_url, cap)
        try:
            yield http, page
        finally:
            with contextlib.suppress(Exception):
                await page.close()


async def run_attack(attack: Attack, scale: Scale) -> Row:
    """One attack on a Core of its own; its row of figures."""
    with tempfile.TemporaryDirectory(prefix="pedelec-hostile-") as tmp:
        workdir = Path(tmp)
        options = ("--store", str(workdir / "store.sqlite")) if attack.store else ()
        with core_process(workdir, *options, *attack.options) as core:
            return await _measure(attack, scale, core)


async def _timed_calls(http: httpx.AsyncClient, page: EchoPage, scale: Scale,
                       failures: list[str]) -> list[float]:
    """The victim's tool calls, one every 50 ms over the probes' window: each one's
    seconds (a call that fails counts as the cap, and is a failure)."""
    seconds: list[float] = []
    end = time.perf_counter() + scale.probes / PROBE_RATE
    while time.perf_counter() < end:
        started = time.perf_counter()
        problem = await _victim_served(http, page, scale.cap)
        seconds.append(scale.cap if problem else time.perf_counter() - started)
        if problem:
            failures.append(problem)
        await asyncio.sleep(0.05)
    return seconds


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2] if values else 0.0


async def _measure(attack: Attack, scale: Scale, core: CoreProcess) -> Row:
    failures: list[str] = []
    async with _clients(core, scale.cap) as (http, victim):
        await asyncio.sleep(0.3)  # Core settles after start: pacing, no window asserted
        calls: list[list[float]] = []

        async def probed(during: Callable[[], Awaitable[None]] | None = None) -> Probes:
            if not attack.strict:
                return await probe(core, scale, during)
            done, timed = await asyncio.gather(probe(core, scale, during),
                                               _timed_calls(http, victim, scale, failures))
            calls.append(timed)
            return done

        idle = await probed()
        before = rss_kib(core.pid)
        ctx = Context(core, scale, http, victim)

        async def during() -> None:
            try:
                await asyncio.wait_for(attack.run(ctx), scale.deadline)
            except TimeoutError:
                ctx.failures.append(f"the attack did not finish within {scale.deadline} s")
            except (OSError, websockets.WebSocketException, httpx.HTTPError) as exc:
                # Core may close a hostile client's connection: its own cost, not a failure
                ctx.notes.append(f"the attacker's connection ended: {type(exc).__name__}")
            except Exception as exc:  # what the attack did not expect: the next ones go on
                ctx.failures.append(f"the attack failed: {type(exc).__name__}: {exc!s:.300}")

        attacked = await probed(during)
        failures += ctx.failures
        victim_problem = await _victim_served(http, victim, scale.cap)
        if victim_problem:
            failures.append(victim_problem)
    peak = max([before, *attacked.rss_kib, *ctx.rss_kib])
    growth = (peak - before) / KIB
    bound = (attack.rss_bound(scale) if attack.rss_bound is not None
             else None if attack.rss_kind is None else float(RSS_BOUNDS_MIB[attack.rss_kind]))
    p99 = attacked.percentile(0.99)
    if p99 >= P99_NOISY:
        failures.append(f"health p99 {p99 * 1000:.0f} ms under attack (limit "
                        f"{P99_NOISY * 1000:.0f} ms; {attacked.unanswered} of "
                        f"{len(attacked.latencies)} probes unanswered within {scale.cap} s)")
    if bound is not None and growth >= bound:
        failures.append(f"RSS grew {growth:.0f} MiB (limit {bound:.0f} MiB)")
    idle_calls = attack_calls = None
    if attack.strict:
        idle_p99 = idle.percentile(0.99)
        if p99 >= idle_p99 + P99_TARGET:
            failures.append(f"health p99 {p99 * 1000:.0f} ms under attack, {idle_p99 * 1000:.0f} "
                            f"idle: more than {P99_TARGET * 1000:.0f} ms added")
        idle_calls, attack_calls = (_median(timed) for timed in calls)
        if attack_calls > CALLS_SLOWER * idle_calls + CALLS_SLACK:
            failures.append(f"the victim's calls took {attack_calls * 1000:.0f} ms (median) "
                            f"under attack, {idle_calls * 1000:.0f} idle")
    try:
        async with httpx.AsyncClient(base_url=core.base_url, trust_env=False) as plain:
            health = await plain.get("/pedelec/v1/health", timeout=scale.cap)
        if health.status_code != 200:
            failures.append(f"health answered {health.status_code} after the attack")
    except httpx.HTTPError as exc:
        failures.append(f"health did not answer after the attack: {type(exc).__name__}")
    stop = await asyncio.to_thread(core.stop)
    if stop > STOP_LIMIT:
        failures.append(f"SIGTERM did not stop Core within {STOP_LIMIT:.0f} s (killed)")
    if failures:
        ctx.notes.append("the end of Core's log: " + core.log_tail(5).replace("\n", " | "))
    return Row(attack.name, idle.percentile(0.5), idle.percentile(0.99),
               attacked.percentile(0.5), p99, attacked.unanswered, growth, bound, stop,
               failures, ctx.notes, idle_calls, attack_calls)


# --- the table ----------------------------------------------------------------------------


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f}" if seconds >= 0.01 else f"{seconds * 1000:.1f}"


def table_header() -> str:
    return ("| attack | health p50 idle / attack (ms) | health p99 idle / attack (ms) | "
            "p99 ratio | RSS growth (MiB) | SIGTERM stop (s) | result |\n"
            "| --- | ---: | ---: | ---: | ---: | ---: | --- |")


def table_row(row: Row) -> str:
    ratio = row.attack_p99 / row.idle_p99 if row.idle_p99 > 0 else math.inf
    bound = "" if row.rss_bound_mib is None else f" (< {row.rss_bound_mib:.0f})"
    stop = "killed" if math.isinf(row.stop_seconds) else f"{row.stop_seconds:.1f}"
    target = "" if row.attack_p99 < P99_TARGET else f"; p99 over {P99_TARGET * 1000:.0f} ms"
    verdict = "pass" + target if row.passed else "**FAIL**: " + "; ".join(row.failures)
    if row.idle_calls_p50 is not None and row.attack_calls_p50 is not None:
        verdict += (f" (victim's calls {_ms(row.idle_calls_p50)} / "
                    f"{_ms(row.attack_calls_p50)} ms)")
    return (f"| {row.attack} | {_ms(row.idle_p50)} / {_ms(row.attack_p50)} | "
            f"{_ms(row.idle_p99)} / {_ms(row.attack_p99)} | {ratio:.1f}x | "
            f"{row.rss_growth_mib:.0f}{bound} | {stop} | {verdict} |")


if __name__ == "__main__":  # the probe process (see probe())
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["probe"])
    parser.add_argument("port", type=int)
    parser.add_argument("pid", type=int)
    parser.add_argument("count", type=int)
    parser.add_argument("cap", type=float)
    options = parser.parse_args()
    _probe_main(options.port, options.pid, options.count, options.cap)
