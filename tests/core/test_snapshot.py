"""The page's memory snapshot (issue 12): made by provisioning, keyed, served compressed.

- :func:`choose_encoding` reads ``Accept-Encoding`` (q-values, ``*``, a refused identity);
- a real Core serves ``/pedelec/pyodide/pedelec-snapshot.bin`` with the right
  ``Content-Encoding``, ``Vary``, ``ETag`` (by key and encoding), ``Cache-Control``, 304 on
  a matching ``If-None-Match``, the inflated bytes to a client that takes no encoding,
  and 404 when there is no snapshot;
- provisioning (real Node, real runtime, when the cache has them) makes the snapshot next
  to the runtime, keyed by the build id and the wheels' sha256, takes it from the cache
  when unchanged and removes it (never serving it stale) when a wheel changed and it
  cannot be remade.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import shutil
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from corekit import config, run, running_core

from pedelec_pyodide.build import provision as prov
from pedelec_pyodide.build import runtime, wheels
from pedelec_pyodide.build import snapshot as snap
from pedelec_pyodide.core.http import snapshot as serving

REPO = Path(__file__).resolve().parents[2]
URL = f"/pedelec/pyodide/{snap.SNAPSHOT_NAME}"


@pytest.mark.parametrize(("header", "expected"), [
    ("gzip, deflate, br, zstd", "br"),
    ("gzip, deflate", "gzip"),
    ("br;q=0.5, gzip", "gzip"),
    ("br;q=0, gzip;q=0.1", "gzip"),
    ("*", "br"),
    ("*;q=0.3, gzip;q=0.4", "gzip"),
    ("identity", "identity"),
    ("", "identity"),
    ("gzip;q=0, br;q=0", "identity"),
    ("gzip;q=nonsense", "identity"),
    ("identity;q=0", None),
    ("gzip;q=0, identity;q=0", None),
    ("*;q=0", None),
    ("*;q=0, identity", "identity"),
    ("*;q=0, gzip", "gzip"),
])
def test_choose_encoding(header: str, expected: str | None) -> None:
    assert serving.choose_encoding(header) == expected


def fake_snapshot(directory: Path, key: str) -> bytes:
    """A runtime directory holding a 'snapshot' (any bytes: Core does not read them)."""
    directory.mkdir(parents=True, exist_ok=True)
    raw = b"snapshot " * 50_000 + bytes(300_000)
    (directory / snap.MANIFEST_NAME).write_text(json.dumps({"key": key}))
    snap.stored_file(directory, "gzip").write_bytes(gzip.compress(raw))
    snap.stored_file(directory, "br").write_bytes(b"brotli bytes stand-in")
    return raw


def test_core_serves_the_snapshot_compressed(tmp_path: Path) -> None:
    raw = fake_snapshot(tmp_path / "pyodide", "k1")

    async def scenario() -> None:
        async with running_core(config(pyodide_dir=tmp_path / "pyodide")) as core:
            async def get(accept: str, **headers: str) -> tuple[int, dict[str, str], bytes]:
                async with core.http.stream("GET", URL, headers={
                        "accept-encoding": accept, **headers}) as response:
                    body = b"".join([chunk async for chunk in response.aiter_raw()])
                    return response.status_code, dict(response.headers), body

            status, headers, body = await get("gzip, deflate, br")
            assert status == 200
            assert headers["content-encoding"] == "br"
            assert body == b"brotli bytes stand-in"
            assert headers["etag"] == '"k1-br"'
            assert headers["vary"] == "Accept-Encoding"
            assert headers["cache-control"] == "no-cache"
            assert headers["access-control-allow-origin"] == "*"

            status, headers, body = await get("gzip, deflate")
            assert (status, headers["content-encoding"]) == (200, "gzip")
            assert headers["etag"] == '"k1-gzip"'
            assert gzip.decompress(body) == raw
            assert int(headers["content-length"]) == len(body)

            status, headers, body = await get("gzip", **{"if-none-match": '"k1-gzip"'})
            assert (status, body) == (304, b"")
            assert headers["etag"] == '"k1-gzip"'
            status, _, _ = await get("br", **{"if-none-match": '"k1-gzip"'})
            assert status == 200  # another representation

            status, headers, body = await get("identity")
            assert status == 200
            assert "content-encoding" not in headers
            assert body == raw

            status, headers, body = await get("identity;q=0")
            assert status == 406
            assert b"br and gzip" in body
            assert headers["vary"] == "Accept-Encoding"

            (tmp_path / "pyodide" / snap.MANIFEST_NAME).unlink()
            status, headers, _ = await get("gzip")
            assert status == 404
            assert headers["access-control-allow-origin"] == "*"

    run(scenario())


def test_key_changes_with_build_wheels_and_maker() -> None:
    base = snap.snapshot_key("a" * 64, {"x": "1", "y": "2"}, b"maker")
    assert base == snap.snapshot_key("a" * 64, {"y": "2", "x": "1"}, b"maker")
    assert base != snap.snapshot_key("b" * 64, {"x": "1", "y": "2"}, b"maker")
    assert base != snap.snapshot_key("a" * 64, {"x": "1", "y": "3"}, b"maker")
    assert base != snap.snapshot_key("a" * 64, {"x": "1", "y": "2"}, b"maker 2")


def header_build_id(data: bytes) -> str:
    """The build id in a snapshot's header (web/pyodide-snapshot.js reads it the same way)."""
    words = struct.unpack("<12I", data[:48])
    assert words[0] == 1886286592
    return "".join(f"{word:08x}" for word in words[4:12])


def test_provision_makes_a_keyed_snapshot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = prov.cache_dir()
    npm_pkg = cache / "npm" / "node_modules" / "pyodide"
    if runtime.pyodide_version_of(npm_pkg) != runtime.PYODIDE_VERSION:
        pytest.skip(f"cache {cache} has no Pyodide runtime (run `python -m "
                    "pedelec_pyodide.build.provision DIR` once, with network)")
    python = runtime.python_of(json.loads((npm_pkg / runtime.LOCK_NAME).read_text()))
    missing = [p for p in wheels.RUNTIME_WHEELS
               if wheels.find_cached(cache / "wheels", p, python) is None]
    if missing:
        pytest.skip(f"cache {cache} not populated (run `python -m pedelec_pyodide.build.provision "
                    "DIR` once, with network)")
    if shutil.which("node") is None:
        pytest.skip("no node")
    result = prov.provision(tmp_path / "out", repo=REPO, log=print)
    directory = result.pyodide_dir
    manifest = json.loads((directory / snap.MANIFEST_NAME).read_text())
    lock = json.loads(result.lock_file.read_text())
    assert result.snapshot_key == manifest["key"]
    assert set(manifest["packages"]) == {"pedelec-pyodide", "jsonschema", "attrs", "pyrsistent"}
    for name, sha in manifest["packages"].items():
        assert lock["packages"][name]["sha256"] == sha
    build_id = snap.runtime_build_id(directory)
    assert manifest["buildId"] == build_id
    data = gzip.decompress(snap.stored_file(directory, "gzip").read_bytes())
    assert len(data) > 10_000_000
    assert header_build_id(data) == build_id
    assert snap.stored_file(directory, "br").stat().st_size < len(data) // 3

    # unchanged: taken from the cache, Node not needed
    monkeypatch.setattr(snap.shutil, "which", lambda name: None)
    for stale in directory.glob("pedelec-snapshot*"):
        stale.unlink()
    again = prov.provision(tmp_path / "out", repo=REPO, log=print)
    assert again.snapshot_key == result.snapshot_key
    assert (directory / snap.MANIFEST_NAME).is_file()

    # a wheel changed and the snapshot cannot be remade (no Node): none is left to serve
    lock["packages"]["attrs"]["sha256"] = "0" * 64
    with pytest.raises(snap.SnapshotError, match="node"):
        snap.ensure_snapshot(directory, lock, web_dir=REPO / "web", cache=tmp_path / "cache",
                             log=print)
    assert not list(directory.glob("pedelec-snapshot*"))

    # opting out removes it
    prov.provision(tmp_path / "out", repo=REPO, log=print)
    assert (directory / snap.MANIFEST_NAME).is_file()
    prov.provision(tmp_path / "out", repo=REPO, log=print, snapshot=False)
    assert not list(directory.glob("pedelec-snapshot*"))


def test_if_none_match_weak_lists_and_star(tmp_path: Path) -> None:
    """RFC 9110 13.1.2: If-None-Match compares weakly (a proxy that recompresses marks the
    ETag weak) and ``*`` matches any current representation: all answer 304."""
    fake_snapshot(tmp_path / "pyodide", "k1")

    async def scenario() -> None:
        async with running_core(config(pyodide_dir=tmp_path / "pyodide")) as core:
            for tag in ('W/"k1-gzip"', '"other", W/"k1-gzip"', '"other","k1-gzip"', "*"):
                response = await core.http.get(URL, headers={"accept-encoding": "gzip",
                                                             "if-none-match": tag})
                assert response.status_code == 304, tag
            for tag in ('"k1-br"', 'W/"k1"', '"k1-gzip'):
                response = await core.http.get(URL, headers={"accept-encoding": "gzip",
                                                             "if-none-match": tag})
                assert response.status_code == 200, tag

    run(scenario())


def test_a_cut_accept_encoding_never_turns_a_refusal_into_consent() -> None:
    """Only MAX_ACCEPT_ENCODING characters are read: an item cut at that bound (here
    ``br;q=0`` cut to ``br``) is dropped, not read as wanted."""
    pad = "a" * (serving.MAX_ACCEPT_ENCODING - len("gzip, ") - len(", br"))
    header = f"gzip, {pad}, br;q=0"
    assert header[:serving.MAX_ACCEPT_ENCODING].endswith(", br")
    assert serving.choose_encoding(header) == "gzip"


def test_inflating_a_truncated_snapshot_fails(tmp_path: Path) -> None:
    """A .gz cut short (a crash, a full disk) is not served as a shorter snapshot to a
    client that takes no encoding: it is refused (503), nothing inflated is left behind,
    and asking again does not inflate it again."""
    stored = tmp_path / "s.gz"
    stored.write_bytes(gzip.compress(b"snapshot " * 50_000)[:-100])
    with pytest.raises(snap.SnapshotError, match="truncated"):
        for _ in serving.inflate(stored):
            pass

    directory = tmp_path / "pyodide"
    fake_snapshot(directory, "k1")
    shutil.copyfile(stored, snap.stored_file(directory, "gzip"))

    async def scenario() -> None:
        async with running_core(config(pyodide_dir=directory)) as core:
            for _ in range(3):
                response = await core.http.get(URL, headers={"accept-encoding": "identity"})
                assert response.status_code == 503
                assert "truncated" in response.text
        assert [p.name for p in directory.iterdir() if p.name.startswith(".")] == []

    with counting_inflations() as inflations:
        run(scenario())
    assert inflations == [snap.stored_file(directory, "gzip")]


@contextlib.contextmanager
def counting_inflations() -> Iterator[list[Path]]:
    """The real :func:`serving.inflate`, with each file it was asked to inflate listed."""
    real = serving.inflate
    calls: list[Path] = []

    def inflate(path: Path) -> Iterator[bytes]:
        calls.append(path)
        return real(path)

    serving.inflate = inflate
    try:
        yield calls
    finally:
        serving.inflate = real


def test_the_inflated_snapshot_is_made_once(tmp_path: Path) -> None:
    """The issue's figure: each HEAD or identity GET inflated the whole snapshot (1.1 s of
    CPU for 10). Now HEADs, conditional requests and GETs, in any order and at once,
    inflate it once per key; it is kept under a dot-name (never served as a file) and
    removed with the snapshot."""
    directory = tmp_path / "pyodide"
    raw = fake_snapshot(directory, "k1")
    identity = {"accept-encoding": "identity"}

    async def scenario() -> None:
        async with running_core(config(pyodide_dir=directory)) as core:
            conditional = await core.http.get(URL, headers={**identity,
                                                            "if-none-match": '"k1-identity"'})
            assert conditional.status_code == 304
            heads = await asyncio.gather(*(core.http.head(URL, headers=identity)
                                           for _ in range(10)))
            assert {(h.status_code, h.headers["content-length"]) for h in heads} == {
                (200, str(len(raw)))}
            assert all("content-encoding" not in h.headers for h in heads)
            gets = await asyncio.gather(*(core.http.get(URL, headers=identity)
                                          for _ in range(5)))
            assert all(g.status_code == 200 and g.content == raw for g in gets)
            assert gets[0].headers["etag"] == '"k1-identity"'
            hidden = serving.identity_file(directory, "k1")
            assert (await core.http.get(f"/pedelec/pyodide/{hidden.name}")).status_code == 404

    with counting_inflations() as inflations:
        run(scenario())
    assert inflations == [snap.stored_file(directory, "gzip")]
    assert serving.identity_file(directory, "k1").read_bytes() == raw
    snap.remove_snapshot(directory)
    assert list(directory.iterdir()) == []


def minimal_runtime(directory: Path) -> dict[str, object]:
    """A runtime directory with a build id, and a lock holding only our package."""
    directory.mkdir(parents=True)
    (directory / "pyodide.mjs").write_text(f'const API={{BUILD_ID:"{"ab" * 32}"}};')
    return {"packages": {snap.ROOT_PACKAGE: {"sha256": "1" * 64, "file_name": "p.whl"}}}


def test_node_that_leaves_no_snapshot_is_a_snapshot_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Node exiting 0 without writing the snapshot is reported as SnapshotError (and so
    is any file error while placing it) (provisioning goes on without one), not an OSError that
    stops provisioning."""
    lock = minimal_runtime(tmp_path / "pyodide")
    true = shutil.which("true")
    monkeypatch.setattr(snap.shutil, "which", lambda name: true)
    with pytest.raises(snap.SnapshotError, match="left no snapshot"):
        snap.ensure_snapshot(tmp_path / "pyodide", lock, web_dir=REPO / "web",
                             cache=tmp_path / "cache", log=print)
    assert not list((tmp_path / "pyodide").glob("pedelec-snapshot*"))

    (tmp_path / "not-a-dir").write_text("")  # a cache that cannot be written
    with pytest.raises(snap.SnapshotError, match="cannot place"):
        snap.ensure_snapshot(tmp_path / "pyodide", lock, web_dir=REPO / "web",
                             cache=tmp_path / "not-a-dir", log=print)


def test_a_hung_node_is_stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Making the snapshot has a deadline: a Node that never ends does not hang
    provisioning."""
    lock = minimal_runtime(tmp_path / "pyodide")
    hung = tmp_path / "node"
    hung.write_text("#!/bin/sh\nexec sleep 60\n")
    hung.chmod(0o755)
    monkeypatch.setattr(snap.shutil, "which", lambda name: str(hung))
    monkeypatch.setattr(snap, "MAKE_TIMEOUT", 0.5)
    with pytest.raises(snap.SnapshotError, match="did not finish"):
        snap.ensure_snapshot(tmp_path / "pyodide", lock, web_dir=REPO / "web",
                             cache=tmp_path / "cache", log=print)


def test_a_cut_short_snapshot_on_disk_is_replaced(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Files cut short after a crash (renamed but never flushed: zero bytes) are not taken
    as the snapshot: in the runtime directory they are copied again from the cache, and a
    cache entry cut short is made again."""
    lock = minimal_runtime(tmp_path / "pyodide")
    maker = tmp_path / "node"  # what make_snapshot.mjs leaves: OUT_PREFIX.gz and .br
    maker.write_text('#!/bin/sh\nprintf "gzip bytes" > "$4.gz"\nprintf "br bytes" > "$4.br"\n')
    maker.chmod(0o755)
    monkeypatch.setattr(snap.shutil, "which", lambda name: str(maker))
    kwargs = {"web_dir": REPO / "web", "cache": tmp_path / "cache", "log": print}
    key = snap.ensure_snapshot(tmp_path / "pyodide", lock, **kwargs)["key"]
    served = snap.stored_file(tmp_path / "pyodide", "gzip")
    assert served.read_bytes() == b"gzip bytes"

    monkeypatch.setattr(snap.shutil, "which", lambda name: None)
    served.write_bytes(b"")
    snap.ensure_snapshot(tmp_path / "pyodide", lock, **kwargs)
    assert served.read_bytes() == b"gzip bytes"

    snap.stored_file(tmp_path / "cache" / "snapshots" / key, "br").write_bytes(b"")
    served.unlink()
    with pytest.raises(snap.SnapshotError, match="node"):  # made again, not copied
        snap.ensure_snapshot(tmp_path / "pyodide", lock, **kwargs)


def test_files_left_by_a_crash_while_placing_the_snapshot_are_not_served(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each file is written under a temporary name and renamed into place; a crash between
    the two leaves the temporary file in the runtime directory, which Core serves: its
    name is a dot-name, which is never served."""
    directory = tmp_path / "pyodide"
    fake_snapshot(directory, "k1")
    monkeypatch.setattr(Path, "replace", lambda self, target: (_ for _ in ()).throw(
        OSError("the process died here")))
    with pytest.raises(OSError, match="died"):
        snap._copy(snap.stored_file(directory, "gzip"), directory / "copied.gz")
    monkeypatch.undo()
    left = [path.name for path in directory.iterdir() if path.name.endswith(".tmp")]
    assert left  # the crash left it there

    async def scenario() -> None:
        async with running_core(config(pyodide_dir=directory)) as core:
            for name in left:
                response = await core.http.get(f"/pedelec/pyodide/{name}")
                assert response.status_code == 404, name
            assert (await core.http.get(f"/pedelec/pyodide/{snap.MANIFEST_NAME}")
                    ).status_code == 200  # the directory itself is served

    run(scenario())
