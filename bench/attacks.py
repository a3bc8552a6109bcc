"""Hostile input (issue 10): Core's health latency and RSS under each attack, idle beside it.

For each attack class (the worst one client can send, every frame within Core's 1 MiB
limit) a Core of its own runs as ``pedelec serve`` on a free loopback port (a temporary
SQLite store for the store attack): a victim page connects, 200 health GETs at 20/s
measure the idle baseline, then 200 more while the attack runs; Core's RSS is sampled
all along. After the attack the victim must still be served and SIGTERM must stop Core
within 5 s. One table row per attack, pass/fail against the issue's figures (health p99
< 100 ms, < 1 s allowed under noise: the pass mark; RSS growth < 256 MiB for 40 sessions
of 1 MiB, < 128 MiB for a client that never reads and for 300 quoting bad frames,
< 256 MiB for 25 turns of 1 MiB args).

The attacks and the measuring live in tests/core/hostile.py, shared with the tests
(tests/core/test_hostile.py). Exit status 1 when any attack fails.

Run: ``.venv/bin/python bench/attacks.py [--quick] [--only NAME ...]``
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

# the test kits, as pytest finds them (pyproject.toml's pythonpath: tests/unit too)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "unit"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "core"))

from hostile import (
    ATTACKS,
    FULL,
    QUICK,
    Row,
    Scale,
    run_attack,
    table_header,
    table_row,
)


async def main(scale: Scale, names: list[str]) -> list[Row]:
    rows = []
    print(f"scale: {scale.name}; {scale.probes} health GETs per phase; a probe without "
          f"answer within {scale.cap:g} s counts as {scale.cap:g} s", flush=True)
    for attack in ATTACKS:
        if names and attack.name not in names:
            continue
        print(f"- {attack.name}: {attack.what} ...", flush=True)
        row = await run_attack(attack, scale)
        print(f"  {table_row(row)}\n  notes: {'; '.join(row.notes)}", flush=True)
        rows.append(row)
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="smaller payloads and 40 probes a phase (the CI test's scale)")
    parser.add_argument("--only", nargs="+", default=[], metavar="NAME",
                        choices=[a.name for a in ATTACKS], help="run only these attacks")
    options = parser.parse_args()
    rows = asyncio.run(main(QUICK if options.quick else FULL, options.only))
    print()
    print(table_header())
    for row in rows:
        print(table_row(row))
    sys.exit(0 if all(row.passed for row in rows) else 1)
