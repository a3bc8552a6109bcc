"""Our own wheel, in the form pages load it.

Built from the repository with ``pip wheel`` (or, pip-installed with no source tree, the
installed package zipped with its METADATA), then made into the page's copy: without what
only the host's CPython uses (``core/``, ``build/``, ``web/``) and with ``.pyc`` compiled
by the Pyodide runtime under Node (``compile_pyc.mjs``; without Node, none).
"""

from __future__ import annotations

import base64
import email.parser
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path

from .lock import dist_info_files
from .report import Log, ProvisionError, check_pip, tail
from .runtime import pyodide_version_of

__all__ = ["HOST_ONLY", "OWN_DIST", "own_wheel"]

OWN_DIST = "pedelec-pyodide"

def _find_repo(repo: Path | None) -> Path | None:
    candidates = [repo] if repo is not None else [Path(__file__).resolve().parents[2]]
    for candidate in candidates:
        pyproject = candidate / "pyproject.toml"
        if pyproject.is_file() and re.search(
            r'^name\s*=\s*"pedelec-pyodide"', pyproject.read_text("utf-8"), re.M
        ):
            return candidate
        if repo is not None:
            raise ProvisionError(f"{repo} is not the pedelec-pyodide repository")
    return None


def _source_digest(repo: Path) -> str:
    digest = hashlib.sha256()
    files = [repo / "pyproject.toml", repo / "README.md"]
    files += [
        p
        for p in (repo / "pedelec_pyodide").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo")
    ]
    for path in sorted(files):
        if path.is_file():
            digest.update(path.relative_to(repo).as_posix().encode() + b"\0")
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def _build_own_wheel(repo: Path, cache: Path, log: Log) -> Path:
    target = cache / "own" / _source_digest(repo)
    existing = sorted(target.glob("pedelec_pyodide-*.whl")) if target.is_dir() else []
    if existing:
        return existing[-1]
    check_pip()
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
               "--disable-pip-version-check"]  # fmt: skip
    if importlib.util.find_spec("hatchling") is not None:
        command.append("--no-build-isolation")  # no network when hatchling is at hand
    log(f"building our wheel from {repo}")
    with tempfile.TemporaryDirectory(prefix="pedelec-wheel-") as tmp:
        command += ["-w", tmp, str(repo)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        built = sorted(Path(tmp).glob("pedelec_pyodide-*.whl"))
        if done.returncode != 0 or not built:
            raise ProvisionError(
                f"building the pedelec-pyodide wheel failed (exit {done.returncode}); "
                "it needs the build backend hatchling (installed, or fetched from PyPI)."
                f"\ncommand: {' '.join(command)}\n{tail(done.stderr or done.stdout)}"
            )
        target.mkdir(parents=True, exist_ok=True)
        final = target / built[0].name
        shutil.copy2(built[0], final)
    return final


def _wheel_from_installed(cache: Path, log: Log) -> Path:
    """Our wheel when there is no source tree (pip-installed): zip the installed
    ``pedelec_pyodide`` package with its installed METADATA. Pure Python, no network."""
    try:
        metadata = importlib.metadata.distribution(OWN_DIST).read_text("METADATA")
    except importlib.metadata.PackageNotFoundError:
        metadata = None
    if not metadata:
        raise ProvisionError(
            "cannot find the pedelec-pyodide source tree or its installed metadata to "
            "make its wheel; pass repo=/path/to/checkout (CLI: --repo DIR)"
        )
    parser = email.parser.HeaderParser()
    version = str(parser.parsestr(metadata)["Version"])
    package = Path(__file__).resolve().parents[1]
    files = sorted(
        p
        for p in package.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo")
    )
    digest = hashlib.sha256(metadata.encode())
    for path in files:
        digest.update(path.relative_to(package.parent).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    target = cache / "own" / f"installed-{digest.hexdigest()[:16]}"
    final = target / f"pedelec_pyodide-{version}-py3-none-any.whl"
    if final.is_file():
        return final
    log(f"making our wheel from the installed package {package}")
    dist_info = f"pedelec_pyodide-{version}.dist-info"
    members = [(p.relative_to(package.parent).as_posix(), p.read_bytes()) for p in files]
    members.append((f"{dist_info}/METADATA", metadata.encode()))
    wheel_meta = "Wheel-Version: 1.0\nGenerator: pedelec-provision\nRoot-Is-Purelib: true\n"
    members.append((f"{dist_info}/WHEEL", (wheel_meta + "Tag: py3-none-any\n").encode()))
    return _write_wheel(final, list(members), f"{dist_info}/RECORD")


def _urlsafe_digest(data: bytes) -> str:
    raw = hashlib.sha256(data).digest()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


#: What only the host's CPython uses (Core and building, never imported in a page; ~70 % of
#: the wheel): the page's copy leaves it out, and the ``pedelec`` command
#: (entry_points.txt) with it.
HOST_ONLY = ("pedelec_pyodide/core/", "pedelec_pyodide/build/", "pedelec_pyodide/web/")
_HOST_ONLY_META = ("entry_points.txt",)
_COMPILER = Path(__file__).with_name("compile_pyc.mjs")


def _compile_for_pyodide(runtime: Path, sources: Mapping[str, str]) -> dict[str, bytes]:
    """Bytecode of ``sources`` (wheel path -> text) compiled by the Pyodide in ``runtime``
    (its CPython is 3.14; the host's cannot write 3.14 .pyc): .pyc wheel path -> bytes."""
    node = shutil.which("node")
    if node is None:
        raise ProvisionError("`node` was not found on PATH")
    command = [node, str(_COMPILER), str(runtime)]
    done = subprocess.run(
        command, input=json.dumps(sources), capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise ProvisionError(f"{' '.join(command)} failed (exit {done.returncode})\n"
                             f"{tail(done.stderr or done.stdout)}")  # fmt: skip
    compiled = json.loads(done.stdout)
    return {name: base64.b64decode(data) for name, data in compiled.items()}


def _page_wheel(wheel: Path, runtime: Path, log: Log) -> Path:
    """Our wheel as pages load it: the same distribution and version (file name, METADATA),
    without what only the host uses, plus unchecked-hash ``.pyc`` compiled by ``runtime``'s
    Python next to every module (the ``.py`` stay, for tracebacks), and a RECORD that
    lists every file with its hash. A page otherwise compiles our sources on its main
    thread before ``pedelec:ready``. Without Node, it is the same wheel without .pyc.

    Cached next to ``wheel`` (whose directory is keyed by the sources), per runtime."""
    target = wheel.parent / f"page-{pyodide_version_of(runtime) or 'unknown'}" / wheel.name
    if target.is_file():
        return target
    with zipfile.ZipFile(wheel) as source:
        record_name = dist_info_files(source)["RECORD"]
        dist_info = record_name.rpartition("/")[0] + "/"
        dropped = {record_name, *(dist_info + name for name in _HOST_ONLY_META)}
        members = [
            (info, source.read(info))
            for info in source.infolist()
            if not info.filename.startswith(HOST_ONLY) and info.filename not in dropped
        ]
    try:
        compiled = _compile_for_pyodide(
            runtime,
            {i.filename: data.decode("utf-8") for i, data in members if i.filename.endswith(".py")},
        )
    except ProvisionError as exc:
        log(f"note: our wheel for pages has no bytecode (pages compile it at start): {exc}")
        target = wheel.parent / "page-without-bytecode" / wheel.name
        compiled = {}
    # the same fixed date as the built wheel's files: the bytes (and the lock's sha256)
    # depend only on the sources and the runtime
    date = members[0][0].date_time
    package = [(i, d) for i, d in members if not i.filename.startswith(dist_info)]
    metadata = [(i, d) for i, d in members if i.filename.startswith(dist_info)]
    pycs = [(_zip_info(name, date), data) for name, data in sorted(compiled.items())]
    members = package + pycs + metadata
    return _write_wheel(target, list(members), _zip_info(record_name, date))


def _write_wheel(target: Path, members: list[tuple[zipfile.ZipInfo | str, bytes]],
                 record: zipfile.ZipInfo | str) -> Path:
    """``members`` and their RECORD (named ``record``) as the wheel ``target``, written
    whole under another name first: a reader never sees half a wheel."""
    def name(member: zipfile.ZipInfo | str) -> str:
        return member if isinstance(member, str) else member.filename

    lines = [f"{name(m)},sha256={_urlsafe_digest(data)},{len(data)}" for m, data in members]
    lines.append(f"{name(record)},,")
    members.append((record, ("\n".join(lines) + "\n").encode()))
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for member, data in members:
            zf.writestr(member, data)
    tmp.replace(target)
    return target


def _zip_info(name: str, date: tuple[int, int, int, int, int, int]) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = 0o644 << 16
    return info


def own_wheel(repo: Path | None, runtime: Path, cache: Path, log: Log) -> Path:
    """The page's copy of our wheel for ``runtime``: built from ``repo`` (default: the
    checkout this module lives in; the installed package when there is none), cached."""
    found = _find_repo(repo)
    built = (_build_own_wheel(found, cache, log) if found is not None
             else _wheel_from_installed(cache, log))
    return _page_wheel(built, runtime, log)
