"""Fault injection (short CI run of ``faultkit.py``) and the regressions it found.

The long run and its figures: docs/records/reliability.md, "Fault injection".
"""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path

from faultkit import RunConfig, run_faults


def test_short_fault_run_loses_nothing_and_runs_nothing_twice(tmp_path: Path) -> None:
    """~60 faults (drops, reloads, SIGKILL restarts of Core, delayed, reordered and
    duplicated frames) over 3 pages running turns of parallel calls. Seed printed."""
    seed = int(os.environ.get("PEDELEC_FAULT_SEED", random.SystemRandom().randrange(2**32)))
    print(f"fault seed {seed} (PEDELEC_FAULT_SEED={seed} to run it again)")
    cfg = RunConfig(seed=seed, faults=60, pages=3, max_seconds=40, gap=(0.05, 0.25))
    report = asyncio.run(asyncio.wait_for(run_faults(cfg, tmp_path), 150))
    print("\n".join(report.lines()))
    assert report.ok, "\n".join(report.lines())
    assert report.total_faults >= 60
    assert {"drop", "reload", "restart"} <= set(report.stats.faults)
    assert report.stats.turns["completed"] > 0
