"""Core over HTTP: the control API and health (:mod:`.control`), MCP (:mod:`.mcp`), static
files (:mod:`.public`, :mod:`.snapshot`), and the HTTP protocol's bounds
(:mod:`.http_limits`): thin Starlette and uvicorn adapters."""
