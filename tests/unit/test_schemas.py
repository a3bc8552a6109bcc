"""The definition-time schema check agrees with jsonschema's own meta-schema check."""

from __future__ import annotations

import importlib
import os
import re
import time
from typing import Any, Literal

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator, SchemaError

from pedelec_pyodide import Session, define_tool, schemas
from pedelec_pyodide.schemas import (
    MAX_ARGS_ERRORS,
    MAX_PATTERN_LENGTH,
    MAX_PATTERN_NESTING,
    PATTERN_CACHE,
    PatternCache,
    PatternsOverBudget,
    charging_patterns,
    check_schema,
)
from pedelec_pyodide.schemas import SchemaError as OurSchemaError
from pedelec_pyodide.text import MAX_EXCERPT, json_path

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


# --- the work is linear in the schema, whatever a page sends ------------------------------


class Counting(dict):  # type: ignore[type-arg]
    """A dict that counts every read of it: the check's work, independent of the clock."""

    reads = 0

    def __getitem__(self, key: Any) -> Any:
        Counting.reads += 1
        return super().__getitem__(key)

    def get(self, key: Any, default: Any = None) -> Any:
        Counting.reads += 1
        return super().get(key, default)

    def __contains__(self, key: Any) -> bool:
        Counting.reads += 1
        return super().__contains__(key)

    def items(self) -> Any:
        Counting.reads += 1
        return super().items()


def reads_to_check(schema: Any) -> int:
    Counting.reads = 0
    check_schema(schema)
    return Counting.reads


def ref_chain(n: int, *, loop: bool = False) -> dict[str, Any]:
    """``d0 -> d1 -> ... -> dn`` through allOf (the issue's 285 KiB hello at n ~ 6,000)."""
    defs = {f"d{i}": Counting(allOf=[Counting({"$ref": f"#/$defs/d{i + 1}"})]) for i in range(n)}
    defs[f"d{n}"] = Counting({"$ref": "#/$defs/d0"}) if loop else Counting(type="object")
    return Counting({"type": "object", "$defs": Counting(defs),
                     "allOf": [Counting({"$ref": "#/$defs/d0"})]})


def test_the_reference_check_is_linear_in_a_chain_of_references() -> None:
    """A walk from every pointer along the chain was quadratic: 38 s for one hello."""
    small, large = reads_to_check(ref_chain(200)), reads_to_check(ref_chain(800))
    assert large <= 5 * small, (small, large)  # 4x the chain; quadratic was ~16x


def test_a_loop_at_the_end_of_a_long_chain_is_found_and_named() -> None:
    with pytest.raises(OurSchemaError, match="leads back to itself") as refused:
        check_schema(ref_chain(3000, loop=True))
    assert "'#/$defs/d" in str(refused.value)


@pytest.mark.parametrize(("schema", "said"), [
    # a cycle entered through a subschema of a referenced one: the ref on the cycle is named
    ({"$defs": {"a": {"allOf": [{"$ref": "#/$defs/b"}]},
                "b": {"anyOf": [{"$ref": "#/$defs/a"}]}},
      "$ref": "#/$defs/a/allOf/0"}, "'#/$defs/"),
    # two spellings of one pointer are one subschema
    ({"$defs": {"a": {"allOf": [{"$ref": "#/%24defs/a"}]}}, "$ref": "#/$defs/a"},
     "'#/%24defs/a' leads back"),
    ({"$defs": {"a": {"not": {"$ref": "#"}}}, "$ref": "#/$defs/a"}, "leads back to itself"),
])
def test_loops_are_found_wherever_they_start(schema: Any, said: str) -> None:
    with pytest.raises(OurSchemaError, match="leads back to itself") as refused:
        check_schema(schema)
    assert said in str(refused.value)


def test_shared_references_that_descend_are_not_loops() -> None:
    # many pointers into one subschema, and a recursion through properties: all valid
    shared = {f"p{i}": {"$ref": "#/$defs/node"} for i in range(500)}
    node = {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}},
            "allOf": [{"$ref": "#/$defs/leaf"}]}
    schema = {"$defs": {"node": node, "leaf": {"type": "object"}}, "properties": shared}
    check_schema(schema)
    Draft202012Validator(schema).is_valid({"p1": {"next": {}}})


def test_a_long_key_is_not_copied_into_every_path_below_it() -> None:
    """Paths were text built at each node: a 500 KiB key over 100,000 subschemas made
    50 GB of copies. Now a path is made only for an error, its long keys cut short."""
    def seconds(size: int) -> float:
        schema = {"properties": {"k" * (200 * size): {"anyOf": [{}] * size}}}
        return min(_timed(lambda: check_schema(schema)) for _ in range(3))
    small, large = seconds(1000), seconds(4000)
    assert large <= 8 * small + 0.01, (small, large)  # 4x the input; quadratic was ~16x
    with pytest.raises(OurSchemaError) as refused:
        check_schema({"properties": {"k" * 100_000: {"anyOf": [{}, {"type": 1}]}}})
    assert len(str(refused.value)) < 2 * MAX_EXCERPT  # the key is quoted as an excerpt
    assert str(refused.value).startswith("$.properties.kkkk")


def _timed(work: Any) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def test_patterns_are_parsed_not_compiled() -> None:
    """Compiling is where re's cost explodes: (?i) over a wide range costs ~10 ms a class
    (112 s for a 20 KiB pattern). Parsing is linear; Core never runs a page's pattern."""
    def seconds(pattern: str) -> float:
        schema = {"properties": {f"p{i}": {"pattern": f"{pattern}{i}"} for i in range(40)}}
        return min(_timed(lambda: uncached(schema)) for _ in range(3))

    def uncached(schema: Any) -> None:
        PATTERN_CACHE.clear()
        check_schema(schema)
    wide = "(?i)" + "[\u0100-\uffff]" * 20
    plain = "a" * len(wide)
    assert seconds(wide) <= 10 * seconds(plain) + 0.01
    # parsed, so accepted: a look-behind of varying width (re compiles only fixed ones)
    check_schema({"pattern": "(?<=a+)b"})


FALLBACK_PATTERNS = ["^[a-z]+$", "(?i)[\u0100-\uffff]", "(a|b)*c{2,3}", "(?P<x>a)(?P=x)",
                     "(unclosed", "a)", "\\p{L}", "[z-a]", "*a", "(?P<x>a)(?P<x>b)"]


def _verdicts() -> list[str | None]:
    said: list[str | None] = []
    for pattern in FALLBACK_PATTERNS:
        PATTERN_CACHE.clear()
        try:
            check_schema({"pattern": pattern})
            said.append(None)
        except OurSchemaError as exc:
            said.append(str(exc))
    return said


def test_without_res_private_parser_re_compile_gives_the_same_verdicts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """re._parser is private: a Python without it (or with another one) falls back to
    re.compile, which refuses the same patterns with the same messages."""
    assert schemas._private_parser() is not None  # the fast path, where the tests run
    parsed = _verdicts()
    monkeypatch.setattr(schemas, "_parse_pattern", re.compile)
    assert _verdicts() == parsed
    assert parsed[0] is None and parsed[4] is not None
    # the one difference: what parses but cannot compile is refused at definition time
    PATTERN_CACHE.clear()
    with pytest.raises(OurSchemaError, match="look-behind requires fixed-width pattern"):
        check_schema({"pattern": "(?<=a+)b"})
    PATTERN_CACHE.clear()


def test_the_private_parser_is_not_used_when_it_is_not_there(
        monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.import_module

    def without_re_parser(name: str, package: str | None = None) -> Any:
        if name == "re._parser":
            raise ModuleNotFoundError(name)
        return real(name, package)
    monkeypatch.setattr(importlib, "import_module", without_re_parser)
    assert schemas._private_parser() is None

@pytest.mark.parametrize(("pattern", "said"), [
    ("a)" + "b" * 900, "is not a valid regular expression (unbalanced parenthesis"),
    ("(" * 51 + ")" * 51, f"nests groups deeper than {MAX_PATTERN_NESTING}"),
    ("(" * 450 + ")" * 450, f"nests groups deeper than {MAX_PATTERN_NESTING}"),
    ("a" * (MAX_PATTERN_LENGTH + 1), f"1001 characters; the limit is {MAX_PATTERN_LENGTH}"),
    ("\\p{L}", "is not a valid regular expression (bad escape"),
])
def test_patterns_too_long_or_too_deep_are_refused(pattern: str, said: str) -> None:
    for schema in ({"pattern": pattern}, {"patternProperties": {pattern: {}}}):
        with pytest.raises(OurSchemaError) as refused:
            check_schema(schema)
        assert said in str(refused.value)
        assert len(str(refused.value)) < 3 * MAX_EXCERPT  # the pattern, quoted in short


# --- what a refusal says: the path of the bad keyword, why, and the value in short --------

TYPES = "one of null, boolean, object, array, number, string, integer"


@pytest.mark.parametrize(("schema", "says"), [
    ({1: {}}, "$: keys must be strings, got 1"),
    ({"type": "integr"}, f"$.type: 'integr' is not a JSON Schema type ({TYPES})"),
    ({"type": []}, "$.type: must be a non-empty array of distinct type names"),
    ({"properties": []}, "$.properties: must be an object of schemas, got list"),
    ({"minLength": -1}, "$.minLength: must be a non-negative integer, got -1"),
    ({"maxItems": 1.5}, "$.maxItems: must be a non-negative integer, got 1.5"),
    ({"maximum": "9"}, "$.maximum: must be a number, got '9'"),
    ({"multipleOf": 0}, "$.multipleOf: must be a number greater than 0, got 0"),
    ({"required": [1]}, "$.required: must be an array of strings, got [1]"),
    ({"required": ["a", "a"]}, "$.required: must not repeat a name, got ['a', 'a']"),
    ({"dependentRequired": []}, "$.dependentRequired: must be an object, got list"),
    ({"dependentRequired": {"a": "b"}},
     "$.dependentRequired.a: must be an array of strings, got 'b'"),
    ({"enum": "a"}, "$.enum: must be an array, got str"),
    ({"pattern": 5}, "$.pattern: must be a string, got int"),
    ({"$ref": 5}, "$.$ref: must be a string, got int"),
    ({"$ref": "https://example.com/s.json"},
     "$.$ref: only local references ('#...') are allowed, got 'https://example.com/s.json'"),
    ({"title": 3}, "$.title: must be a string, got int"),
    ({"uniqueItems": "yes"}, "$.uniqueItems: must be a boolean, got str"),
    ({"anyOf": []}, "$.anyOf: must be a non-empty array of schemas"),
    ({"not": 3}, "$.not: a schema must be an object or a boolean, got int"),
    # draft 7's list form of items and additionalItems: each element is a schema
    ({"items": [{"type": "string"}, {"type": "nope"}]},
     f"$.items[1].type: 'nope' is not a JSON Schema type ({TYPES})"),
    ({"additionalItems": [{"minLength": -2}]},
     "$.additionalItems[0].minLength: must be a non-negative integer, got -2"),
    ({"items": [{"$ref": "#/$defs/gone"}]},
     "$.items[0].$ref: '#/$defs/gone' points to nothing in this schema"),
    ({"patternProperties": {"(": {}}},
     "$.patternProperties['(']: '(' is not a valid regular expression (missing ), "
     "unterminated subpattern at position 0)"),
])
def test_a_refusal_says_where_and_why(schema: Any, says: str) -> None:
    with pytest.raises(OurSchemaError) as refused:
        check_schema(schema)
    assert str(refused.value) == says


def test_count_keywords_may_be_zero() -> None:
    schema = {"minLength": 0, "maxLength": 0, "minItems": 0, "maxItems": 0,
              "minProperties": 0, "maxProperties": 0, "minContains": 0, "maxContains": 0}
    check_schema(schema)
    Draft202012Validator.check_schema(schema)


def test_a_pattern_of_exactly_the_limit_is_accepted_and_one_more_is_quoted_short() -> None:
    check_schema({"pattern": "a" * MAX_PATTERN_LENGTH})
    with pytest.raises(OurSchemaError) as refused:
        check_schema({"pattern": "b" * (MAX_PATTERN_LENGTH + 1)})
    assert str(refused.value) == (
        f"$.pattern: the regular expression {'b' * MAX_EXCERPT!r}… (801 more characters) "
        f"has 1001 characters; the limit is {MAX_PATTERN_LENGTH}")


@pytest.mark.parametrize("pattern", [
    "(" * MAX_PATTERN_NESTING + ")" * MAX_PATTERN_NESTING,  # exactly the limit
    "()" * 60, "(a)" * 60,  # many groups, none inside another
    r"\(" * 60 + "[(]" * 60 + "x",  # escaped and bracketed parentheses are not groups
])
def test_patterns_up_to_the_nesting_limit_are_accepted(pattern: str) -> None:
    check_schema({"pattern": pattern})


@pytest.mark.parametrize("pattern", [
    "(a" * 51 + ")" * 51,  # characters between the parentheses do not hide the depth
    "(" * 30 + ")" + "(" * 22 + ")" * 51,  # 51 deep after a group closed
])
def test_patterns_over_the_nesting_limit_are_refused_and_quoted(pattern: str) -> None:
    with pytest.raises(OurSchemaError) as refused:
        check_schema({"pattern": pattern})
    assert str(refused.value).startswith(f"$.pattern: the regular expression {pattern[:20]!r}"[:-1])
    assert str(refused.value).endswith(f" nests groups deeper than {MAX_PATTERN_NESTING}")


@pytest.mark.parametrize("schema", [
    # a root $id: the schema's own references are still checked
    {"$id": "urn:example:root", "$ref": "#/$defs/missing"},
    {"$id": "urn:example:root", "$defs": {"a": {"$ref": "#/$defs/b"}}},
])
def test_a_root_id_does_not_turn_off_the_reference_check(schema: Any) -> None:
    with pytest.raises(OurSchemaError, match="points to nothing"):
        check_schema(schema)


def test_a_nested_id_leaves_its_references_to_the_validator() -> None:
    # its references resolve against that $id, which this check does not follow
    check_schema({"$defs": {"a": {"$id": "urn:example:a", "$ref": "#/elsewhere"}}})


@pytest.mark.parametrize("schema", [
    {"$defs": {"x": {"$dynamicAnchor": "here", "type": "string"}}, "$ref": "#here"},
    # pointers: ~0 is "~", ~1 is "/", percent-escapes in either case, list indexes
    {"$defs": {"a~b": {"type": "string"}}, "$ref": "#/$defs/a~0b"},
    {"$defs": {"\u00e9t\u00e9": {"type": "string"}}, "allOf": [
        {"$ref": "#/$defs/%C3%A9t%C3%A9"}, {"$ref": "#/$defs/%c3%a9t%c3%a9"}]},
    {"prefixItems": [{"properties": {"a": {"type": "string"}}}],
     "items": {"$ref": "#/prefixItems/0/properties/a"}},
    # an anchor reference met while looking for loops is not a pointer to follow
    {"$defs": {"x": {"$anchor": "here"}, "y": {"allOf": [{"$ref": "#here"}]}},
     "allOf": [{"$ref": "#/$defs/y"}]},
])
def test_references_of_every_form_resolve(schema: Any) -> None:
    check_schema(schema)
    Draft202012Validator(schema).is_valid("text")  # and jsonschema can apply them


def test_a_pointer_with_bytes_that_are_not_utf8_points_to_nothing() -> None:
    with pytest.raises(OurSchemaError) as refused:
        check_schema({"$ref": "#/$defs/%FF"})
    assert str(refused.value) == "$.$ref: '#/$defs/%FF' points to nothing in this schema"


LOOP = "leads back to itself without descending into the arguments: validation would never end"


@pytest.mark.parametrize(("schema", "named"), [
    ({"$ref": "#"}, "#"),
    # a loop through dependentSchemas (a map of subschemas applied to the same object)
    ({"$defs": {"a": {"dependentSchemas": {"k": {"$ref": "#/$defs/a"}}}}, "$ref": "#/$defs/a"},
     "#/$defs/a"),
    # three references round: the first one met after where the walk entered is named
    ({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/c"},
                "c": {"$ref": "#/$defs/a"}}}, "#/$defs/c"),
    # a loop reached from outside it, through a reference that is not on it
    ({"$ref": "#/$defs/entry", "$defs": {"entry": {"allOf": [{"$ref": "#/$defs/a"}]},
                                         "a": {"not": {"$ref": "#/$defs/b"}},
                                         "b": {"not": {"$ref": "#/$defs/a"}}}}, "#/$defs/b"),
    # a loop after two spellings of one subschema that has none
    ({"$defs": {"a": {"allOf": [{"$ref": "#/$defs/b"}, {"$ref": "#/%24defs/b"}]}, "b": {},
                "c": {"not": {"$ref": "#/$defs/c"}}}}, "#/$defs/c"),
])
def test_a_loop_is_refused_naming_a_reference_on_it(schema: Any, named: str) -> None:
    with pytest.raises(OurSchemaError) as refused:
        check_schema(schema)
    assert str(refused.value) == f"$: '{named}' {LOOP}"


async def test_invalid_args_report_at_most_20_errors_each_in_short() -> None:
    """docs/reference/python-api.md: a huge or very wrong argument is not echoed back."""
    names = [f"p{i:02}" for i in range(30)]
    schema = {"type": "object", "properties": {name: {"type": "integer"} for name in names}}
    session = Session([define_tool(name="t", description="d", args_schema=schema,
                                   handler=lambda args: None)])
    result = await session.dispatch("t", {name: "x" * 5000 for name in names})
    errors = result["error"]["details"]["errors"]
    assert len(errors) == MAX_ARGS_ERRORS == 20
    assert all(len(e["path"]) <= 300 and len(e["message"]) <= 300 for e in errors)
    # jsonschema's "'xx...x' is not of type 'integer'", its first 200 characters
    assert errors[0]["message"].endswith("… (4827 more characters)")


# --- each distinct pattern parsed once, what is not cached charged to its sender ----------


def test_a_pattern_is_parsed_once_and_only_new_ones_are_charged() -> None:
    PATTERN_CACHE.clear()
    charged: list[int] = []
    schema = {"properties": {"a": {"pattern": "^a+$"}, "b": {"pattern": "^a+$"},
                             "c": {"pattern": "(x"}}}
    with charging_patterns(charged.append):
        with pytest.raises(OurSchemaError, match=r"\$\.properties\.c\.pattern: '\(x' is not"):
            check_schema(schema)
        assert charged == [4, 2]  # the second "^a+$" was known already
        with pytest.raises(OurSchemaError, match=r"\$\.properties\.c\.pattern: '\(x' is not"):
            check_schema(schema)  # the refusal is remembered too, where it is said afresh
        assert charged == [4, 2]
    check_schema({"pattern": "^b+$"})  # no charge set: nothing charged
    assert charged == [4, 2]


def test_a_refused_charge_stops_the_check_before_the_pattern_is_parsed() -> None:
    PATTERN_CACHE.clear()

    def refuse(characters: int) -> None:
        raise PatternsOverBudget(f"{characters} over")

    with charging_patterns(refuse), pytest.raises(PatternsOverBudget, match="5 over"):
        check_schema({"pattern": "(a|b)"})
    assert PATTERN_CACHE.get("(a|b)") == (False, None)  # not parsed, so not known
    check_schema({"pattern": "(a|b)"})  # outside: checked as ever


def test_the_cache_is_bounded_in_entries_and_in_bytes() -> None:
    cache = PatternCache(entries=3, max_bytes=10_000)
    for i in range(5):
        cache.put(f"p{i}", None)
    assert [cache.get(f"p{i}")[0] for i in range(5)] == [False, False, True, True, True]
    cache.get("p2")  # used: the least recently used goes first
    cache.put("p5", "bad")
    assert [cache.get(f"p{i}")[0] for i in (2, 3, 4, 5)] == [True, False, True, True]
    small = PatternCache(entries=100, max_bytes=3000)
    for i in range(10):
        small.put(f"{i}" + "x" * 900, None)
    assert sum(small.get(f"{i}" + "x" * 900)[0] for i in range(10)) == 3  # ~950 bytes each


# --- args vouched for without jsonschema (schemas.accepts) ---------------------------------

_names = st.sampled_from(["a", "b", "value", "x"])
_scalar_values = (st.none() | st.booleans() | st.integers(-(2**60), 2**60)
                  | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=4)
                  | st.integers(-6, 6)
                  | st.sampled_from([1.0, 1.5, -0.0, 2**53, True, False, "", "a", "ab"]))


class _ListSubclass(list):  # type: ignore[type-arg]
    """An array to jsonschema (is_type takes subclasses)."""


_values = st.recursive(
    _scalar_values,
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(_names, inner, max_size=3)
    | st.lists(inner, max_size=3).map(tuple)
    | st.lists(inner, max_size=3).map(_ListSubclass),
    max_leaves=8)
_type_names = st.sampled_from(["null", "boolean", "object", "array", "number", "string",
                               "integer"])


def _schemas(inner: Any) -> Any:
    keyword = st.sampled_from([
        "types", "properties", "required", "additionalProperties", "items", "enum",
        "const", "anyOf", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
        "minLength", "maxLength", "minItems", "maxItems", "description", "default",
        "pattern", "$ref", "uniqueItems",
    ])
    number = st.integers(-5, 5) | st.floats(-5, 5)

    @st.composite
    def schema(draw: Any) -> Any:
        out: dict[str, Any] = {}
        if draw(st.booleans()):  # most schemas say a type
            out["type"] = draw(_type_names)
        for key in draw(st.lists(keyword, max_size=3, unique=True)):
            if key == "type":
                out["type"] = draw(_type_names)
            elif key == "types":
                out["type"] = draw(st.lists(_type_names, min_size=1, max_size=3, unique=True))
            elif key == "properties":
                out["properties"] = draw(st.dictionaries(_names, inner, max_size=3))
            elif key == "required":
                out["required"] = draw(st.lists(_names, max_size=2, unique=True))
            elif key == "additionalProperties":
                out["additionalProperties"] = draw(st.booleans() | inner)
            elif key in ("items",):
                out[key] = draw(inner)
            elif key in ("enum",):
                out["enum"] = draw(st.lists(_scalar_values | st.lists(_scalar_values, max_size=2),
                                            min_size=1, max_size=4))
            elif key == "const":
                out["const"] = draw(_scalar_values)
            elif key == "anyOf":
                out["anyOf"] = draw(st.lists(inner, min_size=1, max_size=3))
            elif key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
                out[key] = draw(number)
            elif key in ("minLength", "maxLength", "minItems", "maxItems"):
                out[key] = draw(st.integers(0, 3))
            elif key == "pattern":
                out["pattern"] = "^a"
            elif key == "$ref":
                out["$ref"] = "#"
            elif key == "uniqueItems":
                out["uniqueItems"] = True
            else:
                out[key] = draw(st.text(max_size=3))
        return out

    return schema()


_any_schema = st.recursive(st.booleans() | st.just({}), _schemas, max_leaves=6)


@settings(max_examples=int(os.environ.get("PEDELEC_SCHEMA_FUZZ_EXAMPLES", "400")),
          deadline=None, suppress_health_check=list(HealthCheck))
@given(_any_schema, st.lists(_values, min_size=1, max_size=12))
def test_args_the_fast_check_vouches_for_are_valid_to_jsonschema(schema: Any,
                                                                  values: list[Any]) -> None:
    """schemas.accepts never says True where jsonschema finds an error: validation
    through it gives jsonschema's verdict, and messages, always."""
    try:
        check_schema(schema)
    except OurSchemaError:  # not a schema a tool can have
        assume(False)
    valid = schemas.accepts(schema)
    if valid is None:
        return
    validator = Draft202012Validator(schema)
    for value in values:
        if valid(value):
            assert validator.is_valid(value), (schema, value)


def test_the_typed_forms_schemas_are_vouched_for_and_errors_still_come_from_jsonschema(
) -> None:
    @define_tool
    def pick(value: int, name: str = "x", ratio: float = 1.0, flag: bool = False,
             tags: list[str] | None = None, mode: Literal["a", "b"] = "a") -> None:
        """Pick."""

    valid = schemas.accepts(pick.args_schema)
    assert valid is not None
    assert valid({"value": 3, "name": "n", "ratio": 2, "flag": True, "tags": ["t"],
                  "mode": "b"})
    assert valid({"value": 3, "tags": None})
    for wrong in ({}, {"value": "3"}, {"value": 3, "other": 1}, {"value": True},
                  {"value": 3, "mode": "c"}, {"value": 3, "tags": [1]}):
        assert not valid(wrong)
        assert pick.validate(wrong)  # jsonschema's errors, as before
    assert not valid({"value": 3.0}) and pick.validate({"value": 3.0}) == []
    for unread in ({"$ref": "#"}, {"type": "string", "pattern": "^a"},
                   {"$schema": "http://json-schema.org/draft-04/schema#"},
                   {"items": [{"type": "string"}]}):
        assert schemas.accepts(unread) is None


@pytest.mark.parametrize(("schema", "value", "valid"), [
    ({"type": "integer"}, 1, True), ({"type": "integer"}, 1.5, False),
    ({"type": "integer"}, True, False), ({"type": "number"}, False, False),
    ({"type": ["string", "null"]}, None, True), ({"type": ["string", "null"]}, 0, False),
    ({"minimum": 2}, 2, True), ({"minimum": 2}, 1.5, False),
    ({"maximum": 2}, 2, True), ({"maximum": 2}, 3, False),
    ({"exclusiveMinimum": 2}, 2, False), ({"exclusiveMinimum": 2}, 2.5, True),
    ({"exclusiveMaximum": 2}, 2, False), ({"exclusiveMaximum": 2}, 1, True),
    ({"minimum": 2}, "1", True), ({"minimum": 2}, True, True),
    ({"minLength": 2}, "a", False), ({"minLength": 2}, "ab", True), ({"minLength": 2}, [1], True),
    ({"maxLength": 1}, "ab", False), ({"maxItems": 1}, [1, 2], False), ({"minItems": 1}, [], False),
    ({"maxItems": 1}, "ab", True),
    ({"enum": [1, "a"]}, 1, True), ({"enum": [1]}, True, False), ({"enum": [True]}, 1, False),
    ({"const": "a", "enum": ["b"]}, "a", False), ({"const": None}, None, True),
    ({"required": ["a"]}, {}, False), ({"required": ["a"]}, [], True),
    ({"properties": {"a": {"type": "string"}}}, {"a": 1}, False),
    ({"properties": {"a": {"type": "string"}}}, {"a": "x", "b": 1}, True),
    ({"properties": {"a": {}}, "additionalProperties": False}, {"b": 1}, False),
    ({"properties": {"a": {}}, "additionalProperties": False}, {"a": 1}, True),
    ({"additionalProperties": {"type": "string"}}, {"b": 1}, False),
    ({"additionalProperties": {"type": "string"}}, {"b": "x"}, True),
    ({"items": {"type": "string"}}, ["a", 1], False), ({"items": {"type": "string"}}, ["a"], True),
    ({"items": {"type": "string"}}, {"a": 1}, True),
    ({"anyOf": [{"type": "string"}, {"type": "null"}]}, None, True),
    ({"anyOf": [{"type": "string"}, {"type": "null"}]}, 1, False),
    ({"type": "object", "properties": {"n": {"minimum": 0}}}, {"n": -1}, False),
])
def test_the_fast_check_at_each_keywords_edge(schema: dict[str, Any], value: Any,
                                              valid: bool) -> None:
    """True exactly where jsonschema finds no error, for the values it reads (JSON's
    own types)."""
    assert Draft202012Validator(schema).is_valid(value) is valid
    check = schemas.accepts(schema)
    assert check is not None and check(value) is valid


def test_the_fast_check_leaves_other_python_types_to_jsonschema() -> None:
    """A list subclass is an array to jsonschema; a tuple is not; an int subclass is a
    number: none is vouched for, whatever the schema says."""
    from collections import OrderedDict
    from enum import IntEnum

    class Small(IntEnum):
        ONE = 1

    for schema, value in [({"items": {"type": "string"}}, _ListSubclass([1])),
                          ({"type": "array"}, ("a",)),
                          ({"maximum": 0}, Small.ONE),
                          ({"additionalProperties": False}, OrderedDict(a=1)),
                          ({}, ("a",))]:
        check = schemas.accepts(schema)
        assert check is not None and check(value) is False, (schema, value)
