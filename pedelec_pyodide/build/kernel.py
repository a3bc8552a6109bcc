"""The notebook kernel of a JupyterLite site: the installed ``jupyterlite-pyodide-kernel``
(its version, its Pyodide, the wheels it ships in its own piplite index), the wheels it
needs at start (derived, not listed here: ``micropip``, which the kernel loads before
anything else, and the requirements of the wheels it ships, closed over their own
requirements; versions are the npm lock's where it has the package, else the newest on
PyPI), and its memory snapshot's recipe."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from packaging.utils import NormalizedName, canonicalize_name
from packaging.version import Version

from . import wheels as pypi
from .report import LiteError, Log, ProvisionError
from .runtime import PYODIDE_VERSION
from .snapshot import Recipe

__all__ = [
    "KERNEL_SNAPSHOT",
    "KERNEL_START",
    "KernelInfo",
    "install_hint",
    "kernel_info",
    "start_wheels",
    "startup_roots",
    "wheel_name_of",
]

#: what the kernel loads with ``loadPackage`` before its piplite installs
_KERNEL_PRELOADS = ("micropip",)
#: what the kernel installs at start, in its order (its worker: micropip, then piplite,
#: then these through piplite), each skipped when ``loadPyodideOptions.packages`` names it
KERNEL_START = ("micropip", "piplite", "ipykernel", "comm", "pyodide-kernel", "jedi",
                "ipython")
_SERIES = "0.8."
#: the kernel's libraries, imported in its snapshot: not the kernel itself, nor
#: ipykernel, piplite or micropip, which hold JavaScript objects a snapshot cannot keep
KERNEL_SNAPSHOT = Recipe(
    whose="notebook kernel's", name="pedelec-kernel-snapshot.bin",
    manifest="pedelec-kernel-snapshot.json", roots=("ipython", "jedi", "comm"),
    imports=("IPython", "jedi", "comm", "traitlets", "pygments"), encodings=("gzip",))


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


@dataclasses.dataclass(frozen=True)
class KernelInfo:
    """The installed ``jupyterlite-pyodide-kernel``: its version, its Pyodide, and the
    wheels it ships in its own piplite index (installed at kernel start)."""

    version: str
    core_version: str
    pyodide_version: str
    bundled_wheels: tuple[Path, ...]


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
    that the kernel's Pyodide is the one :mod:`.provision` provisions."""
    version = _distribution_version("jupyterlite-pyodide-kernel")
    core_version = _distribution_version("jupyterlite-core")
    for dist, found in (("jupyterlite-pyodide-kernel", version),
                        ("jupyterlite-core", core_version)):
        if not found.startswith(_SERIES):
            raise LiteError(f"{dist} {found} is installed, {_SERIES}x is needed: "
                            f"{install_hint()}")
    constants = importlib.import_module("jupyterlite_pyodide_kernel.constants")
    pyodide_version = str(constants.PYODIDE_VERSION)
    if pyodide_version != PYODIDE_VERSION:
        raise LiteError(
            f"jupyterlite-pyodide-kernel {version} runs Pyodide {pyodide_version}, but this "
            f"pedelec-pyodide provisions Pyodide {PYODIDE_VERSION} for pages and "
            "notebooks alike: install a kernel that pins it (pip install "
            f"'pedelec-pyodide[lite]' picks a matching one) or upgrade pedelec-pyodide"
        )
    bundled = tuple(sorted(_kernel_pypi_dir().glob("*.whl")))
    return KernelInfo(version, core_version, pyodide_version, bundled)


def startup_roots(bundled_wheels: Sequence[Path], python: Version) -> list[NormalizedName]:
    """What the kernel needs from the lock at start: its preloads, and the requirements
    of the wheels it installs from its own index that are not in that index."""
    shipped = {wheel_name_of(wheel) for wheel in bundled_wheels}
    roots = [canonicalize_name(name) for name in _KERNEL_PRELOADS]
    for wheel in bundled_wheels:
        for name in pypi.requirements_of(wheel, python):
            if name not in shipped and name not in roots:
                roots.append(name)
    return roots


def wheel_name_of(wheel: Path) -> NormalizedName:
    """The canonical project name in a wheel's file name."""
    parsed = pypi.wheel_name(wheel.name)
    if parsed is None:
        raise LiteError(f"{wheel} is not named like a wheel")
    return parsed[0]


def _fetch_newest(names: Sequence[str], directory: Path, log: Log,
                  python: Version) -> dict[str, Path]:
    """Wheels for names the npm lock does not pin: the cached one, else PyPI's newest."""
    missing = [n for n in names if pypi.newest_cached(directory, n, python) is None]
    if missing:
        pypi.pip_download(missing, directory, log, python)
    found: dict[str, Path] = {}
    for name in names:
        path = pypi.newest_cached(directory, name, python)
        if path is None:
            raise LiteError(f"PyPI has no pure-Python wheel (py3-none-any) of {name}: "
                            "the Pyodide kernel cannot load it")
        found[name] = path
    return found


def start_wheels(
    roots: Sequence[str], npm_lock: dict[str, Any], have: set[str], directory: Path,
    python: Version, log: Log,
) -> dict[str, Path]:
    """The roots and their requirements, level by level: npm lock versions, PyPI wheels."""
    try:
        return _close_over(roots, npm_lock, have, directory, python, log)
    except ProvisionError as exc:
        raise LiteError(str(exc)) from None


def _close_over(
    roots: Sequence[str], npm_lock: dict[str, Any], have: set[str], directory: Path,
    python: Version, log: Log,
) -> dict[str, Path]:
    packages: dict[str, Any] = npm_lock.get("packages", {})
    pure = pypi.pure_tags(python)
    wheels: dict[str, Path] = {}
    level = [n for n in dict.fromkeys(roots) if n not in have]
    while level:
        pins: dict[str, str] = {}
        newest: list[str] = []
        for name in level:
            entry = packages.get(name)
            parsed = pypi.wheel_name(str(entry.get("file_name", ""))) if entry else None
            if entry is None:
                newest.append(name)
            elif parsed is not None and parsed[2] & pure:
                pins[name] = f"{entry['name']}=={entry['version']}"
            else:
                raise LiteError(
                    f"the kernel needs {name}, which Pyodide builds for WebAssembly "
                    f"({entry.get('file_name')}); PyPI has no such wheel to serve offline"
                )
        fetched = pypi.download_wheels(list(pins.values()), directory, log, python)
        found = dict(zip(pins, fetched, strict=True))
        found.update(_fetch_newest(newest, directory, log, python))
        wheels.update(found)
        seen = have | set(wheels)
        following: list[str] = []
        for wheel in found.values():
            for name in pypi.requirements_of(wheel, python):
                if name not in seen and name not in following:
                    following.append(name)
        level = following
    return wheels
