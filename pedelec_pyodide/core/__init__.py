"""Core: the server that runs agent turns and relays tool calls to pages (CPython only).

One room per concept: :mod:`.page` (one page's connection), :mod:`.sessions` (sessions,
pending requests, turns; local to one node), :mod:`.http` (control API, MCP, static
files), :mod:`.cluster` (nodes on one shared store), :mod:`.store`, :mod:`.agents`.
:mod:`.server` composes them into the app; :mod:`.cli` and :mod:`.config` run and
configure it.
"""
