"""A kept history trimmed at its bound: cut from its text, against decoded and written again.

When a turn's entries take an agent's kept history over its bound (512 KiB), Core drops
its oldest turns (``turns.trimmed_with``): the entries it keeps are cut out of the kept
text as they stand, each decoded only to read its turn. The baseline is the way it was
done before, still how a history the agent read is trimmed: the whole decoded, then every
entry encoded again (``trimmed_history``: twice, for a history with non-ASCII text).
Both give the same entries. Two shapes of history at the bound: the offline agent's
(~1.5 KB entries with a ``→`` in each) and small ASCII ones. Variants interleaved;
prints the best of each and their ratio.

Run: ``.venv/bin/python bench/history_trim.py``
"""

from __future__ import annotations

import functools
import json
import timeit
from collections.abc import Callable
from typing import Any

from pedelec_pyodide.core.sessions.turns import trimmed_history, trimmed_with

LIMIT = 512 * 1024
ROUNDS = 7

SHAPES: dict[str, Callable[[int], dict[str, Any]]] = {
    "offline agent's entries (~1.5 KB, non-ASCII)": lambda n: {
        "agent": "offline", "turn_id": f"t{n}", "user": "/call echo {}\n" * 8,
        "reply": 'echo → {"echo": 1}\n' * 60},
    "small ASCII entries (~40 B)": lambda n: {"turn": f"t{n}", "content": "hello"},
}


def decoded_and_written_again(history_json: str, entries: list[dict[str, Any]],
                              limit: int) -> str:
    return trimmed_history(json.loads(history_json) + entries, limit * 3 // 4)


def main() -> None:
    for label, entry in SHAPES.items():
        history: list[dict[str, Any]] = []
        while len(json.dumps(history)) < LIMIT:  # (a pass per hundred entries)
            history.extend(entry(len(history) + n) for n in range(100))
        kept = trimmed_history(history, 10 * LIMIT)  # as Core keeps it
        new = [entry(len(history))]
        same = json.loads(trimmed_with(kept, new, LIMIT))
        assert same == json.loads(decoded_and_written_again(kept, new, LIMIT)), label
        variants = {"baseline": functools.partial(decoded_and_written_again, kept, new, LIMIT),
                    "cut": functools.partial(trimmed_with, kept, new, LIMIT)}
        times: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(ROUNDS):
            for name, trim in variants.items():
                times[name].append(timeit.timeit(trim, number=3) / 3)
        baseline, cut = min(times["baseline"]), min(times["cut"])
        print(f"{label}: {len(history)} entries, {len(kept)} characters: decoded and "
              f"written again {baseline * 1000:.2f} ms, cut from the text {cut * 1000:.2f} "
              f"ms, ratio {cut / baseline:.2f}x")


if __name__ == "__main__":
    main()
