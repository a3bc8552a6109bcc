"""The official ``mcp`` Python client against a live page, for tests/e2e/mcp.spec.js.

Usage: ``python tests/e2e/mcp_client.py URL TOKEN [CALL_JSON ...]`` where each CALL_JSON is
``{"tool": NAME, "args": {...}}``. Connects over streamable HTTP with the admin token,
lists the tools, makes the calls in order, prints one JSON object: ``{"tools": [...],
"calls": [{"isError", "structuredContent", "text"}, ...]}``. Every step is bounded.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import httpx2
from mcp import ClientSession, types
from mcp.client.streamable_http import streamable_http_client

WAIT = 20.0


async def main(url: str, token: str, calls: list[dict[str, Any]]) -> dict[str, Any]:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"},
                              timeout=httpx2.Timeout(WAIT))
    async with http, streamable_http_client(url, http_client=http) as (read, write), \
            ClientSession(read, write, read_timeout_seconds=WAIT) as client:
        await client.initialize()
        listed = await client.list_tools()
        results = []
        for call in calls:
            result = await client.call_tool(call["tool"], call["args"])
            results.append({
                "isError": result.is_error,
                "structuredContent": result.structured_content,
                "text": [b.text for b in result.content if isinstance(b, types.TextContent)],
            })
    return {
        "tools": [t.model_dump(by_alias=True, exclude_none=True) for t in listed.tools],
        "calls": results,
    }


if __name__ == "__main__":
    url, token, *specs = sys.argv[1:]
    outcome = asyncio.run(asyncio.wait_for(main(url, token, [json.loads(s) for s in specs]),
                                           WAIT * 3))
    print(json.dumps(outcome))
