"""My page's tools: run by the page (a src= block, then register(session)) and imported
by pytest (tests/test_app_tools.py). Nothing at import time needs the browser."""

from pedelec_pyodide import define_tool


def page():
    """The browser's globals (``js``); imported here, so pytest can import this module."""
    import js

    return js


@define_tool
def update_counter(delta: int) -> dict:
    """Add delta to the counter on the page; returns the new value."""
    counter = page().document.getElementById("counter")
    value = int(counter.textContent) + delta
    counter.textContent = str(value)
    return {"value": value}


TOOLS = (update_counter,)


def register(session):
    for tool in TOOLS:
        session.add_tool(tool)
