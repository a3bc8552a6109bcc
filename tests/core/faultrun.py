"""Issue 13's fault run: 3 Core nodes on one redis-server behind HAProxy, simulated pages
and real Chromium demo pages, and callers making control-API tool calls, MCP tool calls
(the official SDK's client) and turns through HAProxy while one node is SIGKILLed and
started again every few seconds (and, optionally, Redis restarted once).

Each simulated page counts its handler runs by the caller's own call id (carried in the
args), keeps a delivery ledger like the page runtime (a request Core re-sends after a
reconnect gets its stored result, it does not run again) and reconnects through HAProxy
with its resume token. A Chromium page is the demo itself (``fault_browsers.mjs``), whose
``update_counter`` takes nothing but ``delta``: there each call's delta is unique in the
run and is its call id, and the demo's log of tool calls (a row per handler run, with its
args) tells the runs apart.

What "lost" and "run twice" mean:

- A control-API call carries an ``Idempotency-Key`` and is retried with that key on a
  connection error, a retryable answer or no answer in :data:`ATTEMPT_TIMEOUT`, until
  :data:`CALL_DEADLINE`. It is lost if it got no final answer by then, or if its handler
  ran but its answer was not the handler's result.
- An MCP ``tools/call`` has no idempotency key a client can send: Core gives each call a
  key of its own, so while the node the client reached lives, the call is routed again
  when the page's node dies and its handler runs once. If the client's node dies (or
  its MCP session, then 404) before the answer, the answer is gone with it: the client
  cannot ask for it again. So a retry of an MCP call is a new call (a new call id; on
  a simulated page the same delta). A call without an answer that was in flight while a
  node was killed is *cut*: its handler may have run (at most once; counted as
  ``cut_ran``) and the page's state must then include it. Any other call without its
  result (refused: 404, 503; an error result) must not have run; one that ran is lost.
  The operation (the delta the caller wants added) is lost if no call of it was answered
  within :data:`CALL_DEADLINE`.
- Run twice: a call id whose handler ran more than once, for either kind of call.

A page's state must equal the sum of the deltas of the calls that ran on it, every
answered call must have run exactly once, and no call may have run that was not made.
:func:`fault_run` returns the figures and what went wrong.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import random
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import httpx2
import websockets
from clusterkit import Cluster, Node, cluster
from corekit import TOKEN, tool_meta
from mcp import Client, ClientSession, types
from mcp.client.streamable_http import streamable_http_client
from storekit import RedisServer

HERE = Path(__file__).parent
BROWSERS = HERE / "fault_browsers.mjs"
# the runtime the e2e setup provisions (and this run, if it is missing)
PYODIDE = HERE.parent.parent / ".cache" / "e2e"

COUNTER = {"name": "update_counter", "description": "adds delta to the counter",
           "argsSchema": {"type": "object",
                          "properties": {"delta": {"type": "integer"},
                                         "call": {"type": "string"}},
                          "required": ["delta", "call"]}}
# core_process.py's PlanAgent calls a and b, then c, in every turn
TOOLS = [COUNTER, *(tool_meta(name) for name in "abc")]
# a caller gives up on one call after this long (every retry included): then it is lost
CALL_DEADLINE = 60.0
# one attempt waits this long before it is retried (a result that never comes back)
ATTEMPT_TIMEOUT = 15.0
RETRY_PAUSE = 0.2
# an HTTP status worth retrying with the same Idempotency-Key: HAProxy with no live
# server, or a node without its store
RETRY_STATUS = frozenset({502, 503, 504})
# latency "during a kill": calls that started this long after a node was killed
KILL_WINDOW = 2.0
# an MCP call without an answer counts as cut by a kill if one happened between this long
# before it was sent and its failure (HAProxy's health check notices a dead node in ~1 s)
CUT_SLACK = 0.1
# how long the Chromium pages may take to start (their Pyodide start-ups at once)
BROWSERS_READY = 240.0
# the two MCP protocols of the SDK's clients: the initialize handshake (an MCP session,
# sticky to its node in HAProxy) and the per-request protocol (any node, each request)
ERAS = ("handshake", "2026-07-28")
# the kinds of calls, counted apart
KINDS = ("control", "mcp", "chromium control", "chromium mcp")


class Target:
    """One page, as its callers see it: the calls made to it, by call id, with their delta,
    by what came of them."""

    def __init__(self, session_id: str, chromium: bool, deltas: itertools.count[int]) -> None:
        self.session_id = session_id
        self.chromium = chromium
        self._deltas = deltas
        self.answered: dict[str, int] = {}
        self.cut: dict[str, int] = {}  # MCP calls in flight while a node was killed
        self.refused: dict[str, int] = {}  # other calls without their result

    def new_call(self, rng: random.Random, delta: int | None = None
                 ) -> tuple[str, int, dict[str, Any]]:
        """A call id, its delta and the args. On the demo the delta is the call id: the
        run's next integer (a retry of an MCP call gets the next one)."""
        if self.chromium:
            delta = next(self._deltas)
            return str(delta), delta, {"delta": delta}
        call = uuid.uuid4().hex
        delta = rng.randint(1, 9) if delta is None else delta
        return call, delta, {"delta": delta, "call": call}

    def check(self, runs: dict[str, int], counter: int, figures: Figures) -> None:
        """The page's handler runs (by call id) and its counter against what was sent."""
        made = {**self.answered, **self.cut, **self.refused}
        where = f"{'chromium ' if self.chromium else ''}{self.session_id}"
        figures.twice += [f"{where} call {call} ran {count}x"
                          for call, count in runs.items() if count > 1]
        figures.wrong_state += [f"{where} call {call} ran, never made"
                                for call in runs if call not in made]
        figures.wrong_state += [f"{where} call {call} answered, never ran"
                                for call in self.answered if call not in runs]
        figures.lost += [f"{where} call {call} ran, its result never came back"
                         for call in self.refused if call in runs]
        figures.cut_ran += sum(call in runs for call in self.cut)
        expected = sum(made[call] for call in runs if call in made)
        if counter != expected:
            figures.wrong_state.append(f"{where}: counter {counter}, sum of the deltas "
                                       f"of the calls that ran {expected}")


class FaultPage:
    """A simulated page that reconnects through HAProxy and resumes until closed."""

    def __init__(self, ws_url: str) -> None:
        self.ws_url = ws_url
        self.session_id = ""
        self.token = ""
        self.counter = 0
        self.runs: dict[str, int] = {}  # call id (from the args) -> handler runs
        self.turn_runs = 0
        self.ledger: dict[str, Any] = {}  # toolRequestId -> result, as the runtime keeps
        self.reconnects = 0
        self.task: asyncio.Task[None] | None = None
        self.closing = False

    async def open(self) -> None:
        ws = await self._hello()
        self.task = asyncio.create_task(self._serve(ws))

    async def _hello(self) -> Any:
        ws = await websockets.connect(self.ws_url, open_timeout=10)
        resume = ({"sessionId": self.session_id, "resumeToken": self.token}
                  if self.session_id else {})
        await ws.send(json.dumps({"type": "hello", "protocol": 1, "tools": TOOLS, **resume}))
        welcome = json.loads(await asyncio.wait_for(ws.recv(), 10))
        if welcome.get("type") != "welcome":
            await ws.close()
            raise ConnectionError(f"no welcome: {welcome}")
        if self.session_id and welcome["sessionId"] != self.session_id:
            raise AssertionError(f"resume gave a new session: {welcome}")
        self.session_id, self.token = welcome["sessionId"], welcome["resumeToken"]
        return ws

    async def _serve(self, ws: Any) -> None:
        while not self.closing:
            with contextlib.suppress(websockets.ConnectionClosed, OSError):
                async for frame in ws:
                    await self._handle(ws, json.loads(frame))
            if self.closing:
                return
            ws = await self._reconnect()

    async def _reconnect(self) -> Any:
        """Until a live node welcomes the page back (bounded: a page that cannot come back
        fails the run)."""
        for attempt in range(300):
            self.reconnects += 1
            try:
                return await self._hello()
            except (OSError, TimeoutError, websockets.WebSocketException):
                await asyncio.sleep(min(0.1 * (attempt + 1), 1.0))
        raise AssertionError(f"page {self.session_id} could not reconnect")

    async def _handle(self, ws: Any, frame: dict[str, Any]) -> None:
        if frame.get("type") != "tool.request":
            return
        rid = frame["toolRequestId"]
        if rid not in self.ledger:  # a re-sent request that ran already is not run again
            args = frame["args"]
            if frame["tool"] == "update_counter":
                self.runs[args["call"]] = self.runs.get(args["call"], 0) + 1
                self.counter += args["delta"]
                self.ledger[rid] = {"value": self.counter}
            else:
                self.turn_runs += 1
                self.ledger[rid] = {"ok": True, "data": args}
        await ws.send(json.dumps({"type": "tool.result", "toolRequestId": rid,
                                  "result": self.ledger[rid], "handledBy": "named"}))

    async def close(self) -> None:
        self.closing = True
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(self.task, 10)


@dataclass
class Counts:
    calls: int = 0  # calls made (a control-API call: one key; an MCP call: one call id)
    answered: int = 0  # calls answered with the handler's result
    # control API: attempts again with the same key; MCP: calls made again as new calls
    retried: int = 0
    hung: int = 0  # attempts with no answer in ATTEMPT_TIMEOUT (then retried)
    cut: int = 0  # MCP calls without an answer, in flight while a node was killed
    # (start, seconds) per answered call
    latencies: list[tuple[float, float]] = field(default_factory=list)


@dataclass
class Figures:
    counts: dict[str, Counts] = field(default_factory=lambda: {k: Counts() for k in KINDS})
    turns: int = 0
    turns_answered: int = 0
    cut_ran: int = 0  # cut MCP calls whose handler had run (their result lost with the node)
    kill_times: list[float] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    twice: list[str] = field(default_factory=list)
    wrong_state: list[str] = field(default_factory=list)
    degraded_seen: bool = False
    kills: int = 0
    chromium_pages: int = 0
    chromium_cut: int = 0  # Chromium pages whose socket's node was killed (once per kill)
    load: str = ""
    # each MCP call and each retried control-API attempt, a line each (calls.log in the
    # workdir: what the callers saw, next to the nodes' logs)
    trace: list[str] = field(default_factory=list)

    @property
    def answered(self) -> int:
        return sum(counts.answered for counts in self.counts.values())

    def percentile(self, share: float, after_kill: bool = False,
                   kinds: tuple[str, ...] = KINDS) -> float:
        """Of the answered calls' latencies (those starting up to KILL_WINDOW after a kill)."""
        ordered = sorted(seconds for kind in kinds for start, seconds in self.counts[kind].latencies
                         if not after_kill or any(0 <= start - kill <= KILL_WINDOW
                                                  for kill in self.kill_times))
        return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else 0.0

    def _ms(self, after_kill: bool = False, kinds: tuple[str, ...] = KINDS) -> str:
        """p50/p99 in ms."""
        return "/".join(f"{1000 * self.percentile(share, after_kill, kinds):.0f}"
                        for share in (0.5, 0.99))

    def summary(self) -> str:
        kinds = "; ".join(
            f"{kind}: calls {c.calls} answered {c.answered} retried {c.retried} "
            f"hung {c.hung} cut {c.cut} p50/p99 {self._ms(kinds=(kind,))} ms"
            for kind, c in self.counts.items())
        return (f"{kinds}; cut MCP calls that had run {self.cut_ran}; "
                f"turns {self.turns}/{self.turns_answered} chromium pages "
                f"{self.chromium_pages} (their node killed {self.chromium_cut}x) "
                f"kills {self.kills} lost {len(self.lost)} twice "
                f"{len(self.twice)} wrong state {len(self.wrong_state)} "
                f"p50/p99 {self._ms()} ms, in the {KILL_WINDOW:.0f} s after a kill "
                f"{self._ms(True)} ms; "
                f"degraded seen {self.degraded_seen} load {self.load}")


def _retryable(status: int, answer: Any) -> bool:
    if status in RETRY_STATUS:
        return True
    error = answer.get("error") if isinstance(answer, dict) else None
    if isinstance(error, dict):
        return bool(error.get("retryable"))
    result = answer.get("result") if isinstance(answer, dict) else None
    if isinstance(result, dict) and isinstance(result.get("error"), dict):
        return bool(result["error"].get("retryable"))
    return False


async def _post(http: httpx.AsyncClient, path: str, body: dict[str, Any], key: str,
                counts: Counts, trace: list[str]) -> tuple[int, Any] | str:
    """POST with ``key`` until a final answer or :data:`CALL_DEADLINE` (then the last
    retryable answer, for the report); each attempt's outcome in ``trace``."""
    deadline = time.monotonic() + CALL_DEADLINE
    last = "no answer"
    for attempt in itertools.count():
        if attempt:
            counts.retried += 1
            trace.append(f"{time.time():.3f} {path} key {key}: {last[:120]}")
            await asyncio.sleep(RETRY_PAUSE)
        if time.monotonic() > deadline:
            return last
        try:
            response = await http.post(path, json=body, headers={"Idempotency-Key": key},
                                       timeout=ATTEMPT_TIMEOUT)
        except httpx.HTTPError as exc:
            counts.hung += isinstance(exc, httpx.ReadTimeout)
            last = f"{type(exc).__name__}: {exc}"
            continue
        try:
            answer = response.json()
        except ValueError:
            answer = response.text
        if not _retryable(response.status_code, answer):
            return response.status_code, answer
        last = f"{response.status_code} {str(answer)[:300]}"
    raise AssertionError("unreachable")


async def _caller(http: httpx.AsyncClient, target: Target, stop: float, figures: Figures,
                  counts: Counts, rng: random.Random) -> None:
    """Control-API tool calls on one page, one after another, until ``stop``."""
    while time.monotonic() < stop:
        call, delta, args = target.new_call(rng)
        counts.calls += 1
        started = time.monotonic()
        answer = await _post(http, f"/pedelec/v1/sessions/{target.session_id}/tool-calls",
                             {"tool": "update_counter", "args": args}, uuid.uuid4().hex,
                             counts, figures.trace)
        if isinstance(answer, str):
            target.refused[call] = delta
            figures.lost.append(f"{target.session_id} call {call}: {answer}")
            continue
        status, body = answer
        result = body.get("result") if isinstance(body, dict) else None
        if status == 200 and isinstance(result, dict) and isinstance(result.get("value"), int):
            counts.answered += 1
            counts.latencies.append((started, time.monotonic() - started))
            target.answered[call] = delta
        else:
            target.refused[call] = delta
            figures.lost.append(f"{target.session_id} call {call}: {status} {str(body)[:200]}")


@contextlib.asynccontextmanager
async def _mcp_client(era: str, url: str) -> AsyncIterator[ClientSession | Client]:
    """The official SDK's client of ``era``'s protocol, its waits bounded."""
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"},
                              timeout=httpx2.Timeout(ATTEMPT_TIMEOUT))
    async with http:
        if era == "handshake":
            async with streamable_http_client(url, http_client=http) as (read, write), \
                    ClientSession(read, write, read_timeout_seconds=ATTEMPT_TIMEOUT) as session:
                await asyncio.wait_for(session.initialize(), ATTEMPT_TIMEOUT)
                yield session
        else:
            async with Client(streamable_http_client(url, http_client=http),
                              read_timeout_seconds=ATTEMPT_TIMEOUT) as client:
                yield client


def _value(result: types.CallToolResult) -> int | None:
    content = result.structured_content
    value = content.get("value") if isinstance(content, dict) and not result.is_error else None
    return value if isinstance(value, int) else None


async def _mcp_caller(url: str, era: str, target: Target, stop: float, figures: Figures,
                      counts: Counts, rng: random.Random) -> None:
    """MCP tool calls on one page, one after another, until ``stop``. A call without its
    result is made again as a new call (the same delta); the client is opened again (a
    new MCP session) after a transport error or a 404."""
    failing_since: float | None = None  # the first call of the operation being retried
    delta: int | None = None  # ... and its delta
    last = "no answer"

    def unanswered(call: str, call_delta: int, started: float, hung: bool) -> None:
        nonlocal failing_since, delta
        counts.retried += 1
        counts.hung += hung
        now = time.monotonic()
        if any(started - CUT_SLACK <= kill <= now for kill in figures.kill_times):
            counts.cut += 1
            target.cut[call] = call_delta
        else:
            target.refused[call] = call_delta
        if failing_since is None:
            failing_since, delta = started, call_delta

    while failing_since is not None or time.monotonic() < stop:
        sent: tuple[str, int, float] | None = None
        try:
            async with _mcp_client(era, url) as client:
                while failing_since is not None or time.monotonic() < stop:
                    if failing_since is not None and (
                            time.monotonic() - failing_since > CALL_DEADLINE):
                        figures.lost.append(f"{target.session_id} MCP ({era}): no call of "
                                            f"delta {delta} answered in {CALL_DEADLINE:g} s: "
                                            f"{last}")
                        failing_since = delta = None
                        continue
                    call, call_delta, args = target.new_call(rng, delta)
                    counts.calls += 1
                    sent = (call, call_delta, time.monotonic())
                    figures.trace.append(f"{time.time():.3f} {era} {target.session_id} "
                                         f"{call} sent")
                    result = await asyncio.wait_for(client.call_tool("update_counter", args),
                                                    ATTEMPT_TIMEOUT)
                    figures.trace.append(f"{time.time():.3f} {era} {target.session_id} "
                                         f"{call} got {str(result.structured_content)[:80]}")
                    if _value(result) is None:  # an error result: no node answered, ...
                        last = f"error result {str(result.content)[:300]}"
                        unanswered(*sent, hung=False)
                        sent = None
                        await asyncio.sleep(RETRY_PAUSE)
                        continue
                    counts.answered += 1
                    counts.latencies.append((sent[2], time.monotonic() - sent[2]))
                    target.answered[call] = call_delta
                    sent = None
                    failing_since = delta = None
        except Exception as exc:  # the client's node died, 404, 503, no answer in time
            last = f"{type(exc).__name__}: {str(exc)[:300]}"
            figures.trace.append(f"{time.time():.3f} {era} {target.session_id} "
                                 f"{sent and sent[0]} failed {last[:120]}")
            if sent is not None:
                unanswered(*sent, hung=isinstance(exc, TimeoutError))
            await asyncio.sleep(RETRY_PAUSE)


class Browsers:
    """``fault_browsers.mjs``: real Chromium demo pages, through HAProxy."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    @classmethod
    @contextlib.asynccontextmanager
    async def opened(cls, url: str, count: int, log: Path) -> AsyncIterator[
            tuple[Browsers, list[str]]]:
        """``count`` pages ready, and their session ids; the browser closed at the end."""
        with open(log, "wb") as errors:
            process = await asyncio.create_subprocess_exec(
                "node", str(BROWSERS), url, str(count), stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=errors, limit=1 << 26)
        browsers = cls(process)
        try:
            ready = await browsers._line(BROWSERS_READY)
            assert "ready" in ready, f"the Chromium pages did not start: {ready}"
            yield browsers, ready["ready"]
        finally:
            await browsers._close()

    async def _line(self, timeout: float) -> Any:
        assert self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), timeout)
        assert line, "fault_browsers.mjs ended"
        return json.loads(line)

    async def state(self) -> dict[str, Any]:
        """Each page's session, state, counter and update_counter runs, as its DOM says."""
        assert self.process.stdin is not None
        self.process.stdin.write(b"state\n")
        await self.process.stdin.drain()
        answer: dict[str, Any] = await self._line(60)
        return answer

    async def _close(self) -> None:
        if self.process.returncode is None:
            with contextlib.suppress(OSError):
                assert self.process.stdin is not None
                self.process.stdin.write(b"close\n")
                await self.process.stdin.drain()
            try:
                await asyncio.wait_for(self.process.wait(), 30)
            except TimeoutError:
                self.process.kill()
                await asyncio.wait_for(self.process.wait(), 30)


async def _browser_check(browsers: Browsers, targets: list[Target], figures: Figures) -> None:
    """Once every page is idle again (bounded): each page's DOM against what was sent."""
    deadline = time.monotonic() + 30
    while True:
        seen = await browsers.state()
        if all(page["state"] == "idle" for page in seen["pages"]):
            break
        if time.monotonic() > deadline:
            figures.wrong_state.append(f"chromium pages not idle: "
                                       f"{[page['state'] for page in seen['pages']]}")
            break
        await asyncio.sleep(0.5)
    figures.wrong_state += [f"chromium page error: {error}" for error in seen["errors"]]
    for target, page in zip(targets, seen["pages"], strict=True):
        if page["sessionId"] != target.session_id:
            figures.wrong_state.append(f"chromium {target.session_id}: a new session "
                                       f"{page['sessionId']}")
        runs: dict[str, int] = {}
        for delta, _ in page["runs"]:
            runs[str(delta)] = runs.get(str(delta), 0) + 1
        target.check(runs, page["counter"], figures)


async def _turner(http: httpx.AsyncClient, page: FaultPage, stop: float, keys: list[str],
                  figures: Figures) -> None:
    """Turns on one page (three tool calls each), one after another, until ``stop``."""
    counts = Counts()  # a turn's retries are not a tool call's
    while time.monotonic() < stop:
        key = uuid.uuid4().hex
        figures.turns += 1
        keys.append(key)
        answer = await _post(http, f"/pedelec/v1/sessions/{page.session_id}/turns",
                             {"text": "go"}, key, counts, figures.trace)
        if isinstance(answer, str):
            figures.lost.append(f"{page.session_id} turn {key}: {answer}")
        else:
            figures.turns_answered += 1
        await asyncio.sleep(0.5)


async def _sockets_on(made: Cluster, node: Node, sessions: set[str]) -> int:
    """How many of ``sessions`` have their page's socket on ``node`` (0 if it cannot say)."""
    if not sessions:
        return 0
    try:
        response = await made.http.get(f"http://127.0.0.1:{node.port}/pedelec/v1/sessions",
                                       params={"connected": "true"}, timeout=2)
        listed = {info["sessionId"] for info in response.json()["sessions"]}
    except (httpx.HTTPError, ValueError, KeyError):
        return 0
    return len(listed & sessions)


async def _killer(made: Cluster, stop: float, every: float, figures: Figures,
                  chromium: set[str]) -> None:
    """Every ``every`` seconds the next node, in turn; until one holding a Chromium
    page's socket was killed, one that holds one now (so that even a short run kills one
    under a real page, wherever its page reconnected). Each is started again in the
    background: a node slow to start (waiting for Redis) delays no later kill, only its
    own next one."""
    nodes = list(made.nodes)
    starting: dict[int, asyncio.Task[None]] = {}  # by node port
    started = time.monotonic()
    try:
        for count, node in enumerate(itertools.cycle(nodes), 1):
            await asyncio.sleep(max(0.0, started + count * every - time.monotonic()))
            if time.monotonic() >= stop:
                return
            if chromium and not figures.chromium_cut:
                held = [await _sockets_on(made, each, chromium) for each in nodes]
                if max(held):
                    node = nodes[held.index(max(held))]
            if node.port in starting:
                await starting.pop(node.port)
            figures.chromium_cut += await _sockets_on(made, node, chromium)
            figures.kill_times.append(time.monotonic())
            await node.kill()
            figures.kills += 1
            starting[node.port] = asyncio.ensure_future(node.start())
    finally:
        await asyncio.gather(*starting.values())


async def _redis_restart(server: RedisServer, made: Cluster, at: float, down: float,
                         figures: Figures) -> None:
    """SIGTERM (Redis writes its append-only file out), ``down`` seconds away, start."""
    await asyncio.sleep(at)
    await asyncio.to_thread(server.stop)
    until = time.monotonic() + down
    while time.monotonic() < until:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            response = await made.http.get("/pedelec/v1/health", timeout=2)
            if response.json().get("status") == "degraded":
                figures.degraded_seen = True
        await asyncio.sleep(0.2)
    await asyncio.to_thread(server.start)


def provision() -> Path:
    """The Pyodide runtime the nodes serve the demo pages (cached: a second run is fast)."""
    subprocess.run([sys.executable, "-m", "pedelec_pyodide.build.provision", str(PYODIDE)],
                   check=True, stdout=subprocess.DEVNULL, timeout=900)
    return PYODIDE / "pyodide"


async def fault_run(server: RedisServer, workdir: Path, *, pages: int, seconds: float,
                    kill_every: float, restart_redis: bool = False,
                    chromium: int = 0) -> Figures:
    """The whole run; every process it started is stopped when it returns or raises."""
    figures = Figures(chromium_pages=chromium)
    rng = random.Random(13)
    deltas = itertools.count(1)
    pyodide = await asyncio.to_thread(provision) if chromium else None
    async with cluster(server.url, 3, workdir, pyodide) as made, \
            contextlib.AsyncExitStack() as stack:
        browser_targets: list[Target] = []
        browsers: Browsers | None = None
        if chromium:
            browsers, ids = await stack.enter_async_context(
                Browsers.opened(made.url, chromium, workdir / "browsers.log"))
            browser_targets = [Target(sid, True, deltas) for sid in ids]
        opened = [FaultPage(made.ws_url) for _ in range(pages)]
        try:
            await asyncio.gather(*(page.open() for page in opened))
            targets = [Target(page.session_id, False, deltas) for page in opened]
            stop = time.monotonic() + seconds
            turn_keys: list[list[str]] = [[] for _ in opened]
            # HAProxy's keep-alive connections may die with a node: a fresh pool per caller
            clients = [httpx.AsyncClient(base_url=made.url,
                                         headers={"Authorization": f"Bearer {TOKEN}"})
                       for _ in [*opened, *browser_targets]]

            def mcp_url(target: Target) -> str:
                return f"{made.url}/pedelec/v1/sessions/{target.session_id}/mcp"

            control, mcp, c_control, c_mcp = (figures.counts[kind] for kind in KINDS)
            try:
                work = [
                    *(_caller(clients[i], target, stop, figures, control, rng)
                      for i, target in enumerate(targets)),
                    # MCP callers on every other page, of both protocols in turn
                    *(_mcp_caller(mcp_url(target), ERAS[i % 2], target, stop, figures, mcp,
                                  rng) for i, target in enumerate(targets[::2])),
                    *(_turner(clients[i], page, stop, turn_keys[i], figures)
                      for i, page in enumerate(opened[:max(1, pages // 4)])),
                    *(_caller(clients[pages + i], target, stop, figures, c_control, rng)
                      for i, target in enumerate(browser_targets)),
                    *(_mcp_caller(mcp_url(target), ERAS[i % 2], target, stop, figures,
                                  c_mcp, rng) for i, target in enumerate(browser_targets)),
                    _killer(made, stop, kill_every, figures,
                            {target.session_id for target in browser_targets}),
                ]
                if restart_redis:
                    work.append(_redis_restart(server, made, seconds / 2, 3.0, figures))
                await asyncio.wait_for(asyncio.gather(*work), seconds + 3 * CALL_DEADLINE)
            finally:
                for client in clients:
                    await client.aclose()
            figures.load = " ".join(f"{x:.2f}" for x in os.getloadavg())
            for i, page in enumerate(opened):
                targets[i].check(page.runs, page.counter, figures)
                if page.turn_runs > 3 * len(turn_keys[i]):
                    figures.twice.append(f"{page.session_id}: {page.turn_runs} turn tool "
                                         f"runs for {len(turn_keys[i])} turns")
            if browsers is not None:
                await _browser_check(browsers, browser_targets, figures)
        finally:
            for page in opened:
                await page.close()
            (workdir / "calls.log").write_text("\n".join(figures.trace) + "\n")
    stopped = [node.process is None or node.process.poll() is not None for node in made.nodes]
    assert all(stopped), f"a Core node still runs after the run: {stopped}"
    return figures
