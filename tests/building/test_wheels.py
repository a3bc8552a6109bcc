"""Wheels for Pyodide's Python: names, pins, markers evaluated inside Pyodide, the cache
and pip (patched: any network attempt shows)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from packaging.tags import Tag
from packaging.utils import canonicalize_name
from packaging.version import Version
from wheelkit import PY, make_wheel

from pedelec_pyodide.build import wheels
from pedelec_pyodide.build.report import ProvisionError
from pedelec_pyodide.build.runtime import PYODIDE_VERSION

PYTHON = Version(PY)


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        ("Pygments", "pygments"),
        ("typing_extensions", "typing-extensions"),
        ("ruamel.yaml", "ruamel-yaml"),
        ("A__b--C..d", "a-b-c-d"),
        ("pedelec-pyodide", "pedelec-pyodide"),
    ],
)
def test_lock_keys_are_canonical_names(raw: str, canonical: str) -> None:
    assert canonicalize_name(raw) == canonical
    escaped = re.sub(r"[-_.]+", "_", raw)  # as a wheel's file name spells it (PEP 427)
    assert wheels.wheel_name(f"{escaped}-1.0-py3-none-any.whl") == (
        canonical, Version("1.0"), frozenset({Tag("py3", "none", "any")}))


@pytest.mark.parametrize(
    ("marker", "expected"),
    [
        ('python_version < "3.11"', False),
        ("python_version < '3.8'", False),
        ('python_version >= "3.8"', True),
        ('python_version > "3.9"', True),
        ('python_version == "3.14"', True),
        ('python_full_version >= "3.14.1"', True),
        ('python_full_version ~= "3.14.0"', True),
        ('python_full_version ~= "3.13.0"', False),
        ('sys_platform == "win32"', False),
        ('sys_platform == "emscripten"', True),
        ('platform_system != "Windows"', True),
        ('os_name == "nt"', False),
        ('platform_machine == "wasm32"', True),
        ('implementation_name == "cpython"', True),
        ('"emscripten" in sys_platform', True),
        ('"win" not in sys_platform', True),
        ('extra == "test"', False),
        ('extra == "test" or python_version >= "3.10"', True),
        (
            '(sys_platform == "win32" or sys_platform == "emscripten") and extra == "zoneinfo"',
            False,
        ),
        ('(sys_platform == "win32" or sys_platform == "emscripten") and python_version>"3"', True),
        ('python_version < "3.11" and extra == "dev"', False),
    ],
)
def test_markers_are_evaluated_for_pyodide(marker: str, expected: bool) -> None:
    required = wheels.requirements_on_pyodide([f"dep; {marker}"], PYTHON)
    assert required == (["dep"] if expected else [])


@pytest.mark.parametrize(
    "marker", ["python_version <", 'bogus_var == "1"', '(sys_platform == "x"', "== 'x'"]
)
def test_a_malformed_marker_is_refused(marker: str) -> None:
    with pytest.raises(ValueError):
        wheels.requirements_on_pyodide([f"dep; {marker}"], PYTHON)


def test_pins_are_exact_and_unique() -> None:
    names = [wheels.exact_pin(p)[0] for p in (*wheels.RUNTIME_WHEELS, *wheels.TEST_WHEELS)]
    assert len(names) == len(set(names))
    assert "jsonschema==4.17.3" in wheels.RUNTIME_WHEELS
    assert PYODIDE_VERSION == "314.0.6"
    assert wheels.exact_pin("Beta.X==2.0") == ("beta-x", Version("2.0"))
    for loose in ("attrs>=1", "attrs==1.*", "attrs", "attrs==1,!=1.1"):
        with pytest.raises(ValueError):
            wheels.exact_pin(loose)


def test_download_uses_cache_without_pip(tmp_path: Path, no_subprocess: list[list[str]]) -> None:
    make_wheel(tmp_path, "alpha", "1.0")
    make_wheel(tmp_path, "beta_x", "2.0", tag="py2.py3-none-any")
    make_wheel(tmp_path, "alpha", "0.9")
    make_wheel(tmp_path, "gamma", "1.0", tag="cp314-cp314-pyemscripten_2026_0_wasm32")
    found = wheels.download_wheels(["alpha==1.0", "Beta.X==2.0"], tmp_path, print, PYTHON)
    assert [p.name for p in found] == [
        "alpha-1.0-py3-none-any.whl",
        "beta_x-2.0-py2.py3-none-any.whl",
    ]
    assert no_subprocess == []


def test_download_failure_says_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_wheel(tmp_path, "alpha", "1.0")
    seen: list[list[str]] = []

    def failing_pip(command: list[str], *args: Any, **kwargs: Any) -> Any:
        seen.append(command)
        return subprocess.CompletedProcess(command, 1, "", "ERROR: No matching distribution")

    monkeypatch.setattr(subprocess, "run", failing_pip)
    with pytest.raises(ProvisionError) as info:
        wheels.download_wheels(["alpha==1.0", "gamma==3.0"], tmp_path, print, PYTHON)
    message = str(info.value)
    assert "gamma==3.0" in message and "alpha==1.0" not in message.split("\n")[0]
    assert "PyPI" in message and "No matching distribution" in message
    (command,) = seen
    assert command[command.index("--python-version") + 1] == "3.14"  # the runtime's, PY
    assert {"--no-deps", "--only-binary=:all:", "gamma==3.0"} <= set(command)
    assert command[command.index("--platform") + 1] == "any"


def test_no_pure_python_wheel_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        subprocess, "run", lambda c, *a, **k: subprocess.CompletedProcess(c, 0, "", "")
    )
    with pytest.raises(ProvisionError, match=r"no pure-Python wheel .* for gamma==3.0"):
        wheels.download_wheels(["gamma==3.0"], tmp_path, print, PYTHON)
