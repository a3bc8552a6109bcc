"""Dispatch overhead, measured side by side against the minimal Python path.

Runs in CPython (``python bench/dispatch.py``) and in Pyodide under Node
(``node bench/run-pyodide.mjs bench/dispatch.py``). Each variant is timed in interleaved
rounds in the same process; the printed figure is the ratio of medians, never an
absolute time.

- minimal path: decode the args JSON, call the handler, encode the result JSON
- dispatch: decode the args JSON, ``session.run_request`` (find the handler, check and
  encode the result), take its JSON
- wire: the whole page path, a ``tool.request`` frame in (parsed and checked), a
  ``tool.result`` frame out, recorded in the delivery ledger (no target: for reference)
- with a 3-property schema, the baseline adds one bare call of the same jsonschema validator
- progress: a request (frame in, frame out) whose sync handler does 10,000 steps of a small
  unit of work (a short note's first words as a JSON summary, a few microseconds), each
  followed by
  ``ctx.progress(step, total, message)``, against the same handler without the progress
  calls (the target: <= 1.1x)
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from jsonschema import Draft202012Validator

from pedelec_pyodide import Session, define_tool

SCHEMA = {
    "type": "object",
    "properties": {
        "delta": {"type": "integer"},
        "label": {"type": "string", "maxLength": 20},
        "enabled": {"type": "boolean"},
    },
    "required": ["delta"],
    "additionalProperties": False,
}
ARGS_TEXT = '{"delta": 2, "label": "clicks", "enabled": true}'


def handler(args: dict[str, Any]) -> dict[str, Any]:
    return {"value": args["delta"] + 1}


STEPS = 10_000
NOTES = [f"Note {n}. " + "Some words written down in a note about the day. " * 4
         for n in range(100)]


def summarise(step: int) -> int:
    """One step of the long tool's work: a short note's first words as a JSON summary."""
    words = NOTES[step % 100].split()
    return len(json.dumps({"step": step, "summary": " ".join(words[:12]),
                           "words": len(words)}))


def long_plain(args: dict[str, Any], ctx: Any) -> int:
    total = 0
    for step in range(STEPS):
        total += summarise(step)
    return total


def long_progress(args: dict[str, Any], ctx: Any) -> int:
    total = 0
    for step in range(STEPS):
        total += summarise(step)
        ctx.progress(step + 1, STEPS, "summarising")
    return total


async def time_per_call(step: Callable[[], Awaitable[Any] | Any], calls: int,
                        is_async: bool) -> float:
    start = time.perf_counter()
    if is_async:
        for _ in range(calls):
            await step()  # type: ignore[misc]
    else:
        for _ in range(calls):
            step()
    return (time.perf_counter() - start) / calls


async def compare(name: str, baseline: Callable[[], Any], ours: Callable[[], Any],
                  ours_async: bool, rounds: int, calls: int, target: float | None) -> float:
    for _ in range(2):  # warm-up: caches, lazily built validators
        await time_per_call(baseline, calls // 10, False)
        await time_per_call(ours, calls // 10, ours_async)
    base_times: list[float] = []
    our_times: list[float] = []
    for _ in range(rounds):
        base_times.append(await time_per_call(baseline, calls, False))
        our_times.append(await time_per_call(ours, calls, ours_async))
    ratio = statistics.median(our_times) / statistics.median(base_times)
    if target is None:
        print(f"{name:<34} {ratio:5.2f}x")
    else:
        verdict = "ok" if ratio <= target else "OVER TARGET"
        print(f"{name:<34} {ratio:5.2f}x  (target <= {target}x: {verdict})")
    return ratio


class Sink:
    def __init__(self) -> None:
        self.last = ""

    def send(self, frame: str) -> None:
        self.last = frame


async def main(rounds: int = 15, calls: int = 4000) -> dict[str, float]:
    print(f"dispatch benchmark on {sys.implementation.name} {sys.version.split()[0]} "
          f"({sys.platform}), {rounds} rounds x {calls} calls, ratio of medians")
    plain = Session([define_tool(name="t", description="d", args_schema={"type": "object"},
                                 handler=handler)])
    plain.on_tool("untyped", handler)  # a named handler, no definition: nothing to validate
    validated = Session([define_tool(name="t", description="d", args_schema=SCHEMA,
                                     handler=handler)])
    validator = Draft202012Validator(SCHEMA)

    def minimal() -> str:
        return json.dumps(handler(json.loads(ARGS_TEXT)))

    def minimal_validated() -> str:
        args = json.loads(ARGS_TEXT)
        if not validator.is_valid(args):
            raise AssertionError("the benchmark's args must be valid")
        return json.dumps(handler(args))

    async def dispatch_untyped() -> str:
        return await plain.dispatch("untyped", json.loads(ARGS_TEXT))  # encodes internally

    async def dispatch_validated() -> str:
        return await validated.dispatch("t", json.loads(ARGS_TEXT))

    sink = Sink()
    plain.connection_made(sink)
    counter = iter(range(10**9))
    frame_head = '{"type":"tool.request","turnId":null,"tool":"untyped","args":' + ARGS_TEXT

    def wire() -> str:
        plain.receive(frame_head + ',"toolRequestId":"' + str(next(counter)) + '"}')
        return sink.last

    long = Session()
    long.on_tool("plain", long_plain)
    long.on_tool("progress", long_progress)
    long_sink = Sink()
    long.connection_made(long_sink)
    long_ids = iter(range(10**9))

    def long_request(tool: str) -> Callable[[], str]:
        head = '{"type":"tool.request","turnId":null,"tool":"' + tool + '","args":{}'

        def run() -> str:
            long.receive(head + ',"toolRequestId":"' + str(next(long_ids)) + '"}')
            return long_sink.last

        return run

    assert await dispatch_untyped() == json.loads(minimal())
    assert await dispatch_validated() == json.loads(minimal_validated())
    wire()
    assert json.loads(sink.last)["result"] == {"value": 3}

    return {
        "no_schema": await compare("dispatch, no schema", minimal, dispatch_untyped, True,
                                   rounds, calls, 1.5),
        "schema": await compare("dispatch, 3-property schema", minimal_validated,
                                dispatch_validated, True, rounds, calls, 1.3),
        "wire": await compare("wire: frame in -> frame out", minimal, wire, False,
                              rounds, calls, None),
        "progress": await compare("10,000 steps with ctx.progress", long_request("plain"),
                                  long_request("progress"), False, rounds, 10, 1.1),
    }


if __name__ == "__main__":
    asyncio.run(main())
