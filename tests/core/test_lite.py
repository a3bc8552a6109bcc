"""``pedelec lite``: the derived wheel set, the rewritten lock, the site's settings, the
example notebook, clear errors; the worker hint of handler errors; Core serving a site."""

from __future__ import annotations

import ast
import asyncio
import hashlib
import importlib
import json
import logging
import re
import subprocess
import sys
import types
import zipfile
from pathlib import Path
from typing import Any

import pytest
from corekit import config, run, running_core
from packaging.version import Version

from pedelec_pyodide import Session, browser, define_tool
from pedelec_pyodide.browser import explain_worker_error
from pedelec_pyodide.build import kernel, lite, runtime, wheels
from pedelec_pyodide.build.lock import build_lock
from pedelec_pyodide.build.notebook import example_notebook
from pedelec_pyodide.core.cli import build_parser

PY = "3.14.2"
PYTHON = Version(PY)


def make_wheel(directory: Path, name: str, version: str, requires: tuple[str, ...] = (),
               tag: str = "py3-none-any") -> Path:
    dist = name.replace("-", "_")
    path = directory / f"{dist}-{version}-{tag}.whl"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{dist}/__init__.py", "")
        archive.writestr(f"{dist}-{version}.dist-info/METADATA", metadata)
    return path


def npm_lock(**packages: tuple[str, str]) -> dict[str, Any]:
    return {
        "info": {"python": PY},
        "packages": {
            key: {"name": key, "version": version, "file_name": file_name, "depends": []}
            for key, (version, file_name) in packages.items()
        },
    }


def test_requirements_follow_markers_and_skip_extras(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path, "ipython", "9.12.0", (
        "decorator", "jedi>=0.18.1", 'colorama; sys_platform == "win32"',
        'pexpect>4.3; sys_platform != "win32" and sys_platform != "emscripten"',
        'typing_extensions>=4.6; python_version < "3.12"', 'pytest; extra == "test"',
        "Stack_Data",
    ))
    assert wheels.requirements_of(wheel, PYTHON) == ["decorator", "jedi", "stack-data"]


def test_startup_roots_are_the_preloads_and_what_the_kernel_wheels_need(tmp_path: Path) -> None:
    shipped = [
        make_wheel(tmp_path, "ipykernel", "6.9.2", ("pyodide-kernel",)),
        make_wheel(tmp_path, "pyodide-kernel", "0.8.6", ("comm", "ipython")),
        make_wheel(tmp_path, "piplite", "0.8.6"),
    ]
    assert kernel.startup_roots(shipped, PYTHON) == ["micropip", "comm", "ipython"]


def test_kernel_wheels_close_over_requirements_with_npm_versions(tmp_path: Path) -> None:
    cache = tmp_path / "wheels"
    cache.mkdir()
    make_wheel(cache, "ipython", "9.12.0", ("jedi", "traitlets"))
    make_wheel(cache, "ipython", "9.13.0")  # newer on PyPI, but the npm lock says 9.12.0
    make_wheel(cache, "jedi", "0.19.2", ("parso",))
    make_wheel(cache, "parso", "0.8.6")
    make_wheel(cache, "comm", "0.2.2")
    make_wheel(cache, "comm", "0.2.3")  # not in the lock: the newest we have
    lock = npm_lock(
        ipython=("9.12.0", "ipython-9.12.0-py3-none-any.whl"),
        jedi=("0.19.2", "jedi-0.19.2-py2.py3-none-any.whl"),
        parso=("0.8.6", "parso-0.8.6-py2.py3-none-any.whl"),
        traitlets=("5.14.3", "traitlets-5.14.3-py3-none-any.whl"),
    )
    found = kernel.start_wheels(["micropip", "comm", "ipython"], lock, {"micropip", "traitlets"},
                                cache, PYTHON, lambda _: None)
    assert {name: path.name for name, path in found.items()} == {
        "comm": "comm-0.2.3-py3-none-any.whl",
        "ipython": "ipython-9.12.0-py3-none-any.whl",
        "jedi": "jedi-0.19.2-py3-none-any.whl",
        "parso": "parso-0.8.6-py3-none-any.whl",
    }


def test_a_webassembly_only_requirement_is_a_clear_error(tmp_path: Path) -> None:
    lock = npm_lock(numpy=("2.2.0", "numpy-2.2.0-cp314-cp314-pyemscripten_2026_0_wasm32.whl"))
    with pytest.raises(lite.LiteError, match="numpy, which Pyodide builds for WebAssembly"):
        kernel.start_wheels(["numpy"], lock, set(), tmp_path, PYTHON, lambda _: None)


def test_a_failed_download_says_what_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                            ) -> None:
    def refuse(command: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(command, 1, "", "ERROR: No matching distribution")

    monkeypatch.setattr(subprocess, "run", refuse)
    with pytest.raises(lite.LiteError, match=r"`pip download` of comm failed \(exit 1\)"):
        kernel.start_wheels(["comm"], npm_lock(), set(), tmp_path, PYTHON, lambda _: None)


def test_the_lock_is_rewritten_from_the_npm_lock_for_the_files_we_have(tmp_path: Path) -> None:
    jedi = make_wheel(tmp_path, "jedi", "0.19.2", ("parso",))
    parso = make_wheel(tmp_path, "parso", "0.8.6")
    base = npm_lock(jedi=("0.19.2", "jedi-0.19.2-py2.py3-none-any.whl"),
                    numpy=("2.2.0", "numpy-2.2.0-cp314-cp314-pyemscripten_2026_0_wasm32.whl"))
    made = build_lock(base, [jedi, parso], tmp_path)
    assert made["info"] == {"python": PY}
    assert sorted(made["packages"]) == ["jedi", "parso"]  # numpy: no file, no entry
    entry = made["packages"]["jedi"]
    assert entry["file_name"] == jedi.name
    assert entry["sha256"] == hashlib.sha256(jedi.read_bytes()).hexdigest()
    assert entry["depends"] == ["parso"]


def test_site_settings_use_the_local_pyodide_without_pypi() -> None:
    """The kernel's start packages are loaded by loadPyodide (the kernel skips installing
    what loadPyodideOptions.packages names); with a snapshot, its module restores it."""
    def settings(**kwargs: bool) -> dict[str, object]:
        config = lite.lite_config(**kwargs)["jupyter-config-data"]
        found: dict[str, object] = config["litePluginSettings"][lite.KERNEL_PLUGIN]
        return found

    preload = {"packages": ["micropip", "piplite", "ipykernel", "comm", "pyodide-kernel",
                            "jedi", "ipython"]}
    assert settings() == {"pyodideUrl": "./static/pyodide/pyodide.mjs",
                          "disablePyPIFallback": True, "loadPyodideOptions": preload}
    assert settings(snapshot=True)["pyodideUrl"] == "./static/pyodide/pedelec-kernel.mjs"


def test_the_kernel_snapshot_holds_no_object_a_snapshot_cannot_keep() -> None:
    """What Node imports for the kernel's snapshot: its libraries, never the kernel, ipykernel
    (which imports the kernel), piplite or micropip: they hold JavaScript functions, and
    Pyodide refuses to make a snapshot then ("Can't serialize object")."""
    imports = set(kernel.KERNEL_SNAPSHOT.imports)
    assert "IPython" in imports
    assert not imports & {"pyodide_kernel", "ipykernel", "piplite", "micropip"}
    assert kernel.KERNEL_SNAPSHOT.encodings == ("gzip",)  # any static server, inflated in JS


def test_the_example_notebook_uses_the_public_api_and_parses() -> None:
    notebook = example_notebook()
    assert notebook["nbformat"] == 4
    code = ["".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "code"]
    assert code[0] == "%pip install pedelec-pyodide"
    assert "from pedelec_pyodide import ToolCall, connect, define_tool" in code[1]
    assert "await connect(CORE_URL" in code[2]
    # CORE_URL is Core's only when Core serves the site: the cell says so and shows the
    # other case as one edit of that line
    setup = code[1].splitlines()
    at = setup.index("CORE_URL = js.location.origin")
    said = "\n".join(setup[at - 4:at])
    assert "when Core serves this site" in said
    assert 'CORE_URL = "http://127.0.0.1:8765"' in said and "--allow-origin" in said
    for source in code[1:]:
        compile(source, "<cell>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    json.dumps(notebook)


def test_an_output_dir_that_is_not_a_site_is_never_removed(tmp_path: Path) -> None:
    (tmp_path / "precious.txt").write_text("keep me")
    with pytest.raises(lite.LiteError, match="not a JupyterLite site"):
        lite._clear_output(tmp_path)
    assert (tmp_path / "precious.txt").read_text() == "keep me"
    site = tmp_path / "site"
    site.mkdir()
    (site / "jupyter-lite.json").write_text("{}")
    lite._clear_output(site)
    assert not site.exists()


def test_missing_lite_extra_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(kernel.importlib.metadata, "version", missing)
    # from a checkout (as ./scripts/demo installs it): the exact command for this checkout
    root = Path(kernel.__file__).resolve().parents[2]
    monkeypatch.chdir(root)
    python = Path(sys.executable).absolute()
    shown = python.relative_to(root) if python.is_relative_to(root) else python
    with pytest.raises(lite.LiteError) as raised:
        kernel.kernel_info()
    assert str(raised.value) == ("jupyterlite-pyodide-kernel is not installed: install the "
                                 f"lite extra: {shown} -m pip install -e '.[lite]'")
    # elsewhere the paths are absolute
    monkeypatch.chdir("/")
    with pytest.raises(lite.LiteError, match=re.escape(f"-m pip install -e '{root}[lite]'")):
        kernel.kernel_info()


def test_the_kernel_pins_the_pyodide_we_provision(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("jupyterlite_pyodide_kernel")
    info = kernel.kernel_info()
    assert info.pyodide_version == runtime.PYODIDE_VERSION
    assert info.version.startswith("0.8.")
    assert any(w.name.startswith("pyodide_kernel-") for w in info.bundled_wheels)
    constants = importlib.import_module("jupyterlite_pyodide_kernel.constants")
    monkeypatch.setattr(constants, "PYODIDE_VERSION", "999.0.0")
    with pytest.raises(lite.LiteError, match=r"runs Pyodide 999\.0\.0, but this pedelec-pyodide"):
        kernel.kernel_info()


def test_cli_has_the_lite_command() -> None:
    args = build_parser().parse_args(["lite", "site"])
    assert (args.command, args.dir, args.pyodide) == ("lite", Path("site"), None)


def test_a_dom_error_in_a_worker_says_the_kernel_has_no_dom() -> None:
    @define_tool
    def title() -> str:
        """The page title."""
        raise AttributeError("document", name="document")

    session = Session([title], explain_error=explain_worker_error)
    result = asyncio.run(session.dispatch("title", {}))
    assert result["error"]["code"] == "TOOL_HANDLER_ERROR"
    assert result["error"]["message"] == (
        "AttributeError: document (the notebook kernel has no DOM: this Python runs in a "
        "Web Worker, where js.document and js.window do not exist)")
    assert explain_worker_error(AttributeError("x", name="x")) is None
    assert explain_worker_error(KeyError("document")) is None
    plain = asyncio.run(Session([title]).dispatch("title", {}))
    assert plain["error"]["message"] == "AttributeError: document"


def test_core_serves_a_site_with_the_types_jupyterlite_needs(tmp_path: Path) -> None:
    site = tmp_path / "site"
    files = {
        "static/pyodide/pyodide.mjs": "text/javascript",
        "static/pyodide/pyodide.asm.wasm": "application/wasm",
        "static/pyodide/micropip-0.11.1-py3-none-any.whl": "application/zip",
        "static/pyodide/pyodide-lock.json": "application/json",
        "extensions/x/static/remoteEntry.js": "text/javascript",
        "jupyter-lite.json": "application/json",
    }
    for name in [*files, "index.html", "files/pedelec-example.ipynb"]:
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text("{}")

    async def main() -> None:
        async with running_core(config(app_dir=site)) as core:
            for name, mime in files.items():
                response = await core.http.get(f"/{name}")
                assert response.status_code == 200, name
                assert response.headers["content-type"].split(";")[0] == mime, name
            notebook = await core.http.get("/files/pedelec-example.ipynb")
            assert notebook.status_code == 200 and notebook.json() == {}

    run(main())


class FakeConsole:
    """The JS console of a kernel's Web Worker: what reaches the browser's dev tools."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []
        self.error = lambda text: self.lines.append(("error", text))
        self.warn = lambda text: self.lines.append(("warn", text))
        self.info = lambda text: self.lines.append(("info", text))


def test_a_handler_error_in_a_kernel_goes_to_the_console_not_the_cell(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """In a notebook kernel sys.stdout/stderr are the output of the cell that ran last (as
    capsys makes them here). Once a session has connected (here: tried to, with a URL the
    fake `js` refuses), a handler's traceback goes to the JS console, once, and nothing to
    the kernel's streams; the agent still gets its error result."""
    console = FakeConsole()

    class URL:
        @staticmethod
        def new(url: str, base: str | None) -> None:
            raise TypeError("Invalid URL")

    fake_js = types.SimpleNamespace(console=console, URL=URL, location=None)
    monkeypatch.setitem(sys.modules, "js", fake_js)
    log = logging.getLogger("pedelec_pyodide")
    monkeypatch.setattr(log, "handlers", [])  # restored after the test, as is propagate
    monkeypatch.setattr(log, "propagate", True)
    # a kernel configures no logging: without pytest's capturing handler on the root
    # logger, Python's fallback handler would write records to sys.stderr
    monkeypatch.setattr(logging.getLogger(), "handlers", [])

    @define_tool
    def boom() -> str:
        """Fails."""
        return str(1 / 0)

    session = Session([boom])
    with pytest.raises(ValueError, match="Core URL must be"):
        asyncio.run(browser.connect("nowhere", session=session))
    for _ in range(2):  # a second connect() adds no second handler: each record once
        with pytest.raises(ValueError):
            asyncio.run(browser.connect("nowhere", session=session))
    result = asyncio.run(session.dispatch("boom", {}))
    assert result["error"]["message"] == "ZeroDivisionError: division by zero"
    assert capsys.readouterr() == ("", "")
    (line,) = console.lines
    assert line[0] == "error"
    assert line[1].startswith("pedelec: tool handler boom raised\nTraceback")
    assert line[1].endswith("ZeroDivisionError: division by zero")
