"""JSON as the package reads it from others and writes it: each rule written once.

- Reading (:func:`decode`): JSON's own numbers only. Python's json takes ``NaN``,
  ``Infinity`` and ``-Infinity`` and turns ``1e999`` into an infinity; a browser's
  ``JSON.parse`` takes none of them, and no frame, row or answer may carry one. A lone
  surrogate is the other half of "strict" and has its own rule, in :mod:`.text`
  (:func:`~.text.lone_surrogate_in_json`), because each entry names it its own way.
- Writing (:func:`encode`, :func:`encoder`): compact, characters as they are (or
  escaped to ASCII when asked), NaN and the infinities refused with ``ValueError`` rather
  than written as tokens no JSON reader takes back.

Text the package wrote itself with :func:`encode` is read back with plain ``json.loads``:
it holds nothing :func:`decode` would refuse, and decoding it needs no check per number.
Not covered: files written for people (indented manifests, lock files), text rendered for
a reader (a reply, a log line), the page's messages to its own JS and localStorage, and
an idempotency key's fingerprint (the hash of its text is stored: the text may not change).
"""

from __future__ import annotations

import json
import json.encoder
import math
from collections.abc import Callable
from typing import Any

__all__ = ["decode", "encode", "encode_tree", "encoder"]


def _not_a_json_number(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(literal: str) -> float:
    value = float(literal)
    if math.isinf(value):  # digits, a sign, a point and an "e" only: quoted as they are
        shown = literal if len(literal) <= 24 else literal[:23] + "…"
        raise ValueError(f'"{shown}" is too large for a JSON number')
    return value


# Built once: json.loads and json.dumps with any option build a new one on every call.
_DECODER = json.JSONDecoder(parse_constant=_not_a_json_number, parse_float=_finite_float)
_SEPARATORS = (",", ":")
_ENCODER = json.JSONEncoder(allow_nan=False, ensure_ascii=False, separators=_SEPARATORS)
_ASCII_ENCODER = json.JSONEncoder(allow_nan=False, ensure_ascii=True, separators=_SEPARATORS)


def decode(text: str) -> Any:
    """The value of the JSON ``text`` from outside. Raises ``json.JSONDecodeError`` (a
    ``ValueError``) where it is not JSON, ``ValueError`` for a number JSON does not have
    (``NaN``, ``Infinity``, beyond a double's range), ``RecursionError`` past the
    interpreter's depth: a caller that must bound depth checks it first."""
    return _DECODER.decode(text)


def encode(value: Any, *, ascii: bool = False) -> str:
    """Compact JSON text of ``value``; ``ascii``: other characters escaped. Raises
    ``ValueError`` for NaN, an infinity or a cycle, ``TypeError`` for what JSON has no
    type for."""
    return (_ASCII_ENCODER if ascii else _ENCODER).encode(value)


def encoder(*, ascii: bool = False, default: Callable[[Any], Any] | None = None
            ) -> json.JSONEncoder:
    """An encoder of the same policy as :func:`encode`, with ``default`` for the types
    JSON has none for (json's meaning)."""
    return json.JSONEncoder(allow_nan=False, ensure_ascii=ascii,
                            separators=_SEPARATORS, default=default)


def _refuse(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _c_tree_encoder() -> Callable[[Any], str] | None:
    """json's C encoder made once, without cycle bookkeeping, if this Python's json has
    it as CPython 3.11 to 3.14 do: ``json.dumps`` makes a new one on each call, ~0.6 us,
    the better part of encoding a small tool result (the page's hot path). It is
    private, so it is called by keyword and must write :func:`encode`'s text for a probe
    and refuse NaN, else None."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return None
    try:
        encode_chunks = make(markers=None, default=_refuse,
                             encoder=json.encoder.encode_basestring, indent=None,
                             key_separator=":", item_separator=",", sort_keys=False,
                             skipkeys=False, allow_nan=False)
    except Exception:  # renamed or changed arguments: the public encoder
        return None

    def tree(value: Any) -> str:
        return "".join(encode_chunks(value, 0))

    probe = {"a": [1, -2.5, "é\n\U0001f600", None, True, False, {}, []], "": (3,)}
    try:
        if tree(probe) != encode(probe):
            return None
        tree(math.nan)
    except ValueError:  # NaN refused, as it must be
        return tree
    except Exception:  # it cannot write the probe: the public encoder
        return None
    return None  # NaN written: not this policy


_TREE_ENCODER = _c_tree_encoder()


def encode_tree(value: Any) -> str:
    """:func:`encode` for a value known to be a tree of JSON's own types (no cycle) at
    most ~100 levels deep: the caller has walked it. Without a check for cycles, so
    faster; where this Python's json lacks the private encoder, :func:`encode`."""
    if _TREE_ENCODER is None:
        return encode(value)
    return _TREE_ENCODER(value)
