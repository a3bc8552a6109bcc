"""Our ``pyodide-lock.json``: the runtime's ``info`` plus one entry per wheel we really have
(sha256 computed from the file), so ``loadPyodide({lockFileURL, packages})`` never falls
back to the (unreachable) CDN. The ``pyodide-lock`` tool cannot read the 314 lock; these
few functions write it."""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import Version

from .report import ProvisionError
from .runtime import python_of
from .wheels import requirements_on_pyodide, wheel_metadata, wheel_name

__all__ = ["build_lock", "dist_info_files", "lock_entry", "sha256_of", "write_lock"]


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def dist_info_files(wheel: zipfile.ZipFile) -> dict[str, str]:
    """Base name -> member path for files directly in the wheel's .dist-info dir."""
    found: dict[str, str] = {}
    for member in wheel.namelist():
        head, _, base = member.partition("/")
        if head.endswith(".dist-info") and "/" not in base and base:
            found[base] = member
    return found


def _wheel_imports(wheel: zipfile.ZipFile, dist_info: Mapping[str, str]) -> list[str]:
    if "top_level.txt" in dist_info:
        text = wheel.read(dist_info["top_level.txt"]).decode("utf-8")
        names = {line.strip() for line in text.splitlines()}
        return sorted(n for n in names if n and "/" not in n and n.isidentifier())
    if "RECORD" in dist_info:
        members = [
            line.rsplit(",", 2)[0]
            for line in wheel.read(dist_info["RECORD"]).decode("utf-8").splitlines()
        ]
    else:
        members = wheel.namelist()
    names = set()
    for member in members:
        head, sep, _rest = member.partition("/")
        if not sep:
            if head.endswith(".py"):
                names.add(head[:-3])
            elif ".cpython-" in head or head.endswith(".so"):
                names.add(head.split(".", 1)[0])
            continue
        if head.endswith((".dist-info", ".data")) or head == "__pycache__":
            continue
        names.add(head)
    return sorted(n for n in names if n.isidentifier())


def lock_entry(
    wheel_path: Path,
    *,
    file_name: str,
    available: Iterable[str],
    python: Version,
) -> dict[str, Any]:
    """One ``packages`` entry of a pyodide-lock.json for a wheel we have on disk.

    ``available`` holds the names present in the lock; ``depends`` lists the wheel's
    Requires-Dist that apply inside Pyodide running ``python`` (markers evaluated, no
    extras) and are in ``available``.
    """
    names_available = {canonicalize_name(n) for n in available}
    with zipfile.ZipFile(wheel_path) as wheel:
        metadata = wheel_metadata(wheel)
        if metadata is None:
            raise ProvisionError(f"{wheel_path} has no .dist-info/METADATA: not a wheel?")
        imports = _wheel_imports(wheel, dist_info_files(wheel))
    name = str(metadata["Name"])
    required = requirements_on_pyodide(map(str, metadata.get_all("Requires-Dist") or []), python)
    depends = [dep for dep in required
               if dep in names_available and dep != canonicalize_name(name)]
    return {
        "name": name,
        "version": str(metadata["Version"]),
        "file_name": file_name,
        "install_dir": "site",
        "sha256": sha256_of(wheel_path),
        "package_type": "package",
        "imports": imports,
        "depends": sorted(depends),
        "unvendored_tests": False,
    }


def _relative_file_name(path: Path, lock_dir: Path) -> str:
    try:
        return path.resolve().relative_to(lock_dir.resolve()).as_posix()
    except ValueError:
        return path.resolve().as_uri()


def build_lock(
    base_lock: Mapping[str, Any],
    wheels: Iterable[Path],
    lock_dir: Path,
) -> dict[str, Any]:
    """A pyodide-lock.json dict: ``base_lock``'s ``info``, plus the base packages whose
    files exist in ``lock_dir``, plus one entry per wheel (file names relative to
    ``lock_dir`` when inside it, else absolute ``file:`` URLs). Markers are evaluated for
    the Python that ``base_lock`` names."""
    info = dict(base_lock.get("info", {}))
    python = python_of(base_lock)
    packages: dict[str, Any] = {}
    for key, entry in dict(base_lock.get("packages", {})).items():
        file_name = str(entry.get("file_name", ""))
        if file_name and "://" not in file_name and (lock_dir / file_name).is_file():
            packages[key] = entry
    names: dict[str, Path] = {}
    for wheel in wheels:
        parsed = wheel_name(wheel.name)
        if parsed is None:
            raise ProvisionError(f"not a wheel file name: {wheel.name}")
        names[parsed[0]] = wheel
    available = set(packages) | set(names)
    for key, wheel in names.items():
        packages[key] = lock_entry(
            wheel,
            file_name=_relative_file_name(wheel, lock_dir),
            available=available,
            python=python,
        )
    return {"info": info, "packages": dict(sorted(packages.items()))}


def write_lock(path: Path, lock: Mapping[str, Any]) -> bool:
    """Write ``lock`` as JSON to ``path`` unless it already holds the same; True if written."""
    text = json.dumps(lock, indent=1, sort_keys=True) + "\n"
    if path.is_file() and path.read_text(encoding="utf-8") == text:
        return False
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return True
