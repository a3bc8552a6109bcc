"""Core's common paths against the socket round trips they cannot avoid, on one Core.

``pedelec serve`` runs in a process of its own (default options, memory store, offline
agent; only the rate limit raised, so that the baseline's pings are not cut off: an
awaited ``tool.result`` is never charged to it). From this process, on 127.0.0.1, with
a raw HTTP/1.1 keep-alive client and a simulated page (a raw WebSocket client that answers
every ``tool.request`` as it reads it: :class:`Page`), variants interleaved round by round:

* ``health``: ``GET /pedelec/v1/health``;
* ``ping``: a WebSocket ping and its pong, on the page's socket (after hello);
* ``call``: ``POST /pedelec/v1/sessions/{id}/tool-calls`` → the page → back;
* ``turn 1``, ``turn 8``: ``POST .../turns`` whose text is 1 or 8 ``/call`` lines (one
  agent step each, a quarter as many of them per round); a step costs
  ``(turn 8 - turn 1) / 7``.

Printed: each variant's median, and the ratios of the medians with goals: a control-API
call against ``health + ping`` (the two hops it crosses) and an agent's step against
``ping``; the 1-minute load average during the run (the machine's cores are shared by
this process and the Cores). ``--before DIR`` runs a second Core from another checkout
(a worktree of an earlier commit), interleaved with this one's: before and after in one
run.

The same variants also run, interleaved, on ``bench/bare_core.py``: a Starlette app on
the server stack Core runs on that does none of Core's work (no checks, no store, no
limits, no agent), only the two sockets' crossings. Its ratios are what those goals
come to for any server in Python on ASGI; Core's time against its time is what Core's
own work costs. ``--granian`` runs that app on Granian too (``bench/bare_granian.py``):
the floor on the other server DESIGN.md allows.

``--cpu`` then prints, for each Core, its CPU time per operation of each variant (the
kernel's count) and this process's (the client and the page): where a ratio's time is.

Run: ``.venv/bin/python bench/core_paths.py [--rounds 15 --calls 200] [--before DIR] [--cpu]
[--granian]``
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from simpages import TOOLS, core_process, server_process
from websockets.speedups import apply_mask

from pedelec_pyodide import protocol

TOKEN = "bench"
STEPS = 8
BARE = "bare ASGI (bench/bare_core.py)"
GRANIAN = "bare ASGI on Granian (bench/bare_granian.py)"


class RawHTTP:
    """One keep-alive HTTP/1.1 connection on asyncio streams (a client library would
    dominate the figures)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, method: str, path: str, body: bytes = b"") -> bytes:
        if self.writer is None or self.writer.is_closing() or (
                self.reader is not None and self.reader.at_eof()):
            # (again after Core's keep-alive timeout closed it, while the other Core ran)
            self.close()
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        assert self.reader is not None
        self.writer.write(
            f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = head.split(b" ", 2)[1]
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        answer = await self.reader.readexactly(length)
        if status != b"200":
            raise RuntimeError(f"{method} {path}: {head!r} {answer[:200]!r}")
        return answer

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


Variant = Callable[[], Awaitable[None]]
REQUEST_HEAD = protocol.frame_head(protocol.ToolRequest).encode()


class Page(asyncio.Protocol):
    """A page that answers at once: a WebSocket client written for the benchmark on
    asyncio's lowest layer, so that its own cost, which is in a call's time and in neither
    baseline, is the least any page's could be. Each frame is handled as it arrives (no
    task, no queue): a ``tool.request`` decoded and its ``tool.result`` written there and
    then, a pong resolving the ping that waits for it; a turn's deltas and its end are told
    by their head and skipped. (A websockets client costs ~110 us a call here, about what
    Core spends on a health request.)"""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.session_id = ""
        self.answered = 0
        self._buffer = b""
        self._opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._welcome: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._pong: asyncio.Future[None] | None = None
        self._upgraded = False

    async def open(self, port: int) -> None:
        await asyncio.get_running_loop().create_connection(lambda: self, "127.0.0.1", port)
        await asyncio.wait_for(self._opened, 30)
        self._send(1, json.dumps({"type": "hello", "protocol": 1, "tools": TOOLS}).encode())
        self.session_id = json.loads(await asyncio.wait_for(self._welcome, 30))["sessionId"]

    async def ping(self) -> None:
        self._pong = asyncio.get_running_loop().create_future()
        self._send(9, b"ping")
        await self._pong

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(
            b"GET /pedelec/v1/bridge HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: "
            + base64.b64encode(os.urandom(16)) + b"\r\n\r\n")

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer + data
        if not self._upgraded:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                self._buffer = buffer
                return
            assert buffer.startswith(b"HTTP/1.1 101"), buffer[:200]
            self._upgraded = True
            self._opened.set_result(None)
            buffer = buffer[end + 4:]
        at = 0
        while len(buffer) - at >= 2:  # Core's frames are not masked
            opcode, length, start = buffer[at] & 0x0F, buffer[at + 1] & 0x7F, at + 2
            if length == 126:
                if len(buffer) - at < 4:
                    break
                length, start = int.from_bytes(buffer[at + 2:at + 4]), at + 4
            elif length == 127:
                if len(buffer) - at < 10:
                    break
                length, start = int.from_bytes(buffer[at + 2:at + 10]), at + 10
            if len(buffer) < start + length:
                break
            self._frame(opcode, buffer[start:start + length])
            at = start + length
        self._buffer = buffer[at:]

    def _frame(self, opcode: int, payload: bytes) -> None:
        if opcode == 1:
            if payload.startswith(REQUEST_HEAD):
                request = json.loads(payload)
                self.answered += 1
                self._send(1, json.dumps({
                    "type": "tool.result", "toolRequestId": request["toolRequestId"],
                    "result": {"echo": request["args"]}, "handledBy": "named"}).encode())
            elif not self._welcome.done():
                self._welcome.set_result(payload.decode())
        elif opcode == 10 and self._pong is not None and not self._pong.done():
            self._pong.set_result(None)
        elif opcode == 9:
            self._send(10, payload)

    def _send(self, opcode: int, payload: bytes) -> None:
        """One masked frame from the client (every frame here is short: under 64 KiB)."""
        mask = os.urandom(4)
        length = len(payload)
        head = (bytes((0x80 | opcode, 0x80 | length)) if length < 126
                else bytes((0x80 | opcode, 0x80 | 126)) + length.to_bytes(2))
        assert self.transport is not None
        self.transport.write(head + mask + apply_mask(payload, mask))

    def connection_lost(self, exc: Exception | None) -> None:
        for waiter in (self._opened, self._welcome, self._pong):
            if waiter is not None and not waiter.done():
                waiter.set_exception(ConnectionError("the page's connection is lost"))

    async def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class Target:
    """One Core process, its page and its HTTP connection: the variants measured on it."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.page = Page()
        self.http = RawHTTP(port)

    async def open(self) -> dict[str, tuple[Variant, int]]:
        """The variants, each with its share of a round's calls (a turn is 1 or 8)."""
        page, http = self.page, self.http
        await page.open(self.port)
        sid = page.session_id
        call_body = json.dumps({"tool": "update_counter", "args": {"delta": 2}}).encode()
        line = '/call update_counter {"delta": 2}'
        turn_bodies = {n: json.dumps({"text": "\n".join([line] * n)}).encode()
                       for n in (1, STEPS)}

        async def health() -> None:
            await http.request("GET", "/pedelec/v1/health")

        async def ping() -> None:
            await page.ping()

        async def call() -> None:
            answer = json.loads(await http.request(
                "POST", f"/pedelec/v1/sessions/{sid}/tool-calls", call_body))
            assert answer["result"] == {"echo": {"delta": 2}}, answer

        def turn(n: int) -> Variant:
            async def run() -> None:
                answer = json.loads(await http.request(
                    "POST", f"/pedelec/v1/sessions/{sid}/turns", turn_bodies[n]))
                assert answer["status"] == "completed" and len(answer["toolCalls"]) == n, answer
            return run

        return {"health": (health, 1), "ping": (ping, 1), "call": (call, 1),
                "turn 1": (turn(1), 4), f"turn {STEPS}": (turn(STEPS), 4)}

    async def close(self) -> None:
        self.http.close()
        await self.page.close()


def rotated(variants: dict[str, dict[str, tuple[Variant, int]]], round_: int
            ) -> list[tuple[str, dict[str, tuple[Variant, int]]]]:
    """Each server's variants, the first of them a different server each round: the one
    measured first in a round costs more (client and server alike), whichever it is."""
    labels = list(variants.items())
    start = round_ % len(labels)
    return labels[start:] + labels[:start]


def per_step(turn_1: float, turn_n: float) -> float:
    """An agent's step, from a turn of 1 ``/call`` line and one of :data:`STEPS`."""
    return (turn_n - turn_1) / (STEPS - 1)


def report(label: str, p50: dict[str, float]) -> tuple[float, float]:
    """Print one Core's medians and the two goals' ratios; return those ratios."""
    floor = p50["health"] + p50["ping"]
    step = per_step(p50["turn 1"], p50[f"turn {STEPS}"])
    print(f"{label}: p50 of each")
    for name, value in p50.items():
        print(f"  {name:8s} {value * 1e6:8.1f} us")
    print(f"  step     {step * 1e6:8.1f} us   (turn {STEPS} - turn 1) / {STEPS - 1}")
    call_ratio, step_ratio = p50["call"] / floor, step / p50["ping"]
    print(f"  control-API call / (health + ping) = {call_ratio:.2f}x   (goal <= 1.3x)")
    print(f"  agent step / ping                  = {step_ratio:.2f}x   (goal <= 1.5x)")
    return call_ratio, step_ratio


def cpu_seconds(pid: int) -> float:
    """The CPU time (user and system) process ``pid`` and its children (Granian's worker)
    have used, as the kernel counts it."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    children = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children += (task / "children").read_text().split()
    return ((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            + sum(cpu_seconds(int(child)) for child in children))


async def cpu_per_operation(variants: dict[str, dict[str, tuple[Variant, int]]],
                            pids: dict[str, int], rounds: int = 3, operations: int = 3000
                            ) -> None:
    """Print each Core's CPU and this process's (the client and the page) per operation
    of each variant: the median of ``rounds`` runs of ``operations`` (a turn: a quarter),
    the Cores interleaved round by round."""
    spent: dict[tuple[str, str], list[tuple[float, float]]] = {
        (label, name): [] for label, named in variants.items() for name in named}
    for round_ in range(rounds):
        for label, named in rotated(variants, round_):
            for name, (fn, share) in named.items():
                count = operations // share
                core, driver = cpu_seconds(pids[label]), time.process_time()
                for _ in range(count):
                    await fn()
                spent[label, name].append(((cpu_seconds(pids[label]) - core) / count,
                                           (time.process_time() - driver) / count))
    for label, named in variants.items():
        print(f"{label}: CPU per operation (median of {rounds} runs of {operations})")
        medians = {name: (statistics.median(c for c, _ in spent[label, name]),
                          statistics.median(d for _, d in spent[label, name]))
                   for name in named}
        for name, (core, driver) in medians.items():
            print(f"  {name:8s} Core {core * 1e6:6.0f} us   client and page {driver * 1e6:6.0f} us")
        (core_1, driver_1), (core_n, driver_n) = medians["turn 1"], medians[f"turn {STEPS}"]
        core_step, driver_step = per_step(core_1, core_n), per_step(driver_1, driver_n)
        print(f"  step     Core {core_step * 1e6:6.0f} us   client and page "
              f"{driver_step * 1e6:6.0f} us")


async def main(rounds: int, calls: int, before: str | None, cpu: bool,
               granian: bool) -> None:
    options = ("--rate-limit", "1000000", "--rate-burst", "1000000")
    with contextlib.ExitStack() as stack:
        processes = {"this tree": stack.enter_context(core_process(TOKEN, *options))}
        if before is not None:
            processes[f"before ({before})"] = stack.enter_context(
                core_process(TOKEN, *options, source=before))
        here = Path(__file__).resolve().parent
        processes[BARE] = stack.enter_context(server_process(
            [sys.executable, str(here / "bare_core.py")]))
        if granian:  # (its worker imports bare_core: this directory on its path)
            processes[GRANIAN] = stack.enter_context(server_process(
                [sys.executable, str(here / "bare_granian.py")], env=dict(
                    os.environ, PYTHONPATH=os.pathsep.join([str(here), *sys.path]))))
        targets = {label: Target(port) for label, (_, port) in processes.items()}
        variants = {label: await target.open() for label, target in targets.items()}
        samples: dict[tuple[str, str], list[float]] = {
            (label, name): [] for label, named in variants.items() for name in named}
        for named in variants.values():  # warm up
            for fn, _ in named.values():
                for _ in range(50):
                    await fn()
        loads = [os.getloadavg()]
        for round_ in range(rounds):
            for label, named in rotated(variants, round_):
                for name, (fn, share) in named.items():
                    for _ in range(max(1, calls // share)):
                        started = time.perf_counter()
                        await fn()
                        samples[label, name].append(time.perf_counter() - started)
            loads.append(os.getloadavg())
        if cpu:
            await cpu_per_operation(variants, {label: process.pid
                                               for label, (process, _) in processes.items()})
            loads.append(os.getloadavg())
        for target in targets.values():
            await target.close()

    print(f"{rounds} rounds of {calls} calls per variant (a turn: a quarter of that), "
          "variants and Cores interleaved")
    medians = {label: {name: statistics.median(samples[label, name]) for name in named}
               for label, named in variants.items()}
    ratios = {label: report(label, p50) for label, p50 in medians.items()}
    if before is not None:
        now_call, now_step = ratios["this tree"]
        then_call, then_step = ratios[f"before ({before})"]
        print(f"this tree / before: call ratio {now_call / then_call:.2f}, "
              f"step ratio {now_step / then_step:.2f}")
    core, bare = medians["this tree"], medians[BARE]
    steps = [per_step(p50["turn 1"], p50[f"turn {STEPS}"]) for p50 in (core, bare)]
    print(f"this tree / {BARE}: call {core['call'] / bare['call']:.2f}x, "
          f"step {steps[0] / steps[1]:.2f}x, health {core['health'] / bare['health']:.2f}x, "
          f"ping {core['ping'] / bare['ping']:.2f}x")
    ones = [one for one, _, _ in loads]
    print(f"1-minute load average {min(ones):.2f} to {max(ones):.2f} during the run "
          f"({os.cpu_count()} cores, shared by this process and the Cores)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--before", metavar="DIR",
                        help="also run the Core of this checkout (e.g. a worktree of an "
                        "earlier commit), interleaved with this one's")
    parser.add_argument("--cpu", action="store_true",
                        help="then print each Core's CPU and the client's per operation")
    parser.add_argument("--granian", action="store_true",
                        help="also run the bare app on Granian (bench/bare_granian.py; "
                        "pip install granian first)")
    options = parser.parse_args()
    asyncio.run(main(options.rounds, options.calls, options.before, options.cpu,
                     options.granian))
