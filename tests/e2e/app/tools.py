"""Tools for the e2e tests: one per rule of the spec. `session` comes from the loader."""

import asyncio

import js

from pedelec_pyodide import define_tool

block_order = ["tools.py"]
runs: dict[str, int] = {}
gates: dict[str, asyncio.Event] = {}
seen: dict[str, object] = {}


def count(name):
    runs[name] = runs.get(name, 0) + 1


def gate(name):
    return gates.setdefault(name, asyncio.Event())


def release(name):
    gate(name).set()


echo = define_tool(
    name="echo",
    description="Echo the arguments back (inline handler).",
    args_schema={"type": "object"},
    handler=lambda args: {"inline": args},
)


@define_tool
def add(a: int, b: int) -> int:
    """Add two integers (sync)."""
    return a + b


@define_tool
async def wait_for(gate_name: str) -> dict:
    """Wait until the test opens the named gate (async)."""
    count("wait_for")
    await gate(gate_name).wait()
    return {"opened": gate_name}


@define_tool
def dom_node() -> object:
    """Return a DOM node (not JSON)."""
    return js.document.getElementById("target")


@define_tool
def js_function() -> object:
    """Return a JS function (not JSON)."""
    return js.Function.new("return 1")


@define_tool
def no_selection() -> dict:
    """A domain failure, returned as a structured error."""
    return {"error": {"code": "NO_SELECTION", "message": "There is no active editor selection.",
                      "details": {"documentId": "doc-1"}}}


@define_tool
def boom() -> None:
    """Raise an unexpected exception."""
    raise RuntimeError("kaboom")


declared_only = define_tool(
    name="declared_only",
    description="Declared, never implemented.",
    args_schema={"type": "object", "properties": {}, "required": []},
)

for tool in (echo, add, wait_for, dom_node, js_function, no_selection, boom, declared_only):
    session.add_tool(tool)
