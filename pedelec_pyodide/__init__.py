"""pedelec-pyodide: Python tool handlers for AI agents, running in the web page under Pyodide."""

from typing import Any

from .context import ApprovalRequest, ToolContext
from .dispatch import DEFAULT_CANCEL_GRACE, PendingRequest, ToolProgress, ToolStatus
from .errors import (
    ApprovalUnavailable,
    CoreUnreachableError,
    NotConnectedError,
    OriginRefusedError,
    PedelecError,
    SessionClosedError,
    TurnError,
)
from .ledger import MemoryLedger, StorageLedger
from .protocol import ProtocolError
from .results import ResultError, ToolError, invalid_args, tool_error
from .schemas import SchemaError
from .session import Session, SessionState, ToolCall, ToolsChanged
from .tools import Tool, define_tool


async def connect(core_url: str, tools: list[Tool] | tuple[Tool, ...] = (), **options: Any
                  ) -> Session:
    """A Session bound to Core at ``core_url`` through the browser bridge (Pyodide only)."""
    from .browser import connect as browser_connect

    return await browser_connect(core_url, tools=tools, **options)


__all__ = [
    "DEFAULT_CANCEL_GRACE",
    "ApprovalRequest",
    "ApprovalUnavailable",
    "CoreUnreachableError",
    "MemoryLedger",
    "NotConnectedError",
    "OriginRefusedError",
    "PedelecError",
    "PendingRequest",
    "ProtocolError",
    "ResultError",
    "SchemaError",
    "Session",
    "SessionClosedError",
    "SessionState",
    "StorageLedger",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolError",
    "ToolProgress",
    "ToolStatus",
    "ToolsChanged",
    "TurnError",
    "connect",
    "define_tool",
    "invalid_args",
    "tool_error",
]
__version__ = "0.1.0"
