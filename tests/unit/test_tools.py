from __future__ import annotations

import dataclasses
import math
from typing import Annotated, Any, Literal, Optional, TypedDict

import pytest

from pedelec_pyodide import Session, Tool, ToolContext, define_tool, strictjson

COUNTER_SCHEMA = {
    "type": "object",
    "properties": {"delta": {"type": "integer"}},
    "required": ["delta"],
}


def test_explicit_form_metadata() -> None:
    tool = define_tool(
        name="update_counter",
        description="Change the counter.",
        args_schema=COUNTER_SCHEMA,
        handler=lambda args: {"value": args["delta"]},
    )
    assert isinstance(tool, Tool)
    assert tool.metadata() == {
        "name": "update_counter",
        "description": "Change the counter.",
        "argsSchema": COUNTER_SCHEMA,
    }


def test_explicit_form_without_handler_has_no_inline_handler() -> None:
    tool = define_tool(name="t", description="d", args_schema={"type": "object"})
    assert tool.handler is None
    with pytest.raises(TypeError, match="no handler"):
        tool()


def test_annotations_travel_only_when_given() -> None:
    plain = define_tool(name="a", description="d", args_schema={"type": "object"})
    assert "annotations" not in plain.metadata()
    hinted = define_tool(
        name="b", description="d", args_schema={"type": "object"},
        annotations={"readOnlyHint": True, "title": "B"},
    )
    assert hinted.metadata()["annotations"] == {"readOnlyHint": True, "title": "B"}
    assert hinted.resumable
    assert not plain.resumable


@pytest.mark.parametrize(
    ("annotations", "message"),
    [({"readOnly": True}, "unknown annotation 'readOnly'"),
     ({"idempotentHint": "yes"}, "must be bool")],
)
def test_bad_annotations_are_rejected(annotations: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        define_tool(name="a", description="d", args_schema={"type": "object"},
                    annotations=annotations)


@pytest.mark.parametrize("name", ["", "has space", "dot.name", "x" * 65, "émoji", 5, "a\n"])
def test_invalid_names_are_rejected(name: Any) -> None:
    with pytest.raises(ValueError, match=r"tool name .* is invalid"):
        define_tool(name=name, description="d", args_schema={"type": "object"})


@pytest.mark.parametrize("name", ["a", "A-b_9", "x" * 64])
def test_valid_names(name: str) -> None:
    assert define_tool(name=name, description="d", args_schema={"type": "object"}).name == name


@pytest.mark.parametrize("description", ["", "   ", 3])
def test_empty_description_is_rejected(description: Any) -> None:
    with pytest.raises(ValueError, match="description must be a non-empty string"):
        define_tool(name="t", description=description, args_schema={"type": "object"})


@pytest.mark.parametrize(
    ("schema", "where"),
    [
        ({"type": "object", "properties": {"delta": {"type": "integr"}}},
         r"\$\.properties\.delta\.type: 'integr' is not a JSON Schema type"),
        ({"type": "object", "required": "delta"}, r"\$\.required: must be an array of strings"),
        ({"type": "object", "properties": []}, r"\$\.properties: must be an object of schemas"),
        ({"type": "object", "properties": {"s": {"pattern": "("}}},
         r"\$\.properties\.s\.pattern: '\(' is not a valid regular expression"),
        ({"type": "object", "properties": {"n": {"minimum": "0"}}},
         r"\$\.properties\.n\.minimum: must be a number"),
        ({"type": "object", "anyOf": []}, r"\$\.anyOf: must be a non-empty array"),
        ({"type": "object", "$ref": "https://example.invalid/s.json"},
         r"only local references"),
    ],
)
def test_invalid_schemas_are_rejected_with_where(schema: dict[str, Any], where: str) -> None:
    with pytest.raises(ValueError, match=where):
        define_tool(name="t", description="d", args_schema=schema)


def test_args_schema_must_describe_an_object() -> None:
    with pytest.raises(ValueError, match="must describe an object"):
        define_tool(name="t", description="d", args_schema={"type": "string"})
    with pytest.raises(ValueError, match="must be a JSON Schema object"):
        define_tool(name="t", description="d", args_schema=[])  # type: ignore[call-overload]


def test_explicit_form_rules() -> None:
    with pytest.raises(ValueError, match="needs args_schema"):
        define_tool(name="t", description="d", handler=lambda: 1)  # type: ignore[call-overload]
    with pytest.raises(ValueError, match="needs name= and description="):
        define_tool(args_schema={"type": "object"})  # type: ignore[call-overload]


# --- the typed form ------------------------------------------------------------------------


def test_bare_decorator_derives_schema_and_description() -> None:
    @define_tool
    def update_counter(delta: int, note: str = "") -> dict[str, int]:
        """Change the counter by delta.

        Args:
            delta: how much to add (negative to subtract)
        """
        return {"value": delta}

    assert update_counter.name == "update_counter"
    assert update_counter.description == "Change the counter by delta."
    assert update_counter.args_schema == {
        "type": "object",
        "properties": {
            "delta": {"type": "integer", "description": "how much to add (negative to subtract)"},
            "note": {"type": "string", "default": ""},
        },
        "required": ["delta"],
        "additionalProperties": False,
    }
    assert update_counter(delta=2) == {"value": 2}  # still callable as the function


def test_decorator_with_name_and_description() -> None:
    @define_tool(name="add-numbers", description="Add two numbers.")
    def add(a: float, b: float = 0) -> float:
        return a + b

    assert add.metadata()["name"] == "add-numbers"
    assert add.metadata()["description"] == "Add two numbers."


class Point(TypedDict):
    x: int
    y: int


@dataclasses.dataclass
class Window:
    width: int
    title: str = "untitled"


@dataclasses.dataclass
class Size:
    width: int
    height: int = 1


def test_typed_annotations_map_to_json_schema() -> None:
    @define_tool
    def every(
        s: str, i: int, f: float, b: bool, maybe: Optional[int],  # noqa: UP045
        union: int | str, items: list[str], scores: dict[str, float],
        mode: Literal["fast", "slow"], point: Point, window: Window,
        note: Annotated[str, "a note"], anything: Any = None,
    ) -> None:
        """All the types."""

    props = every.args_schema["properties"]
    assert props["s"] == {"type": "string"}
    assert props["i"] == {"type": "integer"}
    assert props["f"] == {"type": "number"}
    assert props["b"] == {"type": "boolean"}
    assert props["maybe"] == {"anyOf": [{"type": "integer"}, {"type": "null"}]}
    assert props["union"] == {"anyOf": [{"type": "integer"}, {"type": "string"}]}
    assert props["items"] == {"type": "array", "items": {"type": "string"}}
    assert props["scores"] == {"type": "object", "additionalProperties": {"type": "number"}}
    assert props["mode"] == {"enum": ["fast", "slow"]}
    assert props["point"] == {
        "type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
        "required": ["x", "y"], "additionalProperties": False,
    }
    assert props["window"]["required"] == ["width"]
    assert props["note"] == {"type": "string", "description": "a note"}
    assert props["anything"] == {"default": None}
    assert "anything" not in every.args_schema["required"]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: define_tool(lambda x: x), "has no annotation"),
        (lambda: define_tool(_takes_set), "has no JSON Schema equivalent"),
        (lambda: define_tool(_takes_int_keys), "dict keys must be str"),
        (lambda: define_tool(_takes_varargs), "cannot be described"),
        (lambda: define_tool(_no_doc), "description must be a non-empty string"),
    ],
)
def test_typed_form_rejects_what_it_cannot_express(make: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


def _takes_set(values: set[int]) -> None:
    """Doc."""


def _takes_int_keys(values: dict[int, str]) -> None:
    """Doc."""


def _takes_varargs(*values: int) -> None:
    """Doc."""


def _no_doc(value: int) -> None:
    pass


async def test_typed_handler_gets_keyword_arguments_and_ctx() -> None:
    seen: dict[str, Any] = {}

    @define_tool
    def resize(size: Size, label: str = "x", ctx: ToolContext | None = None) -> int:
        """Resize."""
        seen["size"] = size
        seen["label"] = label
        seen["ctx"] = ctx
        return size.width * size.height

    assert "ctx" not in resize.args_schema["properties"]
    session = Session([resize])
    result = await session.dispatch("resize", {"size": {"width": 3, "height": 2}},
                                    tool_request_id="r1", turn_id="t1")
    assert result == 6
    assert seen["size"] == Size(3, 2)
    assert seen["label"] == "x"
    assert isinstance(seen["ctx"], ToolContext)
    assert seen["ctx"].tool_request_id == "r1"
    assert seen["ctx"].turn_id == "t1"


async def test_typed_handler_args_are_validated_against_the_derived_schema() -> None:
    @define_tool
    def add(a: int, b: int = 0) -> int:
        """Add."""
        return a + b

    session = Session([add])
    extra = await session.dispatch("add", {"a": 1, "c": 2})
    assert extra["error"]["code"] == "INVALID_ARGS"
    wrong = await session.dispatch("add", {"a": "1"})
    assert wrong["error"]["details"]["errors"] == [
        {"path": "$.a", "message": "'1' is not of type 'integer'"}
    ]


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_metadata_json_cannot_carry_is_refused_at_definition_naming_the_field(
        value: float) -> None:
    """It used to be sent, and Core refused the page's hello (FRAME_NOT_JSON)."""
    schema = {"type": "object", "properties": {"a": {"type": "number", "default": value}}}
    with pytest.raises(ValueError) as refused:
        define_tool(name="t", description="d", args_schema=schema, handler=lambda args: args)
    assert str(refused.value) == (
        "tool 't': $.args_schema.properties.a.default is a float, which JSON cannot "
        "represent (NaN and Infinity are not JSON)")


def test_a_typed_parameters_infinite_default_is_left_out_of_its_schema() -> None:
    @define_tool
    def find(limit: float = math.inf, least: float = 0.5) -> float:
        """Find."""
        return limit

    assert find.args_schema["properties"] == {
        "limit": {"type": "number"}, "least": {"type": "number", "default": 0.5}}
    strictjson.encode(find.metadata())  # a hello can carry it
    assert find() == math.inf  # the default still applies

@pytest.mark.parametrize("fields, where", [
    ({"description": "d\ud800"}, "$.description"),
    ({"args_schema": {"type": "object", "properties": {"a\udc00": {}}}},
     '$.args_schema.properties["a\\udc00"]'),
    ({"annotations": {"title": "\ud83d"}}, "$.annotations.title"),
])
def test_metadata_with_a_lone_surrogate_is_refused_naming_the_field(
        fields: dict[str, Any], where: str) -> None:
    options: dict[str, Any] = {"description": "d", "args_schema": {"type": "object"}, **fields}
    with pytest.raises(ValueError) as refused:
        define_tool(name="t", handler=lambda args: args, **options)
    assert str(refused.value) == (
        f"tool 't': a lone surrogate at {where}: text must be valid Unicode")
