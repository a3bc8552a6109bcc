"""Serving the memory snapshot (made by :mod:`pedelec_pyodide.build.snapshot`): the
stored encoding a browser takes; for a client that takes neither, the ``.gz`` inflated
once per key into a dot-file beside it (:func:`make_identity`), never again per request.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from ...build.snapshot import (
    ENCODINGS,
    SNAPSHOT_NAME,
    Encoding,
    SnapshotError,
    stored_file,
    temporary_name,
)

__all__ = ["choose_encoding", "identity_file", "inflate", "make_identity"]

#: the longest Accept-Encoding header read (browsers send ~30 characters)
MAX_ACCEPT_ENCODING = 512
#: the identity answer (a client that takes neither encoding) is inflated in chunks
_CHUNK = 1 << 16


def _weights(accept_encoding: str) -> dict[str, float]:
    """Each coding's q-value in an ``Accept-Encoding`` header (RFC 9110 12.5.3), lower-cased."""
    weights: dict[str, float] = {}
    items = accept_encoding[:MAX_ACCEPT_ENCODING].split(",")
    if len(accept_encoding) > MAX_ACCEPT_ENCODING:
        items.pop()  # cut at the bound: "br;q=0" may have become "br"
    for item in items:
        name, _, params = item.strip().partition(";")
        q = 1.0
        for param in params.split(";"):
            key, _, value = param.strip().partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        weights[name.strip().lower()] = q
    return weights


def choose_encoding(accept_encoding: str) -> Encoding | Literal["identity"] | None:
    """The encoding to answer with for this ``Accept-Encoding`` (RFC 9110 12.5.3: q-values,
    ``*``): a stored one, the better one on a tie; ``"identity"`` when the client takes
    neither; None when it refuses identity too (``identity;q=0``, or ``*;q=0`` without
    naming identity): nothing it takes is on offer (406)."""
    weights = _weights(accept_encoding)
    best: Encoding | None = None
    for encoding in ENCODINGS:
        q = weights.get(encoding, weights.get("*", 0.0))
        if q > 0 and (best is None or q > weights.get(best, weights.get("*", 0.0))):
            best = encoding
    if best is not None:
        return best
    # identity is acceptable unless refused by name, or by "*;q=0" without naming it
    return "identity" if weights.get("identity", weights.get("*", 1.0)) > 0 else None


def identity_file(directory: Path, key: str) -> Path:
    """Where the snapshot of ``key`` is kept inflated, once a client asked for it so: a
    dot-name, never served as a static file, named by its key, so never stale."""
    return directory / f".{SNAPSHOT_NAME}.{key}"


def make_identity(directory: Path, key: str) -> Path:
    """Inflate the stored ``.gz`` into :func:`identity_file` (under a temporary name, then
    renamed into place); its path. Raises :class:`SnapshotError` when the ``.gz`` is cut
    short (nothing is left behind), ``OSError`` when the directory cannot be written."""
    target = identity_file(directory, key)
    tmp = temporary_name(target)
    try:
        with tmp.open("wb") as out:
            for chunk in inflate(stored_file(directory, "gzip")):
                out.write(chunk)
        tmp.replace(target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def inflate(path: Path) -> Iterator[bytes]:
    """The gzip file ``path`` inflated, in chunks of at most 64 KiB; raises
    :class:`SnapshotError` at its end when it was cut short (the response then breaks off
    instead of ending as a shorter, unusable snapshot)."""
    decompressor = zlib.decompressobj(wbits=31)
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(_CHUNK), b""):
            # bounded output per step: a 64 KiB chunk of zeros inflates to ~64 MiB
            data = decompressor.decompress(chunk, _CHUNK)
            while data:
                yield data
                data = decompressor.decompress(decompressor.unconsumed_tail, _CHUNK)
    tail = decompressor.flush()
    if tail:
        yield tail
    if not decompressor.eof:
        raise SnapshotError(f"{path} is truncated")
