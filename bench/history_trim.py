"""A kept history at its bound: trimmed, and appended to.

When a turn's entries take an agent's kept history over its bound (512 KiB), Core drops
its oldest turns, down to three quarters of the bound. Three ways, each giving the same
entries:

* ``decoded``, the baseline, how it was first done and still how a history the agent read
  is trimmed: the whole decoded, then every entry encoded again (``trimmed_history``:
  twice, for a history with non-ASCII text);
* ``cut from the text`` (``history.trimmed_with``, for a text Core did not write or could
  not index): the entries it keeps cut out of the kept text as they stand, each decoded
  only to read its turn;
* ``indexed`` (``HistoryIndex.append``, for a text Core wrote, compact and ASCII): cut at
  a turn its index knows, nothing decoded. (Each run copies the index first, a few
  microseconds: a cut changes it.)

Three shapes of history at the bound: the offline agent's entries as ``bench/history_trim``
has long used (~1.5 KB with a ``→`` in each), a turn of 8 ``/call`` lines as
``bench/core_paths.py`` runs them, and small ASCII entries (~100 B). Variants
interleaved; prints the best of each and the ratios.

Then a turn's entry appended to the same kept text, just under its bound
(``history.appended_history``, what every turn of an agent that only adds to its history
does): the kept text copied once and the new entry added to the copy in place, against
the copy joined with the new entry (a second copy of the whole; how it was done before).

Run: ``.venv/bin/python bench/history_trim.py``
"""

from __future__ import annotations

import functools
import json
import timeit
from array import array
from collections.abc import Callable
from typing import Any

from pedelec_pyodide.core.sessions import history as kept_history
from pedelec_pyodide.core.sessions.history import (
    HistoryIndex,
    appended_history,
    indexed_trim,
    trimmed_history,
    trimmed_with,
)

LIMIT = 512 * 1024
ROUNDS = 7

SHAPES: dict[str, Callable[[int], dict[str, Any]]] = {
    "offline agent's entries (~1.5 KB, non-ASCII)": lambda n: {
        "agent": "offline", "turn_id": f"t{n}", "user": "/call echo {}\n" * 8,
        "reply": 'echo → {"echo": 1}\n' * 60},
    "a turn of 8 calls (~1.6 KB)": lambda n: {
        "agent": "offline", "turn_id": f"t{n}",
        "user": "\n".join(['/call update_counter {"delta": 2}'] * 8),
        "calls": [{"tool": "update_counter", "args": {"delta": 2},
                   "result": {"echo": {"delta": 2}}}] * 8,
        "reply": "\n".join(['update_counter → {"echo": {"delta": 2}}'] * 8)},
    "small ASCII entries (~100 B)": lambda n: {"turn": f"t{n}", "content": "hello" * 16},
}


def decoded_and_written_again(history_json: str, entries: list[dict[str, Any]],
                              limit: int) -> str:
    return trimmed_history(json.loads(history_json) + entries, limit * 3 // 4)


def appended_by_a_join(history_json: str, entries: list[dict[str, Any]], limit: int
                       ) -> str | None:
    """:func:`appended_history` as it was: the kept text's copy joined with the rest."""
    texts, _ = kept_history._kept_texts(entries, len(history_json))
    end = len(history_json) - 1  # (Core's own text: its closing bracket last)
    text = "".join((history_json[:end], ",", ",".join(texts), "]"))
    return text if len(text) <= limit else None


def cut_by_its_index(index: HistoryIndex, entries: list[dict[str, Any]]) -> str | None:
    copy = HistoryIndex(index.text, array("q", index._starts), index._last_turn)
    copy._base = index._base
    return copy.append(entries, LIMIT)


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
        while len(json.dumps(history, separators=(",", ":"))) < LIMIT:  # (a pass per 100)
            history.extend(entry(len(history) + n) for n in range(100))
        # as Core keeps it, and its index (the trim that last cut it made both)
        kept, index = indexed_trim("[]", history, 10 * LIMIT)
        assert index is not None, label
        new = [entry(len(history))]
        same = json.loads(trimmed_with(kept, new, LIMIT))
        assert same == json.loads(decoded_and_written_again(kept, new, LIMIT)), label
        assert same == json.loads(cut_by_its_index(index, new) or ""), label
        took = best({
            "baseline": functools.partial(decoded_and_written_again, kept, new, LIMIT),
            "cut": functools.partial(trimmed_with, kept, new, LIMIT),
            "indexed": functools.partial(cut_by_its_index, index, new)})
        baseline, cut, indexed = took["baseline"], took["cut"], took["indexed"]
        print(f"{label}: {len(history)} entries, {len(kept)} characters: decoded and "
              f"written again {baseline * 1000:.2f} ms, cut from the text {cut * 1000:.2f} "
              f"ms ({cut / baseline:.2f}x), indexed {indexed * 1000:.3f} ms "
              f"({indexed / baseline:.3f}x; {indexed / cut:.3f}x the cut from the text)")
        room = 10 * LIMIT  # (appended, not trimmed)
        assert appended_history(kept, new, room) == appended_by_a_join(kept, new, room), label
        took = best({"join": functools.partial(appended_by_a_join, kept, new, room),
                     "in place": functools.partial(appended_history, kept, new, room)})
        print(f"  a turn's entry appended: joined {took['join'] * 1e6:.0f} µs, in place "
              f"{took['in place'] * 1e6:.0f} µs, ratio {took['in place'] / took['join']:.2f}x")


if __name__ == "__main__":
    main()
