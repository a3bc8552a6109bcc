"""Provision what pages (and the Node test runner) need from Pyodide: one code path.

Lays out ``<out>/pyodide/`` with

* the Pyodide runtime from the npm package ``pyodide@PYODIDE_VERSION`` (installed with
  the user's own ``npm`` into a cache directory),
* pure-Python wheels from PyPI (downloaded with the user's own ``pip`` for CPython 3.14,
  platform ``any``; exact versions pinned below),
* our own wheel, built from the repository with ``pip wheel``, in the form pages load
  it: without ``core/`` and ``web/`` (Core's, never imported in a page) and with ``.pyc``
  compiled by the Pyodide runtime under Node (``compile_pyc.mjs``; without Node, none),
* a ``pyodide-lock.json`` written here: the npm package's ``info`` plus one entry per
  wheel we really have (sha256 computed from the file), so ``loadPyodide({lockFileURL,
  packages})`` never falls back to the (unreachable) CDN,
* the page's memory snapshot (:mod:`.snapshot`: made under Node, keyed by the runtime's
  build id and the wheels' sha256, remade when they change; without Node, none: pages
  then start the slower way).

Everything downloaded is cached (``$PEDELEC_CACHE_DIR`` or ``~/.cache/pedelec-pyodide``):
a second run with everything present does no network and takes well under a second.

CLI: ``python -m pedelec_pyodide.core.provision OUTDIR [--with-tests]``.
CPython only; stdlib only.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import email.parser
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import PedelecError
from .config import default_web_dir
from .snapshot import SnapshotError, ensure_snapshot, remove_snapshot

__all__ = [
    "PYODIDE_VERSION",
    "PYTHON_VERSION",
    "RUNTIME_WHEELS",
    "TEST_WHEELS",
    "ProvisionError",
    "ProvisionResult",
    "build_lock",
    "cache_dir",
    "canonical_name",
    "evaluate_marker",
    "lock_entry",
    "main",
    "provision",
    "write_lock",
]

#: The npm ``pyodide`` version (the one ``jupyterlite-pyodide-kernel`` pins).
PYODIDE_VERSION = "314.0.6"
#: The CPython inside that Pyodide (``info.python`` of its lock says 3.14.2).
PYTHON_VERSION = "3.14"

#: Wheels the page needs at run time (jsonschema < 4.18: later ones need rpds-py, which
#: has no WebAssembly wheel). All are ``py3-none-any`` wheels on PyPI.
RUNTIME_WHEELS: tuple[str, ...] = (
    "jsonschema==4.17.3",
    "attrs==26.1.0",
    "pyrsistent==0.20.0",
    "micropip==0.11.1",
)

#: Extra wheels to run the unit tests with pytest inside Pyodide.
TEST_WHEELS: tuple[str, ...] = (
    "pytest==9.2.0",
    "pluggy==1.7.0",
    "iniconfig==2.3.1",
    "packaging==26.4",
    "pygments==2.21.0",
    "hypothesis==6.155.7",
    "sortedcontainers==2.4.0",
)

_OWN_DIST = "pedelec-pyodide"
_LOCK_NAME = "pyodide-lock.json"
# right wherever provisioning runs: `pedelec serve`/`demo` (whose --pyodide takes a
# provisioned directory) and this module's CLI (whose --pyodide takes the npm package)
_NPM_HINT = (
    "npm (Node.js >= 18) is needed once to fetch the Pyodide runtime: install Node.js "
    "(e.g. `apt install nodejs npm`, or https://nodejs.org). Without npm here: run "
    "`python -m pedelec_pyodide.core.provision OUT` where npm is, copy OUT/pyodide here and "
    "start Core with `pedelec serve --pyodide OUT/pyodide`; or, with the npm package "
    f"pyodide@{PYODIDE_VERSION} unpacked here (its node_modules/pyodide), run `python -m "
    "pedelec_pyodide.core.provision OUT --pyodide node_modules/pyodide` and the same "
    "`pedelec serve --pyodide OUT/pyodide`"
)

Log = Callable[[str], None]


class ProvisionError(PedelecError, RuntimeError):
    """Something needed is missing; the message says what and how to get it."""


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


# --------------------------------------------------------------------------- names


def canonical_name(name: str) -> str:
    """Normalize a project name like Pyodide's lock keys (and PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


_WHEEL_RE = re.compile(
    r"^(?P<name>[^-]+)-(?P<version>[^-]+)(?:-(?P<build>\d[^-]*))?"
    r"-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<plat>[^-]+)\.whl$"
)


def _parse_wheel_name(file_name: str) -> tuple[str, str, str, str] | None:
    """(canonical name, version, abi, platform) of a wheel file name, or None."""
    m = _WHEEL_RE.match(file_name)
    if m is None:
        return None
    return canonical_name(m["name"]), m["version"], m["abi"], m["plat"]


def _split_pin(pin: str) -> tuple[str, str]:
    name, sep, version = pin.partition("==")
    if not sep or not version:
        raise ValueError(f"not an exact pin: {pin!r}")
    return canonical_name(name.strip()), version.strip()


# ------------------------------------------------------------------- PEP 508 markers

_MARKER_TOKEN = re.compile(
    r"""\s*(?:
        (?P<str>'[^']*'|"[^"]*")
      | (?P<op>===|==|!=|~=|<=|>=|<|>|\(|\))
      | (?P<word>not\s+in\b|[A-Za-z_][A-Za-z0-9_.]*)
    )""",
    re.VERBOSE,
)

_VERSION_VARS = frozenset({"python_version", "python_full_version", "implementation_version"})


def _marker_env(python_full_version: str) -> dict[str, str]:
    major_minor = ".".join(python_full_version.split(".")[:2])
    return {
        "python_version": major_minor,
        "python_full_version": python_full_version,
        "implementation_version": python_full_version,
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "sys_platform": "emscripten",
        "platform_system": "Emscripten",
        "platform_machine": "wasm32",
        "platform_release": "",
        "platform_version": "",
        "os_name": "posix",
        "extra": "",
    }


def _version_key(text: str) -> tuple[int, ...]:
    parts: list[int] = []
    for piece in text.split("."):
        m = re.match(r"\d+", piece)
        if m is None:
            break
        parts.append(int(m.group()))
    return tuple(parts)


def _compare(left: str, op: str, right: str, as_version: bool) -> bool:
    if op == "in":
        return left in right
    if op == "not in":
        return left not in right
    if op == "===":
        return left == right
    if as_version and _version_key(left) and _version_key(right):
        lv, rv = _version_key(left), _version_key(right)
        width = max(len(lv), len(rv))
        a = lv + (0,) * (width - len(lv))
        b = rv + (0,) * (width - len(rv))
        if op == "~=":
            prefix = rv[:-1] if len(rv) > 1 else rv
            return a >= b and lv[: len(prefix)] == prefix
        return {
            "==": a == b,
            "!=": a != b,
            "<": a < b,
            "<=": a <= b,
            ">": a > b,
            ">=": a >= b,
        }[op]
    return {
        "==": left == right,
        "!=": left != right,
        "~=": left == right,
        "<": left < right,
        "<=": left <= right,
        ">": left > right,
        ">=": left >= right,
    }[op]


def evaluate_marker(marker: str, python_full_version: str = "3.14.2") -> bool:
    """Evaluate a PEP 508 environment marker for Pyodide (emscripten, no extras)."""
    tokens: list[tuple[str, str]] = []
    pos = 0
    text = marker.strip()
    while pos < len(text):
        m = _MARKER_TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise ValueError(f"cannot parse marker {marker!r} at {text[pos:]!r}")
        pos = m.end()
        kind = m.lastgroup
        assert kind is not None
        tokens.append((kind, " ".join(m.group(kind).split())))
    env = _marker_env(python_full_version)
    index = 0

    def peek() -> tuple[str, str] | None:
        return tokens[index] if index < len(tokens) else None

    def take() -> tuple[str, str]:
        nonlocal index
        if index >= len(tokens):
            raise ValueError(f"unexpected end of marker {marker!r}")
        index += 1
        return tokens[index - 1]

    def value() -> tuple[str, bool]:
        kind, tok = take()
        if kind == "str":
            return tok[1:-1], False
        if kind == "word" and tok in env:
            return env[tok], tok in _VERSION_VARS
        raise ValueError(f"unknown marker value {tok!r} in {marker!r}")

    def atom() -> bool:
        if peek() == ("op", "("):
            take()
            result = disjunction()
            if take() != ("op", ")"):
                raise ValueError(f"unbalanced parentheses in {marker!r}")
            return result
        left, left_is_version = value()
        kind, op = take()
        is_comparison = (kind == "op" and op not in ("(", ")")) or (
            kind == "word" and op in ("in", "not in")
        )
        if not is_comparison:
            raise ValueError(f"expected a comparison in {marker!r}, got {op!r}")
        right, right_is_version = value()
        return _compare(left, op, right, left_is_version or right_is_version)

    def conjunction() -> bool:
        result = atom()
        while peek() == ("word", "and"):
            take()
            result = atom() and result
        return result

    def disjunction() -> bool:
        result = conjunction()
        while peek() == ("word", "or"):
            take()
            result = conjunction() or result
        return result

    result = disjunction()
    if index != len(tokens):
        raise ValueError(f"trailing text in marker {marker!r}")
    return result


# ------------------------------------------------------------------------ the lock


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _dist_info_files(wheel: zipfile.ZipFile) -> dict[str, str]:
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
    python_full_version: str = "3.14.2",
) -> dict[str, Any]:
    """One ``packages`` entry of a pyodide-lock.json for a wheel we have on disk.

    ``available`` holds the canonical names present in the lock; ``depends`` lists the
    wheel's Requires-Dist that apply on Pyodide (markers evaluated for emscripten and
    ``python_full_version``, no extras) and are in ``available``.
    """
    names_available = {canonical_name(n) for n in available}
    with zipfile.ZipFile(wheel_path) as wheel:
        dist_info = _dist_info_files(wheel)
        if "METADATA" not in dist_info:
            raise ProvisionError(f"{wheel_path} has no .dist-info/METADATA: not a wheel?")
        metadata = email.parser.HeaderParser().parsestr(
            wheel.read(dist_info["METADATA"]).decode("utf-8")
        )
        imports = _wheel_imports(wheel, dist_info)
    name = str(metadata["Name"])
    depends: list[str] = []
    for requirement in metadata.get_all("Requires-Dist") or []:
        spec, _, marker = str(requirement).partition(";")
        m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", spec)
        if m is None:
            continue
        if marker.strip() and not evaluate_marker(marker, python_full_version):
            continue
        dep = canonical_name(m.group(1))
        if dep in names_available and dep != canonical_name(name) and dep not in depends:
            depends.append(dep)
    return {
        "name": name,
        "version": str(metadata["Version"]),
        "file_name": file_name,
        "install_dir": "site",
        "sha256": _sha256(wheel_path),
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
    ``lock_dir`` when inside it, else absolute ``file:`` URLs)."""
    info = dict(base_lock.get("info", {}))
    python_full = str(info.get("python") or f"{PYTHON_VERSION}.0")
    packages: dict[str, Any] = {}
    for key, entry in dict(base_lock.get("packages", {})).items():
        file_name = str(entry.get("file_name", ""))
        if file_name and "://" not in file_name and (lock_dir / file_name).is_file():
            packages[key] = entry
    wheel_list = list(wheels)
    names: dict[str, Path] = {}
    for wheel in wheel_list:
        parsed = _parse_wheel_name(wheel.name)
        if parsed is None:
            raise ProvisionError(f"not a wheel file name: {wheel.name}")
        names[parsed[0]] = wheel
    available = set(packages) | set(names)
    for key, wheel in names.items():
        packages[key] = lock_entry(
            wheel,
            file_name=_relative_file_name(wheel, lock_dir),
            available=available,
            python_full_version=python_full,
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


# ------------------------------------------------------------------ the Pyodide runtime


def _is_pyodide_dir(path: Path) -> bool:
    return all((path / f).is_file() for f in ("pyodide.mjs", "pyodide.asm.wasm", _LOCK_NAME))


def _pyodide_version_of(path: Path) -> str | None:
    try:
        data = json.loads((path / "package.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    version = data.get("version") if isinstance(data, dict) else None
    return version if isinstance(version, str) else None


def _npm_pyodide(cache: Path, log: Log) -> Path:
    prefix = cache / "npm"
    package = prefix / "node_modules" / "pyodide"
    if _is_pyodide_dir(package) and _pyodide_version_of(package) == PYODIDE_VERSION:
        return package
    npm = shutil.which("npm")
    if npm is None:
        raise ProvisionError(f"`npm` was not found on PATH. {_NPM_HINT}")
    prefix.mkdir(parents=True, exist_ok=True)
    command = [
        npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund",
        "--no-save", "--loglevel=error", f"pyodide@{PYODIDE_VERSION}",
    ]  # fmt: skip
    log(f"fetching the Pyodide runtime with npm: pyodide@{PYODIDE_VERSION} -> {prefix}")
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0 or not _is_pyodide_dir(package):
        raise ProvisionError(
            f"`{' '.join(command)}` failed (exit {done.returncode}); it needs the npm "
            f"registry (or an npm cache holding pyodide@{PYODIDE_VERSION}).\n"
            f"{_tail(done.stderr or done.stdout)}\nAlternatively: {_NPM_HINT}"
        )
    return package


def _sync_file(src: Path, dst: Path) -> bool:
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


def _install_runtime(source: Path, pyodide_dir: Path) -> int:
    """Copy the runtime's top-level files (not its lock: ours replaces it)."""
    copied = 0
    for item in sorted(source.iterdir()):
        if item.is_file() and item.name != _LOCK_NAME:
            copied += _sync_file(item, pyodide_dir / item.name)
    return copied


# ----------------------------------------------------------------------------- wheels


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _check_pip() -> None:
    if importlib.util.find_spec("pip") is None:
        raise ProvisionError(
            f"pip is not available for {sys.executable}: it is needed to fetch wheels "
            f"from PyPI. Install it with `{sys.executable} -m ensurepip --upgrade` "
            "(Debian: `apt install python3-pip`)."
        )


def _find_cached(directory: Path, pin: str) -> Path | None:
    name, version = _split_pin(pin)
    if not directory.is_dir():
        return None
    for path in sorted(directory.glob("*.whl")):
        parsed = _parse_wheel_name(path.name)
        if parsed and parsed[:2] == (name, version) and parsed[2:] == ("none", "any"):
            return path
    return None


def pip_download(requirements: Sequence[str], directory: Path, log: Log) -> None:
    """Pure-Python wheels for Pyodide's Python from PyPI, with the user's own pip."""
    _check_pip()
    directory.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--python-version", PYTHON_VERSION, "--implementation", "py",
        "--platform", "any", "--disable-pip-version-check", "-q",
        "-d", str(directory), *requirements,
    ]  # fmt: skip
    log(f"downloading {len(requirements)} wheel(s) with pip: {' '.join(requirements)}")
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ProvisionError(
            f"`pip download` of {' '.join(requirements)} failed (exit {done.returncode}); "
            "it needs PyPI (or a pip index/--find-links holding these pure-Python "
            f"wheels).\ncommand: {' '.join(command)}\n{_tail(done.stderr or done.stdout)}"
        )


def _download_wheels(pins: Sequence[str], directory: Path, log: Log) -> list[Path]:
    missing = [pin for pin in pins if _find_cached(directory, pin) is None]
    if missing:
        pip_download(missing, directory, log)
    found: list[Path] = []
    for pin in pins:
        path = _find_cached(directory, pin)
        if path is None:
            raise ProvisionError(
                f"pip ran but no pure-Python wheel (py3-none-any) for {pin} is in "
                f"{directory}: Pyodide needs one (an sdist or a native wheel cannot load)"
            )
        found.append(path)
    return found


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
    _check_pip()
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
                f"\ncommand: {' '.join(command)}\n{_tail(done.stderr or done.stdout)}"
            )
        target.mkdir(parents=True, exist_ok=True)
        final = target / built[0].name
        shutil.copy2(built[0], final)
    return final


def _wheel_from_installed(cache: Path, log: Log) -> Path:
    """Our wheel when there is no source tree (pip-installed): zip the installed
    ``pedelec_pyodide`` package with its installed METADATA. Pure Python, no network."""
    import importlib.metadata

    try:
        metadata = importlib.metadata.distribution(_OWN_DIST).read_text("METADATA")
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
    record = [f"{name},sha256={_urlsafe_digest(data)},{len(data)}" for name, data in members] + [
        f"{dist_info}/RECORD,,"
    ]
    members.append((f"{dist_info}/RECORD", ("\n".join(record) + "\n").encode()))
    target.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f"{final.name}.{os.getpid()}.tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members:
            zf.writestr(name, data)
    tmp.replace(final)
    return final


def _urlsafe_digest(data: bytes) -> str:
    raw = hashlib.sha256(data).digest()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


# -------------------------------------------------------------- the page's copy of our wheel

#: What only Core uses (CPython, never imported in a page; ~70 % of the wheel): the
#: page's copy leaves it out, and the ``pedelec`` command (entry_points.txt) with it.
_CORE_ONLY = ("pedelec_pyodide/core/", "pedelec_pyodide/web/")
_CORE_ONLY_META = ("entry_points.txt",)
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
                             f"{_tail(done.stderr or done.stdout)}")  # fmt: skip
    compiled = json.loads(done.stdout)
    return {name: base64.b64decode(data) for name, data in compiled.items()}


def _page_wheel(wheel: Path, runtime: Path, log: Log) -> Path:
    """Our wheel as pages load it: the same distribution and version (file name, METADATA),
    without what only Core uses, plus unchecked-hash ``.pyc`` compiled by ``runtime``'s
    Python next to every module (the ``.py`` stay, for tracebacks), and a RECORD that
    lists every file with its hash. A page otherwise compiles our sources on its main
    thread before ``pedelec:ready``. Without Node, it is the same wheel without .pyc.

    Cached next to ``wheel`` (whose directory is keyed by the sources), per runtime."""
    target = wheel.parent / f"page-{_pyodide_version_of(runtime) or 'unknown'}" / wheel.name
    if target.is_file():
        return target
    with zipfile.ZipFile(wheel) as source:
        record_name = _dist_info_files(source)["RECORD"]
        dist_info = record_name.rpartition("/")[0] + "/"
        dropped = {record_name, *(dist_info + name for name in _CORE_ONLY_META)}
        members = [
            (info, source.read(info))
            for info in source.infolist()
            if not info.filename.startswith(_CORE_ONLY) and info.filename not in dropped
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
    record = [f"{i.filename},sha256={_urlsafe_digest(data)},{len(data)}" for i, data in members]
    record.append(f"{record_name},,")
    members.append((_zip_info(record_name, date), ("\n".join(record) + "\n").encode()))
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for info, data in members:
            zf.writestr(info, data)
    tmp.replace(target)
    return target


def _zip_info(name: str, date: tuple[int, int, int, int, int, int]) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = 0o644 << 16
    return info


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
        if not _is_pyodide_dir(pyodide_src):
            raise ProvisionError(
                f"{pyodide_src} is not a Pyodide runtime directory (it needs pyodide.mjs, "
                f"pyodide.asm.wasm and {_LOCK_NAME}); the npm package pyodide@"
                f"{PYODIDE_VERSION} has them"
            )
        source = pyodide_src
    else:
        source = _npm_pyodide(cache, say)
    version = _pyodide_version_of(source)
    if version is not None and version != PYODIDE_VERSION:
        say(f"warning: {source} is Pyodide {version}, expected {PYODIDE_VERSION}")
    copied = _install_runtime(source, pyodide_dir)
    if copied:
        say(f"copied {copied} runtime file(s) into {pyodide_dir}")

    pins = list(RUNTIME_WHEELS) + (list(TEST_WHEELS) if with_test_wheels else [])
    downloaded = _download_wheels(pins, cache / "wheels", say)

    found_repo = _find_repo(repo)
    own = _page_wheel(
        _build_own_wheel(found_repo, cache, say)
        if found_repo is not None
        else _wheel_from_installed(cache, say),
        source,
        say,
    )

    wheels: dict[str, Path] = {}
    for wheel in [*downloaded, own]:
        destination = pyodide_dir / wheel.name
        _sync_file(wheel, destination)
        parsed = _parse_wheel_name(wheel.name)
        assert parsed is not None
        wheels[parsed[0]] = destination
    # older builds of our own wheel must not linger next to the new one
    for stale in pyodide_dir.glob("pedelec_pyodide-*.whl"):
        if stale != wheels[canonical_name(_OWN_DIST)]:
            stale.unlink()

    base = json.loads((source / _LOCK_NAME).read_text(encoding="utf-8"))
    lock = build_lock(base, wheels.values(), pyodide_dir)
    lock_file = pyodide_dir / _LOCK_NAME
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
        wheels=wheels,
        own_wheel=wheels[canonical_name(_OWN_DIST)],
        packages=tuple(wheels),
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
        prog="python -m pedelec_pyodide.core.provision",
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
