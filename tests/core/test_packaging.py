"""The wheel: what `pip install pedelec-pyodide` gives a user, built and installed for real."""

from __future__ import annotations

import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out),
                    str(REPO)], check=True, timeout=300)
    (built,) = out.glob("pedelec_pyodide-*.whl")
    return built


def test_the_wheel_carries_types_the_bridge_and_the_demo(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for expected in ("pedelec_pyodide/py.typed", "pedelec_pyodide/web/pedelec-pyodide.js",
                     "pedelec_pyodide/web/pedelec-pyodide.d.ts",
                     "pedelec_pyodide/web/demo/index.html", "pedelec_pyodide/web/demo/tools.py",
                     "pedelec_pyodide/core/server.py"):
        assert expected in names
    assert not any(name.startswith("tests/") for name in names)


def test_an_installed_wheel_finds_its_own_web_files(wheel: Path, tmp_path: Path) -> None:
    env = tmp_path / "venv"
    venv.create(env, with_pip=True)
    python = env / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", str(wheel)],
                   check=True, timeout=300)
    found = subprocess.run(
        [str(python), "-c", "from pedelec_pyodide.core.config import default_web_dir;"
                            "print(default_web_dir())"],
        check=True, capture_output=True, text=True, cwd=tmp_path, timeout=60,
    ).stdout.strip()
    assert found == str(env / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}"
                        / "site-packages" / "pedelec_pyodide" / "web")
