"""The model adapters (``--agent openai:MODEL``, ``--agent anthropic:MODEL``) against each
provider's real wire format.

No test here reaches a paid API or any network: a local HTTP server on 127.0.0.1 (an
ephemeral port, started and stopped by each test) STANDS IN FOR THE PAID API. It replays
the recorded transcripts in ``transcripts/`` — OpenAI's Chat Completions stream (SSE
``data:`` lines of ``chat.completion.chunk``, ``data: [DONE]``) and Anthropic's Messages
stream (``event:``/``data:`` pairs: message_start, content_block_start/delta/stop with
text_delta and input_json_delta, message_delta, message_stop, ping), error answers and a
server that does not answer — and checks what the official SDK sends against each
transcript's recorded request (a subset match), so the tools' translation, the tool
results fed back (ids, ``is_error``) and the history carried between turns are the real
requests the SDKs build.

The agents run against a fake Turn (``agentkit.FakeTurn``, as in
``test_offline_agent.py``); one test runs a turn through real Core, with a page answering
the tool requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from agentkit import (
    DEMO_TOOLS,
    FAST,
    KEY,
    TRANSCRIPTS,
    StandIn,
    agent_for,
    results_sent,
    run,
    turn_with,
)
from clockkit import FakeClock
from corekit import Page as PageAdapter
from corekit import (
    RawClient,
    config,
    fake_clock,
    next_of,
    running_core,
    status_of,
    tool_meta,
    until,
)

from pedelec_pyodide import Session, define_tool, strictjson
from pedelec_pyodide.core.agents import AgentUnavailable, make_agent, model
from pedelec_pyodide.core.agents.anthropic_agent import AnthropicAgent
from pedelec_pyodide.core.agents.contract import StepLimitExceeded, ToolCallRequest
from pedelec_pyodide.core.agents.model import ModelError, ModelSettings, capped
from pedelec_pyodide.core.agents.openai_agent import OpenAIAgent
from pedelec_pyodide.core.offload import LARGE_CHARS

PROVIDERS = ["openai", "anthropic"]


# --- the stand-in for the paid API ---------------------------------------------------------


@contextlib.contextmanager
def stand_in(provider: str, name: str) -> Iterator[StandIn]:
    transcript = json.loads((TRANSCRIPTS / f"{provider}_{name}.json").read_text())
    server = StandIn(transcript)
    server.thread.start()
    try:
        yield server
    finally:
        server.stopping.set()
        server.server.shutdown()
        server.server.server_close()
        server.thread.join(5)
    assert not server.problems, server.problems


# --- transcripts ---------------------------------------------------------------------------


@pytest.mark.parametrize("provider", PROVIDERS)
def test_plain_text_reply_is_streamed_with_tools_translated(provider: str) -> None:
    tools = [*DEMO_TOOLS, {"name": "clear", "description": "Clear the editor.",
                           "argsSchema": {"properties": {}},
                           "annotations": {"title": "Clear all", "destructiveHint": True}}]
    with stand_in(provider, "text_reply") as server:
        turn = turn_with("Hello there", tools=tools)
        reply = run(agent_for(server), turn)
    assert reply == "Hello! How can I help?"
    assert turn.said == ["Hello", "! How can I", " help?"]
    assert turn.batches == []
    assert turn.usage == {"input_tokens": 20, "output_tokens": 8, "requests": 1}
    request = server.requests[0]
    sent = request["body"]["tools"]
    if provider == "openai":
        assert request["headers"]["authorization"] == f"Bearer {KEY}"
        assert sent[1] == {"type": "function", "function": {
            "name": "update_counter", "description": DEMO_TOOLS[1]["description"],
            "parameters": DEMO_TOOLS[1]["argsSchema"]}}
        clear = sent[-1]["function"]
        assert request["body"]["stream_options"] == {"include_usage": True}
    else:
        assert KEY in (request["headers"].get("x-api-key", "")
                       + request["headers"].get("authorization", ""))
        assert sent[1] == {"name": "update_counter",
                           "description": DEMO_TOOLS[1]["description"],
                           "input_schema": DEMO_TOOLS[1]["argsSchema"]}
        assert request["body"]["max_tokens"] == FAST.max_tokens
        clear = {**sent[-1], "parameters": sent[-1]["input_schema"]}
    assert clear["description"] == "Clear all: Clear the editor."
    assert clear["parameters"] == {"type": "object", "properties": {}}
    assert [entry["agent"] for entry in turn.history] == [provider, provider]
    assert json.loads(json.dumps(turn.history)) == turn.history


@pytest.mark.parametrize("provider", PROVIDERS)
def test_one_tool_call_then_a_reply(provider: str) -> None:
    with stand_in(provider, "one_tool_call") as server:
        turn = turn_with("Add 3 to the counter")
        reply = run(agent_for(server), turn)
    call_id = "call_A1" if provider == "openai" else "toolu_A1"
    assert turn.batches == [[ToolCallRequest("update_counter", {"delta": 3}, call_id)]]
    assert reply == "The counter is now 3."
    assert results_sent(server, 1) == [(call_id, {"value": 3}, False)]
    assert turn.usage == {"input_tokens": 30 + 45, "output_tokens": 12 + 9, "requests": 2}
    assert len(turn.history) == 4  # user, assistant (call), result, assistant (reply)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_two_tool_calls_in_one_step_are_one_batch(provider: str) -> None:
    with stand_in(provider, "two_tool_calls") as server:
        turn = turn_with("Where am I, and add 3")
        reply = run(agent_for(server), turn)
    assert [[call.tool for call in batch] for batch in turn.batches] == [
        ["get_current_page", "update_counter"]]
    ids = ("call_A1", "call_B2") if provider == "openai" else ("toolu_A1", "toolu_B2")
    assert [result[0] for result in results_sent(server, 1)] == list(ids)
    if provider == "anthropic":  # its text before the calls is part of the reply
        assert reply == "Doing both.\n\nYou are on Demo; the counter is 3."
    else:
        assert reply == "You are on Demo; the counter is 3."
    assert "".join(turn.said) == reply


@pytest.mark.parametrize("provider", PROVIDERS)
def test_handler_error_is_fed_back_and_the_model_recovers(provider: str) -> None:
    with stand_in(provider, "handler_error_recovery") as server:
        turn = turn_with("Save my notes")
        reply = run(agent_for(server), turn)
    ((_, result, is_error),) = results_sent(server, 1)
    assert result["error"]["code"] == "TOOL_HANDLER_ERROR"
    assert is_error == (provider == "anthropic")  # OpenAI has no flag: the JSON says it
    assert reply == "Saving failed (a division by zero in the page). Nothing was saved."


@pytest.mark.parametrize("provider", PROVIDERS)
def test_malformed_json_and_unknown_tool_are_answered_as_errors(provider: str) -> None:
    with stand_in(provider, "malformed_arguments") as server:
        turn = turn_with("Add 2")
        reply = run(agent_for(server), turn)
    # neither bad call reached the page; the model's good call did
    assert [[(c.tool, c.args) for c in batch] for batch in turn.batches] == [
        [("update_counter", {"delta": 2})]]
    (_, bad_json, bad_flag), (_, unknown, unknown_flag) = results_sent(server, 1)
    assert bad_json["error"]["code"] == "INVALID_ARGS"
    assert bad_json["error"]["message"].startswith(
        "the arguments for update_counter are not valid JSON")
    assert '{"delta": 2' in bad_json["error"]["message"]
    assert unknown["error"]["code"] == "TOOL_HANDLER_NOT_FOUND"
    assert "'delete_everything'" in unknown["error"]["message"]
    assert "update_counter" in unknown["error"]["message"]  # the tools there are
    assert bad_flag == unknown_flag == (provider == "anthropic")
    assert reply == "Done: the counter is 2."


@pytest.mark.parametrize(("arguments", "said"), [
    ('{"delta": NaN}', "(NaN is not a JSON number)"),
    ('{"delta": 1e999}', '("1e999" is too large for a JSON number)'),
    ('{"delta": ' + "9" * 5000 + "}", "(Exceeds the limit (4300 digits)"),
])
def test_arguments_no_page_can_read_are_invalid_args_and_kept_out_of_the_history(
        arguments: str, said: str) -> None:
    """The one strict decoder, as for a page's frames: a model's NaN was a request (refused
    only when its frame was checked) and, in the history (Anthropic's keeps the arguments
    as a value), one the store writes but refuses to read back (the session was skipped as
    damaged at the next start); a 5000-digit number raised out of the agent and failed
    the turn."""
    answer = model.parse_arguments(
        model.ModelCall("c1", "update_counter", arguments), {"update_counter"})
    assert isinstance(answer, dict)
    assert answer["error"]["code"] == "INVALID_ARGS"
    assert answer["error"]["message"].startswith(
        f"the arguments for update_counter are not valid JSON {said}")
    assert model.read_arguments(arguments).kept == {}


def test_an_anthropic_block_begun_again_at_its_index_takes_the_first_ones_place() -> None:
    """Found (by a reviewer): a text block and then a tool_use block at the same index
    (a malformed stream) left the history's content one call short, its calls paired
    with the wrong blocks."""
    with stand_in("anthropic", "one_tool_call") as server:
        events = server.exchanges[0]["response"]["events"]
        [tool_start] = [event for event in events if event["event"] == "content_block_start"]
        text = {"type": "content_block_start", "index": 0,
                "content_block": {"type": "text", "text": ""}}
        delta = {"type": "content_block_delta", "index": 0,
                 "delta": {"type": "text_delta", "text": "x"}}
        at = events.index(tool_start)
        events[at:at] = [{"event": "content_block_start", "data": text},
                         {"event": "content_block_delta", "data": delta}]
        turn = turn_with("Add 3 to the counter")
        run(agent_for(server), turn)
    # (the stand-in checked the next request: its assistant content is the tool_use alone)
    assert turn.batches == [[ToolCallRequest("update_counter", {"delta": 3}, "toolu_A1")]]


def test_a_call_is_read_while_another_is_being_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found (by a reviewer): ``functools.cached_property`` held one lock for every call
    while it read one (Python 3.11): a call read on the event loop waited for another
    session's long arguments read in a worker thread."""
    reading = threading.Event()
    go_on = threading.Event()
    read = model.read_arguments

    def held(arguments: str) -> model.Arguments:
        if arguments == '{"long": 1}':
            reading.set()
            go_on.wait(30)
        return read(arguments)

    monkeypatch.setattr(model, "read_arguments", held)
    long_one = threading.Thread(target=lambda: model.ModelCall("a", "t", '{"long": 1}').read)
    short_one = threading.Thread(target=lambda: model.ModelCall("b", "t", '{"n": 1}').read)
    long_one.start()
    try:
        assert reading.wait(30)
        short_one.start()
        short_one.join(10)
        assert not short_one.is_alive()  # read while the long one still was
    finally:
        go_on.set()
        long_one.join(30)
        short_one.join(30)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_long_arguments_are_read_once_off_the_event_loop(
        provider: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found: a call's arguments were decoded twice, for the history's message and for the
    request, and the OpenAI and Anthropic adapters decoded theirs on the event loop (json
    holds the GIL: up to ~90 ms for 1 MiB of small arrays, twice, every session waiting)."""
    note = "long " * (LARGE_CHARS // 4)
    with stand_in(provider, "one_tool_call") as server:
        answer, follow_up = server.exchanges
        events = answer["response"]["events"]
        if provider == "openai":
            pieces = [chunk["choices"][0]["delta"]["tool_calls"][0]["function"]
                      for chunk in events if isinstance(chunk, dict)  # (not "[DONE]")
                      and chunk["choices"] and chunk["choices"][0]["delta"].get("tool_calls")]
            last, key = pieces[-1], "arguments"
            kept = follow_up["request"]["body"]["messages"][1]["tool_calls"][0]["function"]
            kept["arguments"] = json.dumps({"delta": 3, "note": note})
        else:
            deltas = [event["data"]["delta"] for event in events
                      if event["data"]["type"] == "content_block_delta"]
            last, key = deltas[-1], "partial_json"
            follow_up["request"]["body"]["messages"][1]["content"][0]["input"]["note"] = note
        assert last[key].endswith("}")
        last[key] = last[key][:-1] + ', "note": ' + json.dumps(note) + "}"
        reads: list[bool] = []  # on the event loop's thread?
        decode = strictjson.decode

        def spy(text: str) -> Any:
            if note in text:
                reads.append(threading.current_thread() is threading.main_thread())
            return decode(text)

        monkeypatch.setattr(strictjson, "decode", spy)
        turn = turn_with("Add 3 to the counter")
        reply = run(agent_for(server), turn)
    assert reply == "The counter is now 3."
    assert turn.batches[0][0].args == {"delta": 3, "note": note}
    assert reads == [False]

def many_calls(server: StandIn, count: int) -> None:
    """The stand-in's first answer asks for ``count`` calls of update_counter."""
    events = server.exchanges[0]["response"]["events"]
    if server.provider == "openai":
        [first] = [chunk for chunk in events if isinstance(chunk, dict) and chunk["choices"]
                   and chunk["choices"][0]["delta"].get("tool_calls")
                   and chunk["choices"][0]["delta"]["tool_calls"][0].get("id")]
        at = events.index(first)
        copies = []
        for index in range(1, count):
            chunk = json.loads(json.dumps(first))
            piece = chunk["choices"][0]["delta"]["tool_calls"][0]
            piece.update(index=index, id=f"call_{index}")
            piece["function"]["arguments"] = '{"delta": 1}'
            copies.append(chunk)
    else:
        [first] = [event for event in events if event["event"] == "content_block_start"]
        at = events.index(first)
        copies = []
        for index in range(1, count):
            start = json.loads(json.dumps(first))
            start["data"]["index"] = index
            start["data"]["content_block"]["id"] = f"toolu_{index}"
            delta = {"type": "input_json_delta", "partial_json": '{"delta": 1}'}
            copies += [start, {"event": "content_block_delta", "data": {
                "type": "content_block_delta", "index": index, "delta": delta}},
                {"event": "content_block_stop", "data": {"type": "content_block_stop",
                                                         "index": index}}]
    events[at:at] = copies


@pytest.mark.parametrize("provider", PROVIDERS)
def test_an_answer_of_over_128_calls_fails_the_turn(provider: str) -> None:
    """Found (by a stranger): an answer of 20,000 calls was taken whole, each call refused
    or sent, its history built: Core's event loop held for 7.3 s in one step."""
    with stand_in(provider, "one_tool_call") as server:
        many_calls(server, model.MAX_CALLS + 1)
        server.exchanges = server.exchanges[:1]
        turn = turn_with("Add 3 to the counter")
        with pytest.raises(ModelError, match=f"over {model.MAX_CALLS} tool calls"):
            run(agent_for(server), turn)
    assert turn.batches == []
    with stand_in(provider, "one_tool_call") as server:  # as many as allowed: all made
        many_calls(server, model.MAX_CALLS)
        server.exchanges[1]["request"]["body"] = {}
        turn = turn_with("Add 3 to the counter")
        run(agent_for(server), turn)
    assert [len(batch) for batch in turn.batches] == [model.MAX_CALLS]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_an_answer_is_read_within_its_bound_and_its_time(
        provider: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found (by a stranger): an answer's stream had no bound (256 MB of arguments took
    587 MiB, each piece copying all before it), and only the wait for each chunk had a
    deadline, so a model trickling chunks kept its turn for good."""
    def longer(server: StandIn, times: int) -> None:
        events = server.exchanges[0]["response"]["events"]
        piece = events[2] if provider == "openai" else events[4]  # "! How can I"
        at = events.index(piece)
        events[at:at] = [piece] * times

    monkeypatch.setattr(model, "MAX_ANSWER_CHARS", 1000)
    with stand_in(provider, "text_reply") as server:
        longer(server, 100)  # 1,100 characters of text
        turn = turn_with("Hello there")
        with pytest.raises(ModelError, match="over 1000 characters"):
            run(agent_for(server), turn)
    with stand_in(provider, "text_reply") as server:
        longer(server, 50)
        server.exchanges[0]["response"]["pace"] = 0.1  # ~6 s in all
        turn = turn_with("Hello there")
        settings = ModelSettings(request_timeout=0.2, retry_budget=1.0)  # 2 s an answer
        with pytest.raises(ModelError, match=re.escape(
                "did not finish its answer within 2 s (10 times PEDELEC_MODEL_TIMEOUT)")):
            run(agent_for(server, settings), turn)
        assert len(server.requests) == 1  # not retried: part of it was said


@pytest.mark.parametrize("provider", PROVIDERS)
def test_unauthorized_fails_the_turn_clearly_without_the_key(
        provider: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="pedelec.core")
    with stand_in(provider, "unauthorized") as server:
        turn = turn_with("Hello there")
        with pytest.raises(ModelError) as caught:
            run(agent_for(server), turn)
    env = "OPENAI_API_KEY" if provider == "openai" else "ANTHROPIC_API_KEY"
    message = str(caught.value)
    assert message.startswith(f"authentication failed for {provider} (HTTP 401): check {env}")
    assert len(server.requests) == 1  # never retried
    assert KEY not in message and KEY not in caplog.text
    assert turn.history == []  # nothing answered: nothing remembered


class Waits(FakeClock):
    """The adapters' clock, whose sleeps are recorded and move it at once: the waits take
    no time, so they are checked exactly, at any load."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.seconds.append(seconds)
        self.elapsed += seconds
        await asyncio.sleep(0)


@pytest.fixture
def waits() -> Waits:
    return Waits()


@pytest.mark.parametrize("provider", PROVIDERS)
def test_rate_limit_is_retried_after_the_wait_asked(provider: str, waits: Waits) -> None:
    with stand_in(provider, "rate_limited") as server:
        reply = run(agent_for(server, clock=waits), turn_with("Hello there"))
    assert reply == "Hi!"
    assert len(server.requests) == 2
    # OpenAI sends retry-after-ms (400) beside retry-after (1): the finer one wins
    assert waits.seconds == [0.4 if provider == "openai" else 1.0]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_rate_limit_wait_beyond_the_budget_fails_at_once(provider: str, waits: Waits) -> None:
    with stand_in(provider, "rate_limited") as server:
        server.exchanges = server.exchanges[:1]
        settings = ModelSettings(retry_budget=0.2)
        with pytest.raises(ModelError, match=r"beyond the retry budget of 0\.2 s"):
            run(agent_for(server, settings, waits), turn_with("Hello there"))
    assert len(server.requests) == 1
    assert waits.seconds == []


@pytest.mark.parametrize("provider", PROVIDERS)
def test_server_errors_are_retried_then_the_turn_fails(provider: str, waits: Waits) -> None:
    with stand_in(provider, "server_errors") as server, pytest.raises(ModelError) as caught:
        run(agent_for(server, clock=waits), turn_with("Hello there"))
    assert len(server.requests) == 3
    assert waits.seconds == [0.5, 1.0]  # backoff: 0.5 s, then twice that
    assert str(caught.value).startswith(f"{provider} failed (HTTP ")
    assert str(caught.value).endswith("(gave up after 3 attempts)")


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_server_that_does_not_answer_times_out(provider: str) -> None:
    with stand_in(provider, "timeout") as server:
        started = time.monotonic()
        with pytest.raises(ModelError, match=rf"{provider} did not answer within 0\.3 s"):
            run(agent_for(server, ModelSettings(request_timeout=0.3)), turn_with("Hi"))
    assert time.monotonic() - started < 2.5
    assert len(server.requests) == 1


# --- step limit, history -------------------------------------------------------------------


@pytest.mark.parametrize("provider", PROVIDERS)
def test_step_limit_ends_the_turn_and_keeps_the_history_whole(provider: str) -> None:
    with stand_in(provider, "one_tool_call") as server:
        server.exchanges = server.exchanges[:1]
        turn = turn_with("Add 3 to the counter", max_steps=0)
        with pytest.raises(StepLimitExceeded, match="limit of 0 tool-calling steps"):
            run(agent_for(server), turn)
    assert turn.batches == []
    # the answer whose calls never ran is left out: no call without its result
    assert [entry["message"]["role"] for entry in turn.history] == ["user"]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_history_is_carried_to_the_next_turn_and_tagged(provider: str) -> None:
    other = "anthropic" if provider == "openai" else "openai"
    history: list[dict[str, Any]] = [
        {"agent": "offline", "turn_id": "t0", "user": "x", "calls": [], "reply": "y"},
        {"agent": other, "turn": "t0", "message": {"role": "user", "content": "elsewhere"}},
    ]
    with stand_in(provider, "text_reply") as server:
        run(agent_for(server), turn_with("Hello there", history))
    with stand_in(provider, "one_tool_call") as server:
        for exchange in server.exchanges:  # same answers; the requests now lead with turn 1
            exchange["request"]["body"] = {}
        turn = turn_with("Add 3 to the counter", history)
        turn.turn_id = "turn-2"
        run(agent_for(server), turn)
    first = server.messages(0)
    assert [m["role"] for m in first] == ["user", "assistant", "user"]
    assert first[0]["content"] == "Hello there" and "elsewhere" not in json.dumps(first)
    assert history[:2][0]["agent"] == "offline" and history[1]["agent"] == other
    assert [e["turn"] for e in history[2:]] == ["turn-1"] * 2 + ["turn-2"] * 4


def test_history_cap_drops_whole_turns_oldest_first() -> None:
    def entries(turn: str, count: int) -> list[dict[str, Any]]:
        return [{"agent": "openai", "turn": turn, "message": {"n": i}} for i in range(count)]

    history = entries("a", 2) + entries("b", 4) + entries("c", 2)
    assert [e["turn"] for e in capped(history, 6)] == ["b"] * 4 + ["c"] * 2
    assert [e["turn"] for e in capped(history, 5)] == ["c"] * 2
    assert [e["turn"] for e in capped(entries("big", 9), 3)] == ["big"] * 9  # newest stays


@pytest.mark.parametrize("provider", PROVIDERS)
def test_history_cap_applies_to_the_stored_history(provider: str) -> None:
    history: list[dict[str, Any]] = []
    settings = ModelSettings(history_messages=3)
    for number in (1, 2):
        with stand_in(provider, "text_reply") as server:
            server.exchanges[0]["request"]["body"] = {}
            turn = turn_with("Hello there", history)
            turn.turn_id = f"turn-{number}"
            run(agent_for(server, settings), turn)
    assert [e["turn"] for e in history] == ["turn-2", "turn-2"]
    assert len(server.messages(0)) == 3  # turn 1 was still within the cap when asked


# --- make_agent ----------------------------------------------------------------------------


def test_make_agent_builds_the_adapters_from_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY",
                 "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(AgentUnavailable, match="needs OPENAI_API_KEY"):
        make_agent("openai:gpt-4o-mini")
    with pytest.raises(AgentUnavailable, match="needs ANTHROPIC_API_KEY"):
        make_agent("anthropic:claude-x")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:11434/v1")  # Ollama: no key
    local = make_agent("openai:llama3.2")
    assert isinstance(local, OpenAIAgent) and local.base_url == "http://127.0.0.1:11434/v1"
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    monkeypatch.setenv("PEDELEC_HISTORY_MESSAGES", "10")
    remote = make_agent("anthropic:claude-x")
    assert isinstance(remote, AnthropicAgent) and remote.settings.history_messages == 10
    assert KEY not in json.dumps(remote.info.details)
    monkeypatch.setenv("PEDELEC_MODEL_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="PEDELEC_MODEL_TIMEOUT='soon': expected a positive"):
        make_agent("anthropic:claude-x")


# --- end to end through Core ---------------------------------------------------------------


def test_a_turn_through_core_with_the_openai_adapter(monkeypatch: pytest.MonkeyPatch) -> None:
    @define_tool(name="update_counter", description="Add delta to the counter.")
    def update_counter(delta: int) -> dict[str, int]:
        return {"value": delta}

    async def main(server: StandIn) -> None:
        async with running_core(config(agent="openai:test-model", agent_factory=None)) as core:
            page = await PageAdapter(Session([update_counter])).connect(core.ws_url)
            response = await core.turn(page.session.session_id, "Add 3 to the counter")
            assert response.status_code == 200, response.text
            turn = response.json()
            assert turn["status"] == "completed"
            assert turn["text"] == "The counter is now 3."
            (call,) = turn["toolCalls"]
            assert call["tool"] == "update_counter" and call["result"] == {"value": 3}
            deltas = [f["text"] for f in page.frames("turn.delta")]
            assert "".join(deltas) == "The counter is now 3."
            usage = {"input_tokens": 30 + 45, "output_tokens": 12 + 9, "requests": 2}
            assert turn["usage"] == usage  # the control API's answer
            await page.wait_frame("turn.end")
            assert page.frames("turn.end")[-1]["usage"] == usage  # the page's turn.end

    with stand_in("openai", "one_tool_call") as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", KEY)
        asyncio.run(asyncio.wait_for(main(server), 30))
    tools = server.requests[0]["body"]["tools"]
    assert [tool["function"]["name"] for tool in tools] == ["update_counter"]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_call_awaiting_approval_outlives_its_deadline_and_a_denial_reaches_the_model(
        provider: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through Core: the page asks the user to approve (``tool.waiting``, reason
    ``approval``) for longer than the tool's deadline; the turn waits, and the user's
    denial (``TOOL_DENIED``) is fed back to the model as any error result is."""
    denied = {"error": {"code": "TOOL_DENIED", "message": "the user denied this call",
                        "retryable": False, "details": {"reason": "not now"}}}

    async def main() -> None:
        clock = fake_clock()
        cfg = config(agent=f"{provider}:test-model", agent_factory=None, tool_timeout_ms=300,
                     clock=clock)
        async with running_core(cfg) as core:
            page = await RawClient.open(core.ws_url)
            welcome = await page.hello([tool_meta("delete_note")])
            sid = welcome["sessionId"]
            turn = asyncio.create_task(core.turn(sid, "Delete note 7"))
            request = await next_of(page, "tool.request")
            assert (request["tool"], request["args"]) == ("delete_note", {"id": 7})
            rid = request["toolRequestId"]
            await page.send({"type": "tool.waiting", "toolRequestId": rid, "waiting": True,
                             "reason": "approval"})
            await until(lambda: status_of(core, sid, rid) == "awaiting_approval",
                        "the approval to be shown")
            await clock.advance(0.9)  # three deadlines: the user takes their time
            assert status_of(core, sid, rid) == "awaiting_approval"
            assert not turn.done()
            await page.send({"type": "tool.waiting", "toolRequestId": rid,
                             "waiting": False})
            await page.send({"type": "tool.result", "toolRequestId": rid, "result": denied,
                             "handledBy": "named"})
            answer = (await asyncio.wait_for(turn, 20)).json()
            assert answer["status"] == "completed", answer
            assert answer["text"] == "I did not delete note 7: you declined."
            (call,) = answer["toolCalls"]
            assert call["result"] == denied

    with stand_in(provider, "tool_denied") as server:
        prefix = provider.upper()
        monkeypatch.setenv(f"{prefix}_BASE_URL", server.base_url)
        monkeypatch.setenv(f"{prefix}_API_KEY", KEY)
        asyncio.run(asyncio.wait_for(main(), 30))
    ((_, result, is_error),) = results_sent(server, 1)
    assert result == denied
    assert is_error == (provider == "anthropic")  # OpenAI has no flag: the JSON says it


def test_a_url_in_messages_has_no_credentials_and_keeps_an_ipv6_host_readable() -> None:
    assert (model.public_url("https://user:pw@example.test:8443/v1?key=s")
            == "https://example.test:8443/v1")
    assert model.public_url("http://[::1]:3000/agent") == "http://[::1]:3000/agent"
