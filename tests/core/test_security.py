"""Security of Core (issue 7, item 5), against real servers on loopback.

- the admin token guards every route of the app but health, the origin check, static files
  and the bridge (the routes are read from the Starlette app, so a new one cannot be
  forgotten), and is compared with ``hmac.compare_digest``;
- a page cannot see or answer another session's requests;
- resuming with a known id and a wrong token fails and reveals nothing;
- a browser WebSocket from a foreign Origin is refused unless ``--allow-origin`` lists it;
- oversized and flooding clients are cut off without hurting a well-behaved page;
- error frames, logs and control-API answers never carry the admin token or resume tokens.

The demo's rendering of results (never as HTML) is tests/e2e/security.spec.js.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import websockets
from corekit import (
    WAIT,
    Core,
    Page,
    RawClient,
    config,
    echo_session,
    run,
    running_core,
    tool_meta,
    until,
)
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles

from pedelec_pyodide.core.server import PyodideFiles
from pedelec_pyodide.core.store import hash_token

REPO = Path(__file__).resolve().parent.parent.parent
HEALTH = "/pedelec/v1/health"
ORIGIN_CHECK = "/pedelec/v1/origin-check"
BRIDGE = "/pedelec/v1/bridge"


def wrong_same_length(token: str) -> str:
    return ("A" if token[0] != "A" else "B") + token[1:]


# --- the admin token ---------------------------------------------------------------------


def classify(route: Any) -> str:
    """``open`` (health, origin check), ``static``, ``bridge``, or ``guarded``."""
    if isinstance(route, Mount) and isinstance(route.app, (StaticFiles, PyodideFiles)):
        return "static"
    if isinstance(route, Route) and route.path == "/" and "index" in route.name:
        return "static"
    if isinstance(route, WebSocketRoute):
        return "bridge"
    if isinstance(route, Route) and route.path in (HEALTH, ORIGIN_CHECK):
        return "open"
    return "guarded"


def test_every_route_but_health_static_and_bridge_needs_the_admin_token() -> None:
    async def main() -> None:
        cfg = config(web_dir=REPO / "web", app_dir=REPO / "tests" / "e2e" / "app")
        async with running_core(cfg) as core:
            page = await Page(echo_session()).connect(core.ws_url)
            sid = page.session.session_id
            assert sid is not None
            kinds: dict[str, list[str]] = {}
            for route in core.app.routes:
                kinds.setdefault(classify(route), []).append(route.path)
            # the exceptions, explicitly
            assert kinds["open"] == [HEALTH, ORIGIN_CHECK]
            assert kinds["bridge"] == [BRIDGE]
            assert sorted(kinds["static"]) == ["", "/pedelec", "/pedelec/pyodide"]
            assert len(kinds["guarded"]) >= 5
            token = core.app.state.admin_token
            bad_headers = [{}, {"Authorization": "Bearer wrong"},
                           {"Authorization": f"Bearer {wrong_same_length(token)}"},
                           {"Authorization": f"Basic {token}"}, {"Authorization": token},
                           {"Authorization": f"Bearer {token}x"}]
            checked = 0
            for route in core.app.routes:
                if classify(route) != "guarded":
                    continue
                assert isinstance(route, Route), route
                path = route.path.replace("{session_id}", sid).replace(
                    "{tool_request_id}", "some-request")
                assert "{" not in path, f"a path parameter this test does not know: {path}"
                for method in sorted((route.methods or {"GET"}) - {"HEAD"}):
                    for headers in bad_headers:
                        response = await core.http.request(
                            method, path, json={"tool": "echo", "text": "x"},
                            headers={"Authorization": "", **headers})
                        assert response.status_code == 401, (method, path, response.text)
                        assert response.json()["error"]["code"] == "UNAUTHORIZED"
                        assert token not in response.text
                        checked += 1
            assert checked >= 5 * len(bad_headers)
            # the exceptions answer without a token
            response = await core.http.get(HEALTH, headers={"Authorization": ""})
            assert response.status_code == 200 and response.json()["status"] == "ok"
            for static in ("/pedelec/pedelec-pyodide.js", "/tools.html"):
                response = await core.http.get(static, headers={"Authorization": ""})
                assert response.status_code == 200, static
            # and the right token opens every guarded GET
            assert (await core.http.get("/pedelec/v1/sessions")).status_code == 200
            assert (await core.http.get(f"/pedelec/v1/sessions/{sid}")).status_code == 200
            await page.drop()

    run(main())


def test_the_admin_token_is_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: Any, b: Any) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)

    async def main() -> None:
        async with running_core() as core:
            token = core.app.state.admin_token
            wrong = wrong_same_length(token)
            assert len(wrong) == len(token) and wrong != token
            for path in ("/pedelec/v1/sessions", "/pedelec/v1/sessions/x/mcp"):
                calls.clear()
                response = await core.http.get(path, headers={"Authorization": f"Bearer {wrong}"})
                assert response.status_code == 401, (path, response.text)
                assert (wrong.encode(), token.encode()) in calls, path
            calls.clear()
            assert (await core.http.get("/pedelec/v1/sessions")).status_code == 200
            assert (token.encode(), token.encode()) in calls
            # the resume token too: a known session id with a wrong token of the right length
            owner = await RawClient.open(core.ws_url)
            welcome = await owner.hello()
            calls.clear()
            thief = await RawClient.open(core.ws_url)
            refused = await thief.hello(sessionId=welcome["sessionId"],
                                        resumeToken=wrong_same_length(welcome["resumeToken"]))
            assert refused["code"] == "RESUME_REFUSED"
            # (Core keeps only the token's hash: it compares hashes)
            expected = hash_token(welcome["resumeToken"]).encode()
            assert any(expected in pair for pair in calls)
            await owner.close()
            await thief.close()

    run(main())


# --- sessions are isolated ---------------------------------------------------------------


def test_a_page_cannot_see_or_answer_another_sessions_requests() -> None:
    async def main() -> None:
        async with running_core() as core:
            victim = await Page(echo_session()).connect(core.ws_url)
            sid = victim.session.session_id
            assert sid is not None
            thief = await RawClient.open(core.ws_url)
            await thief.hello([tool_meta("echo")])
            call = asyncio.create_task(core.tool_call(sid, "echo", {"secret": 1}))
            await victim.wait_frame("tool.request")
            request_id = victim.frames("tool.request")[0]["toolRequestId"]
            # the thief got nothing of it, and cannot answer it
            await thief.send({"type": "tool.result", "toolRequestId": request_id,
                              "result": {"secret": "forged"}, "handledBy": "named"})
            refused = await thief.recv()
            assert refused["type"] == "error" and refused["code"] == "UNKNOWN_TOOL_REQUEST"
            body = (await asyncio.wait_for(call, WAIT)).json()
            assert body == {"toolRequestId": request_id, "result": {"secret": 1},
                            "handledBy": "inline"}
            # nothing but the refusal ever reached the thief
            await thief.send({"type": "turn.cancel", "turnId": "probe"})
            probe = await thief.recv()
            assert probe["code"] == "UNKNOWN_TURN"
            await thief.close()
            await victim.drop()

    run(main())


def test_resuming_a_known_session_with_a_wrong_token_fails_and_reveals_nothing() -> None:
    async def main() -> None:
        async with running_core() as core:
            page = await Page(echo_session()).connect(core.ws_url)
            sid = page.session.session_id
            token = page.session.resume_token
            assert sid is not None and token is not None
            pending_call = asyncio.create_task(core.tool_call(sid, "echo", {"n": 1}))
            await page.wait_frame("tool.request")
            answers = []
            for given in ("wrong", wrong_same_length(token), token[:-1], token + "x", None):
                thief = await RawClient.open(core.ws_url)
                extra = {"sessionId": sid} | ({} if given is None else {"resumeToken": given})
                answers.append(await thief.hello([tool_meta("echo")], **extra))
                # nothing of the session reaches the refused connection
                await thief.send({"type": "turn.cancel", "turnId": "probe"})
                assert (await thief.recv())["code"] == "HELLO_REQUIRED"
                await thief.close()
            unknown = await RawClient.open(core.ws_url)
            answers.append(await unknown.hello(sessionId="no-such", resumeToken=token))
            await unknown.close()
            assert {a["code"] for a in answers} == {"RESUME_REFUSED"}
            assert len({a["message"] for a in answers}) == 1  # the same for every cause
            for answer in answers:
                assert set(answer) == {"type", "code", "message"}
                assert sid not in answer["message"] and token not in answer["message"]
            # the owner was not superseded and its request resolves normally
            body = (await asyncio.wait_for(pending_call, WAIT)).json()
            assert body["result"] == {"n": 1}
            assert core.registry.get(sid).connection is not None
            await page.drop()

    run(main())


# --- Origin -----------------------------------------------------------------------------


def test_a_foreign_origin_is_refused_and_allow_origin_admits_it() -> None:
    async def main() -> None:
        evil = "http://evil.example"
        async with running_core() as core:
            with pytest.raises(websockets.InvalidStatus) as refused:
                await websockets.connect(core.ws_url, origin=evil, open_timeout=WAIT)
            assert refused.value.response.status_code == 403
            own = await RawClient.open(core.ws_url, origin=f"http://127.0.0.1:{core.port}")
            assert (await own.hello())["type"] == "welcome"
            await own.close()
            assert not core.registry.sessions or all(
                s.client_json == "{}" for s in core.registry.sessions.values())
        async with running_core(config(allow_origins=(evil,))) as core:
            admitted = await RawClient.open(core.ws_url, origin=evil)
            assert (await admitted.hello())["type"] == "welcome"
            await admitted.close()
            with pytest.raises(websockets.InvalidStatus):
                await websockets.connect(core.ws_url, origin="http://other.example",
                                         open_timeout=WAIT)

    run(main())


# --- abusive clients ----------------------------------------------------------------------


async def latencies(core: Core, sid: str, count: int) -> list[float]:
    times = []
    for i in range(count):
        started = time.perf_counter()
        response = await core.tool_call(sid, "echo", {"i": i})
        assert response.json()["result"] == {"i": i}
        times.append(time.perf_counter() - started)
    return times


def test_oversized_and_flooding_clients_are_cut_off_without_hurting_others() -> None:
    async def main() -> None:
        async with running_core(config(max_frame_bytes=65_536)) as core:
            good = await Page(echo_session()).connect(core.ws_url)
            sid = good.session.session_id
            assert sid is not None
            baseline = statistics.median(await latencies(core, sid, 30))

            # a frame far over the limit: closed unread (1009)
            big = await RawClient.open(core.ws_url)
            await big.hello()
            await big.send("x" * 1_000_000)
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await big.recv()
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009

            # a flood, from a process of its own (its sending is not this loop's work):
            # refused, then cut off (1008); meanwhile the good page keeps its pace
            flooder = await asyncio.create_subprocess_exec(
                sys.executable, str(Path(__file__).with_name("flooder.py")), core.ws_url,
                stdout=asyncio.subprocess.PIPE)
            try:
                assert flooder.stdout is not None
                ready = await asyncio.wait_for(flooder.stdout.readline(), WAIT)
                assert ready == b"ready\n", ready
                during = await latencies(core, sid, 30)
                report = await asyncio.wait_for(flooder.stdout.readline(), WAIT)
                await asyncio.wait_for(flooder.wait(), WAIT)
            finally:
                if flooder.returncode is None:
                    flooder.kill()
                    await flooder.wait()
            flood = json.loads(report)
            assert flood["code"] == 1008, flood
            assert flood["sent"] > 400, flood
            # "normal latency": the median stays within a small multiple of the baseline
            assert statistics.median(during) < max(5 * baseline, baseline + 0.02), (
                baseline, statistics.median(during))
            after = await latencies(core, sid, 10)
            assert statistics.median(after) < max(5 * baseline, baseline + 0.02)
            live = core.registry.get(sid)
            assert live.connection is not None and live.state == "idle"
            await good.drop()

    run(main())


# --- tokens never leak --------------------------------------------------------------------


class Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


def test_errors_logs_and_the_control_api_never_carry_tokens() -> None:
    capture = Capture()
    logger = logging.getLogger("pedelec.core")
    saved_level = logger.level
    logger.addHandler(capture)
    logger.setLevel(logging.DEBUG)
    texts: list[str] = []

    async def main() -> None:
        async with running_core(config(admin_token="s3cret-admin-token-" + "z" * 24)) as core:
            pages = [await Page(echo_session()).connect(core.ws_url) for _ in range(3)]
            sids = [p.session.session_id for p in pages]
            tokens = [p.session.resume_token for p in pages]
            assert all(sids) and all(tokens)
            # a bit of everything: calls, a turn, refusals, a resume, bad requests
            texts.append((await core.tool_call(sids[0], "echo", {"a": 1})).text)
            texts.append((await core.turn(sids[1], "hello")).text)
            texts.append((await core.http.get("/pedelec/v1/sessions")).text)
            for sid in sids:
                texts.append((await core.http.get(f"/pedelec/v1/sessions/{sid}")).text)
            texts.append((await core.http.get(
                "/pedelec/v1/sessions", headers={"Authorization": "Bearer nope"})).text)
            texts.append((await core.http.post(
                f"/pedelec/v1/sessions/{sids[0]}/tool-calls", content=b"{")).text)
            texts.append((await core.http.get("/pedelec/v1/sessions/none")).text)
            texts.append((await core.http.get(HEALTH)).text)
            thief = await RawClient.open(core.ws_url)
            texts.append(str(await thief.hello(sessionId=sids[0], resumeToken=tokens[1])))
            texts.append(str(await thief.hello(sessionId=sids[0], resumeToken="x")))
            await thief.send({"type": "tool.result", "toolRequestId": "x", "result": tokens[0],
                              "handledBy": "named"})
            texts.append(str(await thief.recv()))
            await thief.close()
            await pages[2].drop()
            await pages[2].connect(core.ws_url)  # a resume
            await until(lambda: core.registry.get(sids[2]).connection is not None, "resume")
            for page in pages:
                texts.extend(str(f) for f in page.frames_in if f["type"] != "welcome")
                await page.drop()
            secrets = [core.app.state.admin_token, *tokens]
            for text in texts:
                for secret in secrets:
                    assert secret not in text, text[:200]
            assert any("session.resumed" in line for line in capture.lines)
            assert any("session.resume_refused" in line for line in capture.lines)
            for line in capture.lines:
                for secret in secrets:
                    assert secret not in line, line

    try:
        run(main())
    finally:
        logger.removeHandler(capture)
        logger.setLevel(saved_level)
    assert len(capture.lines) > 10


def test_a_log_field_quotes_a_huge_or_broken_value_briefly(
        caplog: pytest.LogCaptureFixture) -> None:
    """Found: a field was logged whole, checked a character at a time on the event loop:
    an AG-UI agent's 120 KB tool names, each refused, wrote 61.5 MB of log and held the
    loop seconds (a 4 MB name: 0.2 s). A lone surrogate is written as its escape: no log
    handler can encode it."""
    from pedelec_pyodide.core.log import log_event
    from pedelec_pyodide.text import MAX_EXCERPT

    with caplog.at_level("INFO", logger="pedelec.core"):
        log_event("agent.call_refused", tool="x" * 4_000_000, code="TOOL_HANDLER_NOT_FOUND")
        log_event("agent.call_refused", tool="bad\ud800name", turn="a-b.c:d/e_f")
    huge, broken = (record.getMessage() for record in caplog.records)
    assert len(huge) < MAX_EXCERPT + 100, huge[:300]
    assert f"({4_000_000 - MAX_EXCERPT} more characters)" in huge
    assert huge.endswith("code=TOOL_HANDLER_NOT_FOUND")
    assert broken == 'event=agent.call_refused tool="bad\\\\ud800name" turn=a-b.c:d/e_f'
    broken.encode("utf-8")  # (raises on a lone surrogate)
