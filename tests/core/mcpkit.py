"""MCP for the tests: the official SDK's clients on a Core's MCP endpoint (``mcp_client``,
``modern_client``), its address (``mcp_at``), a page with tools to call (``page_session``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx2
from corekit import TOKEN, WAIT
from mcp import Client, ClientSession
from mcp.client.streamable_http import streamable_http_client

from pedelec_pyodide import Session, ToolError, define_tool

COUNTER_SCHEMA = {
    "type": "object", "properties": {"delta": {"type": "integer"}},
    "required": ["delta"], "additionalProperties": False,
}


def page_session(stall: asyncio.Event | None = None) -> Session:
    """A page with a counter, a read-only tool, a tool with no "type" in its schema,
    one that fails, one that never answers (until ``stall`` is set)."""
    state = {"value": 0}

    def update(args: dict[str, Any]) -> dict[str, Any]:
        state["value"] += args["delta"]
        return {"value": state["value"]}

    def fail(args: dict[str, Any]) -> None:
        raise ToolError("NOT_TODAY", "the page says no", retryable=False)

    async def hang(args: dict[str, Any]) -> str:
        assert stall is not None
        await stall.wait()
        return "late"

    return Session([
        define_tool(name="update_counter", description="Adds delta to the counter.",
                    args_schema=COUNTER_SCHEMA, handler=update,
                    annotations={"title": "Update the counter", "idempotentHint": False,
                                 "destructiveHint": False}),
        define_tool(name="get_items", description="Lists the items.",
                    args_schema={"properties": {}}, handler=lambda: ["a", "b"],
                    annotations={"readOnlyHint": True}),
        define_tool(name="fail", description="Always fails.", args_schema={"type": "object"},
                    handler=fail),
        define_tool(name="hang", description="Never answers.", args_schema={"type": "object"},
                    handler=hang),
    ])


@contextlib.asynccontextmanager
async def mcp_client(url: str, inbox: list[Any] | None = None,
                     token: str = TOKEN) -> AsyncIterator[ClientSession]:
    async def on_message(message: Any) -> None:
        if inbox is not None:
            inbox.append(message)

    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"},
                              timeout=httpx2.Timeout(WAIT, read=WAIT * 3))
    async with http, streamable_http_client(url, http_client=http) as (read, write), \
            ClientSession(read, write, message_handler=on_message,
                          read_timeout_seconds=WAIT) as client:
        await asyncio.wait_for(client.initialize(), WAIT)
        yield client


@contextlib.asynccontextmanager
async def modern_client(url: str, read_timeout: float = WAIT) -> AsyncIterator[Client]:
    """The SDK's default ``Client``: the per-request protocol (2026-07-28), no handshake;
    a request unanswered for ``read_timeout`` seconds fails."""
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"},
                              timeout=httpx2.Timeout(WAIT, read=WAIT * 3))
    async with http, Client(streamable_http_client(url, http_client=http),
                            read_timeout_seconds=read_timeout) as client:
        yield client


def mcp_at(port: int, session_id: str) -> str:
    return f"http://127.0.0.1:{port}/pedelec/v1/sessions/{session_id}/mcp"
