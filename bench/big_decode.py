"""A large JSON value decoded in Core's process three ways: with what Core's start made in
the garbage collector's view; out of it (``gc.freeze``, as ``pedelec serve`` does once it
has started: ``core/server.py``, ``freeze_start_heap``); and out of it with the collector
paused, as Core's worker threads decode (``core/offload.py``, ``CollectorPause``).

json's decoder holds the GIL; every few hundred containers it makes set off a collection,
and the full ones walk every object the collector tracks: Core's modules, classes and app
(~50,000 objects), and what is decoded so far, each time. The value: 1 MiB of empty
arrays (``[[],[],...]``), the costliest JSON to decode per byte. The three ways are
interleaved round by round; printed: the median of each and their ratios.

Run: ``.venv/bin/python bench/big_decode.py [--rounds 15]``
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time

from pedelec_pyodide.core.config import CoreConfig
from pedelec_pyodide.core.offload import CollectorPause
from pedelec_pyodide.core.server import create_app

TEXT = "[" + ",".join(["[]"] * 340_000) + "]"  # ~1 MiB


def decode_ms() -> float:
    started = time.perf_counter()
    value = json.loads(TEXT)
    elapsed = time.perf_counter() - started
    del value
    return elapsed * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    rounds = parser.parse_args().rounds
    app = create_app(CoreConfig())  # Core's modules and app, as at its start
    gc.collect()
    tracked = len(gc.get_objects())
    in_view: list[float] = []
    frozen: list[float] = []
    paused: list[float] = []
    pause = CollectorPause()
    for _ in range(rounds):
        gc.freeze()
        frozen.append(decode_ms())
        with pause():
            paused.append(decode_ms())
        gc.unfreeze()
        in_view.append(decode_ms())
    del app
    viewed, kept_out, both = (statistics.median(times) for times in (in_view, frozen, paused))
    print(f"{len(TEXT)} characters of [[],...]; {tracked} objects tracked after Core's start")
    print(f"  start heap in view:                  median {viewed:.1f} ms")
    print(f"  start heap frozen:                   median {kept_out:.1f} ms")
    print(f"  start heap frozen, collector paused: median {both:.1f} ms")
    print(f"  frozen / in view = {kept_out / viewed:.2f}x; frozen and paused / frozen = "
          f"{both / kept_out:.2f}x, / in view = {both / viewed:.2f}x"
          f"   (1-minute load average {os.getloadavg()[0]:.2f}, 2 cores)")


if __name__ == "__main__":
    main()
