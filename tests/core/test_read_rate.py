"""One client's frames are read at ``--read-rate`` characters a second, all its
connections together (a burst of 1 s of it): past it, Core reads that client's
connections more slowly, and refuses nothing. A stranger's 32 sessions from one address
sending 1 MiB frames of small arrays, or turns of 1 MiB of ``/call`` args, each within
its own connection's bounds, held everyone's ``/pedelec/v1/health`` for seconds: each
frame's JSON is decoded with the GIL held, and the event loop waited for it (figures in
docs/records/reliability.md, "One client, many sessions").

Time is Core's injected clock, moved by the tests: no test waits on the wall clock.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from corekit import WAIT, RawClient, config, fake_clock, run, running_core, tool_meta, until
from pytest import approx
from test_page_connection import connect, feed, hello, in_core, sent

from pedelec_pyodide.core.page.connection import TURN_WORK, PageConnection
from pedelec_pyodide.core.sessions import Registry

RATE = 10_000.0  # characters a second, for these tests


def progress(characters: int) -> str:
    """A ``tool.progress`` frame for a request Core does not know, about ``characters``
    long: answered UNKNOWN_TOOL_REQUEST, whatever the rate."""
    frame = {"type": "tool.progress", "toolRequestId": "none", "progress": 1, "message": ""}
    frame["message"] = "m" * (characters - len(json.dumps(frame)))
    return json.dumps(frame)


def test_a_client_past_its_rate_waits_and_its_connections_share_it() -> None:
    async def test(core: Registry) -> None:
        clock = core.config.clock
        first, _ = connect(core, "192.0.2.1")
        second, _ = connect(core, "192.0.2.1")
        other, _ = connect(core, "198.51.100.7")
        for page in (first, second, other):
            hello(page)  # (fed in directly: not charged)
        assert first.read_delay("x" * 6_000) == 0  # within the burst (1 s of the rate)
        assert second.read_delay("x" * 6_000) == approx(2_000 / RATE)  # the same client's bucket
        assert other.read_delay("x" * 9_000) == 0  # another client's
        await clock.advance(0.2)  # what was owed is paid
        assert first.read_delay("x" * 1_000) == approx(1_000 / RATE)
        await clock.advance(1.1)  # full again (no more than the burst saved up)
        assert first.read_delay("x" * 10_000) == approx(0, abs=1e-9)
        assert first.read_delay("x") > 0
    in_core(test, read_rate=RATE, clock=fake_clock())


def test_results_core_waits_for_and_frames_before_hello_are_charged_but_never_wait() -> None:
    """A result's request has a deadline, and whoever called the tool waits for it: the
    client's next frames pay for it instead. Before hello, the hello deadline runs (and
    a hello is bounded by --metadata-rate)."""
    async def test(core: Registry) -> None:
        page, _ = connect(core, "192.0.2.1")
        assert page.read_delay("x" * 12_000) == 0  # before hello: owed, not waited for
        welcome = hello(page)
        assert page.read_delay("x") > 0  # the debt is the client's
        await core.config.clock.advance(2.0)  # paid, and full again (10,000 a second)
        session = core.get(welcome["sessionId"])
        assert session is not None
        call = asyncio.ensure_future(session.start_call("t", {"big": True}))
        await core.config.clock.advance(0)
        [request] = [frame for frame in sent(page) if frame["type"] == "tool.request"]
        result = json.dumps({"type": "tool.result", "toolRequestId": request["toolRequestId"],
                             "result": "r" * 20_000, "handledBy": "named"},
                            separators=(",", ":"))  # as the page's runtime writes it
        assert page.read_delay(result) == 0
        unknown = result.replace(request["toolRequestId"], "unknown")
        assert page.read_delay(unknown) == approx((len(result) + len(unknown)) / RATE - 1)
        call.cancel()
    in_core(test, read_rate=RATE, clock=fake_clock())


def test_a_turn_is_charged_for_the_work_it_sets_off() -> None:
    """Several passes over its text (its /call lines read, their requests made and
    checked, its history kept), where its frame is read once."""
    async def test(core: Registry) -> None:
        page, _ = connect(core, "192.0.2.1")
        hello(page)
        text = "/call t " + json.dumps({"pad": "p" * 4_000})
        frame = json.dumps({"type": "turn.start", "turnId": "t1", "text": text})
        assert page.read_delay(frame) == 0
        assert feed(page, frame)
        owed = len(frame) + (TURN_WORK - 1) * len(text) - RATE
        assert page.read_delay("") == approx(owed / RATE)
        sent(page)
    in_core(test, read_rate=RATE, clock=fake_clock())


def test_a_slow_client_is_read_later_and_refused_nothing_while_others_are_not_slowed() -> None:
    """Over real sockets: the serve loop waits before it handles the frame its client has
    no budget for (and the WebSocket protocol reads no further from that connection
    meanwhile); a page of another client is answered at once."""
    clock = fake_clock()

    async def main() -> None:
        async with running_core(config(read_rate=RATE, clock=clock)) as core:
            slow = [await RawClient.open(core.ws_url, local_addr=("127.0.0.2", 0))
                    for _ in range(2)]
            other = await RawClient.open(core.ws_url, local_addr=("127.0.0.3", 0))
            for page in (*slow, other):
                assert (await page.hello([tool_meta("t")]))["type"] == "welcome"
            await clock.advance(2.0)  # the hellos paid for
            await slow[0].send(progress(8_000))
            assert (await slow[0].recv())["code"] == "UNKNOWN_TOOL_REQUEST"
            timers = clock.waiting
            await slow[1].send(progress(8_000))  # 6,000 characters over: 0.6 s
            await until(lambda: clock.waiting > timers, "the frame over the rate waiting")
            await slow[0].send(progress(100))  # the other connection's bucket is the same
            await other.send(progress(8_000))
            assert (await other.recv())["code"] == "UNKNOWN_TOOL_REQUEST"
            waiting = [asyncio.ensure_future(page.recv()) for page in slow]
            await clock.advance(0.3)
            assert not any(answer.done() for answer in waiting)
            await clock.advance(0.5)
            answers = await asyncio.wait_for(asyncio.gather(*waiting), WAIT)
            assert [answer["code"] for answer in answers] == ["UNKNOWN_TOOL_REQUEST"] * 2
            for page in (*slow, other):
                await page.close()

    run(main())


def test_each_frame_is_charged_once_whichever_way_it_is_handled(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Taken as parsed, or handed to the serve loop (long; new regular expressions to
    check in a thread; over the rate)."""
    charged: list[int] = []
    read_delay = PageConnection.read_delay

    def counted(page: PageConnection, data: str | bytes) -> float:
        charged.append(len(data))
        return read_delay(page, data)

    monkeypatch.setattr(PageConnection, "read_delay", counted)

    async def main() -> list[int]:
        async with running_core(config()) as core:
            page = await RawClient.open(core.ws_url)
            assert (await page.hello([tool_meta("t")]))["type"] == "welcome"
            patterned = {**tool_meta("p"), "argsSchema": {"type": "object", "properties": {
                "s": {"type": "string", "pattern": "^(a|b)+[0-9]{2,4}$"}}}}
            frames = [json.dumps({"type": "tools.update", "tools": [patterned]}),
                      progress(100), progress(40_000)]
            for frame in frames:
                await page.send(frame)
                if json.loads(frame)["type"] == "tool.progress":
                    assert (await page.recv())["code"] == "UNKNOWN_TOOL_REQUEST"
            await until(lambda: len(charged) >= 4, "every frame read")
            await page.close()
            return [len(frame) for frame in frames]

    sizes = run(main())
    assert sorted(charged[1:]) == sorted(sizes)  # (the first: the hello)
