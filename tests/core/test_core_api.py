"""Core's HTTP side: health, the control API, auth, static files, Origin checks."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets
from corekit import TOKEN, Page, RawClient, config, run, running_core, tool_meta, until

from pedelec_pyodide import Session, define_tool


def adder() -> Session:
    tool = define_tool(
        name="add", description="adds one",
        args_schema={"type": "object", "properties": {"a": {"type": "integer"}},
                     "required": ["a"]},
        handler=lambda args: {"value": args["a"] + 1},
    )
    return Session([tool])


def test_health_needs_no_token_and_control_api_does() -> None:
    async def main() -> None:
        async with running_core() as core:
            async with httpx.AsyncClient(base_url=str(core.http.base_url)) as anonymous:
                health = await anonymous.get("/pedelec/v1/health")
                assert health.status_code == 200
                assert health.json()["status"] == "ok"
                for headers in ({}, {"Authorization": "Bearer wrong"},
                                {"Authorization": f"Basic {TOKEN}"}):
                    response = await anonymous.get("/pedelec/v1/sessions", headers=headers)
                    assert response.status_code == 401
                    assert response.json()["error"]["code"] == "UNAUTHORIZED"
                    assert TOKEN not in response.text
                response = await anonymous.post("/pedelec/v1/sessions/x/tool-calls", json={})
                assert response.status_code == 401
            assert (await core.http.get("/pedelec/v1/sessions")).json() == {"sessions": []}

    run(main())


def test_tool_call_through_the_control_api() -> None:
    async def main() -> None:
        async with running_core() as core:
            page = await Page(adder()).connect(core.ws_url)
            sid = page.session.session_id
            assert sid is not None
            response = await core.tool_call(sid, "add", {"a": 41})
            assert response.status_code == 200
            body = response.json()
            assert body["result"] == {"value": 42}
            assert body["handledBy"] == "inline"
            assert [f["toolRequestId"] for f in page.frames("tool.request")] == [
                body["toolRequestId"]]
            # error results travel as results: bad args, then an unknown tool
            bad = (await core.tool_call(sid, "add", {"a": "x"})).json()
            assert bad["result"]["error"]["code"] == "INVALID_ARGS"
            missing = (await core.tool_call(sid, "nope")).json()
            assert missing["result"]["error"]["code"] == "TOOL_HANDLER_NOT_FOUND"
            assert missing["handledBy"] == "none"

            listed = (await core.http.get("/pedelec/v1/sessions")).json()["sessions"]
            assert [s["sessionId"] for s in listed] == [sid]
            info = await core.session_info(sid)
            assert info["state"] == "idle" and info["connected"] is True
            assert info["tools"] == [t.metadata() for t in page.session.tools.values()]

    run(main())


def test_control_api_errors_are_clear() -> None:
    async def main() -> None:
        async with running_core() as core:
            page = await Page(adder()).connect(core.ws_url)
            sid = page.session.session_id
            http = core.http
            assert (await http.get("/pedelec/v1/sessions/unknown")).status_code == 404
            missing = await core.tool_call("unknown", "add")
            assert missing.status_code == 404
            assert missing.json()["error"]["code"] == "SESSION_NOT_FOUND"
            assert (await core.turn("unknown", "hi")).status_code == 404
            url = f"/pedelec/v1/sessions/{sid}/tool-calls"
            cases = [
                (b"{not json", "JSON"),
                (b"[1, 2]", "JSON object"),
                (json.dumps({"args": {}}).encode(), "'tool'"),
                (json.dumps({"tool": "bad name!"}).encode(), "'tool'"),
                (json.dumps({"tool": "add", "timeoutMs": -5}).encode(), "timeoutMs"),
                (json.dumps({"tool": "add", "timeoutMs": True}).encode(), "timeoutMs"),
            ]
            for body, words in cases:
                response = await http.post(url, content=body)
                assert response.status_code == 400, body
                error = response.json()["error"]
                assert error["code"] == "BAD_REQUEST" and words in error["message"]
            response = await http.post(f"/pedelec/v1/sessions/{sid}/turns", json={"text": 5})
            assert response.status_code == 400
            assert page.frames("tool.request") == []

    run(main())


def test_tool_calls_take_the_lane_and_answer_as_the_route_does() -> None:
    """``POST .../tool-calls`` goes straight to its handler (http/tool_call_lane.py): the
    same answers, headers and all, as through Starlette's router (reached here under a
    root path, which the lane leaves to the router); what is not exactly that route (a
    trailing slash, another method) goes the router's way."""
    async def main() -> None:
        async with running_core() as core:
            page = await Page(adder()).connect(core.ws_url)
            sid = page.session.session_id
            routed = httpx.AsyncClient(
                transport=httpx.ASGITransport(app=core.app, root_path="/r"),
                base_url="http://127.0.0.1/r", timeout=30,
                headers={"Authorization": f"Bearer {TOKEN}"})
            url = f"/pedelec/v1/sessions/{sid}/tool-calls"
            cases: list[tuple[str, dict[str, str], bytes]] = [
                (url, {}, json.dumps({"tool": "add", "args": {"a": 1}}).encode()),
                (url, {}, json.dumps({"tool": "add", "args": {"a": "x"}}).encode()),
                (url, {"Authorization": "Bearer wrong"}, b"{}"),
                (url, {}, b"{not json"),
                (url, {}, json.dumps({"tool": "bad name!"}).encode()),
                (url, {"Idempotency-Key": ""}, json.dumps({"tool": "add"}).encode()),
                ("/pedelec/v1/sessions/unknown/tool-calls", {}, b"{}"),
            ]
            try:
                for path, headers, body in cases:
                    lane = await core.http.post(path, content=body, headers=headers)
                    router = await routed.post(path, content=body, headers=headers)
                    answers = [lane.json(), router.json()]
                    for answer in answers:
                        answer.pop("toolRequestId", None)
                    assert lane.status_code == router.status_code, (path, headers, body)
                    assert answers[0] == answers[1], (path, headers, body)
                    for name in ("content-type", "www-authenticate", "retry-after"):
                        assert lane.headers.get(name) == router.headers.get(name), name
                assert (await core.http.get(url)).status_code == 405
                slashed = await core.http.post(url + "/", json={"tool": "add"})
                assert slashed.status_code == (await routed.post(
                    url + "/", json={"tool": "add"})).status_code
                assert slashed.status_code != 200
            finally:
                await routed.aclose()
            assert len(page.frames("tool.request")) == 4  # two good calls each way

    run(main())


def test_static_files_and_mime_types(tmp_path: Path) -> None:
    app = tmp_path / "app"
    app.mkdir()
    (app / "index.html").write_text("<h1>my app</h1>")
    web = tmp_path / "web"
    web.mkdir()
    (web / "pedelec-pyodide.js").write_text("export {};")
    pyodide = tmp_path / "pyodide"
    pyodide.mkdir()
    files = {
        "pyodide.mjs": "text/javascript", "pyodide.asm.js": "text/javascript",
        "pyodide.asm.wasm": "application/wasm", "pyodide-lock.json": "application/json",
        "micropip-0.11.1-py3-none-any.whl": "application/zip",
    }
    for name in files:
        (pyodide / name).write_bytes(b"{}")

    async def main() -> None:
        cfg = config(app_dir=app, web_dir=web, pyodide_dir=pyodide)
        async with running_core(cfg) as core:
            index = await core.http.get("/")
            assert index.status_code == 200 and "my app" in index.text
            bridge_js = await core.http.get("/pedelec/pedelec-pyodide.js")
            assert bridge_js.headers["content-type"].startswith("text/javascript")
            for name, mime in files.items():
                response = await core.http.get(f"/pedelec/pyodide/{name}")
                assert response.status_code == 200, name
                assert response.headers["content-type"].split(";")[0] == mime, name
            health = (await core.http.get("/pedelec/v1/health")).json()
            assert health["pyodide"] == "ready"

    run(main())


def test_health_is_ready_only_once_pages_can_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While the runtime is provisioned, health answers 200 with ready false and the
    runtime is a 503; ready turns true exactly when the runtime is served."""
    import threading

    from pedelec_pyodide.build import provision

    runtime = tmp_path / "runtime"
    runtime.mkdir()
    (runtime / "pyodide.mjs").write_text("export {};")
    release = threading.Event()

    def slow_provision(out_dir: Path, **kwargs: object) -> object:
        if not release.wait(30):
            raise provision.ProvisionError("test: never released")
        return provision.ProvisionResult(out_dir=out_dir, pyodide_dir=runtime,
                                         lock_file=runtime / "pyodide-lock.json", wheels={},
                                         own_wheel=runtime, packages=())

    monkeypatch.setattr(provision, "provision", slow_provision)
    monkeypatch.setenv("PEDELEC_CACHE_DIR", str(tmp_path / "cache"))

    async def main() -> None:
        async with running_core(config(provision=True)) as core:
            try:
                await check(core)
            finally:
                release.set()  # the provisioning thread never outlives the test

    async def check(core: Any) -> None:
        health = await core.http.get("/pedelec/v1/health")
        assert health.status_code == 200
        assert {key: health.json()[key] for key in ("status", "pyodide", "ready")} == {
            "status": "ok", "pyodide": "provisioning", "ready": False}
        assert (await core.http.get("/pedelec/pyodide/pyodide.mjs")).status_code == 503
        release.set()
        for _ in range(200):
            if (await core.http.get("/pedelec/v1/health")).json()["ready"]:
                break
            await asyncio.sleep(0.05)
        assert (await core.http.get("/pedelec/v1/health")).json()["pyodide"] == "ready"
        assert (await core.http.get("/pedelec/pyodide/pyodide.mjs")).status_code == 200

    run(main())


def test_missing_pieces_say_what_is_missing(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_core(config(demo=True, web_dir=tmp_path)) as core:
            page = await core.http.get("/")
            assert page.status_code == 503 and "demo page is not in this build" in page.text
            runtime = await core.http.get("/pedelec/pyodide/pyodide.mjs")
            assert runtime.status_code == 503 and "--pyodide DIR" in runtime.text

    run(main())


@pytest.mark.parametrize(("spec", "kind", "label"), [
    ("offline", "offline", "offline agent"),
    ("openai:gpt-4o", "openai", "model gpt-4o (OpenAI API)"),
    ("anthropic:claude-sonnet-4-5", "anthropic", "model claude-sonnet-4-5 (Anthropic API)"),
    ("ag-ui:https://demo:pa55word@agents.example/run?token=s3cret-token", "ag-ui",
     "AG-UI agent"),
])
def test_the_demo_page_learns_its_agent_without_its_url(
        tmp_path: Path, spec: str, kind: str, label: str) -> None:
    """The demo's chat header names the agent --agent runs; an AG-UI agent's URL (its
    password, its query) never reaches the page, and no token is needed."""
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "index.html").write_text("<!doctype html><title>demo</title>")

    async def main() -> None:
        async with running_core(config(demo=True, web_dir=tmp_path, agent=spec)) as core:
            async with httpx.AsyncClient(base_url=str(core.http.base_url)) as anonymous:
                answer = await anonymous.get("/agent.json")
            assert answer.status_code == 200
            assert answer.headers["cache-control"] == "no-store"
            assert answer.json() == {"kind": kind, "label": label}
            for secret in ("pa55word", "s3cret-token", "agents.example", TOKEN):
                assert secret not in answer.text
            assert (await core.http.get("/")).status_code == 200

    run(main())


def test_origin_allow_list() -> None:
    async def main() -> None:
        cfg = config(allow_origins=("https://app.example",))
        async with running_core(cfg) as core:
            own = f"http://127.0.0.1:{core.port}"
            for origin in (None, own, "https://app.example"):
                client = await RawClient.open(core.ws_url, origin=origin)
                assert (await client.hello())["type"] == "welcome"
                await client.close()
            for origin in ("https://evil.example", f"http://localhost:{core.port}"):
                with pytest.raises(websockets.InvalidStatus) as refused:
                    await RawClient.open(core.ws_url, origin=origin)
                assert refused.value.response.status_code == 403

    run(main())


def test_hello_tools_are_visible_and_tools_update_replaces_them() -> None:
    async def main() -> None:
        async with running_core() as core:
            client = await RawClient.open(core.ws_url)
            welcome = await client.hello([tool_meta("a"), tool_meta("b")])
            sid = welcome["sessionId"]
            assert [t["name"] for t in (await core.session_info(sid))["tools"]] == ["a", "b"]
            await client.send({"type": "tools.update", "tools": [tool_meta("c")]})
            await client.send({"type": "tools.update", "tools": [{"name": "bad name"}]})
            error = await client.recv()
            assert error["code"] == "INVALID_TOOL"
            assert [t["name"] for t in (await core.session_info(sid))["tools"]] == ["c"]

    run(main())


def test_sessions_show_liveness_and_a_call_can_refuse_to_wait_for_the_page() -> None:
    """A closed tab's session stays listed until --session-ttl, but after the connected
    ones, marked ``connected: false`` with ``disconnectedAt``; ``?connected=true`` leaves it
    out; a tool call to it waits for the page unless it says ``waitForPage: false``, and a
    call that waited out its deadline says the page was not there."""
    async def main() -> None:
        async with running_core() as core:
            gone = await Page(adder()).connect(core.ws_url)
            old = await Page(adder()).connect(core.ws_url)
            new = await Page(adder()).connect(core.ws_url)
            gone_id = gone.session.session_id
            await gone.drop()
            registry = core.app.state.registry
            await until(lambda: registry.get(gone_id).connection is None, "the drop")

            listed = (await core.http.get("/pedelec/v1/sessions")).json()["sessions"]
            assert [s["sessionId"] for s in listed] == [
                new.session.session_id, old.session.session_id, gone_id]
            assert [s["connected"] for s in listed] == [True, True, False]
            assert listed[0]["disconnectedAt"] is None
            assert listed[2]["disconnectedAt"] >= listed[2]["createdAt"]
            live = (await core.http.get("/pedelec/v1/sessions?connected=true")).json()
            assert gone_id not in [s["sessionId"] for s in live["sessions"]]
            away = (await core.http.get("/pedelec/v1/sessions?connected=false")).json()
            assert [s["sessionId"] for s in away["sessions"]] == [gone_id]
            bad = await core.http.get("/pedelec/v1/sessions?connected=yes")
            assert bad.status_code == 400 and "'connected'" in bad.json()["error"]["message"]

            url = f"/pedelec/v1/sessions/{gone_id}/tool-calls"
            refused = await core.http.post(url, json={"tool": "add", "args": {"a": 1},
                                                      "waitForPage": False})
            assert refused.status_code == 409
            error = refused.json()["error"]
            assert error["code"] == "PAGE_NOT_CONNECTED"
            assert "?connected=true" in error["message"]
            assert registry.get(gone_id).pending == {}
            bad = await core.http.post(url, json={"tool": "add", "waitForPage": "no"})
            assert bad.status_code == 400 and "'waitForPage'" in bad.json()["error"]["message"]
            # to a connected page, waitForPage: false changes nothing
            fine = await core.http.post(
                f"/pedelec/v1/sessions/{new.session.session_id}/tool-calls",
                json={"tool": "add", "args": {"a": 1}, "waitForPage": False})
            assert fine.json()["result"] == {"value": 2}

            waited = (await core.tool_call(gone_id, "add", {"a": 1}, timeoutMs=50)).json()
            result = waited["result"]
            assert result["error"]["code"] == "TOOL_TIMEOUT"
            assert "no page was connected" in result["error"]["message"]
            assert result["error"]["details"]["pageConnected"] is False

    run(main())
