"""Core's one clock (``CoreConfig.clock``): the fake one tests move (its timers, sleeps and
timeouts in order), the helpers on any clock, and Core's deadlines, session expiry and
leases kept by it, with no real time waited."""

from __future__ import annotations

import asyncio

import pytest
from clockkit import FakeClock
from corekit import RawClient, config, next_of, run, running_core, tool_meta, until

from pedelec_pyodide.core.clock import SystemClock, wait, wait_for
from pedelec_pyodide.core.store import MemoryStore

# --- the fake clock -----------------------------------------------------------------------


def test_the_fake_clock_fires_timers_and_sleeps_in_order_at_their_time() -> None:
    async def main() -> None:
        clock = FakeClock(start=1_000.0)
        fired: list[tuple[str, float]] = []

        async def sleeper(name: str, gaps: list[float]) -> None:
            for gap in gaps:
                await clock.sleep(gap)
                fired.append((name, round(clock.elapsed, 6)))

        tasks = [asyncio.ensure_future(sleeper("a", [1.0, 1.0, 1.0])),
                 asyncio.ensure_future(sleeper("b", [1.5, 0.1]))]
        clock.call_later(2.5, lambda: fired.append(("timer", round(clock.elapsed, 6))))
        cancelled = clock.call_later(0.5, lambda: fired.append(("cancelled", 0.0)))
        cancelled.cancel()
        await clock.advance(0.9)
        assert fired == [] and clock.time() == pytest.approx(1_000.9)
        await clock.advance(10)  # each sleep a task set after its wake fires in order
        assert fired == [("a", 1.0), ("b", 1.5), ("b", 1.6), ("a", 2.0), ("timer", 2.5),
                         ("a", 3.0)]
        assert clock.elapsed == pytest.approx(10.9) and clock.waiting == 0
        await asyncio.gather(*tasks)

    run(main())


def test_a_fake_timeout_raises_at_its_time_and_passes_other_cancels_on() -> None:
    async def main() -> None:
        clock = FakeClock()
        never = asyncio.get_running_loop().create_future()
        timed = asyncio.ensure_future(wait_for(clock, never, 5.0))
        await clock.advance(4.9)
        assert not timed.done()
        await clock.advance(0.1)
        with pytest.raises(TimeoutError):
            await timed
        assert never.cancelled()

        # done in time: its result, and the timer is gone
        assert await wait_for(clock, asyncio.sleep(0, "ok"), 5.0) == "ok"
        assert clock.waiting == 0

        # a cancel from elsewhere is not a timeout
        waiting = asyncio.ensure_future(wait_for(clock, asyncio.Event().wait(), 5.0))
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting

        # wait(): returns at its time, cancelling nothing
        task = asyncio.ensure_future(asyncio.Event().wait())
        waited = asyncio.ensure_future(wait(clock, [task], 2.0))
        await clock.advance(2.0)
        await waited
        assert not task.done()
        task.cancel()

    run(main())


def test_the_system_clocks_helpers_keep_asyncios_rules() -> None:
    async def main() -> None:
        clock = SystemClock()
        with pytest.raises(TimeoutError):
            await wait_for(clock, asyncio.Event().wait(), 0.01)
        task = asyncio.ensure_future(asyncio.Event().wait())
        await wait(clock, [task], 0.01)
        assert not task.done()
        task.cancel()
        await clock.sleep(0)
        assert clock.monotonic() <= SystemClock().monotonic()

    run(main())


# --- Core on the fake clock ---------------------------------------------------------------


def test_a_local_lease_expires_on_the_clock() -> None:
    async def main() -> None:
        clock = FakeClock()
        store = MemoryStore(clock)
        assert await store.claim("s", "node-a", 6.0) is None
        await clock.advance(5.9)
        assert await store.holder("s") == "node-a"
        assert (await store.renew(["s"], "node-a", 6.0)).retaken == []
        await clock.advance(5.9)
        assert await store.holder("s") == "node-a"  # renewed: six seconds from then
        await clock.advance(0.1)
        assert await store.holder("s") is None
        assert await store.claim("s", "node-b", 6.0) is None  # free again

    run(main())


def test_a_request_deadline_and_a_sessions_expiry_run_on_cores_clock() -> None:
    """A request times out when the clock passes its deadline (its waitedMs the clock's),
    and the session whose page went away expires at --session-ttl of the clock: no real
    time is waited for either."""

    async def main() -> None:
        clock = FakeClock()
        async with running_core(config(clock=clock, tool_timeout_ms=30_000,
                                       session_ttl=120.0)) as core:
            page = await RawClient.open(core.ws_url)
            sid = (await page.hello([tool_meta("t")]))["sessionId"]
            call = asyncio.ensure_future(core.tool_call(sid, "t", {}))
            await next_of(page, "tool.request")
            await clock.advance(29.9)
            assert not call.done()
            await clock.advance(0.1)
            answer = (await asyncio.wait_for(call, 10)).json()
            assert answer["result"]["error"]["code"] == "TOOL_TIMEOUT"
            assert answer["result"]["error"]["details"]["waitedMs"] == 30_000

            await page.close()
            session = core.registry.sessions[sid]
            await until(lambda: session.connection is None, "the page gone")
            await clock.advance(119.9)
            assert sid in core.registry.sessions
            await clock.advance(0.1)
            assert sid not in core.registry.sessions

    run(main())
