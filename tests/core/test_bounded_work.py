"""Issue 10, class 2: no frame makes Core work super-linearly on its event loop.

Each of the issue's payloads goes to a real Core (in process) from one unauthenticated
WebSocket while ``/pedelec/v1/health`` is polled; health must keep answering. Before the
fix: 38 s for the hello with a chain of ``$ref``s, 28.6 s for the turn whose words matched
word by word, 22 s for the turn read once per property. The scaling of each check is
asserted in tests/unit/test_schemas.py and tests/core/test_offline_agent.py; here the
bound is generous (the machine is noisy), the freezes it catches were tens of seconds.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Awaitable
from typing import Any

import pytest
from corekit import WAIT, Core, RawClient, config, run, running_core, tool_meta

from pedelec_pyodide import protocol
from pedelec_pyodide.core.agents import OfflineAgent
from pedelec_pyodide.core.bridge import PARSE_IN_THREAD_CHARS

HEALTH_BOUND = 2.0  # seconds: the slowest health answer allowed while the payload works


async def health_while(core: Core, work: Awaitable[Any]) -> tuple[Any, float]:
    """Run ``work`` while polling health; its result and the slowest health answer."""
    slowest = 0.0
    done = asyncio.Event()
    polled = asyncio.Event()

    async def poll() -> None:
        nonlocal slowest
        while not done.is_set():
            started = time.perf_counter()
            response = await core.http.get("/pedelec/v1/health")
            assert response.status_code == 200
            slowest = max(slowest, time.perf_counter() - started)
            polled.set()
            await asyncio.sleep(0.01)

    poller = asyncio.create_task(poll())
    await asyncio.wait_for(polled.wait(), WAIT)  # polling before the payload goes
    try:
        result = await work
    finally:
        done.set()
        await asyncio.wait_for(poller, WAIT)
    return result, slowest


def word(i: int, letter: str) -> str:
    """Distinct words that all share their first four letters (one bucket, before)."""
    return "abcd" + letter + "".join(chr(97 + i // 26**k % 26) for k in range(4))


async def turn(client: RawClient, text: str) -> dict[str, Any]:
    await client.send({"type": "turn.start", "turnId": "t1", "text": text})
    while True:
        frame = await client.recv()
        if frame["type"] == "turn.end":
            return frame


def test_a_chain_of_references_in_a_hello() -> None:
    async def main() -> None:
        async with running_core(config()) as core:
            n = 6000  # the issue's 285 KiB hello
            defs = {f"d{i}": {"allOf": [{"$ref": f"#/$defs/d{i + 1}"}]} for i in range(n)}
            defs[f"d{n}"] = {"type": "object"}
            meta = {"name": "chained", "description": "d", "argsSchema": {
                "type": "object", "$defs": defs, "allOf": [{"$ref": "#/$defs/d0"}]}}
            client = await RawClient.open(core.ws_url)
            welcome, slowest = await health_while(core, client.hello([meta]))
            assert welcome["type"] == "welcome", welcome
            assert slowest < HEALTH_BOUND, slowest
            await client.close()
    run(main())


def test_a_turn_the_offline_agent_matches_against_a_long_description() -> None:
    async def main() -> None:
        async with running_core(config(agent_factory=OfflineAgent)) as core:
            n = 13_000  # 117 KiB of text, 117 KiB of description
            meta = {"name": "zz", "description": " ".join(word(i, "b") for i in range(n)),
                    "argsSchema": {"type": "object"}}
            client = await RawClient.open(core.ws_url)
            assert (await client.hello([meta]))["type"] == "welcome"
            text = " ".join(word(i, "a") for i in range(n))
            end, slowest = await health_while(core, turn(client, text))
            assert end["status"] == "completed" and end["text"].startswith("No tool fits")
            assert slowest < HEALTH_BOUND, slowest
            await client.close()
    run(main())


def test_a_turn_the_offline_agent_reads_for_many_properties() -> None:
    async def main() -> None:
        async with running_core(config(agent_factory=OfflineAgent)) as core:
            properties = {f"p{i}": {"type": "string"} for i in range(4000)}
            meta = {"name": "fill_form", "description": "Fill the form.", "argsSchema": {
                "type": "object", "properties": properties, "required": ["p3999"]}}
            client = await RawClient.open(core.ws_url)
            assert (await client.hello([meta]))["type"] == "welcome"
            text = "fill form " + "x " * 200_000  # 400 KiB
            end, slowest = await health_while(core, turn(client, text))
            assert end["status"] == "completed"
            assert end["text"].startswith("To call fill_form I need a value for p3999")
            assert slowest < HEALTH_BOUND, slowest
            await client.close()
    run(main())


def test_a_long_frame_is_parsed_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Checking is linear, but a 1 MiB hello of tiny subschemas still takes ~0.5 s: in a
    worker thread, the event loop gets the GIL every few ms and health keeps answering."""
    parsed_in: list[tuple[int, str]] = []
    parse = protocol.parse_client_frame

    def spy(data: str | bytes, **options: Any) -> protocol.ClientMessage:
        parsed_in.append((len(data), threading.current_thread().name))
        return parse(data, **options)

    monkeypatch.setattr(protocol, "parse_client_frame", spy)

    async def main() -> None:
        async with running_core(config()) as core:
            client = await RawClient.open(core.ws_url)
            long = {**tool_meta("t"), "description": "d" * PARSE_IN_THREAD_CHARS}
            assert (await client.hello([long]))["type"] == "welcome"
            assert (await client.hello())["code"] == "DUPLICATE_HELLO"
            await client.close()
    run(main())
    (long_size, long_thread), (short_size, short_thread) = parsed_in
    assert long_size > PARSE_IN_THREAD_CHARS and long_thread.startswith("pedelec-parse")
    assert short_size < PARSE_IN_THREAD_CHARS and short_thread == threading.main_thread().name


def _best_of(work: Any, rounds: int = 3) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return min(times)


def test_checks_on_a_large_valid_value_cost_about_what_decoding_it_costs() -> None:
    """The checks every 1 MiB frame or args value goes through run at C speed when the
    value is fine: the lone-surrogate rule walked every node in Python (~20x json.loads
    on ``[{}, {}, ...]``), the nesting check made a regex match per bracket pair (~4.5x)."""
    from pedelec_pyodide.text import lone_surrogate_at

    text = "[" + ",".join(["{}"] * 340_000) + "]"  # the most containers 1 MiB can hold
    value = json.loads(text)
    decode = _best_of(lambda: json.loads(text))
    assert _best_of(lambda: lone_surrogate_at(value)) < 3 * decode + 0.005
    assert _best_of(lambda: protocol._nests_too_deep(text)) < 3 * decode + 0.005
    assert lone_surrogate_at([value, {"k": "\ud800"}]) == "$[1].k"  # and still finds one
