"""Core fits a long reply to the page's frame limit: ``turn.end`` keeps the longest start of
its text that fits (with a note of what was cut), ``turn.delta`` text is split into as few
frames as fit. Both cut the text's encoded bytes, measured once: their results are pinned
here against the plain definitions (a bisection over whole frames, frame by frame), and
their work is counted in characters of JSON made and read, not timed."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pedelec_pyodide import protocol
from pedelec_pyodide.core.sessions import delta_frames, fitted_end_frame

# characters whose JSON escapes and UTF-8 lengths differ: quotes and backslashes (2-byte
# escapes), control characters (\n and \u00XX), 2-, 3- and 4-byte UTF-8, and the letters
# an escape is made of (a cut must not split "\\u0001" nor take "\\" + "u" for one)
TRICKY = ['a', 'u', '0', '"', '\\', '\n', '\x01', '\x1f', '\x7f', 'é', '€', '\u2028', '😀']
texts = st.text(alphabet=st.sampled_from(TRICKY), max_size=400)


def end_message(text: str) -> protocol.TurnEnd:
    return protocol.TurnEnd(turn_id="t1", status="completed", text=text, error=None,
                            usage={"input_tokens": 3})


def note(cut: int) -> str:
    return (f"\n[... {cut} more characters: the reply is too long for one frame; "
            "the whole text is in the turn's record]")


def bisected_end_frame(end: protocol.TurnEnd, limit: int) -> str:
    """The definition: the longest start of the text whose frame, with the note, fits
    (frames grow with the text kept, so a bisection over whole frames finds it)."""
    frame = end.encode()
    if protocol.frame_size(frame) <= limit:
        return frame
    text = end.text

    def cut_at(keep: int) -> str:
        return dataclasses.replace(end, text=text[:keep] + note(len(text) - keep)).encode()

    low, high = 0, len(text)
    while low < high:
        middle = (low + high + 1) // 2
        if protocol.frame_size(cut_at(middle)) <= limit:
            low = middle
        else:
            high = middle - 1
    return cut_at(low)


@settings(max_examples=400, deadline=None)
@given(text=texts, limit=st.integers(min_value=260, max_value=1500))  # the note fits
def test_the_fitted_turn_end_is_the_longest_start_that_fits(text: str, limit: int) -> None:
    end = end_message(text)
    fitted = fitted_end_frame(end, limit)
    assert fitted == bisected_end_frame(end, limit)
    assert isinstance(protocol.parse_server_frame(fitted, max_bytes=limit), protocol.TurnEnd)


def test_a_note_with_fewer_digits_leaves_room_for_more_characters() -> None:
    """Keeping one more character can shorten the note by a digit (100 more characters ->
    99): the frame keeps that character when it then fits."""
    text = "\\" * 60 + "a" * 100
    end = end_message(text)
    for limit in range(200, 400):
        assert fitted_end_frame(end, limit) == bisected_end_frame(end, limit), limit


def halved_delta_frames(delta: protocol.TurnDelta, limit: int) -> list[str]:
    """How Core split deltas before: in halves until each fits (the same joined text, more
    frames, every level encoded again)."""
    frame = delta.encode()
    if protocol.frame_size(frame) <= limit or len(delta.text) < 2:
        return [frame]
    half = len(delta.text) // 2
    return (halved_delta_frames(dataclasses.replace(delta, text=delta.text[:half]), limit)
            + halved_delta_frames(dataclasses.replace(delta, text=delta.text[half:]), limit))


@settings(max_examples=400, deadline=None)
@given(text=texts, limit=st.integers(min_value=60, max_value=600))
def test_delta_frames_fit_join_to_the_text_and_are_as_few_as_fit(text: str, limit: int
                                                                  ) -> None:
    delta = protocol.TurnDelta(turn_id="t1", text=text)
    frames = delta_frames(delta, limit)
    pieces = []
    for frame in frames:
        message = protocol.parse_server_frame(frame, max_bytes=limit)  # each fits
        assert isinstance(message, protocol.TurnDelta) and message.turn_id == "t1"
        pieces.append(message.text)
    assert "".join(pieces) == text
    assert len(frames) <= len(halved_delta_frames(delta, limit))
    taken = 0
    for piece in pieces[:-1]:  # each frame but the last is full: one more character won't fit
        taken += len(piece)
        longer = dataclasses.replace(delta, text=piece + text[taken]).encode()
        assert protocol.frame_size(longer) > limit


@contextmanager
def json_work(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The characters of every JSON text encoded or decoded meanwhile, one entry a pass."""
    passes: list[int] = []
    encode, decode = json.JSONEncoder.encode, json.JSONDecoder.decode

    def counted_encode(self: json.JSONEncoder, value: Any) -> str:
        text = encode(self, value)
        passes.append(len(text))
        return text

    def counted_decode(self: json.JSONDecoder, text: str, **options: Any) -> Any:
        passes.append(len(text))
        return decode(self, text, **options)

    with monkeypatch.context() as patch:
        patch.setattr(json.JSONEncoder, "encode", counted_encode)
        patch.setattr(json.JSONDecoder, "decode", counted_decode)
        yield passes


@pytest.mark.parametrize("size", [64 * 1024, 1024 * 1024])
def test_fitting_a_turn_end_is_a_fixed_number_of_passes_over_the_text(
        monkeypatch: pytest.MonkeyPatch, size: int) -> None:
    """A bisection encoded the whole frame once per halving (~20 times for 1 MiB); now:
    the frame, the text alone, its kept start read back, the fitted frame."""
    text = ('{},"\\é\n' * size)[:size]
    end = end_message(text)
    limit = size // 2
    with json_work(monkeypatch) as passes:
        fitted = fitted_end_frame(end, limit)
    assert protocol.frame_size(fitted) <= limit
    long_passes = [chars for chars in passes if chars > 1024]
    assert len(long_passes) <= 4, long_passes
    encoded = len(end.encode())
    assert sum(passes) <= 3 * encoded, (sum(passes), encoded)


@pytest.mark.parametrize("size", [64 * 1024, 1024 * 1024])
def test_splitting_a_delta_passes_over_the_text_a_fixed_number_of_times(
        monkeypatch: pytest.MonkeyPatch, size: int) -> None:
    """Halving encoded every level again (1 + log2 of the pieces: 8 times for 100 pieces);
    now: the text once whole, once to measure it, each piece read back and encoded."""
    delta = protocol.TurnDelta(turn_id="t1", text=('{},"\\é\n' * size)[:size])
    limit = size // 100
    with json_work(monkeypatch) as passes:
        frames = delta_frames(delta, limit)
    assert len(frames) >= 100
    encoded = len(delta.encode())
    assert sum(passes) <= 5 * encoded, (sum(passes), encoded)
