"""A kept history at its bound: trimmed, and appended to.

When a turn's entries take an agent's kept history over its bound (512 KiB), Core drops
its oldest turns (``turns.trimmed_with``): the entries it keeps are cut out of the kept
text as they stand, each decoded only to read its turn. The baseline is the way it was
done before, still how a history the agent read is trimmed: the whole decoded, then every
entry encoded again (``trimmed_history``: twice, for a history with non-ASCII text).
Both give the same entries. Two shapes of history at the bound: the offline agent's
(~1.5 KB entries with a ``→`` in each) and small ASCII ones. Variants interleaved;
prints the best of each and their ratio.

Then a turn's entry appended to the same kept text, just under its bound
(``turns.appended_history``, what every turn of an agent that only adds to its history
does): the kept text copied once and the new entry added to the copy in place, against
the copy joined with the new entry (a second copy of the whole; how it was done before).

Run: ``.venv/bin/python bench/history_trim.py``
"""

from __future__ import annotations

import functools
import json
import timeit
from collections.abc import Callable
from typing import Any

from pedelec_pyodide.core.sessions import turns
from pedelec_pyodide.core.sessions.turns import appended_history, trimmed_history, trimmed_with

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


def appended_by_a_join(history_json: str, entries: list[dict[str, Any]], limit: int
                       ) -> str | None:
    """:func:`appended_history` as it was: the kept text's copy joined with the rest."""
    texts, _ = turns._kept_texts(entries, len(history_json))
    end = len(history_json) - 1  # (Core's own text: its closing bracket last)
    text = "".join((history_json[:end], ",", ",".join(texts), "]"))
    return text if len(text) <= limit else None


def best(variants: dict[str, Callable[[], object]]) -> dict[str, float]:
    """Each variant's best time of ROUNDS, the variants interleaved."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(ROUNDS):
        for name, run in variants.items():
            times[name].append(timeit.timeit(run, number=3) / 3)
    return {name: min(each) for name, each in times.items()}


def main() -> None:
    for label, entry in SHAPES.items():
        history: list[dict[str, Any]] = []
        while len(json.dumps(history)) < LIMIT:  # (a pass per hundred entries)
            history.extend(entry(len(history) + n) for n in range(100))
        kept = trimmed_history(history, 10 * LIMIT)  # as Core keeps it
        new = [entry(len(history))]
        same = json.loads(trimmed_with(kept, new, LIMIT))
        assert same == json.loads(decoded_and_written_again(kept, new, LIMIT)), label
        took = best({
            "baseline": functools.partial(decoded_and_written_again, kept, new, LIMIT),
            "cut": functools.partial(trimmed_with, kept, new, LIMIT)})
        baseline, cut = took["baseline"], took["cut"]
        print(f"{label}: {len(history)} entries, {len(kept)} characters: decoded and "
              f"written again {baseline * 1000:.2f} ms, cut from the text {cut * 1000:.2f} "
              f"ms, ratio {cut / baseline:.2f}x")
        room = 10 * LIMIT  # (appended, not trimmed)
        assert appended_history(kept, new, room) == appended_by_a_join(kept, new, room), label
        took = best({"join": functools.partial(appended_by_a_join, kept, new, room),
                     "in place": functools.partial(appended_history, kept, new, room)})
        print(f"  a turn's entry appended: joined {took['join'] * 1e6:.0f} µs, in place "
              f"{took['in place'] * 1e6:.0f} µs, ratio {took['in place'] / took['join']:.2f}x")


if __name__ == "__main__":
    main()
