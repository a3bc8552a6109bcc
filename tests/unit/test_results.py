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

from pedelec_pyodide.results import ResultError, encode_result

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
