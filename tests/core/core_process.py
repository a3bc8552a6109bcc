"""Core in a process of its own, for the crash tests: ``python core_process.py DB PORT``.

Runs the same ``pedelec_pyodide.core.server.run`` as the CLI, with the test's PlanAgent
(two parallel calls, then one), and prints the URL once it listens.
"""

from __future__ import annotations

import sys

from corekit import TOKEN, PlanAgent

from pedelec_pyodide.core.config import CoreConfig
from pedelec_pyodide.core.server import run

PLAN = [[("a", {"n": 1}), ("b", {"n": 2})], [("c", {"n": 3})]]

if __name__ == "__main__":
    cfg = CoreConfig(port=int(sys.argv[2]), admin_token=TOKEN, web_dir=None,
                     store=sys.argv[1], agent_factory=lambda: PlanAgent(PLAN))
    run(cfg, lambda url: print(url, flush=True))
