"""JavaScript values returned by a handler, inside Pyodide (skipped in CPython)."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from pedelec_pyodide import Session

pytestmark = pytest.mark.skipif(sys.platform != "emscripten",
                                reason="JsProxy values exist only inside Pyodide")


def js_values() -> dict[str, Any]:
    import js  # type: ignore[import-not-found]

    return {
        "function": js.eval("(function answer() { return 42; })"),
        "object": js.eval("({a: 1})"),
        "array": js.eval("[1, 2]"),
        "typed array": js.Uint8Array.new(3),
        "map": js.Map.new(),
        "promise-free handle": js.eval("new (class Handle {})()"),
        "null-prototype object": js.eval("Object.create(null)"),  # no constructor to name
    }


@pytest.mark.parametrize(("kind", "js_class"), [
    ("function", "Function"), ("object", "Object"), ("array", "Array"),
    ("typed array", "Uint8Array"), ("map", "Map"), ("promise-free handle", "Handle"),
    ("null-prototype object", "object"),
])
async def test_a_jsproxy_result_is_invalid_and_named(kind: str, js_class: str) -> None:
    value = js_values()[kind]
    session = Session()
    session.on_tool("t", lambda: {"value": value})
    result = await session.dispatch("t", {})
    error = result["error"]
    assert error["code"] == "TOOL_RESULT_INVALID"
    assert error["details"]["path"] == "$.value"
    assert error["details"]["type"] == f"a JavaScript {js_class} (JsProxy)"
    assert error["message"] == (
        f"the result is not JSON-compatible: $.value is a JavaScript {js_class} (JsProxy), "
        "which is not a JSON type; convert it explicitly (value.to_py(), str(value), "
        "list(value))")


async def test_converted_js_values_are_fine() -> None:
    import js

    session = Session()
    session.on_tool("t", lambda: {"bytes": list(js.Uint8Array.new([1, 2, 3]).to_py()),
                                  "title": str(js.eval("'a title'"))})
    assert await session.dispatch("t", {}) == {"bytes": [1, 2, 3], "title": "a title"}
