"""The one JSON policy: what is read from others (strict numbers) and how JSON is written
(compact, no NaN), with json's private C encoder as a checked fast path only."""

from __future__ import annotations

import json
import json.encoder
import math
from typing import Any

import pytest

from pedelec_pyodide import protocol, strictjson
from pedelec_pyodide.results import encode_result

TREES: list[Any] = [
    None, True, False, 0, -1, 2**60, 1.5, -0.0, 1e308, "", "é\n\t\"\\", "\U0001f600",
    "\u2028", [], {}, [1, [2, [3]]], {"a": {"b": [None, "x"]}, "": 0}, (1, "tuple"),
    {"deep": [[[[[[[[[[1]]]]]]]]]]}, {"k" * 300: "v" * 3000},
]


@pytest.mark.parametrize(("text", "said"), [
    ('{"x": NaN}', "NaN is not a JSON number"),
    ("[Infinity]", "Infinity is not a JSON number"),
    ("-Infinity", "-Infinity is not a JSON number"),
    ("1e999", '"1e999" is too large for a JSON number'),
    ("-1e999", '"-1e999" is too large for a JSON number'),
    ("1" * 30 + ".0e999", '"' + "1" * 23 + '…" is too large for a JSON number'),
])
def test_decode_refuses_the_numbers_json_does_not_have(text: str, said: str) -> None:
    with pytest.raises(ValueError) as refused:
        strictjson.decode(text)
    assert str(refused.value) == said
    assert not isinstance(refused.value, json.JSONDecodeError)


def test_decode_takes_json_and_says_where_it_is_not() -> None:
    assert strictjson.decode('{"a": [1, 2.5, -0, 1e308, "\\u00e9"]}') == {
        "a": [1, 2.5, 0, 1e308, "é"]}
    with pytest.raises(json.JSONDecodeError) as refused:
        strictjson.decode('{"a": }')
    assert refused.value.pos == 6


def test_encode_is_compact_keeps_characters_and_refuses_nan() -> None:
    assert strictjson.encode({"a": [1, "é"], "b": None}) == '{"a":[1,"é"],"b":null}'
    assert strictjson.encode({"a": "é"}, ascii=True) == '{"a":"\\u00e9"}'
    for bad in (math.nan, math.inf, -math.inf, {"x": [math.nan]}):
        with pytest.raises(ValueError, match="Out of range float"):
            strictjson.encode(bad)
    cycle: list[Any] = []
    cycle.append(cycle)
    with pytest.raises(ValueError, match="Circular reference"):
        strictjson.encode(cycle)
    with pytest.raises(TypeError, match="not JSON serializable"):
        strictjson.encode({1, 2})


def test_an_encoder_of_the_policy_takes_a_default() -> None:
    made = strictjson.encoder(default=lambda value: sorted(value))
    assert made.encode({"s": {2, 1}}) == '{"s":[1,2]}'
    with pytest.raises(ValueError):
        made.encode(math.nan)
    assert strictjson.encoder(ascii=True).encode("é") == '"\\u00e9"'


@pytest.mark.parametrize("value", TREES)
def test_the_tree_encoder_writes_what_encode_writes(value: Any) -> None:
    assert strictjson.encode_tree(value) == strictjson.encode(value)


def test_the_fast_path_is_taken_where_the_tests_run() -> None:
    assert strictjson._TREE_ENCODER is not None  # CPython 3.11+ and Pyodide have it


def test_without_the_private_encoder_encode_tree_is_encode(
        monkeypatch: pytest.MonkeyPatch) -> None:
    fast = [strictjson.encode_tree(value) for value in TREES]
    fast_results = [encode_result(value) for value in TREES]
    monkeypatch.setattr(strictjson, "_TREE_ENCODER", None)
    assert [strictjson.encode_tree(value) for value in TREES] == fast
    assert [encode_result(value) for value in TREES] == fast_results
    with pytest.raises(ValueError):
        strictjson.encode_tree([math.nan])


# json's C encoder maker, as strictjson finds it (None where json has no C part)
REAL_MAKE: Any = vars(json.encoder).get("c_make_encoder")


def _nan_writing(**arguments: Any) -> Any:
    return REAL_MAKE(**{**arguments, "allow_nan": True})


def _positional_only(*arguments: Any) -> Any:
    return REAL_MAKE(*arguments)


def _renamed(**arguments: Any) -> Any:
    raise TypeError("make_encoder() got an unexpected keyword argument 'markers'")


@pytest.mark.parametrize("make", [None, _nan_writing, _positional_only, _renamed])
def test_a_private_encoder_that_is_gone_or_changed_is_not_used(
        make: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(json.encoder, "c_make_encoder", make)
    assert strictjson._c_tree_encoder() is None


def test_a_frame_with_nan_is_not_json_before_it_is_sent() -> None:
    request = protocol.ToolRequest(tool_request_id="r1", tool="t", args={"x": math.nan})
    with pytest.raises(protocol.ProtocolError) as refused:
        request.encode()
    assert refused.value.code == protocol.FRAME_NOT_JSON
    assert refused.value.message.startswith("frame is not JSON: Out of range float")
