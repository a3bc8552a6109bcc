"""The JSON result check, property-based: it never raises, and it accepts exactly the
values ``json.dumps(v, allow_nan=False)`` encodes with str keys and no cycles."""

from __future__ import annotations

import datetime
import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pedelec_pyodide.results import (
    TOOL_RESULT_INVALID,
    TOOL_RESULT_TOO_LARGE,
    ResultError,
    ToolError,
    encode_result,
    invalid_args,
    is_error_result,
    tool_error,
)

UNLIMITED = 10**9

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.text(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.binary(max_size=4), st.sets(st.integers(), max_size=2),
    st.just(datetime.date(2026, 11, 30)), st.builds(object),
)
keys = st.one_of(st.text(max_size=5), st.integers(), st.none(), st.booleans(),
                 st.floats(allow_nan=False), st.tuples(st.integers()))
values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.tuples(children, children),
        st.dictionaries(keys, children, max_size=4),
    ),
    max_leaves=20,
)


def reference_accepts(value: Any) -> bool:
    """The rule, independently: json.dumps must encode it, and every key must be a str."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return all_keys_are_str(value)


def all_keys_are_str(value: Any) -> bool:
    if isinstance(value, dict):
        return all(isinstance(k, str) for k in value) and all(
            all_keys_are_str(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return all(all_keys_are_str(v) for v in value)
    return True


@settings(max_examples=400, deadline=None)
@given(values)
def test_accepts_exactly_what_json_encodes_with_str_keys(value: Any) -> None:
    try:
        wire, text = encode_result(value, UNLIMITED)
    except ResultError as exc:
        assert not reference_accepts(value), f"refused a JSON value: {value!r}"
        error = exc.result["error"]
        assert error["code"] == "TOOL_RESULT_INVALID"
        assert error["details"]["path"].startswith("$")
        return
    assert reference_accepts(value), f"accepted a non-JSON value: {value!r}"
    assert json.loads(text) == wire
    assert wire == json.loads(json.dumps(value, allow_nan=False))


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.integers(),
                    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=3), c,
                                                                         max_size=3),
                    max_leaves=10))
def test_cycles_are_refused_and_repeats_are_not(value: Any) -> None:
    repeated = [value, value]
    assert encode_result(repeated, UNLIMITED)[0] == json.loads(json.dumps(repeated))
    container: list[Any] = [value]
    container.append(container)
    try:
        encode_result(container, UNLIMITED)
    except ResultError as exc:
        assert "cycle" in exc.result["error"]["message"]
    else:
        raise AssertionError("a cycle was accepted")


def test_nan_and_infinity_are_refused() -> None:
    for bad in (math.nan, math.inf, -math.inf):
        try:
            encode_result({"x": bad})
        except ResultError as exc:
            assert exc.result["error"]["details"]["path"] == "$.x"
        else:
            raise AssertionError(f"{bad} accepted")


@pytest.mark.parametrize("value, path", [
    ("\ud800", "$"), ({"a": ["ok", "x\udfff"]}, "$.a[1]"), ({"k\ud83d": 1}, '$["k\\ud83d"]'),
    ((["\udc00"],), "$[0][0]"),  # the slow path (a tuple) too
])
def test_a_lone_surrogate_in_a_result_is_refused_naming_its_path(value: Any, path: str) -> None:
    with pytest.raises(ResultError) as refused:
        encode_result(value)
    error = refused.value.result["error"]
    assert error["code"] == "TOOL_RESULT_INVALID"
    assert error["details"]["path"] == path
    assert "lone surrogate" in error["message"]
    wire, text = encode_result({"emoji": "\U0001f600"})  # a pair is valid text
    assert json.loads(text) == wire == {"emoji": "\U0001f600"}


# --- the messages and paths users see (docs/reference/python-api.md, "Dispatch") --------

def refusal(value: Any) -> dict[str, Any]:
    with pytest.raises(ResultError) as refused:
        encode_result(value)
    error: dict[str, Any] = refused.value.result["error"]
    assert error["code"] == TOOL_RESULT_INVALID
    assert str(refused.value) == error["message"]  # the exception reads as its result
    return error


class Broken(dict):  # type: ignore[type-arg]
    def items(self) -> Any:
        raise RuntimeError("the backing store went away")


@pytest.mark.parametrize(("value", "path", "kind", "why"), [
    ({"when": datetime.date(2026, 11, 30)}, "$.when", "a datetime.date", "is not a JSON type"),
    ({"x": math.nan}, "$.x", "a float",
     "JSON cannot represent (NaN and Infinity are not JSON)"),
    ({"ok": [1], 7: "seven"}, '$["7"]', "a int",
     "is not allowed as an object key (keys must be str)"),
    # a finite float before the bad part does not end the walk (a tuple: the slow path)
    ((1.5, {1}), "$[1]", "a set", "is not a JSON type"),
])
def test_a_refusal_names_the_path_the_type_and_why(
        value: Any, path: str, kind: str, why: str) -> None:
    error = refusal(value)
    assert error["message"] == f"the result is not JSON-compatible: {path} is {kind}, which {why}"
    assert error["details"] == {"path": path, "type": kind}


def test_a_cycle_is_named_as_one() -> None:
    loop: list[Any] = [1]
    loop.append({"back": loop})
    error = refusal(loop)
    assert error["message"] == ("the result is not JSON-compatible: $[1].back is a list, "
                                "which contains itself (a cycle)")


def test_a_value_repeated_beside_a_tuple_is_not_a_cycle() -> None:
    # a tuple takes the walk (the slow path): a container closed after its first visit
    # may appear again
    shared = [1, {"a": [2]}]
    value = {"t": (0,), "first": shared, "again": shared, "deep": [shared, (shared,)]}
    wire, _ = encode_result(value)
    assert wire == json.loads(json.dumps(value))


def nested_dicts(depth: int) -> Any:
    value: Any = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


@pytest.mark.parametrize("container", ["dict", "list", "mixed", "tuple"])
def test_results_nest_at_most_99_levels_of_any_container(container: str) -> None:
    def build(depth: int) -> Any:
        value: Any = {} if container == "dict" else []
        for level in range(depth - 1):
            if container == "dict" or (container == "mixed" and level % 2):
                value = {"a": value}
            elif container == "tuple":
                value = (value,)
            else:
                value = [value]
        return value

    assert encode_result(build(99))[0] == json.loads(json.dumps(build(99)))
    error = refusal(build(100))
    assert error["message"].endswith(", which nests deeper than 99 levels")
    assert error["details"]["path"].count(".a") + error["details"]["path"].count("[0]") == 99


def test_a_value_json_cannot_encode_is_refused_even_when_its_walk_looks_fine() -> None:
    # an int too long to write as text (Python's int_max_str_digits): of a JSON type, yet
    # json cannot encode it
    error = refusal((1, 10**5000))
    assert error["message"] == ("the result is not JSON-compatible: $ is a tuple, "
                                "which cannot be encoded as JSON")
    assert error["details"] == {"path": "$", "type": "a tuple"}


def test_a_container_that_fails_while_it_is_read_is_refused_not_raised() -> None:
    error = refusal(Broken(x=1))
    kind = f"a {__name__}.Broken"  # the module as pytest imported it
    assert error["message"] == (
        f"the result is not JSON-compatible: $ is {kind}, "
        "which raised RuntimeError while it was read: the backing store went away")
    assert error["details"] == {"path": "$", "type": kind}


class Logged(dict):  # type: ignore[type-arg]
    """A dict whose items() encodes another result first: encoding re-entered."""

    def items(self) -> Any:
        self.inner = encode_result({"inner": [1, 2]})
        return super().items()


def test_a_result_encoded_while_another_is_being_encoded_is_right() -> None:
    value = Logged(a=[1, {"b": 2}], c="d")
    wire, text = encode_result(value)
    assert (wire, text) == ({"a": [1, {"b": 2}], "c": "d"}, '{"a":[1,{"b":2}],"c":"d"}')
    assert value.inner == ({"inner": [1, 2]}, '{"inner":[1,2]}')


@pytest.mark.parametrize(("value", "path"), [
    ({"a": ["ok", "x\udfff"]}, "$.a[1]"), ((["\udc00"],), "$[0][0]"),
])
def test_a_lone_surrogate_refusal_says_where_and_why(value: Any, path: str) -> None:
    error = refusal(value)
    assert error["message"] == (f"the result is not valid Unicode text: a lone surrogate at "
                                f"{path}: text must be valid Unicode")
    assert error["details"] == {"path": path, "type": "a str"}


def test_the_size_limit_counts_utf8_bytes_of_the_json() -> None:
    value = {"text": "é" * 10}  # 10 characters, 20 bytes
    size = len('{"text":""}') + 20
    assert encode_result(value, size)[0] == value
    with pytest.raises(ResultError) as refused:
        encode_result(value, size - 1)
    assert refused.value.result == {"error": {
        "code": TOOL_RESULT_TOO_LARGE,
        "message": f"the result is {size} bytes of JSON; the limit is {size - 1}",
        "details": {"size": size, "limit": size - 1}}}


# --- the error helpers ---------------------------------------------------------------

def test_tool_error_builds_the_uniform_shape() -> None:
    assert tool_error("NOPE", "no") == {"error": {"code": "NOPE", "message": "no"}}
    assert tool_error("NOPE", "no", details={"k": 1}, retryable=0) == {
        "error": {"code": "NOPE", "message": "no", "details": {"k": 1}, "retryable": False}}
    assert invalid_args("bad x", [1]) == {"error": {
        "code": "INVALID_ARGS", "message": "bad x", "details": [1], "retryable": True}}


@pytest.mark.parametrize(("code", "message", "says"), [
    ("", "m", "an error code must be a non-empty string, got ''"),
    (7, "m", "an error code must be a non-empty string, got 7"),
    ("C", b"m", "an error message must be a string, got bytes"),
])
def test_tool_error_refuses_a_bad_code_or_message(code: Any, message: Any, says: str) -> None:
    with pytest.raises(ValueError) as refused:
        tool_error(code, message)
    assert str(refused.value) == says
    with pytest.raises(ValueError):
        ToolError(code, message)


def test_a_tool_error_reads_as_its_message_and_carries_its_result() -> None:
    error = ToolError("OUT_OF_STOCK", "no more widgets", details={"left": 0}, retryable=True)
    assert str(error) == "no more widgets"
    assert error.code == "OUT_OF_STOCK"
    assert error.result == tool_error("OUT_OF_STOCK", "no more widgets", details={"left": 0},
                                      retryable=True)


@pytest.mark.parametrize(("code", "retryable"), [
    ("TOOL_CANCELLED", False), ("TOOL_DENIED", False), ("TOOL_OUTCOME_UNKNOWN", False),
    ("INVALID_ARGS", True), ("TOOL_TIMEOUT", True),
])
def test_a_code_whose_meaning_fixes_retryable_gets_it_unless_told(
        code: str, retryable: bool) -> None:
    """A handler's ToolError(TOOL_CANCELLED, ...) says what the runtime's own cancel says."""
    assert ToolError(code, "m").result["error"]["retryable"] is retryable
    assert tool_error(code, "m")["error"]["retryable"] is retryable
    assert tool_error(code, "m", retryable=not retryable)["error"]["retryable"] is not retryable
    assert "retryable" not in tool_error("TOOL_HANDLER_ERROR", "m")["error"]


@pytest.mark.parametrize(("result", "is_error"), [
    (tool_error("C", "m"), True),
    (invalid_args("m", {"errors": []}), True),
    ({"error": {}}, True),
    ({"error": {"code": "C"}}, True),
    # a handler's plain values (these were error results to the page's ToolCall, the
    # offline agent and Anthropic's is_error, and not to MCP's isError: MCP was right)
    ({"error": None}, False),
    ({"error": "text"}, False),
    ({"error": ["C"]}, False),
    ({"error": {"code": "C"}, "value": 1}, False),
    ({}, False), (None, False), ("error", False), ([{"error": {}}], False),
])
def test_an_error_result_is_one_key_error_holding_an_object(result: Any, is_error: bool) -> None:
    assert is_error_result(result) is is_error
