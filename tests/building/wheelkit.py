"""Wheels and runtimes made in a tmp dir for the build tests: small but well-formed."""

from __future__ import annotations

import base64
import hashlib
import json
import zipfile
from pathlib import Path

from pedelec_pyodide.build.runtime import PYODIDE_VERSION

#: the Python of the fake runtime's lock (Pyodide 314's)
PY = "3.14.2"


def make_wheel(
    directory: Path,
    name: str,
    version: str,
    *,
    requires: tuple[str, ...] = (),
    files: tuple[str, ...] = (),
    top_level: str | None = None,
    tag: str = "py3-none-any",
) -> Path:
    """A minimal but well-formed wheel."""
    dist = f"{name.replace('-', '_')}-{version}"
    path = directory / f"{dist}-{tag}.whl"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {r}\n" for r in requires)
    members = {f: f"# {f}\n" for f in files}
    members[f"{dist}.dist-info/METADATA"] = metadata
    members[f"{dist}.dist-info/WHEEL"] = f"Wheel-Version: 1.0\nTag: {tag}\n"
    if top_level is not None:
        members[f"{dist}.dist-info/top_level.txt"] = top_level
    record = "".join(f"{m},,\n" for m in members) + f"{dist}.dist-info/RECORD,,\n"
    members[f"{dist}.dist-info/RECORD"] = record
    with zipfile.ZipFile(path, "w") as zf:
        for member, text in members.items():
            zf.writestr(member, text)
    return path


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fake_runtime(directory: Path) -> Path:
    directory.mkdir(parents=True)
    (directory / "pyodide.mjs").write_text("export {}\n")
    (directory / "pyodide.asm.wasm").write_bytes(b"\0asm")
    (directory / "python_stdlib.zip").write_bytes(b"PK")
    (directory / "package.json").write_text(json.dumps({"version": PYODIDE_VERSION}))
    base = {
        "info": {"python": PY, "arch": "wasm32"},
        "packages": {"cdn-only": {"name": "cdn-only", "file_name": "cdn_only-1-py3-none-any.whl"}},
    }
    (directory / "pyodide-lock.json").write_text(json.dumps(base))
    return directory


def fake_compile(runtime: Path, sources: dict[str, str]) -> dict[str, bytes]:
    """Stands in for Pyodide's compiler (Node): one fake .pyc per source, where 3.14 puts it."""
    compiled = {}
    for name in sources:
        folder, _, base = name.rpartition("/")
        compiled[f"{folder}/__pycache__/{base[:-3]}.cpython-314.pyc"] = f"pyc of {name}".encode()
    return compiled


def check_record(wheel: zipfile.ZipFile) -> list[str]:
    """Assert the wheel's RECORD lists exactly its files with their sha256 and size."""
    (record_name,) = [n for n in wheel.namelist() if n.endswith(".dist-info/RECORD")]
    lines = wheel.read(record_name).decode().splitlines()
    assert {line.rsplit(",", 2)[0] for line in lines} == set(wheel.namelist())
    for line in lines:
        name, digest, size = line.rsplit(",", 2)
        if name == record_name:
            assert (digest, size) == ("", "")
            continue
        data = wheel.read(name)
        raw = hashlib.sha256(data).digest()
        assert digest == "sha256=" + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
        assert int(size) == len(data)
    return wheel.namelist()
