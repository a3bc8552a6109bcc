"""Pure-Python wheels for the Pyodide runtime's Python, from PyPI: the pins, the cache,
the user's own ``pip``, and what a wheel requires on Pyodide (its markers evaluated there).

Names, versions, tags and markers are :mod:`packaging`'s rules; only the environment is
ours: Pyodide's (emscripten, wasm32) with the runtime's Python.
"""

from __future__ import annotations

import email.message
import email.parser
import subprocess
import sys
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from packaging.requirements import Requirement
from packaging.tags import Tag, compatible_tags
from packaging.utils import (
    InvalidWheelFilename,
    NormalizedName,
    canonicalize_name,
    parse_wheel_filename,
)
from packaging.version import Version

from .report import Log, ProvisionError, check_pip, tail

__all__ = [
    "RUNTIME_WHEELS",
    "TEST_WHEELS",
    "download_wheels",
    "exact_pin",
    "find_cached",
    "newest_cached",
    "pip_download",
    "pure_tags",
    "pyodide_environment",
    "requirements_of",
    "requirements_on_pyodide",
    "wheel_metadata",
    "wheel_name",
]

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


def exact_pin(pin: str) -> tuple[NormalizedName, Version]:
    """(canonical name, version) of ``name==version``; ValueError for anything looser."""
    requirement = Requirement(pin)
    specifiers = list(requirement.specifier)
    if len(specifiers) != 1 or specifiers[0].operator != "==" or "*" in specifiers[0].version:
        raise ValueError(f"not an exact pin: {pin!r}")
    return canonicalize_name(requirement.name), Version(specifiers[0].version)


def wheel_name(file_name: str) -> tuple[NormalizedName, Version, frozenset[Tag]] | None:
    """(canonical name, version, tags) of a wheel's file name, or None if it is not one."""
    try:
        name, version, _build, tags = parse_wheel_filename(file_name)
    except InvalidWheelFilename:
        return None
    return name, version, tags


# ------------------------------------------------------------------ Pyodide's environment


def pure_tags(python: Version) -> frozenset[Tag]:
    """The tags of a pure-Python wheel that ``python`` loads (``py3-none-any``,
    ``py314-none-any``, ...): the only wheels Pyodide can take from PyPI."""
    return frozenset(compatible_tags((python.major, python.minor), platforms=["any"]))


def pyodide_environment(python: Version) -> dict[str, str]:
    """The PEP 508 marker environment inside Pyodide running ``python``, with no extra."""
    return {
        "python_version": f"{python.major}.{python.minor}",
        "python_full_version": str(python),
        "implementation_version": str(python),
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


def requirements_on_pyodide(requires_dist: Iterable[str], python: Version) -> list[NormalizedName]:
    """The canonical names of the ``Requires-Dist`` lines that apply inside Pyodide running
    ``python`` (markers evaluated, no extras), in order, each once. ValueError for a
    malformed one."""
    environment = pyodide_environment(python)
    names: list[NormalizedName] = []
    for line in requires_dist:
        requirement = Requirement(line)
        if requirement.marker is not None and not requirement.marker.evaluate(environment):
            continue
        name = canonicalize_name(requirement.name)
        if name not in names:
            names.append(name)
    return names


def wheel_metadata(wheel: zipfile.ZipFile) -> email.message.Message | None:
    """The wheel's ``.dist-info/METADATA`` headers, or None when it has none."""
    members = [m for m in wheel.namelist()
               if m.count("/") == 1 and m.endswith(".dist-info/METADATA")]
    if not members:
        return None
    return email.parser.HeaderParser().parsestr(wheel.read(members[0]).decode("utf-8"))


def requirements_of(wheel: Path, python: Version) -> list[NormalizedName]:
    """Canonical names ``wheel`` requires inside Pyodide running ``python``."""
    with zipfile.ZipFile(wheel) as archive:
        metadata = wheel_metadata(archive)
    if metadata is None:
        raise ProvisionError(f"{wheel} has no .dist-info/METADATA: not a wheel?")
    return requirements_on_pyodide(map(str, metadata.get_all("Requires-Dist") or []), python)


# ------------------------------------------------------------------ the cache and PyPI


def find_cached(directory: Path, pin: str, python: Version) -> Path | None:
    """The pure-Python wheel of the exact ``pin`` in ``directory``, if there."""
    name, version = exact_pin(pin)
    pure = pure_tags(python)
    for path in sorted(directory.glob("*.whl")) if directory.is_dir() else ():
        parsed = wheel_name(path.name)
        if parsed and parsed[:2] == (name, version) and parsed[2] & pure:
            return path
    return None


def newest_cached(directory: Path, name: str, python: Version) -> Path | None:
    """The newest pure-Python wheel of ``name`` in ``directory``, if any."""
    pure = pure_tags(python)
    found: list[tuple[Version, Path]] = []
    for path in directory.glob("*.whl") if directory.is_dir() else ():
        parsed = wheel_name(path.name)
        if parsed and parsed[0] == canonicalize_name(name) and parsed[2] & pure:
            found.append((parsed[1], path))
    return max(found)[1] if found else None


def pip_download(requirements: Sequence[str], directory: Path, log: Log,
                 python: Version) -> None:
    """Pure-Python wheels for ``python`` (Pyodide's) from PyPI, with the user's own pip."""
    check_pip()
    directory.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--python-version", f"{python.major}.{python.minor}", "--implementation", "py",
        "--platform", "any", "--disable-pip-version-check", "-q",
        "-d", str(directory), *requirements,
    ]  # fmt: skip
    log(f"downloading {len(requirements)} wheel(s) with pip: {' '.join(requirements)}")
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ProvisionError(
            f"`pip download` of {' '.join(requirements)} failed (exit {done.returncode}); "
            "it needs PyPI (or a pip index/--find-links holding these pure-Python "
            f"wheels).\ncommand: {' '.join(command)}\n{tail(done.stderr or done.stdout)}"
        )


def download_wheels(pins: Sequence[str], directory: Path, log: Log,
                    python: Version) -> list[Path]:
    """The wheels of the exact ``pins``, from ``directory`` or else PyPI, in their order."""
    missing = [pin for pin in pins if find_cached(directory, pin, python) is None]
    if missing:
        pip_download(missing, directory, log, python)
    found: list[Path] = []
    for pin in pins:
        path = find_cached(directory, pin, python)
        if path is None:
            raise ProvisionError(
                f"pip ran but no pure-Python wheel (py3-none-any) for {pin} is in "
                f"{directory}: Pyodide needs one (an sdist or a native wheel cannot load)"
            )
        found.append(path)
    return found
