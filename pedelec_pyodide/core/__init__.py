"""Core: the server that runs agent turns and relays tool calls to pages (CPython only)."""
