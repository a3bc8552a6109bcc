"""JSON Schema: the definition-time check, and args validators built once per tool.

``check_schema`` is a structural check of a schema against the draft 2020-12 meta-schema's
rules for each keyword's value, written out here so that defining a tool does not import
jsonschema: that import costs ~450 ms in the page and must stay off the path to "ready".
The validator itself (jsonschema) is built on first use and kept for the tool's lifetime.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from typing import Any

from .text import excerpt, json_path, quote

JSON_TYPES = ("null", "boolean", "object", "array", "number", "string", "integer")

# Keywords whose value is a schema, a map of schemas, or a non-empty array of schemas.
_SCHEMA_KEYWORDS = (
    "additionalProperties", "items", "contains", "propertyNames", "not", "if", "then", "else",
    "unevaluatedItems", "unevaluatedProperties", "additionalItems", "contentSchema",
)
_SCHEMA_MAP_KEYWORDS = ("properties", "patternProperties", "$defs", "definitions",
                        "dependentSchemas")
_SCHEMA_ARRAY_KEYWORDS = ("allOf", "anyOf", "oneOf", "prefixItems")
_COUNT_KEYWORDS = ("maxLength", "minLength", "maxItems", "minItems", "maxProperties",
                   "minProperties", "minContains", "maxContains")
_NUMBER_KEYWORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_STRING_KEYWORDS = ("$id", "$schema", "$anchor", "$dynamicAnchor", "$dynamicRef", "$comment",
                    "title", "description", "format", "contentEncoding", "contentMediaType")
_BOOL_KEYWORDS = ("uniqueItems", "readOnly", "writeOnly", "deprecated")


class SchemaError(ValueError):
    """A schema that is not valid JSON Schema; the message names where and why."""


def check_schema(schema: Any, where: str = "$") -> None:
    """Raise :class:`SchemaError` if ``schema`` is not a valid JSON Schema, or if one of
    its local ``$ref``s points to nothing (else every call would fail on it)."""
    found = _Found(where)
    _check(schema, where, found)
    _check_references(schema, where, found)


class _Found:
    """What the walk over a schema's subschemas met: references, anchors, nested ``$id``s
    (only in schema positions: a ``{"$ref": ...}`` inside ``const`` is data)."""

    __slots__ = ("anchors", "nested_id", "refs", "root")

    def __init__(self, root: str) -> None:
        self.root = root  # where the schema itself is
        self.refs: list[tuple[str, str]] = []  # (reference, where)
        self.anchors: set[str] = set()
        self.nested_id = False


def _check(schema: Any, where: str, found: _Found) -> None:
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise SchemaError(f"{where}: a schema must be an object or a boolean, got {_kind(schema)}")
    for key in schema:
        if not isinstance(key, str):
            raise SchemaError(f"{where}: keys must be strings, got {quote(key)}")
    if "$id" in schema and where != found.root:
        found.nested_id = True
    for keyword, value in schema.items():
        _check_keyword(keyword, value, f"{where}.{excerpt(keyword)}", found)


def _check_keyword(keyword: str, value: Any, where: str, found: _Found) -> None:
    if keyword == "type":
        _check_type(value, where)
    elif keyword in _SCHEMA_KEYWORDS:
        if keyword in ("items", "additionalItems") and isinstance(value, list):
            _check_schema_array(value, where, found)  # draft 7 tuple form
        else:
            _check(value, where, found)
    elif keyword in _SCHEMA_MAP_KEYWORDS:
        if not isinstance(value, dict):
            raise SchemaError(f"{where}: must be an object of schemas, got {_kind(value)}")
        for name, sub in value.items():
            if keyword == "patternProperties":
                _check_regex(name, f"{where}[{quote(name)}]")
            _check(sub, f"{where}.{excerpt(name)}", found)
    elif keyword in _SCHEMA_ARRAY_KEYWORDS:
        _check_schema_array(value, where, found)
    elif keyword in _COUNT_KEYWORDS:
        if not _is_int(value) or value < 0:
            raise SchemaError(f"{where}: must be a non-negative integer, got {quote(value)}")
    elif keyword in _NUMBER_KEYWORDS:
        if not _is_number(value):
            raise SchemaError(f"{where}: must be a number, got {quote(value)}")
    elif keyword == "multipleOf":
        if not _is_number(value) or value <= 0:
            raise SchemaError(f"{where}: must be a number greater than 0, got {quote(value)}")
    elif keyword == "required":
        _check_string_set(value, where)
    elif keyword == "dependentRequired":
        if not isinstance(value, dict):
            raise SchemaError(f"{where}: must be an object, got {_kind(value)}")
        for name, names in value.items():
            _check_string_set(names, f"{where}.{excerpt(name)}")
    elif keyword == "enum" or keyword == "examples":
        if not isinstance(value, list):
            raise SchemaError(f"{where}: must be an array, got {_kind(value)}")
    elif keyword == "pattern":
        if not isinstance(value, str):
            raise SchemaError(f"{where}: must be a string, got {_kind(value)}")
        _check_regex(value, where)
    elif keyword == "$ref":
        if not isinstance(value, str):
            raise SchemaError(f"{where}: must be a string, got {_kind(value)}")
        if not value.startswith("#"):
            # A remote reference would make the validator fetch a URL: never do that.
            raise SchemaError(
                f"{where}: only local references ('#...') are allowed, got {quote(value)}")
        found.refs.append((value, where))
    elif keyword in _STRING_KEYWORDS:
        if not isinstance(value, str):
            raise SchemaError(f"{where}: must be a string, got {_kind(value)}")
        if keyword in ("$anchor", "$dynamicAnchor"):
            found.anchors.add(value)
    elif keyword in _BOOL_KEYWORDS and not isinstance(value, bool):
        raise SchemaError(f"{where}: must be a boolean, got {_kind(value)}")
    # Any other keyword (const, default, vendor extensions) may hold any value.


def _check_references(root: Any, where: str, found: _Found) -> None:
    """Each ``#/json/pointer`` resolves in ``root``, each ``#name`` names an ``$anchor``.
    Skipped when a subschema has its own ``$id`` (its references resolve against it)."""
    if found.nested_id:
        return
    refs = found.refs
    for ref, at in refs:
        fragment = _unquote(ref[1:])
        if fragment and not fragment.startswith("/"):
            if fragment not in found.anchors:
                raise SchemaError(f"{at}: {quote(ref)} names no $anchor in this schema")
        elif _resolve(root, fragment) is _NOWHERE:
            raise SchemaError(f"{at}: {quote(ref)} points to nothing in this schema")
    _check_no_loop(root, [ref for ref, _ in refs if ref == "#" or ref.startswith("#/")], where)


# keywords that apply a subschema to the same instance: a $ref cycle through only these
# never reaches a smaller part of the args, and the validator recurses until it fails
_SAME_INSTANCE = ("allOf", "anyOf", "oneOf", "not", "if", "then", "else", "dependentSchemas")


def _same_instance_refs(schema: Any) -> list[str]:
    """The local pointer ``$ref``s applied to the same instance as ``schema``."""
    found: list[str] = []
    pending = [schema]
    while pending:
        node = pending.pop()
        if not isinstance(node, dict):
            continue
        ref = node.get("$ref")
        if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):
            found.append(ref)
        for keyword in _SAME_INSTANCE:
            value = node.get(keyword)
            if isinstance(value, list):
                pending.extend(value)
            elif isinstance(value, dict):
                pending.extend(value.values() if keyword == "dependentSchemas" else [value])
    return found


def _check_no_loop(root: Any, pointers: list[str], where: str) -> None:
    """No pointer leads back to itself through same-instance keywords only."""
    for start in set(pointers):
        seen: set[str] = set()
        frontier = [start]
        while frontier:
            for ref in _same_instance_refs(_resolve(root, _unquote(frontier.pop()[1:]))):
                if ref == start:
                    raise SchemaError(f"{where}: {quote(start)} leads back to itself without "
                                      "descending into the arguments: validation would never end")
                if ref not in seen:
                    seen.add(ref)
                    frontier.append(ref)


def _unquote(text: str) -> str:
    """Percent-decoding, without urllib.parse (it imports ipaddress: ~50 ms in the page)."""
    if "%" not in text:
        return text
    raw = re.sub(rb"%([0-9A-Fa-f]{2})", lambda m: bytes([int(m.group(1), 16)]), text.encode())
    return raw.decode("utf-8", "replace")


_NOWHERE = object()


def _resolve(root: Any, pointer: str) -> Any:
    """The node a JSON pointer names in ``root``, or ``_NOWHERE``."""
    node = root
    for token in pointer.split("/")[1:]:
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return _NOWHERE
    return node


def _check_type(value: Any, where: str) -> None:
    names = value if isinstance(value, list) else [value]
    if isinstance(value, list) and (not value or len(set(map(repr, value))) != len(value)):
        raise SchemaError(f"{where}: must be a non-empty array of distinct type names")
    for name in names:
        if name not in JSON_TYPES:
            raise SchemaError(
                f"{where}: {quote(name)} is not a JSON Schema type (one of {', '.join(JSON_TYPES)})"
            )


def _check_schema_array(value: Any, where: str, found: _Found) -> None:
    if not isinstance(value, list) or not value:
        raise SchemaError(f"{where}: must be a non-empty array of schemas")
    for index, sub in enumerate(value):
        _check(sub, f"{where}[{index}]", found)


def _check_string_set(value: Any, where: str) -> None:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise SchemaError(f"{where}: must be an array of strings, got {quote(value)}")
    if len(set(value)) != len(value):
        raise SchemaError(f"{where}: must not repeat a name, got {quote(value)}")


def _check_regex(pattern: str, where: str) -> None:
    try:
        re.compile(pattern)
    except re.error as exc:
        raise SchemaError(
            f"{where}: {quote(pattern)} is not a valid regular expression ({exc})"
        ) from None


def _is_int(value: Any) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool)) or (
        isinstance(value, float) and value.is_integer()
    )


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _kind(value: Any) -> str:
    return type(value).__name__


# --- validation --------------------------------------------------------------------------

ArgsValidator = Callable[[Any], list[dict[str, str]]]


def compile_validator(schema: dict[str, Any]) -> ArgsValidator:
    """A function returning the list of errors in ``args`` (empty when they are valid)."""
    from jsonschema.validators import (  # type: ignore[import-untyped]
        Draft202012Validator,
        validator_for,
    )

    validator = validator_for(schema, default=Draft202012Validator)(schema)

    def errors(args: Any) -> list[dict[str, str]]:
        # jsonschema's messages quote the offending value: clipped, so that the error
        # result of a huge argument stays small (else its frame is over the limit)
        found = [
            {"path": excerpt(json_path(error.absolute_path)), "message": excerpt(error.message)}
            for error in itertools.islice(validator.iter_errors(args), MAX_ARGS_ERRORS)
        ]
        found.sort(key=lambda error: error["path"])
        return found

    return errors


MAX_ARGS_ERRORS = 20
