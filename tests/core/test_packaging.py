"""The wheel: what `pip install pedelec-pyodide` gives a user, built and installed for real."""

from __future__ import annotations

import re
import subprocess
import sys
import sysconfig
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
                     "pedelec_pyodide/core/server.py", "pedelec_pyodide/build/provision.py",
                     # run under Node at provisioning: found next to the modules that run them
                     "pedelec_pyodide/build/make_snapshot.mjs",
                     "pedelec_pyodide/build/compile_pyc.mjs"):
        assert expected in names
    assert not any(name.startswith("tests/") for name in names)


def test_an_installed_wheel_finds_its_own_web_files(wheel: Path, tmp_path: Path) -> None:
    env = tmp_path / "venv"
    venv.create(env, with_pip=True)
    python = env / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", str(wheel)],
                   check=True, timeout=300)
    found = subprocess.run(
        [str(python), "-c", "from pedelec_pyodide.build.web import default_web_dir;"
                            "print(default_web_dir())"],
        check=True, capture_output=True, text=True, cwd=tmp_path, timeout=60,
    ).stdout.strip()
    assert found == str(env / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}"
                        / "site-packages" / "pedelec_pyodide" / "web")


# docs/how-to/install.md: a built wheel installed with the extra
DOCUMENTED_WHEEL_INSTALL = re.compile(
    r"^\.venv/bin/pip install \"(pedelec-pyodide\[core\]) @ file://\S+/pedelec_pyodide-[^/\"]+"
    r"\.whl\"$", re.MULTILINE)
INSTALL_GUIDE = REPO / "docs" / "how-to" / "install.md"
# what no index serves: an install by the bare name
BY_NAME = re.compile(r"pip install '?pedelec-pyodide\[[a-z,]+\]'?(?!\s*@)")


def test_the_docs_install_from_a_checkout_or_a_wheel_never_by_name() -> None:
    docs = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    assert len(docs) > 10
    for doc in docs:
        assert not BY_NAME.search(doc.read_text()), doc


def test_the_wheel_installs_with_the_core_extra_as_the_install_guide_says(
        wheel: Path, tmp_path: Path) -> None:
    """The command of docs/how-to/install.md, with this wheel's URL, into a fresh venv gives
    a working `pedelec`. Offline: the extra's requirements must be satisfied by the distributions of
    this test's environment (all but pedelec-pyodide itself, seen through a .pth file), so
    pip resolves the extra without an index."""
    documented = DOCUMENTED_WHEEL_INSTALL.search(INSTALL_GUIDE.read_text())
    assert documented, "docs/how-to/install.md shows no `pip install 'pedelec-pyodide[core] @ file:///…'`"
    here = Path(sysconfig.get_paths()["purelib"])
    deps = tmp_path / "deps"
    deps.mkdir()
    for entry in here.iterdir():
        if not entry.name.lower().replace("-", "_").lstrip("_").startswith(
                ("pedelec_pyodide", "editable_impl_pedelec_pyodide")):
            (deps / entry.name).symlink_to(entry)
    env = tmp_path / "venv"
    venv.create(env, with_pip=True)
    python = env / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig;"
                           "print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True, timeout=60).stdout.strip()
    (Path(site) / "deps.pth").write_text(f"{deps}\n")
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-index",
                    "--disable-pip-version-check", f"{documented[1]} @ {wheel.as_uri()}"],
                   check=True, timeout=300)
    shown = subprocess.run([str(env / "bin" / "pedelec"), "--help"], check=True,
                           capture_output=True, text=True, cwd=tmp_path, timeout=60).stdout
    assert "serve" in shown and "demo" in shown
    where = subprocess.run([str(python), "-c", "import pedelec_pyodide, starlette;"
                            "print(pedelec_pyodide.__file__)"],
                           check=True, capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert where.stdout.strip().startswith(site)
