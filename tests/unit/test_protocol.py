"""Wire protocol v1: every message both ways, every malformed input, and the docs in sync."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from pedelec_pyodide import SessionState, protocol, strictjson
from pedelec_pyodide.protocol import (
    Hello,
    ProtocolError,
    ToolRequest,
    ToolResult,
    TurnEnd,
    parse_client_frame,
    parse_server_frame,
)

TOOL = {"name": "t", "description": "d", "argsSchema": {"type": "object"}}

CLIENT_MESSAGES: list[dict[str, Any]] = [
    {"type": "hello", "protocol": 1, "tools": [TOOL], "client": {"name": "x"}},
    {"type": "hello", "protocol": 1, "tools": [], "sessionId": "s", "resumeToken": "r"},
    {"type": "tools.update", "tools": [TOOL]},
    {"type": "turn.start", "turnId": "t1", "text": "hi"},
    {"type": "tool.result", "toolRequestId": "q", "result": None, "handledBy": "none"},
    {"type": "tool.result", "toolRequestId": "q", "result": {"a": [1]}, "handledBy": "named"},
    {"type": "turn.cancel", "turnId": "t1"},
]
SERVER_MESSAGES: list[dict[str, Any]] = [
    {"type": "welcome", "sessionId": "s", "resumeToken": "r", "resumed": False, "state": "idle"},
    {"type": "tool.request", "toolRequestId": "q", "turnId": None, "tool": "t", "args": {}},
    {"type": "tool.request", "toolRequestId": "q", "turnId": "t1", "tool": "t", "args": [1]},
    {"type": "tool.cancel", "toolRequestId": "q", "reason": "deadline"},
    {"type": "turn.delta", "turnId": "t1", "text": "par"},
    {"type": "turn.end", "turnId": "t1", "status": "completed", "text": "done"},
    {"type": "turn.end", "turnId": "t1", "status": "failed", "text": "",
     "error": {"code": "X", "message": "m"}},
    {"type": "error", "code": "UNKNOWN_TYPE", "message": "m"},
    {"type": "error", "code": "DUPLICATE_RESULT", "message": "m", "toolRequestId": "q"},
]


@pytest.mark.parametrize("wire", CLIENT_MESSAGES)
def test_client_messages_round_trip(wire: dict[str, Any]) -> None:
    message = parse_client_frame(json.dumps(wire))
    assert message.to_wire() == wire
    assert parse_client_frame(message.encode()) == message


@pytest.mark.parametrize("wire", SERVER_MESSAGES)
def test_server_messages_round_trip(wire: dict[str, Any]) -> None:
    message = parse_server_frame(json.dumps(wire))
    assert message.to_wire() == wire
    assert parse_server_frame(message.encode()) == message


def test_snake_case_in_python() -> None:
    hello = parse_client_frame(json.dumps(CLIENT_MESSAGES[1]))
    assert isinstance(hello, Hello)
    assert (hello.session_id, hello.resume_token) == ("s", "r")
    request = parse_server_frame(json.dumps(SERVER_MESSAGES[2]))
    assert isinstance(request, ToolRequest)
    assert (request.tool_request_id, request.turn_id, request.args) == ("q", "t1", [1])


def test_unknown_fields_are_ignored() -> None:
    message = parse_server_frame('{"type":"turn.delta","turnId":"t","text":"x","future":1}')
    assert message == protocol.TurnDelta(turn_id="t", text="x")


def test_encode_tool_result_matches_the_dataclass() -> None:
    frame = protocol.encode_tool_result("q\"1", '{"a":[1,2]}', "inline")
    assert parse_client_frame(frame) == ToolResult(tool_request_id='q"1', result={"a": [1, 2]},
                                                   handled_by="inline")


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        ("not json", "FRAME_NOT_JSON"),
        ("", "FRAME_NOT_JSON"),
        (b"\xff\xfe", "FRAME_NOT_JSON"),
        ("[1]", "FRAME_NOT_OBJECT"),
        ("null", "FRAME_NOT_OBJECT"),
        ("{}", "MISSING_TYPE"),
        ('{"type": 5}', "INVALID_FIELD"),
        ('{"type": "nope"}', "UNKNOWN_TYPE"),
        ('{"type": "welcome", "sessionId": "s", "resumeToken": "r", "resumed": true,'
         ' "state": "idle"}', "WRONG_DIRECTION"),
        ('{"type": "turn.start", "turnId": "t"}', "MISSING_FIELD"),
        ('{"type": "turn.start", "turnId": "t", "text": 5}', "INVALID_FIELD"),
        ('{"type": "turn.start", "turnId": "", "text": ""}', "INVALID_FIELD"),
        ('{"type": "turn.start", "turnId": "' + "x" * 129 + '", "text": ""}', "INVALID_FIELD"),
        ('{"type": "tool.result", "toolRequestId": "q", "handledBy": "named"}', "MISSING_FIELD"),
        ('{"type": "tool.result", "toolRequestId": "q", "result": 1, "handledBy": "me"}',
         "INVALID_FIELD"),
        ('{"type": "hello", "protocol": 2, "tools": []}', "UNSUPPORTED_PROTOCOL"),
        ('{"type": "hello", "protocol": true, "tools": []}', "INVALID_FIELD"),
        ('{"type": "hello", "protocol": 1, "tools": {}}', "INVALID_FIELD"),
        ('{"type": "hello", "protocol": 1, "tools": [{"name": "bad name", "description": "d",'
         ' "argsSchema": {}}]}', "INVALID_TOOL"),
        ('{"type": "tools.update", "tools": [{"name": "t", "description": "",'
         ' "argsSchema": {}}]}', "INVALID_TOOL"),
        ('{"type": "tools.update", "tools": [{"name": "t", "description": "d",'
         ' "argsSchema": {"type": "integr"}}]}', "INVALID_TOOL"),
        ('{"type": "tools.update", "tools": [' + json.dumps(TOOL) + "," + json.dumps(TOOL)
         + "]}", "INVALID_TOOL"),
        ('{"type": "turn.cancel", "turnId": null}', "INVALID_FIELD"),
    ],
)
def test_malformed_client_frames_get_distinct_codes(frame: str | bytes, code: str) -> None:
    with pytest.raises(ProtocolError) as info:
        parse_client_frame(frame)
    assert info.value.code == code
    assert info.value.message


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        ('{"type": "hello", "protocol": 1, "tools": []}', "WRONG_DIRECTION"),
        ('{"type": "tool.request", "toolRequestId": "q", "tool": "t", "args": {}}',
         "MISSING_FIELD"),
        ('{"type": "turn.end", "turnId": "t", "status": "done", "text": ""}', "INVALID_FIELD"),
        ('{"type": "welcome", "sessionId": "s", "resumeToken": "r", "resumed": "no",'
         ' "state": "idle"}', "INVALID_FIELD"),
    ],
)
def test_malformed_server_frames(frame: str, code: str) -> None:
    with pytest.raises(ProtocolError) as info:
        parse_server_frame(frame)
    assert info.value.code == code


def test_too_large_and_too_deep() -> None:
    big = json.dumps({"type": "turn.start", "turnId": "t", "text": "x" * 2000})
    with pytest.raises(ProtocolError) as info:
        parse_client_frame(big, max_bytes=1000)
    assert info.value.code == "FRAME_TOO_LARGE"
    assert parse_client_frame(big, max_bytes=len(big)).text == "x" * 2000  # type: ignore[union-attr]
    multibyte = json.dumps({"type": "turn.start", "turnId": "t", "text": "é" * 600},
                           ensure_ascii=False)
    with pytest.raises(ProtocolError):
        parse_client_frame(multibyte, max_bytes=1000)  # 600 chars, 1200+ bytes

    deep = '{"type": "tool.result", "toolRequestId": "q", "handledBy": "named", "result": '
    ok = deep + "[" * 99 + "]" * 99 + "}"
    assert isinstance(parse_client_frame(ok), ToolResult)
    too_deep = deep + "[" * 100 + "]" * 100 + "}"
    with pytest.raises(ProtocolError) as info:
        parse_client_frame(too_deep)
    assert info.value.code == "FRAME_TOO_DEEP"
    very_deep = deep + "[" * 100_000 + "]" * 100_000 + "}"
    with pytest.raises(ProtocolError) as info:
        parse_client_frame(very_deep, max_bytes=10**6)
    assert info.value.code == "FRAME_TOO_DEEP"
    brackets_in_strings = json.dumps({"type": "turn.start", "turnId": "t", "text": "[{" * 300})
    assert isinstance(parse_client_frame(brackets_in_strings), protocol.TurnStart)


def _deepest(text: str) -> int:
    """The most brackets open at once outside strings, counted one character at a time."""
    depth = deepest = 0
    for char in protocol.outside_strings(text):
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def _chain(depth: int) -> str:
    return "[" * (depth - 1) + '{"a":"]]}"}' + "]" * (depth - 1)


@pytest.mark.parametrize("text", [
    "[" + ",".join([_chain(99)] * 3000) + "]",  # long at the limit: many chains, 100 deep
    "[" + ",".join([_chain(99)] * 3000 + [_chain(100)]) + "]",  # one over it, at the end
    "[" + ",".join(["[]"] * 50_000 + [_chain(100)]) + "]",  # stripped first, then counted
    "[" + ",".join(["[[],[[]],{}]"] * 10_000) + "]",
    "[" * 60 + ",".join([_chain(40)] * 500) + "]" * 60,  # 99 deep, wide at the bottom
    "[" * 60 + ",".join([_chain(41)] * 500) + "]" * 60,
])
def test_the_depth_check_counts_what_a_decoder_would_recurse(text: str) -> None:
    json.loads(text)
    assert protocol.nests_too_deep(text) == (_deepest(text) > protocol.MAX_DEPTH)


def test_the_depth_check_of_what_is_not_json_never_counts_less() -> None:
    assert protocol.nests_too_deep("[]" * 200 + "[" * 101)
    assert protocol.nests_too_deep("[]" * 200 + "[" * 100)  # more, for what is not JSON
    assert not protocol.nests_too_deep("]" * 300 + "[" * 50)  # closing opens nothing
    assert not protocol.nests_too_deep("[" * 99 + "}" * 300)


def test_turn_end_error_is_optional() -> None:
    message = parse_server_frame('{"type":"turn.end","turnId":"t","status":"cancelled",'
                                 '"text":"","error":null}')
    assert isinstance(message, TurnEnd) and message.error is None


# --- docs/reference/protocol.md stays in sync with the code ---------------------------------------

DOC = Path(__file__).resolve().parents[2] / "docs" / "reference" / "protocol.md"


def documented_schemas() -> dict[str, Any]:
    text = DOC.read_text(encoding="utf-8")
    blocks = re.findall(r"#### `([a-z.]+)`\n\n.*?\n\n```json\n(.*?)\n```", text, re.S)
    return {kind: json.loads(body) for kind, body in blocks}


@pytest.mark.skipif(not DOC.exists(), reason="docs/ is not shipped with the package")
def test_docs_list_exactly_the_schemas_of_the_code() -> None:
    assert documented_schemas() == protocol.all_schemas()


def test_schemas_accept_what_the_parser_accepts() -> None:
    from jsonschema import Draft202012Validator

    schemas = protocol.all_schemas()
    for wire in CLIENT_MESSAGES + SERVER_MESSAGES:
        Draft202012Validator(schemas[wire["type"]]).validate(wire)
    for schema in schemas.values():
        Draft202012Validator.check_schema(schema)


# --- optional page -> Core messages of interactive tools -----------------------------------


def test_tool_progress_parses_with_optional_total_and_message() -> None:
    message = parse_client_frame(
        '{"type":"tool.progress","toolRequestId":"r1","progress":2.5,"total":10,"message":"x"}')
    assert message == protocol.ToolProgressMessage("r1", 2.5, 10, "x")
    bare = parse_client_frame('{"type":"tool.progress","toolRequestId":"r1","progress":3}')
    assert bare == protocol.ToolProgressMessage("r1", 3)
    assert json.loads(bare.encode()) == {"type": "tool.progress", "toolRequestId": "r1",
                                         "progress": 3}


@pytest.mark.parametrize("progress", ['"3"', "true", "null", "9007199254740993", "[1]"])
def test_tool_progress_must_be_a_number_a_double_can_hold(progress: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        parse_client_frame(
            f'{{"type":"tool.progress","toolRequestId":"r1","progress":{progress}}}')
    assert caught.value.code == protocol.INVALID_FIELD
    assert "tool.progress.progress must be a number" in caught.value.message


def test_tool_waiting_round_trips() -> None:
    message = parse_client_frame(
        '{"type":"tool.waiting","toolRequestId":"r1","waiting":true,"reason":"approval"}')
    assert message == protocol.ToolWaiting("r1", True, "approval")
    assert parse_client_frame(message.encode()) == message


def test_the_pages_session_states_are_the_protocols() -> None:
    """``SessionState`` (a public enum) spells the protocol's states, in its order."""
    assert tuple(state.value for state in SessionState) == protocol.SESSION_STATES


@pytest.mark.parametrize("frame", [
    protocol.TurnStart(turn_id="t-1_A", text="hi"),
    protocol.ToolResult(tool_request_id="r-1_A", result={"a": 1}, handled_by="named"),
    protocol.ToolRequest(tool_request_id="r-1_A", turn_id=None, tool="t", args={}),
    protocol.TurnCancel(turn_id="t-1_A"),
])
def test_a_frame_begins_with_its_head_and_first_id(frame: protocol.Message) -> None:
    """``frame_head`` is what the encoders write (Core traces refused frames by it)."""
    first = getattr(frame, frame.fields[0].attr)
    assert frame.encode().startswith(
        protocol.frame_head(type(frame)) + strictjson.encode(first))


def test_an_encoded_tool_result_begins_with_its_head() -> None:
    text = protocol.encode_tool_result("r-1", "[1]", "inline")
    assert text.startswith(protocol.frame_head(protocol.ToolResult) + '"r-1",')
    assert protocol.frame_head(protocol.ToolResult) == '{"type":"tool.result","toolRequestId":'
    assert json.loads(text) == protocol.ToolResult(
        tool_request_id="r-1", result=[1], handled_by="inline").to_wire()
