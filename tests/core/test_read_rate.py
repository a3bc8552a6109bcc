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

from corekit import WAIT, RawClient, config, fake_clock, run, running_core, tool_meta, until
from pytest import approx
from test_page_connection import connect, feed, hello, in_core, sent

from pedelec_pyodide.core.page.connection import TURN_WORK
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
        assert first.read_delay("x" * 6_000) == 0  # within the burst (1 s of the rate)
        assert second.read_delay("x" * 6_000) == approx(2_000 / RATE)  # the same client's bucket
        assert other.read_delay("x" * 9_000) == 0  # another client's
        await clock.advance(0.2)  # what was owed is paid
        assert first.read_delay("x" * 1_000) == approx(1_000 / RATE)
        await clock.advance(1.1)  # full again (no more than the burst saved up)
        assert first.read_delay("x" * 10_000) == approx(0, abs=1e-9)
        assert first.read_delay("x") > 0
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
