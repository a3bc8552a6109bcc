"""Tests for pedelec_pyodide.core.provision.

Everything but the last test runs offline, on wheels built here in a tmp dir and a fake
Pyodide runtime dir; subprocess (npm, pip) is patched to fail so any network attempt
shows. The last test runs the real provision when the cache already holds the npm
runtime and the pinned wheels, else it is skipped.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest

from pedelec_pyodide.core import provision as prov

REPO = Path(__file__).resolve().parents[2]


def make_wheel(
    directory: Path,
    name: str,
    version: str,
    *,
    requires: tuple[str, ...] = (),
    files: tuple[str, ...] = (),
    top_level: str | None = None,
    tag: str = "py3-none-any",
) -> Path:
    """A minimal but well-formed wheel."""
    dist = f"{name.replace('-', '_')}-{version}"
    path = directory / f"{dist}-{tag}.whl"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {r}\n" for r in requires)
    members = {f: f"# {f}\n" for f in files}
    members[f"{dist}.dist-info/METADATA"] = metadata
    members[f"{dist}.dist-info/WHEEL"] = f"Wheel-Version: 1.0\nTag: {tag}\n"
    if top_level is not None:
        members[f"{dist}.dist-info/top_level.txt"] = top_level
    record = "".join(f"{m},,\n" for m in members) + f"{dist}.dist-info/RECORD,,\n"
    members[f"{dist}.dist-info/RECORD"] = record
    with zipfile.ZipFile(path, "w") as zf:
        for member, text in members.items():
            zf.writestr(member, text)
    return path


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def no_subprocess(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Fail loudly if npm or pip would be run; records the attempted commands."""
    calls: list[list[str]] = []

    def fake_run(command: list[str], *args: Any, **kwargs: Any) -> Any:
        calls.append(command)
        raise AssertionError(f"unexpected subprocess: {command}")

    monkeypatch.setattr(subprocess, "run", fake_run)
    return calls


# ---------------------------------------------------------------- names and markers


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
def test_canonical_name(raw: str, canonical: str) -> None:
    assert prov.canonical_name(raw) == canonical


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
def test_evaluate_marker(marker: str, expected: bool) -> None:
    assert prov.evaluate_marker(marker) is expected


@pytest.mark.parametrize(
    "marker", ["python_version <", 'bogus_var == "1"', '(sys_platform == "x"', "== 'x'"]
)
def test_evaluate_marker_rejects_malformed(marker: str) -> None:
    with pytest.raises(ValueError):
        prov.evaluate_marker(marker)


def test_pins_are_exact_and_unique() -> None:
    names = [prov._split_pin(p)[0] for p in (*prov.RUNTIME_WHEELS, *prov.TEST_WHEELS)]
    assert len(names) == len(set(names))
    assert "jsonschema==4.17.3" in prov.RUNTIME_WHEELS
    assert prov.PYODIDE_VERSION == "314.0.6"
    with pytest.raises(ValueError):
        prov._split_pin("attrs>=1")


# ------------------------------------------------------------------------- the lock


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
    entry = prov.lock_entry(wheel, file_name=wheel.name, available=available)
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
    assert prov.lock_entry(wheel, file_name="x", available=[])["imports"] == ["thing"]


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
    lock = prov.build_lock(base, [inside, outside], lock_dir)
    assert lock["info"] == base["info"]
    assert sorted(lock["packages"]) == ["app", "lib", "shipped"]
    app, lib = lock["packages"]["app"], lock["packages"]["lib"]
    assert app["file_name"] == inside.name
    assert app["depends"] == ["shipped"]  # "absent" is not in the lock
    assert lib["file_name"] == outside.resolve().as_uri()
    assert lib["depends"] == ["app"]
    assert app["sha256"] == sha256(inside) and lib["sha256"] == sha256(outside)


def test_write_lock_is_idempotent(tmp_path: Path) -> None:
    path = tmp_path / "pyodide-lock.json"
    lock = {"info": {"python": "3.14.2"}, "packages": {}}
    assert prov.write_lock(path, lock) is True
    mtime = path.stat().st_mtime_ns
    assert prov.write_lock(path, lock) is False
    assert path.stat().st_mtime_ns == mtime
    assert json.loads(path.read_text()) == lock


# ----------------------------------------------------------- wheels, npm, error texts


def test_download_uses_cache_without_pip(tmp_path: Path, no_subprocess: list[list[str]]) -> None:
    make_wheel(tmp_path, "alpha", "1.0")
    make_wheel(tmp_path, "beta_x", "2.0", tag="py2.py3-none-any")
    make_wheel(tmp_path, "alpha", "0.9")
    make_wheel(tmp_path, "gamma", "1.0", tag="cp314-cp314-pyemscripten_2026_0_wasm32")
    found = prov._download_wheels(["alpha==1.0", "Beta.X==2.0"], tmp_path, print)
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
    with pytest.raises(prov.ProvisionError) as info:
        prov._download_wheels(["alpha==1.0", "gamma==3.0"], tmp_path, print)
    message = str(info.value)
    assert "gamma==3.0" in message and "alpha==1.0" not in message.split("\n")[0]
    assert "PyPI" in message and "No matching distribution" in message
    (command,) = seen
    assert command[command.index("--python-version") + 1] == prov.PYTHON_VERSION
    assert {"--no-deps", "--only-binary=:all:", "gamma==3.0"} <= set(command)
    assert command[command.index("--platform") + 1] == "any"


def test_no_pure_python_wheel_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        subprocess, "run", lambda c, *a, **k: subprocess.CompletedProcess(c, 0, "", "")
    )
    with pytest.raises(prov.ProvisionError, match=r"no pure-Python wheel .* for gamma==3.0"):
        prov._download_wheels(["gamma==3.0"], tmp_path, print)


def test_missing_npm_is_explained(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_subprocess: list[list[str]]
) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(prov.ProvisionError) as info:
        prov.provision(tmp_path / "out", cache=tmp_path / "cache", repo=REPO, log=print)
    message = str(info.value)
    assert "`npm` was not found" in message
    assert "pedelec serve --pyodide OUT/pyodide" in message and prov.PYODIDE_VERSION in message
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


def fake_runtime(directory: Path) -> Path:
    directory.mkdir(parents=True)
    (directory / "pyodide.mjs").write_text("export {}\n")
    (directory / "pyodide.asm.wasm").write_bytes(b"\0asm")
    (directory / "python_stdlib.zip").write_bytes(b"PK")
    (directory / "package.json").write_text(json.dumps({"version": prov.PYODIDE_VERSION}))
    base = {
        "info": {"python": "3.14.2", "arch": "wasm32"},
        "packages": {"cdn-only": {"name": "cdn-only", "file_name": "cdn_only-1-py3-none-any.whl"}},
    }
    (directory / "pyodide-lock.json").write_text(json.dumps(base))
    return directory


def test_provision_offline_and_idempotent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_subprocess: list[list[str]]
) -> None:
    cache = tmp_path / "cache"
    wheels = cache / "wheels"
    wheels.mkdir(parents=True)
    make_wheel(wheels, "libdep", "1.0", files=("libdep.py",))
    make_wheel(wheels, "Lib.Top", "2.0", requires=("libdep", "missing"), files=("lib_top/a.py",))
    make_wheel(wheels, "testonly", "3.0", files=("testonly.py",))
    monkeypatch.setattr(prov, "RUNTIME_WHEELS", ("lib.top==2.0", "libdep==1.0"))
    monkeypatch.setattr(prov, "TEST_WHEELS", ("testonly==3.0",))
    # other people edit the sources meanwhile: pin the digest our own wheel is cached under
    monkeypatch.setattr(prov, "_source_digest", lambda repo: "fixed-digest")
    own_dir = cache / "own" / "fixed-digest"
    own_dir.mkdir(parents=True)
    make_wheel(
        own_dir, "pedelec-pyodide", "0.1.0", requires=("lib.top",), files=("pedelec_pyodide/x.py",)
    )
    runtime = fake_runtime(tmp_path / "npm-pyodide")
    monkeypatch.setattr(prov, "_compile_for_pyodide", fake_compile)
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
    assert lock["info"] == {"python": "3.14.2", "arch": "wasm32"}
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


def fake_compile(runtime: Path, sources: dict[str, str]) -> dict[str, bytes]:
    """Stands in for Pyodide's compiler (Node): one fake .pyc per source, where 3.14 puts it."""
    compiled = {}
    for name in sources:
        folder, _, base = name.rpartition("/")
        compiled[f"{folder}/__pycache__/{base[:-3]}.cpython-314.pyc"] = f"pyc of {name}".encode()
    return compiled


def check_record(wheel: zipfile.ZipFile) -> list[str]:
    """Assert the wheel's RECORD lists exactly its files with their sha256 and size."""
    (record_name,) = [n for n in wheel.namelist() if n.endswith(".dist-info/RECORD")]
    lines = wheel.read(record_name).decode().splitlines()
    assert {line.rsplit(",", 2)[0] for line in lines} == set(wheel.namelist())
    for line in lines:
        name, digest, size = line.rsplit(",", 2)
        if name == record_name:
            assert (digest, size) == ("", "")
            continue
        data = wheel.read(name)
        raw = hashlib.sha256(data).digest()
        assert digest == "sha256=" + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
        assert int(size) == len(data)
    return wheel.namelist()


def test_page_wheel_has_bytecode_and_no_core(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_subprocess: list[list[str]]
) -> None:
    own_dir = tmp_path / "own" / "digest"
    own_dir.mkdir(parents=True)
    modules = ("pedelec_pyodide/__init__.py", "pedelec_pyodide/session.py")
    core_only = ("pedelec_pyodide/core/cli.py", "pedelec_pyodide/web/pedelec-pyodide.js")
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

    monkeypatch.setattr(prov, "_compile_for_pyodide", compile_)
    page = prov._page_wheel(built, runtime, print)

    assert page.name == built.name and page != built
    assert compiled == [{m: f"# {m}\n" for m in modules}]
    with zipfile.ZipFile(page) as zf:
        names = check_record(zf)
        for module in modules:
            folder, _, base = module.rpartition("/")
            pyc = f"{folder}/__pycache__/{base[:-3]}.cpython-314.pyc"
            assert zf.read(pyc) == f"pyc of {module}".encode()
            assert zf.read(module) == f"# {module}\n".encode()
        assert not [n for n in names if n.startswith(prov._CORE_ONLY)]
        assert not [n for n in names if n.endswith("entry_points.txt")]
        assert zf.read("pedelec_pyodide-0.1.0.dist-info/METADATA") == zipfile.ZipFile(built).read(
            "pedelec_pyodide-0.1.0.dist-info/METADATA"
        )
    entry = prov.lock_entry(page, file_name=page.name, available=[])
    assert (entry["name"], entry["version"]) == ("pedelec-pyodide", "0.1.0")
    assert entry["imports"] == ["pedelec_pyodide"]
    assert entry["sha256"] == sha256(page)
    # cached, and the same bytes when made again (the lock's sha256 depends on the sources)
    assert prov._page_wheel(built, runtime, print) == page and len(compiled) == 1
    first = page.read_bytes()
    page.unlink()
    assert prov._page_wheel(built, runtime, print).read_bytes() == first


def test_page_wheel_without_node_has_no_bytecode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    own_dir = tmp_path / "own" / "digest"
    own_dir.mkdir(parents=True)
    built = make_wheel(own_dir, "pedelec-pyodide", "0.1.0", files=("pedelec_pyodide/a.py",))
    monkeypatch.setattr(prov.shutil, "which", lambda name: None)
    logs: list[str] = []
    page = prov._page_wheel(built, fake_runtime(tmp_path / "rt"), logs.append)
    assert logs == [
        "note: our wheel for pages has no bytecode (pages compile it at start): "
        "`node` was not found on PATH"
    ]
    with zipfile.ZipFile(page) as zf:
        assert not [n for n in check_record(zf) if n.endswith(".pyc")]
        assert "pedelec_pyodide/a.py" in zf.namelist()


def test_cli_reports_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = prov.main([str(tmp_path / "out"), "--pyodide", str(tmp_path), "--cache-dir", "x"])
    assert code == 1
    assert "not a Pyodide runtime directory" in capsys.readouterr().err


# -------------------------------------------------------- the real thing, if cached


def test_real_provision_from_cache(tmp_path: Path) -> None:
    cache = prov.cache_dir()
    npm_pkg = cache / "npm" / "node_modules" / "pyodide"
    pins = (*prov.RUNTIME_WHEELS, *prov.TEST_WHEELS)
    missing = [p for p in pins if prov._find_cached(cache / "wheels", p) is None]
    if prov._pyodide_version_of(npm_pkg) != prov.PYODIDE_VERSION or missing:
        pytest.skip(
            f"cache {cache} not populated (run `python -m pedelec_pyodide.core.provision "
            "DIR --with-tests` once, with network)"
        )
    result = prov.provision(tmp_path / "out", with_test_wheels=True, repo=REPO, log=print)
    lock = json.loads(result.lock_file.read_text())
    npm_lock = json.loads((npm_pkg / "pyodide-lock.json").read_text())
    assert lock["info"] == npm_lock["info"]
    assert lock["info"]["python"].startswith(prov.PYTHON_VERSION + ".")
    expected = {prov._split_pin(p)[0] for p in pins} | {"pedelec-pyodide"}
    assert set(lock["packages"]) == expected
    for pin in pins:
        name, version = prov._split_pin(pin)
        entry = lock["packages"][name]
        assert entry["version"] == version
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
        assert not [n for n in names if n.startswith(prov._CORE_ONLY)]
        if shutil.which("node") is None:
            return
        for module in modules:
            folder, _, base = module.rpartition("/")
            tag = "cpython-" + prov.PYTHON_VERSION.replace(".", "")
            header = zf.read(f"{folder}/__pycache__/{base[:-3]}.{tag}.pyc")[:16]
            # PEP 552 flags: hash-based (bit 0), source not checked (bit 1 clear)
            assert int.from_bytes(header[4:8], "little") == 0b01


def test_wheel_from_installed_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No source tree (pip-installed): the installed package is zipped into a wheel."""
    import base64
    import importlib.metadata

    metadata = "Metadata-Version: 2.4\nName: pedelec-pyodide\nVersion: 9.8.7\n"
    metadata += "Requires-Dist: jsonschema>=4.17\nRequires-Dist: pytest>=8; extra == 'test'\n"

    class FakeDist:
        def read_text(self, name: str) -> str | None:
            return metadata if name == "METADATA" else None

    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: FakeDist())
    monkeypatch.setattr(prov, "_find_repo", lambda repo: None)
    wheel = prov._wheel_from_installed(tmp_path, print)
    assert wheel.name == "pedelec_pyodide-9.8.7-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        assert "pedelec_pyodide/core/provision.py" in names
        assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
        record = zf.read("pedelec_pyodide-9.8.7.dist-info/RECORD").decode().splitlines()
        for line in record:
            name, digest, _size = line.rsplit(",", 2)
            if digest:
                raw = hashlib.sha256(zf.read(name)).digest()
                assert digest == "sha256=" + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
    assert set(names) == {line.rsplit(",", 2)[0] for line in record}
    entry = prov.lock_entry(wheel, file_name=wheel.name, available=["jsonschema", "pytest"])
    assert entry["imports"] == ["pedelec_pyodide"]
    assert entry["depends"] == ["jsonschema"]
    assert prov._wheel_from_installed(tmp_path, print) == wheel  # cached
