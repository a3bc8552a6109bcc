"""How handlers are called: leading-parameter adaptation, and the typed form's schema.

Handlers are called like the JS ones (``handler(args, ctx)``, fallback
``handler(tool, args, ctx)``) and may declare fewer parameters: they receive the leading
ones. A typed tool (``@define_tool`` with no ``args_schema``) is instead called with keyword
arguments, its JSON Schema derived here from the annotations, once, at definition time.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Union

Invoker = Callable[..., Any]


def positional_arity(fn: Callable[..., Any]) -> int | None:
    """How many leading positional arguments ``fn`` accepts; None means any number."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins without a signature: give them everything
        return None
    count = 0
    for parameter in signature.parameters.values():
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            return None
        if parameter.kind in (
            inspect.Parameter.POSITIONAL_ONLY,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
        ):
            count += 1
    return count


def leading_arity(fn: Callable[..., Any], available: int) -> int:
    """How many of the ``available`` leading arguments to pass ``fn``."""
    if not callable(fn):
        raise TypeError(f"a handler must be callable, got {type(fn).__name__}")
    arity = positional_arity(fn)
    return available if arity is None else min(arity, available)


# --- the typed form ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TypedSignature:
    """What the typed form derived from a function: its schema and how to call it."""

    args_schema: dict[str, Any]
    description: str
    context_parameter: str | None
    converters: dict[str, Callable[[Any], Any]]

    def invoker(self, fn: Callable[..., Any]) -> Invoker:
        context = self.context_parameter
        converters = self.converters

        def keywords(args: dict[str, Any], ctx: Any) -> dict[str, Any]:
            kwargs = dict(args)
            for name, convert in converters.items():
                if name in kwargs:
                    kwargs[name] = convert(kwargs[name])
            if context is not None:
                kwargs[context] = ctx
            return kwargs

        def call(args: dict[str, Any], ctx: Any) -> Any:
            return fn(**keywords(args, ctx))

        # An async function gets an async invoker, so the session can see that calling it
        # runs none of the function's body (see the delivery ledger in session.py).
        async def call_async(args: dict[str, Any], ctx: Any) -> Any:
            return await fn(**keywords(args, ctx))

        return call_async if inspect.iscoroutinefunction(fn) else call


def derive_signature(fn: Callable[..., Any], context_type: type) -> TypedSignature:
    """The args schema of a typed handler, or a ValueError naming what cannot be expressed."""
    where = getattr(fn, "__qualname__", repr(fn))
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception as exc:
        raise ValueError(f"{where}: cannot resolve the annotations ({exc})") from None
    docs = _docstring_params(inspect.getdoc(fn) or "")
    properties: dict[str, Any] = {}
    required: list[str] = []
    converters: dict[str, Callable[[Any], Any]] = {}
    context_parameter: str | None = None
    for name, parameter in inspect.signature(fn).parameters.items():
        if parameter.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            raise ValueError(f"{where}: *{name} cannot be described by a JSON Schema")
        if parameter.kind is inspect.Parameter.POSITIONAL_ONLY:
            raise ValueError(f"{where}: parameter {name!r} is positional-only")
        if name not in hints:
            raise ValueError(
                f"{where}: parameter {name!r} has no annotation; the typed form needs one "
                "for every parameter (or pass args_schema=)"
            )
        hint = hints[name]
        if hint is context_type or context_type in typing.get_args(hint):
            context_parameter = name
            continue
        schema, convert = _schema_for(hint, f"{where}: parameter {name!r}")
        if name in docs:
            schema = {**schema, "description": docs[name]}
        if parameter.default is inspect.Parameter.empty:
            required.append(name)
        else:
            default = parameter.default
            # an infinite (or NaN) default has no JSON form: left out, it still applies
            if default is None or isinstance(default, (str, int, bool)) or (
                    isinstance(default, float) and math.isfinite(default)):
                schema = {**schema, "default": default}
        properties[name] = schema
        if convert is not None:
            converters[name] = convert
    args_schema: dict[str, Any] = {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }
    return TypedSignature(args_schema, _summary(inspect.getdoc(fn) or ""), context_parameter,
                          converters)


_SIMPLE: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}


def _schema_for(hint: Any, where: str) -> tuple[dict[str, Any], Callable[[Any], Any] | None]:
    """A JSON Schema for an annotation, and a converter when the handler wants a richer type."""
    origin = typing.get_origin(hint)
    arguments = typing.get_args(hint)
    if origin is typing.Annotated:
        schema, convert = _schema_for(arguments[0], where)
        notes = [note for note in arguments[1:] if isinstance(note, str)]
        if notes:
            schema = {**schema, "description": " ".join(notes)}
        return schema, convert
    if hint in _SIMPLE:
        return {"type": _SIMPLE[hint]}, None
    if hint is Any:
        return {}, None
    if hint is None or hint is type(None):
        return {"type": "null"}, None
    if origin is Literal:
        if not all(isinstance(value, (str, int, bool)) or value is None for value in arguments):
            raise ValueError(f"{where}: Literal values must be str, int, bool or None")
        return {"enum": list(arguments)}, None
    if origin in (Union, types.UnionType):
        options = [_schema_for(argument, where) for argument in arguments]
        if any(convert is not None for _, convert in options):
            raise ValueError(f"{where}: a union of dataclasses cannot be converted")
        return {"anyOf": [schema for schema, _ in options]}, None
    if origin in (list, Sequence) or hint is list:
        if not arguments:
            return {"type": "array"}, None
        item, convert = _schema_for(arguments[0], where)
        return {"type": "array", "items": item}, (
            None if convert is None else _each_item(convert)
        )
    if origin in (dict, Mapping) or hint is dict:
        if not arguments:
            return {"type": "object"}, None
        if arguments[0] is not str:
            raise ValueError(f"{where}: dict keys must be str in JSON, got {arguments[0]!r}")
        value, convert = _schema_for(arguments[1], where)
        return {"type": "object", "additionalProperties": value}, (
            None if convert is None else _each_value(convert)
        )
    if typing.is_typeddict(hint):
        return _typeddict_schema(hint, where), None
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return _dataclass_schema(hint, where)
    raise ValueError(
        f"{where}: annotation {hint!r} has no JSON Schema equivalent (use str, int, float, "
        "bool, None, Literal, Optional/Union, list[T], dict[str, T], a TypedDict or a "
        "dataclass, or pass args_schema=)"
    )


def _each_item(convert: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda values: [convert(value) for value in values]


def _each_value(convert: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda mapping: {key: convert(value) for key, value in mapping.items()}


def _typeddict_schema(hint: Any, where: str) -> dict[str, Any]:
    properties = {}
    for name, annotation in typing.get_type_hints(hint, include_extras=True).items():
        schema, convert = _schema_for(annotation, f"{where} field {name!r}")
        if convert is not None:
            raise ValueError(f"{where}: a TypedDict field cannot hold a dataclass")
        properties[name] = schema
    return {
        "type": "object",
        "properties": properties,
        "required": sorted(hint.__required_keys__),
        "additionalProperties": False,
    }


def _dataclass_schema(hint: type, where: str) -> tuple[dict[str, Any], Callable[[Any], Any]]:
    hints = typing.get_type_hints(hint, include_extras=True)
    properties: dict[str, Any] = {}
    required: list[str] = []
    converters: dict[str, Callable[[Any], Any]] = {}
    for field in dataclasses.fields(hint):
        schema, convert = _schema_for(hints[field.name], f"{where} field {field.name!r}")
        properties[field.name] = schema
        if convert is not None:
            converters[field.name] = convert
        if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            required.append(field.name)

    def build(data: dict[str, Any]) -> Any:
        values = {k: (converters[k](v) if k in converters else v) for k, v in data.items()}
        return hint(**values)

    schema = {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }
    return schema, build


_PARAM_LINE = re.compile(r"^\s{2,}(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.+)$")


def _docstring_params(doc: str) -> dict[str, str]:
    """Parameter descriptions from a Google-style ``Args:`` section."""
    params: dict[str, str] = {}
    in_args = False
    current: str | None = None
    for line in doc.splitlines():
        stripped = line.strip()
        if stripped in ("Args:", "Arguments:", "Parameters:"):
            in_args, current = True, None
            continue
        if not in_args:
            continue
        if stripped and not line.startswith(" "):
            break  # the next section
        match = _PARAM_LINE.match(line)
        if match:
            current = match.group(1)
            params[current] = match.group(2).strip()
        elif current and stripped:
            params[current] += " " + stripped
    return params


def _summary(doc: str) -> str:
    """The docstring without its Args/Returns sections."""
    kept: list[str] = []
    for line in doc.splitlines():
        if line.strip() in ("Args:", "Arguments:", "Parameters:", "Returns:", "Raises:"):
            break
        kept.append(line)
    return "\n".join(kept).strip()
