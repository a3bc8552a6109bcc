"""Tool definitions: ``define_tool`` and ``Tool`` (the metadata rules are in ``metadata``)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, overload

from .context import ToolContext
from .metadata import (
    ANNOTATION_HINTS,
    NAME_PATTERN,
    check_annotations,
    check_args_schema,
    check_description,
    check_metadata,
    check_name,
    check_text,
)
from .schemas import ArgsValidator, compile_validator
from .signatures import Invoker, derive_signature

Handler = Callable[..., Any]
#: ``needs_approval``: always, never, or a function of the (validated) args
NeedsApproval = bool | Callable[[Any], bool]

__all__ = [
    "ANNOTATION_HINTS", "NAME_PATTERN", "NeedsApproval", "Tool", "check_metadata",
    "define_tool",
]


class Tool:
    """A tool: its metadata for the agent, and optionally its inline handler.

    A tool made by the typed form is also still callable as the function it decorates.
    """

    __slots__ = ("_function", "_invoker", "_validator", "annotations", "args_schema",
                 "description", "handler", "name", "needs_approval", "webmcp")

    def __init__(
        self,
        *,
        name: str,
        description: str,
        args_schema: dict[str, Any],
        handler: Handler | None = None,
        annotations: dict[str, Any] | None = None,
        invoker: Invoker | None = None,
        needs_approval: NeedsApproval = False,
        webmcp: bool = True,
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
        if not isinstance(needs_approval, bool) and not callable(needs_approval):
            raise ValueError(f"tool {name!r}: needs_approval must be a bool or a function "
                             f"of the args, got {type(needs_approval).__name__}")
        if not isinstance(webmcp, bool):
            raise ValueError(f"tool {name!r}: webmcp must be True or False, got "
                             f"{type(webmcp).__name__}")
        if inspect.iscoroutinefunction(needs_approval):  # its coroutine is never awaited
            raise ValueError(f"tool {name!r}: needs_approval must be a plain function "
                             "returning a bool, not an async one (it is asked before the "
                             "approver, in the same step)")
        self.name = name
        self.description = description
        self.args_schema = args_schema
        self.handler = handler
        self.annotations = dict(annotations) if annotations else None
        self._function = handler
        # What the session calls with (args, ctx), or the leading ones it declares.
        self._invoker: Invoker | None = invoker if invoker is not None else handler
        self._validator: ArgsValidator | None = None
        #: ask the user before each run (see ``Session.on_approval``)
        self.needs_approval = needs_approval
        #: offered to the browser's own agent on a page that opts in to WebMCP (not part
        #: of the metadata: Core gets the tool either way)
        self.webmcp = webmcp

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
    needs_approval: NeedsApproval = False,
    webmcp: bool = True,
) -> Callable[[Handler], Tool]: ...


@overload
def define_tool(
    *,
    name: str,
    description: str,
    args_schema: dict[str, Any],
    handler: Handler | None = None,
    annotations: dict[str, Any] | None = None,
    needs_approval: NeedsApproval = False,
    webmcp: bool = True,
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
    needs_approval: NeedsApproval = False,
    webmcp: bool = True,
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

    ``needs_approval=True`` (or a function of the validated args returning bool) makes
    every run wait for the user's approval (``Session.on_approval``, the page's
    ``approval`` event); a denial is the result ``TOOL_DENIED``.

    ``webmcp=False`` keeps the tool from the browser's own agent on a page that offers
    its tools on WebMCP (``data-webmcp``); Core's agent still gets it.
    """
    if args_schema is not None:
        if function is not None:
            raise TypeError("pass the handler as handler=, not positionally, with args_schema=")
        if name is None or description is None:
            raise ValueError("define_tool with args_schema= needs name= and description=")
        return Tool(name=name, description=description, args_schema=args_schema,
                    handler=handler, annotations=annotations, needs_approval=needs_approval,
                    webmcp=webmcp)
    if handler is not None:
        raise ValueError("handler= needs args_schema=; without one, use define_tool as a decorator")

    def typed(fn: Handler) -> Tool:
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
            needs_approval=needs_approval,
            webmcp=webmcp,
        )
        return tool

    if function is not None:
        return typed(function)
    return typed
