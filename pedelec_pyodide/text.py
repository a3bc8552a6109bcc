"""Rules for text from others, shared by every place it enters.

- Text is valid Unicode: JSON may spell a lone surrogate (``"\\ud800"``) and Python's
  decoder builds a ``str`` holding it, which no UTF-8 frame, SQLite row or log line can
  carry. :func:`lone_surrogate_at` finds one, by JSON path, so that each entry refuses
  it naming the field.
- An error message quotes at most :data:`MAX_EXCERPT` characters of a value it was sent
  (:func:`excerpt`, :func:`quote`), so a huge bad value gives a small error.
"""

from __future__ import annotations

import json
import re
from typing import Any

#: characters of a value sent by someone else that an error message may quote
MAX_EXCERPT = 200

_SURROGATE = re.compile("[\ud800-\udfff]")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def excerpt(text: str) -> str:
    """``text`` as an error message may quote it: its first :data:`MAX_EXCERPT`
    characters (and how many more there are), lone surrogates written as escapes."""
    if len(text) > MAX_EXCERPT:
        text = f"{text[:MAX_EXCERPT]}… ({len(text) - MAX_EXCERPT} more characters)"
    if not text.isascii():
        text = _SURROGATE.sub(lambda found: f"\\u{ord(found.group()):04x}", text)
    return text


def quote(value: Any) -> str:
    """``repr(value)``, excerpted: how an error message shows a value it was sent."""
    if isinstance(value, str) and len(value) > MAX_EXCERPT:  # no repr of a huge string
        return f"{value[:MAX_EXCERPT]!r}… ({len(value) - MAX_EXCERPT} more characters)"
    return excerpt(repr(value))


def json_path(parts: Any) -> str:
    """``$.a[0].b`` from a sequence of keys and indexes."""
    path = "$"
    for part in parts:
        if isinstance(part, int):
            path += f"[{part}]"
        elif _IDENTIFIER.match(part):
            path += f".{part}"
        else:
            path += "[" + json.dumps(part, ensure_ascii=False) + "]"
    return path


def lone_surrogate_at(value: Any) -> str | None:
    """The JSON path (excerpted) of the first string, key or value, in ``value`` that holds
    a lone surrogate, or None. Linear in its size: a C-speed check first (the value as
    UTF-8 JSON), and the walk in Python (~15x slower) only when that finds one or fails."""
    if not _may_hold(value):
        return None
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        pass  # there is one: find where
    except (TypeError, ValueError, RecursionError):
        pass  # not JSON as it is (a set, NaN, too deep): walk what can be walked
    else:
        return None
    pending: list[tuple[Any, tuple[Any, ...] | None]] = [(value, None)]
    push = pending.append
    while pending:
        node, where = pending.pop()
        if isinstance(node, str):
            if _SURROGATE.search(node):
                parts: list[Any] = []
                while where is not None:
                    where, part = where
                    parts.append(part)
                return excerpt(json_path(reversed(parts)))
        elif isinstance(node, dict):
            for key, item in reversed(node.items()):  # document order: pushed last first
                if _may_hold(item):
                    push((item, (where, key)))
                if _may_hold(key):
                    push((key, (where, key)))
        elif isinstance(node, (list, tuple)):
            for index in range(len(node) - 1, -1, -1):
                item = node[index]
                if _may_hold(item):
                    push((item, (where, index)))
    return None


def _may_hold(item: Any) -> bool:
    """Whether ``item`` may hold a surrogate: a container, or a str not all ASCII."""
    if isinstance(item, str):
        return not item.isascii()
    return isinstance(item, (dict, list, tuple))


def lone_surrogate_in_json(text: str, value: Any) -> str | None:
    """:func:`lone_surrogate_at` for ``value`` decoded from the JSON ``text``. The walk
    (Python, ~3x the decoding) runs only when there is a lone surrogate: C-speed checks
    first (a raw one in the text; for escapes, re-encoding the value as UTF-8)."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # a raw surrogate: decoded as it is
            return lone_surrogate_at(value)
    if "\\ud" not in text and "\\uD" not in text:
        return None
    try:  # escapes: valid pairs decode to one character, lone ones do not encode
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return lone_surrogate_at(value)
    return None


def not_unicode(where: str | None = None) -> str:
    """What a refusal says about a lone surrogate (found at ``where`` in a JSON value)."""
    return f"a lone surrogate{'' if where is None else ' at ' + where}: text must be valid Unicode"
