"""What Core's work on one AG-UI event may cost, at the bounds of what it validates.

Core validates an AG-UI event with pydantic, which holds the GIL for the whole event even
in a worker thread: every other session waits that long. So it validates an event only
within ``MAX_VALIDATED_EVENT_BYTES`` (1 MiB) and ``MAX_EVENT_VALUES`` (8,192 values:
brackets and commas outside strings); over them it reads the event's ``type`` from its
first bytes alone. Each shape below is the costliest of its kind that reaches the work
named (the best of 7 runs, in ms), against the baseline: what Core did with any event
before these bounds, validating it whole, on the costliest 4 MiB event (nested arrays).
The ratio is the figure; the times depend on the machine.

Run: ``.venv/bin/python bench/ag_ui_events.py``
"""

from __future__ import annotations

import time
from collections.abc import Callable

from pydantic import ValidationError

from pedelec_pyodide.core.agents.ag_ui_agent import (
    _EVENT,
    MAX_EVENT_VALUES,
    MAX_VALIDATED_EVENT_BYTES,
    _leading_type,
    _values,
)

RUNS = 7


def best_ms(work: Callable[[bytes], object], data: bytes) -> float:
    best = float("inf")
    for _ in range(RUNS):
        start = time.perf_counter()
        work(data)
        best = min(best, time.perf_counter() - start)
    return best * 1000


def _invalid(data: bytes) -> None:
    """Validate ``data``, which is not an AG-UI event, and read its first error as Core
    does."""
    try:
        _EVENT.validate_json(data)
    except ValidationError as exc:
        exc.errors(include_url=False, include_input=False)[0]
    else:
        raise AssertionError("valid")


def event(kind: str, field: str, body: str) -> bytes:
    return f'{{"type": "{kind}", "{field}": {body}}}'.encode()


def main() -> None:
    room = MAX_VALIDATED_EVENT_BYTES - 64
    four_mib_nested = event("STATE_SNAPSHOT", "snapshot",
                            "[" + "[[[[[[]]]]]]," * (4 * 1024 * 1024 // 13 - 4) + "0]")
    base = best_ms(_EVENT.validate_json, four_mib_nested)
    nested = MAX_EVENT_VALUES // 7 - 1  # 6 brackets and a comma each
    shapes = {
        # counted (a raw count over the bound), its strings stripped: 1 MiB of them
        "count: 1 MiB of empty strings": (
            _values, event("RAW", "event", "[" + '"",' * (room // 3) + '""]')),
        "count: 1 MiB of escapes": (
            _values, event("RAW", "event", '"' + "\\n" * (room // 2) + '"')),
        # validated: just within the values bound
        "validate: nested arrays": (
            _EVENT.validate_json, event("RAW", "event", "[" + "[[[[[[]]]]]]," * nested + "0]")),
        # the AG-UI models' own objects cost more per value than bare arrays
        "validate: message parts": (
            _EVENT.validate_json, event("MESSAGES_SNAPSHOT", "messages", '[{"id": "a", '
                                        '"role": "user", "content": [' + ",".join(
                                            ['{"type": "text", "text": "x"}']
                                            * (MAX_EVENT_VALUES // 3 - 2)) + "]}]")),
        # an invalid event costs an error per value
        "validate: an error per value": (
            _invalid, event("MESSAGES_SNAPSHOT", "messages",
                            "[" + ",".join(["0"] * (MAX_EVENT_VALUES - 2)) + "]")),
        "validate: object members": (
            _EVENT.validate_json, event("RAW", "event", "{" + ",".join(
                f'"k{n}": 1' for n in range(MAX_EVENT_VALUES - 1)) + "}")),
        # over the bounds: the type, from the first bytes
        "type: 4 MiB of nested arrays": (_leading_type, four_mib_nested),
    }
    print(f"{'before: 4 MiB of nested arrays validated':42s} {base:7.2f} ms")
    for name, (work, data) in shapes.items():
        took = best_ms(work, data)
        print(f"{name:32s} {len(data) / 1024:5.0f} KiB {took:7.2f} ms  {took / base:6.3f}x")


if __name__ == "__main__":
    main()
