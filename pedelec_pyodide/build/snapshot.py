"""Making memory snapshots: the page's, made by provisioning and served by Core; the notebook
kernel's, made by ``pedelec lite`` (:data:`PAGE`, and the :class:`Recipe` in kernel.py).
This module also names the files a snapshot is, which Core serves (core/http/snapshot.py).

A Pyodide memory snapshot (made under Node by ``make_snapshot.mjs`` through
``web/pyodide-snapshot.js``) is the interpreter's whole wasm heap after our wheels were
unpacked and our modules imported; a page restored from it is ready ~3x sooner than a
bare ``loadPyodide()``. It fits one ``pyodide.asm.wasm`` build and one set of wheels, so it
is keyed by both (:func:`snapshot_key`) and remade when either changes.

Next to the runtime (``<out>/pyodide/``) it is three files: the manifest
``pedelec-snapshot.json`` (key, build id, the sha256 of each wheel in it: the loader
compares them with our lock) and the snapshot compressed, ``pedelec-snapshot.bin.gz`` and
``.br``. Core serves ``pedelec-snapshot.bin`` in the encoding the browser takes
(``core/server.py``): ~30 MiB raw, ~7 MiB gzip, ~6 MiB brotli.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ..errors import PedelecError
from .report import Log

__all__ = [
    "ENCODINGS",
    "MANIFEST_NAME",
    "PAGE",
    "SNAPSHOT_NAME",
    "Encoding",
    "Recipe",
    "SnapshotError",
    "ensure_snapshot",
    "remove_snapshot",
    "runtime_build_id",
    "snapshot_key",
    "stored_file",
    "temporary_name",
]

#: the URL's file name (under ``/pedelec/pyodide/``); on disk it is only compressed
SNAPSHOT_NAME = "pedelec-snapshot.bin"
MANIFEST_NAME = "pedelec-snapshot.json"
#: what a page imports before its blocks run: in the snapshot, they cost nothing at start
IMPORTS = (
    "jsonschema",
    "jsonschema.validators",
    "pedelec_pyodide.session",
    "pedelec_pyodide.tools",
    "pedelec_pyodide.browser",
)
#: the root package whose wheels (it and its dependencies in the lock) are in the snapshot
ROOT_PACKAGE = "pedelec-pyodide"

Encoding = Literal["br", "gzip"]
#: the stored encodings, the better first
ENCODINGS: tuple[Encoding, ...] = ("br", "gzip")
_SUFFIX: dict[Encoding, str] = {"br": ".br", "gzip": ".gz"}
#: how long making the snapshot under Node may take (it takes ~10 s)
MAKE_TIMEOUT = 300.0

#: in a cache entry: the sizes of its files, written once they are all made
_MADE_NAME = "made.json"

_MAKER = Path(__file__).with_name("make_snapshot.mjs")
_MAKER_VERSION_FILES = (_MAKER,)


class SnapshotError(PedelecError, RuntimeError):
    """The snapshot could not be made (pages start without one), or a stored one is cut
    short."""


@dataclass(frozen=True)
class Recipe:
    """One kind of snapshot: what it holds and the files it is."""

    #: whose it is, for the log line ("page's")
    whose: str
    #: its file's name (on disk with the encoding's suffix) and its manifest's
    name: str
    manifest: str
    #: the lock's packages whose wheels (with their dependencies) are unpacked in it
    roots: tuple[str, ...]
    #: the modules imported in it
    imports: tuple[str, ...]
    #: the encodings stored (the better first)
    encodings: tuple[Encoding, ...]


#: the page's: our wheels, our modules; Core serves it in either encoding
PAGE = Recipe("page's", SNAPSHOT_NAME, MANIFEST_NAME, (ROOT_PACKAGE,), IMPORTS, ENCODINGS)


def snapshot_packages(lock: Mapping[str, Any],
                      roots: Sequence[str] = PAGE.roots) -> list[str]:
    """The lock's names of ``roots`` and their dependencies, in install order."""
    packages = lock["packages"]
    names: list[str] = []

    def add(name: str) -> None:
        if name in names:
            return
        if name not in packages:
            raise SnapshotError(f"{name} is not in the lock")
        names.append(name)
        for dep in packages[name].get("depends", []):
            add(dep)

    for root in roots:
        add(root)
    return names


def snapshot_key(build_id: str, wheels: Mapping[str, str], maker: bytes,
                 imports: Sequence[str] = PAGE.imports) -> str:
    """The snapshot's identity: the runtime's build id, each wheel's sha256 (by name), the
    modules imported, and the code that makes it (``maker``: its bytes). Any change is a
    new snapshot."""
    text = json.dumps({"buildId": build_id, "wheels": dict(sorted(wheels.items())),
                       "imports": tuple(imports), "maker": hashlib.sha256(maker).hexdigest()},
                      sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def runtime_build_id(pyodide_dir: Path) -> str | None:
    """The build id of the runtime in ``pyodide_dir`` (from its pyodide.mjs), or None."""
    try:
        text = (pyodide_dir / "pyodide.mjs").read_text("utf-8")
    except OSError:
        return None
    match = re.search(r'BUILD_ID:"([0-9a-f]{64})"', text)
    return match.group(1) if match else None


def _maker_bytes(snapshot_module: Path) -> bytes:
    return b"\0".join(p.read_bytes() for p in (*_MAKER_VERSION_FILES, snapshot_module))


def ensure_snapshot(pyodide_dir: Path, lock: Mapping[str, Any], *, web_dir: Path | None,
                    cache: Path, log: Log, recipe: Recipe = PAGE) -> dict[str, Any]:
    """Make (or take from ``cache``) the snapshot for the runtime and wheels in
    ``pyodide_dir`` and put it there with its manifest; returns the manifest. Raises
    :class:`SnapshotError` when it cannot be made (no Node, no web/ module, Node failed):
    any older snapshot and manifest there are removed first, so none is served stale."""
    manifest_file = pyodide_dir / recipe.manifest
    names = snapshot_packages(lock, recipe.roots)
    packages = {name: str(lock["packages"][name]["sha256"]) for name in names}
    build_id = runtime_build_id(pyodide_dir)
    module = web_dir / "pyodide-snapshot.js" if web_dir is not None else None
    try:
        if build_id is None:
            raise SnapshotError(f"no Pyodide build id in {pyodide_dir / 'pyodide.mjs'}")
        if module is None or not module.is_file():
            raise SnapshotError("web/pyodide-snapshot.js was not found")
        key = snapshot_key(build_id, packages, _maker_bytes(module), recipe.imports)
        manifest = {"key": key, "buildId": build_id, "packages": packages,
                    "imports": list(recipe.imports)}
        stored = cache / "snapshots" / key
        made = _made_sizes(stored, recipe)
        try:
            if (made is not None and _sizes(pyodide_dir, recipe) == made
                    and json.loads(manifest_file.read_text("utf-8")) == manifest):
                return manifest
        except (OSError, ValueError):
            pass
        remove_snapshot(pyodide_dir, recipe)
        if made is None:
            _make(pyodide_dir, module, [lock["packages"][n]["file_name"] for n in names],
                  stored, log, recipe)
            made = _sizes(stored, recipe)
            if made is None:
                raise SnapshotError(f"{_MAKER.name} exited 0 but left no snapshot in {stored}")
            _write(stored / _MADE_NAME, json.dumps(made))
        for encoding in recipe.encodings:
            _copy(stored_file(stored, encoding, recipe.name),
                  stored_file(pyodide_dir, encoding, recipe.name))
        _write(manifest_file, json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    except SnapshotError:
        remove_snapshot(pyodide_dir, recipe)
        raise
    except OSError as exc:  # a full disk, a Node that wrote nothing: no snapshot, no crash
        remove_snapshot(pyodide_dir, recipe)
        raise SnapshotError(f"cannot place the snapshot in {pyodide_dir}: {exc}") from exc
    return manifest


def remove_snapshot(pyodide_dir: Path, recipe: Recipe = PAGE) -> None:
    """Remove the snapshot, its manifest and its inflated forms (the dot-files Core makes
    for clients that take no stored encoding) from ``pyodide_dir``, if there."""
    (pyodide_dir / recipe.manifest).unlink(missing_ok=True)
    for encoding in ENCODINGS:
        stored_file(pyodide_dir, encoding, recipe.name).unlink(missing_ok=True)
    for inflated in pyodide_dir.glob(f".{recipe.name}.*"):
        inflated.unlink(missing_ok=True)


def _sizes(directory: Path, recipe: Recipe = PAGE) -> dict[str, int] | None:
    """The size of each stored encoding in ``directory``, or None when one is missing."""
    try:
        return {e: stored_file(directory, e, recipe.name).stat().st_size
                for e in recipe.encodings}
    except OSError:
        return None


def _made_sizes(stored: Path, recipe: Recipe = PAGE) -> dict[str, int] | None:
    """The sizes recorded when the cache entry ``stored`` was made, if its files still have
    them (renamed but never flushed before a crash, a file can be left empty)."""
    try:
        made = json.loads((stored / _MADE_NAME).read_text("utf-8"))
    except (OSError, ValueError):
        return None
    return made if isinstance(made, dict) and made == _sizes(stored, recipe) else None


def temporary_name(path: Path) -> Path:
    """Where ``path`` is written before it is renamed into place: a dot-name, which the
    runtime directory never serves (one left by a crash included)."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def _write(path: Path, text: str) -> None:
    tmp = temporary_name(path)
    tmp.write_text(text, "utf-8")
    tmp.replace(path)


def _copy(src: Path, dst: Path) -> None:
    tmp = temporary_name(dst)
    shutil.copyfile(src, tmp)
    tmp.replace(dst)


def _make(pyodide_dir: Path, module: Path, wheels: Sequence[str], target: Path,
          log: Log, recipe: Recipe) -> None:
    node = shutil.which("node")
    if node is None:
        raise SnapshotError("`node` was not found on PATH (Node.js makes the snapshot)")
    log(f"making the {recipe.whose} memory snapshot under Node (once per runtime and wheels)")
    target.mkdir(parents=True, exist_ok=True)
    command = [node, str(_MAKER), str(module), str(pyodide_dir), str(target / recipe.name)]
    try:
        done = subprocess.run(command, input=json.dumps({"wheels": list(wheels),
                                                         "imports": list(recipe.imports)}),
                              capture_output=True, text=True, check=False,
                              timeout=MAKE_TIMEOUT)
    except subprocess.TimeoutExpired as exc:
        raise SnapshotError(f"{' '.join(command)} did not finish in {MAKE_TIMEOUT:g} s") from exc
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
        raise SnapshotError(f"{' '.join(command)} failed (exit {done.returncode})\n{tail}")


def stored_file(directory: Path, encoding: Encoding, name: str = SNAPSHOT_NAME) -> Path:
    """Where the snapshot ``name`` is stored in ``encoding``."""
    return directory / (name + _SUFFIX[encoding])
