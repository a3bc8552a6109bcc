"""Core in a process of its own, for the crash tests: ``python core_process.py DB PORT``.

Runs the same ``pedelec_pyodide.core.server.run`` as the CLI, with the test's PlanAgent
(two parallel calls, then one), and prints the URL once it listens; then one line per
retry Core takes as one of a key it knows (its ``control.retry`` log event), so that a
test can wait for that instead of guessing a time.
"""

from __future__ import annotations

import logging
import sys

from corekit import TOKEN, PlanAgent

from pedelec_pyodide.core.config import CoreConfig
from pedelec_pyodide.core.server import run

PLAN = [[("a", {"n": 1}), ("b", {"n": 2})], [("c", {"n": 3})]]
RETRY = "event=control.retry "


class Retries(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith(RETRY):
            print(record.getMessage(), flush=True)

if __name__ == "__main__":
    cfg = CoreConfig(port=int(sys.argv[2]), admin_token=TOKEN, web_dir=None,
                     store=sys.argv[1], agent_factory=lambda: PlanAgent(PLAN))
    core_logger = logging.getLogger("pedelec.core")
    core_logger.addHandler(Retries())
    core_logger.setLevel(logging.INFO)
    run(cfg, lambda url: print(url, flush=True))
