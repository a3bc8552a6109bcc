"""The depth check every frame gets before it is decoded (``protocol.nests_too_deep``),
against the check it replaced, on 1 MiB texts of the shapes that cost each most.

The check it replaced stripped every innermost bracket pair at once, a level a pass, up to
MAX_DEPTH passes: linear per pass, but a text of many chains each nearly 100 deep took
a hundred passes over most of itself (~0.36 s for 1 MiB, on Core's event loop for an MCP
call's args, and in every page). The check now strips while that halves what is left,
then counts the rest in one pass at C speed. Both are run on each shape, interleaved
round by round; printed: the median of each and their ratio.

Run: ``.venv/bin/python bench/depth_check.py [--rounds 9]``
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from pedelec_pyodide.protocol import (
    _NOT_BRACKET_BYTES,
    MAX_DEPTH,
    nests_too_deep,
    outside_strings,
)

SIZE = 1_000_000


def chains(depth: int) -> str:
    chain = "[" * depth + "]" * depth
    return "[" + ",".join([chain] * (SIZE // (2 * depth + 1))) + "]"


SHAPES = {
    "chains 96 deep": chains(96),
    "chains 17 deep": chains(17),
    "chains 8 deep": chains(8),
    "chains 4 deep": chains(4),
    "empty arrays": "[" + ",".join(["[]"] * (SIZE // 3)) + "]",
    "numbers in pairs": "[" + ",".join(["[1,2]"] * (SIZE // 6)) + "]",
}


def level_by_level(text: str) -> bool:
    """The check as it was: a pass per level."""
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return False
    brackets = outside_strings(text).encode("utf-8", "surrogatepass").translate(
        None, _NOT_BRACKET_BYTES)
    for _ in range(MAX_DEPTH):
        stripped = brackets.replace(b"[]", b"\0").replace(b"{}", b"").replace(b"\0", b"")
        if stripped == brackets:
            return len(brackets) > MAX_DEPTH
        brackets = stripped
    return bool(brackets)


def ms(check: Callable[[str], bool], text: str) -> float:
    started = time.perf_counter()
    check(text)
    return (time.perf_counter() - started) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    rounds = parser.parse_args().rounds
    print(f"{SIZE:,} characters a text; {rounds} rounds, the two checks interleaved")
    for name, text in SHAPES.items():
        assert nests_too_deep(text) == level_by_level(text)
        before: list[float] = []
        after: list[float] = []
        for _ in range(rounds):
            before.append(ms(level_by_level, text))
            after.append(ms(nests_too_deep, text))
        old, new = statistics.median(before), statistics.median(after)
        print(f"  {name:18} a pass per level {old:7.1f} ms   now {new:6.1f} ms   "
              f"{new / old:.2f}x")


if __name__ == "__main__":
    main()
