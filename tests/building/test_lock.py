"""Our pyodide-lock.json: one entry per wheel we have, its depends as Pyodide sees them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from packaging.version import Version
from wheelkit import PY, make_wheel, sha256

from pedelec_pyodide.build import lock
from pedelec_pyodide.build.report import ProvisionError

PYTHON = Version(PY)


def test_lock_entry_from_fixture_wheel(tmp_path: Path) -> None:
    wheel = make_wheel(
        tmp_path,
        "Foo_Bar",
        "1.2.0",
        requires=(
            "dep-a",
            'dep_b>=1 ; python_version < "3.11"',
            'colorama; sys_platform == "win32"',
            "Dep.C[fast] (>=2)",
            "not-in-lock>=1",
            'dep-a; extra == "test"',
            'dep-d; extra == "test"',
            "foo-bar",  # a self-dependency is dropped
        ),
        files=("foo/__init__.py", "foo/sub/x.py", "foo_mod.py", "foo-1.2.0.data/scripts/s"),
    )
    available = ["dep-a", "dep_b", "colorama", "dep-c", "dep-d", "foo-bar"]
    entry = lock.lock_entry(wheel, file_name=wheel.name, available=available, python=PYTHON)
    assert entry == {
        "name": "Foo_Bar",
        "version": "1.2.0",
        "file_name": wheel.name,
        "install_dir": "site",
        "sha256": sha256(wheel),
        "package_type": "package",
        "imports": ["foo", "foo_mod"],
        "depends": ["dep-a", "dep-c"],
        "unvendored_tests": False,
    }


def test_lock_entry_prefers_top_level_txt(tmp_path: Path) -> None:
    wheel = make_wheel(
        tmp_path, "thing", "0.1", files=("thing/__init__.py", "_private.py"), top_level="thing\n"
    )
    entry = lock.lock_entry(wheel, file_name="x", available=[], python=PYTHON)
    assert entry["imports"] == ["thing"]


def test_build_lock_keeps_info_drops_missing_base_packages(tmp_path: Path) -> None:
    lock_dir = tmp_path / "pyodide"
    lock_dir.mkdir()
    (lock_dir / "shipped-1.0-py3-none-any.whl").write_bytes(b"x")
    base = {
        "info": {"arch": "wasm32", "python": "3.14.2", "platform": "emscripten_5_0_3"},
        "packages": {
            "shipped": {"name": "shipped", "file_name": "shipped-1.0-py3-none-any.whl"},
            "absent": {"name": "absent", "file_name": "absent-1.0-py3-none-any.whl"},
            "remote": {"name": "remote", "file_name": "https://cdn.example/r.whl"},
        },
    }
    inside = make_wheel(lock_dir, "app", "1.0", requires=("shipped", "absent"), files=("app.py",))
    outside = make_wheel(tmp_path, "lib", "2.0", requires=("app",), files=("lib/__init__.py",))
    made = lock.build_lock(base, [inside, outside], lock_dir)
    assert made["info"] == base["info"]
    assert sorted(made["packages"]) == ["app", "lib", "shipped"]
    app, lib = made["packages"]["app"], made["packages"]["lib"]
    assert app["file_name"] == inside.name
    assert app["depends"] == ["shipped"]  # "absent" is not in the lock
    assert lib["file_name"] == outside.resolve().as_uri()
    assert lib["depends"] == ["app"]
    assert app["sha256"] == sha256(inside) and lib["sha256"] == sha256(outside)


def test_write_lock_is_idempotent(tmp_path: Path) -> None:
    path = tmp_path / "pyodide-lock.json"
    made = {"info": {"python": PY}, "packages": {}}
    assert lock.write_lock(path, made) is True
    mtime = path.stat().st_mtime_ns
    assert lock.write_lock(path, made) is False
    assert path.stat().st_mtime_ns == mtime
    assert json.loads(path.read_text()) == made


def test_a_lock_without_the_runtime_python_is_refused(tmp_path: Path) -> None:
    """Markers are evaluated for the Python the runtime's lock names: no guessing."""
    wheel = make_wheel(tmp_path, "app", "1.0", files=("app.py",))
    for info in ({}, {"python": "three"}):
        with pytest.raises(ProvisionError, match=r"info\.python"):
            lock.build_lock({"info": info, "packages": {}}, [wheel], tmp_path)


def test_depends_follow_the_runtime_python(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path, "app", "1.0", files=("app.py",),
                       requires=('old; python_version < "3.14"', 'new; python_version >= "3.14"'))
    base = {"info": {"python": PY}, "packages": {}}
    old, new = (make_wheel(tmp_path, name, "1.0", files=(f"{name}.py",)) for name in ("old", "new"))
    assert lock.build_lock(base, [wheel, old, new], tmp_path)["packages"]["app"]["depends"] == [
        "new"]
    base["info"]["python"] = "3.13.1"
    assert lock.build_lock(base, [wheel, old, new], tmp_path)["packages"]["app"]["depends"] == [
        "old"]
