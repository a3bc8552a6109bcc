# The tools of tests/e2e/app/webmcp*.html, offered to the browser's agent (data-webmcp).
import asyncio

from pedelec_pyodide import ToolContext, define_tool


@define_tool(annotations={"title": "Add numbers", "readOnlyHint": True})
def add(a: int, b: int = 0) -> dict:
    """Add two integers."""
    return {"sum": a + b}


@define_tool(needs_approval=True, annotations={"destructiveHint": True})
def remove_note(note: str) -> dict:
    """Delete a note: asks the user first."""
    return {"removed": note}


@define_tool
def broken() -> dict:
    """Always fails."""
    raise RuntimeError("the notes store is gone")


@define_tool
async def polite(limit_ms: int, ctx: ToolContext) -> dict:
    """Wait until cancelled (ctx.cancelled), at most limit_ms."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while not ctx.cancelled and (loop.time() - start) * 1000 < limit_ms:
        await asyncio.sleep(0.02)
    return {"cancelled": ctx.cancelled}


@define_tool
async def stubborn() -> dict:
    """Runs until the end of time, never looking at ctx.cancelled."""
    await asyncio.Event().wait()
    return {}


@define_tool
async def pause(ms: int) -> dict:
    """Wait ms milliseconds."""
    await asyncio.sleep(ms / 1000)
    return {"paused": ms}


@define_tool(webmcp=False)
def secret() -> str:
    """Only Core's agent may call this."""
    return "core only"


TOOLS = (add, remove_note, broken, polite, stubborn, pause, secret)
