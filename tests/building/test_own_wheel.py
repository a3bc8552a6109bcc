"""Our own wheel as pages load it: without what only the host runs, with bytecode compiled
by Pyodide's Python (faked here: Node is not run), and when pip-installed, zipped from the
installed package."""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import shutil
import zipfile
from pathlib import Path

import pytest
from packaging.version import Version
from wheelkit import PY, check_record, fake_compile, fake_runtime, make_wheel, sha256

from pedelec_pyodide.build import own_wheel
from pedelec_pyodide.build.lock import lock_entry


def test_page_wheel_has_bytecode_and_no_host_only_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_subprocess: list[list[str]]
) -> None:
    own_dir = tmp_path / "own" / "digest"
    own_dir.mkdir(parents=True)
    modules = ("pedelec_pyodide/__init__.py", "pedelec_pyodide/session.py")
    core_only = ("pedelec_pyodide/core/cli.py", "pedelec_pyodide/build/provision.py",
                 "pedelec_pyodide/web/pedelec-pyodide.js")
    files = (*modules, "pedelec_pyodide/py.typed", *core_only)
    built = make_wheel(own_dir, "pedelec-pyodide", "0.1.0", files=files)
    with zipfile.ZipFile(built, "a") as zf:
        zf.writestr("pedelec_pyodide-0.1.0.dist-info/entry_points.txt", "[console_scripts]\n")
    runtime = fake_runtime(tmp_path / "npm-pyodide")
    compiled: list[dict[str, str]] = []

    def compile_(runtime_dir: Path, sources: dict[str, str]) -> dict[str, bytes]:
        assert runtime_dir == runtime
        compiled.append(sources)
        return fake_compile(runtime_dir, sources)

    monkeypatch.setattr(own_wheel, "_compile_for_pyodide", compile_)
    page = own_wheel._page_wheel(built, runtime, print)

    assert page.name == built.name and page != built
    assert compiled == [{m: f"# {m}\n" for m in modules}]
    with zipfile.ZipFile(page) as zf:
        names = check_record(zf)
        for module in modules:
            folder, _, base = module.rpartition("/")
            pyc = f"{folder}/__pycache__/{base[:-3]}.cpython-314.pyc"
            assert zf.read(pyc) == f"pyc of {module}".encode()
            assert zf.read(module) == f"# {module}\n".encode()
        assert not [n for n in names if n.startswith(own_wheel.HOST_ONLY)]
        assert not [n for n in names if n.endswith("entry_points.txt")]
        assert zf.read("pedelec_pyodide-0.1.0.dist-info/METADATA") == zipfile.ZipFile(built).read(
            "pedelec_pyodide-0.1.0.dist-info/METADATA"
        )
    entry = lock_entry(page, file_name=page.name, available=[], python=Version(PY))
    assert (entry["name"], entry["version"]) == ("pedelec-pyodide", "0.1.0")
    assert entry["imports"] == ["pedelec_pyodide"]
    assert entry["sha256"] == sha256(page)
    # cached, and the same bytes when made again (the lock's sha256 depends on the sources)
    assert own_wheel._page_wheel(built, runtime, print) == page and len(compiled) == 1
    first = page.read_bytes()
    page.unlink()
    assert own_wheel._page_wheel(built, runtime, print).read_bytes() == first


def test_page_wheel_without_node_has_no_bytecode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    own_dir = tmp_path / "own" / "digest"
    own_dir.mkdir(parents=True)
    built = make_wheel(own_dir, "pedelec-pyodide", "0.1.0", files=("pedelec_pyodide/a.py",))
    monkeypatch.setattr(shutil, "which", lambda name: None)
    logs: list[str] = []
    page = own_wheel._page_wheel(built, fake_runtime(tmp_path / "rt"), logs.append)
    assert logs == [
        "note: our wheel for pages has no bytecode (pages compile it at start): "
        "`node` was not found on PATH"
    ]
    with zipfile.ZipFile(page) as zf:
        assert not [n for n in check_record(zf) if n.endswith(".pyc")]
        assert "pedelec_pyodide/a.py" in zf.namelist()


def test_wheel_from_installed_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No source tree (pip-installed): the installed package is zipped into a wheel."""
    metadata = "Metadata-Version: 2.4\nName: pedelec-pyodide\nVersion: 9.8.7\n"
    metadata += "Requires-Dist: jsonschema>=4.17\nRequires-Dist: pytest>=8; extra == 'test'\n"

    class FakeDist:
        def read_text(self, name: str) -> str | None:
            return metadata if name == "METADATA" else None

    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: FakeDist())
    monkeypatch.setattr(own_wheel, "_find_repo", lambda repo: None)
    wheel = own_wheel._wheel_from_installed(tmp_path, print)
    assert wheel.name == "pedelec_pyodide-9.8.7-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        assert "pedelec_pyodide/build/provision.py" in names
        assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
        record = zf.read("pedelec_pyodide-9.8.7.dist-info/RECORD").decode().splitlines()
        for line in record:
            name, digest, _size = line.rsplit(",", 2)
            if digest:
                raw = hashlib.sha256(zf.read(name)).digest()
                assert digest == "sha256=" + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
    assert set(names) == {line.rsplit(",", 2)[0] for line in record}
    entry = lock_entry(wheel, file_name=wheel.name, available=["jsonschema", "pytest"],
                       python=Version(PY))
    assert entry["imports"] == ["pedelec_pyodide"]
    assert entry["depends"] == ["jsonschema"]
    assert own_wheel._wheel_from_installed(tmp_path, print) == wheel  # cached
