"""Attacks on the WebSocket layer (issue 22) against a real Core process, and a raw client.

The attacks speak WebSocket frames Core's app never sees (pings, pongs, continuation
frames), or sockets that never say hello. :class:`RawSocket` does the opening handshake
with websockets' own Sans-I/O client (no hand-written parser), then writes frames that
websockets serialises, as fast as the socket takes them, and reads only if told: a
client that never reads does not even drain its kernel buffer.

Each attack runs under ``hostile.py``'s measuring (a victim page, /health probes idle
and under attack from a process of their own, RSS, the victim served after it, SIGTERM);
``test_ws_frames.py`` asserts the figures against the same run's idle baseline.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import struct
import tempfile
import termios
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from hostile import (
    ECHO_TOOLS,
    QUICK,
    TOKEN,
    Attack,
    Context,
    CoreProcess,
    EchoPage,
    Row,
    _measure,
    connect,
    core_process,
)
from hostile import FULL as HOSTILE_FULL
from websockets.client import ClientProtocol
from websockets.frames import Close, Frame, Opcode
from websockets.uri import parse_uri

LONG = os.environ.get("PEDELEC_LONG") == "1"
HELLO_TIMEOUT = 1.0  # seconds: the short --hello-timeout of these Cores
#: a pattern Python's re takes ~1 ms to compile (issue 22, attack 1)
HEAVY_PATTERN = "(" * 50 + "|" * 5 + ")" * 50
#: other shapes of costly pattern (nesting, alternation, repetition)
PATTERN_SHAPES = [HEAVY_PATTERN, "(?:" * 40 + "a|b" + ")*" * 40, "((a+)+)+" * 30,
                  "[a-z]{1,1000}" * 20]


@dataclass(frozen=True)
class WsScale:
    """How big each attack is."""

    name: str
    sockets: int  # sockets that never say hello
    fragments: int  # empty continuation frames after a first fragment
    pings: int  # pings (125-byte payloads) from a client that never reads
    pongs: int  # unsolicited pongs
    #: tools.update frames of patterns before hello, 100 a second (less than the default
    #: hello deadline, 10 s: past it Core closes the connection)
    pattern_seconds: float
    reloads: int  # pages that answer 15 of 40 calls and close, per way of closing


QUICK_WS = WsScale("quick", sockets=40, fragments=200_000, pings=200_000, pongs=100_000,
                   pattern_seconds=2.0, reloads=10)
FULL_WS = WsScale("full", sockets=600, fragments=1_000_000, pings=1_500_000,
                  pongs=1_000_000, pattern_seconds=8.0, reloads=60)
SCALE = FULL_WS if LONG else QUICK_WS
#: hostile.py's measuring: probes per phase (the attack runs while they do), caps
MEASURE = HOSTILE_FULL if LONG else QUICK


# --- a raw WebSocket client ---------------------------------------------------------------


def frame(opcode: Opcode, data: bytes = b"", fin: bool = True) -> bytes:
    """One client frame (masked), serialised by websockets."""
    return Frame(opcode, data, fin=fin).serialize(mask=True, extensions=[])


class RawSocket:
    """A WebSocket client that writes what it is told and reads only when asked."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 protocol: ClientProtocol) -> None:
        self.reader = reader
        self.writer = writer
        self.protocol = protocol
        self.opened = time.monotonic()
        self._texts: deque[dict[str, Any]] = deque()  # read, not yet asked for

    @classmethod
    async def open(cls, port: int, cap: float = 10.0) -> RawSocket:
        protocol = ClientProtocol(parse_uri(f"ws://127.0.0.1:{port}/pedelec/v1/bridge"))
        protocol.send_request(protocol.connect())
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"".join(protocol.data_to_send()))
        while protocol.handshake_exc is None and not protocol.events_received():
            data = await asyncio.wait_for(reader.read(65536), cap)
            if not data:
                raise ConnectionError("Core closed the socket during the handshake")
            protocol.receive_data(data)
        if protocol.handshake_exc is not None:
            raise protocol.handshake_exc
        return cls(reader, writer, protocol)

    async def write(self, data: bytes) -> None:
        """Write, waiting while the socket does not take more (raises once it is gone)."""
        self.writer.write(data)
        await self.writer.drain()

    async def send_text(self, text: str) -> None:
        await self.write(frame(Opcode.TEXT, text.encode()))

    async def next_text(self, cap: float) -> dict[str, Any]:
        """The next text message from Core (pongs and other control frames skipped)."""
        while not self._texts:
            data = await asyncio.wait_for(self.reader.read(65536), cap)
            if not data:
                raise ConnectionError("Core closed the connection")
            self.protocol.receive_data(data)
            self._texts.extend(json.loads(bytes(event.data))
                               for event in self.protocol.events_received()
                               if isinstance(event, Frame) and event.opcode is Opcode.TEXT)
        return self._texts.popleft()

    async def closed_by_core(self, cap: float) -> Close | None:
        """Read (and drop) what comes until Core closes the socket; its close frame, if
        one came. Raises TimeoutError when the socket is still open after ``cap``."""
        close: Close | None = None
        while True:
            try:
                data = await asyncio.wait_for(self.reader.read(65536), cap)
            except ConnectionError:
                return close
            if not data:
                return close
            self.protocol.receive_data(data)
            for event in self.protocol.events_received():
                if isinstance(event, Frame) and event.opcode is Opcode.CLOSE:
                    close = Close.parse(event.data)

    def abort(self) -> None:
        self.writer.transport.abort()


async def flood(sock: RawSocket, unit: bytes, count: int, first: bytes = b"") -> int:
    """``first``, then ``unit`` ``count`` times, in writes of ~256 KiB; the units Core
    took before the socket broke (all of them when it never did)."""
    per_write = max(1, 256 * 1024 // len(unit))
    chunk = unit * per_write
    sent = 0
    try:
        if first:
            await sock.write(first)
        while sent < count:
            take = min(per_write, count - sent)
            await sock.write(chunk if take == per_write else unit * take)
            sent += take
    except (ConnectionError, OSError):
        pass
    return sent


def cpu_seconds(pid: int) -> float:
    """The CPU time (user + system) a process has used."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def fds_back(core: CoreProcess, baseline: int, cap: float) -> float | None:
    """Seconds until Core holds no more file descriptors than ``baseline`` (None: not
    within ``cap``)."""
    started = time.monotonic()
    while time.monotonic() - started < cap:
        if open_fds(core.pid) <= baseline:
            return time.monotonic() - started
        await asyncio.sleep(0.05)
    return None


# --- the attacks ----------------------------------------------------------------------------


async def attack_no_hello(ctx: Context) -> None:
    """Sockets that never say hello: silent ones, ones that ping (reading the pongs),
    ones that send other frames, ones that never read; all must be closed within a
    multiple of the hello deadline (1008), those over the 32 one client may have awaiting
    their hello at once (1013)."""
    core, count = ctx.core, SCALE.sockets
    baseline = open_fds(core.pid)
    socks = [await RawSocket.open(core.port) for _ in range(count)]
    ctx.notes.append(f"{count} sockets opened; Core holds {open_fds(core.pid) - baseline} "
                     "more fds")

    async def ping_until_closed(sock: RawSocket) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while True:
                await sock.write(frame(Opcode.PING, b"p" * 125))
                await asyncio.sleep(0.1)

    async def chatter_until_closed(sock: RawSocket) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while True:
                await sock.send_text(json.dumps({"type": "turn.start", "turnId": "t",
                                                 "text": "hi"}))
                await asyncio.sleep(0.1)

    kinds = ["silent", "pings", "chatter", "never reads"]  # socket i is of kind i % 4
    busy = [asyncio.create_task(ping_until_closed(s)) for s in socks[1::4]]
    busy += [asyncio.create_task(chatter_until_closed(s)) for s in socks[2::4]]
    limit = 4 * HELLO_TIMEOUT
    readers = [(kinds[i % 4], s) for i, s in enumerate(socks) if i % 4 != 3]
    closes = await asyncio.gather(*(s.closed_by_core(limit + 2) for _, s in readers),
                                  return_exceptions=True)
    late = [kind for (kind, _), c in zip(readers, closes, strict=True)
            if isinstance(c, BaseException)]
    codes = {c.code for c in closes if isinstance(c, Close)}
    after = max(time.monotonic() - s.opened for s in socks)
    back = await fds_back(core, baseline, limit)  # the non-readers' sockets too
    for task in busy:
        task.cancel()
    for sock in socks:
        sock.abort()
    ctx.notes.append(f"close codes {sorted(codes)}; all read sockets closed within "
                     f"{after:.1f} s of opening; fds back to baseline in "
                     f"{'-' if back is None else f'{back:.1f}'} s")
    if late:
        ctx.failures.append(f"{len(late)} sockets still open {limit + 2:.0f} s after the "
                            f"{HELLO_TIMEOUT:g} s hello deadline: {sorted(set(late))}")
    if codes - {1008, 1013}:
        ctx.failures.append(f"closed with {sorted(codes)}, not 1008 or 1013")
    if back is None:
        ctx.failures.append(f"Core still holds {open_fds(core.pid) - baseline} fds of the "
                            f"attack {limit:.0f} s after the sockets opened")


def fragments_attack(first: bytes, unit: bytes, what: str) -> Callable[[Context],
                                                                        Awaitable[None]]:
    """A first fragment, then ``SCALE.fragments`` units (continuation frames, perhaps
    with control frames between them), as fast as Core takes them."""

    async def attack(ctx: Context) -> None:
        sock = await RawSocket.open(ctx.core.port)
        started, cpu = time.perf_counter(), cpu_seconds(ctx.core.pid)
        sent = await flood(sock, unit, SCALE.fragments, first)
        close = await sock.closed_by_core(ctx.scale.cap)
        ctx.notes.append(f"{what}: Core took {sent:,} of {SCALE.fragments:,} in "
                         f"{time.perf_counter() - started:.2f} s, "
                         f"{cpu_seconds(ctx.core.pid) - cpu:.2f} s of its CPU; closed "
                         f"{close.code if close else 'without a close frame'}")
        if sent >= SCALE.fragments and close is None:
            ctx.failures.append(f"{what}: every frame taken, and no close from Core")
        if close is not None and close.code != 1008:
            ctx.failures.append(f"{what}: closed with {close.code}, not 1008")
        sock.abort()

    return attack


async def attack_pings_unread(ctx: Context) -> None:
    """Pings with 125-byte payloads from a client that never reads (a Core whose rate
    limit lets them all through: the buffered pongs are what is measured)."""
    sock = await RawSocket.open(ctx.core.port)
    baseline = open_fds(ctx.core.pid) - 1
    cpu = cpu_seconds(ctx.core.pid)
    sent = await flood(sock, frame(Opcode.PING, b"q" * 125), SCALE.pings)
    ctx.mark_rss()
    back = await fds_back(ctx.core, baseline, ctx.scale.cap)
    ctx.notes.append(f"Core took {sent:,} of {SCALE.pings:,} pings before the socket broke "
                     f"({cpu_seconds(ctx.core.pid) - cpu:.2f} s of its CPU); its socket gone "
                     f"{'-' if back is None else f'{back:.1f}'} s later")
    if sent >= SCALE.pings:
        ctx.failures.append("Core took every ping from a client that reads nothing")
    if back is None:
        ctx.failures.append("Core still holds the non-reader's socket")
    sock.abort()


async def attack_pongs(ctx: Context) -> None:
    """Unsolicited pongs, as fast as Core takes them."""
    sock = await RawSocket.open(ctx.core.port)
    cpu = cpu_seconds(ctx.core.pid)
    sent = await flood(sock, frame(Opcode.PONG, b"r" * 16), SCALE.pongs)
    close = await sock.closed_by_core(ctx.scale.cap)
    ctx.notes.append(f"Core took {sent:,} of {SCALE.pongs:,} pongs "
                     f"({cpu_seconds(ctx.core.pid) - cpu:.2f} s of its CPU); closed "
                     f"{close.code if close else 'without a close frame'}")
    if sent >= SCALE.pongs and close is None:
        ctx.failures.append("every pong taken, and no close from Core")
    sock.abort()


async def attack_messages_past_the_cut(ctx: Context) -> None:
    """Small messages after hello, as fast as Core takes them, never reading: the rate
    limit cuts the client off (1008), and what it sends after that must cost Core no more
    parsing than before the cut (uvicorn reads on, for 10 s, waiting for a close answer)."""
    sock = await RawSocket.open(ctx.core.port)
    await sock.send_text(json.dumps({"type": "hello", "protocol": 1, "tools": []}))
    await sock.next_text(ctx.scale.cap)  # welcome
    cpu = cpu_seconds(ctx.core.pid)
    unit = frame(Opcode.TEXT, b'{"type":"turn.cancel","turnId":"x"}')
    sent = await flood(sock, unit, SCALE.fragments)
    close = await sock.closed_by_core(ctx.scale.cap)
    ctx.notes.append(f"Core took {sent:,} of {SCALE.fragments:,} messages "
                     f"({cpu_seconds(ctx.core.pid) - cpu:.2f} s of its CPU); closed "
                     f"{close.code if close else 'without a close frame'}")
    if sent >= SCALE.fragments:
        ctx.failures.append("Core took every message from a client it had cut off")
    sock.abort()


def pattern_update(budget: int) -> str:
    """A ``tools.update`` of about ``budget`` bytes whose schemas are costly patterns."""
    properties: dict[str, Any] = {}
    size = 200
    index = 0
    while True:
        pattern = PATTERN_SHAPES[index % len(PATTERN_SHAPES)]
        size += len(pattern) + 40
        if size > budget:
            break
        properties[f"p{index}"] = {"type": "string", "pattern": pattern}
        index += 1
    tool = {"name": "t", "description": "patterns",
            "argsSchema": {"type": "object", "properties": properties}}
    return json.dumps({"type": "tools.update", "tools": [tool]})


async def _call_times(ctx: Context, page: EchoPage, calls: int) -> list[float]:
    times = []
    for i in range(calls):
        started = time.perf_counter()
        response = await ctx.http.post(f"/pedelec/v1/sessions/{page.session_id}/tool-calls",
                                       json={"tool": "echo", "args": {"i": i}},
                                       timeout=ctx.scale.cap)
        times.append(time.perf_counter() - started)
        if response.status_code != 200:
            ctx.failures.append(f"a victim call answered {response.status_code}")
    return sorted(times)


async def attack_patterns_before_hello(ctx: Context) -> None:
    """``tools.update`` frames just under 16 KiB of costly patterns before hello, 100 a
    second (half the rate limit), each to be answered HELLO_REQUIRED at once; another
    page's calls timed before and during."""
    victim = await EchoPage().open(ctx.core.ws_url, ctx.scale.cap)
    try:
        idle = await _call_times(ctx, victim, 20)
        sock = await RawSocket.open(ctx.core.port)
        text = pattern_update(16 * 1024 - 512)
        count = int(SCALE.pattern_seconds * 100)
        answers: dict[str, int] = {}
        slowest = 0.0

        async def send_all() -> None:
            nonlocal slowest
            for _ in range(count):
                started = time.perf_counter()
                await sock.send_text(text)
                answer = await sock.next_text(ctx.scale.cap)
                slowest = max(slowest, time.perf_counter() - started)
                key = answer.get("code") or answer["type"]
                answers[key] = answers.get(key, 0) + 1
                await asyncio.sleep(max(0.0, 0.01 - (time.perf_counter() - started)))

        sender = asyncio.create_task(send_all())
        during = await _call_times(ctx, victim, 20)
        await sender
        sock.abort()
        ctx.notes.append(f"{count} frames of {len(text):,} bytes -> {answers}; slowest "
                         f"answer {slowest * 1000:.1f} ms; victim call p50 idle "
                         f"{idle[10] * 1000:.1f} ms, during {during[10] * 1000:.1f} ms")
        if answers != {"HELLO_REQUIRED": count}:
            ctx.failures.append(f"answers {answers}, not HELLO_REQUIRED x{count}")
        if during[10] > idle[10] + 0.1:
            ctx.failures.append(f"the victim's calls slowed: p50 {idle[10] * 1000:.1f} ms -> "
                                f"{during[10] * 1000:.1f} ms")
    finally:
        await victim.close()


WS_ATTACKS: list[tuple[Attack, tuple[str, ...]]] = [
    (Attack("no_hello", f"sockets that never say hello (--hello-timeout {HELLO_TIMEOUT:g})",
            attack_no_hello), ("--hello-timeout", str(HELLO_TIMEOUT))),
    (Attack("empty_fragments", "a text message of empty continuation frames",
            fragments_attack(frame(Opcode.TEXT, b"", fin=False), frame(Opcode.CONT, fin=False),
                             "empty fragments")), ()),
    (Attack("binary_fragments", "a binary message of one-byte continuation frames",
            fragments_attack(frame(Opcode.BINARY, b"\x00", fin=False),
                             frame(Opcode.CONT, b"\x01", fin=False), "binary fragments")), ()),
    (Attack("fragments_and_pings", "continuation frames with a ping between each two",
            fragments_attack(frame(Opcode.TEXT, b"{", fin=False),
                             frame(Opcode.CONT, fin=False) + frame(Opcode.PING, b"x" * 125),
                             "fragments and pings")), ()),
    (Attack("pings_unread", "125-byte pings from a client that never reads, the rate limit "
            "set high", attack_pings_unread, rss_kind="never_reads"),
     ("--rate-limit", "10000000", "--rate-burst", "10000000")),
    (Attack("pings_rate", "125-byte pings from a client that never reads",
            attack_pings_unread, rss_kind="never_reads"), ()),
    (Attack("pongs", "unsolicited pongs", attack_pongs), ()),
    (Attack("messages_past_the_cut", "small messages after hello from a client that never "
            "reads, past its cut-off", attack_messages_past_the_cut), ()),
    (Attack("patterns_before_hello", "tools.update frames of costly patterns before hello",
            attack_patterns_before_hello), ()),
]


async def run_ws_attack(attack: Attack, options: tuple[str, ...]) -> Row:
    """One attack on a Core of its own (started with ``options``), measured by hostile.py."""
    with tempfile.TemporaryDirectory(prefix="pedelec-ws-") as tmp:
        workdir = Path(tmp)
        with core_process(workdir, *options) as core:
            return await _measure(attack, MEASURE, core)


# --- results a page sent before it closed -------------------------------------------------

CALLS, ANSWERED = 40, 15
STAGGER = 0.002  # seconds between the calls' starts


def _unsent_bytes(transport: asyncio.BaseTransport) -> int:
    """Bytes this side's kernel has not had acknowledged yet (Linux SIOCOUTQ)."""
    raw = transport.get_extra_info("socket")
    return int(struct.unpack("i", fcntl.ioctl(raw.fileno(), termios.TIOCOUTQ,
                                              b"\0\0\0\0"))[0])


async def answer_and_close(core: CoreProcess, http: httpx.AsyncClient, how: str,
                           cap: float) -> str | None:
    """A page (a websockets client) gets 40 parallel calls, answers 15 as they come and
    closes at once (``how``: ``close``, the close handshake; ``close-frame-and-fin``, a
    close frame and its FIN without waiting for Core's; ``reset``, a reset once Core's
    kernel has acknowledged the results). A second page resumes the session and answers
    what it is sent. None when the 15 results reached their callers and only the other
    25 requests came again, else what went wrong."""
    ws = await connect(core.ws_url)
    await ws.send(json.dumps({"type": "hello", "protocol": 1, "tools": ECHO_TOOLS}))
    welcome = json.loads(await asyncio.wait_for(ws.recv(), cap))
    sid, token = welcome["sessionId"], welcome["resumeToken"]

    async def call(i: int) -> httpx.Response:
        await asyncio.sleep(i * STAGGER)  # Core still sends requests when the page closes
        return await http.post(f"/pedelec/v1/sessions/{sid}/tool-calls",
                               json={"tool": "echo", "args": {"i": i}}, timeout=cap * 3)

    calls = [asyncio.create_task(call(i)) for i in range(CALLS)]
    answered: set[str] = set()
    while len(answered) < ANSWERED:
        request = json.loads(await asyncio.wait_for(ws.recv(), cap))
        if request["type"] == "tool.request":
            answered.add(request["toolRequestId"])
            await ws.send(json.dumps({
                "type": "tool.result", "toolRequestId": request["toolRequestId"],
                "result": {"first": request["args"]}, "handledBy": "named"}))
    if how == "close":
        await ws.close()
    elif how == "close-frame-and-fin":
        ws.transport.write(frame(Opcode.CLOSE, Close(1001, "reloading").serialize()))
        ws.transport.close()
    else:
        while _unsent_bytes(ws.transport):  # Core's kernel has every result: then reset
            await asyncio.sleep(0.001)
        ws.transport.abort()
    resent: list[str] = []
    ws = await connect(core.ws_url)
    await ws.send(json.dumps({"type": "hello", "protocol": 1, "tools": ECHO_TOOLS,
                              "sessionId": sid, "resumeToken": token}))

    async def answer() -> None:
        async for message in ws:
            request = json.loads(message)
            if request["type"] == "tool.request":
                resent.append(request["toolRequestId"])
                await ws.send(json.dumps({
                    "type": "tool.result", "toolRequestId": request["toolRequestId"],
                    "result": {"second": request["args"]}, "handledBy": "named"}))

    answering = asyncio.create_task(answer())
    try:
        results = [r.json().get("result", {}) for r in await asyncio.gather(*calls)]
    finally:
        answering.cancel()
        await ws.close()
    firsts = sum(1 for r in results if "first" in r)
    again = set(resent) & answered
    if firsts != ANSWERED or again or len(results) != CALLS:
        return (f"{how}: {firsts} of {ANSWERED} answered results reached their callers; "
                f"{len(again)} answered requests sent again ({len(resent)} in all)")
    return None


async def run_reloads(how: str, runs: int, cap: float = 10.0) -> list[str]:
    """``runs`` pages that answer and close (``how``), one after another, on one Core;
    what went wrong."""
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="pedelec-ws-") as tmp:
        workdir = Path(tmp)
        with core_process(workdir) as core:
            async with httpx.AsyncClient(base_url=core.base_url, trust_env=False,
                                         headers={"Authorization": f"Bearer {TOKEN}"}) as http:
                for _ in range(runs):
                    problem = await answer_and_close(core, http, how, cap)
                    if problem:
                        problems.append(problem)
    return problems
