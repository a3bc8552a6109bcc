"""The offline agent: Core's embedded default. Deterministic, no network, no model.

Two kinds of message (``docs/reference/agents.md``, "The offline agent", is the user's guide):

* ``/call TOOL {json args}`` lines call exactly those tools, one step per line, in the order
  written, and the reply has one line per call: ``TOOL → RESULT``.
* Any other text is matched against the tools' names and descriptions; the best tool is
  called with arguments read from the text where its schema allows, or the reply asks for
  the arguments it could not read.

Same tools, same text, same results ⇒ same calls and same reply, byte for byte.
"""

from __future__ import annotations

import bisect
import copy
import json
import re
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from ... import strictjson
from ...results import is_error_result
from ...text import lone_surrogate_in_json, not_unicode
from ...tools import NAME_PATTERN
from ..offload import LARGE_CHARS, is_large, off_loop, off_loop_when
from .contract import AgentInfo, ToolCallOutcome, ToolCallRequest, Turn

ARROW = "→"
CALL_SYNTAX = "/call TOOL {json args}"

# --- rendering ---------------------------------------------------------------------------

# Characters str.splitlines() breaks on that json.dumps(ensure_ascii=False) leaves as is.
_LINE_BREAKS = {"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def compact_json(value: Any) -> str:
    """One line of JSON, non-ASCII kept readable."""
    text = json.dumps(value, ensure_ascii=False)
    for char, escape in _LINE_BREAKS.items():
        text = text.replace(char, escape)
    return text


def _one_line(text: str) -> str:
    """``text`` itself when it is printable on one line, else its JSON string form."""
    return text if text.isprintable() else compact_json(text)


def render_result(result: Any) -> str:
    """A tool result on one line: the value's JSON, or ``error CODE: message``."""
    if is_error_result(result):
        error = result["error"]
        code = error.get("code")
        if not isinstance(code, str):
            return "error " + compact_json(error)
        message = error.get("message")
        if isinstance(message, str) and message:
            return f"error {_one_line(code)}: {_one_line(message)}"
        return f"error {_one_line(code)}"
    return compact_json(result)


def render_outcome(outcome: ToolCallOutcome) -> str:
    return f"{outcome.tool} {ARROW} {render_result(outcome.result)}"


# --- /call lines -------------------------------------------------------------------------


def _is_call_line(line: str) -> bool:
    stripped = line.lstrip()
    return stripped.startswith("/call") and (len(stripped) == 5 or stripped[5].isspace())


def _snippet(text: str, limit: int = 60) -> str:
    return compact_json(text if len(text) <= limit else text[: limit - 1] + "…")


def _parse_call(line: str) -> ToolCallRequest | str:
    """One ``/call`` line as a request, or what is wrong with it."""
    parts = line.lstrip()[len("/call") :].split(None, 1)
    if not parts:
        return f"no tool name after /call (write {CALL_SYNTAX})"
    name = parts[0]
    if not NAME_PATTERN.fullmatch(name):
        return (
            f"{_snippet(name)} is not a tool name (1 to 64 letters, digits, '_' or '-')"
        )
    if len(parts) == 1:
        return ToolCallRequest(name, {})
    raw = parts[1].strip()
    try:
        args = strictjson.decode(raw)
    except json.JSONDecodeError as exc:
        return f"the args for {name} are not valid JSON: {exc.msg} at character {exc.pos + 1}"
    except ValueError as exc:  # our number checks, or an integer too long to convert
        return f"the args for {name} are not valid JSON: {_one_line(str(exc))}"
    except RecursionError:
        return f"the args for {name} are nested too deeply"
    if not isinstance(args, dict):
        kind = "an array" if isinstance(args, list) else "not an object"
        return f"the args for {name} must be a JSON object like {{\"key\": 1}}, got {kind}"
    # "\ud800" decodes to text no frame or row can hold (found in the text, at C speed)
    where = lone_surrogate_in_json(raw, args)
    if where is not None:
        return f"the args for {name} hold {not_unicode(where)}"
    return ToolCallRequest(name, args)


@dataclass(frozen=True)
class CallMessage:
    """A ``/call`` message: its calls, or the problems that stop all of them. The first
    call is kept as it was read (it runs at once: its args are not decoded twice); the
    others as their lines, each read again when its step comes, so that a turn holds no
    decoded args but the running call's."""

    calls: deque[ToolCallRequest | str]
    problems: list[str]


#: problems of a /call message quoted in the reply; the rest are counted (a reply must not
#: grow with the message: 1 MiB of short bad lines made a 32 MB reply)
MAX_PROBLEMS = 20


async def _read_call(call: ToolCallRequest | str) -> ToolCallRequest:
    """``call``, or a line :func:`parse_call_message` found well-formed, read again (a
    long one off the event loop)."""
    if isinstance(call, ToolCallRequest):
        return call
    parsed = await off_loop_when(len(call) > LARGE_CHARS, _parse_call, call)
    assert isinstance(parsed, ToolCallRequest)  # the same line, read the same way
    return parsed


def parse_call_message(text: str) -> CallMessage | None:
    """The ``/call`` lines of ``text``, or None when it is not a ``/call`` message.

    A message is a ``/call`` message when any of its lines starts with ``/call``; then every
    non-blank line must be a well-formed ``/call`` line. Problems read ``line N: ...``.
    """
    lines = text.splitlines()
    if not any(_is_call_line(line) for line in lines):
        return None
    message = CallMessage(deque(), [])
    unlisted = 0  # problems past MAX_PROBLEMS: counted, not written out
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if not _is_call_line(line):
            if len(message.problems) >= MAX_PROBLEMS:
                unlisted += 1
                continue
            message.problems.append(
                f"line {number}: {_snippet(line.strip())} is not a /call line; a message "
                "with /call lines may hold only /call lines")
            continue
        parsed = _parse_call(line)
        if not isinstance(parsed, str):
            message.calls.append(line if message.calls else parsed)
        elif len(message.problems) < MAX_PROBLEMS:
            message.problems.append(f"line {number}: {parsed}")
        else:
            unlisted += 1
    if unlisted:
        message.problems.append(f"... and {unlisted} more lines with problems")
    return message


# --- matching text to a tool -------------------------------------------------------------

#: characters of a message (one with no /call line), and of each tool's description, read
MAX_READ_CHARS = 4096
NAME_WORD_SCORE = 3
DESCRIPTION_WORD_SCORE = 1
MIN_SCORE = 2  # one name word, or two description words

_STOPWORDS = frozenset(
    [
        "a", "about", "also", "am", "an", "and", "any", "are", "as", "at", "be", "by", "can",
        "could", "do", "does", "for", "from", "get", "give", "has", "have", "how", "i", "in", "is",
        "it", "its", "me", "my", "now", "of", "on", "or", "please", "s", "show", "tell", "that",
        "the", "their", "them", "then", "there", "this", "to", "us", "want", "was", "we", "what",
        "whats", "which", "will", "with", "would", "you", "your",
    ]
)
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_LETTERS = re.compile(r"[^\W\d_]+")


def words(text: str) -> list[str]:
    """Lowercase letter-words of ``text`` (snake_case, kebab-case and camelCase split),
    stopwords left out, in order of first appearance, each once."""
    found = _LETTERS.findall(_CAMEL.sub(" ", text).lower())
    return list(dict.fromkeys(w for w in found if w not in _STOPWORDS))


class _TextIndex:
    """The message's words, as sets: each lookup is a few set lookups, whatever the
    number of words (scanning the words that share a prefix was text x description).

    Two words of at least four letters have the same stem when they are equal over the
    first five letters, or over all of the shorter one: counter/counters,
    selected/selection, title/titled."""

    def __init__(self, text: str) -> None:
        self.exact = set(words(text))
        self.four = {word for word in self.exact if len(word) == 4}
        self.prefix4 = {word[:4] for word in self.exact if len(word) >= 4}
        self.prefix5 = {word[:5] for word in self.exact if len(word) >= 5}

    def mentions(self, word: str) -> bool:
        if word in self.exact:
            return True
        if len(word) < 4:
            return False
        if len(word) == 4:  # the whole of it starts a word of the text
            return word in self.prefix4
        return word[:5] in self.prefix5 or word[:4] in self.four


@dataclass(frozen=True)
class Match:
    tool: dict[str, Any]
    score: int
    name_words: int


def best_tool(text: str, tools: list[dict[str, Any]]) -> Match | None:
    """The tool (from the session's validated metadata) the text is most about, or None
    when none scores :data:`MIN_SCORE`.

    Each of a tool's name words the text mentions scores 3, each other description word 1.
    Ties: more name words first, then the earlier tool in the session's list. Reads the
    first :data:`MAX_READ_CHARS` characters of the text and of each description.
    """
    index = _TextIndex(text[:MAX_READ_CHARS])
    best: Match | None = None
    for tool in tools:
        name_words = words(tool["name"])
        description = tool["description"][:MAX_READ_CHARS]
        other_words = [w for w in words(description) if w not in name_words]
        hits = sum(1 for w in name_words if index.mentions(w))
        score = NAME_WORD_SCORE * hits + DESCRIPTION_WORD_SCORE * sum(
            1 for w in other_words if index.mentions(w)
        )
        if score >= MIN_SCORE and (
            best is None or (score, hits) > (best.score, best.name_words)
        ):
            best = Match(tool, score, hits)
    return best


# --- arguments from the text -------------------------------------------------------------

#: properties of a schema, and values of an enum, looked for in a message (in order)
MAX_FILL_NAMES = 64
#: names and values of more than one word looked for in one message (each is a search)
MAX_PHRASE_LOOKUPS = 16

# "...", '...' and the typographic pairs \u201c...\u201d and \u2018...\u2019
_QUOTES = {'"': '"', "'": "'", "\u201c": "\u201d", "\u2018": "\u2019"}
_QUOTED = r'"[^"\n]*"|\'[^\'\n]*\'|\u201c[^\u201d\n]*\u201d|\u2018[^\u2019\n]*\u2019'
_QUOTED_RE = re.compile(rf"(?<!\w)(?:{_QUOTED})")
_NUMBER_RE = re.compile(r"(?<![\w.])([-+]?)(\d+(?:\.\d+)?)(?!\w|\.\d)")
_NEGATING = re.compile(r"\b(?:decreas\w*|decrement\w*|subtract\w*|minus|reduc\w*|down)\b")
_BOOLEAN_WORDS = {"yes": True, "true": True, "no": False, "false": False}
_BOOLEAN_RE = re.compile(r"\b(yes|true|no|false)\b")
_WORD = re.compile(r"[\w-]+")  # a name stands alone: no such character just before or after
_WORD_CHAR = re.compile(r"[\w-]")
_LETTER = re.compile(r"\w")
_SEPARATORS = (re.compile(r"\s*[:=]\s*"), re.compile(r"\s+"))  # name=value, name value
_VALUE_END = re.compile(r"[\s,;]")
_KINDS = ("integer", "number", "boolean", "string")
_NO_VALUE: Any = object()  # "the text gives no value for this property"
_EXAMPLES: dict[str, Any] = {"integer": 1, "number": 1.5, "boolean": True, "string": "..."}

Span = tuple[int, int]


def _kind(schema: Any) -> str | None:
    """``enum``, ``integer``, ``number``, ``boolean``, ``string``, or None (anything else)."""
    if not isinstance(schema, dict):
        return None
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return "enum"
    declared = schema.get("type")
    types = [declared] if isinstance(declared, str) else declared
    if not isinstance(types, list):
        return None
    return next((kind for kind in _KINDS if kind in types), None)


def _unquote(raw: str) -> str | None:
    return raw[1:-1] if _QUOTED_RE.fullmatch(raw) else None


def _number(sign: str, digits: str, kind: str) -> int | float | None:
    if kind == "integer":
        return None if "." in digits else int(sign + digits)
    return float(sign + digits) if "." in digits else int(sign + digits)


def _shown(member: Any) -> str:
    """An enum value as the text would say it."""
    return member if isinstance(member, str) else compact_json(member)


def _lower(text: str) -> str:
    """``text`` in lower case, character for character (positions stay the same)."""
    lowered = text.lower()
    if len(lowered) == len(text):
        return lowered
    return "".join(c if len(c.lower()) != 1 else c.lower() for c in text)


def _members(schema: dict[str, Any]) -> dict[str, Any]:
    """An enum's first values by how the text says them, in any case (the first wins)."""
    found: dict[str, Any] = {}
    for member in schema["enum"][:MAX_FILL_NAMES]:
        found.setdefault(_lower(_shown(member)), member)
    return found


def _convert(raw: str, explicit: bool, kind: str | None, members: dict[str, Any]) -> Any:
    """``raw`` as a value of ``kind`` (an enum's values: ``members``), or ``_NO_VALUE``.
    Bare strings need ``name=``."""
    inner = _unquote(raw)
    if kind == "string":
        if inner is not None:
            return inner
        return raw if explicit else _NO_VALUE
    if kind == "enum":
        return members.get(_lower(inner if inner is not None else raw), _NO_VALUE)
    if kind == "boolean":
        return _BOOLEAN_WORDS.get(raw.lower(), _NO_VALUE)
    if kind in ("integer", "number"):
        number = _NUMBER_RE.fullmatch(raw)
        if number is not None:
            value = _number(number.group(1), number.group(2), kind)
            return _NO_VALUE if value is None else value
    return _NO_VALUE


def _next(positions: list[int], after: int) -> int | None:
    """The first of the sorted ``positions`` greater than ``after``."""
    index = bisect.bisect_right(positions, after)
    return positions[index] if index < len(positions) else None


class _Filler:
    """Reads values out of the text; each stretch of text gives at most one value.

    The text is read once: its words indexed, its quotes and value ends found. A name
    looked up is then a dictionary lookup, not a pass over the text (a regular expression
    per property was properties x text: 22 s for 4,000 properties and 400 KiB).
    """

    def __init__(self, text: str) -> None:
        self.text = text
        self.lowered = _lower(text)
        self.taken: list[Span] = []
        self.words: dict[str, list[int]] = {}
        for word in _WORD.finditer(self.lowered):
            self.words.setdefault(word.group(), []).append(word.start())
        self.phrases_left = MAX_PHRASE_LOOKUPS
        self.newlines = [m.start() for m in re.finditer("\n", text)]
        self.closers = {closer: [m.start() for m in re.finditer(closer, text)]
                        for closer in set(_QUOTES.values())}
        self.value_ends = [m.start() for m in _VALUE_END.finditer(text)]
        self.quoted = self._quoted_strings()
        self.mentions: dict[int, tuple[bool, Span] | None] = {}

    def _quote_at(self, start: int) -> int | None:
        """The end of the quoted string opening at ``start``, if one does (closed before
        the line ends)."""
        closer = _QUOTES.get(self.text[start])
        if closer is None:
            return None
        end = _next(self.closers[closer], start)
        line_end = _next(self.newlines, start)
        return None if end is None or (line_end is not None and line_end < end) else end + 1

    def _quoted_strings(self) -> list[Span]:
        """The quoted strings, as ``_QUOTED_RE.finditer`` finds them, in linear time (the
        expression tries each opening quote to the end of its line: quadratic)."""
        found: list[Span] = []
        for opening in re.finditer("|".join(_QUOTES), self.text):
            start = opening.start()
            if found and start < found[-1][1]:
                continue
            if start and _LETTER.match(self.text, start - 1):  # (?<!\w)
                continue
            end = self._quote_at(start)
            if end is not None:
                found.append((start, end))
        return found

    def occurrences(self, name: str) -> Iterator[Span]:
        """Where ``name`` stands in the text (any case), not part of a longer word, in
        order. A word is looked up; a phrase (several words, or other characters) is
        searched for, at most :data:`MAX_PHRASE_LOOKUPS` times a message."""
        key = _lower(name)
        if _WORD.fullmatch(key):
            yield from ((start, start + len(key)) for start in self.words.get(key, ()))
            return
        if self.phrases_left <= 0 or len(key) > len(self.lowered):
            return
        self.phrases_left -= 1
        start = self.lowered.find(key)
        while start >= 0:
            end = start + len(key)
            before = start > 0 and _WORD_CHAR.match(self.lowered, start - 1)
            if not before and not _WORD_CHAR.match(self.lowered, end):
                yield start, end
            start = self.lowered.find(key, start + 1)

    def _mention(self, end: int) -> tuple[bool, Span] | None:
        """What follows a name ending at ``end``: ``=value``, ``: value`` or `` value``
        (quoted, or up to a space, comma or semicolon), as (explicit, the value's span)."""
        if end not in self.mentions:
            self.mentions[end] = None
            for explicit, separator in zip((True, False), _SEPARATORS, strict=True):
                found = separator.match(self.text, end)
                start = found.end() if found else len(self.text)
                if start == len(self.text):
                    continue
                value_end = self._quote_at(start)
                if value_end is None:
                    value_end = _next(self.value_ends, start - 1)
                    value_end = len(self.text) if value_end is None else value_end
                if value_end > start:
                    self.mentions[end] = (explicit, (start, value_end))
                    break
        return self.mentions[end]

    def named(self, name: str, kind: str | None, schema: dict[str, Any]) -> Any:
        """``name=value``, ``name: value`` or ``name value`` (quoted, number, boolean)."""
        members = _members(schema) if kind == "enum" else {}
        searched = 0  # each mention read ends where its value does, as one pass would
        for start, end in self.occurrences(name):
            mention = None if start < searched else self._mention(end)
            if mention is None:
                continue
            explicit, (value_start, value_end) = mention
            raw = self.text[value_start:value_end]
            if _unquote(raw) is None:
                raw = raw.rstrip(".!?)") or raw  # "delta=5." ends a sentence
            value = _convert(raw, explicit, kind, members)
            if value is not _NO_VALUE:
                self.taken.append((start, value_end))
                return value
            searched = value_end
        return _NO_VALUE

    def first(self, spans: Iterable[Span], also_avoid: list[Span]) -> Span | None:
        """The first of ``spans`` (in order, not overlapping each other) in text no other
        value used, now taken. One pass over both."""
        blocked = sorted((*self.taken, *also_avoid))
        index, reach = 0, -1  # how far the blocked spans starting before this one reach
        for start, end in spans:
            while index < len(blocked) and blocked[index][0] < end:
                reach = max(reach, blocked[index][1])
                index += 1
            if reach <= start:
                self.taken.append((start, end))
                return start, end
        return None

    def earliest(self, members: list[Any]) -> Any:
        """The value of ``members`` the text names first."""
        earliest: tuple[int, int] | None = None
        for index, member in enumerate(members[:MAX_FILL_NAMES]):
            shown = _shown(member)
            found = next(self.occurrences(shown), None) if shown else None
            if found is not None and (earliest is None or found[0] < earliest[0]):
                earliest = (found[0], index)
        return _NO_VALUE if earliest is None else members[earliest[1]]


def fill_args(
    schema: Any, text: str
) -> tuple[dict[str, Any], list[tuple[str, Any]]]:
    """Arguments for a tool read from ``text``: ``(args, [(missing name, its schema)])``.

    In order: ``name=value`` mentions; the first number for the only numeric property
    (negated when the text says decrease, subtract, minus, reduce or down and gives no
    sign); the first quoted string for the only string property; the earliest enum value
    named; yes/no/true/false for the only boolean property; then schema defaults.
    Reads the first :data:`MAX_READ_CHARS` characters of the text, and looks for the first
    :data:`MAX_FILL_NAMES` properties (the others get their defaults, or are asked for).
    """
    if not isinstance(schema, dict) or not isinstance(schema.get("properties"), dict):
        return {}, []
    properties: dict[str, Any] = schema["properties"]
    kinds = {name: _kind(spec) for name, spec in list(properties.items())[:MAX_FILL_NAMES]}
    filler = _Filler(text[:MAX_READ_CHARS])
    args: dict[str, Any] = {}
    for name in kinds:
        if not name.strip():  # a blank name cannot be mentioned
            continue
        spec = properties[name]
        value = filler.named(name, kinds[name], spec if isinstance(spec, dict) else {})
        if value is not _NO_VALUE:
            args[name] = value

    def only(*wanted: str) -> str | None:
        names = [name for name, kind in kinds.items() if kind in wanted]
        return names[0] if len(names) == 1 and names[0] not in args else None

    numeric = only("integer", "number")
    if numeric is not None:
        numbers = {m.span(): m for m in _NUMBER_RE.finditer(filler.text)}
        span = filler.first(numbers, filler.quoted)  # not inside quotes
        if span is not None:
            number = numbers[span]
            value = _number(number.group(1), number.group(2), str(kinds[numeric]))
            if value is not None:
                negate = not number.group(1) and _NEGATING.search(filler.lowered) is not None
                args[numeric] = -value if negate else value
    string = only("string")
    if string is not None:
        quoted = filler.first(filler.quoted, [])
        if quoted is not None:
            args[string] = filler.text[quoted[0] + 1 : quoted[1] - 1]
    for name, kind in kinds.items():
        if kind == "enum" and name not in args:
            choice = filler.earliest(properties[name]["enum"])
            if choice is not _NO_VALUE:
                args[name] = choice
    boolean = only("boolean")
    if boolean is not None:
        said = _BOOLEAN_RE.search(filler.lowered)
        if said is not None:
            args[boolean] = _BOOLEAN_WORDS[said.group(1)]
    for name, spec in properties.items():
        if name not in args and isinstance(spec, dict) and "default" in spec:
            args[name] = copy.deepcopy(spec["default"])
    required = schema.get("required")
    wanted = required if isinstance(required, list) else []
    missing = [  # a name listed twice is asked for once
        (name, properties.get(name))
        for name in dict.fromkeys(name for name in wanted if isinstance(name, str))
        if name not in args
    ]
    return args, missing


def _describe_property(name: str, schema: Any) -> str:
    kind = _kind(schema)
    if kind == "enum":
        label = "one of " + ", ".join(compact_json(m) for m in schema["enum"])
    else:
        label = kind or "a JSON value"
    description = schema.get("description") if isinstance(schema, dict) else None
    if isinstance(description, str) and description.strip():
        label += ": " + _one_line(description.strip())
    return f"{name} ({label})"


def _example(schema: Any) -> Any:
    kind = _kind(schema)
    if kind == "enum":
        return schema["enum"][0]
    return _EXAMPLES.get(kind or "")


def question(tool: str, missing: list[tuple[str, Any]], args: dict[str, Any]) -> str:
    """Ask for the required arguments the text did not give."""
    described = [_describe_property(name, schema) for name, schema in missing]
    listing = described[0] if len(described) == 1 else (
        ", ".join(described[:-1]) + " and " + described[-1]
    )
    noun = "a value" if len(missing) == 1 else "values"
    example = {**args, **{name: _example(schema) for name, schema in missing}}
    return (
        f"To call {tool} I need {noun} for {listing}. What should "
        f"{'it' if len(missing) == 1 else 'they'} be? For example: "
        f"/call {tool} {compact_json(example)}"
    )


def no_match(tools: list[dict[str, Any]]) -> str:
    """No tool fits: say so and list the tools there are."""
    if not tools:
        return "No tool fits that, and this session has no tools yet."
    lines = ["No tool fits that. The tools are:"]
    for tool in tools:
        first_line = tool["description"].strip().splitlines()[0]  # non-empty: validated
        lines.append(f"- {tool['name']}: {_one_line(first_line)}")
    lines.append(f"Ask for one of them, or call it directly: {CALL_SYNTAX}")
    return "\n".join(lines)


# --- the agent ---------------------------------------------------------------------------


def _plan(text: str, tools: list[dict[str, Any]]) -> tuple[str, dict[str, Any]] | str:
    """For text that is not ``/call`` lines: the call to make (tool name, args), or the
    reply when there is none. Returns nothing of ``tools``, so the turn does not hold the
    decoded metadata while it waits for the call."""
    match = best_tool(text, tools)
    if match is None:
        return no_match(tools)
    name = str(match.tool["name"])
    args, missing = fill_args(match.tool.get("argsSchema"), text)
    if missing:
        return question(name, missing, args)
    return name, args


class _Reply:
    """The reply, streamed: every piece goes to ``turn.say`` as it is known."""

    def __init__(self, turn: Turn) -> None:
        self._turn = turn
        self._blocks: list[str] = []

    async def add(self, block: str) -> None:
        await self._turn.say(block if not self._blocks else "\n" + block)
        self._blocks.append(block)

    @property
    def text(self) -> str:
        return "\n".join(self._blocks)


class OfflineAgent:
    """Core's embedded default agent; see the module docstring and ``docs/reference/agents.md``."""

    def __init__(self) -> None:
        self.info = AgentInfo(name="offline")

    async def run(self, turn: Turn) -> str:
        reply = _Reply(turn)
        calls: list[dict[str, Any]] = []
        # reading a long message (lines, JSON args) is linear work: off the event loop
        message = await off_loop_when(len(turn.text) > LARGE_CHARS, parse_call_message,
                                      turn.text)
        if message is None:
            await self._answer(turn, reply, calls)
        elif message.problems:
            count = len(message.problems)
            await reply.add(
                "Nothing was called: "
                + ("this line has a problem:" if count == 1 else "these lines have problems:")
            )
            await reply.add("\n".join(message.problems))
            await reply.add(f"Write one call per line: {CALL_SYNTAX}")
        elif await self._within_steps(turn, reply, len(message.calls)):
            while message.calls:  # one step each, in this order
                await self._call(turn, reply, calls, message.calls)
        text = reply.text
        turn.remember(
            {
                "agent": "offline",
                "turn_id": turn.turn_id,
                "user": turn.text,
                "calls": calls,
                "reply": text,
            }
        )
        return text

    async def _answer(self, turn: Turn, reply: _Reply, calls: list[dict[str, Any]]) -> None:
        # the tools are decoded, and matched to the text, off the event loop
        planned = await off_loop(lambda: _plan(turn.text, turn.tools))
        if isinstance(planned, str):
            await reply.add(planned)
            return
        name, args = planned
        if await self._within_steps(turn, reply, 1):
            await reply.add(f"Calling {name} {compact_json(args)}")
            await self._call(turn, reply, calls, deque([ToolCallRequest(name, args)]))

    @staticmethod
    async def _within_steps(turn: Turn, reply: _Reply, steps: int) -> bool:
        if steps <= turn.max_steps:
            return True
        await reply.add(
            f"Nothing was called: that takes {steps} tool "
            f"step{'s' if steps != 1 else ''} and this turn allows {max(turn.max_steps, 0)}."
        )
        return False

    @staticmethod
    async def _call(turn: Turn, reply: _Reply, calls: list[dict[str, Any]],
                    waiting: deque[ToolCallRequest | str]) -> None:
        """One step: the next of ``waiting``, or the ``/call`` line to read it from (read
        here), taken out of it. Nothing here holds its decoded args while the page works
        (a turn keeps them as text: :meth:`Turn.call_tools`); history keeps that text."""
        (outcome,) = await turn.call_tools([await _read_call(waiting.popleft())])
        calls.append({"tool": outcome.tool, "args": outcome.args_json or outcome.args,
                      "result": outcome.result_json or outcome.result})
        await reply.add(await off_loop_when(is_large(outcome.result), render_outcome, outcome))
