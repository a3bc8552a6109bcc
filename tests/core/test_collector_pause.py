"""The garbage collector paused while Core's threads work on large values
(offload.CollectorPause): json makes a container per array or object it decodes, and
collections set off every few hundred walk them with the GIL held (1 MiB of ``[[],...]``:
~3x the time). The pause is one for the process, so these tests drive it by hand, one
work entered after another, as threads would."""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from pedelec_pyodide.core.http.mcp import _body_read_paused
from pedelec_pyodide.core.offload import CollectorPause, WorkerThreads, collector_paused, off_loop


@pytest.fixture(autouse=True)
def collector_restored() -> Iterator[None]:
    was = gc.isenabled()
    yield
    if was:
        gc.enable()
    else:  # pragma: no cover - the suite runs with the collector on
        gc.disable()


def test_paused_while_any_work_runs_and_on_again_after() -> None:
    pause = CollectorPause()
    with ExitStack() as first:
        first.enter_context(pause())
        assert not gc.isenabled()
        with pause():  # a second work, begun within the first's pause
            assert not gc.isenabled()
        assert not gc.isenabled()  # the first still runs
    assert gc.isenabled()


def test_a_pause_lasts_a_few_works_however_long_they_keep_overlapping() -> None:
    """Works that keep overlapping (a flood of large frames on several threads) would
    otherwise keep it paused for good, and other clients' cycles uncollected."""
    pause = CollectorPause(most_joining=2)

    def begin() -> ExitStack:
        work = ExitStack()
        work.enter_context(pause())
        return work

    first, second, third = begin(), begin(), begin()  # the first and two joining: the bound
    assert not gc.isenabled()
    second.close()  # one ends: the pause with it, the other two still running
    assert gc.isenabled()
    fourth = begin()  # begun while works run outside a pause: none begins
    assert gc.isenabled()
    for work in (first, third, fourth):
        work.close()
    assert gc.isenabled()
    fifth = begin()  # none left running: the next work pauses it again
    assert not gc.isenabled()
    fifth.close()
    assert gc.isenabled()


def test_a_collector_disabled_by_someone_else_stays_disabled() -> None:
    pause = CollectorPause()
    gc.disable()
    with pause():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_threads_overlapping_leave_it_on() -> None:
    pause = CollectorPause()
    ready = threading.Barrier(4)
    seen: list[bool] = []

    def work() -> None:
        with pause():
            ready.wait(timeout=10)
            seen.append(gc.isenabled())
            ready.wait(timeout=10)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert seen == [False] * 4 and gc.isenabled()


def test_core_s_own_work_off_the_loop_runs_paused() -> None:
    async def main() -> tuple[bool, bool]:
        return await off_loop(gc.isenabled), gc.isenabled()

    assert asyncio.run(main()) == (False, True)


def test_a_pause_for_one_step_ends_with_it() -> None:
    async def main() -> list[bool]:
        seen = []
        CollectorPause().for_this_step()
        seen.append(gc.isenabled())
        await asyncio.sleep(0)  # the step ends; the pause's end was the next callback
        seen.append(gc.isenabled())
        return seen

    assert asyncio.run(main()) == [False, True]


@pytest.mark.parametrize(("chunks", "paused"), [
    ([b"x" * 10_000, b"x" * 10_000], True),  # long: the step that has its end decodes it
    ([b"x" * 10_000], False),  # short: decoded at once, paused for nothing
])
def test_the_mcp_sdks_decode_of_a_long_body_runs_paused(chunks: list[bytes],
                                                          paused: bool) -> None:
    """The SDK decodes a request's body on the loop in the step that reads its end."""
    async def main() -> list[bool]:
        messages = [{"type": "http.request", "body": chunk, "more_body": True}
                    for chunk in chunks]
        messages[-1]["more_body"] = False

        async def receive() -> dict[str, object]:
            return messages.pop(0)

        read = _body_read_paused(receive)
        seen = []
        for _ in chunks:
            await read()
            seen.append(gc.isenabled())
        await asyncio.sleep(0)
        return [*seen, gc.isenabled()]

    assert asyncio.run(main()) == [True] * (len(chunks) - 1) + [not paused, True]


def test_works_wait_for_a_thread_on_the_loop_so_a_flood_does_not_end_the_pause() -> None:
    """Works queued in the threads' own queue counted as joining the pause at once: a
    flood of them ended it after the first, and the collector then ran in every decode of
    the flood (16 calls of 0.75 MiB pending at once held health at p99 ~1.6 s; ~0.7 s)."""
    threads = WorkerThreads(2, "test-pause")
    pairs = threading.Barrier(2, timeout=5)  # the two threads' works overlap, pair by pair
    seen: list[tuple[int, bool]] = []

    def work() -> None:
        pairs.wait()
        seen.append((collector_paused._working, gc.isenabled()))
        pairs.wait()

    async def main() -> None:
        await asyncio.gather(*(threads.run(work) for _ in range(6)))

    asyncio.run(main())
    assert max(working for working, _ in seen) == 2  # only the works that run count
    assert not any(enabled for _, enabled in seen[:4])  # the first four at least, paused
    assert gc.isenabled()


def test_a_work_whose_caller_is_cancelled_keeps_its_thread_and_pause_until_it_ends() -> None:
    threads = WorkerThreads(1, "test-cancel")
    started, release, ended = threading.Event(), threading.Event(), threading.Event()

    def slow() -> None:
        started.set()
        release.wait(5)
        ended.set()

    async def main() -> list[bool]:
        first = asyncio.ensure_future(threads.run(slow))
        await asyncio.to_thread(started.wait, 5)
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        seen = [gc.isenabled()]  # its work still runs: still paused
        release.set()
        await asyncio.to_thread(ended.wait, 5)
        following = await threads.run(gc.isenabled)  # (its thread is free: this runs)
        await asyncio.sleep(0)
        return [*seen, following, gc.isenabled()]

    assert asyncio.run(main()) == [False, False, True]
