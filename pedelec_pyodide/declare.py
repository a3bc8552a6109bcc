"""Messages declared once: a JSON object with a ``type`` and a list of fields, from which
its parser, its encoder and its JSON Schema derive.

Shared by the page↔Core protocol (:mod:`pedelec_pyodide.protocol`) and the messages
between Core nodes (``core/cluster/messages.py``). What a field's kind accepts, how a
refusal is raised and the kinds only one side has stay with that side, passed in as
hooks. Pure Python: the page runtime (Pyodide) parses with it too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from . import strictjson


@dataclass(frozen=True)
class Field:
    """One field: its camelCase ``wire`` name, the ``attr`` that holds it, its ``kind``
    (each side's own set) and whether it must be there."""

    wire: str
    attr: str
    kind: str
    required: bool = True


class Declared:
    """Base of a declared message. Subclasses declare ``type``, ``fields`` and
    ``description``."""

    type: ClassVar[str]
    fields: ClassVar[tuple[Field, ...]]
    description: ClassVar[str]

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"type": self.type}
        for spec in self.fields:
            value = getattr(self, spec.attr)
            if value is None and not spec.required:
                continue
            wire[spec.wire] = value
        return wire

    def encode(self) -> str:
        return strictjson.encode(self.to_wire())


_M = TypeVar("_M", bound=Declared)
_ABSENT = object()


def build(cls: type[_M], data: dict[str, Any], check: Callable[[str, Any, Any], Any],
          missing: Callable[[str], Exception]) -> _M:
    """A ``cls`` from its wire object: each field's value through ``check(type, spec,
    value)``, which returns what to keep or raises; ``missing(message)`` is the error
    for a required field that is not there. An optional field's null is its absence."""
    name = cls.type
    values: dict[str, Any] = {}
    for spec in cls.fields:
        value = data.get(spec.wire, _ABSENT)
        if value is _ABSENT:
            if spec.required:
                raise missing(f"{name}: missing field {spec.wire!r}")
            continue
        if value is None and not spec.required:
            continue
        values[spec.attr] = check(name, spec, value)
    return cls(**values)


#: the JSON Schema of the kinds that mean the same on both sides (JSON's own types)
_KIND_SCHEMAS: dict[str, dict[str, Any]] = {
    "str": {"type": "string"},
    "bool": {"type": "boolean"},
    "int": {"type": "integer"},
    "number": {"type": "number"},
    "object": {"type": "object"},
    "array": {"type": "array"},
    "any": {},
}


def kind_schema(kind: str) -> dict[str, Any]:
    """The JSON Schema of a kind both sides share (a fresh dict: callers add to it)."""
    return dict(_KIND_SCHEMAS[kind])


def message_schema(cls: type[Declared],
                   field_schema: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
    """The JSON Schema of one message type, each field's from ``field_schema(spec)``."""
    properties: dict[str, Any] = {"type": {"const": cls.type}}
    required = ["type"]
    for spec in cls.fields:
        properties[spec.wire] = field_schema(spec)
        if spec.required:
            required.append(spec.wire)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": cls.type,
        "description": cls.description,
        "type": "object",
        "properties": properties,
        "required": required,
    }
