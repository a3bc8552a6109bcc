"""A large JSON value decoded in Core's process, with what Core's start made in the
garbage collector's view and out of it (``gc.freeze``, as ``pedelec serve`` does once it
has started: ``core/server.py``, ``freeze_start_heap``).

json's decoder holds the GIL; every few hundred containers it makes set off a collection,
and the full ones walk every object the collector tracks: Core's modules, classes and app
(~50,000 objects) each time. The value: 1 MiB of empty arrays (``[[],[],...]``), the
costliest JSON to decode per byte. The two ways are interleaved round by round (freeze,
decode, unfreeze, decode); printed: the median of each and their ratio.

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
    for _ in range(rounds):
        gc.freeze()
        frozen.append(decode_ms())
        gc.unfreeze()
        in_view.append(decode_ms())
    del app
    print(f"{len(TEXT)} characters of [[],...]; {tracked} objects tracked after Core's start")
    print(f"  start heap in view: median {statistics.median(in_view):.1f} ms")
    print(f"  start heap frozen:  median {statistics.median(frozen):.1f} ms")
    print(f"  frozen / in view = {statistics.median(frozen) / statistics.median(in_view):.2f}x"
          f"   (1-minute load average {os.getloadavg()[0]:.2f}, 2 cores)")


if __name__ == "__main__":
    main()
