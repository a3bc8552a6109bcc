"""Frames fitted to the page's limit: ``turn.end`` and ``turn.delta`` cut between
characters, ``tool.request`` checked as the page would parse it, and the ended turns a
session keeps to send their ``turn.end`` again."""

from __future__ import annotations

import dataclasses
import json
import secrets
from typing import Any

from ... import protocol
from ...results import INVALID_ARGS, tool_error
from ..store import TurnRecord

# a request's id and its tool.request frame, through checked_request_frame
CheckedRequest = tuple[str, str]


#: what a re-sent ``turn.end`` says in place of a reply Core no longer keeps
FORGOTTEN_REPLY = ("[Core no longer keeps the reply of this earlier turn for a re-sent "
                   "turn.end; the whole text is in the turn's record]")


class EndedTurn:
    """An ended turn as its session remembers it, to send its ``turn.end`` again: its
    record without its texts and tool calls (they went to the store and the turn's
    caller), and its ``turn.end`` frame as UTF-8 while the session's budget keeps it
    (:meth:`CoreSession.remember_end`)."""

    __slots__ = ("frame", "record", "replied")

    def __init__(self, turn: TurnRecord, frame: str) -> None:
        self.record = dataclasses.replace(turn, text="", final_text="", tool_calls=[])
        self.replied = bool(turn.final_text)
        self.frame: bytes | None = frame.encode()

    def end_frame(self, max_frame_bytes: int) -> str:
        """The ``turn.end`` frame as first sent, or one saying its reply is not kept."""
        if self.frame is not None:
            return self.frame.decode()
        return end_frame(dataclasses.replace(
            self.record, final_text=FORGOTTEN_REPLY if self.replied else ""), max_frame_bytes)


def new_request_id() -> str:
    return secrets.token_hex(16)


def _escaped(text: str) -> bytes:
    """``text`` as it is inside a frame: its JSON string form without the quotes, as
    UTF-8 (each character's escape is the same wherever it stands, so the bytes of a
    prefix of the text are a prefix of these)."""
    return json.dumps(text, ensure_ascii=False)[1:-1].encode("utf-8", "surrogatepass")


def _backslashes_before(escaped: bytes, start: int, end: int) -> int:
    """How many backslashes ``escaped[start:end]`` ends with."""
    piece = escaped[start:end]
    return len(piece) - len(piece.rstrip(b"\\"))


def _piece_end(escaped: bytes, start: int, budget: int) -> int:
    """The end of the longest piece ``escaped[start:end]`` of at most ``budget`` bytes
    that ends between two characters of the text: not inside a UTF-8 sequence nor a JSON
    escape (``\\x``, ``\\uXXXX``). ``start`` is such a place."""
    end = start + max(0, budget)
    if end >= len(escaped):
        return len(escaped)
    while end > start and escaped[end] & 0xC0 == 0x80:  # a UTF-8 continuation byte
        end -= 1
    # A run of backslashes starts between characters and pairs up ("\\\\" is one
    # backslash), so an odd run ends with the start of an escape that was cut.
    if _backslashes_before(escaped, start, end) % 2:
        return end - 1
    unicode = escaped.rfind(b"\\u", max(start, end - 5), end)  # "\\uXXXX" cut short?
    if unicode >= 0 and _backslashes_before(escaped, start, unicode + 1) % 2:
        return unicode
    return end


def _unescaped(piece: bytes) -> str:
    """The text of a piece of :func:`_escaped` bytes that :func:`_piece_end` cut."""
    text: str = json.loads('"' + piece.decode("utf-8", "surrogatepass") + '"')
    return text


def fitted_end_frame(end: protocol.TurnEnd, max_frame_bytes: int) -> str:
    """The ``turn.end`` frame; if its text makes it too large for the page, the longest
    start of the text that fits, with a note of what was cut (the turn's record, in the
    store and the control API, keeps the whole text).

    Linear: the text is encoded once more to measure each character's bytes in the
    frame, and the start that fits is cut from those bytes (a bisection encoded the
    whole frame ~20 times)."""
    frame = end.encode()
    size = protocol.frame_size(frame)
    if size <= max_frame_bytes:
        return frame
    text = end.text
    escaped = _escaped(text)
    envelope = size - len(escaped)  # the frame's bytes besides its text's

    def note(cut: int) -> str:
        return (f"\n[... {cut} more characters: the reply is too long for one frame; "
                "the whole text is in the turn's record]")

    def note_bytes(keep: int) -> int:
        return len(_escaped(note(len(text) - keep)))

    # With the longest note (nothing kept) the start that fits is found in the bytes.
    # A shorter note (fewer digits to count what is cut) may leave room for a few more
    # characters, one at least per byte it saves (the frame grows with every character
    # kept, so the first that does not fit ends the search).
    used = _piece_end(escaped, 0, max_frame_bytes - envelope - note_bytes(0))
    keep = len(_unescaped(escaped[:used]))
    while keep < len(text):
        more = len(_escaped(text[keep]))
        if envelope + used + more + note_bytes(keep + 1) > max_frame_bytes:
            break
        used += more
        keep += 1
    return dataclasses.replace(end, text=text[:keep] + note(len(text) - keep)).encode()


def delta_frames(delta: protocol.TurnDelta, max_frame_bytes: int) -> list[str]:
    """The ``turn.delta`` frames for one piece of streamed text: as few as fit the page's
    limit, cut between characters (the page joins deltas, so nothing is lost). Linear:
    the pieces are cut from the text's encoded bytes, measured once."""
    frame = delta.encode()
    size = protocol.frame_size(frame)
    if size <= max_frame_bytes or len(delta.text) < 2:
        return [frame]
    escaped = _escaped(delta.text)
    budget = max_frame_bytes - (size - len(escaped))
    frames = []
    start = 0
    while start < len(escaped):
        end = _piece_end(escaped, start, budget)
        if end == start:  # a limit below one character's escape: one character a frame
            end = _piece_end(escaped, start, 6)
        piece = _unescaped(escaped[start:end])
        frames.append(dataclasses.replace(delta, text=piece).encode())
        start = end
    return frames


def end_frame(turn: TurnRecord, max_frame_bytes: int) -> str:
    """The ``turn.end`` frame of an ended turn (:func:`fitted_end_frame`)."""
    return fitted_end_frame(protocol.TurnEnd(
        turn_id=turn.id, status=turn.status, text=turn.final_text, error=turn.error,
        usage=turn.usage or None,
    ), max_frame_bytes)


def checked_request_frame(request: protocol.ToolRequest, max_frame_bytes: int) -> str:
    """The ``tool.request`` frame, or the :class:`protocol.ProtocolError` the page would
    answer it with (too large, too deep, NaN or a lone surrogate in the args): such a
    request could only wait for its deadline, so it is refused before it is sent."""
    try:
        frame = request.encode()
    except RecursionError:
        raise protocol.ProtocolError(
            protocol.FRAME_TOO_DEEP, f"the args nest deeper than {protocol.MAX_DEPTH}"
        ) from None
    if not _surely_taken(frame, request, max_frame_bytes):
        protocol.parse_server_frame(frame, max_bytes=max_frame_bytes)  # the page's verdict
    return frame


def _surely_taken(frame: str, request: protocol.ToolRequest, max_frame_bytes: int) -> bool:
    """Whether the page's parse of ``frame`` (Core's strict encoding of ``request``, so
    JSON without NaN) surely takes it, from checks at C speed: within the size limit, no
    lone surrogate (none raw, no ``\\ud`` escape), a string for a tool name (the ids are
    Core's own), and not nested too deep: the page's own check, made before it decodes,
    so a frame that fails it gets the page's refusal from here (linear, at C speed, no
    value built: 1 MiB of small arrays decoded was ~15 to 45 ms with the GIL held). A
    frame that fails another check is parsed as the page would, for its exact refusal."""
    if not isinstance(request.tool, str) or "\\ud" in frame or "\\uD" in frame:
        return False
    try:
        size = len(frame) if frame.isascii() else len(frame.encode("utf-8"))
    except UnicodeEncodeError:  # a raw lone surrogate
        return False
    if size > max_frame_bytes:
        return False
    protocol.refuse_too_deep(frame)
    return True


def checked_call(tool: str, args: Any, max_frame_bytes: int,
                 turn_id: str | None = None) -> CheckedRequest:
    """A new request's id and its checked frame (:func:`checked_request_frame`), before
    anything of it is stored: a caller's args the page would refuse never reach the store."""
    request_id = new_request_id()
    return request_id, checked_request_frame(protocol.ToolRequest(
        tool_request_id=request_id, tool=tool, args=args, turn_id=turn_id), max_frame_bytes)


def refused_request(exc: protocol.ProtocolError) -> dict[str, Any]:
    """The result of a request the page would refuse (too large, too deep, NaN, ...)."""
    return tool_error(INVALID_ARGS, f"the page would refuse this tool.request: {exc.message}",
                      retryable=True)

