"""Core in a process of its own, for the crash tests: ``python core_process.py DB PORT
[PYODIDE]``; with a provisioned runtime directory ``PYODIDE`` it also serves the demo and
the runtime, as ``pedelec demo --pyodide PYODIDE`` does (real Chromium pages load it).

Runs the same ``pedelec_pyodide.core.server.run`` as the CLI, with the test's PlanAgent
(two parallel calls, then one), and prints the URL once it listens; then the log lines
of the events a test waits for (``until_logged``) instead of guessing a time: a retry Core
takes as one of a key it knows (``control.retry``), a turn it starts (``turn.start``), its
store found out of reach (``store.unreachable``: its writer retries from then on).
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
from pathlib import Path

from corekit import CLUSTER_SECRET, TOKEN, WAIT, PlanAgent

from pedelec_pyodide.core.config import CoreConfig
from pedelec_pyodide.core.log import configure
from pedelec_pyodide.core.server import run

PLAN = [[("a", {"n": 1}), ("b", {"n": 2})], [("c", {"n": 3})]]
RETRY = "event=control.retry "
TURN_START = "event=turn.start "
STORE_UNREACHABLE = "event=store.unreachable "


class Printed(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith((RETRY, TURN_START, STORE_UNREACHABLE)):
            print(record.getMessage(), flush=True)


async def until_logged(process: subprocess.Popen[str], event: str) -> None:
    """Until the Core of this file, run by ``corekit.core_process``, prints a
    line of ``event`` (the lines before it are skipped)."""
    assert process.stdout is not None
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while True:
        left = deadline - loop.time()
        assert left > 0, f"Core never logged {event.strip()}"
        line = await asyncio.wait_for(asyncio.to_thread(process.stdout.readline), left)
        assert line, f"Core ended before it logged {event.strip()}"
        if line.startswith(event):
            return


if __name__ == "__main__":
    pyodide = Path(sys.argv[3]) if len(sys.argv) > 3 else None
    # without a runtime no web files at all (the default web_dir is the repository's web/)
    web = {} if pyodide is not None else {"web_dir": None}
    cfg = CoreConfig(port=int(sys.argv[2]), admin_token=TOKEN, store=sys.argv[1],
                     cluster_secret=CLUSTER_SECRET,
                     pyodide_dir=pyodide, demo=pyodide is not None,
                     agent_factory=lambda: PlanAgent(PLAN), **web)
    configure()  # every event line to stderr (a cluster's node keeps them in a file)
    logging.getLogger("pedelec.core").addHandler(Printed())
    run(cfg, lambda url: print(url, flush=True))
