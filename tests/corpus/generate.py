"""Writes the bad-input corpus: one JSON-lines file per family, one case per line.

    .venv/bin/python tests/corpus/generate.py      # rewrites tests/corpus/*.jsonl

The data files are committed and the runners read only them (tests/core/test_corpus.py,
tests/e2e/corpus-results.spec.js); this script is how they were written. A case:

    {"id", "family", "description", "applies", "input", "expect"}

``applies`` says where the case runs: ``core`` (a raw WebSocket to a real Core),
``core+session`` (a real Session as the page behind a real Core), ``control`` (Core's
HTTP API), ``page`` (Chromium, through Playwright). The README beside this file gives the
input forms and placeholders of each family.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
cases: dict[str, list[dict[str, Any]]] = {}


def case(family: str, cid: str, description: str, applies: str, input: Any,
         expect: dict[str, Any]) -> None:
    cases.setdefault(family, []).append({
        "id": f"{family}/{cid}", "family": family, "description": description,
        "applies": applies, "input": input, "expect": expect,
    })


# --- protocol frames sent to Core ---------------------------------------------------------

def frame(cid: str, description: str, input: dict[str, Any], code: str,
          stage: str = "session") -> None:
    case("frames", cid, description, "core", {"stage": stage, **input}, {"error": code})


META = {"name": "t", "description": "a tool", "argsSchema": {"type": "object"}}
RESULT = {"type": "tool.result", "toolRequestId": "$PENDING", "result": 1, "handledBy": "named"}

# not JSON
for i, text in enumerate([
    "", " ", "not json", "{", "}", "{'type': 'hello'}", '{"type": "hello",}', "[1,2",
    '{"type":"turn.start" "turnId":"t"}', "nul", "tru", "\x00", "{\"type\":\"x\"}}",
    '{"a":1}garbage', "NaN", "Infinity", "-Infinity", "1e400",
    '{"type":"turn.start","turnId":"t","text":NaN}',
    '{"type":"tool.result","toolRequestId":"$PENDING","result":NaN,"handledBy":"named"}',
    '{"type":"tool.result","toolRequestId":"$PENDING","result":[Infinity],"handledBy":"named"}',
    '{"type":"tool.result","toolRequestId":"$PENDING","result":-1e999,"handledBy":"named"}',
    '{"type":"tool.result","toolRequestId":"$PENDING","result":"\\ud800","handledBy":"named"}',
    '{"type":"turn.start","turnId":"t","text":"\\udc00 lone low"}',
    '{"type":"turn.start","turnId":"t","text":"\\ud83d then no pair"}',
    "/* comment */ {}", "\ufeff{}", '{"type":"tool.result","toolRequestId":"x",',
]):
    frame(f"not-json-{i:02d}", f"not JSON text: {text[:60]!r}", {"text": text}, "FRAME_NOT_JSON")
frame("binary-not-utf8", "a binary frame that is not UTF-8", {"bytes_hex": "ff fe 00 7b"},
      "FRAME_NOT_JSON")
frame("binary-latin1", "a binary frame in Latin-1", {"bytes_hex": "7b22e9223a317d"},
      "FRAME_NOT_JSON")

# JSON but not an object
for i, value in enumerate([[], [1, 2], "hello", 1, 1.5, True, False, None,
                           [{"type": "hello"}], "{\"type\":\"hello\"}"]):
    frame(f"not-object-{i:02d}", f"JSON, not an object: {json.dumps(value)}",
          {"json": value}, "FRAME_NOT_OBJECT")

# nesting
for depth in (101, 150, 1000, 30_000):  # 30,000 deep is 60 KB: under the size limit
    frame(f"deep-array-{depth}", f"arrays nested {depth} deep inside a result",
          {"make": "nested", "depth": depth, "open": "["}, "FRAME_TOO_DEEP")
frame("deep-object-200", "objects nested 200 deep", {"make": "nested", "depth": 200,
      "open": "{"}, "FRAME_TOO_DEEP")
frame("deep-unbalanced", "60,000 opening brackets, never closed",
      {"make": "repeat", "unit": "[", "count": 60_000}, "FRAME_TOO_DEEP")
# before hello, Core reads no more of a frame than its leading type: refused unparsed
frame("deep-before-hello", "a deeply nested frame before hello",
      {"make": "nested", "depth": 5000, "open": "["}, "HELLO_REQUIRED", stage="before_hello")

# size (Core in these tests: max_frame_bytes = 65536; over 4x is closed unread with 1009)
for kind, size in (("just-over", 65_537), ("double", 131_072), ("triple", 200_000)):
    frame(f"huge-{kind}", f"a turn.start whose text makes the frame {size} bytes",
          {"make": "padded", "frame": {"type": "turn.start", "turnId": "t", "text": ""},
           "field": "text", "bytes": size}, "FRAME_TOO_LARGE")
frame("huge-result", "a result of 100,000 bytes for a pending request (over the limit)",
      {"make": "padded", "frame": {**RESULT, "result": ""}, "field": "result",
       "bytes": 100_000}, "FRAME_TOO_LARGE")
frame("huge-non-ascii", "a frame of 40,000 three-byte characters (120,000 bytes)",
      {"make": "padded", "frame": {"type": "turn.start", "turnId": "t", "text": ""},
       "field": "text", "bytes": 120_000, "char": "\u20ac"}, "FRAME_TOO_LARGE")
case("frames", "huge-far-over", "a frame over 4x the limit: closed unread (1009); the "
     "session resumes and loses nothing", "core",
     {"stage": "session", "make": "repeat", "unit": "x", "count": 300_000},
     {"close": 1009})

# metadata a session would hold (Core in these tests: max_metadata_bytes = 16384)
frame("metadata-over-limit", "a tools.update whose metadata is 20,000 bytes of JSON",
      {"json": {"type": "tools.update", "tools": [{**META, "description": "d" * 20_000}]}},
      "METADATA_TOO_LARGE")
frame("metadata-over-limit-empty-objects", "a tools.update of 18,000 bytes of empty "
      "objects (the worst shape for memory, ~24x decoded)",
      {"json": {"type": "tools.update", "tools": [{**META, "argsSchema": {
          "type": "object", "properties": {"a": {"enum": [{}] * 6000}}}}]}},
      "METADATA_TOO_LARGE")

# type
frame("missing-type", "an object without type", {"json": {"turnId": "t"}}, "MISSING_TYPE")
frame("null-type", "type is null", {"json": {"type": None}}, "MISSING_TYPE")
for i, value in enumerate([1, True, [], {}, ["hello"]]):
    frame(f"type-not-string-{i}", f"type is {json.dumps(value)}", {"json": {"type": value}},
          "INVALID_FIELD")
for name in ("", "HELLO", "hello ", "tool.results", "tool_result", "turn.stop", "ping",
             "tool.call", "__proto__", "constructor", "toString", "x" * 1000):
    frame(f"unknown-type-{name[:20] or 'empty'}", f"unknown type {name[:40]!r}",
          {"json": {"type": name}}, "UNKNOWN_TYPE")

# wrong direction: what Core sends, sent to Core
for body in (
    {"type": "welcome", "sessionId": "s", "resumeToken": "r", "resumed": False, "state": "idle"},
    {"type": "tool.request", "toolRequestId": "x", "turnId": None, "tool": "t", "args": {}},
    {"type": "tool.cancel", "toolRequestId": "$PENDING", "reason": "page says so"},
    {"type": "turn.delta", "turnId": "t", "text": "x"},
    {"type": "turn.end", "turnId": "t", "status": "completed", "text": ""},
    {"type": "error", "code": "X", "message": "y"},
):
    frame(f"wrong-direction-{body['type']}", f"{body['type']} sent to Core", {"json": body},
          "WRONG_DIRECTION")
    frame(f"wrong-direction-{body['type']}-before-hello", f"{body['type']} before hello",
          {"json": body}, "HELLO_REQUIRED", stage="before_hello")
frame("wrong-direction-minimal", "a bare {type: welcome} (no fields) is still the wrong way",
      {"json": {"type": "welcome"}}, "WRONG_DIRECTION")

# missing and mistyped fields, per message
GOOD = {
    "hello": {"type": "hello", "protocol": 1, "tools": [META]},
    "tools.update": {"type": "tools.update", "tools": [META]},
    "turn.start": {"type": "turn.start", "turnId": "t1", "text": "hi"},
    "tool.result": RESULT,
    "turn.cancel": {"type": "turn.cancel", "turnId": "t1"},
}
WRONG_VALUES: dict[str, list[Any]] = {
    "protocol": ["1", 1.0, True, None, [1]],
    "tools": [{}, "t", None, 1, {"0": META}],
    "client": ["browser", 1, [], True],
    "sessionId": [1, "", "x" * 129, [], True],
    "resumeToken": [1, "", "x" * 129, {}],
    "turnId": [1, "", "x" * 129, None, ["t"], {}],
    "text": [1, None, ["hi"], {}, True],
    "toolRequestId": [1, "", "x" * 129, None, ["$PENDING"]],
    "handledBy": ["NAMED", "agent", 1, None, ""],
}
REQUIRED = {"hello": ["protocol", "tools"], "tools.update": ["tools"],
            "turn.start": ["turnId", "text"], "tool.result": ["toolRequestId", "result",
                                                               "handledBy"],
            "turn.cancel": ["turnId"]}
for kind, good in GOOD.items():
    stage = "before_hello" if kind == "hello" else "session"
    for name in REQUIRED[kind]:
        body = {k: v for k, v in good.items() if k != name}
        frame(f"missing-{kind}-{name}", f"{kind} without {name}", {"json": body},
              "MISSING_FIELD", stage)
    for name in good:
        for i, value in enumerate(WRONG_VALUES.get(name, [])):
            code = "INVALID_FIELD"
            if name == "protocol" and value is None:
                code = "INVALID_FIELD"
            if (kind, name, value) == ("hello", "client", None):
                continue
            frame(f"wrong-{kind}-{name}-{i}", f"{kind}.{name} = {json.dumps(value)[:40]}",
                  {"json": {**good, name: value}}, code, stage)
    if kind == "hello":
        for name in ("client", "sessionId", "resumeToken"):
            for i, value in enumerate(WRONG_VALUES[name]):
                if name == "resumeToken":
                    body = {**good, "sessionId": "$OTHER_SESSION", name: value}
                else:
                    body = {**good, name: value}
                frame(f"wrong-hello-{name}-{i}", f"hello.{name} = {json.dumps(value)[:40]}",
                      {"json": body}, "INVALID_FIELD", "before_hello")
for version in (0, 2, -1, 10**20):
    frame(f"protocol-{version}", f"hello with protocol {version}",
          {"json": {**GOOD["hello"], "protocol": version}}, "UNSUPPORTED_PROTOCOL",
          "before_hello")

# a lone surrogate ("\ud800" once decoded) in each field: refused, whatever the field
SURROGATE_FIELDS: list[tuple[str, str, dict[str, Any]]] = [
    ("hello-tool-name", "before_hello", {**GOOD["hello"], "tools": [{**META, "name": "t\ud800"}]}),
    ("hello-tool-description", "before_hello",
     {**GOOD["hello"], "tools": [{**META, "description": "\udc00"}]}),
    ("hello-schema-key", "before_hello", {**GOOD["hello"], "tools": [
        {**META, "argsSchema": {"type": "object", "properties": {"\ud800": {}}}}]}),
    ("hello-schema-const", "before_hello", {**GOOD["hello"], "tools": [
        {**META, "argsSchema": {"type": "object", "const": ["\ud83d"]}}]}),
    ("hello-annotation-title", "before_hello",
     {**GOOD["hello"], "tools": [{**META, "annotations": {"title": "\udfff"}}]}),
    ("hello-client-value", "before_hello", {**GOOD["hello"], "client": {"ua": "\ud800"}}),
    ("hello-client-key", "before_hello", {**GOOD["hello"], "client": {"\ud800": 1}}),
    ("hello-session-id", "before_hello", {**GOOD["hello"], "sessionId": "\ud800",
                                          "resumeToken": "$OTHER_TOKEN"}),
    ("tools-update-description", "session",
     {**GOOD["tools.update"], "tools": [{**META, "description": "d\ud800"}]}),
    ("turn-start-text", "session", {**GOOD["turn.start"], "text": "/call t {}\ud800"}),
    ("turn-start-turn-id", "session", {**GOOD["turn.start"], "turnId": "t\udc00"}),
    ("result-nested-value", "session", {**RESULT, "result": {"a": [{"b": "\ud800"}]}}),
    ("result-key", "session", {**RESULT, "result": {"\udc00": 1}}),
    ("result-error-message", "session", {**RESULT, "result": {"error": {
        "code": "E", "message": "\ud800"}}}),
    ("result-request-id", "session", {**RESULT, "toolRequestId": "\ud800"}),
    ("result-handled-by", "session", {**RESULT, "handledBy": "named\ud800"}),
    ("turn-cancel-turn-id", "session", {"type": "turn.cancel", "turnId": "\udfff"}),
]
for cid, stage, body in SURROGATE_FIELDS:
    frame(f"surrogate-{cid}", f"a lone surrogate in {cid.replace('-', ' ')}", {"json": body},
          "FRAME_NOT_JSON", stage)

# tool metadata breaking define_tool's rules
BAD_META: list[tuple[str, Any]] = [
    ("not-object", "t"), ("no-name", {"description": "d", "argsSchema": {}}),
    ("bad-name-space", {**META, "name": "a b"}), ("bad-name-long", {**META, "name": "n" * 65}),
    ("bad-name-empty", {**META, "name": ""}), ("bad-name-dot", {**META, "name": "a.b"}),
    ("empty-description", {**META, "description": ""}),
    ("description-not-string", {**META, "description": 1}),
    ("no-schema", {"name": "t", "description": "d"}),
    ("schema-not-object", {**META, "argsSchema": "object"}),
    ("schema-bad-type", {**META, "argsSchema": {"type": "objekt"}}),
    ("schema-array-type", {**META, "argsSchema": {"type": "array"}}),
    ("schema-remote-ref", {**META, "argsSchema": {"type": "object",
                                                   "$ref": "http://example.com/s.json"}}),
    ("schema-bad-required", {**META, "argsSchema": {"type": "object", "required": "x"}}),
    ("schema-bad-pattern", {**META, "argsSchema": {"type": "object", "properties": {
        "s": {"type": "string", "pattern": "("}}}}),
    ("schema-negative-min", {**META, "argsSchema": {"type": "object", "properties": {
        "s": {"type": "string", "minLength": -1}}}}),
    # shapes that cost super-linear work before they were refused (issue 10)
    ("schema-ref-chain-loop", {**META, "argsSchema": {
        "type": "object", "allOf": [{"$ref": "#/$defs/d0"}], "$defs": {
            **{f"d{i}": {"allOf": [{"$ref": f"#/$defs/d{i + 1}"}]} for i in range(999)},
            "d999": {"anyOf": [{"$ref": "#/$defs/d0"}]}}}}),
    ("schema-pattern-too-long", {**META, "argsSchema": {"type": "object", "properties": {
        "s": {"type": "string", "pattern": "(?i)" + "[\u0100-\uffff]" * 200}}}}),
    ("schema-pattern-property-too-long", {**META, "argsSchema": {
        "type": "object", "patternProperties": {"a" * 1001: {}}}}),
    ("schema-pattern-nested-groups", {**META, "argsSchema": {"type": "object", "properties": {
        "s": {"type": "string", "pattern": "(" * 450 + ")" * 450}}}}),
    ("bad-annotation", {**META, "annotations": {"readOnlyHint": "yes"}}),
    ("unknown-annotation", {**META, "annotations": {"dangerHint": True}}),
]
for name, meta in BAD_META:
    frame(f"tool-{name}", f"hello with tool metadata: {name}",
          {"json": {**GOOD["hello"], "tools": [meta]}}, "INVALID_TOOL", "before_hello")
frame("tool-listed-twice", "hello listing one tool twice",
      {"json": {**GOOD["hello"], "tools": [META, META]}}, "INVALID_TOOL", "before_hello")
for name, meta in BAD_META[:6]:
    frame(f"update-tool-{name}", f"tools.update with tool metadata: {name}",
          {"json": {"type": "tools.update", "tools": [meta]}}, "INVALID_TOOL")

# session-level: order, ids, replays, resume
for kind in ("tools.update", "turn.start", "tool.result", "turn.cancel"):
    body = {**GOOD[kind]}
    frame(f"before-hello-{kind}", f"{kind} before hello", {"json": body}, "HELLO_REQUIRED",
          "before_hello")
frame("before-hello-type-last", "a tools.update whose type comes last, before hello",
      {"json": {"tools": [META], "type": "tools.update"}}, "HELLO_REQUIRED", "before_hello")
frame("before-hello-hello-type-last", "a hello whose type is not its first member (before "
      "hello Core reads a leading type only)",
      {"json": {"protocol": 1, "tools": [META], "type": "hello"}}, "HELLO_REQUIRED",
      "before_hello")
frame("before-hello-hello-escaped", "a hello whose type is spelt with an escape",
      {"text": '{"type":"hell\\u006f","protocol":1,"tools":[]}'}, "HELLO_REQUIRED",
      "before_hello")
frame("before-hello-binary-update", "a binary tools.update before hello",
      {"bytes_hex": json.dumps({"type": "tools.update", "tools": [META]}).encode().hex()},
      "HELLO_REQUIRED", "before_hello")
frame("before-hello-not-json", "text that is not JSON before hello", {"text": "not json"},
      "HELLO_REQUIRED", "before_hello")
frame("hello-twice", "a second hello on one connection", {"json": GOOD["hello"]},
      "DUPLICATE_HELLO")
frame("hello-twice-resume", "a second hello, resuming another session, on an open one",
      {"json": {**GOOD["hello"], "sessionId": "$OTHER_SESSION",
                "resumeToken": "$OTHER_TOKEN"}}, "DUPLICATE_HELLO")
for cid, extra in (
    ("wrong-token", {"sessionId": "$OTHER_SESSION", "resumeToken": "$WRONG_TOKEN"}),
    ("wrong-token-same-length", {"sessionId": "$OTHER_SESSION",
                                 "resumeToken": "$WRONG_TOKEN_SAME_LENGTH"}),
    ("no-token", {"sessionId": "$OTHER_SESSION"}),
    ("null-token", {"sessionId": "$OTHER_SESSION", "resumeToken": None}),
    ("own-token-other-session", {"sessionId": "$OTHER_SESSION",
                                 "resumeToken": "$THIRD_TOKEN"}),
    ("unknown-session", {"sessionId": "no-such-session", "resumeToken": "$OTHER_TOKEN"}),
    ("token-as-session-id", {"sessionId": "$OTHER_TOKEN", "resumeToken": "$OTHER_TOKEN"}),
):
    frame(f"resume-{cid}", f"resume refused: {cid.replace('-', ' ')}",
          {"json": {**GOOD["hello"], **extra}}, "RESUME_REFUSED", "before_hello")
for cid, rid in (("never-issued", "never-issued"), ("other-session", "$OTHER_PENDING"),
                 ("other-session-done", "$OTHER_DONE"), ("session-id", "$SESSION"),
                 ("max-length", "x" * 128), ("unicode", "\u00e9t\u00e9")):
    frame(f"result-{cid}", f"a result for an id this session never had: {cid}",
          {"json": {**RESULT, "toolRequestId": rid}}, "UNKNOWN_TOOL_REQUEST")
for handled_by in ("named", "inline", "fallback", "none"):
    frame(f"replay-result-{handled_by}", f"a result replayed for an answered request "
          f"(handledBy {handled_by})",
          {"json": {**RESULT, "toolRequestId": "$DONE", "handledBy": handled_by}},
          "DUPLICATE_RESULT")
frame("replay-error-result", "an error result replayed for an answered request",
      {"json": {**RESULT, "toolRequestId": "$DONE",
                "result": {"error": {"code": "X", "message": "y"}}}}, "DUPLICATE_RESULT")
frame("late-result", "a result after the request timed out", {"json": {
    **RESULT, "toolRequestId": "$LATE"}}, "LATE_RESULT")
for turn_id in ("never-started", "$SESSION", "$PENDING"):
    frame(f"cancel-unknown-turn-{turn_id.strip('$').lower()}", "turn.cancel for a turn that "
          "is not running", {"json": {"type": "turn.cancel", "turnId": turn_id}},
          "UNKNOWN_TURN")


# --- tool args against the demo tools' schemas ---------------------------------------------
# web/demo/tools.py: update_counter(delta: a safe integer, |delta| <= 2**53 - 1) and four
# tools without parameters; their schemas use type (object, integer), minimum, maximum,
# properties, required, additionalProperties.

def args(cid: str, tool: str, value: Any, path: str, description: str) -> None:
    case("args", cid, description, "core+session", {"tool": tool, "args": value},
         {"code": "INVALID_ARGS", "path": path})


for cid, value in (("string", "3"), ("float", 1.5), ("bool-true", True), ("bool-false", False),
                   ("null", None), ("array", [1]), ("object", {"n": 1}),
                   ("numeric-string", "1e3"), ("empty-string", ""), ("negative-float", -0.5),
                   ("huge-string", "9" * 60_000)):
    args(f"update_counter-delta-{cid}", "update_counter", {"delta": value}, "$.delta",
         f"type integer: delta = {json.dumps(value)[:30]}")
for cid, value in (("over-safe-integer", 2**53), ("under-safe-integer", -(2**53)),
                   ("huge-integer", 99999999999999999999999), ("huge-float", 1e23)):
    args(f"update_counter-delta-{cid}", "update_counter", {"delta": value}, "$.delta",
         f"a safe integer (the counter is also a JS number): delta = {value!r}")
args("update_counter-missing", "update_counter", {}, "$", "required: no delta")
args("update_counter-wrong-name", "update_counter", {"Delta": 1}, "$",
     "required + additionalProperties: Delta instead of delta")
args("update_counter-extra", "update_counter", {"delta": 1, "extra": 1}, "$",
     "additionalProperties: false, one extra key")
args("update_counter-extra-huge-key", "update_counter", {"delta": 1, "k" * 50_000: 1}, "$",
     "additionalProperties: an extra key of 50,000 characters")
for cid, value in (("array", [1]), ("string", "delta=1"), ("number", 1), ("null", None),
                   ("bool", True)):
    args(f"update_counter-args-{cid}", "update_counter", value, "$",
         f"type object: args = {json.dumps(value)}")
for tool in ("get_current_page", "get_selection", "save_document", "word_stats"):
    for cid, value in (("extra", {"x": 1}), ("huge-string", {"x": "a" * 60_000}),
                       ("array", []), ("string", "{}"), ("nested", {"a": {"b": [1, {}]}})):
        args(f"{tool}-{cid}", tool, value, "$",
             f"{tool} takes no arguments: {cid}")


# --- handler results in CPython, through a real Session ------------------------------------
# input.python: an expression evaluated by the runner (namespace: math, datetime, decimal,
# fractions, uuid, pathlib, enum, array; `cycle_list()` and `cycle_dict()` build cycles).

def pyresult(cid: str, expression: str, code: str, path: str, description: str,
             type_contains: str | None = None) -> None:
    expect: dict[str, Any] = {"code": code, "path": path}
    if type_contains:
        expect["type_contains"] = type_contains
    case("results", cid, description, "core+session", {"python": expression}, expect)


INVALID = "TOOL_RESULT_INVALID"
for cid, expr, path, kind in (
    ("nan", "float('nan')", "$", "float"), ("inf", "float('inf')", "$", "float"),
    ("minus-inf", "-math.inf", "$", "float"), ("nan-in-list", "[1, math.nan]", "$[1]", "float"),
    ("inf-in-dict", "{'a': {'b': math.inf}}", "$.a.b", "float"),
    ("bytes", "b'abc'", "$", "bytes"), ("bytearray", "bytearray(b'x')", "$", "bytearray"),
    ("memoryview", "memoryview(b'x')", "$", "memoryview"), ("set", "{1, 2}", "$", "set"),
    ("frozenset", "frozenset()", "$", "frozenset"), ("complex", "1j", "$", "complex"),
    ("datetime", "datetime.datetime(2024, 1, 1)", "$", "datetime"),
    ("date", "datetime.date(2024, 1, 1)", "$", "date"),
    ("timedelta", "datetime.timedelta(1)", "$", "timedelta"),
    ("decimal", "decimal.Decimal('1.5')", "$", "Decimal"),
    ("fraction", "fractions.Fraction(1, 3)", "$", "Fraction"),
    ("uuid", "uuid.UUID(int=1)", "$", "UUID"), ("path", "pathlib.PurePosixPath('/x')", "$",
                                                   "PurePosixPath"),
    ("object", "object()", "$", "object"), ("function", "len", "$", "builtin_function"),
    ("lambda", "lambda: 1", "$", "function"), ("class", "int", "$", "type"),
    ("module", "math", "$", "module"), ("range", "range(3)", "$", "range"),
    ("generator", "(i for i in range(3))", "$", "generator"),
    ("iterator", "iter([1])", "$", "iterator"), ("ellipsis", "...", "$", "ellipsis"),
    ("not-implemented", "NotImplemented", "$", "NotImplemented"),
    ("exception-value", "ValueError('x')", "$", "ValueError"),
    ("enum-nonjson", "enum.Enum('E', 'A').A", "$", "E"),
    ("array-module", "array.array('i', [1])", "$", "array"),
    ("int-key", "{1: 'a'}", '$["1"]', "int"), ("none-key", "{None: 1}", "$.None", "None"),
    ("tuple-key", "{(1, 2): 1}", '$["(1, 2)"]', "tuple"),
    ("float-key-nested", "{'a': {1.5: 1}}", '$.a["1.5"]', "float"),
    ("cycle-list", "cycle_list()", "$[0]", "list"), ("cycle-dict", "cycle_dict()", "$.self",
                                                      "dict"),
    ("set-deep", "{'a': [{'b': {3}}]}", "$.a[0].b", "set"),
    ("bytes-in-tuple", "(1, b'x')", "$[1]", "bytes"),
    ("too-deep", "nest(150)", "$" + "[0]" * 99, "list"),
):
    pyresult(cid, expr, INVALID, path, f"a handler returns {expr}", kind)
pyresult("too-large", "'x' * (1024 * 1024 + 1)", "TOOL_RESULT_TOO_LARGE", "$",
         "a result over 1 MiB of JSON")
pyresult("too-large-list", "['\u20ac' * 1000] * 400", "TOOL_RESULT_TOO_LARGE", "$",
         "a list of non-ASCII strings over 1 MiB of UTF-8")


# --- handler results in the page (Chromium) ------------------------------------------------
# input.js: a JS expression; the page's Python handler returns pyodide.code.run_js(expr).
# expect.code: the error code of the result; expect.value: the JSON result itself.

def pageresult(cid: str, expression: str, expect: dict[str, Any], description: str) -> None:
    case("page-results", cid, description, "page", {"js": expression}, expect)


for cid, expr in (
    ("dom-node", "document.body"), ("dom-element", "document.createElement('div')"),
    ("dom-text", "document.createTextNode('x')"),
    ("dom-nodelist", "document.querySelectorAll('*')"),
    ("document", "document"), ("window", "window"), ("function", "(() => 1)"),
    ("class", "(class A {})"), ("async-function", "(async () => 1)"),
    ("uint8array", "new Uint8Array([1, 2])"), ("float64array", "new Float64Array(2)"),
    ("arraybuffer", "new ArrayBuffer(8)"), ("dataview", "new DataView(new ArrayBuffer(4))"),
    ("map", "new Map([['a', 1]])"), ("set", "new Set([1])"), ("weakmap", "new WeakMap()"),
    ("date", "new Date(0)"), ("regexp", "/x/g"), ("error", "new Error('x')"),
    ("symbol", "Symbol('s')"), ("plain-object", "({a: 1})"), ("array", "[1, 2]"),
    ("event", "new Event('x')"), ("blob", "new Blob(['x'])"), ("url", "new URL('http://x/')"),
    ("proxy", "new Proxy({}, {})"), ("promise-of-object", "Promise.resolve({a: 1})"),
    ("nan", "NaN"), ("infinity", "Infinity"),
):
    pageresult(cid, expr, {"code": "TOOL_RESULT_INVALID"},
               f"a page handler returns the JS value {expr}")
pageresult("promise-rejected", "Promise.reject(new Error('nope'))",
           {"code": "TOOL_HANDLER_ERROR"}, "a rejected Promise is a handler error")
pageresult("throws", "(() => { throw new TypeError('bad') })()",
           {"code": "TOOL_HANDLER_ERROR"}, "JS code that throws")
for cid, expr, value in (("promise-number", "Promise.resolve(42)", 42),
                         ("number", "1.5", 1.5), ("string-markup", "'<b>x</b>'", "<b>x</b>"),
                         ("bool", "true", True), ("undefined", "undefined", None),
                         ("bigint-huge", "2n ** 70n", 2**70)):
    pageresult(cid, expr, {"value": value},
               f"a JS value Pyodide converts to a JSON type: {expr}")


# --- control API requests ------------------------------------------------------------------
# input: method, path ($SESSION: a live session's id), auth ("good" by default, "none",
# "wrong", "wrong-same-length", "basic", "lowercase-scheme", "no-scheme", "token-in-query"),
# body (text), or make: {"kind": "big_body", "bytes": N}; headers_hex: [[name, value as
# hex], ...] sent as they are (repeats included); host: the Host header sent.

def control(cid: str, description: str, input: dict[str, Any], status: int,
            code: str | None) -> None:
    expect: dict[str, Any] = {"status": status}
    if code is not None:
        expect["code"] = code
    case("control", cid, description, "control", input, expect)


ROUTES = [("GET", "/pedelec/v1/sessions"), ("GET", "/pedelec/v1/sessions/$SESSION"),
          ("POST", "/pedelec/v1/sessions/$SESSION/tool-calls"),
          ("POST", "/pedelec/v1/sessions/$SESSION/turns")]
for method, path in ROUTES:
    short = path.rsplit("/", 1)[-1].replace("$SESSION", "session")
    for auth in ("none", "wrong", "wrong-same-length", "basic", "no-scheme", "token-in-query",
                 "bearer-no-token"):
        control(f"auth-{auth}-{method.lower()}-{short}", f"{method} {path} with auth {auth}",
                {"method": method, "path": path, "auth": auth,
                 "body": '{"tool": "echo", "args": {}, "text": "x"}'}, 401, "UNAUTHORIZED")
for method, path in ROUTES[1:]:
    short = path.rsplit("/", 1)[-1].replace("$SESSION", "session")
    for sid in ("no-such-session", "%00", "x" * 300):
        control(f"unknown-session-{short}-{sid[:10]}", f"{method} for an unknown session",
                {"method": method, "path": path.replace("$SESSION", sid),
                 "body": '{"tool": "echo", "args": {}, "text": "x"}'}, 404,
                "SESSION_NOT_FOUND")
TOOL_CALLS = "/pedelec/v1/sessions/$SESSION/tool-calls"
TURNS = "/pedelec/v1/sessions/$SESSION/turns"
for cid, body in (("empty", ""), ("not-json", "tool=echo"), ("array", "[]"), ("string", '"x"'),
                  ("null", "null"), ("truncated", '{"tool": "echo"'),
                  ("nan-args", '{"tool": "echo", "args": NaN}'),
                  ("infinity-timeout", '{"tool": "echo", "timeoutMs": Infinity}'),
                  ("lone-surrogate", '{"tool": "echo", "args": {"s": "\\ud800"}}'),
                  ("lone-surrogate-key", '{"tool": "echo", "args": {"\\udc00": 1}}'),
                  ("lone-surrogate-nested",
                   '{"tool": "echo", "args": {"a": [1, {"b": "x\\ud83d"}]}}'),
                  ("lone-surrogate-tool", '{"tool": "echo\\ud800"}'),
                  ("deep-body", "[" * 60_000),
                  ("deep-args", '{"tool": "echo", "args": ' + "[" * 150 + "]" * 150 + "}"),
                  ("no-tool", '{"args": {}}'), ("tool-number", '{"tool": 1}'),
                  ("tool-null", '{"tool": null}'), ("tool-bad-name", '{"tool": "a b"}'),
                  ("tool-too-long", json.dumps({"tool": "t" * 65})),
                  ("timeout-zero", '{"tool": "echo", "timeoutMs": 0}'),
                  ("timeout-negative", '{"tool": "echo", "timeoutMs": -5}'),
                  ("timeout-float", '{"tool": "echo", "timeoutMs": 1.5}'),
                  ("timeout-string", '{"tool": "echo", "timeoutMs": "100"}'),
                  ("timeout-bool", '{"tool": "echo", "timeoutMs": true}'),
                  ("timeout-over-a-day", '{"tool": "echo", "timeoutMs": 86400001}'),
                  ("timeout-400-digits", '{"tool": "echo", "timeoutMs": 1' + "0" * 400 + "}"),
                  ("wait-for-page-string", '{"tool": "echo", "waitForPage": "false"}'),
                  ("wait-for-page-number", '{"tool": "echo", "waitForPage": 0}'),
                  ("wait-for-page-null", '{"tool": "echo", "waitForPage": null}')):
    control(f"tool-calls-{cid}", f"tool-calls body: {cid}",
            {"method": "POST", "path": TOOL_CALLS, "body": body}, 400, "BAD_REQUEST")
control("tool-calls-not-utf8", "tool-calls body: bytes that are not UTF-8",
        {"method": "POST", "path": TOOL_CALLS, "body_hex": "7b22746f6f6c223a22ff227d"}, 400,
        "BAD_REQUEST")
for cid, body in (("empty", ""), ("no-text", "{}"), ("text-number", '{"text": 1}'),
                  ("text-null", '{"text": null}'), ("text-array", '{"text": ["x"]}'),
                  ("lone-surrogate", '{"text": "\\udc00"}'), ("array", "[]"),
                  ("lone-surrogate-other-field",
                   '{"text": "/call echo {}", "extra": ["\\ud800"]}')):
    control(f"turns-{cid}", f"turns body: {cid}", {"method": "POST", "path": TURNS,
                                                  "body": body}, 400, "BAD_REQUEST")
control("turns-encoded-surrogate", "turns body: a surrogate encoded in the bytes (CESU-8)",
        {"method": "POST", "path": TURNS, "body_hex": '{"text": "\ud800"}'.encode(
            "utf-8", "surrogatepass").hex()}, 400, "BAD_REQUEST")
control("tool-calls-big-body", "a tool-calls body over the frame limit",
        {"method": "POST", "path": TOOL_CALLS, "make": {"kind": "big_body", "bytes": 200_000}},
        413, "PAYLOAD_TOO_LARGE")
control("turns-big-body", "a turns body over the frame limit",
        {"method": "POST", "path": TURNS, "make": {"kind": "big_body", "bytes": 200_000}},
        413, "PAYLOAD_TOO_LARGE")
control("tool-calls-args-over-frame", "args that make a tool.request over the page's limit",
        {"method": "POST", "path": TOOL_CALLS,
         "make": {"kind": "big_args", "bytes": 65_500}}, 413, "PAYLOAD_TOO_LARGE")
for cid, query in (("yes", "yes"), ("empty", ""), ("upper", "TRUE"), ("long", "t" * 5000),
                   ("nul", "%00")):
    control(f"sessions-connected-{cid}", f"GET /sessions?connected= {cid}",
            {"method": "GET", "path": f"/pedelec/v1/sessions?connected={query}"}, 400,
            "BAD_REQUEST")
for method, path in (("DELETE", TOOL_CALLS), ("GET", TOOL_CALLS), ("PUT", TURNS),
                     ("POST", "/pedelec/v1/sessions")):
    control(f"method-{method.lower()}-{path.rsplit('/', 1)[-1].strip('$').lower()}",
            f"{method} {path}: not allowed", {"method": method, "path": path}, 405, None)

KEY = "Idempotency-Key"
for cid, value in (("empty", b""), ("129-chars", b"k" * 129),
                   ("129-two-byte-chars", "\u00e9".encode() * 129),
                   ("not-utf8", b"\xff\xfe"), ("encoded-surrogate", b"\xed\xa0\x80"),
                   ("overlong-utf8", b"\xc0\xaf"), ("truncated-utf8", b"k\xe2\x82")):
    for path, body in ((TOOL_CALLS, '{"tool": "echo", "args": {}}'), (TURNS, '{"text": "x"}')):
        control(f"idempotency-key-{cid}-{path.rsplit('/', 1)[-1]}",
                f"{KEY} header: {cid}", {"method": "POST", "path": path, "body": body,
                                         "headers_hex": [[KEY, value.hex()]]}, 400,
                "BAD_REQUEST")
control("idempotency-key-twice", f"two {KEY} headers",
        {"method": "POST", "path": TOOL_CALLS, "body": '{"tool": "echo", "args": {}}',
         "headers_hex": [[KEY, b"a".hex()], [KEY, b"a".hex()]]}, 400, "BAD_REQUEST")
for cid, rid in (("unknown", "no-such-request"), ("long", "r" * 2000), ("percent", "%00%ff")):
    control(f"tool-request-{cid}", "GET a tool request the session never had",
            {"method": "GET", "path": f"{TOOL_CALLS}/{rid}"}, 404, "TOOL_REQUEST_NOT_FOUND")
# DNS rebinding: a Host that is not one of Core's names reaches no route, with any token
for method, path in [("GET", "/pedelec/v1/health"), *ROUTES]:
    short = path.rsplit("/", 1)[-1].replace("$SESSION", "session")
    for host, status in (("evil.example", 421), ("localhost.evil.example:8765", 421),
                         ("127.0.0.1.evil.example", 421), ("127.1", 421),
                         ("::1", 400), ("localhost:port", 400), ("user@localhost", 400)):
        control(f"host-{host.replace(':', '-')}-{method.lower()}-{short}",
                f"{method} {path} with Host {host}",
                {"method": method, "path": path, "host": host,
                 "body": '{"tool": "echo", "args": {}, "text": "x"}'}, status, None)


# --- damaged rows in a store file -------------------------------------------------------
# input: table, and the columns that differ from a good row of that table (the runner's
# base row; requests and turns belong to a good session of their own unless they say
# otherwise). A value is JSON (null: SQL NULL), or {"utf8_hex": ...}: text made of these
# bytes, which need not be UTF-8. Every case is skipped with a warning at start.

def store_row(cid: str, description: str, table: str, columns: dict[str, Any]) -> None:
    case("store-rows", cid, description, "store", {"table": table, "columns": columns},
         {"skipped": True})


TOOL = json.dumps([META])
for column, value, what in (
        ("id", None, "a NULL id"), ("id", 7, "a number for an id"),
        ("id", "x" * 129, "an id over 128 characters"),
        ("token_hash", None, "a NULL token hash"),
        ("token_hash", "a-token-in-clear", "a token hash that is not sha256 hex"),
        ("tools", "[", "tools that are not JSON"), ("tools", '{"a": 1}', "tools not a list"),
        ("tools", "[1]", "a tool that is not an object"),
        ("tools", json.dumps([{**META, "name": "no spaces"}]), "a tool with a bad name"),
        ("tools", TOOL[:-1] + ", " + TOOL[1:], "a tool listed twice"),
        ("tools", {"utf8_hex": "5bff5d"}, "tools that are not UTF-8"),
        ("tools", None, "NULL tools"),
        ("history", '[{"a": "\\ud800"}]', "a lone surrogate escaped in the history"),
        ("history", "[1]", "a history entry that is not an object"),
        ("history", "[NaN]", "NaN in the history"),
        ("history", "[" * 100_000, "a history nested past the recursion limit"),
        ("created_at", "yesterday", "a creation time that is text"),
        ("created_at", None, "a NULL creation time")):
    store_row(f"session-{column}-{len(cases.get('store-rows', []))}", f"session: {what}",
              "sessions", {column: value})
for column, value, what in (
        ("session_id", "nobody", "a request of an unknown session"),
        ("session_id", None, "a request with a NULL session"),
        ("turn_id", 5, "a number for a turn id"),
        ("step", "x", "a step that is text"), ("step", -1, "a negative step"),
        ("step", 1.5, "a step that is not whole"), ("idx", None, "a NULL index"),
        ("tool", None, "a NULL tool"), ("args", "{", "args that are not JSON"),
        ("args", None, "NULL args"), ("deadline", None, "a NULL deadline"),
        ("deadline", "soon", "a deadline that is text"),
        ("result", "{", "a result that is not JSON"),
        ("handled_by", 3, "a number for handled_by")):
    store_row(f"request-{column}-{len(cases['store-rows'])}", f"request: {what}", "requests",
              {column: value})
for column, value, what in (
        ("session_id", "nobody", "a turn of an unknown session"),
        ("text", None, "a NULL text"), ("status", "weird", "an unknown status"),
        ("final_text", 3, "a number for the final text"),
        ("error", '"boom"', "an error that is not an object"),
        ("error", "{", "an error that is not JSON"),
        ("tool_calls", "{", "tool calls that are not JSON"),
        ("tool_calls", "[1]", "a tool call that is not an object"),
        ("end_delivered", "yes", "end_delivered that is text"),
        ("end_delivered", 2, "end_delivered neither 0 nor 1"),
        ("created_at", None, "a NULL creation time"),
        ("usage", "[1]", "usage that is not an object"),
        ("usage", '{"input_tokens": "many"}', "usage counts that are not numbers")):
    store_row(f"turn-{column}-{len(cases['store-rows'])}", f"turn: {what}", "turns",
              {column: value})


def main() -> None:
    for family, items in cases.items():
        ids = [c["id"] for c in items]
        assert len(ids) == len(set(ids)), f"duplicate ids in {family}"
        path = HERE / f"{family}.jsonl"
        path.write_text("".join(json.dumps(c, ensure_ascii=True) + "\n" for c in items))
        print(f"{path.name}: {len(items)} cases")
    print(f"total: {sum(len(v) for v in cases.values())}")


if __name__ == "__main__":
    main()
