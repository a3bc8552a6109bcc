"""Provisioning end to end: the runtime, the wheels, our wheel and the lock laid out in one
directory, and what it says when something is missing.

Everything but the last test runs offline, on wheels built here in a tmp dir and a fake
Pyodide runtime dir; subprocess (npm, pip) is patched to fail so any network attempt
shows. The last test runs the real provision when the cache already holds the npm
runtime and the pinned wheels, else it is skipped.
"""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import pytest
from packaging.version import Version
from wheelkit import PY, check_record, fake_compile, fake_runtime, make_wheel, sha256

from pedelec_pyodide.build import own_wheel, wheels
from pedelec_pyodide.build import provision as prov
from pedelec_pyodide.build import runtime as pyodide

REPO = Path(__file__).resolve().parents[2]


def test_missing_npm_is_explained(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_subprocess: list[list[str]]
) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(prov.ProvisionError) as info:
        prov.provision(tmp_path / "out", cache=tmp_path / "cache", repo=REPO, log=print)
    message = str(info.value)
    assert "`npm` was not found" in message
    assert "pedelec serve --pyodide OUT/pyodide" in message and pyodide.PYODIDE_VERSION in message
    assert "provision OUT --pyodide node_modules/pyodide" in message
    assert no_subprocess == []


def test_bad_pyodide_dir_is_explained(tmp_path: Path) -> None:
    with pytest.raises(prov.ProvisionError, match="not a Pyodide runtime directory"):
        prov.provision(tmp_path / "out", pyodide_src=tmp_path, cache=tmp_path, log=print)


def test_cache_dir_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PEDELEC_CACHE_DIR", str(tmp_path))
    assert prov.cache_dir() == tmp_path
    monkeypatch.delenv("PEDELEC_CACHE_DIR")
    assert prov.cache_dir() == Path.home() / ".cache" / "pedelec-pyodide"


# ------------------------------------------------ provision() end to end, offline


def test_provision_offline_and_idempotent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_subprocess: list[list[str]]
) -> None:
    cache = tmp_path / "cache"
    cached = cache / "wheels"
    cached.mkdir(parents=True)
    make_wheel(cached, "libdep", "1.0", files=("libdep.py",))
    make_wheel(cached, "Lib.Top", "2.0", requires=("libdep", "missing"), files=("lib_top/a.py",))
    make_wheel(cached, "testonly", "3.0", files=("testonly.py",))
    monkeypatch.setattr(wheels, "RUNTIME_WHEELS", ("lib.top==2.0", "libdep==1.0"))
    monkeypatch.setattr(wheels, "TEST_WHEELS", ("testonly==3.0",))
    # other people edit the sources meanwhile: pin the digest our own wheel is cached under
    monkeypatch.setattr(own_wheel, "_source_digest", lambda repo: "fixed-digest")
    own_dir = cache / "own" / "fixed-digest"
    own_dir.mkdir(parents=True)
    make_wheel(
        own_dir, "pedelec-pyodide", "0.1.0", requires=("lib.top",), files=("pedelec_pyodide/x.py",)
    )
    runtime = fake_runtime(tmp_path / "npm-pyodide")
    monkeypatch.setattr(own_wheel, "_compile_for_pyodide", fake_compile)
    logs: list[str] = []
    out = tmp_path / "out"

    # a fake runtime has no snapshot to make (test_snapshot.py makes real ones)
    result = prov.provision(out, pyodide_src=runtime, cache=cache, repo=REPO, log=logs.append,
                            snapshot=False)

    assert no_subprocess == []
    assert result.pyodide_dir == out / "pyodide"
    assert result.lock_file == out / "pyodide" / "pyodide-lock.json"
    assert result.own_wheel.name == "pedelec_pyodide-0.1.0-py3-none-any.whl"
    assert set(result.packages) == {"lib-top", "libdep", "pedelec-pyodide"}
    for name in ("pyodide.mjs", "pyodide.asm.wasm", "python_stdlib.zip", "package.json"):
        assert (result.pyodide_dir / name).read_bytes() == (runtime / name).read_bytes()
    lock = json.loads(result.lock_file.read_text())
    assert lock["info"] == {"python": PY, "arch": "wasm32"}
    assert sorted(lock["packages"]) == ["lib-top", "libdep", "pedelec-pyodide"]
    for entry in lock["packages"].values():
        wheel = result.pyodide_dir / entry["file_name"]
        assert wheel.is_file() and entry["sha256"] == sha256(wheel)
    assert lock["packages"]["lib-top"]["depends"] == ["libdep"]
    assert lock["packages"]["pedelec-pyodide"]["depends"] == ["lib-top"]
    assert lock["packages"]["pedelec-pyodide"]["imports"] == ["pedelec_pyodide"]

    # second run: nothing copied, nothing written
    logs.clear()
    again = prov.provision(out, pyodide_src=runtime, cache=cache, repo=REPO, log=logs.append,
                           snapshot=False)
    assert again == result
    assert len(logs) == 1 and logs[0].startswith("ready in")

    # with the test set: one more package in the lock, still no subprocess
    with_tests = prov.provision(
        out, pyodide_src=runtime, cache=cache, repo=REPO, log=logs.append, with_test_wheels=True,
        snapshot=False)
    assert "testonly" in json.loads(with_tests.lock_file.read_text())["packages"]
    assert no_subprocess == []


def test_cli_reports_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = prov.main([str(tmp_path / "out"), "--pyodide", str(tmp_path), "--cache-dir", "x"])
    assert code == 1
    assert "not a Pyodide runtime directory" in capsys.readouterr().err


# -------------------------------------------------------- the real thing, if cached


def test_real_provision_from_cache(tmp_path: Path) -> None:
    cache = prov.cache_dir()
    npm_pkg = cache / "npm" / "node_modules" / "pyodide"
    pins = (*wheels.RUNTIME_WHEELS, *wheels.TEST_WHEELS)
    npm_lock = (json.loads((npm_pkg / pyodide.LOCK_NAME).read_text())
                if pyodide.pyodide_version_of(npm_pkg) == pyodide.PYODIDE_VERSION else None)
    python = pyodide.python_of(npm_lock) if npm_lock is not None else None
    missing = [p for p in pins
               if python is None or wheels.find_cached(cache / "wheels", p, python) is None]
    if npm_lock is None or python is None or missing:
        pytest.skip(
            f"cache {cache} not populated (run `python -m pedelec_pyodide.build.provision "
            "DIR --with-tests` once, with network)"
        )
    result = prov.provision(tmp_path / "out", with_test_wheels=True, repo=REPO, log=print)
    lock = json.loads(result.lock_file.read_text())
    assert lock["info"] == npm_lock["info"]
    assert python.major == 3 and python.minor >= 14  # Pyodide 314 runs CPython 3.14
    expected = {wheels.exact_pin(p)[0] for p in pins} | {"pedelec-pyodide"}
    assert set(lock["packages"]) == expected
    for pin in pins:
        name, version = wheels.exact_pin(pin)
        entry = lock["packages"][name]
        assert Version(entry["version"]) == version
        assert entry["sha256"] == sha256(result.pyodide_dir / entry["file_name"])
    assert lock["packages"]["jsonschema"]["depends"] == ["attrs", "pyrsistent"]
    assert set(lock["packages"]["pytest"]["depends"]) == {
        "iniconfig",
        "packaging",
        "pluggy",
        "pygments",
    }
    assert lock["packages"]["attrs"]["imports"] == ["attr", "attrs"]
    assert (result.pyodide_dir / "pyodide.asm.wasm").is_file()
    own = lock["packages"]["pedelec-pyodide"]
    assert own["sha256"] == sha256(result.own_wheel)
    with zipfile.ZipFile(result.own_wheel) as zf:
        names = check_record(zf)
        modules = [n for n in names if n.endswith(".py")]
        assert "pedelec_pyodide/browser.py" in modules
        assert not [n for n in names if n.startswith(own_wheel.HOST_ONLY)]
        if shutil.which("node") is None:
            return
        for module in modules:
            folder, _, base = module.rpartition("/")
            tag = f"cpython-{python.major}{python.minor}"  # the runtime's Python
            header = zf.read(f"{folder}/__pycache__/{base[:-3]}.{tag}.pyc")[:16]
            # PEP 552 flags: hash-based (bit 0), source not checked (bit 1 clear)
            assert int.from_bytes(header[4:8], "little") == 0b01
