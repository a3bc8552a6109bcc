"""Pages on other origins (issue 14), against a real Core on loopback.

Core's own files under ``/pedelec/`` (the loader, Pyodide, our lock and wheels) are public:
every answer, errors included, carries ``Access-Control-Allow-Origin: *`` and a preflight
is answered; the app at ``/`` and the API are not made public. The bridge keeps its Origin
allow-list, and ``/pedelec/v1/origin-check`` tells a page whether it will be let in.
The same in Chromium, from a page on another origin: tests/e2e/other-origin.spec.js.
"""

from __future__ import annotations

import logging
import sys
import types
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import httpx
import pytest
from corekit import config, run, running_core

from pedelec_pyodide.browser import CoreUnreachableError, OriginRefusedError, connect

REPO = Path(__file__).resolve().parent.parent.parent
PAGE_ORIGIN = "http://127.0.0.1:9"


def test_cores_own_files_are_public_and_the_app_is_not(tmp_path: Path) -> None:
    pyodide_dir = tmp_path / "pyodide"
    pyodide_dir.mkdir()
    (pyodide_dir / "pyodide.mjs").write_text("export const loadPyodide = null;")
    (pyodide_dir / "pyodide-lock.json").write_text("{}")
    app_dir = tmp_path / "app"
    app_dir.mkdir()
    (app_dir / "index.html").write_text("app")
    cfg = config(web_dir=REPO / "web", pyodide_dir=pyodide_dir, app_dir=app_dir)

    async def main() -> None:
        async with running_core(cfg) as core:
            origin = {"Origin": PAGE_ORIGIN}
            for path, status in [("/pedelec/pedelec-pyodide.js", 200),
                                 ("/pedelec/pedelec-pyodide.classic.js", 200),
                                 ("/pedelec/pyodide/pyodide.mjs", 200),
                                 ("/pedelec/pyodide/pyodide-lock.json", 200),
                                 ("/pedelec/pyodide/missing.whl", 404),
                                 ("/pedelec/missing.js", 404)]:
                response = await core.http.get(path, headers=origin)
                assert response.status_code == status, path
                assert response.headers["access-control-allow-origin"] == "*", path
                assert response.headers["cross-origin-resource-policy"] == "cross-origin"
                preflight = await core.http.options(path, headers={
                    **origin, "Access-Control-Request-Method": "GET",
                    "Access-Control-Request-Headers": "range"})
                assert preflight.status_code == 204, path
                assert preflight.headers["access-control-allow-origin"] == "*"
                assert "GET" in preflight.headers["access-control-allow-methods"]
                assert preflight.headers["access-control-allow-headers"] == "range"
            # a wrong method on a public file is still refused, readably
            response = await core.http.post("/pedelec/pedelec-pyodide.js", headers=origin)
            assert response.status_code == 405
            assert response.headers["access-control-allow-origin"] == "*"
            # the app and the API stay as they were
            for path in ("/", "/index.html", "/pedelec/v1/health", "/pedelec/v1/sessions"):
                response = await core.http.get(path, headers=origin)
                assert response.status_code == 200, path
                assert "access-control-allow-origin" not in response.headers, path

    run(main())


def test_the_runtime_being_provisioned_is_a_readable_503() -> None:
    async def main() -> None:
        async with running_core(config(pyodide_dir=None)) as core:
            response = await core.http.get("/pedelec/pyodide/pyodide.mjs",
                                           headers={"Origin": PAGE_ORIGIN})
            assert response.status_code == 503
            assert response.headers["access-control-allow-origin"] == "*"
            assert "Pyodide runtime missing" in response.text

    run(main())


def test_origin_check_says_whether_the_bridge_takes_the_origin() -> None:
    async def main() -> None:
        # an allowed origin is compared as bridge.normal_origin writes both
        for allowed, expected in [((), False), ((PAGE_ORIGIN,), True), (("*",), True),
                                  ((PAGE_ORIGIN.upper() + "/",), True)]:
            async with running_core(config(allow_origins=allowed)) as core:
                response = await core.http.get("/pedelec/v1/origin-check",
                                               headers={"Origin": PAGE_ORIGIN,
                                                        "Authorization": ""})
                assert response.status_code == 200
                assert response.json() == {"allowed": expected}
                assert response.headers["access-control-allow-origin"] == "*"
                assert response.headers["cache-control"] == "no-store"
                # Core's own origin is always allowed
                own = f"http://127.0.0.1:{core.port}"
                response = await core.http.get("/pedelec/v1/origin-check",
                                               headers={"Origin": own})
                assert response.json() == {"allowed": True}

    run(main())


class FakeScope:
    """What `js` is to Python in a page or a JupyterLite kernel on PAGE_ORIGIN, as far as
    connect() uses it before the WebSocket: `location`, `URL`, `fetch` (here a real HTTP
    request with the page's Origin, as the browser sends it), `console`; and a
    `WebSocket` that cannot be opened (this test stops before the bridge)."""

    def __init__(self, origin: str) -> None:
        self.location = types.SimpleNamespace(origin=origin, href=f"{origin}/lab/index.html")
        self.console = types.SimpleNamespace(error=print, warn=print, info=print)
        self.fetched: list[str] = []
        self.URL = types.SimpleNamespace(new=self._url)
        self.WebSocket = types.SimpleNamespace(new=self._no_socket)

    @staticmethod
    def _url(url: str, base: str | None = None) -> types.SimpleNamespace:
        parts = urlsplit(urljoin(base or "", url))
        return types.SimpleNamespace(
            protocol=f"{parts.scheme}:", host=parts.netloc, pathname=parts.path or "/",
            search=f"?{parts.query}" if parts.query else "",
            origin=f"{parts.scheme}://{parts.netloc}")

    @staticmethod
    def _no_socket(url: str) -> None:
        raise RuntimeError("no WebSocket in this test")

    async def fetch(self, url: str) -> types.SimpleNamespace:
        self.fetched.append(url)
        async with httpx.AsyncClient() as client:
            response = await client.get(url, headers={"Origin": self.location.origin})

        async def text() -> str:
            return response.text

        return types.SimpleNamespace(ok=response.is_success, text=text)


def test_python_connect_from_a_refused_origin_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """`pedelec_pyodide.connect()` in a page or notebook on another origin asks Core's
    origin check first: refused, it fails naming the origin and --allow-origin (a refused
    WebSocket says only "closed"); allowed, it goes on to the WebSocket."""
    scope = FakeScope(PAGE_ORIGIN)
    monkeypatch.setitem(sys.modules, "js", scope)
    ffi = types.ModuleType("pyodide.ffi")
    ffi.create_proxy = lambda fn: fn  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pyodide", types.ModuleType("pyodide"))
    monkeypatch.setitem(sys.modules, "pyodide.ffi", ffi)
    log = logging.getLogger("pedelec_pyodide")  # connect() sends it to the console
    monkeypatch.setattr(log, "handlers", [])
    monkeypatch.setattr(log, "propagate", True)

    async def main() -> None:
        async with running_core() as core:
            url = str(core.http.base_url)
            with pytest.raises(OriginRefusedError) as refused:
                await connect(url, storage=False)
            assert str(refused.value) == (
                f"Core at {url.rstrip('/')} does not let pages from {PAGE_ORIGIN} open a "
                f"session: start it with --allow-origin {PAGE_ORIGIN}")
            assert scope.fetched == [f"{url.rstrip('/')}/pedelec/v1/origin-check"]
        async with running_core(config(allow_origins=(PAGE_ORIGIN,))) as core:
            with pytest.raises(CoreUnreachableError, match="no WebSocket in this test") as raised:
                await connect(str(core.http.base_url), storage=False)
            assert not isinstance(raised.value, OriginRefusedError)

    run(main())
