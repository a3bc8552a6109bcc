"""What Core serves (issue 10, class 6), against a real Core on loopback.

- under ``--app DIR``, ``/pedelec/`` and ``/pedelec/pyodide/``: no dot-path (``.env``,
  ``.git/config``) and none of Core's own store files (a real SQLite store placed in the
  served directory), in every spelling of the path a client can send, through symlinks and
  hard links: each answers 404 exactly as a missing file does;
- the ``Host`` check (DNS rebinding): every route, HTTP and a real WebSocket handshake, is
  refused unless ``Host`` is one of Core's own names or ``--allow-host``.

Requests go over a raw socket: HTTP clients normalise paths (``..``, ``%2e``) and Host.
"""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

import pytest
import websockets
from corekit import TOKEN, WAIT, Page, config, echo_session, run, running_core

from pedelec_pyodide.core.cli import build_parser, config_from_args
from pedelec_pyodide.core.http.public import host_name, own_hosts

SECRET = "SECRET-CONTENT-must-not-be-served"


async def raw_get(port: int, path: str, headers: list[tuple[str, str]] | None = None,
                  version: str = "HTTP/1.1") -> tuple[int, bytes]:
    """``GET path`` exactly as given; the status and the body (Connection: close)."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), WAIT)
    if headers is None:
        headers = [("Host", f"127.0.0.1:{port}")]
    lines = [f"GET {path} {version}", *(f"{k}: {v}" for k, v in headers), "Connection: close"]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), WAIT)
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, body


def served_tree(root: Path, outside: Path) -> None:
    """A served directory with public files and private ones, reached every way there is."""
    root.mkdir()
    (root / "index.html").write_text("<!doctype html><title>public</title>")
    (root / "sub").mkdir()
    (root / "sub" / "page.html").write_text("public page")
    (root / ".env").write_text(f"API_KEY={SECRET}")
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text(f"[remote] url = {SECRET}")
    (root / ".git" / "index.html").write_text(SECRET)
    (root / "sub" / ".hidden.js").write_text(SECRET)
    (root / "link-to-env").symlink_to(root / ".env")         # a public name for a dotfile
    (root / "git-dir").symlink_to(root / ".git")             # a public name for a dot-folder
    (root / "outside").symlink_to(outside)                   # out of the directory
    (root / ".public-name.txt").symlink_to(root / "index.html")  # a dot-name for a public file


# every spelling of a private path a client can send; each must answer as a missing file
PRIVATE_PATHS = [
    "/.env", "/%2eenv", "/%2Eenv", "/.ENV", "/.env/", "/.env?x=1", "//.env", "///.env",
    "/./.env", "/sub/../.env", "/sub/%2e%2e/.env", "/sub%2F..%2F.env", "/sub%2f%2e%2e%2f.env",
    "/%2e%2e/%2e%2e/.env", "/sub//..//.env", "/\\.env", "/sub\\..\\.env", "/%5c.env",
    "/.git/config", "/.git/", "/.git", "/%2egit/config", "/.git%2Fconfig", "/.GIT/config",
    "/sub/.hidden.js", "/sub/%2ehidden.js", "/link-to-env", "/git-dir/config", "/git-dir/",
    "/outside", "/.public-name.txt", "/.env%00", "/%2e/.env",
]
PUBLIC_PATHS = ["/index.html", "/sub/page.html", "/sub/../index.html"]


def test_no_dot_path_and_no_store_file_is_served_in_any_spelling(tmp_path: Path) -> None:
    outside = tmp_path / "outside-secret.txt"
    outside.write_text(SECRET)
    app_dir, web_dir, pyodide_dir = tmp_path / "app", tmp_path / "web", tmp_path / "pyodide"
    for root in (app_dir, web_dir, pyodide_dir):
        served_tree(root, outside)
    (web_dir / "pedelec-pyodide.js").write_text("// the loader")
    (pyodide_dir / "pyodide.mjs").write_text("// the runtime")
    store = app_dir / "core.sqlite"  # the store inside the served app, as users do
    cfg = config(app_dir=app_dir, web_dir=web_dir, pyodide_dir=pyodide_dir, store=str(store))

    async def main() -> None:
        async with running_core(cfg) as core:
            page = await Page(echo_session()).connect(core.ws_url)  # the store has rows
            await core.tool_call(page.session.session_id or "", "echo", {"a": 1})
            store_names = [p.name for p in app_dir.iterdir() if p.name.startswith("core.")]
            assert {"core.sqlite", "core.sqlite-wal", "core.sqlite-shm"} <= set(store_names)
            for root in (web_dir, pyodide_dir):  # the store by other names: hard links
                os.link(store, root / "store-copy.db")
            os.link(store, app_dir / "STORE-COPY.DB")
            (app_dir / "store-link").symlink_to(store)
            cases: list[tuple[str, str]] = []
            for prefix in ("", "/pedelec", "/pedelec/pyodide"):
                cases += [(prefix, path) for path in PRIVATE_PATHS]
                cases += [(prefix, "/store-copy.db")] if prefix else []
            cases += [("", f"/{name}") for name in store_names]
            cases += [("", "/%63ore.sqlite"), ("", "/STORE-COPY.DB"), ("", "/store-link"),
                      ("", "/sub/../core.sqlite-wal")]
            assert (await raw_get(core.port, "/"))[0] == 200  # the app's index.html
            for prefix in ("", "/pedelec", "/pedelec/pyodide"):
                missing = await raw_get(core.port, f"{prefix}/no-such-file")
                assert missing[0] == 404
                for path in PUBLIC_PATHS:  # the control: the same tree is served
                    assert (await raw_get(core.port, prefix + path))[0] == 200, prefix + path
            refused = []
            for prefix, path in cases:
                status, body = await raw_get(core.port, prefix + path)
                if SECRET.encode() in body or b"SQLite format" in body or status != 404:
                    refused.append((prefix + path, status, body[:60]))
                else:
                    assert (status, body) == await raw_get(core.port, f"{prefix}/no-such-file")
            assert refused == [], refused
            await page.drop()

    run(main())


# --- the Host check ----------------------------------------------------------------------

ALLOWED_HOSTS = ["127.0.0.1:{port}", "127.0.0.1", "localhost", "localhost:{port}",
                 "LocalHost:{port}", "[::1]:{port}", "[::1]", "my-box.lan:{port}",
                 "192.168.7.9:1234", "[0:0:0:0:0:0:0:1]:{port}"]
MISDIRECTED_HOSTS = ["evil.example", "evil.example:{port}", "127.0.0.1.evil.example",
                     "localhost.evil.example:{port}", "127.1", "0x7f.0.0.1", "[::2]",
                     "my-box.lan.evil.example", "localhost.", "0.0.0.0:{port}"]
BAD_HOSTS = [[], [("Host", "")], [("Host", "::1:{port}")], [("Host", "localhost:abc")],
             [("Host", "localhost:")], [("Host", "user@localhost")], [("Host", "a b")],
             [("Host", "localhost"), ("Host", "evil.example")], [("Host", "x" * 300)],
             [("Host", "localhost/x")], [("Host", "[::1")], [("Host", "a..b")]]


def test_only_cores_own_host_names_are_answered(tmp_path: Path) -> None:
    app_dir = tmp_path / "app"
    app_dir.mkdir()
    (app_dir / "index.html").write_text("app")
    cfg = config(app_dir=app_dir, allow_hosts=("my-box.lan", "192.168.7.9"))

    async def main() -> None:
        async with running_core(cfg) as core:
            port = core.port
            auth = ("Authorization", f"Bearer {TOKEN}")
            paths = ["/pedelec/v1/health", "/", "/index.html", "/pedelec/v1/sessions",
                     "/pedelec/pyodide/pyodide.mjs"]
            for host in ALLOWED_HOSTS:
                status, _ = await raw_get(port, "/pedelec/v1/sessions",
                                          [("Host", host.format(port=port)), auth])
                assert status == 200, host
            for host in MISDIRECTED_HOSTS:
                for path in paths:
                    status, body = await raw_get(port, path, [("Host", host.format(port=port)),
                                                              auth])
                    assert status == 421, (host, path, status)
                    assert b"--allow-host" in body and b"sessions" not in body
            for headers in BAD_HOSTS:
                headers = [(k, v.format(port=port)) for k, v in headers] + [auth]
                for path in paths:
                    status, body = await raw_get(port, path, headers)
                    assert status == 400, (headers, path, status, body)
            # HTTP/1.0 without Host: refused too
            assert (await raw_get(port, "/pedelec/v1/health", [], "HTTP/1.0"))[0] == 400

    run(main())


def test_a_websocket_with_another_host_is_refused_at_the_handshake() -> None:
    async def main() -> None:
        async with running_core() as core:
            url = "/pedelec/v1/bridge"
            for host in ("evil.example", f"evil.example:{core.port}", "localhost.evil.example"):
                sock = socket.create_connection(("127.0.0.1", core.port), timeout=WAIT)
                with pytest.raises(websockets.InvalidStatus) as refused:
                    await websockets.connect(f"ws://{host}{url}", sock=sock, proxy=None,
                                             open_timeout=WAIT)
                assert refused.value.response.status_code == 421, host
                assert b"--allow-host" in refused.value.response.body
                sock.close()
            assert core.registry.sessions == {}
            # the same connection by Core's own names opens a session
            for host in (f"localhost:{core.port}", f"127.0.0.1:{core.port}"):
                sock = socket.create_connection(("127.0.0.1", core.port), timeout=WAIT)
                ws = await websockets.connect(f"ws://{host}{url}", sock=sock, proxy=None,
                                              open_timeout=WAIT)
                await ws.close()

    run(main())


def test_host_names_and_allow_host() -> None:
    assert host_name("LOCALHOST:8765") == "localhost"
    assert host_name("[::1]:80") == "::1"
    assert host_name("::1") is None
    assert host_name("host:") is None
    assert host_name("[FE80:0:0::1]:80") == "fe80::1"  # one spelling of an IPv6 address
    assert host_name("a..b") is None and host_name("[::1") is None
    # bound to every interface: the machine's names are refused until --allow-host names them
    hosts = own_hosts("0.0.0.0", ())
    assert hosts is not None and "my-laptop.local" not in hosts and "localhost" in hosts
    hosts = own_hosts("0.0.0.0", ("My-Laptop.local", "[fe80::1]"))
    assert hosts is not None and {"my-laptop.local", "fe80::1"} <= hosts
    assert own_hosts("127.0.0.1", ("*",)) is None
    parser = build_parser()
    cfg, _ = config_from_args(parser.parse_args(
        ["serve", "--allow-host", "box.lan", "--allow-host", "10.0.0.5"]))
    assert cfg.allow_hosts == ("box.lan", "10.0.0.5")
    for bad in ("http://box.lan", "box.lan:8765", "10.0.0.5:8765", "[::1", "box lan", "",
                "a..b", "x" * 300):
        with pytest.raises(SystemExit):
            parser.parse_args(["serve", "--allow-host", bad])
