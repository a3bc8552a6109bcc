"""What only the Redis store does, against a real redis-server (Debian's) of each test's
own: surviving a restart of Redis, waiting out Redis being away, clusters side by side,
and a real Core on it (the store contract itself: test_store_contract.py)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from core_process import STORE_UNREACHABLE, until_logged
from corekit import (
    TOKEN,
    WAIT,
    RawClient,
    config,
    core_process,
    echo_page,
    run,
    running_core,
    tool_meta,
    until,
)
from storekit import RedisServer, free_port

from pedelec_pyodide.core.store import (
    STORE_UNAVAILABLE,
    IdempotencyRecord,
    RequestRecord,
    SessionRecord,
    Store,
    StoreError,
    TurnRecord,
    hash_token,
    open_store,
    writer,
)


def request(rid: str, sid: str = "s1") -> RequestRecord:
    return RequestRecord(rid, sid, None, 0, 0, "echo", {"n": rid}, 1e12)


async def stored_ids(url: str) -> list[str]:
    store = open_store(url)
    try:
        return [r.id for r in (await store.load()).requests]
    finally:
        await store.close()


def test_what_redis_acknowledged_survives_its_sigkill(redis_server: RedisServer) -> None:
    """Append-only file, ``appendfsync everysec``: Redis writes the file before it answers,
    so a killed redis-server (not the machine) loses no write a flush returned for."""

    async def main() -> None:
        store = open_store(redis_server.url)
        store.save_session(SessionRecord("s1", hash_token("t"), "[]", "[]", 1.0))
        for n in range(300):
            store.save_request(request(f"r{n:03}"))
            if n % 50 == 49:
                await store.flush()
        await store.flush()
        redis_server.kill()
        redis_server.start()
        await store.close()
        assert await stored_ids(redis_server.url) == [f"r{n:03}" for n in range(300)]

    run(main())


def test_while_redis_is_away_writes_wait_and_are_stored_when_it_is_back(
        redis_server: RedisServer) -> None:
    """Redis killed mid-run: a flush fails at its deadline, naming the store out of reach;
    the store says it is unavailable; the writes are kept, and stored in order once Redis
    is back, with nothing lost and nothing left failed."""

    async def main() -> None:
        store = open_store(redis_server.url, timeout=1.0)
        store.save_session(SessionRecord("s1", hash_token("t"), "[]", "[]", 1.0))
        store.save_request(request("before"))
        await store.flush("s1", "before")
        redis_server.kill()
        store.save_request(request("during-1"))
        started = time.monotonic()
        with pytest.raises(StoreError, match="cannot reach redis://127"):
            await store.flush("during-1", timeout=2.0)
        assert 1.5 < time.monotonic() - started < 6
        assert store.unavailable and "cannot reach" in (store.problem or "")
        store.save_request(request("during-2"))
        redis_server.start()
        await store.flush("during-1", "during-2", timeout=WAIT)
        assert not store.unavailable and store.problem is None
        await store.close()
        assert await stored_ids(redis_server.url) == ["before", "during-1", "during-2"]

    run(main())


def test_an_idle_store_notices_redis_is_away_and_back(
        redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """No write to fail: the writer checks on Redis when idle, so health can tell."""
    monkeypatch.setattr(writer, "PROBE_SECONDS", 0.2)

    async def main() -> None:
        store = open_store(redis_server.url, timeout=1.0)
        store.save_session(SessionRecord("s1", hash_token("t"), "[]", "[]", 1.0))
        await store.flush()
        redis_server.kill()
        await until(lambda: store.unavailable, "the store to notice")
        redis_server.start()
        await until(lambda: not store.unavailable, "the store to see Redis back")
        assert store.problem is None
        await store.close()

    run(main())


def test_clusters_on_one_redis_database_do_not_see_each_other(
        redis_server: RedisServer) -> None:
    async def main() -> None:
        stores: dict[str, Store] = {}
        for cluster in ("eu", "us"):
            store = open_store(f"{redis_server.url}?cluster={cluster}")
            store.save_session(SessionRecord(f"s-{cluster}", hash_token("t"), "[]", "[]", 1.0))
            await store.close()
            stores[cluster] = open_store(f"{redis_server.url}?cluster={cluster}")
        for cluster, store in stores.items():
            assert [s.id for s in (await store.load()).sessions] == [f"s-{cluster}"]
            await store.close()
        with redis_server.client() as client:
            assert all(key.startswith((b"pedelec:eu:", b"pedelec:us:"))
                       for key in client.keys("*"))

    run(main())


def test_core_on_redis_says_503_while_redis_is_away_and_resumes_after(
        redis_server: RedisServer) -> None:
    """A real Core with --store redis://: calls go through; Redis killed: health says
    degraded with the reason and a control-API call is refused 503 STORE_UNAVAILABLE,
    nothing sent to the page; Redis back: calls go through again; and a Core started
    afterwards on the same Redis resumes the page's session with its token."""

    async def main() -> None:
        cfg = config(store=redis_server.url, store_timeout=1.0)
        async with running_core(cfg) as core:
            page = await echo_page().connect(core.ws_url)
            sid, token = page.session.session_id, page.session.resume_token
            assert sid is not None and token is not None
            assert (await core.tool_call(sid, "echo", {"n": 1})).json()["result"] == {"n": 1}
            redis_server.kill()
            for _ in range(int(WAIT / 0.1)):  # the next write, or the idle check, tells
                health = (await core.http.get("/pedelec/v1/health")).json()
                if health["status"] == "degraded":
                    break
                await asyncio.sleep(0.1)
            assert health["status"] == "degraded" and "cannot reach" in health["reason"]
            refused = await core.tool_call(sid, "echo", {"n": 2})
            assert refused.status_code == 503, refused.text
            assert refused.json()["error"]["code"] == STORE_UNAVAILABLE
            assert refused.headers["retry-after"] == "1"
            turn = await core.turn(sid, "hello")
            assert turn.json()["error"]["code"] == STORE_UNAVAILABLE
            redis_server.start()
            await until(lambda: not core.registry.store.unavailable, "Redis back")
            assert (await core.tool_call(sid, "echo", {"n": 3})).json()["result"] == {"n": 3}
            assert [f["args"] for f in page.frames("tool.request")] == [{"n": 1}, {"n": 3}]
            await page.drop()
        async with running_core(config(store=redis_server.url)) as core:
            client = await RawClient.open(core.ws_url)
            welcome = await client.hello([tool_meta("echo")], sessionId=sid,
                                         resumeToken=token)
            assert (welcome["type"], welcome["resumed"]) == ("welcome", True)
            await client.close()

    run(main())


def test_serve_with_redis_out_of_reach_exits_with_a_clear_error(tmp_path: Path) -> None:
    """Core starts only with what it stored: no Redis (within --store-timeout) is an exit
    with the reason, and the password in the URL is never printed."""
    url = f"redis://:hunter2@127.0.0.1:{free_port()}/0"
    failed = subprocess.run(
        [sys.executable, "-m", "pedelec_pyodide.core.cli", "serve", "--port", "0",
         "--no-provision", "--store", url, "--store-timeout", "0.5"],
        capture_output=True, text=True, timeout=30)
    assert failed.returncode == 2, failed.stderr
    assert "cannot reach redis://:***@127.0.0.1" in failed.stderr
    assert "hunter2" not in failed.stderr + failed.stdout
    assert failed.stdout == ""  # nothing announced


def test_sigterm_stops_core_within_5_seconds_while_redis_is_away(
        redis_server: RedisServer) -> None:
    """A real Core process on Redis, a control-API call waiting on a page that never
    answers, Redis killed (Core retrying its writes): SIGTERM still stops it in time."""
    port = free_port()

    async def main() -> float:
        async with core_process(redis_server.url, port) as process:
            page = await RawClient.open(f"ws://127.0.0.1:{port}/pedelec/v1/bridge")
            welcome = await page.hello([tool_meta("c")])
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=WAIT,
                                         headers={"Authorization": f"Bearer {TOKEN}"}) as http:
                path = f"/pedelec/v1/sessions/{welcome['sessionId']}/tool-calls"
                waiting = [asyncio.create_task(http.post(path, json={"tool": "c", "args": {}}))]
                assert (await page.recv())["type"] == "tool.request"
                redis_server.kill()
                # a request to store while Redis is away: its write is retried
                waiting.append(asyncio.create_task(http.post(path, json={"tool": "c"})))
                await until_logged(process, STORE_UNREACHABLE)
                started = time.monotonic()
                process.send_signal(signal.SIGTERM)
                await asyncio.to_thread(process.wait, 3 * WAIT)
                elapsed = time.monotonic() - started
                await asyncio.gather(*waiting, return_exceptions=True)
            await page.ws.close()
            return elapsed

    elapsed = run(main())
    print(f"SIGTERM to exit, Redis away: {elapsed:.2f} s")
    assert elapsed < 5, elapsed


def test_a_deleted_session_leaves_no_key_behind(redis_server: RedisServer) -> None:
    async def main() -> None:
        store = open_store(redis_server.url)
        for sid in ("gone", "kept"):
            store.save_session(SessionRecord(sid, hash_token("t"), "[]", "[]", 1.0))
            store.save_request(request(f"r-{sid}", sid))
            store.save_turn(TurnRecord(f"t-{sid}", sid, "hi", "running", created_at=1.0))
            store.save_turn(TurnRecord(f"u-{sid}", sid, "hi", "completed", created_at=2.0))
            store.mark_end_delivered(sid, f"u-{sid}")
            store.save_key(IdempotencyRecord(hash_token(sid), sid, "turn", "f" * 64,
                                             f"t-{sid}", 1.0))
        store.delete_session("gone")
        await store.close()
        with redis_server.client() as client:
            keys = sorted(key.decode() for key in client.keys("*"))
            assert keys and not [key for key in keys if "gone" in key], keys
            assert client.zrange("pedelec:main:sessions", 0, -1) == [b"kept"]

    run(main())


def test_an_idle_store_outlives_redis_refusing_its_check(
        redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """Redis answers the idle check with a refusal (here an ACL taking PING away; Redis
    busy with a script says BUSY alike): logged, and the writer stores what comes next."""
    monkeypatch.setattr(writer, "PROBE_SECONDS", 0.2)
    caplog.set_level(logging.INFO, logger="pedelec.core")

    async def main() -> None:
        store = open_store(redis_server.url, timeout=1.0)
        store.save_session(SessionRecord("s1", hash_token("t"), "[]", "[]", 1.0))
        await store.flush()
        with redis_server.client() as client:
            client.execute_command("ACL", "SETUSER", "default", "-ping")
            try:
                await until(lambda: any("event=store.probe_failed" in r.getMessage()
                                        for r in caplog.records), "a refused check")
            finally:
                client.execute_command("ACL", "SETUSER", "default", "+ping")
        store.save_session(SessionRecord("s2", hash_token("t"), "[]", "[]", 2.0))
        await store.flush("s2")
        assert [r.id for r in (await store.load()).sessions] == ["s1", "s2"]
        await store.close()

    run(main())


def test_a_node_starts_past_a_list_of_sessions_of_the_wrong_type(
        redis_server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    """The cluster's list of sessions holds another Redis type: reported as a damaged
    row is (``store.row_skipped``), and the node starts and answers."""
    caplog.set_level(logging.INFO, logger="pedelec.core")
    with redis_server.client() as client:
        client.set("pedelec:main:sessions", "garbage")

    async def main() -> None:
        async with running_core(config(store=redis_server.url)) as a:
            response = await a.http.get("/pedelec/v1/health")
            assert response.status_code == 200, response.text
        assert any("event=store.row_skipped table=sessions rowid=pedelec:main:sessions "
                   in r.getMessage() for r in caplog.records)

    run(main())


def test_a_session_row_of_an_older_core_is_read_and_rewritten_with_its_tools_apart(
        redis_server: RedisServer) -> None:
    """A row written before the tools had a key of their own (its tools inside) loads as
    it was, and is rewritten so: a turn's end (the row alone) then keeps its tools."""
    tools = json.dumps([tool_meta("echo")])
    row = json.dumps(["s1", hash_token("t"), tools, "[]", 1.0])
    with redis_server.client() as client:
        client.set("pedelec:main:session:s1", row)
        client.zadd("pedelec:main:sessions", {"s1": 1.0})

    async def main() -> None:
        store = open_store(redis_server.url)
        try:
            (loaded,) = (await store.load()).sessions
            assert loaded.tools == tools
            await store.flush()  # the rewrite
            with redis_server.client() as client:
                assert client.get("pedelec:main:tools:s1") == tools.encode()
                assert json.loads(client.get("pedelec:main:session:s1"))[2] is None
            loaded.history = '[{"turn":1}]'
            store.save_history(loaded)
            await store.flush()
            again = await store.load_session_record("s1")
            assert again is not None and (again.tools, again.history) == (
                tools, '[{"turn":1}]')
        finally:
            await store.close()

    run(main())


class HistoryAgent:
    """Keeps each turn's text in the agent's history (so a session's history is large)."""

    async def run(self, turn: Any) -> str:
        turn.history.append({"turn": turn.turn_id, "text": turn.text})
        return "noted"


def test_a_tools_update_writes_the_tools_alone_and_only_when_they_changed(
        redis_server: RedisServer) -> None:
    """Redis's input, measured: a page whose session holds 300 KB of history sends
    tools.update frames of 200 KB of tools. One that changes the tools costs Redis about
    the tools (not the row with its history, as it did); one that repeats them, nothing.
    Each tools.update is followed by a changed one, waited for: it shows the first was
    processed."""

    def received_by_redis() -> int:
        with redis_server.client() as client:
            return int(client.info("stats")["total_net_input_bytes"])

    def tools(n: int) -> list[dict[str, Any]]:
        return [dict(tool_meta("echo"), description=f"{n}:" + "d" * 200_000)]

    async def main() -> None:
        async with running_core(config(store=redis_server.url,
                                       agent_factory=HistoryAgent)) as a:
            page = await RawClient.open(a.ws_url)
            sid = (await page.hello(tools(0)))["sessionId"]
            session = a.registry.sessions[sid]
            assert (await a.turn(sid, "h" * 300_000)).json()["status"] == "completed"
            assert len(session.record.history) > 300_000

            async def updated(*versions: int) -> int:
                await a.registry.store.flush()
                before = received_by_redis()
                for n in versions:
                    await page.send({"type": "tools.update", "tools": tools(n)})
                await until(lambda: f'"{versions[-1]}:' in session.record.tools,
                            "the last tools.update")
                await a.registry.store.flush()
                return received_by_redis() - before

            one_change = await updated(1)
            assert 200_000 < one_change < 260_000, one_change  # the tools, not the history
            repeats = await updated(1, 1, 1, 1, 1, 2)  # five repeats, then a change
            assert repeats < one_change + 60_000, (repeats, one_change)
            await page.close()

    run(main())


#: the ACL rule docs/how-to/deploy.md gives Core's Redis user (cluster ``main``)
CORE_ACL = ("on >core-password-of-the-test resetkeys ~pedelec:main:* resetchannels "
            "&pedelec:main:* -@all +get +set +mget +del +exists +pexpire +zadd +zrem "
            "+zrange +hset +hdel +hgetall +hvals +sadd +srem +smembers +publish "
            "+subscribe +unsubscribe +ping +multi +exec +discard +evalsha +eval "
            "+script|load +select")


def test_core_runs_as_a_redis_user_with_only_its_keys_channels_and_commands(
        redis_server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    """Two nodes as the ACL user deploy.md describes (its keys, its channels, the
    commands Core sends): a page on A, a call and a turn through B, a tools.update, the
    page resuming on B (a take-over); nothing Redis refuses (NOPERM) on the way. The
    default user is switched off, as deploy.md says to."""
    caplog.set_level(logging.INFO, logger="pedelec.core")
    with redis_server.client() as client:
        client.execute_command("ACL", "SETUSER", "pedelec", *CORE_ACL.split())
        client.execute_command("ACL", "SETUSER", "admin", "on", ">admin-pw", "~*", "&*",
                               "+@all")
        client.execute_command("ACL", "SETUSER", "default", "off")
    url = f"redis://pedelec:core-password-of-the-test@127.0.0.1:{redis_server.port}/0"

    async def main() -> None:
        async with running_core(config(store=url)) as a, running_core(config(store=url)) as b:
            page = await RawClient.open(a.ws_url)
            welcome = await page.hello([tool_meta("echo")])
            sid, token = welcome["sessionId"], welcome["resumeToken"]
            call = asyncio.ensure_future(b.tool_call(sid, "echo", {"n": 1}))
            request = await asyncio.wait_for(page.recv(), WAIT)
            assert request["type"] == "tool.request", request
            await page.send({"type": "tool.result", "toolRequestId": request["toolRequestId"],
                             "result": {"ok": True, "data": 1}, "handledBy": "named"})
            assert (await call).status_code == 200
            assert (await b.turn(sid, "hi")).json()["status"] == "completed"
            await page.send({"type": "tools.update", "tools": [tool_meta("other")]})
            await until(lambda: "other" in a.registry.sessions[sid].record.tools)
            await a.registry.store.flush()
            second = await RawClient.open(b.ws_url)
            assert (await second.hello([tool_meta("echo")], sessionId=sid,
                                       resumeToken=token)).get("resumed")
            await second.close()
            await page.close()
        refused = [r.getMessage() for r in caplog.records if "NOPERM" in r.getMessage()
                   or r.levelno >= logging.WARNING]
        assert refused == [], refused

    run(main())


def tls_files(workdir: Path) -> Path:
    """A CA and a certificate for 127.0.0.1 it signed (openssl, in ``workdir``); the CA's."""
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=workdir, check=True, capture_output=True,
                       timeout=60)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
            "ca.pem", "-days", "1", "-subj", "/CN=pedelec test CA")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out",
            "server.csr", "-subj", "/CN=127.0.0.1")
    (workdir / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "server.pem", "-days", "1", "-extfile", "ext.cnf")
    return workdir / "ca.pem"


def test_core_on_rediss_checks_the_servers_certificate(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``rediss://``: Core reaches a TLS redis-server whose certificate a CA in
    ``SSL_CERT_FILE`` signed, and refuses to start on it without that CA (exit 2 from the
    CLI: the store cannot be reached)."""
    ca = tls_files(tmp_path)
    port = free_port()
    server = subprocess.Popen(
        ["redis-server", "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", "server.pem", "--tls-key-file", "server.key",
         "--tls-ca-cert-file", "ca.pem", "--tls-auth-clients", "no", "--save", "",
         "--appendonly", "no", "--dir", str(tmp_path)],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"rediss://127.0.0.1:{port}/0"
    try:
        deadline = time.monotonic() + WAIT
        while True:  # until it listens: a refusal must be the certificate's
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and server.poll() is None
                time.sleep(0.02)
        env = {k: v for k, v in os.environ.items() if k != "SSL_CERT_FILE"}
        refused = subprocess.run(
            [sys.executable, "-m", "pedelec_pyodide.core.cli", "serve", "--store", url,
             "--store-timeout", "2", "--no-provision", "--port", "0"],
            capture_output=True, text=True, timeout=60, env=env)
        assert refused.returncode == 2, refused.stderr
        assert "certificate" in refused.stderr.lower(), refused.stderr
        monkeypatch.setenv("SSL_CERT_FILE", str(ca))

        async def main() -> None:
            async with running_core(config(store=url)) as a:
                page = await RawClient.open(a.ws_url)
                sid = (await page.hello([tool_meta("echo")]))["sessionId"]
                await a.registry.store.flush()
                assert await a.registry.store.holder(sid) == a.registry.node
                await page.close()

        run(main())
    finally:
        server.terminate()
        server.wait(WAIT)


def test_tools_writes_a_later_one_replaces_cost_redis_nothing(
        redis_server: RedisServer) -> None:
    """50 tools writes of one session queued at once (a store falling behind a page's
    tools.update flood) are one batch: Redis receives the last one alone, and stores it."""

    def received_by_redis() -> int:
        with redis_server.client() as client:
            return int(client.info("stats")["total_net_input_bytes"])

    async def main() -> None:
        store = open_store(redis_server.url)
        try:
            record = SessionRecord("s1", hash_token("t"), "[]", "[]", 1.0)
            store.save_session(record)
            await store.flush()
            before = received_by_redis()
            for n in range(50):
                record.tools = json.dumps([dict(tool_meta("echo"),
                                                description=f"{n}:" + "d" * 100_000)])
                store.save_tools(record)
            await store.flush()
            assert received_by_redis() - before < 2 * 100_000
            stored = await store.load_session_record("s1")
            assert stored is not None and '"49:' in stored.tools
        finally:
            await store.close()

    run(main())
