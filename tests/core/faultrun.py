"""Issue 13's fault run: 3 Core nodes on one redis-server behind HAProxy, simulated pages,
and callers making control-API tool calls and turns through HAProxy while one node is
SIGKILLed and started again every few seconds (and, optionally, Redis restarted once).

Each page counts its handler runs by the caller's own call id (carried in the args), keeps
a delivery ledger like the page runtime (a request Core re-sends after a reconnect gets its
stored result, it does not run again) and reconnects through HAProxy with its resume token.
Each call carries an Idempotency-Key and is retried with the same key on a retryable
answer, until its deadline. :func:`fault_run` returns the figures and what went wrong.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import random
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import websockets
from clusterkit import Cluster, cluster
from corekit import TOKEN, tool_meta
from storekit import RedisServer

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
class Figures:
    calls: int = 0  # calls made (each with its own key)
    answered: int = 0  # calls that got a final answer
    succeeded: int = 0  # ... whose answer is the handler's result
    retried: int = 0  # retries with the same key
    hung: int = 0  # attempts with no answer in ATTEMPT_TIMEOUT (then retried)
    turns: int = 0
    turns_answered: int = 0
    # (start, seconds) per answered call; calls starting up to KILL_WINDOW after a kill
    latencies: list[tuple[float, float]] = field(default_factory=list)
    kill_times: list[float] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    twice: list[str] = field(default_factory=list)
    wrong_state: list[str] = field(default_factory=list)
    degraded_seen: bool = False
    kills: int = 0
    load: str = ""

    def percentile(self, share: float, after_kill: bool = False) -> float:
        ordered = sorted(seconds for start, seconds in self.latencies
                         if not after_kill or any(0 <= start - kill <= KILL_WINDOW
                                                  for kill in self.kill_times))
        return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else 0.0

    def summary(self) -> str:
        return (f"calls {self.calls} answered {self.answered} succeeded {self.succeeded} "
                f"retried {self.retried} hung {self.hung} turns {self.turns}/{self.turns_answered} "
                f"kills {self.kills} lost {len(self.lost)} twice {len(self.twice)} "
                f"wrong state {len(self.wrong_state)} "
                f"p50 {1000 * self.percentile(0.5):.0f} ms "
                f"p99 {1000 * self.percentile(0.99):.0f} ms, in the {KILL_WINDOW:.0f} s "
                f"after a kill p50 {1000 * self.percentile(0.5, True):.0f} ms "
                f"p99 {1000 * self.percentile(0.99, True):.0f} ms "
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
                figures: Figures) -> tuple[int, Any] | str:
    """POST with ``key`` until a final answer or :data:`CALL_DEADLINE` (then the last
    retryable answer, for the report)."""
    deadline = time.monotonic() + CALL_DEADLINE
    last = "no answer"
    for attempt in itertools.count():
        if attempt:
            figures.retried += 1
            await asyncio.sleep(RETRY_PAUSE)
        if time.monotonic() > deadline:
            return last
        try:
            response = await http.post(path, json=body, headers={"Idempotency-Key": key},
                                       timeout=ATTEMPT_TIMEOUT)
        except httpx.HTTPError as exc:
            figures.hung += isinstance(exc, httpx.ReadTimeout)
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


async def _caller(http: httpx.AsyncClient, page: FaultPage, stop: float, sent: dict[str, int],
                  figures: Figures, rng: random.Random) -> None:
    """Tool calls on one page, one after another, until ``stop``."""
    while time.monotonic() < stop:
        call = uuid.uuid4().hex
        delta = rng.randint(1, 9)
        figures.calls += 1
        started = time.monotonic()
        answer = await _post(http, f"/pedelec/v1/sessions/{page.session_id}/tool-calls",
                             {"tool": "update_counter", "args": {"delta": delta, "call": call}},
                             call, figures)
        if isinstance(answer, str):
            figures.lost.append(f"{page.session_id} call {call}: {answer}")
            continue
        figures.answered += 1
        figures.latencies.append((started, time.monotonic() - started))
        status, body = answer
        result = body.get("result") if isinstance(body, dict) else None
        if status == 200 and isinstance(result, dict) and "value" in result:
            figures.succeeded += 1
            sent[call] = delta
        else:
            figures.lost.append(f"{page.session_id} call {call}: {status} {str(body)[:200]}")


async def _turner(http: httpx.AsyncClient, page: FaultPage, stop: float, keys: list[str],
                  figures: Figures) -> None:
    """Turns on one page (three tool calls each), one after another, until ``stop``."""
    while time.monotonic() < stop:
        key = uuid.uuid4().hex
        figures.turns += 1
        keys.append(key)
        answer = await _post(http, f"/pedelec/v1/sessions/{page.session_id}/turns",
                             {"text": "go"}, key, figures)
        if isinstance(answer, str):
            figures.lost.append(f"{page.session_id} turn {key}: {answer}")
        else:
            figures.turns_answered += 1
        await asyncio.sleep(0.5)


async def _killer(made: Cluster, stop: float, every: float, figures: Figures) -> None:
    for node in itertools.cycle(made.nodes):
        await asyncio.sleep(every)
        if time.monotonic() >= stop:
            return
        figures.kill_times.append(time.monotonic())
        await node.kill()
        figures.kills += 1
        await node.start()


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


async def fault_run(server: RedisServer, workdir: Path, *, pages: int, seconds: float,
                    kill_every: float, restart_redis: bool = False) -> Figures:
    """The whole run; every process it started is stopped when it returns or raises."""
    figures = Figures()
    rng = random.Random(13)
    async with cluster(server.url, 3, workdir) as made:
        opened = [FaultPage(made.ws_url) for _ in range(pages)]
        try:
            await asyncio.gather(*(page.open() for page in opened))
            stop = time.monotonic() + seconds
            sent: list[dict[str, int]] = [{} for _ in opened]
            turn_keys: list[list[str]] = [[] for _ in opened]
            # HAProxy's keep-alive connections may die with a node: a fresh pool per caller
            clients = [httpx.AsyncClient(base_url=str(made.http.base_url),
                                         headers={"Authorization": f"Bearer {TOKEN}"})
                       for _ in opened]
            try:
                work = [
                    *(_caller(clients[i], page, stop, sent[i], figures, rng)
                      for i, page in enumerate(opened)),
                    *(_turner(clients[i], page, stop, turn_keys[i], figures)
                      for i, page in enumerate(opened[:max(1, pages // 4)])),
                    _killer(made, stop, kill_every, figures),
                ]
                if restart_redis:
                    work.append(_redis_restart(server, made, seconds / 2, 3.0, figures))
                await asyncio.wait_for(asyncio.gather(*work), seconds + 3 * CALL_DEADLINE)
            finally:
                for client in clients:
                    await client.aclose()
            figures.load = " ".join(f"{x:.2f}" for x in os.getloadavg())
            for i, page in enumerate(opened):
                figures.twice += [f"{page.session_id} call {call} ran {count}x"
                                  for call, count in page.runs.items() if count > 1]
                figures.twice += [f"{page.session_id} call {call} ran, never answered"
                                  for call in page.runs if call not in sent[i]]
                if page.turn_runs > 3 * len(turn_keys[i]):
                    figures.twice.append(f"{page.session_id}: {page.turn_runs} turn tool "
                                         f"runs for {len(turn_keys[i])} turns")
                if page.counter != sum(sent[i].values()):
                    figures.wrong_state.append(
                        f"{page.session_id}: counter {page.counter}, "
                        f"sum of answered deltas {sum(sent[i].values())}")
        finally:
            for page in opened:
                await page.close()
    stopped = [node.process is None or node.process.poll() is not None for node in made.nodes]
    assert all(stopped), f"a Core node still runs after the run: {stopped}"
    return figures
