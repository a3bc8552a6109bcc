"""An agent's history as the text a session keeps: appended to, and trimmed to its bound.

A session keeps its agent's history as one JSON list's text, at most
``--max-history-bytes``: the oldest turns are dropped whole (a turn's entries are
consecutive and share their turn), so a model never sees a tool result without the call it
answers. An agent that only adds to its history (the offline agent: ``Turn.remember``)
has its entries appended to that text, never decoding what is kept. Over the bound, the
whole is cut down to three quarters of it, so that the turns after append as text again
for a while.

Cutting a text Core wrote itself, compact and ASCII, needs no decoding: a
:class:`HistoryIndex` knows where each of its turns begins. Any other text (a stored one,
one holding wide characters) is decoded to find them, and indexed from then on.
"""

from __future__ import annotations

import json
import re
from array import array
from bisect import bisect_left
from typing import Any

from ... import protocol
from ..store import char_width, dump_json, kept_size

Turn = tuple[type, Any] | None


def _turn_of(entry: Any) -> Turn:
    """The turn a history entry belongs to: ``turn`` (model adapters) or ``turn_id``
    (the offline agent), with its type (as JSON says, 1, 1.0 and true are three turns)."""
    turn = entry.get("turn", entry.get("turn_id")) if isinstance(entry, dict) else None
    return None if turn is None else (type(turn), turn)


_READ_BACK_AS_IT_IS = (str, int, float, bool)  # JSON gives such a turn back as it is


def _turns_read_back(entries: list[Any], texts: list[str]) -> list[Turn]:
    """The turn of each entry written as ``texts``, as the kept text reads back (what
    Core sees after a restart): read off the entry, or where JSON would not give it back
    as it is (a tuple, an enum; an entry that is not a dict), off its text decoded."""
    turns = []
    for entry, text in zip(entries, texts, strict=True):
        turn = _turn_of(entry) if type(entry) is dict else None
        if type(entry) is not dict or (
                turn is not None and type(turn[1]) not in _READ_BACK_AS_IT_IS):
            turn = _turn_of(json.loads(text))
        turns.append(turn)
    return turns


def trimmed_history(history: list[dict[str, Any]], limit: int) -> str:
    """The agent's history as the JSON text a session keeps, at most ``limit`` bytes: the
    oldest turns are dropped whole (a turn's entries are consecutive and share their
    turn), so a model never sees a tool result without the call it answers."""
    texts, width = _kept_texts(history)
    turns = _turns_read_back(history, texts)
    return "[" + ",".join(texts[_first_kept(turns, texts, width, limit):]) + "]"


def _first_kept(turns: list[Turn], texts: list[str], width: int, limit: int) -> int:
    """The first of the entries written as ``texts``, of these ``turns``, each
    character of which takes ``width`` bytes once they are joined, that a history of at
    most ``limit`` bytes keeps."""
    # with its comma: its UTF-8 bytes, or its bytes of memory where those are more (a
    # comma takes ``width`` bytes of memory too)
    sizes = [max(protocol.frame_size(text) + 1, width * (len(text) + 1)) for text in texts]
    total = width + sum(sizes)  # + the brackets, less the last comma
    start = 0
    while start < len(texts) and total > limit:
        turn = turns[start]
        while True:  # drop the oldest turn, all its entries
            total -= sizes[start]
            start += 1
            if start == len(texts) or turn is None or turns[start] != turn:
                break
    return start


def appended_history(history_json: str, entries: list[dict[str, Any]], limit: int
                     ) -> str | None:
    """The kept history's text with ``entries`` appended as text, without decoding what
    is kept (an agent that only adds to its history pays for its new entries, not the
    whole); None when that is over ``limit`` (see :func:`trimmed_history`)."""
    # (in the form that costs least joined to the kept text, when that is ASCII: a few
    # wide characters written as they are would make all of it take their width)
    texts, _ = _kept_texts(entries, len(history_json), char_width(history_json))
    text = _appended(history_json, texts)
    return text if kept_size(text) <= limit else None


def _appended(history_json: str, texts: list[str]) -> str:
    """``history_json`` with the entries written as ``texts`` appended."""
    # a stored history is any JSON list (store/rows.py): whitespace may stand around its
    # closing bracket, and an empty one may be "[ ]". The kept text (up to the bound) is
    # copied once, and the new entries added to the copy in place (CPython resizes a
    # string no one else holds: a join would copy the whole again).
    end = len(history_json.rstrip()) - 1  # where its closing bracket is
    if history_json[end - 1:end].isspace():
        end = len(history_json[:end].rstrip())
    separator = "" if history_json[end - 1:end] == "[" or not texts else ","
    text = history_json[:end]
    text += separator + ",".join(texts) + "]"
    return text


def trimmed_with(history_json: str, entries: list[dict[str, Any]], limit: int) -> str:
    """:func:`trimmed_history` of the kept history and ``entries``, down to three
    quarters of ``limit``: see :func:`indexed_trim`."""
    return indexed_trim(history_json, entries, limit)[0]


def indexed_trim(history_json: str, entries: list[dict[str, Any]], limit: int
                 ) -> tuple[str, HistoryIndex | None]:
    """:func:`trimmed_history` of the kept history and ``entries``, down to three
    quarters of ``limit``, and its index (None: it cannot have one): the turns after it
    append as text again for a while, rather than each decoding the whole to drop its
    oldest turn. A kept entry written in ASCII
    stays as it stands (decoded only to read its turn); any other is written again with
    the new ones, in the form that takes the least memory over the whole history, as
    :func:`trimmed_history` writes it (else one wide character kept as it is would make
    every character of the history take its width), unless it nests deeper than a frame
    may."""
    kept, texts = _kept_items(history_json)
    again: list[int] = []  # the entries written again
    stands: list[int] = []  # and those that stay as they stand, though not ASCII
    for n, text in enumerate(texts):
        if not text.isascii():
            # one nested deeper than a frame may (only a store can hold it) stays as it
            # stands: json's encoder might not reach its bottom, and no trim would be done
            (stands if protocol.nests_too_deep(text) else again).append(n)
    standing = [text for text in texts if text.isascii()] + [texts[n] for n in stands]
    written, width = _kept_texts([kept[n] for n in again] + entries,
                                 sum(map(len, standing)), _width(standing))
    for n, text in zip(again, written, strict=False):
        texts[n] = text
    turns = [_turn_of(item) for item in kept] + _turns_read_back(
        entries, written[len(again):])
    texts += written[len(again):]
    start = _first_kept(turns, texts, width, limit * 3 // 4)
    text = "[" + ",".join(texts[start:]) + "]"
    return text, HistoryIndex.of(text, turns[start:], texts[start:])


_DECODER = json.JSONDecoder()
_WHITESPACE = re.compile(r"[ \t\n\r]*")  # JSON's


def _kept_items(history_json: str) -> tuple[list[Any], list[str]]:
    """A kept history's entries (a JSON list: as stored, whitespace may stand between its
    items), each decoded, and each one's text as it stands in ``history_json``."""
    items: list[Any] = []
    texts: list[str] = []
    at = _past_whitespace(history_json, _past_whitespace(history_json, 0) + 1)  # "[" too
    while history_json[at] != "]":
        item, end = _DECODER.raw_decode(history_json, at)
        items.append(item)
        texts.append(history_json[at:end])
        at = _past_whitespace(history_json, end)
        if history_json[at] == ",":
            at = _past_whitespace(history_json, at + 1)
    return items, texts


def _past_whitespace(text: str, at: int) -> int:
    found = _WHITESPACE.match(text, at)
    assert found is not None  # (it matches no character too)
    return found.end()


def _kept_texts(history: list[dict[str, Any]], kept_chars: int = 0, kept_width: int = 1
                ) -> tuple[list[str], int]:
    """Each entry's JSON text, and the bytes each character of them all will take once
    joined with ``kept_chars`` characters of text kept besides, which take ``kept_width``
    bytes each (the width of the widest): the entries' characters as they are, or escaped
    where that takes less memory in all (see :func:`~.store.kept_json`). (Escaped is not
    always ASCII: a tool's result is kept as the text its page sent, a
    :class:`~.store.JsonText`, characters as they are.)"""
    escaped = [dump_json(entry, ascii=True) for entry in history]
    # Escaped is the form, with no need to write them as they are: when it escapes nothing
    # (the same text), or when it escapes no Latin-1 (which takes 1 byte as it is) and
    # more text of 1 byte a character is kept than these take escaped (as they are, 2 or
    # 4 bytes a character, they would take more: at least the kept text's again).
    if _width(escaped) == 1 and (
            not any("\\u" in text for text in escaped)
            or (kept_width == 1 and kept_chars > sum(map(len, escaped))
                and not any(map(_LATIN_1_ESCAPE.search, escaped)))):
        return escaped, kept_width
    texts = [dump_json(entry) for entry in history]
    width = max(kept_width, _width(texts))
    if width == kept_width:  # as they are, they take no more than the kept text does
        return texts, width
    escaped_width = max(kept_width, _width(escaped))
    others = kept_chars + len(history) + 1  # (and the commas and brackets, at the width)
    if (escaped_width * (others + sum(map(len, escaped)))
            < width * (others + sum(map(len, texts)))):
        return escaped, escaped_width
    return texts, width


# a character U+0080 to U+00FF escaped (or a backslash written before "u00e9" and the
# like, which only takes the longer way)
_LATIN_1_ESCAPE = re.compile(r"\\u00[89a-f]")


def _width(texts: list[str]) -> int:
    return max(map(char_width, texts), default=1)


class HistoryIndex:
    """Where each turn's entries begin in one history text that Core wrote, compact and
    ASCII (``text``, the session's by identity): cutting it at a turn is then a slice of
    it, where a trim decoded every entry to find its turn (3 to 30 ms at the default bound,
    every few dozen turns of a busy agent). Kept in memory with the session: 8 bytes a
    turn, and never more turns than one for each 64 characters of its text (an eighth of
    its size); a text it cannot index (non-ASCII, turns too small) leaves its session
    without one until the next trim."""

    __slots__ = ("_base", "_last_turn", "_starts", "text")

    def __init__(self, text: str, starts: array[int], last_turn: Turn) -> None:
        self.text = text
        # each turn's first entry, at ``_base`` + its place in the text (a cut moves the
        # base, not every place)
        self._starts = starts
        self._base = 0
        self._last_turn = last_turn  # the last entry's (a new entry of it joins its turn)

    @classmethod
    def of(cls, text: str, turns: list[Turn], texts: list[str]) -> HistoryIndex | None:
        """The index of ``text``, entries of these ``turns`` written as ``texts`` and
        joined; None if it cannot have one."""
        if not text.isascii():
            return None
        places, last_turn = _turn_starts(turns, texts, 1, None)
        return (cls(text, array("q", places), last_turn)
                if _bounded(len(places), len(text)) else None)

    def append(self, entries: list[dict[str, Any]], limit: int) -> str | None:
        """The text with ``entries`` appended, as :func:`appended_history` writes it, cut
        down to three quarters of ``limit`` when it is over, as :func:`indexed_trim` cuts
        it; this index becomes that text's. None, the index unchanged: the text could not
        be indexed (see :func:`indexed_trim`)."""
        texts, _ = _kept_texts(entries, len(self.text))
        text = _appended(self.text, texts)
        if not text.isascii():
            return None
        first = len(self.text) - 1 + (len(self.text) > 2)  # after the comma, if any
        places, last_turn = _turn_starts(_turns_read_back(entries, texts), texts, first,
                                         self._last_turn)
        starts, base = self._starts, self._base
        starts.extend(place + base for place in places)
        # cut: from the first turn from which "[" + the rest is short enough
        kept, cut = 0, 0
        if len(text) > limit:
            kept = bisect_left(starts, base + len(text) + 1 - limit * 3 // 4)
            cut = starts[kept] - base if kept < len(starts) else len(text) - 1
        if not _bounded(len(starts) - kept, len(text) - cut + (cut > 0)):
            del starts[len(starts) - len(places):]
            return None
        if cut:
            text = "[" + text[cut:]
            del starts[:kept]
            self._base += cut - 1
        self.text, self._last_turn = text, last_turn if starts else None
        return text


def _bounded(starts: int, chars: int) -> bool:
    """Whether an index of ``starts`` turns is small enough for a text of ``chars``."""
    return starts <= chars // 64 + 1


def _turn_starts(turns: list[Turn], texts: list[str], at: int, last_turn: Turn
                 ) -> tuple[list[int], Turn]:
    """Where each new turn begins among entries of these ``turns`` written as ``texts``
    and joined with commas from place ``at``, after an entry of ``last_turn`` (grouped
    as :func:`_first_kept` groups them); and the last entry's turn."""
    places = []
    for turn, text in zip(turns, texts, strict=True):
        if turn is None or turn != last_turn:
            places.append(at)
        last_turn = turn
        at += len(text) + 1
    return places, last_turn
