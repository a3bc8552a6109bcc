"""``pedelec lite DIR``: an offline JupyterLite site with pedelec-pyodide in its kernel.

The site is built clean every time (an incremental ``jupyter lite build`` was seen to
drop the local Pyodide URL silently) from a staging directory laid out here:

* ``static/pyodide/``: the Pyodide runtime from npm at the version the installed
  ``jupyterlite-pyodide-kernel`` pins (it must equal :data:`provision.PYODIDE_VERSION`),
  our runtime wheels and our own wheel (:func:`provision.provision`), plus the
  pure-Python wheels the kernel loads at start, from PyPI. Those are derived, not listed
  here: ``micropip`` (which the kernel loads before anything else) and the requirements
  of the wheels the kernel ships in its own piplite index (``pyodide-kernel`` needs
  ``ipython`` and ``comm``, ...), closed over their own requirements; versions are the
  npm lock's where it has the package, else the newest on PyPI.
* ``static/pyodide/pyodide-lock.json``: rewritten from the npm lock by
  :func:`provision.build_lock`, so every package it names is a file next to it, and
  ``micropip.install("pedelec-pyodide")`` / ``%pip install pedelec-pyodide`` find our
  wheel there (micropip searches the lock before any index).
* ``jupyter-lite.json``: the kernel's settings, ``pyodideUrl`` local and
  ``disablePyPIFallback`` on, and ``loadPyodideOptions.packages``: the packages the
  kernel would install one after the other at start (micropip, then piplite, then
  ipykernel, comm, pyodide-kernel, jedi, ipython through piplite) loaded by
  ``loadPyodide`` itself, from the lock, while the runtime boots (the kernel skips what
  that list names); ``files/``: the example notebook.
* the kernel's memory snapshot (:data:`KERNEL_SNAPSHOT`, made under Node like the page's):
  the interpreter with the kernel's libraries imported (IPython's import is the larger
  part of a kernel's start). ``pyodideUrl`` then names ``pedelec-kernel.mjs`` (from
  ``web/``), Pyodide's module whose ``loadPyodide`` restores it (falling back to a boot).
  Without Node there is none, and the kernel boots the usual way.

CPython only. Needs the ``lite`` extra (:func:`install_hint` says how).
"""

from __future__ import annotations

import dataclasses
import email.parser
import importlib
import importlib.metadata
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import PedelecError
from . import provision
from .config import default_web_dir
from .provision import ProvisionError, canonical_name, evaluate_marker
from .snapshot import Recipe, SnapshotError, ensure_snapshot

__all__ = [
    "EXAMPLE_NOTEBOOK",
    "KERNEL_PLUGIN",
    "KERNEL_SNAPSHOT",
    "KernelInfo",
    "LiteError",
    "LiteResult",
    "build_site",
    "example_notebook",
    "install_hint",
    "kernel_info",
    "lite_config",
    "main",
    "requirements_of",
    "startup_roots",
]

#: the settings key of the Pyodide kernel in ``jupyter-lite.json``
KERNEL_PLUGIN = "@jupyterlite/pyodide-kernel-extension:kernel"
#: the example notebook's name in the site's files
EXAMPLE_NOTEBOOK = "pedelec-example.ipynb"
#: what the kernel loads with ``loadPackage`` before its piplite installs
_KERNEL_PRELOADS = ("micropip",)
#: what the kernel installs at start, in its order (its worker: micropip, then piplite,
#: then these through piplite), each skipped when ``loadPyodideOptions.packages`` names it
KERNEL_START = ("micropip", "piplite", "ipykernel", "comm", "pyodide-kernel", "jedi",
                "ipython")
_SERIES = "0.8."
_PYODIDE_DIR = "./static/pyodide/"
#: the kernel's Pyodide module: Pyodide's own, or the one that restores the snapshot
_PYODIDE_MODULE = "pyodide.mjs"
_KERNEL_MODULE = "pedelec-kernel.mjs"
#: the kernel's libraries, imported in its snapshot: not the kernel itself, nor
#: ipykernel, piplite or micropip, which hold JavaScript objects a snapshot cannot keep
KERNEL_SNAPSHOT = Recipe(
    whose="notebook kernel's", name="pedelec-kernel-snapshot.bin",
    manifest="pedelec-kernel-snapshot.json", roots=("ipython", "jedi", "comm"),
    imports=("IPython", "jedi", "comm", "traitlets", "pygments"), encodings=("gzip",))
#: beside the kernel's module in static/pyodide/ (from web/)
_KERNEL_MODULE_FILES = (_KERNEL_MODULE, "pyodide-snapshot.js")


def install_hint() -> str:
    """The command that installs the lite extra into the Python running this. From a
    checkout (an editable install, as ``./scripts/demo`` makes) the exact command, paths
    relative to the checkout when run in it; else the extra's name (no index serves the package:
    install it the way pedelec-pyodide was installed)."""
    root = Path(__file__).resolve().parents[2]
    if not (root / "pyproject.toml").is_file():
        return ("install the lite extra into this Python, the way pedelec-pyodide was "
                "installed: pip install '/path/to/pedelec-pyodide-checkout[lite]', or "
                "pip install 'pedelec-pyodide[lite] @ file:///path/to/pedelec_pyodide-"
                "<version>-py3-none-any.whl'")

    python, here = Path(sys.executable).absolute(), Path.cwd().resolve() == root
    if here and python.is_relative_to(root):
        python = python.relative_to(root)
    return f"install the lite extra: {python} -m pip install -e '{'.' if here else root}[lite]'"

Log = provision.Log


class LiteError(PedelecError, RuntimeError):
    """The site cannot be built; the message says what is missing and how to get it."""


@dataclasses.dataclass(frozen=True)
class KernelInfo:
    """The installed ``jupyterlite-pyodide-kernel``: its version, its Pyodide, and the
    wheels it ships in its own piplite index (installed at kernel start)."""

    version: str
    core_version: str
    pyodide_version: str
    bundled_wheels: tuple[Path, ...]


@dataclasses.dataclass(frozen=True)
class LiteResult:
    """What :func:`build_site` made."""

    site_dir: Path
    pyodide_dir: Path
    lock_file: Path
    notebook: Path
    #: canonical name -> wheel in ``pyodide_dir`` of every package the kernel loads at start
    kernel_wheels: dict[str, Path]
    kernel: KernelInfo
    seconds: float


# ---------------------------------------------------------------------- the kernel


def _distribution_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        raise LiteError(f"{name} is not installed: {install_hint()}") from None


def _kernel_pypi_dir() -> Path:
    """The piplite index the kernel's labextension ships (``static/pypi/all.json``)."""
    paths = importlib.import_module("jupyter_core.paths")
    constants = importlib.import_module("jupyterlite_pyodide_kernel.constants")
    name = str(constants.PYODIDE_KERNEL_NPM_NAME)
    for root in paths.jupyter_path("labextensions"):
        candidate = Path(root) / name / "static" / "pypi"
        if (candidate / "all.json").is_file():
            return candidate
    raise LiteError(
        f"the labextension {name} (with static/pypi/all.json) is not installed in any of "
        f"{paths.jupyter_path('labextensions')}: reinstall jupyterlite-pyodide-kernel"
    )


def kernel_info() -> KernelInfo:
    """Check that jupyterlite-core and jupyterlite-pyodide-kernel 0.8.x are installed and
    that the kernel's Pyodide is the one :mod:`provision` provisions."""
    version = _distribution_version("jupyterlite-pyodide-kernel")
    core_version = _distribution_version("jupyterlite-core")
    for dist, found in (("jupyterlite-pyodide-kernel", version),
                        ("jupyterlite-core", core_version)):
        if not found.startswith(_SERIES):
            raise LiteError(f"{dist} {found} is installed, {_SERIES}x is needed: "
                            f"{install_hint()}")
    constants = importlib.import_module("jupyterlite_pyodide_kernel.constants")
    pyodide_version = str(constants.PYODIDE_VERSION)
    if pyodide_version != provision.PYODIDE_VERSION:
        raise LiteError(
            f"jupyterlite-pyodide-kernel {version} runs Pyodide {pyodide_version}, but this "
            f"pedelec-pyodide provisions Pyodide {provision.PYODIDE_VERSION} for pages and "
            "notebooks alike: install a kernel that pins it (pip install "
            f"'pedelec-pyodide[lite]' picks a matching one) or upgrade pedelec-pyodide"
        )
    bundled = tuple(sorted(_kernel_pypi_dir().glob("*.whl")))
    return KernelInfo(version, core_version, pyodide_version, bundled)


# ---------------------------------------------------------------------- the wheels


def requirements_of(wheel: Path, python_full_version: str) -> list[str]:
    """Canonical names a wheel requires on Pyodide (markers evaluated, no extras)."""
    with zipfile.ZipFile(wheel) as archive:
        members = [m for m in archive.namelist()
                   if m.count("/") == 1 and m.endswith(".dist-info/METADATA")]
        if not members:
            raise LiteError(f"{wheel} has no .dist-info/METADATA: not a wheel?")
        text = archive.read(members[0]).decode("utf-8")
    metadata = email.parser.HeaderParser().parsestr(text)
    names: list[str] = []
    for requirement in metadata.get_all("Requires-Dist") or []:
        spec, _, marker = str(requirement).partition(";")
        m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", spec)
        if m is None or (marker.strip() and not evaluate_marker(marker, python_full_version)):
            continue
        name = canonical_name(m.group(1))
        if name not in names:
            names.append(name)
    return names


def startup_roots(bundled_wheels: Sequence[Path], python_full_version: str) -> list[str]:
    """What the kernel needs from the lock at start: its preloads, and the requirements
    of the wheels it installs from its own index that are not in that index."""
    shipped = {canonical_name(w.name.split("-", 1)[0]) for w in bundled_wheels}
    roots = list(_KERNEL_PRELOADS)
    for wheel in bundled_wheels:
        for name in requirements_of(wheel, python_full_version):
            if name not in shipped and name not in roots:
                roots.append(name)
    return roots


def _cached_any(directory: Path, name: str) -> Path | None:
    """The newest cached ``py3-none-any``-style wheel of ``name``, if any."""
    found: list[tuple[tuple[int, ...], Path]] = []
    for path in directory.glob("*.whl") if directory.is_dir() else ():
        parsed = provision._parse_wheel_name(path.name)
        if parsed and parsed[0] == name and parsed[2:] == ("none", "any"):
            found.append((provision._version_key(parsed[1]), path))
    return max(found)[1] if found else None


def _fetch_newest(names: Sequence[str], directory: Path, log: Log) -> dict[str, Path]:
    """Wheels for names the npm lock does not pin: the cached one, else PyPI's newest."""
    missing = [n for n in names if _cached_any(directory, n) is None]
    if missing:
        try:
            provision.pip_download(missing, directory, log)
        except ProvisionError as exc:
            raise LiteError(str(exc)) from None
    found: dict[str, Path] = {}
    for name in names:
        path = _cached_any(directory, name)
        if path is None:
            raise LiteError(f"PyPI has no pure-Python wheel (py3-none-any) of {name}: "
                            "the Pyodide kernel cannot load it")
        found[name] = path
    return found


def _kernel_wheels(
    roots: Sequence[str], npm_lock: dict[str, Any], have: set[str], directory: Path,
    python_full_version: str, log: Log,
) -> dict[str, Path]:
    """The roots and their requirements, level by level: npm lock versions, PyPI wheels."""
    packages: dict[str, Any] = npm_lock.get("packages", {})
    wheels: dict[str, Path] = {}
    level = [n for n in dict.fromkeys(roots) if n not in have]
    while level:
        pins: dict[str, str] = {}
        newest: list[str] = []
        for name in level:
            entry = packages.get(name)
            if entry is None:
                newest.append(name)
            elif str(entry.get("file_name", "")).endswith("-none-any.whl"):
                pins[name] = f"{entry['name']}=={entry['version']}"
            else:
                raise LiteError(
                    f"the kernel needs {name}, which Pyodide builds for WebAssembly "
                    f"({entry.get('file_name')}); PyPI has no such wheel to serve offline"
                )
        try:
            fetched = provision._download_wheels(list(pins.values()), directory, log)
        except ProvisionError as exc:
            raise LiteError(str(exc)) from None
        found = dict(zip(pins, fetched, strict=True))
        found.update(_fetch_newest(newest, directory, log))
        wheels.update(found)
        seen = have | set(wheels)
        following: list[str] = []
        for wheel in found.values():
            for name in requirements_of(wheel, python_full_version):
                if name not in seen and name not in following:
                    following.append(name)
        level = following
    return wheels


# ------------------------------------------------------------------- the site files


def lite_config(*, snapshot: bool = False) -> dict[str, Any]:
    """``jupyter-lite.json``: the local Pyodide (restoring the kernel's snapshot, with one),
    no fallback to PyPI, the kernel's start packages loaded while Pyodide boots."""
    module = _KERNEL_MODULE if snapshot else _PYODIDE_MODULE
    return {
        "jupyter-lite-schema-version": 0,
        "jupyter-config-data": {
            "appName": "pedelec-pyodide",
            "litePluginSettings": {
                KERNEL_PLUGIN: {"pyodideUrl": _PYODIDE_DIR + module,
                                "disablePyPIFallback": True,
                                "loadPyodideOptions": {"packages": list(KERNEL_START)}},
            },
        },
    }


_CELLS: tuple[tuple[str, str], ...] = (
    ("markdown", """\
# pedelec-pyodide in a notebook

The tools below are Python functions over this notebook's state (a shopping list).
`connect` registers them with Core, which serves this site: the agent (Core's offline
agent, or anyone with the admin token through the control API) calls them, and they run
here, in the Pyodide kernel.

The kernel runs in a **Web Worker**: there is no DOM (`js.document` does not exist), so
a tool that touches it gets a `TOOL_HANDLER_ERROR` saying so."""),
    ("code", "%pip install pedelec-pyodide"),
    ("code", """\
import js
from pedelec_pyodide import ToolCall, connect, define_tool

# Core's URL. This works when Core serves this site (`pedelec serve --app SITE`): the
# same origin (js.location is the kernel worker's URL). If the site is served elsewhere,
# put Core's URL here instead, e.g. CORE_URL = "http://127.0.0.1:8765", and start Core
# with --allow-origin set to this site's origin.
CORE_URL = js.location.origin
shopping = []
log = []


@define_tool
def add_item(name: str, quantity: int = 1) -> list:
    \"\"\"Add an item to the notebook's shopping list; returns the list.\"\"\"
    shopping.append({"name": name, "quantity": quantity})
    return shopping


@define_tool
def list_items() -> list:
    \"\"\"The notebook's shopping list.\"\"\"
    return shopping


@define_tool
def page_title() -> str:
    \"\"\"The page's title (needs the DOM, which a notebook kernel has not).\"\"\"
    return js.document.title


def record(event):
    if isinstance(event, ToolCall):
        log.append(f"{event.tool} {event.args} -> {event.result} [{event.handled_by}]")


def show_log():
    print(f"{len(log)} tool call(s)")
    for line in log:
        print(line)"""),
    ("code", """\
session = await connect(CORE_URL, tools=[add_item, list_items, page_title])
session.subscribe(record)
print("session:", session.session_id, session.state.value)"""),
    ("code", """\
reply = await session.send_text('/call add_item {"name": "apples", "quantity": 3}')
print("agent:", reply)"""),
    ("code", """\
result = await session.dispatch("page_title", {})
print("page_title:", result["error"]["code"], "-", result["error"]["message"])"""),
    ("code", """\
print("shopping:", shopping)
show_log()"""),
)


def example_notebook() -> dict[str, Any]:
    """The example notebook (nbformat 4) as a dict."""
    cells: list[dict[str, Any]] = []
    for index, (kind, source) in enumerate(_CELLS):
        cell: dict[str, Any] = {
            "cell_type": kind, "id": f"pedelec-{index}", "metadata": {},
            "source": source.splitlines(keepends=True),
        }
        if kind == "code":
            cell.update(execution_count=None, outputs=[])
        cells.append(cell)
    return {
        "cells": cells,
        "metadata": {
            "kernelspec": {"display_name": "Python (Pyodide)", "language": "python",
                           "name": "python"},
            "language_info": {"name": "python"},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")


def _clear_output(site: Path) -> None:
    """Remove a previous site (never a directory that is something else)."""
    if not site.exists():
        return
    if not site.is_dir():
        raise LiteError(f"{site} exists and is not a directory")
    if any(site.iterdir()) and not (site / "jupyter-lite.json").is_file():
        raise LiteError(f"{site} is not empty and is not a JupyterLite site: choose another "
                        "directory (it is replaced on every build)")
    shutil.rmtree(site)


# ------------------------------------------------------------------------ the build


def build_site(
    site_dir: Path, *, cache: Path | None = None, repo: Path | None = None,
    pyodide_src: Path | None = None, log: Log | None = None,
) -> LiteResult:
    """Build the site into ``site_dir`` (replacing a previous site there), offline once
    the cache holds the runtime and the wheels. ``pyodide_src``: an npm ``pyodide``
    package directory to use instead of npm. Raises :class:`LiteError`."""
    say = log or _default_log
    started = time.monotonic()
    cache = cache if cache is not None else provision.cache_dir()
    kernel = kernel_info()
    site_dir = Path(site_dir).resolve()
    _clear_output(site_dir)
    with tempfile.TemporaryDirectory(prefix="pedelec-lite-") as tmp:
        stage = Path(tmp)
        try:
            # no memory snapshot: the kernel boots Pyodide itself (its options are JSON)
            runtime = provision.provision(stage / "static", repo=repo, cache=cache,
                                          pyodide_src=pyodide_src, log=say, snapshot=False)
            npm_dir = pyodide_src or provision._npm_pyodide(cache, say)
        except ProvisionError as exc:
            raise LiteError(str(exc)) from None
        npm_lock = json.loads((npm_dir / "pyodide-lock.json").read_text(encoding="utf-8"))
        python_full = str(npm_lock.get("info", {}).get("python") or provision.PYTHON_VERSION)
        roots = startup_roots(kernel.bundled_wheels, python_full)
        fetched = _kernel_wheels(roots, npm_lock, set(runtime.wheels), cache / "wheels",
                                 python_full, say)
        pyodide_dir = runtime.pyodide_dir
        kernel_wheels = {name: runtime.wheels[name] for name in roots if name in runtime.wheels}
        for name, wheel in fetched.items():
            kernel_wheels[name] = pyodide_dir / wheel.name
            shutil.copy2(wheel, kernel_wheels[name])
        # the kernel's own wheels it installs at start (piplite, ipykernel, pyodide-kernel)
        # go into the lock too, so that loadPyodide loads them (KERNEL_START)
        for wheel in kernel.bundled_wheels:
            name = canonical_name(wheel.name.split("-", 1)[0])
            if name in KERNEL_START and name not in kernel_wheels:
                kernel_wheels[name] = pyodide_dir / wheel.name
                shutil.copy2(wheel, kernel_wheels[name])
        missing = [name for name in KERNEL_START
                   if name not in kernel_wheels and name not in runtime.wheels]
        if missing:
            raise LiteError(f"jupyterlite-pyodide-kernel {kernel.version} starts with "
                            f"{', '.join(missing)}, which the site has no wheel of")
        lock = provision.build_lock(npm_lock, [*runtime.wheels.values(),
                                               *kernel_wheels.values()], pyodide_dir)
        provision.write_lock(runtime.lock_file, lock)
        say(f"lock: {len(lock['packages'])} packages, {len(kernel_wheels)} for the kernel")
        snapshot = _kernel_snapshot(pyodide_dir, lock, cache, say)
        _write_json(stage / "jupyter-lite.json", lite_config(snapshot=snapshot))
        _write_json(stage / "files" / EXAMPLE_NOTEBOOK, example_notebook())
        _jupyter_lite_build(stage, site_dir, say)
        if snapshot:  # the build points pyodideUrl at its pyodide.mjs, whatever it was
            _use_kernel_module(site_dir / "jupyter-lite.json")
    result_dir = site_dir / "static" / "pyodide"
    _check_site(site_dir, result_dir)
    seconds = time.monotonic() - started
    say(f"site ready in {seconds:.1f}s: {site_dir}")
    return LiteResult(
        site_dir=site_dir, pyodide_dir=result_dir, lock_file=result_dir / "pyodide-lock.json",
        notebook=site_dir / "files" / EXAMPLE_NOTEBOOK,
        kernel_wheels={n: result_dir / w.name for n, w in kernel_wheels.items()},
        kernel=kernel, seconds=seconds,
    )


def _kernel_snapshot(pyodide_dir: Path, lock: dict[str, Any], cache: Path, log: Log) -> bool:
    """Put the kernel's memory snapshot and the module that restores it next to the
    runtime; False (a note said why) when there can be none: the kernel boots."""
    web = default_web_dir()
    try:
        modules = [web / name for name in _KERNEL_MODULE_FILES] if web is not None else []
        if not modules or not all(path.is_file() for path in modules):
            raise SnapshotError(f"web/{_KERNEL_MODULE} was not found")
        ensure_snapshot(pyodide_dir, lock, web_dir=web, cache=cache, log=log,
                        recipe=KERNEL_SNAPSHOT)
    except SnapshotError as exc:
        log(f"note: no memory snapshot for the notebook kernel, it starts without one "
            f"(slower): {exc}")
        return False
    for path in modules:
        shutil.copy2(path, pyodide_dir / path.name)
    return True


def _use_kernel_module(config_file: Path) -> None:
    """Point the built site's kernel at the module that restores its snapshot."""
    config = json.loads(config_file.read_text(encoding="utf-8"))
    settings = config["jupyter-config-data"]["litePluginSettings"][KERNEL_PLUGIN]
    settings["pyodideUrl"] = _PYODIDE_DIR + _KERNEL_MODULE
    _write_json(config_file, config)


def _jupyter_lite_build(stage: Path, site_dir: Path, log: Log) -> None:
    command = [
        sys.executable, "-m", "jupyterlite_core", "build", "--lite-dir", str(stage),
        "--output-dir", str(site_dir), "--contents", str(stage / "files"),
        "--apps", "lab", "--apps", "notebooks", "--no-sourcemaps", "--no-libarchive",
    ]  # fmt: skip
    log("running jupyter lite build (clean: a fresh lite dir and build state)")
    # cwd=stage: the build state (.jupyterlite.doit.db) lives and dies with the stage
    done = subprocess.run(command, cwd=stage, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise LiteError(f"`jupyter lite build` failed (exit {done.returncode}).\ncommand: "
                        f"{' '.join(command)}\n{provision._tail(done.stderr or done.stdout, 30)}")


def _check_site(site_dir: Path, pyodide_dir: Path) -> None:
    """The built site must use the local Pyodide, without PyPI: say so if it does not."""
    config = json.loads((site_dir / "jupyter-lite.json").read_text(encoding="utf-8"))
    settings = config.get("jupyter-config-data", {}).get("litePluginSettings", {})
    kernel = settings.get(KERNEL_PLUGIN, {})
    problems = []
    module = str(kernel.get("pyodideUrl")).removeprefix(_PYODIDE_DIR)
    if module not in (_PYODIDE_MODULE, _KERNEL_MODULE) or not (pyodide_dir / module).is_file():
        problems.append(f"pyodideUrl is {kernel.get('pyodideUrl')!r}, not a module in "
                        f"{_PYODIDE_DIR}")
    if kernel.get("disablePyPIFallback") is not True:
        problems.append("disablePyPIFallback is not set")
    for name in ("pyodide.mjs", "pyodide.asm.wasm", "pyodide-lock.json"):
        if not (pyodide_dir / name).is_file():
            problems.append(f"{pyodide_dir / name} is missing")
    if not (site_dir / "files" / EXAMPLE_NOTEBOOK).is_file():
        problems.append(f"the example notebook files/{EXAMPLE_NOTEBOOK} is missing")
    if problems:
        raise LiteError(f"the built site at {site_dir} is not offline-ready: "
                        + "; ".join(problems))


def _default_log(message: str) -> None:
    print(f"pedelec lite: {message}", file=sys.stderr, flush=True)


def main(site_dir: Path, pyodide_src: Path | None = None) -> int:
    """``pedelec lite DIR``: build, print the directory and how to serve it."""
    try:
        result = build_site(site_dir, pyodide_src=pyodide_src)
    except LiteError as exc:
        print(f"pedelec lite: error: {exc}", file=sys.stderr)
        return 1
    print(result.site_dir)
    print(f"serve it with: pedelec serve --app {result.site_dir} --pyodide "
          f"{result.pyodide_dir}", file=sys.stderr)
    print(f"then open /notebooks/index.html?path={EXAMPLE_NOTEBOOK}", file=sys.stderr)
    return 0
