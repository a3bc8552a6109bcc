"""``pedelec serve`` / ``pedelec demo`` as a user runs them."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from pedelec_pyodide.core.cli import build_parser, config_from_args
from pedelec_pyodide.core.server import freeze_start_heap

T = TypeVar("T")


def start(*args: str, token: str | None = None) -> tuple[subprocess.Popen[str], str, str]:
    """Core as a user starts it, ``token`` in ``$PEDELEC_ADMIN_TOKEN`` (else none set);
    its URL, and the token it printed (none when it came from the environment)."""
    env = dict(os.environ)
    env.pop("PEDELEC_ADMIN_TOKEN", None)
    if token is not None:
        env["PEDELEC_ADMIN_TOKEN"] = token
    process = subprocess.Popen(
        [sys.executable, "-m", "pedelec_pyodide.core.cli", *args, "--port", "0",
         "--no-provision", "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert process.stdout is not None
    url_line = process.stdout.readline()
    assert url_line.startswith(f"pedelec {args[0]}: http://127.0.0.1:"), url_line
    printed = ""
    if token is None:
        token_line = process.stdout.readline()
        assert token_line.startswith("admin token (generated; set PEDELEC_ADMIN_TOKEN"), (
            token_line)
        printed = token_line.rsplit(" ", 1)[1].strip()
    return process, url_line.split(": ", 1)[1].strip(), printed


@pytest.mark.parametrize("command", ["serve", "demo"])
def test_cli_prints_url_answers_and_stops_on_sigterm(command: str) -> None:
    """With the token in the environment, Core prints its URL only: the token never
    reaches its output or its log (both end up in log collectors)."""
    process, url, printed = start(command, token="from-the-env")
    try:
        assert printed == ""
        health = httpx.get(url + "pedelec/v1/health", timeout=10)
        assert health.status_code == 200
        sessions = httpx.get(url + "pedelec/v1/sessions", timeout=10,
                             headers={"Authorization": "Bearer from-the-env"})
        assert sessions.status_code == 200
        assert httpx.get(url, timeout=10).status_code in (200, 503)
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 0
    assert process.stdout is not None and process.stderr is not None
    output = process.stdout.read() + process.stderr.read()
    assert "from-the-env" not in output
    assert "admin token" not in output


def test_cli_prints_a_token_it_generated_and_refuses_bad_agents() -> None:
    process, url, token = start("serve")
    try:
        assert len(token) >= 32
        sessions = httpx.get(url + "pedelec/v1/sessions", timeout=10,
                             headers={"Authorization": f"Bearer {token}"})
        assert sessions.status_code == 200
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=15) == 0
    failed = subprocess.run(
        [sys.executable, "-m", "pedelec_pyodide.core.cli", "serve", "--agent", "nonsense"],
        capture_output=True, text=True, timeout=30)
    assert failed.returncode == 2 and "unknown agent 'nonsense'" in failed.stderr


def test_help_explains_every_option() -> None:
    parser = build_parser()
    for command in ("serve", "demo"):
        sub = parser._subparsers._group_actions[0].choices[command]  # type: ignore[union-attr]
        for action in sub._actions:
            assert action.help, (command, action.dest)


def test_help_writes_a_whole_default_as_the_cli_reference_does() -> None:
    """1048576, not ``:g``'s 1.04858e+06."""
    parser = build_parser()
    serve = parser._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    helps = {action.dest: action.help or "" for action in serve._actions}
    assert helps["metadata_rate"].endswith("(default: 1048576)")
    assert not [dest for dest, text in helps.items() if "e+" in text]


@pytest.mark.parametrize("option", [
    ["--tool-timeout", "0"], ["--tool-timeout", "86400001"], ["--tool-timeout", "1" + "0" * 400],
    ["--tool-timeouts", "save=86400001"], ["--session-ttl", "nan"], ["--session-ttl", "inf"],
    ["--rate-limit", "-1"], ["--port", "70000"], ["--port", "-1"],
    ["--kept-results", "0"], ["--kept-results", "1.5"], ["--result-retention", "nan"],
    ["--result-retention", "-5"],
    ["--max-sessions", "0"], ["--max-metadata-bytes", "1.5"], ["--max-queued-bytes", "-1"],
    ["--max-pending", "many"], ["--max-history-bytes", "0"],
    ["--user-wait-limit", "0"], ["--user-wait-limit", "nan"], ["--max-total-factor", "0.5"],
    ["--header-timeout", "0"], ["--header-timeout", "inf"], ["--header-timeout", "nan"],
    ["--forwarded-allow-ips", "proxy.example"], ["--forwarded-allow-ips", "10.0.0.1,"],
    ["--forwarded-allow-ips", "10.0.0.0/33"],
    ["--max-total-factor", "inf"],
])
def test_out_of_range_options_are_refused_with_a_message(
        option: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as refused:
        build_parser().parse_args(["serve", *option])
    assert refused.value.code == 2
    assert option[0] in capsys.readouterr().err


def test_kept_results_and_their_retention_reach_the_config() -> None:
    args = build_parser().parse_args(["serve", "--kept-results", "5",
                                      "--result-retention", "90.5"])
    cfg, _ = config_from_args(args)
    assert (cfg.kept_results, cfg.result_retention) == (5, 90.5)
    default, _ = config_from_args(build_parser().parse_args(["serve"]))
    assert (default.kept_results, default.result_retention) == (64, 86400.0)


def test_the_transport_options_reach_the_config() -> None:
    """Core trusts no proxy unless told (uvicorn alone trusts 127.0.0.1: any local
    process could then claim any client address)."""
    default, _ = config_from_args(build_parser().parse_args(["serve"]))
    assert (default.header_timeout, default.forwarded_allow_ips) == (10.0, ())
    cfg, _ = config_from_args(build_parser().parse_args([
        "serve", "--header-timeout", "2.5", "--forwarded-allow-ips", "10.0.0.5, 10.1.0.0/16",
        "--forwarded-allow-ips", "::1"]))
    assert (cfg.header_timeout, cfg.forwarded_allow_ips) == (
        2.5, ("10.0.0.5", "10.1.0.0/16", "::1"))
    star, _ = config_from_args(build_parser().parse_args([
        "serve", "--forwarded-allow-ips", "*"]))
    assert star.forwarded_allow_ips == ("*",)


def test_the_longest_deadline_is_accepted() -> None:
    args = build_parser().parse_args(["serve", "--tool-timeout", "86400000",
                                      "--tool-timeouts", "save=86400000"])
    assert args.tool_timeout == 86_400_000 and args.tool_timeouts == [("save", 86_400_000)]


def test_the_memory_bounds_reach_the_config() -> None:
    cfg, _ = config_from_args(build_parser().parse_args([
        "serve", "--max-sessions", "3", "--max-metadata-bytes", "4096",
        "--max-queued-bytes", "65536", "--max-pending", "5", "--max-history-bytes", "2048",
        "--session-ttl", "9"]))
    assert (cfg.max_sessions, cfg.max_metadata_bytes, cfg.max_queued_bytes, cfg.max_pending,
            cfg.max_history_bytes, cfg.session_ttl) == (3, 4096, 65536, 5, 2048, 9.0)


def test_the_long_running_tool_limits_reach_the_config() -> None:
    cfg, _ = config_from_args(build_parser().parse_args([
        "serve", "--user-wait-limit", "90", "--max-total-factor", "3"]))
    assert (cfg.user_wait_limit, cfg.max_total_factor) == (90.0, 3.0)
    default, _ = config_from_args(build_parser().parse_args(["serve"]))
    assert (default.user_wait_limit, default.max_total_factor) == (600.0, 10.0)


def test_a_store_that_is_not_sqlite_is_a_clear_error(tmp_path: Path) -> None:
    store = tmp_path / "notes.txt"
    store.write_text("these are my notes, not a database\n")
    failed = subprocess.run(
        [sys.executable, "-m", "pedelec_pyodide.core.cli", "serve", "--port", "0",
         "--no-provision", "--store", str(store)],
        capture_output=True, text=True, timeout=30)
    assert failed.returncode == 2
    assert failed.stderr.strip() == f"pedelec: error: --store {store}: file is not a database"
    assert failed.stdout == ""  # nothing announced


def test_a_pyodide_directory_that_was_not_provisioned_is_refused_at_once(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--pyodide", str(tmp_path)])
    said = capsys.readouterr().err
    assert "no pyodide.mjs or pyodide-lock.json there" in said
    assert "python -m pedelec_pyodide.build.provision" in said


def test_an_unknown_option_is_reported_with_its_command_usage(
        capsys: pytest.CaptureFixture[str]) -> None:
    from pedelec_pyodide.core.cli import main

    with pytest.raises(SystemExit) as refused:
        main(["serve", "--bogus"])
    assert refused.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: pedelec serve ")
    assert "unrecognized arguments: --bogus" in err


def test_a_fraction_where_a_whole_number_is_expected_says_so(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--max-steps", "1.5"])
    assert "'1.5': expected a whole number" in capsys.readouterr().err


@pytest.mark.parametrize("origin", ["notanorigin", "ftp://x.example", "http://", "http://a/b",
                                    "http://a:99999", "https://user@a.example"])
def test_a_malformed_allow_origin_is_refused(
        origin: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--allow-origin", origin])
    assert "expected an origin such as" in capsys.readouterr().err


def test_well_formed_allow_origins_are_taken() -> None:
    args = build_parser().parse_args([
        "serve", "--allow-origin", "http://127.0.0.1:5173/", "--allow-origin", "*",
        "--allow-origin", "https://[::1]:8443", "--allow-origin", "https://app.example"])
    assert args.allow_origin == ["http://127.0.0.1:5173", "*", "https://[::1]:8443",
                                 "https://app.example"]


def test_scripts_demo_prints_the_url_first_and_no_stray_lines() -> None:
    """./scripts/demo on a machine where it is set up: what the user reads on stdout starts
    with the demo's URL (provisioning's progress goes to stderr; its stdout, the runtime
    directory for scripts, is not shown)."""
    repo = Path(__file__).resolve().parents[2]
    if not (repo / ".venv" / "bin" / "pedelec").exists():
        pytest.skip("needs the repository's .venv (./scripts/demo makes it)")
    env = {key: value for key, value in os.environ.items() if key != "PEDELEC_ADMIN_TOKEN"}
    process = subprocess.Popen([str(repo / "scripts" / "demo"), "--port", "0", "--quiet"],
                               cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               text=True, env=env)
    deadline = threading.Timer(240, process.kill)  # a stuck provisioning ends the readline
    deadline.start()
    try:
        assert process.stdout is not None
        first = process.stdout.readline()  # blocks until provisioning is done and Core is up
        assert first.startswith("pedelec demo: http://127.0.0.1:"), first
    finally:
        deadline.cancel()
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


STOPPED_IN_A_FINALIZER = """
import os, signal, sys
from pedelec_pyodide.core import cli, server

class SignalsWhileFinalized:
    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(100_000):  # Python runs the handler here, inside the finalizer
            pass

if sys.argv[1] == "announced":  # as the URL is read
    serve = cli.run
    def run(cfg, announce):
        serve(cfg, lambda url: (announce(url), SignalsWhileFinalized()))
    cli.run = run
else:  # while Core starts, before the URL is out
    make_app = server.create_app
    def create_app(cfg):
        SignalsWhileFinalized()
        return make_app(cfg)
    server.create_app = create_app
sys.exit(cli.main(["serve", "--port", "0", "--no-provision", "--quiet"]))
"""


@pytest.mark.parametrize("when", ["starting", "announced"])
def test_a_sigterm_lost_in_a_finalizer_still_stops_core(when: str) -> None:
    """A supervisor stops Core as it starts, or as soon as it has read the URL: the signal
    is handled wherever Python is at that moment, a finalizer included (the worst place:
    an exception raised there is dropped). Core stops, exit status 0."""
    env = {key: value for key, value in os.environ.items() if key != "PEDELEC_ADMIN_TOKEN"}
    process = subprocess.Popen([sys.executable, "-c", STOPPED_IN_A_FINALIZER, when],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=env)
    try:
        out, err = process.communicate(timeout=30)
    finally:
        process.kill()
        process.wait(timeout=30)
    assert out.startswith("pedelec serve: http://127.0.0.1:"), out
    assert process.returncode == 0, err


def test_requests_waiting_when_core_stops_are_answered_core_stopping() -> None:
    """SIGTERM while a tool call, a streamed tool call, a turn and an MCP call wait for a
    page that never answers: once Core gives up on them each gets CORE_STOPPING (a 503,
    or the stream's last event), not a bare 500 and a traceback in the log; Core exits 0."""
    import asyncio
    import json

    from corekit import TOKEN
    from mcp.shared.exceptions import MCPError
    from mcpkit import mcp_at, modern_client

    process, url, _ = start("serve", token=TOKEN)
    base = url.rstrip("/")
    auth = {"Authorization": f"Bearer {TOKEN}"}

    async def scenario() -> tuple[list[httpx.Response], str]:
        page, sid = await _silent_page(base, "a", "b", "c", "d")
        calls = f"{base}/pedelec/v1/sessions/{sid}/tool-calls"
        async with httpx.AsyncClient(trust_env=False, timeout=30) as client, \
                modern_client(mcp_at(int(base.rsplit(":", 1)[1]), sid)) as mcp:
            async def streamed() -> str:
                async with client.stream("POST", calls, json={"tool": "b", "args": {}},
                                         headers={**auth, "Accept": "text/event-stream"}
                                         ) as events:
                    return (await events.aread()).decode()

            waiting = [asyncio.ensure_future(client.post(calls, json={"tool": "a", "args": {}},
                                                         headers=auth)),
                       asyncio.ensure_future(client.post(
                           f"{base}/pedelec/v1/sessions/{sid}/turns", headers=auth,
                           json={"text": '/call c {}'}))]
            stream = asyncio.ensure_future(streamed())
            mcp_call = asyncio.ensure_future(mcp.call_tool("d", {}))
            requested = set()
            while len(requested) < 4:  # each has reached the page
                frame = json.loads(await asyncio.wait_for(page.recv(), 10))
                if frame["type"] == "tool.request":
                    requested.add(frame["tool"])
            process.send_signal(signal.SIGTERM)
            answers = [await asyncio.wait_for(call, 20) for call in waiting]
            text = await asyncio.wait_for(stream, 20)
            with pytest.raises(MCPError):  # (the SDK says no more than that it failed)
                await asyncio.wait_for(mcp_call, 20)
        await page.close()
        return answers, text

    (answers, streamed_text), err = _run_until_stopped(process, scenario())
    for answer in answers:
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"]["code"] == "CORE_STOPPING"
    last = streamed_text.strip().split("\n\n")[-1]
    assert last.startswith("event: error\ndata: ") and "CORE_STOPPING" in last, streamed_text
    assert process.returncode == 0 and "Traceback" not in err, err
    # the stop as it is meant to go: a warning of Core's, no ERROR line of uvicorn's
    assert "ERROR" not in err and "event=core.gave_up waiting=" in err, err


def test_requests_pipelined_behind_one_waiting_when_core_stops_never_start() -> None:
    """Two tool calls pipelined on one connection, the first waiting for a page that
    never answers, when Core stops: the first is answered CORE_STOPPING with
    ``Connection: close`` and the connection closes; the second never reaches the page
    (Core has given up: it must not start work it will not finish) and gets no answer,
    which tells its client it was not run."""
    import asyncio
    import json

    import websockets
    from corekit import TOKEN

    process, url, _ = start("serve", token=TOKEN)
    base = url.rstrip("/")
    port = int(base.rsplit(":", 1)[1])

    async def scenario() -> tuple[bytes, list[str]]:
        page, sid = await _silent_page(base, "first", "second")
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for tool in ("first", "second"):
            body = json.dumps({"tool": tool, "args": {}}).encode()
            writer.write(
                f"POST /pedelec/v1/sessions/{sid}/tool-calls HTTP/1.1\r\n"
                f"Host: 127.0.0.1:{port}\r\nAuthorization: Bearer {TOKEN}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                .encode() + body)
        requested = []
        frame = json.loads(await asyncio.wait_for(page.recv(), 10))
        requested.append(frame["tool"])  # the first reached the page, the second waits
        process.send_signal(signal.SIGTERM)
        answer = await asyncio.wait_for(reader.read(), 20)  # to the connection's end
        writer.close()
        with contextlib.suppress(websockets.ConnectionClosed, TimeoutError):
            while True:  # what else reached the page before Core closed its socket
                frame = json.loads(await asyncio.wait_for(page.recv(), 20))
                if frame["type"] == "tool.request":
                    requested.append(frame["tool"])
        return answer, requested

    (answer, requested), err = _run_until_stopped(process, scenario())
    head, _, rest = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503 "), answer
    assert b"\r\nconnection: close" in head.lower(), head
    assert b"CORE_STOPPING" in rest and b"HTTP/1.1" not in rest, answer  # one answer only
    assert requested == ["first"]
    assert process.returncode == 0 and "Traceback" not in err, err


@pytest.mark.parametrize("reader", ["stopped", "reading"])
def test_a_download_under_way_when_core_stops_is_cut_off(tmp_path: Path, reader: str
                                                         ) -> None:
    """A client downloading a large file of the app when Core stops, one that stopped
    reading (its socket full) and one still reading: Core cuts the download off and exits
    0, with no traceback. It waited for the one that stopped reading until its slow-read
    cut-off (--header-timeout, here 120 s), and the other's ending logged "Response
    content shorter than Content-Length"."""
    import socket
    import time

    from corekit import TOKEN

    app = tmp_path / "app"
    app.mkdir()
    (app / "index.html").write_text("<p>app</p>")
    with open(app / "big.bin", "wb") as big:
        big.truncate(256 * 2**20)  # (sparse: no disk needed)
    process, url, _ = start("serve", "--app", str(app), "--header-timeout", "120",
                            token=TOKEN)
    port = int(url.rstrip("/").rsplit(":", 1)[1])
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    done = threading.Event()

    def read_on() -> None:  # ~1.6 MB/s: far from the end of 256 MiB when Core stops
        with contextlib.suppress(OSError):
            while not done.is_set() and client.recv(16384):
                time.sleep(0.01)

    reading = threading.Thread(target=read_on)
    try:
        client.settimeout(30)
        client.connect(("127.0.0.1", port))
        client.sendall(b"GET /big.bin HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert client.recv(1024).startswith(b"HTTP/1.1 200")
        if reader == "reading":
            reading.start()
        time.sleep(0.5)  # Core's writes fill the socket (the stopped reader's, at least)
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=30)
        assert process.returncode == 0 and "Traceback" not in err, err
    finally:
        done.set()
        if reading.is_alive():
            reading.join(timeout=30)
        client.close()
        process.kill()
        process.wait(timeout=30)


def test_a_second_ctrl_c_still_ends_cores_own_work() -> None:
    """Ctrl-C twice with a call waiting: uvicorn then skips its wait for connections and
    the app's end, but Core's own end (turns, the store: bounded) runs all the same, with
    no traceback; exit 0."""
    import asyncio
    import json

    import websockets
    from corekit import TOKEN

    env = dict(os.environ, PEDELEC_ADMIN_TOKEN=TOKEN)
    process = subprocess.Popen(
        [sys.executable, "-m", "pedelec_pyodide.core.cli", "serve", "--port", "0",
         "--no-provision"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert process.stdout is not None
    base = process.stdout.readline().split(": ", 1)[1].strip().rstrip("/")

    async def scenario() -> None:
        page, sid = await _silent_page(base, "a")
        async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
            call = asyncio.ensure_future(client.post(
                f"{base}/pedelec/v1/sessions/{sid}/tool-calls",
                json={"tool": "a", "args": {}}, headers={"Authorization": f"Bearer {TOKEN}"}))
            while json.loads(await asyncio.wait_for(page.recv(), 10))["type"] != (
                    "tool.request"):
                pass
            process.send_signal(signal.SIGINT)
            await asyncio.sleep(0.3)
            process.send_signal(signal.SIGINT)
            answer = await asyncio.wait_for(call, 20)
            assert answer.status_code == 503, answer.text
        with contextlib.suppress(websockets.ConnectionClosed):
            await page.close()

    _, err = _run_until_stopped(process, scenario())
    assert process.returncode == 0, err
    assert "event=core.stopped" in err and "Traceback" not in err, err


def test_version_names_the_distribution() -> None:
    from pedelec_pyodide import __version__

    shown = subprocess.run([sys.executable, "-m", "pedelec_pyodide.core.cli", "--version"],
                           capture_output=True, text=True, timeout=30)
    assert shown.returncode == 0 and shown.stdout == f"pedelec-pyodide {__version__}\n"


@pytest.mark.parametrize("argv", [[], ["serve", "--bogus"], ["demo", "--port", "x"], ["lite"]])
def test_a_usage_error_is_three_short_lines(argv: list[str]) -> None:
    """The short usage, the error, where the options are explained (serve's whole usage
    is a dozen lines: that is --help's)."""
    failed = subprocess.run([sys.executable, "-m", "pedelec_pyodide.core.cli", *argv],
                            capture_output=True, text=True, timeout=30)
    lines = failed.stderr.splitlines()
    assert failed.returncode == 2 and len(lines) == 3, failed.stderr
    assert lines[0].startswith("usage: pedelec") and len(lines[0]) < 80
    assert ": error: " in lines[1] and lines[2].endswith("--help explains every option)")


def test_a_port_in_use_says_how_to_get_another() -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        failed = subprocess.run(
            [sys.executable, "-m", "pedelec_pyodide.core.cli", "serve", "--port", str(port),
             "--no-provision", "--quiet"], capture_output=True, text=True, timeout=30)
    assert failed.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in failed.stderr
    assert "--port 0 picks a free one" in failed.stderr


async def _silent_page(base: str, *tools: str) -> tuple[Any, str]:
    """A page on Core at ``base`` with ``tools`` (by name) that it never answers: its
    WebSocket and its session's id."""
    import asyncio
    import json

    import websockets

    page = await websockets.connect(base.replace("http", "ws", 1) + "/pedelec/v1/bridge",
                                    proxy=None)
    await page.send(json.dumps({"type": "hello", "protocol": 1, "tools": [
        {"name": name, "description": "never answers", "argsSchema": {"type": "object"}}
        for name in tools]}))
    return page, json.loads(await asyncio.wait_for(page.recv(), 10))["sessionId"]


def _run_until_stopped(process: subprocess.Popen[str], scenario: Coroutine[Any, Any, T]
                       ) -> tuple[T, str]:
    """``scenario``, which stops Core, then Core's end (30 s at most; killed if it outlives
    the test): what the scenario returned, and what Core wrote to stderr."""
    import asyncio

    try:
        outcome = asyncio.run(scenario)
        _, err = process.communicate(timeout=30)
    finally:
        process.kill()
        process.wait(timeout=30)
    return outcome, err


def _answers_then_stops(process: subprocess.Popen[str], port: int) -> str:
    """Wait (30 s at most) for Core on ``port`` to answer its health check, then stop it
    with SIGTERM: what it wrote to stderr."""
    import time

    deadline = time.monotonic() + 30
    while True:
        assert process.poll() is None, process.communicate(timeout=10)[1]
        try:
            health = httpx.get(f"http://127.0.0.1:{port}/pedelec/v1/health", timeout=5)
            break
        except httpx.TransportError:
            assert time.monotonic() < deadline, "Core never answered"
            time.sleep(0.1)
    assert health.status_code == 200
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=30)
    return err


def test_a_reader_that_stops_reading_the_output_does_not_stop_core() -> None:
    """Whoever started Core closed its end of the output before Core printed its URL and
    generated token: Core serves on (it said "cannot listen" and exited 1)."""
    import socket

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    env = {key: value for key, value in os.environ.items() if key != "PEDELEC_ADMIN_TOKEN"}
    read_end, write_end = os.pipe()
    os.close(read_end)  # nobody reads: Core's first print fails (BrokenPipeError)
    process = subprocess.Popen(
        [sys.executable, "-m", "pedelec_pyodide.core.cli", "serve", "--port", str(port),
         "--no-provision", "--quiet"], stdout=write_end, stderr=subprocess.PIPE, text=True,
        env=env)
    os.close(write_end)
    try:
        err = _answers_then_stops(process, port)
        assert process.returncode == 0, err
    finally:
        process.kill()
        process.wait(timeout=30)


@pytest.mark.parametrize("closed", [">&-", ">&- 2>&-"])
def test_core_started_with_its_output_closed_serves(closed: str) -> None:
    """``pedelec serve >&-``: standard output (and error) closed as descriptors when Core
    starts. Core serves, and stops on SIGTERM with exit 0 (uvicorn's logging failed on
    the missing stream: a traceback, exit 1)."""
    import socket

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    command = [sys.executable, "-m", "pedelec_pyodide.core.cli", "serve", "--port",
               str(port), "--no-provision"]
    process = subprocess.Popen(["sh", "-c", f'exec "$@" {closed}', "sh", *command],
                               stderr=subprocess.PIPE, text=True,
                               env=dict(os.environ, PEDELEC_ADMIN_TOKEN="closed"))
    try:
        err = _answers_then_stops(process, port)
        assert process.returncode == 0, err
        assert ("event=core.stopped" in err) == ("2>&-" not in closed), err
    finally:
        process.kill()
        process.wait(timeout=30)


def test_a_bare_pyodide_runtime_is_refused_with_the_command_that_provisions_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The npm package's directory has pyodide.mjs and a pyodide-lock.json, but pages
    served from it would start without pedelec-pyodide."""
    (tmp_path / "pyodide.mjs").write_text("export {};")
    (tmp_path / "pyodide-lock.json").write_text('{"info": {}, "packages": {"micropip": {}}}')
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--pyodide", str(tmp_path)])
    said = capsys.readouterr().err
    assert "lists no pedelec-pyodide" in said
    assert f"provision OUT --pyodide {tmp_path}" in said and "--pyodide OUT/pyodide" in said
    (tmp_path / "pyodide-lock.json").write_text('{"packages": {"pedelec-pyodide": {}}}')
    args = build_parser().parse_args(["serve", "--pyodide", str(tmp_path)])
    assert args.pyodide == tmp_path.resolve()


def test_a_provisioning_failure_is_a_warning_even_with_quiet_and_health_says_why(
        tmp_path: Path) -> None:
    """No npm on PATH and nothing cached: pages cannot load. --quiet still shows why, and
    health's pyodideDetail says it too."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("PEDELEC_")}
    env["PATH"] = str(Path(sys.executable).parent)  # this Python, and no npm
    env["PEDELEC_CACHE_DIR"] = str(tmp_path)
    process = subprocess.Popen(
        [sys.executable, "-m", "pedelec_pyodide.core.cli", "serve", "--port", "0", "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert process.stdout is not None
        url = process.stdout.readline().split(": ", 1)[1].strip()
        health: dict[str, object] = {}
        for _ in range(300):
            health = httpx.get(url + "pedelec/v1/health", timeout=10).json()
            if health["pyodide"] != "provisioning":
                break
            threading.Event().wait(0.1)
        assert health["pyodide"] == "error" and health["ready"] is False
        assert "`npm` was not found" in str(health["pyodideDetail"])
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=15)
    assert process.stderr is not None
    said = process.stderr.read()
    assert " WARNING event=provision.failed " in said and "`npm` was not found" in said


def test_core_keeps_what_its_start_made_out_of_full_collections() -> None:
    """``pedelec serve`` freezes its start's objects once started (``run``): each full
    garbage collection, which a large decoded value sets off, walks every object the
    collector tracks (bench/big_decode.py: ~0.5x the time to decode 1 MiB of arrays)."""
    try:
        freeze_start_heap()
        assert gc.get_freeze_count() > 1000
    finally:
        gc.unfreeze()
