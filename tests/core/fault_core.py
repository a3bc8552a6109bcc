"""Core in a process of its own for the fault-injection harness (``faultkit.py``).

``python fault_core.py DB PORT TOOL_TIMEOUT_MS`` runs the CLI's ``server.run`` with the
SQLite store and :class:`PlanFromText`, a deterministic agent whose turn text is the plan:
``{"plan": [[[tool, args], ...], ...]}`` (a list of steps, each a list of parallel calls).
Its reply is the JSON list of ``{"tool", "id", "result"}``, one per call, in plan order.
Deterministic, so a turn resumed after a SIGKILL asks for the very same calls again.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from pedelec_pyodide.core.agents.contract import ToolCallRequest, Turn
from pedelec_pyodide.core.config import CoreConfig
from pedelec_pyodide.core.server import run

TOKEN = "fault-admin-token"


class PlanFromText:
    async def run(self, turn: Turn) -> str:
        plan: list[list[list[Any]]] = json.loads(turn.text)["plan"]
        out: list[dict[str, Any]] = []
        for step in plan:
            outcomes = await turn.call_tools([ToolCallRequest(t, a) for t, a in step])
            out.extend({"tool": o.tool, "id": o.tool_request_id, "result": o.result}
                       for o in outcomes)
        return json.dumps(out)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    cfg = CoreConfig(port=int(sys.argv[2]), admin_token=TOKEN, web_dir=None,
                     store=sys.argv[1], agent_factory=PlanFromText,
                     tool_timeout_ms=int(sys.argv[3]), rate_limit=10_000, rate_burst=20_000)
    run(cfg, lambda url: print(url, flush=True))
