"""Fault injection: turns with parallel tool calls while the network, the page and Core fail.

The set-up, all on 127.0.0.1::

    SimPage (a real pedelec_pyodide.Session, StorageLedger) ──ws──▶ FaultProxy ──ws──▶ Core
                                                                           (subprocess, SQLite)

* **Core** runs in a child process (``fault_core.py``) with the SQLite store and a
  deterministic agent that reads its plan from the turn text: steps of parallel calls.
* **FaultProxy** is a loopback WebSocket proxy: per frame it may *delay* it, *reorder* it
  (hold it back until the next frame of the same direction has gone), or *duplicate* it
  (only the frames the protocol makes idempotent: ``tool.request``, ``tool.result``,
  ``tool.cancel``, ``turn.delta``, ``turn.end``); it can also *drop* a page's connection.
* **SimPage** is a page: a real ``Session`` whose tools are side-effecting ``w`` (run
  counted at its start, never to be run twice) and read-only ``r`` (``readOnlyHint``: may
  run again after an interruption). It reconnects with backoff like the browser bridge.
  A *reload* closes the Session, kills its running handlers (a reloaded tab's code is gone)
  and starts a new Session on the same ledger storage (sessionStorage), resuming by id and
  token with its handlers registered again.
* A scheduler injects, at seeded random moments, drops, reloads and *Core restarts*
  (SIGKILL, then the same port and database).

Invariants, checked for every turn and at the end of the run:

* **0 lost results**: every call of a plan got exactly one result in the agent's reply,
  either the handler's own value or an allowed error code (``TOOL_OUTCOME_UNKNOWN`` for a
  side effect interrupted by a reload, ``TOOL_TIMEOUT``), counted and reported;
* **0 duplicate executions**: ``w`` ran at most once per ``toolRequestId`` *and* per call
  (each call carries a unique key), and a ``w`` result that is a value comes from a run;
* **every turn ends**: ``completed`` (or ``failed`` with an allowed code), within a bound;
  a turn whose page was reloaded is followed on the new page, which re-sends its
  ``turn.start`` after each welcome (as an app keeping the turn in sessionStorage would,
  and as the Session itself does after a resume): Core ignores it while the turn runs,
  answers an ended turn with its ``turn.end`` again, and starts one it never got.

Run the long version: ``.venv/bin/python tests/core/faultkit.py --faults 1000 [--seed N]``.
The seed fixes every random choice (plans, fault kinds, moments, frame faults); the
interleavings still depend on timing, so a run is repeatable in kind, not step by step.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import websockets

from pedelec_pyodide import Session, define_tool
from pedelec_pyodide.ledger import StorageLedger
from pedelec_pyodide.protocol import TurnEnd, Welcome
from pedelec_pyodide.session import TURN_LOST, TurnError

# the unit suite's sessionStorage stand-in (faultkit also runs as a script)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from web_storage import DictStorage

HERE = Path(__file__).resolve().parent
TOKEN = "fault-admin-token"
IDEMPOTENT_FRAMES = {"tool.request", "tool.result", "tool.cancel", "turn.start", "turn.delta",
                     "turn.end"}
ALLOWED_RESULT_ERRORS = {"TOOL_OUTCOME_UNKNOWN", "TOOL_TIMEOUT"}
ALLOWED_TURN_ERRORS = {"TURN_INTERRUPTED"}
TURN_BOUND = 60.0  # seconds: a turn that has not ended by then is a hang


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# --- Core in a child process ---------------------------------------------------------------


class CoreProcess:
    """``fault_core.py`` on a fixed port and database; SIGKILL and restart it."""

    def __init__(self, db: Path, port: int, log: Path, tool_timeout_ms: int) -> None:
        self.db, self.port, self.log_path = db, port, log
        self.tool_timeout_ms = tool_timeout_ms
        self.process: subprocess.Popen[str] | None = None
        self.restarts = 0

    async def start(self) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), *sys.path]))
        with open(self.log_path, "a") as log:
            self.process = subprocess.Popen(
                [sys.executable, str(HERE / "fault_core.py"), str(self.db), str(self.port),
                 str(self.tool_timeout_ms)],
                stdout=subprocess.PIPE, stderr=log, text=True, env=env)
        assert self.process.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(self.process.stdout.readline), 30)
        if not line.startswith("http://127.0.0.1:"):
            raise RuntimeError(f"Core did not start: {line!r}; see {self.log_path}")

    async def kill(self) -> None:
        process = self.process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGKILL)
            await asyncio.to_thread(process.wait, 10)

    async def restart(self) -> None:
        await self.kill()
        self.restarts += 1
        await self.start()

    async def stop(self) -> None:
        process = self.process
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                await asyncio.to_thread(process.wait, 10)
            except subprocess.TimeoutExpired:
                process.kill()
                await asyncio.to_thread(process.wait, 10)
        if process is not None and process.stdout is not None:
            process.stdout.close()


# --- the fault proxy -----------------------------------------------------------------------


@dataclass
class FrameFaults:
    """Per-frame probabilities of the proxy's faults."""

    delay: float = 0.02
    reorder: float = 0.015
    duplicate: float = 0.015
    max_delay: float = 0.03  # seconds


class FaultProxy:
    """A loopback WebSocket proxy that delays, reorders and duplicates frames, and can drop
    a connection. Every fault it applies is counted in ``faults``."""

    def __init__(self, upstream_port: int, rng: random.Random, faults: Counter[str],
                 frame_faults: FrameFaults) -> None:
        self.upstream = f"ws://127.0.0.1:{upstream_port}/pedelec/v1/bridge"
        self.rng = rng
        self.faults = faults
        self.frame_faults = frame_faults
        self.enabled = True
        self.links: dict[int, tuple[Any, Any]] = {}  # page link id -> (down, up)
        self.server: Any = None
        self.port = 0

    async def start(self) -> None:
        self.server = await websockets.serve(self._handle, "127.0.0.1", 0, max_size=None)
        self.port = self.server.sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/pedelec/v1/bridge"

    async def stop(self) -> None:
        self.server.close()
        await asyncio.wait_for(self.server.wait_closed(), 10)

    async def _handle(self, down: Any) -> None:
        link = int(down.request.path.rsplit("=", 1)[1]) if "link=" in down.request.path else -1
        try:
            up = await websockets.connect(self.upstream, open_timeout=2, max_size=None)
        except (OSError, TimeoutError, websockets.InvalidHandshake):
            await down.close()
            return
        self.links[link] = (down, up)
        pumps = [asyncio.create_task(self._pump(down, up)),
                 asyncio.create_task(self._pump(up, down))]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            if self.links.get(link, (None, None))[0] is down:
                del self.links[link]
            await asyncio.gather(up.close(), down.close(), return_exceptions=True)

    async def _pump(self, source: Any, sink: Any) -> None:
        rng, ff = self.rng, self.frame_faults
        held: str | None = None
        with contextlib.suppress(websockets.ConnectionClosed):
            while True:
                try:
                    frame = await asyncio.wait_for(source.recv(), 0.05 if held else None)
                except TimeoutError:  # nothing came after the held frame: let it go
                    assert held is not None
                    await sink.send(held)
                    held = None
                    continue
                kind = json.loads(frame).get("type") if self.enabled else None
                if kind is None or kind in ("hello", "welcome"):
                    await sink.send(frame)
                    continue
                if rng.random() < ff.delay:
                    self.faults["delay"] += 1
                    await asyncio.sleep(rng.uniform(0.001, ff.max_delay))
                if held is None and rng.random() < ff.reorder:
                    self.faults["reorder"] += 1
                    held = frame
                    continue
                await sink.send(frame)
                if kind in IDEMPOTENT_FRAMES and rng.random() < ff.duplicate:
                    self.faults["duplicate"] += 1
                    await sink.send(frame)
                if held is not None:
                    await sink.send(held)
                    held = None

    async def drop(self, link: int) -> bool:
        pair = self.links.get(link)
        if pair is None:
            return False
        await asyncio.gather(*(ws.close() for ws in pair), return_exceptions=True)
        return True


# --- pages ---------------------------------------------------------------------------------


@dataclass
class Stats:
    faults: Counter[str] = field(default_factory=Counter)
    turns: Counter[str] = field(default_factory=Counter)
    results: Counter[str] = field(default_factory=Counter)
    runs_by_id: Counter[tuple[str, str]] = field(default_factory=Counter)
    runs_by_key: Counter[str] = field(default_factory=Counter)
    requests_seen: dict[str, str] = field(default_factory=dict)  # toolRequestId -> turnId
    calls: int = 0
    lost: int = 0
    duplicates: int = 0
    problems: list[str] = field(default_factory=list)

    def problem(self, text: str) -> None:
        self.problems.append(text)


class Incarnation:
    """One load of a page: a Session, its handlers, its connection loop."""

    def __init__(self, page: SimPage) -> None:
        self.page = page
        self.alive = True
        self.dead = asyncio.Event()
        self.session = Session(self._tools(), ledger=StorageLedger(page.storage, "ledger:"))
        self.session.session_id, self.session.resume_token = page.session_id, page.token
        self.session.subscribe(self._event)
        self.ws: Any = None
        self.welcomed = asyncio.Event()
        self.link_task = asyncio.create_task(self._link())

    def _tools(self) -> list[Any]:
        stats, rng = self.page.stats, self.page.rng

        async def body(tool: str, key: str, ctx: Any) -> dict[str, Any]:
            stats.runs_by_id[(tool, ctx.tool_request_id)] += 1
            if tool == "w":
                stats.runs_by_key[key] += 1
            sleep = asyncio.ensure_future(asyncio.sleep(rng.uniform(0.0, 0.04)))
            dead = asyncio.ensure_future(self.dead.wait())
            await asyncio.wait([sleep, dead], return_when=asyncio.FIRST_COMPLETED)
            sleep.cancel()
            dead.cancel()
            if not self.alive:  # the tab was reloaded: this code is gone
                raise asyncio.CancelledError
            return {"tool": tool, "key": key}

        async def w(args: dict[str, Any], ctx: Any) -> dict[str, Any]:
            return await body("w", args["key"], ctx)

        async def r(args: dict[str, Any], ctx: Any) -> dict[str, Any]:
            return await body("r", args["key"], ctx)

        schema = {"type": "object", "properties": {"key": {"type": "string"}},
                  "required": ["key"], "additionalProperties": False}
        return [
            define_tool(name="w", description="a side effect: never twice", args_schema=schema,
                        handler=w),
            define_tool(name="r", description="read-only", args_schema=schema, handler=r,
                        annotations={"readOnlyHint": True}),
        ]

    def _event(self, event: Any) -> None:
        if isinstance(event, Welcome):
            self.page.session_id, self.page.token = event.session_id, event.resume_token
            self.page.welcomes += 1
            self.welcomed.set()
        elif isinstance(event, TurnEnd):
            self.page.turn_ends.setdefault(event.turn_id, event)
            self.page.ended.set()

    def send(self, frame: str) -> None:  # the Session's Transport
        ws = self.ws
        if ws is not None:
            data = json.loads(frame)
            if data["type"] == "turn.start":
                self.page.started_turns.add(data["turnId"])
            task = asyncio.ensure_future(ws.send(frame))
            task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def _link(self) -> None:
        """Connect, serve frames, reconnect with backoff, until the page is reloaded."""
        backoff = 0.02
        while self.alive:
            try:
                ws = await websockets.connect(f"{self.page.proxy_url}?link={self.page.link}",
                                              open_timeout=5, max_size=None)
            except (OSError, TimeoutError, websockets.InvalidHandshake):
                await asyncio.sleep(backoff)
                backoff = min(0.5, backoff * 2)
                continue
            self.ws = ws
            self.welcomed.clear()
            self.session.connection_made(self)
            with contextlib.suppress(websockets.ConnectionClosed):
                async for frame in ws:
                    data = json.loads(frame)
                    if data["type"] == "tool.request":
                        self.page.stats.requests_seen[data["toolRequestId"]] = data["turnId"]
                    elif data["type"] == "welcome":
                        backoff = 0.02
                    elif data["type"] == "error" and data["code"] == "RESUME_REFUSED":
                        self.page.stats.problem(f"page {self.page.link}: resume refused")
                    if not self.alive:
                        break
                    self.session.receive(frame)
            self.ws = None
            if not self.alive:
                with contextlib.suppress(Exception):
                    await ws.close()
                return
            # not welcomed until the next welcome: a turn waits for it (_welcomed), where
            # it would find the page welcomed but not connected, and try again at once,
            # never yielding to the loop that reconnects it
            self.welcomed.clear()
            self.session.connection_lost()
            await asyncio.sleep(backoff)
            backoff = min(0.5, backoff * 2)

    async def unload(self) -> None:
        self.alive = False
        self.dead.set()
        self.session.close()
        if self.ws is not None:
            with contextlib.suppress(Exception):
                await self.ws.close()
        self.link_task.cancel()
        await asyncio.gather(self.link_task, return_exceptions=True)


class SimPage:
    """A page that runs turns one after the other and may be reloaded at any moment."""

    def __init__(self, link: int, proxy_url: str, rng: random.Random, stats: Stats,
                 http: httpx.AsyncClient) -> None:
        self.link, self.proxy_url, self.rng, self.stats, self.http = (
            link, proxy_url, rng, stats, http)
        self.storage = DictStorage()
        self.session_id: str | None = None
        self.token: str | None = None
        self.turn_ends: dict[str, TurnEnd] = {}
        self.started_turns: set[str] = set()
        self.ended = asyncio.Event()
        self.welcomes = 0
        self.current = Incarnation(self)
        self.turn_serial = 0

    async def reload(self) -> None:
        old = self.current
        await old.unload()
        self.current = Incarnation(self)

    def plan(self) -> list[list[list[Any]]]:
        self.turn_serial += 1
        steps = []
        for s in range(self.rng.randint(1, 3)):
            calls = []
            for i in range(self.rng.randint(1, 4)):
                tool = "w" if self.rng.random() < 0.6 else "r"
                calls.append([tool, {"key": f"p{self.link}-t{self.turn_serial}-s{s}-i{i}"}])
            steps.append(calls)
        return steps

    async def run_turns(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            plan = self.plan()
            await self.one_turn(plan)
            await asyncio.sleep(0)  # a turn given up at once must not hold the loop

    async def one_turn(self, plan: list[list[list[Any]]]) -> None:
        stats = self.stats
        inc = await self._welcomed()
        if inc is not self.current or not inc.session.connected:
            return  # reloaded or dropped meanwhile: try a new turn
        text = json.dumps({"plan": plan})
        task = asyncio.ensure_future(inc.session.send_text(text))
        # the turn id: the Session's turn.start frame (sent synchronously by send_text)
        await asyncio.sleep(0)
        turn_ids = [t for t, f in inc.session._turns.items() if not f.done()]
        if not turn_ids:
            task.cancel()
            return
        turn_id = turn_ids[0]
        deadline = time.monotonic() + TURN_BOUND
        end = await self._await_end(task, turn_id, text, deadline)
        if end is None:
            return  # a problem, recorded
        stats.turns[end.status] += 1
        if end.status != "completed":
            code = (end.error or {}).get("code")
            stats.turns[f"failed:{code}"] += 1
            if code not in ALLOWED_TURN_ERRORS:
                stats.problem(f"turn {turn_id} ended {end.status}: {end.error}")
            return
        self.check_reply(plan, end.text, turn_id)

    async def _welcomed(self) -> Incarnation:
        """The page once welcomed; a reload before its welcome (the old page's never
        comes) waits for the new page's."""
        deadline = time.monotonic() + TURN_BOUND
        while True:
            inc = self.current
            if inc.welcomed.is_set():
                return inc
            if time.monotonic() > deadline:
                raise TimeoutError(f"page {self.link} was not welcomed in {TURN_BOUND}s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(inc.welcomed.wait(), 0.1)

    async def _await_end(self, task: asyncio.Future[str], turn_id: str, text: str,
                         deadline: float) -> TurnEnd | None:
        following = False
        asked_at = -1
        while True:
            if turn_id in self.turn_ends:
                task.cancel()
                return self.turn_ends[turn_id]
            if not following and task.done() and not task.cancelled():
                exc = task.exception()
                if exc is None or (isinstance(exc, TurnError) and exc.code != TURN_LOST):
                    # A turn.end is recorded before it settles the future (checked above):
                    # this settled without one (Core refused the turn with an error frame).
                    self.stats.problem(f"turn {turn_id} settled without a turn.end: {exc!r}")
                    return None
                following = True  # reloaded under the turn: follow it on the new page
            inc = self.current
            if following and inc.welcomed.is_set() and self.welcomes != asked_at:
                # the reloaded page asks about its turn, as the Session does on a resume:
                # Core ignores it (running), answers with its turn.end (ended) or starts
                # it (its turn.start was lost with the old page)
                asked_at = self.welcomes
                inc.send(json.dumps({"type": "turn.start", "turnId": turn_id, "text": text}))
            if time.monotonic() > deadline:
                task.cancel()
                self.stats.problem(f"turn {turn_id} did not end within {TURN_BOUND}s (hang)")
                self.stats.turns["hung"] += 1
                return None
            self.ended.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.ended.wait(), 0.1)

    def check_reply(self, plan: list[list[list[Any]]], text: str, turn_id: str) -> None:
        stats = self.stats
        calls = [call for step in plan for call in step]
        stats.calls += len(calls)
        try:
            outcomes = json.loads(text)
        except ValueError:
            stats.problem(f"turn {turn_id}: reply is not JSON: {text[:80]!r}")
            stats.lost += len(calls)
            return
        if len(outcomes) != len(calls):
            stats.lost += abs(len(calls) - len(outcomes))
            stats.problem(f"turn {turn_id}: {len(calls)} calls, {len(outcomes)} results")
        for (tool, args), outcome in zip(calls, outcomes, strict=False):
            result = outcome["result"]
            if isinstance(result, dict) and "error" in result:
                code = result["error"].get("code")
                stats.results[str(code)] += 1
                if code not in ALLOWED_RESULT_ERRORS:
                    stats.problem(f"turn {turn_id}: {tool} {args['key']}: {result}")
                    stats.lost += 1
            elif result == {"tool": tool, "key": args["key"]}:
                stats.results["ok"] += 1
                if stats.runs_by_id[(tool, outcome["id"])] < 1:
                    stats.problem(f"{tool} {args['key']}: a value no handler run produced")
            else:
                stats.problem(f"turn {turn_id}: {tool} {args['key']}: wrong result {result}")
                stats.lost += 1


# --- the run -------------------------------------------------------------------------------


@dataclass
class RunConfig:
    seed: int
    faults: int = 60  # stop injecting once this many faults were injected
    pages: int = 4
    max_seconds: float = 600.0
    weights: dict[str, float] = field(default_factory=lambda: {
        "drop": 0.5, "reload": 0.35, "restart": 0.15})
    gap: tuple[float, float] = (0.05, 0.4)  # seconds between scheduled faults
    frame_faults: FrameFaults = field(default_factory=FrameFaults)
    tool_timeout_ms: int = 20_000


@dataclass
class Report:
    seed: int
    seconds: float
    stats: Stats
    core_restarts: int
    evidence: list[str] = field(default_factory=list)

    @property
    def total_faults(self) -> int:
        return sum(self.stats.faults.values())

    def lines(self) -> list[str]:
        s = self.stats
        duplicates = sum(1 for (tool, _), n in s.runs_by_id.items() if tool == "w" and n > 1)
        duplicates += sum(1 for n in s.runs_by_key.values() if n > 1)
        reruns = sum(n - 1 for (tool, _), n in s.runs_by_id.items() if tool == "r" and n > 1)
        return [
            f"seed {self.seed}; {self.seconds:.1f} s",
            f"faults injected: {self.total_faults} ({dict(sorted(s.faults.items()))})",
            f"turns: {sum(v for k, v in s.turns.items() if ':' not in k)} "
            f"({dict(sorted(s.turns.items()))})",
            f"tool calls (in ended turns): {s.calls}; results: {dict(sorted(s.results.items()))}",
            f"read-only re-runs after a reload: {reruns}",
            f"lost results: {s.lost}; duplicate executions: {duplicates}; "
            f"problems: {len(s.problems)}",
            *[f"  PROBLEM: {p}" for p in s.problems[:20]],
            *[f"  core: {line}" for line in self.evidence[-60:]],
        ]

    @property
    def ok(self) -> bool:
        s = self.stats
        duplicates = sum(1 for (tool, _), n in s.runs_by_id.items() if tool == "w" and n > 1)
        duplicates += sum(1 for n in s.runs_by_key.values() if n > 1)
        return s.lost == 0 and duplicates == 0 and not s.problems


async def run_faults(cfg: RunConfig, workdir: Path,
                     progress: Callable[[str], None] | None = None) -> Report:
    rng = random.Random(cfg.seed)
    stats = Stats()
    core = CoreProcess(workdir / "core.sqlite", free_port(), workdir / "core.log",
                       cfg.tool_timeout_ms)
    proxy = FaultProxy(core.port, random.Random(rng.random()), stats.faults, cfg.frame_faults)
    http = httpx.AsyncClient(base_url=f"http://127.0.0.1:{core.port}", timeout=5,
                             headers={"Authorization": f"Bearer {TOKEN}"})
    pages: list[SimPage] = []
    workers: list[asyncio.Task[None]] = []
    started = time.monotonic()
    try:
        await core.start()
        await proxy.start()
        pages = [SimPage(i, proxy.url, random.Random(rng.random()), stats, http)
                 for i in range(cfg.pages)]
        stop = asyncio.Event()
        workers = [asyncio.create_task(page.run_turns(stop)) for page in pages]
        kinds = list(cfg.weights)
        weights = [cfg.weights[k] for k in kinds]
        # every kind at least once (in a seeded order), so a short run tests them all
        first_round = rng.sample(kinds, len(kinds))
        last_report = 0
        while ((sum(stats.faults.values()) < cfg.faults or first_round)
               and time.monotonic() - started < cfg.max_seconds):
            await asyncio.sleep(rng.uniform(*cfg.gap))
            for worker in workers:
                if worker.done():
                    worker.result()  # a crash of the harness itself: fail loudly
            kind = first_round.pop() if first_round else rng.choices(kinds, weights)[0]
            page = rng.choice(pages)
            if kind == "drop":
                if await proxy.drop(page.link):
                    stats.faults["drop"] += 1
                elif not stats.faults["drop"]:
                    first_round.append("drop")  # no link to drop yet: try again later
                await page.reload()
                stats.faults["reload"] += 1
            else:
                await core.restart()
                stats.faults["restart"] += 1
            total = sum(stats.faults.values())
            if progress is not None and total - last_report >= 100:
                last_report = total
                progress(f"{total} faults, {sum(stats.turns.values())} turn ends, "
                         f"{time.monotonic() - started:.0f} s")
        # quiesce: no more faults; every page finishes the turn it is in
        stop.set()
        proxy.enabled = False
        await asyncio.wait_for(asyncio.gather(*workers), TURN_BOUND + 10)
        stats.duplicates = sum(1 for (t, _), n in stats.runs_by_id.items() if t == "w" and n > 1)
        report = Report(cfg.seed, time.monotonic() - started, stats, core.restarts)
        if stats.problems:  # Core's log lines about the turns in trouble, to explain them
            ids = {word for p in stats.problems for word in p.split() if len(word) == 32}
            for line in core.log_path.read_text().splitlines():
                if any(i in line for i in ids) or "core.started" in line:
                    report.evidence.append(line)
        return report
    finally:
        for worker in workers:
            worker.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        for page in pages:
            await page.current.unload()
        await http.aclose()
        if proxy.server is not None:
            await proxy.stop()
        await core.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description="fault injection over Core and pages")
    parser.add_argument("--faults", type=int, default=1000)
    parser.add_argument("--pages", type=int, default=4)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--max-seconds", type=float, default=1800)
    options = parser.parse_args()
    seed = options.seed if options.seed is not None else random.SystemRandom().randrange(2**32)
    print(f"seed {seed}", flush=True)
    cfg = RunConfig(seed=seed, faults=options.faults, pages=options.pages,
                    max_seconds=options.max_seconds)
    with tempfile.TemporaryDirectory(prefix="pedelec-faults-") as tmp:
        report = asyncio.run(run_faults(cfg, Path(tmp),
                                        lambda line: print(line, flush=True)))
        for line in report.lines():
            print(line)
        if not report.ok:
            log = Path(tmp) / "core.log"
            keep = Path(tempfile.gettempdir()) / f"pedelec-faults-{seed}.log"
            keep.write_text(log.read_text())
            print(f"Core's log kept in {keep}")
    sys.exit(0 if report.ok else 1)


if __name__ == "__main__":
    main()
