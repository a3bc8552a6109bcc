"""Provision what pages (and the Node test runner) need from Pyodide: one code path.

Lays out ``<out>/pyodide/`` with

* the Pyodide runtime (:mod:`.runtime`: the npm package ``pyodide@PYODIDE_VERSION``,
  installed with the user's own ``npm`` into a cache directory),
* pure-Python wheels from PyPI (:mod:`.wheels`: downloaded with the user's own ``pip``
  for the runtime's Python, platform ``any``; exact versions pinned there),
* our own wheel in the form pages load it (:mod:`.own_wheel`),
* a ``pyodide-lock.json`` (:mod:`.lock`): the npm package's ``info`` plus one entry per
  wheel we really have,
* the page's memory snapshot (:mod:`.snapshot`: made under Node, keyed by the runtime's
  build id and the wheels' sha256, remade when they change; without Node, none: pages
  then start the slower way).

Everything downloaded is cached (``$PEDELEC_CACHE_DIR`` or ``~/.cache/pedelec-pyodide``):
a second run with everything present does no network and takes well under a second.

CLI: ``python -m pedelec_pyodide.build.provision OUTDIR [--with-tests]``. CPython only.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from . import wheels
from .lock import build_lock, write_lock
from .own_wheel import OWN_DIST, own_wheel
from .report import Log, ProvisionError
from .runtime import (
    LOCK_NAME,
    PYODIDE_VERSION,
    install_runtime,
    is_pyodide_dir,
    npm_pyodide,
    pyodide_version_of,
    python_of,
    sync_file,
)
from .snapshot import SnapshotError, ensure_snapshot, remove_snapshot
from .web import default_web_dir

__all__ = ["ProvisionError", "ProvisionResult", "cache_dir", "main", "provision"]


@dataclasses.dataclass(frozen=True)
class ProvisionResult:
    """Where things are after :func:`provision`."""

    out_dir: Path
    #: ``<out>/pyodide/``: the runtime, the wheels and the lock (serve this directory)
    pyodide_dir: Path
    lock_file: Path
    #: canonical package name -> wheel path (runtime, own and, if asked, test wheels)
    wheels: dict[str, Path]
    own_wheel: Path
    #: the names to pass to ``loadPyodide({packages})`` / ``loadPackage``
    packages: tuple[str, ...]
    pyodide_version: str = PYODIDE_VERSION
    #: the memory snapshot's key (:mod:`.snapshot`), or None when there is none
    snapshot_key: str | None = None


def _default_log(message: str) -> None:
    print(f"pedelec provision: {message}", file=sys.stderr, flush=True)


def cache_dir() -> Path:
    """``$PEDELEC_CACHE_DIR`` or ``~/.cache/pedelec-pyodide``."""
    env = os.environ.get("PEDELEC_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "pedelec-pyodide"


# ------------------------------------------------------------------------ the function


def provision(
    out_dir: Path,
    *,
    with_test_wheels: bool = False,
    repo: Path | None = None,
    pyodide_src: Path | None = None,
    cache: Path | None = None,
    log: Log | None = None,
    snapshot: bool = True,
) -> ProvisionResult:
    """Lay out ``<out_dir>/pyodide/``: runtime, wheels and our lock (see module doc).

    ``repo``: the source tree to build our wheel from with ``pip wheel`` (default: the
    checkout this module lives in; when it is not in a checkout, e.g. pip-installed, the
    installed package is zipped into a wheel instead). ``pyodide_src``: an existing
    Pyodide runtime directory to use instead of npm. ``snapshot``: make the page's memory
    snapshot (else any old one is removed).
    Raises :class:`ProvisionError` saying what is missing and how to get it.
    """
    say = log or _default_log
    started = time.monotonic()
    cache = cache if cache is not None else cache_dir()
    out_dir = Path(out_dir)
    pyodide_dir = out_dir / "pyodide"
    pyodide_dir.mkdir(parents=True, exist_ok=True)

    if pyodide_src is not None:
        if not is_pyodide_dir(pyodide_src):
            raise ProvisionError(
                f"{pyodide_src} is not a Pyodide runtime directory (it needs pyodide.mjs, "
                f"pyodide.asm.wasm and {LOCK_NAME}); the npm package pyodide@"
                f"{PYODIDE_VERSION} has them"
            )
        source = pyodide_src
    else:
        source = npm_pyodide(cache, say)
    version = pyodide_version_of(source)
    if version is not None and version != PYODIDE_VERSION:
        say(f"warning: {source} is Pyodide {version}, expected {PYODIDE_VERSION}")
    copied = install_runtime(source, pyodide_dir)
    if copied:
        say(f"copied {copied} runtime file(s) into {pyodide_dir}")
    base = json.loads((source / LOCK_NAME).read_text(encoding="utf-8"))

    pins = [*wheels.RUNTIME_WHEELS, *(wheels.TEST_WHEELS if with_test_wheels else ())]
    downloaded = wheels.download_wheels(pins, cache / "wheels", say, python_of(base))
    own = own_wheel(repo, source, cache, say)

    placed: dict[str, Path] = {}
    for wheel in [*downloaded, own]:
        destination = pyodide_dir / wheel.name
        sync_file(wheel, destination)
        parsed = wheels.wheel_name(wheel.name)
        assert parsed is not None  # downloaded by its name, or built by us
        placed[parsed[0]] = destination
    own_placed = placed[canonicalize_name(OWN_DIST)]
    # older builds of our own wheel must not linger next to the new one
    for stale in pyodide_dir.glob("pedelec_pyodide-*.whl"):
        if stale != own_placed:
            stale.unlink()

    lock = build_lock(base, placed.values(), pyodide_dir)
    lock_file = pyodide_dir / LOCK_NAME
    if write_lock(lock_file, lock):
        say(f"wrote {lock_file} ({len(lock['packages'])} packages)")
    key = _snapshot(pyodide_dir, lock, cache, say) if snapshot else None
    if not snapshot:
        remove_snapshot(pyodide_dir)
    say(f"ready in {time.monotonic() - started:.2f}s: {pyodide_dir}")
    return ProvisionResult(
        out_dir=out_dir,
        pyodide_dir=pyodide_dir,
        lock_file=lock_file,
        wheels=placed,
        own_wheel=own_placed,
        packages=tuple(placed),
        snapshot_key=key,
    )


def _snapshot(pyodide_dir: Path, lock: Mapping[str, Any], cache: Path, log: Log) -> str | None:
    try:
        return str(ensure_snapshot(pyodide_dir, lock, web_dir=default_web_dir(), cache=cache,
                                   log=log)["key"])
    except SnapshotError as exc:
        log(f"note: no memory snapshot, pages start without one (slower): {exc}")
        return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pedelec_pyodide.build.provision",
        description="Lay out the Pyodide runtime, the wheels and a pyodide-lock.json "
        "in OUTDIR/pyodide/ (cached in $PEDELEC_CACHE_DIR or ~/.cache/pedelec-pyodide).",
    )
    parser.add_argument("out_dir", type=Path, metavar="OUTDIR")
    parser.add_argument("--with-tests", action="store_true", help="add pytest, hypothesis")
    parser.add_argument("--repo", type=Path, help="source tree to build our wheel from")
    parser.add_argument("--pyodide", type=Path, help="use this Pyodide runtime dir, not npm")
    parser.add_argument("--cache-dir", type=Path, help="cache directory")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--no-snapshot", action="store_true",
                        help="make no memory snapshot (pages start without one)")
    args = parser.parse_args(argv)
    try:
        result = provision(
            args.out_dir,
            with_test_wheels=args.with_tests,
            repo=args.repo,
            pyodide_src=args.pyodide,
            cache=args.cache_dir,
            snapshot=not args.no_snapshot,
        )
    except ProvisionError as exc:
        print(f"pedelec provision: error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        summary = {
            "pyodideVersion": result.pyodide_version,
            "pyodideDir": str(result.pyodide_dir.resolve()),
            "lockFile": str(result.lock_file.resolve()),
            "ownWheel": str(result.own_wheel.resolve()),
            "packages": list(result.packages),
            "snapshotKey": result.snapshot_key,
        }
        print(json.dumps(summary, indent=2))
    else:
        print(result.pyodide_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
