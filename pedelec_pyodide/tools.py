"""Tool definitions: ``define_tool``, ``Tool`` and the rules every tool's metadata obeys."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, overload

from .schemas import ArgsValidator, SchemaError, check_schema, compile_validator
from .signatures import Invoker, derive_signature
from .text import lone_surrogate_at, not_unicode, quote

NAME_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
ANNOTATION_HINTS: dict[str, type] = {
    "title": str,
    "readOnlyHint": bool,
    "idempotentHint": bool,
    "destructiveHint": bool,
    "openWorldHint": bool,
}

Handler = Callable[..., Any]


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
    """The metadata is valid Unicode text (a page would send U+FFFD for a lone surrogate)."""
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


class Tool:
    """A tool: its metadata for the agent, and optionally its inline handler.

    A tool made by the typed form is also still callable as the function it decorates.
    """

    __slots__ = ("_function", "_invoker", "_validator", "annotations", "args_schema",
                 "description", "handler", "name")

    def __init__(
        self,
        *,
        name: str,
        description: str,
        args_schema: dict[str, Any],
        handler: Handler | None = None,
        annotations: dict[str, Any] | None = None,
        invoker: Invoker | None = None,
    ) -> None:
        check_name(name)
        check_description(name, description)
        check_args_schema(name, args_schema)
        if annotations is not None:
            check_annotations(name, annotations)
        check_text(name, {"description": description, "args_schema": args_schema,
                          "annotations": annotations})
        if handler is not None and not callable(handler):
            raise ValueError(f"tool {name!r}: handler must be callable")
        self.name = name
        self.description = description
        self.args_schema = args_schema
        self.handler = handler
        self.annotations = dict(annotations) if annotations else None
        self._function = handler
        # What the session calls with (args, ctx), or the leading ones it declares.
        self._invoker: Invoker | None = invoker if invoker is not None else handler
        self._validator: ArgsValidator | None = None

    def metadata(self) -> dict[str, Any]:
        """The JSON sent to Core: ``{"name", "description", "argsSchema"}`` (+ annotations)."""
        data: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "argsSchema": self.args_schema,
        }
        if self.annotations:
            data["annotations"] = dict(self.annotations)
        return data

    @property
    def resumable(self) -> bool:
        """Whether a run interrupted by a reload may safely run again."""
        hints = self.annotations or {}
        return bool(hints.get("readOnlyHint") or hints.get("idempotentHint"))

    def validate(self, args: Any) -> list[dict[str, str]]:
        """Errors in ``args`` against ``args_schema`` (empty when valid); validator built once."""
        validator = self._validator
        if validator is None:
            validator = self._validator = compile_validator(self.args_schema)
        return validator(args)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._function is None:
            raise TypeError(
                f"tool {self.name!r} has no handler to call; with args_schema=, define_tool "
                "is not a decorator: pass handler=..."
            )
        return self._function(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<Tool {self.name!r}>"


@overload
def define_tool(function: Handler, /) -> Tool: ...


@overload
def define_tool(
    *,
    name: str | None = None,
    description: str | None = None,
    args_schema: None = None,
    handler: None = None,
    annotations: dict[str, Any] | None = None,
) -> Callable[[Handler], Tool]: ...


@overload
def define_tool(
    *,
    name: str,
    description: str,
    args_schema: dict[str, Any],
    handler: Handler | None = None,
    annotations: dict[str, Any] | None = None,
) -> Tool: ...


def define_tool(
    function: Handler | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    args_schema: dict[str, Any] | None = None,
    handler: Handler | None = None,
    annotations: dict[str, Any] | None = None,
) -> Tool | Callable[[Handler], Tool]:
    """Define a tool.

    Explicit form (mirrors the JS ``defineTool``)::

        define_tool(name=..., description=..., args_schema={...}, handler=fn)

    ``handler(args, ctx)`` may declare fewer parameters. Typed form, with no
    ``args_schema``: the schema comes from the annotated parameters and the handler is
    called with keyword arguments (plus ``ctx`` if a parameter is annotated
    ``ToolContext``)::

        @define_tool
        def update_counter(delta: int) -> dict: ...

        @define_tool(name="add", description="Add two numbers.")
        def add(a: float, b: float = 0) -> float: ...
    """
    if args_schema is not None:
        if function is not None:
            raise TypeError("pass the handler as handler=, not positionally, with args_schema=")
        if name is None or description is None:
            raise ValueError("define_tool with args_schema= needs name= and description=")
        return Tool(name=name, description=description, args_schema=args_schema,
                    handler=handler, annotations=annotations)
    if handler is not None:
        raise ValueError("handler= needs args_schema=; without one, use define_tool as a decorator")

    def typed(fn: Handler) -> Tool:
        from .session import ToolContext

        if not callable(fn):
            raise TypeError(f"define_tool decorates a function, got {type(fn).__name__}")
        signature = derive_signature(fn, ToolContext)
        tool_name = name if name is not None else getattr(fn, "__name__", "")
        tool = Tool(
            name=tool_name,
            description=description if description is not None else signature.description,
            args_schema=signature.args_schema,
            handler=fn,
            annotations=annotations,
            invoker=signature.invoker(fn),
        )
        return tool

    if function is not None:
        return typed(function)
    return typed
