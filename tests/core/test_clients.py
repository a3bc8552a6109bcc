"""Per client address (issue 22): sessions capped per client, no client's hellos evicting
another's session, IPv6 clients by their /64, and a session restored from the store
counting for the first client to resume it.

Each client is a loopback source address of its own (127.0.0.2, 127.0.0.3, ...): Core sees
them as different clients exactly as it would different machines.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
import websockets
from corekit import WAIT, RawClient, config, run, running_core, tool_meta, until
from websockets.frames import Opcode
from ws_hostile import RawSocket, frame

from pedelec_pyodide.core.page.clients import UNKNOWN, client_key
from pedelec_pyodide.core.sessions import TOO_MANY_SESSIONS
from pedelec_pyodide.protocol import CLOSE_TRY_AGAIN


async def from_address(url: str, host: str) -> RawClient:
    return await RawClient.open(url, local_addr=(host, 0))


async def closed_with(client: RawClient) -> int | None:
    """The close code Core ends ``client``'s connection with (within WAIT)."""
    with contextlib.suppress(websockets.ConnectionClosed):
        while True:
            await asyncio.wait_for(client.ws.recv(), WAIT)
    return client.ws.close_code


def test_client_keys_group_ipv6_by_its_64_and_map_ipv4() -> None:
    assert client_key("127.0.0.2") == "127.0.0.2"
    assert client_key("2001:db8:1:2:aaaa::1") == client_key("2001:db8:1:2:bbbb::9")
    assert client_key("2001:db8:1:2::1") != client_key("2001:db8:1:3::1")
    assert client_key("2001:db8:1:2::1") == "2001:db8:1:2::/64"
    assert client_key("::ffff:10.0.0.1") == "10.0.0.1"
    assert client_key(None) == client_key("") == UNKNOWN
    assert client_key("some-proxy-name") == "some-proxy-name"


def test_a_client_over_its_cap_is_refused_and_another_client_is_not() -> None:
    async def main() -> None:
        async with running_core(config(max_sessions_per_client=2)) as core:
            mine = []
            for _ in range(3):  # (each says hello before the next connects: see below)
                mine.append(await from_address(core.ws_url, "127.0.0.2"))
                answer = await mine[-1].hello()
            assert [m.ws.close_code for m in mine[:2]] == [None, None]
            refused = answer
            assert refused["code"] == TOO_MANY_SESSIONS
            assert "--max-sessions-per-client" in refused["message"]
            assert await closed_with(mine[2]) == CLOSE_TRY_AGAIN
            other = await from_address(core.ws_url, "127.0.0.3")
            assert (await other.hello())["type"] == "welcome"
            assert len(core.registry.sessions) == 3
            for client in (*mine[:2], other):
                await client.close()

    run(main())


def test_connections_yet_to_say_hello_are_bounded_per_client_and_in_all() -> None:
    """No session counts a connection before its hello, yet each may hold a frame of MiBs
    being received: a client may have as many of them as it may have sessions (one more
    is closed at once, 1013, nothing more it sends read), Core as many as it may hold
    sessions; at that cap a newcomer takes the place of the oldest of the client that has
    the most, so no few clients can keep the others' pages out."""
    async def main() -> None:
        async with running_core(config(max_sessions=3, max_sessions_per_client=2)) as core:
            mine = [await from_address(core.ws_url, "127.0.0.2") for _ in range(3)]
            assert await closed_with(mine[2]) == CLOSE_TRY_AGAIN  # its own cap
            others = [await from_address(core.ws_url, "127.0.0.3") for _ in range(2)]
            # three in all, and no client would have more than 127.0.0.3 then
            assert await closed_with(others[1]) == CLOSE_TRY_AGAIN
            newcomer = await from_address(core.ws_url, "127.0.0.4")
            assert await closed_with(mine[0]) == CLOSE_TRY_AGAIN  # made room for it
            for client in (mine[1], newcomer, others[0]):
                assert (await client.hello())["type"] == "welcome"
            late = await from_address(core.ws_url, "127.0.0.2")
            assert (await late.hello()).get("code") == TOO_MANY_SESSIONS  # Core is full
            await closed_with(late)
            assert len(core.registry.arrivals) == 0
            for client in (mine[1], newcomer, others[0]):
                await client.close()

    run(main())


def test_hellos_never_evict_another_clients_session_nor_its_pending_call() -> None:
    """The issue's attack in small: Core full, a page from one client reloading (its
    session disconnected, a call pending), another client's hellos. Before: the hellos
    expired the reloading page's session (RESUME_REFUSED, its call SESSION_EXPIRED)."""
    async def main() -> None:
        async with running_core(config(max_sessions=3, max_sessions_per_client=2)) as core:
            page = await from_address(core.ws_url, "127.0.0.2")
            welcome = await page.hello([tool_meta("slow")])
            sid = welcome["sessionId"]
            call = asyncio.create_task(core.tool_call(sid, "slow", {}, timeoutMs=int(WAIT * 1000)))
            assert (await page.recv())["type"] == "tool.request"
            await page.close()  # the page reloads
            await until(lambda: core.registry.sessions[sid].connection is None, "the drop")
            flood, answers = [], []
            for _ in range(4):
                flood.append(await from_address(core.ws_url, "127.0.0.3"))
                answers.append(await flood[-1].hello())
            assert [a["type"] for a in answers[:2]] == ["welcome", "welcome"]
            # Core is full (3) and the one session awaiting a resume is not theirs
            assert [a.get("code") for a in answers[2:]] == [TOO_MANY_SESSIONS] * 2
            assert sid in core.registry.sessions and not call.done()
            back = await from_address(core.ws_url, "127.0.0.2")
            resumed = await back.hello([tool_meta("slow")], sessionId=sid,
                                       resumeToken=welcome["resumeToken"])
            assert resumed["type"] == "welcome" and resumed["resumed"] is True
            request = await back.recv()  # the pending call, sent again
            assert request["type"] == "tool.request"
            await back.send({"type": "tool.result", "toolRequestId": request["toolRequestId"],
                             "result": {"ok": True}, "handledBy": "named"})
            assert (await asyncio.wait_for(call, WAIT)).json()["result"] == {"ok": True}
            for client in (back, *flood[:2]):
                await client.close()

    run(main())


def test_a_client_makes_room_from_its_own_disconnected_sessions_only() -> None:
    async def main() -> None:
        async with running_core(config(max_sessions=4, max_sessions_per_client=2)) as core:
            other = await from_address(core.ws_url, "127.0.0.3")
            theirs = (await other.hello())["sessionId"]
            await other.close()  # another client's session, awaiting a resume
            first = await from_address(core.ws_url, "127.0.0.2")
            old = (await first.hello())["sessionId"]
            second = await from_address(core.ws_url, "127.0.0.2")
            await second.hello()
            await first.close()
            await until(lambda: core.registry.sessions[old].connection is None, "the drop")
            third = await from_address(core.ws_url, "127.0.0.2")
            assert (await third.hello())["type"] == "welcome"  # in place of its own `old`
            assert old not in core.registry.sessions and theirs in core.registry.sessions
            # at its cap with none of its own disconnected: refused, theirs still kept
            fourth = await from_address(core.ws_url, "127.0.0.2")
            assert (await fourth.hello())["code"] == TOO_MANY_SESSIONS
            assert theirs in core.registry.sessions
            await second.close()
            await third.close()

    run(main())


@pytest.mark.parametrize("clients", [1, 3])
def test_a_closed_session_gives_its_place_back(clients: int) -> None:
    """The count follows sessions that expire: a client at its cap whose sessions expired
    may open as many again (and Core forgets the client once it holds none)."""
    async def main() -> None:
        async with running_core(config(max_sessions_per_client=2, session_ttl=0.05)) as core:
            for _ in range(3):
                pages = [await from_address(core.ws_url, f"127.0.0.{2 + i % clients}")
                         for i in range(2)]
                for page in pages:
                    assert (await page.hello())["type"] == "welcome"
                for page in pages:
                    await page.close()
                await until(lambda: not core.registry.sessions, "the sessions to expire")
                assert core.registry.clients == {}

    run(main())


def test_a_restored_session_counts_for_the_first_client_to_resume_it(tmp_path: Path) -> None:
    store = str(tmp_path / "core.sqlite")

    async def main() -> None:
        async with running_core(config(store=store, max_sessions_per_client=1)) as core:
            page = await from_address(core.ws_url, "127.0.0.2")
            welcome: dict[str, Any] = await page.hello()
            await page.close()
        async with running_core(config(store=store, max_sessions_per_client=1)) as core:
            sid = welcome["sessionId"]
            assert core.registry.sessions[sid].client is None  # nobody's yet
            fresh = await from_address(core.ws_url, "127.0.0.2")
            assert (await fresh.hello())["type"] == "welcome"  # not counted against .2
            await fresh.close()
            back = await from_address(core.ws_url, "127.0.0.4")
            resumed = await back.hello(sessionId=sid, resumeToken=welcome["resumeToken"])
            assert resumed["resumed"] is True
            assert core.registry.sessions[sid].client == "127.0.0.4"
            again = await from_address(core.ws_url, "127.0.0.4")
            assert (await again.hello())["code"] == TOO_MANY_SESSIONS  # .4 holds one now
            await back.close()

    run(main())


def test_a_burst_of_messages_is_handled_one_per_step_of_the_loop() -> None:
    """A page's messages that arrive together are handled one per step of the event loop,
    other connections' work (and health) going between: not a whole read's worth in one
    step (a 4 KiB read holds ~200 short frames; 256 pages sending them took Core's loop
    for seconds)."""
    async def main() -> None:
        async with running_core(config()) as core:
            sock = await RawSocket.open(core.port)
            await sock.send_text(json.dumps({"type": "hello", "protocol": 1, "tools": []}))
            assert (await sock.next_text(WAIT))["type"] == "welcome"
            steps = 0

            def tick() -> None:
                nonlocal steps
                steps += 1
                if steps < 100_000:
                    asyncio.get_running_loop().call_soon(tick)

            asyncio.get_running_loop().call_soon(tick)
            await sock.write(frame(Opcode.TEXT, b'{"type":"nope"}') * 100)  # one read
            started = steps
            for _ in range(100):
                assert (await sock.next_text(WAIT))["code"] == "UNKNOWN_TYPE"
            assert steps - started >= 90, steps - started
            sock.abort()

    run(main())
