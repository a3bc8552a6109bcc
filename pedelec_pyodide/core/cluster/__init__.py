"""Core's nodes on one shared store (Redis): the messages between them, declared once
(:mod:`.messages`), and the :class:`Node` that sends and hears them, with its leases;
control-API calls forwarded (:mod:`.routing`) and MCP tool calls relayed (:mod:`.relay`)
to the node holding the page.

Builds on :mod:`..sessions` (local to one node), which knows nothing of it.
"""

from .leases import Leases
from .node import Node
from .relay import NoSession, ToolRelay
from .routing import ClusterRouter, serve_forwarded

__all__ = ["ClusterRouter", "Leases", "NoSession", "Node", "ToolRelay", "serve_forwarded"]
