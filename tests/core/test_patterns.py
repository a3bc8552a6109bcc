"""Regular expressions in tool metadata (issue 22): each distinct one checked once, new ones
charged to their client (``--pattern-rate``), a frame with many new ones checked in a
worker thread, never on the event loop. The floods themselves, against a Core process
with health probed, are in hostile.py (``patterns_*``).
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from corekit import RawClient, config, run, running_core

from pedelec_pyodide import protocol, schemas
from pedelec_pyodide.core.sessions import RATE_LIMITED


def patterned(prefix: str, count: int, length: int = 100) -> dict[str, Any]:
    """A tool with ``count`` distinct patterns of ``length`` characters each."""
    properties = {f"p{i}": {"type": "string",
                            "pattern": f"{prefix}{i}:".ljust(length, "a")}
                  for i in range(count)}
    return {"name": "t", "description": "d",
            "argsSchema": {"type": "object", "properties": properties}}


def test_new_patterns_are_checked_off_the_event_loop_and_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    parsed_in: list[str] = []
    checked: list[str] = []
    checked_in: set[str] = set()
    parse = protocol.parse_client_frame
    problem = schemas._regex_problem

    def spy_parse(data: str | bytes, **options: Any) -> protocol.ClientMessage:
        parsed_in.append(threading.current_thread().name)
        return parse(data, **options)

    def spy_problem(pattern: str) -> str | None:
        checked.append(pattern)
        checked_in.add(threading.current_thread().name)
        return problem(pattern)

    monkeypatch.setattr(protocol, "parse_client_frame", spy_parse)
    monkeypatch.setattr(schemas, "_regex_problem", spy_problem)
    schemas.PATTERN_CACHE.clear()
    many = patterned("many", 40)  # a short frame (~5 KiB)

    async def main() -> None:
        async with running_core(config()) as core:
            client = await RawClient.open(core.ws_url)
            assert (await client.hello([patterned("few", 3)]))["type"] == "welcome"
            await client.send({"type": "tools.update", "tools": [many]})
            await client.send({"type": "tools.update", "tools": [many]})  # all known now
            await client.send({"type": "turn.cancel", "turnId": "x"})
            assert (await client.recv())["code"] == "UNKNOWN_TURN"  # the updates went in
            await client.close()
    run(main())
    main_thread = threading.main_thread().name
    # each frame with a new pattern: begun on the loop, parsed in a thread (its patterns
    # checked there); one whose patterns are all known, and any other: on the loop
    assert parsed_in[0] == main_thread and parsed_in[1].startswith("pedelec-parse-patterns")
    assert parsed_in[2] == main_thread and parsed_in[3].startswith("pedelec-parse-patterns")
    assert parsed_in[4:] == [main_thread, main_thread]
    assert len(checked) == len(set(checked)) == 3 + len(many["argsSchema"]["properties"])
    assert checked_in == {parsed_in[1]}  # never on the loop


def test_new_patterns_are_charged_to_their_client_only() -> None:
    schemas.PATTERN_CACHE.clear()
    rate = 100.0  # characters a second: a burst of 400 (a noisy machine's pauses refill
    # a few dozen: each step below is hundreds of characters away from a flip)

    async def main() -> None:
        async with running_core(config(pattern_rate=rate)) as core:
            flood = await RawClient.open(core.ws_url, local_addr=("127.0.0.2", 0))
            refused = await flood.hello([patterned("a", 50)])  # 5000 characters: 4 checked
            assert refused["type"] == "error" and refused["code"] == RATE_LIMITED
            assert "--pattern-rate" in refused["message"]
            assert not core.registry.sessions  # and the connection stays
            # another connection of the same client shares its budget
            again = await RawClient.open(core.ws_url, local_addr=("127.0.0.2", 0))
            assert (await again.hello([patterned("b", 3)]))["code"] == RATE_LIMITED
            other = await RawClient.open(core.ws_url, local_addr=("127.0.0.3", 0))
            assert (await other.hello([patterned("c", 3)]))["type"] == "welcome"
            # patterns checked already cost nothing: the flooding client may send them
            assert (await flood.hello([patterned("c", 3)]))["type"] == "welcome"
            for client in (flood, again, other):
                await client.close()
            # its budget outlives its connections (no fresh burst by reconnecting)
            back = await RawClient.open(core.ws_url, local_addr=("127.0.0.2", 0))
            assert (await back.hello([patterned("d", 3)]))["code"] == RATE_LIMITED
            await back.close()

    run(main())
