"""The definition-time schema check agrees with jsonschema's own meta-schema check."""

from __future__ import annotations

from typing import Any

import pytest
from jsonschema import Draft202012Validator, SchemaError

from pedelec_pyodide.schemas import SchemaError as OurSchemaError
from pedelec_pyodide.schemas import check_schema
from pedelec_pyodide.text import json_path

VALID = [
    {}, True, False,
    {"type": "object", "properties": {"a": {"type": ["string", "null"]}}, "required": ["a"]},
    {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}},
    {"type": "array", "prefixItems": [{"type": "string"}], "minItems": 1, "uniqueItems": True},
    {"enum": [1, "a", None]}, {"const": {"x": 1}},
    {"anyOf": [{"type": "string"}, {"type": "number", "multipleOf": 0.5}]},
    {"type": "string", "pattern": "^[a-z]+$", "minLength": 1, "maxLength": 5, "format": "email"},
    {"$defs": {"p": {"type": "integer"}}, "properties": {"x": {"$ref": "#/$defs/p"}}},
    {"patternProperties": {"^x-": {"type": "string"}}, "additionalProperties": False},
    {"not": {"type": "null"}, "if": {"type": "string"}, "then": {"minLength": 1}},
    {"dependentRequired": {"a": ["b"]}, "dependentSchemas": {"a": {"required": ["c"]}}},
    {"title": "T", "description": "D", "default": 3, "examples": [1], "deprecated": False},
    {"x-vendor": {"anything": [1, 2]}},
]

INVALID = [
    {"type": "integr"}, {"type": []}, {"type": ["string", "string"]}, {"type": 5},
    {"properties": []}, {"properties": {"a": 5}}, {"required": "a"}, {"required": [1]},
    {"required": ["a", "a"]}, {"items": 3}, {"anyOf": []}, {"allOf": {}}, {"minLength": -1},
    {"minLength": 1.5}, {"maximum": "9"}, {"multipleOf": 0}, {"enum": "a"},
    {"pattern": 5}, {"patternProperties": {"a": 3}}, {"uniqueItems": "yes"},
    {"not": 3}, {"additionalProperties": "no"}, {"$defs": {"p": 1}}, {"title": 3},
    {"dependentRequired": {"a": "b"}}, {"examples": {}},
]


@pytest.mark.parametrize("schema", VALID)
def test_valid_schemas_pass_both(schema: Any) -> None:
    Draft202012Validator.check_schema(schema)
    check_schema(schema)


@pytest.mark.parametrize("schema", INVALID)
def test_invalid_schemas_fail_both(schema: Any) -> None:
    with pytest.raises(SchemaError):
        Draft202012Validator.check_schema(schema)
    with pytest.raises(OurSchemaError):
        check_schema(schema)


def test_invalid_regex_is_refused() -> None:
    with pytest.raises(OurSchemaError, match="regular expression"):
        check_schema({"pattern": "(unclosed"})


def test_json_paths() -> None:
    assert json_path([]) == "$"
    assert json_path(["a", 0, "b_c"]) == "$.a[0].b_c"
    assert json_path(["with space", "1x"]) == '$["with space"]["1x"]'


@pytest.mark.parametrize("schema", [
    {"$defs": {"a/b": {"type": "string"}}, "$ref": "#/$defs/a~1b"},
    {"$defs": {"a b": {"type": "string"}}, "$ref": "#/$defs/a%20b"},
    {"$defs": {"x": {"$anchor": "here", "type": "string"}}, "$ref": "#here"},
    {"prefixItems": [{"type": "string"}], "items": {"$ref": "#/prefixItems/0"}},
    {"$defs": {"n": {"type": "array", "items": {"$ref": "#/$defs/n"}}}, "$ref": "#/$defs/n"},
    # data that looks like a reference is not one
    {"const": {"$ref": "#/nothing"}}, {"default": {"$ref": "#nowhere"}, "type": "object"},
])
def test_local_references_that_resolve_pass(schema: Any) -> None:
    check_schema(schema)
    Draft202012Validator(schema).is_valid([])  # and jsonschema can apply them


@pytest.mark.parametrize(("schema", "said"), [
    ({"$ref": "#/$defs/missing"}, "$.$ref: '#/$defs/missing' points to nothing"),
    ({"properties": {"a": {"$ref": "#/properties/b"}}}, "$.properties.a.$ref"),
    ({"prefixItems": [{}], "items": {"$ref": "#/prefixItems/1"}}, "points to nothing"),
    ({"$ref": "#nowhere"}, "'#nowhere' names no $anchor"),
    ({"$ref": "#"}, "'#' leads back to itself"),
    ({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"allOf": [{"$ref": "#/$defs/a"}]}},
      "properties": {"x": {"$ref": "#/$defs/a"}}}, "leads back to itself"),
])
def test_a_local_reference_to_nothing_is_refused_where_it_is(schema: Any, said: str) -> None:
    """Else jsonschema raises (or recurses until it fails) on every call: found by
    probing, the error escaped dispatch."""
    with pytest.raises(OurSchemaError) as refused:
        check_schema(schema)
    assert said in str(refused.value)
