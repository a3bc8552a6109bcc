"""Smoke version of the load benchmark (bench/load.py): 100 pages, 5 s, 0 errors.

The long run (1,000 pages, 60 s) and its figures: docs/records/reliability.md, "Load".
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_load_smoke_100_pages_5_seconds_no_errors() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "load.py"), "--pages", "100", "--seconds", "5",
         "--concurrency", "16", "--sample", "1"],
        capture_output=True, text=True, timeout=90, cwd=ROOT)
    print(done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "errors: 0;" in done.stdout
