"""Tool results: the JSON-compatibility check, error results and :class:`ToolError`."""

from __future__ import annotations

import json
import math
from typing import Any

from . import strictjson
from .errors import PedelecError
from .text import excerpt, json_path, lone_surrogate_in_json, not_unicode

DEFAULT_MAX_RESULT_BYTES = 1024 * 1024

# Error codes the runtime produces itself. Handlers may use any code of their own.
INVALID_ARGS = "INVALID_ARGS"
TOOL_HANDLER_ERROR = "TOOL_HANDLER_ERROR"
TOOL_HANDLER_NOT_FOUND = "TOOL_HANDLER_NOT_FOUND"
TOOL_RESULT_INVALID = "TOOL_RESULT_INVALID"
TOOL_RESULT_TOO_LARGE = "TOOL_RESULT_TOO_LARGE"
TOOL_CANCELLED = "TOOL_CANCELLED"
TOOL_DENIED = "TOOL_DENIED"
TOOL_TIMEOUT = "TOOL_TIMEOUT"
TOOL_OUTCOME_UNKNOWN = "TOOL_OUTCOME_UNKNOWN"
#: a request refused because too many are in flight: Core's per session, the page's
#: WebMCP calls
TOO_MANY_PENDING = "TOO_MANY_PENDING"
#: that bound's default, the same on both sides (Core's ``--max-pending``)
DEFAULT_MAX_PENDING = 64

#: ``retryable`` of the codes whose meaning fixes it, when the caller does not say: a
#: handler's ``ToolError(TOOL_CANCELLED, ...)`` reads as the runtime's own cancel does
RETRYABLE_BY_CODE: dict[str, bool] = {
    INVALID_ARGS: True,
    TOOL_TIMEOUT: True,
    TOOL_CANCELLED: False,
    TOOL_DENIED: False,
    TOOL_OUTCOME_UNKNOWN: False,
}


def tool_error(
    code: str, message: str, *, details: Any = None, retryable: bool | None = None
) -> dict[str, Any]:
    """``{"error": {"code", "message", "details"?, "retryable"?}}``, the uniform error shape.
    Without ``retryable``, a code of :data:`RETRYABLE_BY_CODE` gets its own."""
    if not isinstance(code, str) or not code:
        raise ValueError(f"an error code must be a non-empty string, got {code!r}")
    if not isinstance(message, str):
        raise ValueError(f"an error message must be a string, got {type(message).__name__}")
    error: dict[str, Any] = {"code": code, "message": message}
    if details is not None:
        error["details"] = details
    if retryable is None:
        retryable = RETRYABLE_BY_CODE.get(code)
    if retryable is not None:
        error["retryable"] = bool(retryable)
    return {"error": error}


def is_error_result(result: Any) -> bool:
    """Whether ``result`` is an error result, ``{"error": {...}}``: the one key ``error``,
    its value an object. ``{"error": null}`` or ``{"error": "text"}`` is a plain value a
    handler returned, like any other."""
    return isinstance(result, dict) and len(result) == 1 and isinstance(result.get("error"), dict)


def invalid_args(message: str, details: Any = None) -> dict[str, Any]:
    """The ``INVALID_ARGS`` error result: the agent may retry with better arguments."""
    return tool_error(INVALID_ARGS, message, details=details, retryable=True)


class ToolError(PedelecError):
    """Raise in a handler to return a structured error result instead of a crash."""

    def __init__(
        self, code: str, message: str, *, details: Any = None, retryable: bool | None = None
    ) -> None:
        super().__init__(message)
        self.result = tool_error(code, message, details=details, retryable=retryable)

    @property
    def code(self) -> str:
        code: str = self.result["error"]["code"]
        return code


class ResultError(PedelecError):
    """A handler's value that cannot be sent; ``result`` is the error result to send instead."""

    def __init__(self, result: dict[str, Any]) -> None:
        super().__init__(result["error"]["message"])
        self.result = result


_SCALARS = frozenset({str, int, float, bool, type(None)})


MAX_RESULT_DEPTH = 99  # a result sits one level inside its tool.result frame (100 deep)


def encode_result(value: Any, max_bytes: int = DEFAULT_MAX_RESULT_BYTES) -> tuple[Any, str]:
    """Check a handler's value and encode it: ``(value as Core will see it, JSON text)``.

    Accepts exactly what ``json.dumps(value, allow_nan=False)`` encodes with str keys, no
    cycles and at most ``MAX_RESULT_DEPTH`` levels of nesting; anything else raises
    :class:`ResultError` naming the JSON path and the type. The depth is checked before
    json's C encoder runs: in the page, its recursion ends in a fatal JS stack overflow
    rather than a RecursionError.
    """
    if _is_plain(value, MAX_RESULT_DEPTH):  # walked: a tree, not too deep
        try:
            text = strictjson.encode_tree(value)
        except ValueError:  # NaN or Infinity
            raise ResultError(_invalid(value)) from None
        wire = value
    else:
        try:
            problem = find_invalid(value)
            if problem is not None:
                raise ResultError(_describe(*problem))
            # Only tuples and subclasses of JSON types remain: encode, and decode what Core
            # sees.
            try:
                text = strictjson.encode(value)
            except (TypeError, ValueError):
                raise ResultError(_invalid(value)) from None
        except ResultError:
            raise
        except Exception as exc:  # a container whose own methods fail while it is read
            raise ResultError(_describe(
                "$", value, f"raised {type(exc).__name__} while it was read: {excerpt(str(exc))}",
            )) from None
        wire = json.loads(text)
    where = lone_surrogate_in_json(text, wire)
    if where is not None:  # no UTF-8 frame can carry it (a browser would mangle it)
        raise ResultError(tool_error(
            TOOL_RESULT_INVALID, f"the result is not valid Unicode text: {not_unicode(where)}",
            details={"path": where, "type": "a str"}))
    size = len(text) if text.isascii() else len(text.encode("utf-8"))
    if size > max_bytes:
        raise ResultError(
            tool_error(
                TOOL_RESULT_TOO_LARGE,
                f"the result is {size} bytes of JSON; the limit is {max_bytes}",
                details={"size": size, "limit": max_bytes},
            )
        )
    return wire, text


def _is_plain(value: Any, depth: int) -> bool:
    """Only exact JSON types, str keys and bounded nesting: what decoding gives back."""
    kind = type(value)
    if kind is dict:
        if depth <= 0:
            return False
        for key, item in value.items():  # loops, not all(...): this is the hot path
            if type(key) is not str or not _is_plain(item, depth - 1):
                return False
        return True
    if kind is list:
        if depth <= 0:
            return False
        for item in value:  # noqa: SIM110 - a loop is faster than all(...) here
            if not _is_plain(item, depth - 1):
                return False
        return True
    return kind in _SCALARS


def _invalid(value: Any) -> dict[str, Any]:
    problem = find_invalid(value)
    if problem is None:  # the encoder refused something the walk accepts: still refuse it
        problem = ("$", value, "cannot be encoded as JSON")
    return _describe(*problem)


def _describe(path: str, value: Any, why: str) -> dict[str, Any]:
    kind = describe_type(value)
    if _is_js_proxy(value):
        why += "; convert it explicitly (value.to_py(), str(value), list(value))"
    return tool_error(
        TOOL_RESULT_INVALID,
        f"the result is not JSON-compatible: {path} is {kind}, which {why}",
        details={"path": path, "type": kind},
    )


_EXIT = object()


def find_invalid(value: Any) -> tuple[str, Any, str] | None:
    """The first non-JSON part of ``value`` as ``(json path, value, why)``, or None."""
    # Depth-first; a container stays "open" until its exit marker is popped, so a value
    # that appears twice is fine and a container inside itself (a cycle) is not.
    stack: list[tuple[Any, list[Any]]] = [(value, [])]
    open_containers: set[int] = set()
    while stack:
        node, path = stack.pop()
        if node is _EXIT:
            open_containers.discard(path[0])
            continue
        if node is None or isinstance(node, (str, bool, int)):
            continue
        if isinstance(node, float):
            if not math.isfinite(node):
                why = "JSON cannot represent (NaN and Infinity are not JSON)"
                return json_path(path), node, why
            continue
        if not isinstance(node, (list, tuple, dict)):
            return json_path(path), node, "is not a JSON type"
        if id(node) in open_containers:
            return json_path(path), node, "contains itself (a cycle)"
        if len(path) >= MAX_RESULT_DEPTH:
            return json_path(path), node, f"nests deeper than {MAX_RESULT_DEPTH} levels"
        open_containers.add(id(node))
        stack.append((_EXIT, [id(node)]))
        if isinstance(node, dict):
            for key in node:
                if not isinstance(key, str):
                    return (
                        json_path([*path, str(key)]),
                        key,
                        "is not allowed as an object key (keys must be str)",
                    )
            children = [(child, [*path, key]) for key, child in node.items()]
        else:
            children = [(child, [*path, index]) for index, child in enumerate(node)]
        stack.extend(reversed(children))
    return None


def describe_type(value: Any) -> str:
    """The Python type of ``value`` for an error message; a JsProxy names its JS class."""
    cls = type(value)
    if _is_js_proxy(value):
        try:
            js_name = str(value.constructor.name)
        except Exception:
            js_name = "object"
        return f"a JavaScript {js_name} ({cls.__name__})"
    if cls.__module__ == "builtins":
        return f"a {cls.__qualname__}"
    return f"a {cls.__module__}.{cls.__qualname__}"


def _is_js_proxy(value: Any) -> bool:
    return type(value).__module__.startswith(("pyodide", "_pyodide"))
