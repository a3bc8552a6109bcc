"""The messages between Core nodes, declared once (core/cluster/messages.py): each parses
back from its encoding, fits its published JSON Schema (docs/reference/cluster.md, kept
in sync here), and whatever is not one of them is a BadMessage, never another error."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from pedelec_pyodide.core.cluster import messages
from pedelec_pyodide.core.cluster.messages import (
    BadMessage,
    HandedOver,
    HandOver,
    HttpCall,
    HttpReply,
    HungUp,
    McpCall,
    McpCancel,
    McpCancelled,
    McpProgress,
    McpReply,
    NodeMessage,
    ToolsChanged,
    parse,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "reference" / "cluster.md"

EXAMPLES: list[NodeMessage] = [
    HttpCall(ask="a" * 24, sender="b" * 16, method="POST", path="/pedelec/v1/sessions/s",
             query="x=1", headers=[["authorization", "Bearer t"]], body="{}",
             route_key=True),
    HttpReply(ask="a" * 24, status=200, body='{"ok":true}'),
    HungUp(ask="a" * 24),
    McpCall(ask="c" * 24, sender="b" * 16, session="s", tool="echo", args={"n": [1, None]},
            key="pedelec-mcp-" + "0" * 32),
    McpCall(ask="c" * 24, sender="b" * 16, session="s", tool="echo", args=None, key="k"),
    McpProgress(key="k", progress=1.5),
    McpProgress(key="k", progress=2.0, total=10.0, message="half"),
    McpReply(ask="c" * 24, result={"ok": True}),
    McpReply(ask="c" * 24, moved=True),
    McpCancel(ask="d" * 24, sender="b" * 16, key="k", session="s"),
    McpCancelled(ask="d" * 24),
    McpCancelled(ask="d" * 24, moved=True),
    ToolsChanged(session="s"),
    HandOver(session="s", to="e" * 16),
    HandedOver(session="s"),
]


def test_every_message_type_has_an_example() -> None:
    assert {example.type for example in EXAMPLES} == set(messages.MESSAGE_TYPES)


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda message: message.type)
def test_a_message_parses_back_from_its_encoding_and_fits_its_schema(
        message: NodeMessage) -> None:
    text = message.encode()
    assert parse(text) == message
    wire = json.loads(text)
    schema = messages.all_schemas()[message.type]
    Draft202012Validator.check_schema(schema)
    Draft202012Validator(schema).validate(wire)


@pytest.mark.skipif(not DOC.exists(), reason="docs/ is not shipped with the package")
def test_docs_list_exactly_the_schemas_of_the_code() -> None:
    text = DOC.read_text(encoding="utf-8")
    blocks = re.findall(r"#### `([A-Za-z.]+)`\n\n.*?\n\n```json\n(.*?)\n```", text, re.S)
    assert {kind: json.loads(body) for kind, body in blocks} == messages.all_schemas()


def _wire(base: NodeMessage, **changes: Any) -> str:
    wire = {**base.to_wire(), **changes}
    return json.dumps({key: value for key, value in wire.items() if value is not ...})


@pytest.mark.parametrize("text", [
    "not json", "[1]", '"http.call"', "[" * 100_000 + "]" * 100_000, "{}",
    json.dumps({"type": 1}),
    json.dumps({"type": "mcpCall"}),  # the keys the nodes once sniffed
    json.dumps({"handOver": "s", "to": "n"}),
    _wire(HandOver(session="s", to="n"), to=...),
    _wire(HandOver(session="s", to="n"), session=""),
    _wire(HttpReply(ask="a", status=200, body=""), status=True),
    _wire(HttpReply(ask="a", status=200, body=""), status=99),
    _wire(HttpReply(ask="a", status=200, body=""), status=200.0),
    _wire(HttpReply(ask="a", status=200, body=""), body=None),
    _wire(EXAMPLES[0], headers=[["a"]]),
    _wire(EXAMPLES[0], headers="authorization: x"),
    _wire(EXAMPLES[0], routeKey="yes"),
    _wire(McpProgress(key="k", progress=1), progress=10 ** 400),
    _wire(McpProgress(key="k", progress=1), progress=True),
    _wire(McpProgress(key="k", progress=1), total="all"),
    _wire(McpProgress(key="k", progress=1), message=3),
    _wire(McpReply(ask="a"), moved="true"),
])
def test_what_is_no_message_is_a_bad_message(text: str) -> None:
    with pytest.raises(BadMessage):
        parse(text)


def test_an_optional_field_may_be_null_or_absent_and_unknown_fields_are_ignored() -> None:
    assert parse('{"type":"mcp.progress","key":"k","progress":1,"total":null,"x":1}') \
        == McpProgress(key="k", progress=1.0)
    assert parse('{"type":"mcp.reply","ask":"a"}') == McpReply(ask="a")
