"""The bounds on ``--agent ag-ui:URL``: a hostile or broken AG-UI agent costs Core bounded
time, memory and waiting; secrets it echoes are never shown; the operator's headers cannot
break the request Core makes."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gc
import ssl
import threading
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable
from types import SimpleNamespace
from typing import Any

import pytest
from aguikit import Script, ScriptedAgent, ag_ui, call_run, counter_session, sse, started, text_run
from corekit import WAIT, Page, RawClient, next_of, result, run, running_core, tool_meta

from pedelec_pyodide import TurnError, strictjson
from pedelec_pyodide.core.agents import ag_ui_agent
from pedelec_pyodide.core.agents.ag_ui_agent import (
    MAX_CALLS,
    MAX_EVENT_BYTES,
    MAX_EVENT_VALUES,
    MAX_VALIDATED_EVENT_BYTES,
    TYPE_PREFIX_BYTES,
    sse_events,
)
from pedelec_pyodide.core.agents.contract import ToolCallRequest
from pedelec_pyodide.core.agents.factory import make_agent, parse_header
from pedelec_pyodide.core.agents.model import MAX_ARGUMENTS_CHARS, ModelCall
from pedelec_pyodide.core.cli import build_parser
from pedelec_pyodide.core.offload import LARGE_CHARS
from pedelec_pyodide.core.store import JsonText

#: seconds between two bytes of a trickling agent: well within the event timeout below
PACE = 0.05
TIMEOUT_MS = 300

Serve = Callable[[asyncio.StreamReader, asyncio.StreamWriter, asyncio.Event], Awaitable[None]]


@contextlib.asynccontextmanager
async def raw_agent(serve: Serve) -> AsyncIterator[str]:
    """A loopback server answering each request with ``serve``; yields its URL. Stopped,
    its connections told to stop, when the block ends."""
    stopping = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            await serve(reader, writer, stopping)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/agent"
    finally:
        stopping.set()
        server.close()
        await asyncio.wait_for(server.wait_closed(), WAIT)


async def trickle(writer: asyncio.StreamWriter, stopping: asyncio.Event, head: bytes,
                  piece: Callable[[int], bytes]) -> None:
    """``head``, then ``piece(n)`` every :data:`PACE` seconds until told to stop."""
    writer.write(head)
    n = 0
    while not stopping.is_set():
        writer.write(piece(n))
        await writer.drain()
        n += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), PACE)


# --- every wait has a deadline, whatever trickles in ----------------------------------------


CHUNKED = b"Transfer-Encoding: chunked\r\n\r\n"
TRICKLES: dict[str, tuple[bytes, Callable[[int], bytes]]] = {
    # found: the body of an error answer was read a byte at a time, each read within the
    # timeout: 4096 bytes took 4096 timeouts (hours with the default --tool-timeout)
    "error body": (b"HTTP/1.1 502 X\r\nContent-Type: text/plain\r\n" + CHUNKED,
                   lambda n: b"1\r\nx\r\n"),
    # found: so was the answer's head, a header line at a time, without end
    "head": (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n",
             lambda n: f"X-Pad-{n}: x\r\n".encode()),
    # held: a comment is no event
    "comments": (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n" + CHUNKED,
                 lambda n: b"5\r\n: hi\n\r\n"),
}


@pytest.mark.parametrize("case", TRICKLES)
def test_an_agent_that_trickles_fails_the_turn_within_the_event_timeout(
        case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    head, piece = TRICKLES[case]
    # the head may take the connection's time and the event timeout: less of the first
    monkeypatch.setattr(ag_ui_agent, "CONNECT_SECONDS", 1.0)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    stopping: asyncio.Event) -> None:
        await trickle(writer, stopping, head, piece)

    async def main() -> None:
        async with raw_agent(serve) as url, \
                running_core(ag_ui(url, tool_timeout_ms=TIMEOUT_MS)) as core:
            page = await Page(counter_session()[0]).connect(core.ws_url)
            with pytest.raises(TurnError) as failed:
                await asyncio.wait_for(page.session.send_text("go"), WAIT)
            assert failed.value.code == "AGENT_ERROR"
            assert "sent no event for 0.3 s" in failed.value.message, failed.value.message
            assert (await core.http.get("/pedelec/v1/health")).status_code == 200

    run(main())


def test_an_agent_that_keeps_the_stream_open_after_run_finished_is_done_with() -> None:
    """Held: Core stops reading at RUN_FINISHED and closes the run."""
    async def main() -> None:
        async with ScriptedAgent([Script(text_run("hi"), end="hang")]) as agent, \
                running_core(ag_ui(agent.url, tool_timeout_ms=TIMEOUT_MS)) as core:
            page = await Page(counter_session()[0]).connect(core.ws_url)
            assert await asyncio.wait_for(page.session.send_text("go"), WAIT) == "hi"

    run(main())


# --- what one run may ask for ----------------------------------------------------------------


def _calls(count: int, *, chunks: bool = False, same_id: bool = False) -> list[bytes]:
    """A run calling ``update_counter`` ``count`` times."""
    events = [started()]
    for n in range(count):
        call_id = "c" if same_id else f"c{n}"
        if chunks:
            events.append(sse({"type": "TOOL_CALL_CHUNK", "toolCallId": call_id,
                               "toolCallName": "update_counter", "delta": '{"delta": 1}'}))
        else:
            events += [sse({"type": "TOOL_CALL_START", "toolCallId": call_id,
                            "toolCallName": "update_counter"}),
                       sse({"type": "TOOL_CALL_ARGS", "toolCallId": call_id,
                            "delta": '{"delta": 1}'}),
                       sse({"type": "TOOL_CALL_END", "toolCallId": call_id})]
    return [b"".join([*events, sse({"type": "RUN_FINISHED", "threadId": "t", "runId": "r"})])]


@pytest.mark.parametrize("chunks", [False, True], ids=["start", "chunk"])
def test_a_run_asking_for_too_many_calls_fails_before_the_page_sees_one(chunks: bool) -> None:
    """Found: nothing bounded the calls of one run but its 16 MiB: 150,000 calls of a tool
    the page lacks held Core's event loop for 10 s and took 800 MB (each answered
    TOOL_HANDLER_NOT_FOUND listing every tool, all sent back in the next run: 66 MB);
    60,000 of one it has opened 60,000 requests (64 sent, the rest TOO_MANY_PENDING)."""
    async def main() -> None:
        scripts = [Script(_calls(MAX_CALLS + 1, chunks=chunks)), Script(text_run("ok"))]
        async with ScriptedAgent(scripts) as agent, running_core(ag_ui(agent.url)) as core:
            session, runs = counter_session()
            page = await Page(session).connect(core.ws_url)
            with pytest.raises(TurnError) as failed:
                await page.session.send_text("go")
            assert failed.value.code == "AGENT_ERROR"
            assert f"asked for over {MAX_CALLS} tool calls in one run" in failed.value.message
            assert page.frames("tool.request") == [] and runs == []
            assert len(agent.requests) == 1

    run(main())


def test_a_run_may_ask_for_as_many_calls_as_allowed_and_reuse_an_id() -> None:
    async def main() -> None:
        scripts = [Script(_calls(MAX_CALLS, same_id=True)), Script(text_run("ok"))]
        async with ScriptedAgent(scripts) as agent, running_core(ag_ui(agent.url)) as core:
            session, runs = counter_session()
            page = await Page(session).connect(core.ws_url)
            assert await page.session.send_text("go") == "ok"
            assert runs == [{"delta": 1}]  # one id: one call, its args the last ones

    run(main())


def test_large_args_are_parsed_once_off_the_event_loop(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Found: a call's args (up to 16 MiB of JSON) were parsed twice and encoded once on
    the event loop (10 MB of numbers held it 1.4 s), where Core works on any value over
    ``LARGE_CHARS`` in its worker threads; then twice in those threads (json holds the
    GIL), for the history's message and for the request."""
    args = '{"delta": 1, "pad": [' + "1," * LARGE_CHARS + "1]}"
    seen: list[bool] = []
    decode = strictjson.decode

    def spy(text: str) -> Any:
        if text == args:
            seen.append(threading.current_thread() is threading.main_thread())
        return decode(text)

    async def main() -> None:
        scripts = [Script(call_run("update_counter", args)), Script(text_run("ok"))]
        async with ScriptedAgent(scripts) as agent, running_core(ag_ui(agent.url)) as core:
            page = await Page(counter_session()[0]).connect(core.ws_url)
            monkeypatch.setattr(strictjson, "decode", spy)
            assert await page.session.send_text("go") == "ok"

    run(main())
    assert seen == [False]  # parsed once, not on the loop's thread


# --- what one event may cost ------------------------------------------------------------------

#: more JSON values than one event may hold: [[],[],...]
MANY = "[" + ",".join(["[]"] * MAX_EVENT_VALUES) + "]"
#: ~4 MiB of nested arrays: the costliest JSON to build per byte that strings do not bound
NESTED = "[" + "[[[[[[]]]]]]," * ((MAX_EVENT_BYTES - 200) // 13) + "0]"


class _Parses:
    """Core's work on large events, watched: the length of each event validated, of each
    whose values were counted, and of each text its type was read from."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.validated: list[int] = []
        self.counted: list[int] = []
        self.typed: list[int] = []

        def watched(lengths: list[int], work: Callable[..., Any]) -> Callable[..., Any]:
            def run(value: Any, *args: Any, **kwargs: Any) -> Any:
                lengths.append(len(value))
                return work(value, *args, **kwargs)
            return run

        adapter = SimpleNamespace(validate_json=watched(self.validated,
                                                        ag_ui_agent._EVENT.validate_json))
        monkeypatch.setattr(ag_ui_agent, "_EVENT", adapter)
        monkeypatch.setattr(ag_ui_agent, "_values", watched(self.counted, ag_ui_agent._values))
        monkeypatch.setattr(ag_ui_agent, "from_json", watched(self.typed, ag_ui_agent.from_json))

    def check(self, event: str) -> None:
        """``event`` was never validated, its values counted only within the bound on
        validated bytes, its type read from its first bytes alone."""
        assert self.validated and max(self.validated) < len(event), self.validated
        assert len(event) <= MAX_VALIDATED_EVENT_BYTES or len(event) not in self.counted
        assert all(length <= TYPE_PREFIX_BYTES for length in self.typed), self.typed


REFUSED = {
    # found: a 4 MiB event of ``[],`` (extra fields are allowed) held Core's event loop for
    # 0.5 s: pydantic builds its values in a worker thread, but with the GIL held
    "values": ('{"type": "TOOL_CALL_ARGS", "toolCallId": "c", "delta": "{}", "pad": '
               + MANY + "}", f"sent a TOOL_CALL_ARGS event of over {MAX_EVENT_VALUES} JSON values"),
    "bytes": ('{"type": "TOOL_CALL_ARGS", "toolCallId": "c", "delta": "'
              + " " * MAX_VALIDATED_EVENT_BYTES + '"}',
              f"sent a TOOL_CALL_ARGS event of over {MAX_VALIDATED_EVENT_BYTES} bytes"),
    # a type Core skips, but not leading: the event's size decides
    "type last": ('{"snapshot": ' + MANY + ', "type": "STATE_SNAPSHOT"}',
                  f"sent an event of over {MAX_EVENT_VALUES} JSON values"),
    # its type is in its first bytes, but too deep in them to be read
    "deep": ('{"type": "RAW", "event": ' + "[" * 100_000 + "]" * 100_000 + "}",
             f"sent an event of over {MAX_EVENT_VALUES} JSON values"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_an_event_over_the_bounds_fails_the_turn_unvalidated(
        case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    parses = _Parses(monkeypatch)
    event, said = REFUSED[case]
    run_events = [started(), sse({"type": "TOOL_CALL_START", "toolCallId": "c",
                                  "toolCallName": "update_counter"}), sse(event)]

    async def main() -> None:
        async with ScriptedAgent([Script(run_events)]) as agent, \
                running_core(ag_ui(agent.url)) as core:
            session, runs = counter_session()
            page = await Page(session).connect(core.ws_url)
            with pytest.raises(TurnError) as failed:
                await page.session.send_text("go")
            assert failed.value.code == "AGENT_ERROR"
            assert said in failed.value.message, failed.value.message
            assert runs == []

    run(main())
    parses.check(event)


SKIPPED = {
    "values": '{"type": "STATE_SNAPSHOT", "snapshot": ' + MANY + "}",
    # found (by a stranger): reading such an event's type parsed all of it, 0.3-0.6 s and
    # ~150 MiB for 4 MiB of nested arrays
    "nested": '{"type": "STATE_SNAPSHOT", "snapshot": ' + NESTED + "}",
    # found (by a stranger): counting values outside strings took ~0.2 s on 4 MiB of them
    "strings": '{"type": "STATE_SNAPSHOT", "snapshot": [' + '"",' * (MAX_EVENT_BYTES // 4)
               + '""]}',
}


@pytest.mark.parametrize("case", SKIPPED)
def test_an_event_over_the_bounds_that_core_has_no_use_for_is_skipped_unread(
        case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    parses = _Parses(monkeypatch)
    event = SKIPPED[case]
    pieces = text_run("ok")
    pieces.insert(1, sse(event))

    async def main() -> None:
        async with ScriptedAgent([Script(pieces)]) as agent, \
                running_core(ag_ui(agent.url)) as core:
            page = await Page(counter_session()[0]).connect(core.ws_url)
            assert await page.session.send_text("go") == "ok"

    run(main())
    parses.check(event)


def test_brackets_and_commas_in_strings_are_no_values() -> None:
    """A model may well say JSON, or send a call's args as one delta: JSON in a string."""
    said = "[{,]}" * MAX_EVENT_VALUES

    async def main() -> None:
        async with ScriptedAgent([Script(text_run(said))]) as agent, \
                running_core(ag_ui(agent.url)) as core:
            page = await Page(counter_session()[0]).connect(core.ws_url)
            assert await page.session.send_text("go") == said

    run(main())


def test_arguments_longer_than_a_call_can_carry_are_answered_unread(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Found (by a stranger): 16 MB of a call's arguments, sent as small deltas, were
    decoded twice in a worker thread with the GIL held: the event loop stalled for seconds
    and Core took ~1 GB. No tool call can carry more than a page's frame."""
    piece = '"' + "x" * (64 * 1024 - 2) + '",'
    pieces = MAX_ARGUMENTS_CHARS // len(piece) + 1
    run_events = [started(), sse({"type": "TOOL_CALL_START", "toolCallId": "c",
                                  "toolCallName": "update_counter"}),
                  sse({"type": "TOOL_CALL_ARGS", "toolCallId": "c", "delta": '{"pad": ['})]
    run_events += [sse({"type": "TOOL_CALL_ARGS", "toolCallId": "c", "delta": piece})] * pieces
    run_events += [sse({"type": "TOOL_CALL_ARGS", "toolCallId": "c", "delta": '""]}'}),
                   sse({"type": "TOOL_CALL_END", "toolCallId": "c"}),
                   sse({"type": "RUN_FINISHED", "threadId": "t", "runId": "r"})]
    decoded: list[int] = []
    decode = strictjson.decode

    def spy(text: str) -> Any:
        decoded.append(len(text))
        return decode(text)

    async def main() -> None:
        scripts = [Script(run_events), Script(text_run("ok"))]
        async with ScriptedAgent(scripts) as agent, running_core(ag_ui(agent.url)) as core:
            session, runs = counter_session()
            page = await Page(session).connect(core.ws_url)
            monkeypatch.setattr(strictjson, "decode", spy)
            assert await page.session.send_text("go") == "ok"
            assert runs == []
            [answer] = [message for message in agent.requests[1]["body"]["messages"]
                        if message["role"] == "tool"]
            assert (f"the arguments for update_counter are over {MAX_ARGUMENTS_CHARS} "
                    "characters") in answer["content"], answer["content"][:300]

    run(main())
    assert max(decoded, default=0) <= MAX_ARGUMENTS_CHARS, decoded


def test_while_the_page_works_the_agent_holds_no_args_decoded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Found (by a stranger): a model agent kept each call's arguments decoded (its reading
    of them, and the request) while the page worked, as well as the turn's text of them:
    15 calls of 1 MiB of small arrays held ~450 MiB for as long as the page took. Then the
    turn decoded each call's arguments back for its outcome, which a model agent never
    reads: once more per call, held until the step ended."""
    args = '{"delta": 2, "pad": [' + ",".join(["[]"] * 1000) + "]}"
    decoded_back: list[str] = []
    value = JsonText.value

    def spy(kept: JsonText) -> Any:
        if '"pad":' in kept.text:
            decoded_back.append(kept.text)
        return value(kept)

    monkeypatch.setattr(JsonText, "value", spy)

    def decoded() -> list[object]:
        gc.collect()
        return [held for held in gc.get_objects()
                if (isinstance(held, ToolCallRequest) and "pad" in held.args)
                or (isinstance(held, ModelCall) and held.is_read)]

    async def main() -> None:
        scripts = [Script(call_run("update_counter", args)), Script(text_run("ok"))]
        async with ScriptedAgent(scripts) as agent, running_core(ag_ui(agent.url)) as core:
            page = await RawClient.open(core.ws_url)
            welcome = await page.hello([tool_meta("update_counter")])
            turn = asyncio.ensure_future(core.http.post(  # (it waits for the looks below)
                f"/pedelec/v1/sessions/{welcome['sessionId']}/turns", json={"text": "go"},
                timeout=WAIT))
            request = await next_of(page, "tool.request")
            assert len(request["args"]["pad"]) == 1000
            assert decoded() == []
            await result(page, request["toolRequestId"], {"value": 2})
            assert (await asyncio.wait_for(turn, WAIT)).json()["status"] == "completed"
            await page.close()

    run(main())
    assert decoded_back == []


def test_every_run_shares_one_tls_context(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found: every run made an HTTP client with a TLS context of its own, loading the CA
    bundle on the event loop (~40 ms here), even for an http URL."""
    made: list[int] = []
    create = ssl.create_default_context

    def spy(*args: Any, **kwargs: Any) -> ssl.SSLContext:
        made.append(1)
        return create(*args, **kwargs)

    async def main() -> None:
        scripts = [Script(call_run("update_counter", '{"delta": 1}')), Script(text_run("a")),
                   Script(text_run("b"))]
        async with ScriptedAgent(scripts) as agent, running_core(ag_ui(agent.url)) as core:
            page = await Page(counter_session()[0]).connect(core.ws_url)
            monkeypatch.setattr(ssl, "create_default_context", spy)
            assert await page.session.send_text("go") == "a"
            assert await page.session.send_text("again") == "b"
            assert len(agent.requests) == 3

    run(main())
    assert made == []
    assert ag_ui_agent._tls() is ag_ui_agent._tls()


# --- memory --------------------------------------------------------------------------------


def test_an_event_of_tiny_data_lines_takes_the_memory_of_its_bytes() -> None:
    """Found: an event's data lines were kept as a list of bytes objects: one of 4 MiB in
    2-byte lines took ~50 MB (a line's object costs ~17 times its 3 bytes, at any size: an
    eighth of the limit shows it, in an eighth of the time)."""
    size = MAX_EVENT_BYTES // 8
    lines = (size - 16) // 3
    stream = b"data: " + b"\ndata:xy" * lines + b"\n\n"

    async def read() -> list[bytes]:
        async def chunks() -> AsyncIterator[bytes]:
            for start in range(0, len(stream), 64 * 1024):
                yield stream[start:start + 64 * 1024]

        return [event async for event in sse_events(chunks(), "here")]

    tracemalloc.start()
    try:
        [event] = asyncio.run(read())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(event) == 3 * lines and event.endswith(b"\nxy")
    assert peak < 3 * size, peak


#: one read: one event of tiny lines, tiny events, or events of 16 KiB; what it should give,
#: and how many turns of the event loop at least while it is parsed
KIB_16 = b"x" * (16 * 1024)
ONE_READ = {
    # found: parsed in one go, it held the event loop ~45 ms a 64 KiB read (a 4 MiB event
    # of them, 3 s in 45 ms pieces)
    "one event": (b"data: " + b"\ndata:xy" * 21_843 + b"\n\n", [b"\nxy" * 21_843],
                  21_844 // 256 - 1),
    # found (by a stranger): each event is handled before the next is read, and 4,096 lines
    # at a time were ~2,000 events, ~100 ms
    "tiny events": (b"data:{}\n\n" * 7_281, [b"{}"] * 7_281, 2 * 7_281 // 256 - 1),
    # found (by a stranger): 128 events of 16 KiB (validated in place) were ~90 ms
    "16 KiB events": ((b"data:" + KIB_16 + b"\n\n") * 64, [KIB_16] * 64, 63),
}


@pytest.mark.parametrize("case", ONE_READ)
def test_a_read_is_parsed_256_lines_or_16_kib_of_events_at_a_time(case: str) -> None:
    stream, expected, turns_at_least = ONE_READ[case]

    async def main() -> int:
        turns = 0

        async def count_turns() -> None:
            nonlocal turns
            while True:
                turns += 1
                await asyncio.sleep(0)

        async def one_read() -> AsyncIterator[bytes]:
            yield stream

        counter = asyncio.create_task(count_turns())
        await asyncio.sleep(0)
        before = turns
        events = [event async for event in sse_events(one_read(), "here")]
        during = turns - before
        counter.cancel()
        assert events == expected
        return during

    assert asyncio.run(main()) >= turns_at_least


# --- secrets ---------------------------------------------------------------------------------


def test_an_echoed_url_password_or_query_key_is_never_shown() -> None:
    """Found: header values were hidden where the agent echoed them, but not the URL's
    password or query values, which the docs promise never to show."""
    async def main() -> None:
        echo = b"no agent at /agent?key=qk-s3cret-1&x=1 for u:pw-s3cret-2 (pw%2Ds3cret)"
        script = Script([echo], status=404, content_type="text/plain")
        async with ScriptedAgent([script]) as agent:
            url = agent.url.replace("://", "://u:pw%2Ds3cret@") + "?key=qk-s3cret-1&x=1"
            async with running_core(ag_ui(url)) as core:
                page = await Page(counter_session()[0]).connect(core.ws_url)
                with pytest.raises(TurnError) as failed:
                    await page.session.send_text("go")
        message = failed.value.message
        assert "answered HTTP 404: no agent at /agent?key=***&x=1 for u:" in message, message
        assert "s3cret" not in message

    run(main())


def test_the_url_password_the_agent_echoes_as_basic_auth_is_never_shown() -> None:
    """Found (by a stranger): the URL's user and password go as ``Authorization: Basic``;
    an agent that echoed that header showed them, base64-encoded, in the turn's error and
    Core's log."""
    basic = base64.b64encode(b"u:pw-s3cret-2").decode()

    async def main() -> None:
        echo = f"unauthorized: token Basic {basic} tenant None".encode()
        script = Script([echo], status=401, content_type="text/plain")
        async with ScriptedAgent([script]) as agent:
            url = agent.url.replace("://", "://u:pw%2Ds3cret-2@")
            async with running_core(ag_ui(url)) as core:
                page = await Page(counter_session()[0]).connect(core.ws_url)
                with pytest.raises(TurnError) as failed:
                    await page.session.send_text("go")
            assert agent.requests[0]["headers"]["authorization"] == f"Basic {basic}"
        message = failed.value.message
        assert "answered HTTP 401: unauthorized: token Basic *** tenant None" in message, (
            message)

    run(main())


def test_credentials_in_the_url_and_an_authorization_header_are_refused_at_start() -> None:
    """Found (by a stranger): with both, the header was dropped without a word (the URL's
    user and password are sent as the Authorization header)."""
    with pytest.raises(ValueError, match="give one of them"):
        make_agent("ag-ui:http://u:pw@127.0.0.1:1/agent",
                   headers=[("Authorization", "Bearer t")])
    make_agent("ag-ui:http://127.0.0.1:1/agent", headers=[("Authorization", "Bearer t")])
    make_agent("ag-ui:http://u:pw@127.0.0.1:1/agent", headers=[("X-Tenant", "acme")])


def test_a_url_that_is_not_one_is_quoted_as_given() -> None:
    with pytest.raises(ValueError, match=r"got not-a-url$"):
        make_agent("ag-ui:not-a-url")


# --- the operator's headers ----------------------------------------------------------------


@pytest.mark.parametrize("header", ["Content-Length: 3", "transfer-encoding: chunked",
                                    "Accept: application/json", "Content-Type: text/plain",
                                    "Accept-Encoding: gzip", "Connection: Upgrade"])
def test_a_header_core_sets_itself_is_refused_at_start(
        header: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Found: ``--agent-header "Transfer-Encoding: chunked"`` sent both framings (a request
    a proxy may split in two), ``Content-Length`` broke every run, ``Accept`` went twice."""
    name = header.partition(":")[0]
    with pytest.raises(ValueError, match=f"--agent-header {name}: Core sets this header"):
        parse_header(header)
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["serve", "--agent", "ag-ui:http://127.0.0.1:1/",
                                   "--agent-header", header])
    assert exited.value.code == 2
    assert "Core sets this header itself" in capsys.readouterr().err
    assert parse_header("Host: agents.internal") == ("Host", "agents.internal")  # allowed


# --- what one turn may cost, in all ----------------------------------------------------------


def test_a_step_limit_naming_huge_tools_still_ends_the_turn_on_the_page() -> None:
    """Found: the step limit's message listed every tool the agent still asked for, whole:
    a 1.5 MB name made a ``turn.end`` frame over the page's 1 MiB, refused by the page at
    every reconnect: the turn never ended there. (Such a name in a log line:
    test_security.) Each name is under the bound on an event Core validates; the two are
    over the page's frame."""
    name = "x" * 750_000
    two_calls = [started()] + [
        sse({"type": "TOOL_CALL_START", "toolCallId": call_id, "toolCallName": name})
        for call_id in ("c1", "c2")] + [sse({"type": "RUN_FINISHED", "threadId": "t",
                                             "runId": "r"})]

    async def main() -> None:
        scripts = [Script(two_calls)]
        async with ScriptedAgent(scripts) as agent, \
                running_core(ag_ui(agent.url, max_steps=0)) as core:
            page = await Page(counter_session()[0]).connect(core.ws_url)
            with pytest.raises(TurnError) as failed:
                await asyncio.wait_for(page.session.send_text("go"), WAIT)
            assert failed.value.code == "STEP_LIMIT_EXCEEDED"
            message = failed.value.message
            assert "still asked for xxx" in message and len(message) < 300, message[:400]

    run(main())


def test_an_agent_that_sends_events_for_ever_ends_its_run_at_the_run_limit() -> None:
    """Found: only the gap between two events had a deadline: an agent sending a
    ``STEP_STARTED`` now and then kept its turn (and the session) busy for good."""
    def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
              stopping: asyncio.Event) -> Awaitable[None]:
        return trickle(writer, stopping, b"HTTP/1.1 200 OK\r\nContent-Type: "
                       b"text/event-stream\r\n\r\n" + started(),
                       lambda n: sse({"type": "STEP_STARTED", "stepName": f"s{n}"}))

    async def main() -> None:
        async with raw_agent(serve) as url, running_core(ag_ui(
                url, tool_timeout_ms=TIMEOUT_MS, max_total_factor=3)) as core:
            page = await Page(counter_session()[0]).connect(core.ws_url)
            loop = asyncio.get_running_loop()
            began = loop.time()
            with pytest.raises(TurnError) as failed:
                await asyncio.wait_for(page.session.send_text("go"), WAIT)
            assert failed.value.code == "AGENT_ERROR"
            assert "did not finish its run within 0.9 s" in failed.value.message, (
                failed.value.message)
            assert 0.9 <= loop.time() - began < WAIT

    run(main())


def test_a_turns_runs_together_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found: each run was bounded (16 MiB), not the turn: every run is sent what the ones
    before it said, so nine runs of 15 MB each sent the agent ~120 MB in the last and held
    ~450 MiB of Core's memory (three such sessions: 1.3 GiB)."""
    budget = 64 * 1024
    monkeypatch.setattr(ag_ui_agent, "MAX_TURN_STREAM_BYTES", budget)
    pad = "y" * (budget // 3)

    def saying_and_calling(n: int) -> Script:
        events = call_run("update_counter", '{"delta": 1}', call_id=f"c{n}")
        return Script([events[0], sse({"type": "TEXT_MESSAGE_CONTENT", "messageId": f"m{n}",
                                       "delta": pad}), *events[1:]])

    async def main() -> None:
        scripts = [saying_and_calling(n) for n in range(5)]
        async with ScriptedAgent(scripts) as agent, running_core(ag_ui(agent.url)) as core:
            session, runs = counter_session()
            page = await Page(session).connect(core.ws_url)
            with pytest.raises(TurnError) as failed:
                await asyncio.wait_for(page.session.send_text("go"), WAIT)
            assert failed.value.code == "AGENT_ERROR"
            assert f"sent over {budget} bytes in one turn's runs" in failed.value.message
            assert len(agent.requests) == 3 and len(runs) == 2  # the third run is cut off

    run(main())
