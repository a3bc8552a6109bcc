"""The Pyodide runtime: the npm package ``pyodide@PYODIDE_VERSION`` (installed with the
user's own ``npm`` into the cache, or an unpacked one given), copied where it is served, and
the Python version it runs, read from its lock."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from .report import Log, ProvisionError, tail

__all__ = [
    "LOCK_NAME",
    "NPM_HINT",
    "PYODIDE_VERSION",
    "install_runtime",
    "is_pyodide_dir",
    "npm_pyodide",
    "pyodide_version_of",
    "python_of",
    "sync_file",
]

#: The npm ``pyodide`` version (the one ``jupyterlite-pyodide-kernel`` pins).
PYODIDE_VERSION = "314.0.6"
LOCK_NAME = "pyodide-lock.json"
# right wherever provisioning runs: `pedelec serve`/`demo` (whose --pyodide takes a
# provisioned directory) and the provision CLI (whose --pyodide takes the npm package)
NPM_HINT = (
    "npm (Node.js >= 18) is needed once to fetch the Pyodide runtime: install Node.js "
    "(e.g. `apt install nodejs npm`, or https://nodejs.org). Without npm here: run "
    "`python -m pedelec_pyodide.build.provision OUT` where npm is, copy OUT/pyodide here and "
    "start Core with `pedelec serve --pyodide OUT/pyodide`; or, with the npm package "
    f"pyodide@{PYODIDE_VERSION} unpacked here (its node_modules/pyodide), run `python -m "
    "pedelec_pyodide.build.provision OUT --pyodide node_modules/pyodide` and the same "
    "`pedelec serve --pyodide OUT/pyodide`"
)


def python_of(lock: Mapping[str, Any]) -> Version:
    """The CPython inside the runtime whose ``pyodide-lock.json`` is ``lock`` (its
    ``info.python``, e.g. 3.14.2): wheels are fetched and their markers evaluated for it."""
    found = lock.get("info", {}).get("python")
    try:
        return Version(str(found))
    except InvalidVersion:
        raise ProvisionError(
            f"the Pyodide lock's info.python is {found!r}, not a Python version: is it the "
            f"{LOCK_NAME} of a Pyodide runtime?"
        ) from None


def is_pyodide_dir(path: Path) -> bool:
    return all((path / f).is_file() for f in ("pyodide.mjs", "pyodide.asm.wasm", LOCK_NAME))


def pyodide_version_of(path: Path) -> str | None:
    """The version in the npm package's ``package.json`` at ``path``, or None."""
    try:
        data = json.loads((path / "package.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    version = data.get("version") if isinstance(data, dict) else None
    return version if isinstance(version, str) else None


def npm_pyodide(cache: Path, log: Log) -> Path:
    """The npm package's directory in ``cache``, installed with ``npm`` unless there."""
    prefix = cache / "npm"
    package = prefix / "node_modules" / "pyodide"
    if is_pyodide_dir(package) and pyodide_version_of(package) == PYODIDE_VERSION:
        return package
    npm = shutil.which("npm")
    if npm is None:
        raise ProvisionError(f"`npm` was not found on PATH. {NPM_HINT}")
    prefix.mkdir(parents=True, exist_ok=True)
    command = [
        npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund",
        "--no-save", "--loglevel=error", f"pyodide@{PYODIDE_VERSION}",
    ]  # fmt: skip
    log(f"fetching the Pyodide runtime with npm: pyodide@{PYODIDE_VERSION} -> {prefix}")
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0 or not is_pyodide_dir(package):
        raise ProvisionError(
            f"`{' '.join(command)}` failed (exit {done.returncode}); it needs the npm "
            f"registry (or an npm cache holding pyodide@{PYODIDE_VERSION}).\n"
            f"{tail(done.stderr or done.stdout)}\nAlternatively: {NPM_HINT}"
        )
    return package


def sync_file(src: Path, dst: Path) -> bool:
    """Copy unless ``dst`` has the same size and mtime; True if copied."""
    try:
        s, d = src.stat(), dst.stat()
        if s.st_size == d.st_size and int(s.st_mtime) == int(d.st_mtime):
            return False
    except FileNotFoundError:
        pass
    tmp = dst.with_name(f"{dst.name}.{os.getpid()}.tmp")
    shutil.copy2(src, tmp)
    tmp.replace(dst)
    return True


def install_runtime(source: Path, pyodide_dir: Path) -> int:
    """Copy the runtime's top-level files (not its lock: ours replaces it); how many."""
    copied = 0
    for item in sorted(source.iterdir()):
        if item.is_file() and item.name != LOCK_NAME:
            copied += sync_file(item, pyodide_dir / item.name)
    return copied
