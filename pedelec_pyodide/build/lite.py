"""``pedelec lite DIR``: an offline JupyterLite site with pedelec-pyodide in its kernel.

The site is built clean every time (an incremental ``jupyter lite build`` was seen to
drop the local Pyodide URL silently) from a staging directory laid out here:

* ``static/pyodide/``: the Pyodide runtime from npm at the version the installed
  ``jupyterlite-pyodide-kernel`` pins (it must equal :data:`.runtime.PYODIDE_VERSION`),
  our runtime wheels and our own wheel (:func:`.provision.provision`), plus the
  pure-Python wheels the kernel loads at start, from PyPI (:mod:`.kernel` derives them:
  ``pyodide-kernel`` needs ``ipython`` and ``comm``, ...).
* ``static/pyodide/pyodide-lock.json``: rewritten from the npm lock by
  :func:`.lock.build_lock`, so every package it names is a file next to it, and
  ``micropip.install("pedelec-pyodide")`` / ``%pip install pedelec-pyodide`` find our
  wheel there (micropip searches the lock before any index).
* ``jupyter-lite.json``: the kernel's settings, ``pyodideUrl`` local and
  ``disablePyPIFallback`` on, and ``loadPyodideOptions.packages``: the packages the
  kernel would install one after the other at start (micropip, then piplite, then
  ipykernel, comm, pyodide-kernel, jedi, ipython through piplite) loaded by
  ``loadPyodide`` itself, from the lock, while the runtime boots (the kernel skips what
  that list names); ``files/``: the example notebook.
* the kernel's memory snapshot (:data:`.kernel.KERNEL_SNAPSHOT`, made under Node like the
  page's):
  the interpreter with the kernel's libraries imported (IPython's import is the larger
  part of a kernel's start). ``pyodideUrl`` then names ``pedelec-kernel.mjs`` (from
  ``web/``), Pyodide's module whose ``loadPyodide`` restores it (falling back to a boot).
  Without Node there is none, and the kernel boots the usual way.

CPython only. Needs the ``lite`` extra (:func:`.kernel.install_hint` says how).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .kernel import (
    KERNEL_SNAPSHOT,
    KERNEL_START,
    KernelInfo,
    kernel_info,
    start_wheels,
    startup_roots,
    wheel_name_of,
)
from .lock import build_lock, write_lock
from .notebook import EXAMPLE_NOTEBOOK, example_notebook
from .provision import cache_dir, provision
from .report import LiteError, Log, ProvisionError, tail
from .runtime import LOCK_NAME, npm_pyodide, python_of
from .snapshot import SnapshotError, ensure_snapshot
from .web import default_web_dir

__all__ = ["KERNEL_PLUGIN", "LiteError", "LiteResult", "build_site", "lite_config", "main"]

#: the settings key of the Pyodide kernel in ``jupyter-lite.json``
KERNEL_PLUGIN = "@jupyterlite/pyodide-kernel-extension:kernel"
_PYODIDE_DIR = "./static/pyodide/"
#: the kernel's Pyodide module: Pyodide's own, or the one that restores the snapshot
_PYODIDE_MODULE = "pyodide.mjs"
_KERNEL_MODULE = "pedelec-kernel.mjs"
#: beside the kernel's module in static/pyodide/ (from web/)
_KERNEL_MODULE_FILES = (_KERNEL_MODULE, "pyodide-snapshot.js")


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
    cache = cache if cache is not None else cache_dir()
    kernel = kernel_info()
    site_dir = Path(site_dir).resolve()
    _clear_output(site_dir)
    with tempfile.TemporaryDirectory(prefix="pedelec-lite-") as tmp:
        stage = Path(tmp)
        try:
            # no memory snapshot: the kernel boots Pyodide itself (its options are JSON)
            runtime = provision(stage / "static", repo=repo, cache=cache,
                                pyodide_src=pyodide_src, log=say, snapshot=False)
            npm_dir = pyodide_src or npm_pyodide(cache, say)
            npm_lock = json.loads((npm_dir / LOCK_NAME).read_text(encoding="utf-8"))
            python = python_of(npm_lock)
            roots = startup_roots(kernel.bundled_wheels, python)
        except ProvisionError as exc:
            raise LiteError(str(exc)) from None
        fetched = start_wheels(roots, npm_lock, set(runtime.wheels), cache / "wheels",
                               python, say)
        pyodide_dir = runtime.pyodide_dir
        kernel_wheels: dict[str, Path] = {
            name: runtime.wheels[name] for name in roots if name in runtime.wheels}
        for name, wheel in fetched.items():
            kernel_wheels[name] = pyodide_dir / wheel.name
            shutil.copy2(wheel, kernel_wheels[name])
        # the kernel's own wheels it installs at start (piplite, ipykernel, pyodide-kernel)
        # go into the lock too, so that loadPyodide loads them (KERNEL_START)
        for wheel in kernel.bundled_wheels:
            name = wheel_name_of(wheel)
            if name in KERNEL_START and name not in kernel_wheels:
                kernel_wheels[name] = pyodide_dir / wheel.name
                shutil.copy2(wheel, kernel_wheels[name])
        missing = [name for name in KERNEL_START
                   if name not in kernel_wheels and name not in runtime.wheels]
        if missing:
            raise LiteError(f"jupyterlite-pyodide-kernel {kernel.version} starts with "
                            f"{', '.join(missing)}, which the site has no wheel of")
        lock = build_lock(npm_lock, [*runtime.wheels.values(), *kernel_wheels.values()],
                          pyodide_dir)
        write_lock(runtime.lock_file, lock)
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
        site_dir=site_dir, pyodide_dir=result_dir, lock_file=result_dir / LOCK_NAME,
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
                        f"{' '.join(command)}\n{tail(done.stderr or done.stdout, 30)}")


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
