"""pedelec-pyodide: Python tool handlers for AI agents, running in the web page under Pyodide."""

from typing import Any

from .ledger import MemoryLedger, StorageLedger
from .results import ToolError, invalid_args, tool_error
from .session import (
    NotConnectedError,
    Session,
    SessionClosedError,
    SessionState,
    ToolCall,
    ToolContext,
    TurnError,
)
from .tools import Tool, define_tool


async def connect(core_url: str, tools: list[Tool] | tuple[Tool, ...] = (), **options: Any
                  ) -> Session:
    """A Session bound to Core at ``core_url`` through the browser bridge (Pyodide only)."""
    from .browser import connect as browser_connect

    return await browser_connect(core_url, tools=tools, **options)


__all__ = [
    "MemoryLedger",
    "NotConnectedError",
    "Session",
    "SessionClosedError",
    "SessionState",
    "StorageLedger",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolError",
    "TurnError",
    "connect",
    "define_tool",
    "invalid_args",
    "tool_error",
]
__version__ = "0.1.0"
