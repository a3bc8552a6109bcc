"""The agents of ``pedelec_pyodide.core.agents``: the offline agent, the scripted agent and
``make_agent``, run against a fake Turn (no Core, no page).

The fake Turn records every ``call_tools`` batch and every ``say``, answers with canned
results for the demo tools, and enforces ``max_steps`` the way Core does, by raising
``StepLimitExceeded``.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections.abc import Callable
from typing import Any

import pytest
from agentkit import FakeTurn, schema
from hypothesis import given, settings
from hypothesis import strategies as st

from pedelec_pyodide.core.agents import (
    AgentUnavailable,
    OfflineAgent,
    ScriptedAgent,
    make_agent,
)
from pedelec_pyodide.core.agents import offline as offline_module
from pedelec_pyodide.core.agents.contract import (
    Agent,
    StepLimitExceeded,
    ToolCallOutcome,
    ToolCallRequest,
)
from pedelec_pyodide.core.agents.offline import (
    _NO_VALUE,
    _QUOTED,
    _QUOTED_RE,
    MAX_FILL_NAMES,
    MAX_PHRASE_LOOKUPS,
    MAX_PROBLEMS,
    MAX_READ_CHARS,
    _convert,
    _Filler,
    _members,
    _unquote,
    best_tool,
    fill_args,
    render_result,
)
from pedelec_pyodide.core.sessions.history import appended_history
from pedelec_pyodide.core.store import JsonText


def run(agent: Agent, turn: FakeTurn) -> str:
    reply = asyncio.run(agent.run(turn))
    assert isinstance(reply, str)
    return reply


def offline(text: str, tools: list[dict[str, Any]] | None = None, **options: Any
            ) -> tuple[str, FakeTurn]:
    turn = FakeTurn(text, tools, **options)
    reply = run(OfflineAgent(), turn)
    # Invariants of every offline turn: the reply is streamed (at least one piece, and the
    # pieces make the reply exactly) and one JSON-compatible record goes into the history.
    assert turn.said and "".join(turn.said) == reply
    assert len(turn.history) == 1
    assert json.loads(json.dumps(turn.history[0])) == turn.history[0]
    return reply, turn


# --- /call lines -------------------------------------------------------------------------


def test_call_line_with_args_calls_the_tool_and_renders_its_result() -> None:
    reply, turn = offline('/call update_counter {"delta": 3}')
    assert turn.batches == [[ToolCallRequest("update_counter", {"delta": 3})]]
    assert reply == 'update_counter → {"value": 3}'


def test_call_line_without_args_sends_an_empty_object() -> None:
    reply, turn = offline("/call get_current_page")
    assert turn.calls == [("get_current_page", {})]
    assert reply == 'get_current_page → {"title": "Demo", "url": "http://127.0.0.1:8765/"}'


def test_several_call_lines_run_in_order_one_step_each() -> None:
    text = (
        '/call update_counter {"delta": 2}\n'
        "\n"
        "   /call get_current_page   \n"
        '/call update_counter {"delta": -5}\n'
    )
    reply, turn = offline(text)
    assert [[c.tool for c in batch] for batch in turn.batches] == [
        ["update_counter"], ["get_current_page"], ["update_counter"]
    ]
    assert turn.calls[2] == ("update_counter", {"delta": -5})
    assert reply.splitlines() == [
        'update_counter → {"value": 2}',
        'get_current_page → {"title": "Demo", "url": "http://127.0.0.1:8765/"}',
        'update_counter → {"value": -3}',
    ]
    assert turn.events == ["call", "say"] * 3  # each line is streamed as its result arrives


def test_each_call_line_s_args_are_decoded_twice_at_most_and_the_first_s_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A message is read whole before any call runs (one bad line stops them all); the
    first call runs as read, the others are read again at their step (a turn holds no
    decoded args but the running call's). Decoding is the costliest work on a long line."""
    decoded: list[str] = []
    decode = offline_module.strictjson.decode

    def counted(text: str) -> Any:
        decoded.append(text)
        return decode(text)

    monkeypatch.setattr(offline_module.strictjson, "decode", counted)
    first, second = '{"delta": 2}', '{"delta": -5}'
    _, turn = offline(f"/call update_counter {first}\n/call update_counter {second}")
    assert turn.calls == [("update_counter", {"delta": 2}), ("update_counter", {"delta": -5})]
    assert (decoded.count(first), decoded.count(second)) == (1, 2)


def test_call_line_args_keep_their_json_types() -> None:
    handlers = {"echo": lambda args: args}
    args = {"n": 2.5, "big": 10**30, "s": "x y", "list": [None, True], "o": {"k": "é"}}
    reply, turn = offline("/call echo " + json.dumps(args), handlers=handlers)
    assert turn.calls == [("echo", args)]
    assert reply == "echo → " + json.dumps(args, ensure_ascii=False)


def test_call_of_a_tool_the_session_does_not_list_is_still_sent() -> None:
    # A named or fallback handler in the page may serve a name with no definition.
    handlers = {"secret_tool": lambda args: {"ok": args}}
    reply, turn = offline('/call secret_tool {"a": 1}', handlers=handlers)
    assert turn.calls == [("secret_tool", {"a": 1})]
    assert reply == 'secret_tool → {"ok": {"a": 1}}'
    reply, _ = offline("/call nobody_home")
    assert reply == "nobody_home → error TOOL_HANDLER_NOT_FOUND: no handler for tool 'nobody_home'"


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ('/call update_counter {"delta": }', "line 1: the args for update_counter are not valid "
         "JSON: Expecting value at character 11"),
        ('/call update_counter {"delta": 1', "line 1: the args for update_counter are not valid "
         "JSON: Expecting ',' delimiter at character 12"),
        ("/call update_counter [1, 2]", "line 1: the args for update_counter must be a JSON "
         'object like {"key": 1}, got an array'),
        ("/call update_counter 5", "got not an object"),
        ('/call update_counter {"delta": NaN}', "NaN is not a JSON number"),
        ('/call update_counter {"delta": 1e999}', '"1e999" is too large for a JSON number'),
        ("/call", "line 1: no tool name after /call (write /call TOOL {json args})"),
        ("/call get.page {}", "line 1: \"get.page\" is not a tool name"),
        ("/call " + "x" * 65, "is not a tool name"),
        ('/call update_counter {"delta": ' + "[" * 100_000, "nested too deeply"),
        ('/call update_counter {"delta": ' + "9" * 5000 + "}", "line 1: the args for "
         "update_counter are not valid JSON: Exceeds the limit"),
    ],
)
def test_malformed_call_line_calls_nothing_and_says_why(line: str, problem: str) -> None:
    reply, turn = offline(line)
    assert turn.batches == []
    assert reply.startswith("Nothing was called: this line has a problem:\n")
    assert problem in reply
    assert reply.endswith("Write one call per line: /call TOOL {json args}")


def test_one_bad_line_stops_the_whole_message_and_every_problem_is_listed() -> None:
    text = (
        "/call get_current_page\n"
        "please also do this\n"
        "/call update_counter {oops}\n"
    )
    reply, turn = offline(text)
    assert turn.batches == []
    lines = reply.splitlines()
    assert lines[0] == "Nothing was called: these lines have problems:"
    assert lines[1] == ('line 2: "please also do this" is not a /call line; a message with '
                        "/call lines may hold only /call lines")
    assert lines[2].startswith("line 3: the args for update_counter are not valid JSON")
    assert len(lines) == 4


def test_the_reply_quotes_a_bounded_number_of_problems() -> None:
    """One /call line and 340,000 short bad lines (1 MiB) made a 32 MB reply, built,
    stored and sent on the event loop; the reply no longer grows with the message."""
    reply, turn = offline("/call get_current_page\n" + "a\n" * 340_000)
    assert turn.batches == []
    lines = reply.splitlines()
    assert lines[1].startswith("line 2: ")
    assert lines[MAX_PROBLEMS].startswith(f"line {MAX_PROBLEMS + 1}: ")
    assert lines[MAX_PROBLEMS + 1] == f"... and {340_000 - MAX_PROBLEMS} more lines with problems"
    assert len(reply) < 100 * MAX_PROBLEMS + 200


def test_more_call_lines_than_the_step_limit_calls_nothing() -> None:
    text = "\n".join(["/call get_current_page"] * 3)
    reply, turn = offline(text, max_steps=2)
    assert turn.batches == []
    assert reply == "Nothing was called: that takes 3 tool steps and this turn allows 2."


def test_a_word_starting_with_call_is_not_a_call_line() -> None:
    reply, turn = offline("/callme maybe")
    assert turn.batches == []
    assert reply.startswith("No tool fits that.")


# --- rendering results -------------------------------------------------------------------


def test_error_results_render_code_and_message() -> None:
    reply, _ = offline('/call save_document {"title": "a", "body": "b"}')
    assert reply == "save_document → error TOOL_HANDLER_ERROR: ZeroDivisionError: division by zero"


@pytest.mark.parametrize(
    ("result", "shown"),
    [
        ({"value": 3}, '{"value": 3}'),
        (None, "null"),
        ("naïve 文字", '"naïve 文字"'),
        ([1, 2.5, True], "[1, 2.5, true]"),
        ({"text": "two\nlines\u2028and\x85more"}, r'{"text": "two\nlines\u2028and\u0085more"}'),
        ({"error": {"code": "NO_SELECTION", "message": "There is no active editor selection.",
                    "details": {"documentId": 7}}},
         "error NO_SELECTION: There is no active editor selection."),
        ({"error": {"code": "BAD", "message": "line one\nline two"}},
         r'error BAD: "line one\nline two"'),
        ({"error": {"code": "QUIET"}}, "error QUIET"),
        # not error results: an error result's "error" is an object (results.is_error_result)
        ({"error": "just text"}, '{"error": "just text"}'),
        ({"error": None}, '{"error": null}'),
        ({"error": "x", "other": 1}, '{"error": "x", "other": 1}'),  # not an error result
    ],
)
def test_render_result_is_one_line(result: Any, shown: str) -> None:
    assert render_result(result) == shown
    assert len(shown.splitlines()) == 1


def test_every_call_gets_exactly_one_reply_line() -> None:
    handlers = {"echo": lambda args: args}
    text = '/call echo {"s": "a\\nb\\u2029c"}\n/call echo {"s": "\\u0085"}'
    reply, turn = offline(text, handlers=handlers)
    assert len(reply.splitlines()) == 2 == len(turn.batches)


# --- text matched to a tool --------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "tool", "args"),
    [
        ("increase the counter by 5", "update_counter", {"delta": 5}),
        ("decrease the counter by 2", "update_counter", {"delta": -2}),
        ("Subtract 4 from the counter.", "update_counter", {"delta": -4}),
        ("counter down 3", "update_counter", {"delta": -3}),
        ("add -3 to the counter", "update_counter", {"delta": -3}),
        ("decrease the counter by -3", "update_counter", {"delta": -3}),  # a sign is kept
        ("update_counter delta=7.", "update_counter", {"delta": 7}),
        ("what page am I on?", "get_current_page", {}),
        ("What's the title and URL of this page", "get_current_page", {}),
        ("what is selected?", "get_selection", {}),
        ("Save the document, title: 'Notes' body=\"Hello world\"", "save_document",
         {"title": "Notes", "body": "Hello world"}),
    ],
)
def test_text_is_matched_to_a_tool_with_args_from_the_text(
    text: str, tool: str, args: dict[str, Any]
) -> None:
    reply, turn = offline(text)
    assert turn.batches == [[ToolCallRequest(tool, args)]]
    first, second = reply.split("\n")
    assert first == f"Calling {tool} {json.dumps(args, ensure_ascii=False)}"
    assert second.startswith(f"{tool} → ")
    assert turn.events == ["say", "call", "say"]  # what it calls is said before it runs


def test_matched_call_reply_shows_the_result() -> None:
    reply, _ = offline("increase the counter by 5")
    assert reply == 'Calling update_counter {"delta": 5}\nupdate_counter → {"value": 5}'


def test_required_argument_the_text_does_not_give_is_asked_for() -> None:
    reply, turn = offline("bump the counter please")
    assert turn.batches == []
    assert reply == (
        "To call update_counter I need a value for delta (integer: How much to add). "
        'What should it be? For example: /call update_counter {"delta": 1}'
    )
    assert turn.history[0]["calls"] == []


def test_an_integer_property_takes_no_fraction() -> None:
    reply, turn = offline("add 2.5 to the counter")
    assert turn.batches == []
    assert reply.startswith("To call update_counter I need a value for delta (integer")


def test_several_missing_arguments_are_asked_for_together_keeping_what_was_given() -> None:
    reply, turn = offline("save the document")
    assert turn.batches == []
    assert reply == (
        "To call save_document I need values for title (string) and body (string). What "
        'should they be? For example: /call save_document {"title": "...", "body": "..."}'
    )
    reply, _ = offline('save the document with title "Notes"')
    assert reply == (
        "To call save_document I need a value for body (string). What should it be? "
        'For example: /call save_document {"title": "Notes", "body": "..."}'
    )


def test_text_no_tool_fits_lists_the_tools() -> None:
    reply, turn = offline("hello there")
    assert turn.batches == []
    assert reply == (
        "No tool fits that. The tools are:\n"
        "- get_current_page: Read the current page title and URL.\n"
        "- update_counter: Add delta to the counter shown on the page and return its new "
        "value.\n"
        "- get_selection: Read the text currently selected in the editor.\n"
        "- save_document: Save a document with a title and a body.\n"
        "Ask for one of them, or call it directly: /call TOOL {json args}"
    )


def test_a_single_description_word_is_below_the_threshold() -> None:
    # "editor" is only in get_selection's description: one description word scores 1 < 2.
    reply, turn = offline("editor")
    assert turn.batches == [] and reply.startswith("No tool fits that.")
    # two description words reach it
    reply, turn = offline("the editor text")
    assert turn.calls == [("get_selection", {})]


def test_a_session_without_tools() -> None:
    reply, turn = offline("increase the counter by 5", tools=[])
    assert reply == "No tool fits that, and this session has no tools yet."
    assert turn.batches == []


def test_name_words_outweigh_description_words() -> None:
    tools = [
        {"name": "read_notes", "description": "Read the counter notes and the counter log.",
         "argsSchema": schema()},
        {"name": "counter", "description": "The counter.", "argsSchema": schema()},
    ]
    _, turn = offline("counter notes log", tools)  # read_notes: 3 + 2, counter: 3 (+0)
    assert turn.calls == [("read_notes", {})]
    _, turn = offline("the counter", tools)  # read_notes: 1, counter: 3
    assert turn.calls == [("counter", {})]


def test_ties_go_to_more_name_words_then_to_the_earlier_tool() -> None:
    alpha = {"name": "alpha_report", "description": "Report.", "argsSchema": schema()}
    beta = {"name": "beta_report", "description": "Report.", "argsSchema": schema()}
    _, turn = offline("report", [alpha, beta])
    assert turn.calls == [("alpha_report", {})]
    _, turn = offline("report", [beta, alpha])
    assert turn.calls == [("beta_report", {})]
    # equal scores (3 each): the one scoring by a name word wins over description words
    gamma = {"name": "gamma", "description": "Weekly sales totals.", "argsSchema": schema()}
    delta = {"name": "weekly", "description": "Something.", "argsSchema": schema()}
    _, turn = offline("weekly sales totals", [gamma, delta])
    assert turn.calls == [("weekly", {})]


def test_args_from_enums_booleans_defaults_and_named_values() -> None:
    tool = {
        "name": "set_theme",
        "description": "Switch the page theme.",
        "argsSchema": schema(
            {
                "theme": {"enum": ["light", "dark", "sepia"]},
                "animate": {"type": "boolean"},
                "speed": {"type": "number", "default": 1.0},
                "label": {"type": "string", "default": "main"},
            },
            ["theme", "animate"],
        ),
    }
    _, turn = offline("set the theme to dark or light, yes animate it", [tool])
    assert turn.calls == [
        ("set_theme", {"theme": "dark", "animate": True, "speed": 1.0, "label": "main"})
    ]
    _, turn = offline("theme: SEPIA animate=false speed 2.5 label='top bar'", [tool])
    assert turn.calls == [
        ("set_theme", {"theme": "sepia", "animate": False, "speed": 2.5, "label": "top bar"})
    ]
    reply, turn = offline("switch the theme", [tool])
    assert turn.batches == []
    assert reply.startswith(
        'To call set_theme I need values for theme (one of "light", "dark", "sepia") and '
        "animate (boolean)."
    )
    assert reply.endswith(
        '/call set_theme {"speed": 1.0, "label": "main", "theme": "light", "animate": true}'
    )


def test_an_empty_enum_value_is_never_mentioned() -> None:
    tool = {"name": "pick_mode", "description": "Pick a mode.",
            "argsSchema": schema({"mode": {"enum": ["", "fast", 3]}}, ["mode"])}
    _, turn = offline("pick mode 3 or fast", [tool])
    assert turn.calls == [("pick_mode", {"mode": 3})]
    reply, turn = offline("pick a mode", [tool])
    assert turn.batches == []
    assert 'mode (one of "", "fast", 3)' in reply


def test_a_blank_property_name_is_never_read_from_the_text() -> None:
    tool = {"name": "odd_tool", "description": "Odd.",
            "argsSchema": schema({" ": {"type": "string"}, "n": {"default": 0}}, [" "])}
    _, turn = offline("odd tool = 'x'", [tool])
    assert turn.calls == [("odd_tool", {" ": "x", "n": 0})]  # the only string property
    reply, turn = offline("odd tool", [tool])
    assert reply.endswith('For example: /call odd_tool {"n": 0, " ": "..."}')


def test_a_single_string_property_takes_the_first_quoted_string_numbers_in_quotes_ignored(
) -> None:
    tool = {
        "name": "rename_chapter",
        "description": "Rename a chapter.",
        "argsSchema": schema(
            {"name": {"type": "string"}, "number": {"type": "integer"}}, ["name", "number"]
        ),
    }
    _, turn = offline("rename chapter \u201cPart 2\u201d to 'x', it is 4", [tool])
    assert turn.calls == [("rename_chapter", {"name": "Part 2", "number": 4})]
    _, turn = offline("don't rename chapter 'Intro' as 3", [tool])  # an apostrophe is no quote
    assert turn.calls == [("rename_chapter", {"name": "Intro", "number": 3})]


def test_tool_words_match_across_word_forms_and_cases() -> None:
    tools = [{"name": "getSelectedText", "description": "Selection.", "argsSchema": schema()}]
    _, turn = offline("the SELECTION", tools)
    assert turn.calls == [("getSelectedText", {})]


def test_turn_step_limit_of_zero_calls_nothing() -> None:
    reply, turn = offline("increase the counter by 5", max_steps=0)
    assert turn.batches == []
    assert reply == "Nothing was called: that takes 1 tool step and this turn allows 0."


# --- determinism and history -------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    ["increase the counter by 5", "save the document", "hello", "/call get_current_page",
     "/call x {"],
)
def test_same_input_same_output(text: str) -> None:
    first, turn_a = offline(text)
    second, turn_b = offline(text)
    assert first == second
    assert turn_a.said == turn_b.said
    assert turn_a.batches == turn_b.batches
    assert turn_a.history == turn_b.history


def test_history_records_the_turn() -> None:
    turn = FakeTurn('/call update_counter {"delta": 4}')
    turn.history.append({"earlier": "turn"})
    reply = run(OfflineAgent(), turn)
    assert turn.history == [
        {"earlier": "turn"},
        {
            "agent": "offline",
            "turn_id": "turn-1",
            "user": '/call update_counter {"delta": 4}',
            "calls": [{"tool": "update_counter", "args": {"delta": 4}, "result": {"value": 4}}],
            "reply": reply,
        },
    ]


def test_the_step_limit_from_core_is_not_swallowed() -> None:
    class StrictTurn(FakeTurn):
        async def call_tools(self, calls: list[ToolCallRequest]) -> list[ToolCallOutcome]:
            raise StepLimitExceeded("Core says no")

    with pytest.raises(StepLimitExceeded):
        run(OfflineAgent(), StrictTurn("/call get_current_page"))


def test_offline_agent_describes_itself() -> None:
    assert OfflineAgent().info.name == "offline"


# --- never raises ------------------------------------------------------------------------

_call_like = st.builds(
    lambda name, rest: f"/call {name} {rest}",
    st.from_regex(r"[A-Za-z0-9_.-]{0,70}", fullmatch=True),
    st.text(max_size=40),
)
_messages = st.one_of(
    st.text(max_size=300),
    st.lists(st.one_of(_call_like, st.text(max_size=30)), max_size=5).map("\n".join),
    st.lists(st.sampled_from(
        ["counter", "page", "save", "document", "title=", "'x'", '"y"', "5", "-2.5", "down",
         "yes", "no", "delta", "body:", "selection", "/call", "\u2028", "\n"]
    ), max_size=12).map(" ".join),
)


@settings(max_examples=300, deadline=None)
@given(_messages)
def test_offline_agent_never_raises_for_any_text(text: str) -> None:
    reply, turn = offline(text)
    assert reply.strip()
    assert len(turn.batches) <= 10


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=3),
    max_leaves=12,
)
_property = st.one_of(
    _json,
    st.fixed_dictionaries({}, optional={
        "type": st.sampled_from(["integer", "number", "string", "boolean", "array", "object",
                                 "null"]) | st.lists(st.sampled_from(["integer", "string",
                                                                      "null"])),
        "enum": st.lists(_json, max_size=3),
        "default": _json,
        "description": st.text(max_size=20),
    }),
)
_schemas = st.one_of(
    _json,
    st.fixed_dictionaries({"type": st.just("object")}, optional={
        "properties": st.dictionaries(st.text(max_size=8), _property, max_size=4) | _json,
        "required": st.lists(st.text(max_size=8), max_size=4) | _json,
    }),
)


@settings(max_examples=300, deadline=None)
@given(_schemas, _messages)
def test_offline_agent_never_raises_for_any_schema(args_schema: Any, text: str) -> None:
    tools = [{"name": "do_thing", "description": "Do the thing to the page counter.",
              "argsSchema": args_schema}]
    offline("do the thing to the counter " + text, tools, handlers={"do_thing": lambda a: a})


# --- bounded work: linear in the message and the metadata, capped -----------------------


def seconds(work: Callable[[], Any]) -> float:
    """CPU time of ten calls of ``work``: the process's own time, so other processes on a
    loaded machine do not count."""
    started = time.process_time()
    for _ in range(10):
        work()
    return time.process_time() - started


def growth(work: Callable[[int], Any], size: int, rounds: int = 5) -> float:
    """How much longer ``work`` takes at 4x ``size``: ~4 when linear, ~16 when quadratic.
    The two sizes are timed in alternation and the best of each is kept."""
    small = large = math.inf
    for _ in range(rounds):
        small = min(small, seconds(lambda: work(size)))
        large = min(large, seconds(lambda: work(4 * size)))
    return large / small


def prefixed(count: int, letter: str) -> str:
    """Distinct words sharing their first four letters."""
    return " ".join("abcd" + letter + "".join(chr(97 + i // 26**k % 26) for k in range(3))
                    for i in range(count))


LINEAR = 9.0  # the growth allowed for 4x the input: generous, quadratic is ~16


def test_word_matching_is_linear_in_text_and_description() -> None:
    """Every text word was compared with every description word sharing its first four
    letters: 28.6 s for 117 KiB of each."""
    def match(n: int) -> Any:
        return best_tool(prefixed(n, "a"), [{"name": "t", "description": prefixed(n, "b")}])
    assert growth(match, 100) < LINEAR


@pytest.mark.parametrize("case", ["properties", "quotes", "numbers in quotes", "enum",
                                  "phrases", "equals"])
def test_filling_args_is_linear_in_the_message_and_the_schema(case: str) -> None:
    """One regular expression per property over the whole message: 22 s for 4,000
    properties and 400 KiB; each opening quote tried to the end of its line; each number
    checked against every quoted string; each enum value searched for in the message."""
    def fill(n: int) -> Any:
        k = n // 64  # up to 64 names at 4x: the most that are read
        if case == "properties":
            return fill_args(schema({f"p{i}": {"type": "string"} for i in range(k)}),
                             "x " * n)
        if case == "quotes":
            return fill_args(schema({"a": {"type": "string"}}), "\u201c" * n)
        if case == "numbers in quotes":
            return fill_args(schema({"a": {"type": "integer"}}), '"1" ' * (n // 4))
        if case == "enum":
            return fill_args(schema({"a": {"enum": [f"v{i}" for i in range(k)]}}), "x " * n)
        if case == "phrases":
            return fill_args(schema({f"a b{i}": {"type": "integer"} for i in range(k)}),
                             "a a " * (n // 4))
        return fill_args(schema({"a": {"type": "integer"}}), "a=" * (n // 2))
    assert growth(fill, 1000) < LINEAR


def test_the_agent_reads_the_first_characters_of_a_message() -> None:
    tool = {"name": "set_level", "description": "Set the level.",
            "argsSchema": schema({"level": {"type": "integer"}}, ["level"])}
    padding = " " * (MAX_READ_CHARS - len("set level level=5"))
    _, turn = offline("set level" + padding + " level=5", [tool])
    assert turn.calls == [("set_level", {"level": 5})]
    reply, turn = offline("set level" + padding + "  level=5", [tool])
    assert turn.batches == [] and reply.startswith("To call set_level I need a value for level")
    reply, _ = offline(" " * MAX_READ_CHARS + "set level 5", [tool])
    assert reply.startswith("No tool fits that.")


def test_the_first_names_and_enum_values_are_looked_for() -> None:
    names = {f"p{i}": {"type": "integer", "default": 0} for i in range(MAX_FILL_NAMES + 1)}
    args, _ = fill_args(schema(names), f"p0=1 p{MAX_FILL_NAMES - 1}=2 p{MAX_FILL_NAMES}=3")
    assert (args["p0"], args[f"p{MAX_FILL_NAMES - 1}"], args[f"p{MAX_FILL_NAMES}"]) == (1, 2, 0)
    values = [f"v{i}" for i in range(MAX_FILL_NAMES + 1)]
    args, _ = fill_args(schema({"e": {"enum": values}}), f"v{MAX_FILL_NAMES} then v7")
    assert args == {"e": "v7"}
    phrases = {f"a b{i}": {"type": "integer"} for i in range(MAX_PHRASE_LOOKUPS + 1)}
    text = " ".join(f"a b{i}=1" for i in range(MAX_PHRASE_LOOKUPS + 1))
    args, _ = fill_args(schema(phrases), text)
    assert sorted(args) == sorted(list(phrases)[:MAX_PHRASE_LOOKUPS])


_texts = st.lists(st.sampled_from(list("ab A-_=:;, \n\"'\u201c\u201d\u2018\u2019.!?)09+x")),
                  max_size=40).map("".join)


@settings(max_examples=500, deadline=None)
@given(_texts)
def test_quoted_strings_are_found_as_the_expression_finds_them(text: str) -> None:
    assert _Filler(text).quoted == [m.span() for m in _QUOTED_RE.finditer(text)]


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from(list("abA -_x.")), min_size=1, max_size=4).map("".join),
       st.sampled_from(["integer", "string", "boolean", "enum"]), _texts)
def test_names_are_read_as_one_expression_per_name_reads_them(
        name: str, kind: str, text: str) -> None:
    """The indexed reading gives what one regular expression per name gave (linear)."""
    spec: dict[str, Any] = {"enum": ["a", "b x", 1]} if kind == "enum" else {"type": kind}
    pattern = re.compile(
        rf"(?<![\w-]){re.escape(name)}(?![\w-])(\s*[:=]\s*|\s+)({_QUOTED}|[^\s,;]+)",
        re.IGNORECASE)
    expected: Any = None
    for found in pattern.finditer(text):
        raw = found.group(2)
        if _unquote(raw) is None:
            raw = raw.rstrip(".!?)") or raw
        members = _members(spec) if kind == "enum" else {}
        value = _convert(raw, found.group(1).strip() != "", kind, members)
        if value is not _NO_VALUE:
            expected = value
            break
    got = _Filler(text).named(name, kind, spec)
    assert (None if got is _NO_VALUE else got) == expected


# --- the scripted agent ------------------------------------------------------------------


def test_scripted_agent_makes_the_calls_and_says_the_text() -> None:
    agent = ScriptedAgent([
        "Looking. ",
        [ToolCallRequest("get_current_page", {}, call_id="c1"),
         ToolCallRequest("update_counter", {"delta": 2}, call_id="c2")],
        lambda outcomes: f"The page is {outcomes[0].result['title']}, "
                         f"the counter {outcomes[1].result['value']}.",
    ])
    turn = FakeTurn("anything")
    reply = run(agent, turn)
    assert turn.batches == [[ToolCallRequest("get_current_page", {}, call_id="c1"),
                             ToolCallRequest("update_counter", {"delta": 2}, call_id="c2")]]
    assert turn.said == ["Looking. ", "The page is Demo, the counter 2."]
    assert reply == "Looking. The page is Demo, the counter 2."
    assert [[o.call_id for o in step] for step in agent.outcomes] == [["c1", "c2"]]
    assert agent.info.name == "scripted"


def test_scripted_agent_callables_may_be_async_and_return_calls() -> None:
    seen: list[list[ToolCallOutcome]] = []

    async def next_step(outcomes: list[ToolCallOutcome]) -> list[ToolCallRequest]:
        seen.append(outcomes)
        await asyncio.sleep(0)
        return [ToolCallRequest("update_counter", {"delta": outcomes[0].result["value"]})]

    agent = ScriptedAgent([
        lambda outcomes: [ToolCallRequest("update_counter", {"delta": 3})],
        next_step,
        lambda outcomes: str(outcomes[0].result),
    ])
    turn = FakeTurn("go")
    assert run(agent, turn) == "{'value': 6}"
    assert turn.calls == [("update_counter", {"delta": 3}), ("update_counter", {"delta": 3})]
    assert seen[0][0].result == {"value": 3}


def test_scripted_agent_raises_when_the_script_says_so() -> None:
    agent = ScriptedAgent([[ToolCallRequest("get_selection", {})], RuntimeError("model down")])
    turn = FakeTurn("go")
    with pytest.raises(RuntimeError, match="model down"):
        run(agent, turn)
    assert turn.calls == [("get_selection", {})]
    with pytest.raises(ValueError, match="from a callable"):
        run(ScriptedAgent([lambda outcomes: ValueError("from a callable")]), FakeTurn("go"))


def test_scripted_agent_replays_a_list_on_every_run() -> None:
    agent = ScriptedAgent([[ToolCallRequest("update_counter", {"delta": 1})], "done"])
    turn = FakeTurn("one")
    assert run(agent, turn) == "done"
    turn.text = "two"
    assert run(agent, turn) == "done"
    assert turn.calls == [("update_counter", {"delta": 1})] * 2
    assert [step[0].result for step in agent.outcomes] == [{"value": 1}, {"value": 2}]


def test_scripted_agent_with_no_text_replies_empty() -> None:
    assert run(ScriptedAgent([]), FakeTurn("x")) == ""


def test_forever_runs_into_the_step_limit() -> None:
    agent = ScriptedAgent.forever("update_counter", {"delta": 1})
    turn = FakeTurn("loop", max_steps=7)
    with pytest.raises(StepLimitExceeded):
        run(agent, turn)
    assert turn.calls == [("update_counter", {"delta": 1})] * 7
    turn = FakeTurn("again", max_steps=2)
    with pytest.raises(StepLimitExceeded):
        run(ScriptedAgent.forever("get_selection"), turn)
    assert turn.calls == [("get_selection", {})] * 2


# --- make_agent --------------------------------------------------------------------------


def test_make_agent_offline() -> None:
    assert isinstance(make_agent("offline"), OfflineAgent)
    assert isinstance(make_agent("  offline "), OfflineAgent)


@pytest.mark.parametrize(("spec", "key"),
                         [("openai:gpt-4o-mini", "OPENAI_API_KEY"),
                          ("anthropic:claude-x", "ANTHROPIC_API_KEY")])
def test_make_agent_model_adapters_need_their_key(
        spec: str, key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(AgentUnavailable) as caught:
        make_agent(spec)
    message = str(caught.value)
    assert f"agent {spec} needs {key}" in message
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize("spec", ["openai:", "anthropic:  "])
def test_make_agent_needs_a_model_name(spec: str) -> None:
    with pytest.raises(ValueError, match="names no model") as caught:
        make_agent(spec)
    assert not isinstance(caught.value, AgentUnavailable)


@pytest.mark.parametrize("spec", ["", "rules", "offline:x", "OpenAI:gpt", "openai", "ollama:x"])
def test_make_agent_rejects_other_specs_listing_the_accepted_forms(spec: str) -> None:
    with pytest.raises(ValueError) as caught:
        make_agent(spec)
    assert not isinstance(caught.value, AgentUnavailable)
    assert str(caught.value) == (
        f"unknown agent {spec!r}: use one of offline, openai:MODEL, anthropic:MODEL, "
        "ag-ui:URL"
    )


# --- the history the offline agent appends to ------------------------------------------


@pytest.mark.parametrize("kept", ["[ ]", "[]\n", ' [{"turn_id": "t0"}] ', '[{"turn_id": "t0"}\n]',
                                  '[\t{"turn_id": "t0"} \n ]\r\n', "[\n\n]"])
def test_appending_to_a_kept_history_not_in_compact_form_stays_json(kept: str) -> None:
    """A stored history is taken as any JSON list of objects (store/rows.py), so it may
    hold whitespace (a row written by hand or by another tool). Appending the offline
    agent's entry as text must still give JSON, or the session's row is damaged at the
    next start and the session lost."""
    new = [{"agent": "offline", "turn_id": "t1", "user": "hi"}]
    appended = appended_history(kept, new, 10_000)
    assert appended is not None
    assert json.loads(appended) == json.loads(kept) + new


def test_an_outcome_given_its_args_as_text_decodes_them_when_read() -> None:
    """Core gives a call's outcome its args as the JSON text it keeps: an agent that reads
    them gets them decoded (once); one that does not, a model agent, costs no decoding."""
    outcome = ToolCallOutcome(tool_request_id="r", tool="t", result={"ok": True},
                              handled_by="named", args=JsonText('{"n": [1, 2]}'))
    assert outcome.args == {"n": [1, 2]}
    assert outcome.args is outcome.args  # decoded once, kept
    assert ToolCallOutcome(tool_request_id="r", tool="t", result=None,
                           handled_by="none").args is None
