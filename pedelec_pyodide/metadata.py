"""The rules every tool's metadata obeys, at definition time (``define_tool``) and on the
wire (``hello``, ``tools.update``, Core's store). Imports only the leaf modules ``schemas``,
``results`` and ``text``, so the protocol and Core can use the rules without the runtime."""

from __future__ import annotations

import re
from typing import Any

from .results import describe_type, find_invalid
from .schemas import SchemaError, check_schema
from .text import lone_surrogate_at, not_unicode, quote

NAME_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
ANNOTATION_HINTS: dict[str, type] = {
    "title": str,
    "readOnlyHint": bool,
    "idempotentHint": bool,
    "destructiveHint": bool,
    "openWorldHint": bool,
}

def check_name(name: Any) -> None:
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise ValueError(
            f"tool name {quote(name)} is invalid: use 1 to 64 letters, digits, '_' or '-'"
        )


def check_description(name: str, description: Any) -> None:
    if not isinstance(description, str) or not description.strip():
        raise ValueError(f"tool {name!r}: the description must be a non-empty string")


def check_args_schema(name: str, schema: Any) -> None:
    if not isinstance(schema, dict):
        raise ValueError(
            f"tool {name!r}: args_schema must be a JSON Schema object, got {type(schema).__name__}"
        )
    declared = schema.get("type", "object")
    if declared != "object" and not (isinstance(declared, list) and "object" in declared):
        raise ValueError(
            f"tool {name!r}: args_schema must describe an object (type 'object'), "
            f"got type {quote(declared)}"
        )
    try:
        check_schema(schema)
    except SchemaError as exc:
        raise ValueError(f"tool {name!r}: args_schema is not a valid JSON Schema: {exc}") from None


def check_annotations(name: str, annotations: Any) -> None:
    if not isinstance(annotations, dict):
        raise ValueError(f"tool {name!r}: annotations must be a dict")
    for key, value in annotations.items():
        expected = ANNOTATION_HINTS.get(key)
        if expected is None:
            raise ValueError(
                f"tool {name!r}: unknown annotation {quote(key)} "
                f"(known: {', '.join(ANNOTATION_HINTS)})"
            )
        if not isinstance(value, expected):
            raise ValueError(
                f"tool {name!r}: annotation {key!r} must be {expected.__name__}, "
                f"got {quote(value)}"
            )


def check_text(name: str, fields: dict[str, Any]) -> None:
    """The metadata is JSON (NaN in a schema: no frame can carry it) of valid Unicode text
    (a page would send U+FFFD for a lone surrogate)."""
    problem = find_invalid(fields)
    if problem is not None:
        path, value, why = problem
        raise ValueError(f"tool {name!r}: {path} is {describe_type(value)}, which {why}")
    where = lone_surrogate_at(fields)
    if where is not None:
        raise ValueError(f"tool {name!r}: {not_unicode(where)}")


def check_metadata(metadata: Any) -> None:
    """Tool metadata as it travels on the wire, checked by the same rules as define_tool."""
    if not isinstance(metadata, dict):
        raise ValueError(f"tool metadata must be an object, got {type(metadata).__name__}")
    name = metadata.get("name")
    check_name(name)
    assert isinstance(name, str)
    check_description(name, metadata.get("description"))
    if "argsSchema" not in metadata:
        raise ValueError(f"tool {name!r}: missing argsSchema")
    check_args_schema(name, metadata["argsSchema"])
    if "annotations" in metadata:
        check_annotations(name, metadata["annotations"])
