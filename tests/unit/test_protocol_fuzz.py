"""Property tests of the protocol parser (hypothesis), in CPython and in Pyodide.

Frames are built from the message declarations themselves (each field's kind), then
mutated at random: a field dropped, retyped or replaced, the type renamed, unknown fields
added, the text cut, spliced or nested. Whatever comes out, parsing in either direction
ends in a message or a ProtocolError with a documented code, never another exception; and
a parsed message re-encodes to a frame that parses back to the same message, carrying the
same values for every declared field.

PEDELEC_PROTOCOL_FUZZ_EXAMPLES scales the run (default 300; the long run: 100000).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pedelec_pyodide import protocol
from pedelec_pyodide.protocol import MESSAGE_TYPES, Message, ProtocolError

EXAMPLES = int(os.environ.get("PEDELEC_PROTOCOL_FUZZ_EXAMPLES", "300"))
CODES = {
    protocol.FRAME_TOO_LARGE, protocol.FRAME_NOT_JSON, protocol.FRAME_NOT_OBJECT,
    protocol.FRAME_TOO_DEEP, protocol.MISSING_TYPE, protocol.UNKNOWN_TYPE,
    protocol.WRONG_DIRECTION, protocol.MISSING_FIELD, protocol.INVALID_FIELD,
    protocol.INVALID_TOOL, protocol.UNSUPPORTED_PROTOCOL,
}
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=False,
                suppress_health_check=list(HealthCheck))

scalars = (st.none() | st.booleans() | st.integers(-(2**70), 2**70)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20))
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
ids = st.text(min_size=1, max_size=128)
SCHEMAS = [{"type": "object"}, {"type": "object", "properties": {"n": {"type": "integer"}},
                                "required": ["n"], "additionalProperties": False}]
tool_metadata = st.builds(
    lambda name, description, schema, hints: {
        "name": name, "description": description, "argsSchema": schema,
        **({"annotations": hints} if hints else {})},
    st.from_regex(r"\A[A-Za-z0-9_-]{1,64}\Z"),
    st.text(min_size=1, max_size=30).filter(str.strip),
    st.sampled_from(SCHEMAS),
    st.dictionaries(st.sampled_from(["readOnlyHint", "idempotentHint"]), st.booleans()))


def tools_list() -> st.SearchStrategy[list[dict[str, Any]]]:
    return st.lists(tool_metadata, max_size=3, unique_by=lambda m: m["name"])


def field_value(spec: Any) -> st.SearchStrategy[Any]:
    if spec.choices is not None:
        return st.sampled_from(spec.choices)
    base: st.SearchStrategy[Any] = {
        "id": ids, "str": st.text(max_size=40), "bool": st.booleans(),
        "int": st.integers(),
        "number": st.integers(-2**53, 2**53) | st.floats(allow_nan=False, allow_infinity=False),
        "object": st.dictionaries(st.text(max_size=8), json_values,
                                                        max_size=3),
        "array": st.lists(json_values, max_size=3), "any": json_values, "tools": tools_list(),
    }[spec.kind]
    return base | st.none() if spec.nullable else base


@st.composite
def valid_frame(draw: st.DrawFn) -> dict[str, Any]:
    cls: type[Message] = draw(st.sampled_from(list(MESSAGE_TYPES.values())))
    frame: dict[str, Any] = {"type": cls.type}
    for spec in cls.fields:
        if spec.required or draw(st.booleans()):
            frame[spec.wire] = draw(field_value(spec))
    return frame


WRONG = st.sampled_from([None, True, 0, -1, 1.5, "", "x" * 129, [], {}, [1], {"a": 1}])


@st.composite
def mutated_frame(draw: st.DrawFn) -> str | bytes:
    frame = draw(valid_frame())
    wrapped: Any
    for _ in range(draw(st.integers(0, 3))):
        keys = sorted(frame)
        action = draw(st.sampled_from(
            ["drop", "retype", "rename", "extra", "type", "wrap"]))
        key = draw(st.sampled_from(keys)) if keys else "type"
        if action == "drop" and keys:
            frame.pop(key)
        elif action == "retype":
            frame[key] = draw(WRONG | json_values)
        elif action == "rename":
            frame[draw(st.text(max_size=12))] = frame.pop(key, None)
        elif action == "extra":
            frame[draw(st.text(max_size=12))] = draw(json_values)
        elif action == "type":
            frame["type"] = draw(st.sampled_from(list(MESSAGE_TYPES)) | st.text(max_size=12)
                                 | WRONG)
        else:  # wrapped: the last mutation
            wrapped = ({"type": frame.get("type"), "x": [frame]} if draw(st.booleans())
                       else [frame])
            break
    else:
        wrapped = frame
    text = json.dumps(wrapped, ensure_ascii=draw(st.booleans()))
    cut = draw(st.sampled_from(["none", "none", "truncate", "splice", "nest", "bytes"]))
    if cut == "truncate":
        text = text[: draw(st.integers(0, len(text)))]
    elif cut == "splice":
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(st.sampled_from(
            ["NaN", "Infinity", "1e400", '"\\ud800"', "{", "]", ",", "\x00", "\\"]
        ) | st.text(max_size=5)) + text[at:]
    elif cut == "nest":
        depth = draw(st.integers(95, 140))
        text = "[" * depth + text + "]" * depth
    elif cut == "bytes":
        raw = text.encode()
        at = draw(st.integers(0, len(raw)))
        return raw[:at] + draw(st.binary(max_size=4)) + raw[at:]
    return text


def check(data: str | bytes) -> None:
    for parse in (protocol.parse_client_frame, protocol.parse_server_frame):
        try:
            message = parse(data)
        except ProtocolError as exc:
            assert exc.code in CODES, exc.code
            assert isinstance(exc.message, str) and exc.message
            continue
        # re-encodes to an equivalent frame
        encoded = message.encode()
        assert parse(encoded) == message
        original = json.loads(data)
        wire = message.to_wire()
        assert wire["type"] == original["type"]
        for spec in type(message).fields:
            if spec.wire in wire and spec.wire in original:
                assert _same(wire[spec.wire], original[spec.wire]), spec.wire
            elif spec.wire in wire:  # only turnId of tool.request, always on the wire
                assert wire[spec.wire] is None
        # and never anything a JSON peer cannot read back
        json.loads(encoded)
        encoded.encode("utf-8")


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    return bool(a == b and type(a) is type(b)) or (a == b and not isinstance(a, bool)
                                                  and not isinstance(b, bool))


@FUZZ
@given(valid_frame())
def test_declared_messages_round_trip(frame: dict[str, Any]) -> None:
    text = json.dumps(frame)
    cls = MESSAGE_TYPES[frame["type"]]
    parse = (protocol.parse_client_frame if cls.direction == "client"
             else protocol.parse_server_frame)
    message = parse(text)
    assert parse(message.encode()) == message
    check(text)


@FUZZ
@given(mutated_frame())
def test_mutated_frames_parse_or_fail_with_a_known_code(data: str | bytes) -> None:
    check(data)


@FUZZ
@given(st.text(max_size=200) | st.binary(max_size=200))
def test_arbitrary_text_parses_or_fails_with_a_known_code(data: str | bytes) -> None:
    check(data)


_ids = st.text(max_size=3) | st.just("r" * protocol.MAX_ID_LENGTH) | st.just(
    "r" * (protocol.MAX_ID_LENGTH + 1))
_fields = st.none() | st.booleans() | st.integers(-2, 2) | _ids | st.lists(_ids, max_size=1) | (
    st.dictionaries(_ids, _ids, max_size=1))


@FUZZ
@given(st.fixed_dictionaries({}, optional={
    "toolRequestId": _fields, "turnId": _fields, "tool": _fields, "args": json_values,
    "extra": _fields}))
def test_a_request_checked_at_a_glance_is_the_one_its_fields_checks_build(
        data: dict[str, Any]) -> None:
    """protocol.well_formed_request (a tool call's path) gives a request exactly when the
    declared fields' checks build one, and the same request."""
    from pedelec_pyodide import declare

    try:
        declared: Any = declare.build(protocol.ToolRequest, data, protocol._check_field,
                                      protocol._missing_field)
    except ProtocolError:
        declared = None
    assert protocol.well_formed_request(data) == declared
