"""The page's tools under plain pytest: no browser, no Core."""

import asyncio
import sys
from types import SimpleNamespace

import app_tools

from pedelec_pyodide import Session


def test_update_counter(monkeypatch):
    counter = SimpleNamespace(textContent="0")
    document = SimpleNamespace(getElementById={"counter": counter}.__getitem__)
    monkeypatch.setitem(sys.modules, "js", SimpleNamespace(document=document))
    session = Session()
    app_tools.register(session)

    assert asyncio.run(session.dispatch("update_counter", {"delta": 2})) == {"value": 2}
    assert counter.textContent == "2"
    refused = asyncio.run(session.dispatch("update_counter", {"delta": "x"}))
    assert refused["error"]["code"] == "INVALID_ARGS"
