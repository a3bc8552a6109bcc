"""JSON Schema: the definition-time check, and args validators built once per tool.

``check_schema`` is a structural check of a schema against the draft 2020-12 meta-schema's
rules for each keyword's value, written out here so that defining a tool does not import
jsonschema: that import costs ~450 ms in the page and must stay off the path to "ready".
The validator itself (jsonschema) is built on first use and kept for the tool's lifetime.

Regular expressions are the one costly part of the check (~0.2 to 1.7 µs a character to
parse, a hundred times JSON's): each distinct one is parsed once (:data:`PATTERN_CACHE`
verdicts kept), and a caller that checks what strangers send (Core) charges what is not
cached to its sender with :func:`charging_patterns`.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import itertools
import re
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

from .errors import PedelecError
from .text import excerpt, json_path, quote

JSON_TYPES = ("null", "boolean", "object", "array", "number", "string", "integer")

# Keywords whose value is a schema, a map of schemas, or a non-empty array of schemas.
_SCHEMA_KEYWORDS = (
    "additionalProperties", "items", "contains", "propertyNames", "not", "if", "then", "else",
    "unevaluatedItems", "unevaluatedProperties", "additionalItems", "contentSchema",
)
_SCHEMA_MAP_KEYWORDS = ("properties", "patternProperties", "$defs", "definitions",
                        "dependentSchemas")
_SCHEMA_ARRAY_KEYWORDS = ("allOf", "anyOf", "oneOf", "prefixItems")
_COUNT_KEYWORDS = ("maxLength", "minLength", "maxItems", "minItems", "maxProperties",
                   "minProperties", "minContains", "maxContains")
_NUMBER_KEYWORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_STRING_KEYWORDS = ("$id", "$schema", "$anchor", "$dynamicAnchor", "$dynamicRef", "$comment",
                    "title", "description", "format", "contentEncoding", "contentMediaType")
_BOOL_KEYWORDS = ("uniqueItems", "readOnly", "writeOnly", "deprecated")
#: the longest ``pattern`` (or ``patternProperties`` name) a schema may hold
MAX_PATTERN_LENGTH = 1000
#: the deepest nesting of groups in a pattern
MAX_PATTERN_NESTING = 50


class SchemaError(PedelecError, ValueError):
    """A schema that is not valid JSON Schema; the message names where and why."""


def check_schema(schema: Any, where: str = "$") -> None:
    """Raise :class:`SchemaError` if ``schema`` is not a valid JSON Schema, or if one of
    its local ``$ref``s points to nothing (else every call would fail on it).

    Linear in the size of the schema: it runs on what any page sends Core."""
    found = _Found(where)
    _check(schema, where, found)
    _check_references(schema, where, found)


class _Where:
    """Where a subschema is (``$.properties.a``), made into text only for an error
    message: text built at every node would copy its parents' keys again at each one,
    quadratic under a long key."""

    __slots__ = ("parent", "part")

    def __init__(self, parent: Where, part: str) -> None:
        self.parent = parent
        self.part = part

    def __str__(self) -> str:
        parts: list[str] = []
        node: Where = self
        while isinstance(node, _Where):
            parts.append(node.part)
            node = node.parent
        return node + "".join(reversed(parts))


Where = _Where | str


class _Found:
    """What the walk over a schema's subschemas met: references, anchors, nested ``$id``s
    (only in schema positions: a ``{"$ref": ...}`` inside ``const`` is data)."""

    __slots__ = ("anchors", "nested_id", "refs", "root")

    def __init__(self, root: str) -> None:
        self.root = root  # where the schema itself is
        self.refs: list[tuple[str, Where]] = []  # (reference, where)
        self.anchors: set[str] = set()
        self.nested_id = False


def _check(schema: Any, where: Where, found: _Found) -> None:
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise SchemaError(f"{where}: a schema must be an object or a boolean, got {_kind(schema)}")
    for key in schema:
        if not isinstance(key, str):
            raise SchemaError(f"{where}: keys must be strings, got {quote(key)}")
    if "$id" in schema and where is not found.root:
        found.nested_id = True
    for keyword, value in schema.items():
        _check_keyword(keyword, value, _Where(where, "." + excerpt(keyword)), found)


def _check_keyword(keyword: str, value: Any, where: Where, found: _Found) -> None:
    if keyword == "type":
        _check_type(value, where)
    elif keyword in _SCHEMA_KEYWORDS:
        if keyword in ("items", "additionalItems") and isinstance(value, list):
            _check_schema_array(value, where, found)  # draft 7 tuple form
        else:
            _check(value, where, found)
    elif keyword in _SCHEMA_MAP_KEYWORDS:
        if not isinstance(value, dict):
            raise SchemaError(f"{where}: must be an object of schemas, got {_kind(value)}")
        for name, sub in value.items():
            if keyword == "patternProperties":
                _check_regex(name, _Where(where, f"[{quote(name)}]"))
            _check(sub, _Where(where, "." + excerpt(name)), found)
    elif keyword in _SCHEMA_ARRAY_KEYWORDS:
        _check_schema_array(value, where, found)
    elif keyword in _COUNT_KEYWORDS:
        if not _is_int(value) or value < 0:
            raise SchemaError(f"{where}: must be a non-negative integer, got {quote(value)}")
    elif keyword in _NUMBER_KEYWORDS:
        if not _is_number(value):
            raise SchemaError(f"{where}: must be a number, got {quote(value)}")
    elif keyword == "multipleOf":
        if not _is_number(value) or value <= 0:
            raise SchemaError(f"{where}: must be a number greater than 0, got {quote(value)}")
    elif keyword == "required":
        _check_string_set(value, where)
    elif keyword == "dependentRequired":
        if not isinstance(value, dict):
            raise SchemaError(f"{where}: must be an object, got {_kind(value)}")
        for name, names in value.items():
            _check_string_set(names, _Where(where, "." + excerpt(name)))
    elif keyword == "enum" or keyword == "examples":
        if not isinstance(value, list):
            raise SchemaError(f"{where}: must be an array, got {_kind(value)}")
    elif keyword == "pattern":
        if not isinstance(value, str):
            raise SchemaError(f"{where}: must be a string, got {_kind(value)}")
        _check_regex(value, where)
    elif keyword == "$ref":
        if not isinstance(value, str):
            raise SchemaError(f"{where}: must be a string, got {_kind(value)}")
        if not value.startswith("#"):
            # A remote reference would make the validator fetch a URL: never do that.
            raise SchemaError(
                f"{where}: only local references ('#...') are allowed, got {quote(value)}")
        found.refs.append((value, where))
    elif keyword in _STRING_KEYWORDS:
        if not isinstance(value, str):
            raise SchemaError(f"{where}: must be a string, got {_kind(value)}")
        if keyword in ("$anchor", "$dynamicAnchor"):
            found.anchors.add(value)
    elif keyword in _BOOL_KEYWORDS and not isinstance(value, bool):
        raise SchemaError(f"{where}: must be a boolean, got {_kind(value)}")
    # Any other keyword (const, default, vendor extensions) may hold any value.


def _check_references(root: Any, where: Where, found: _Found) -> None:
    """Each ``#/json/pointer`` resolves in ``root``, each ``#name`` names an ``$anchor``.
    Skipped when a subschema has its own ``$id`` (its references resolve against it)."""
    if found.nested_id:
        return
    targets: dict[str, Any] = {}  # each pointer resolved once
    for ref, at in found.refs:
        fragment = _unquote(ref[1:])
        if fragment and not fragment.startswith("/"):
            if fragment not in found.anchors:
                raise SchemaError(f"{at}: {quote(ref)} names no $anchor in this schema")
        elif ref not in targets:
            targets[ref] = _resolve(root, fragment)
            if targets[ref] is _NOWHERE:
                raise SchemaError(f"{at}: {quote(ref)} points to nothing in this schema")
    _check_no_loop(targets, where)


# keywords that apply a subschema to the same instance: a $ref cycle through only these
# never reaches a smaller part of the args, and the validator recurses until it fails
_SAME_INSTANCE = ("allOf", "anyOf", "oneOf", "not", "if", "then", "else", "dependentSchemas")


def _same_instance_edges(targets: dict[str, Any], node: Any) -> list[tuple[Any, str | None]]:
    """The subschemas applied to the same instance as ``node``: its local pointer ``$ref``'s
    target (with the reference) and its same-instance keywords' subschemas (with None)."""
    if not isinstance(node, dict):
        return []
    edges: list[tuple[Any, str | None]] = []
    ref = node.get("$ref")
    if isinstance(ref, str) and ref in targets:
        edges.append((targets[ref], ref))
    for keyword in _SAME_INSTANCE:
        value = node.get(keyword)
        if isinstance(value, list):
            edges.extend((sub, None) for sub in value)
        elif isinstance(value, dict):
            subs = value.values() if keyword == "dependentSchemas" else [value]
            edges.extend((sub, None) for sub in subs)
    return edges


def _check_no_loop(targets: dict[str, Any], where: Where) -> None:
    """No pointer (``targets``: each one's subschema) leads back to itself through
    same-instance keywords only.

    One depth-first walk over the graph of subschemas (same-instance keywords and local
    pointer references), each subschema entered once: linear in the schema, however the
    references chain (a walk from every pointer was quadratic in a chain of them).
    """
    done: set[int] = set()
    for start, target in targets.items():
        if id(target) in done:
            continue
        # the path from the start: (node, the reference that led to it, its edges left)
        path: list[tuple[Any, str | None, list[tuple[Any, str | None]]]] = [
            (target, start, _same_instance_edges(targets, target))]
        on_path = {id(target): 0}
        while path:
            node, _, edges = path[-1]
            if not edges:
                path.pop()
                del on_path[id(node)]
                done.add(id(node))
                continue
            sub, ref = edges.pop()
            if id(sub) in on_path:  # a cycle: name a reference on it (one always is)
                loop = [via for _, via, _ in path[on_path[id(sub)] + 1:]] + [ref]
                named = next(via for via in loop if via is not None)
                raise SchemaError(f"{where}: {quote(named)} leads back to itself without "
                                  "descending into the arguments: validation would never end")
            if id(sub) not in done and isinstance(sub, dict):
                on_path[id(sub)] = len(path)
                path.append((sub, ref, _same_instance_edges(targets, sub)))


def _unquote(text: str) -> str:
    """Percent-decoding, without urllib.parse (it imports ipaddress: ~50 ms in the page)."""
    if "%" not in text:
        return text
    raw = re.sub(rb"%([0-9A-Fa-f]{2})", lambda m: bytes([int(m.group(1), 16)]), text.encode())
    return raw.decode("utf-8", "replace")


_NOWHERE = object()


def _resolve(root: Any, pointer: str) -> Any:
    """The node a JSON pointer names in ``root``, or ``_NOWHERE``."""
    node = root
    for token in pointer.split("/")[1:]:
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return _NOWHERE
    return node


def _check_type(value: Any, where: Where) -> None:
    names = value if isinstance(value, list) else [value]
    if isinstance(value, list) and (not value or len(set(map(repr, value))) != len(value)):
        raise SchemaError(f"{where}: must be a non-empty array of distinct type names")
    for name in names:
        if name not in JSON_TYPES:
            raise SchemaError(
                f"{where}: {quote(name)} is not a JSON Schema type (one of {', '.join(JSON_TYPES)})"
            )


def _check_schema_array(value: Any, where: Where, found: _Found) -> None:
    if not isinstance(value, list) or not value:
        raise SchemaError(f"{where}: must be a non-empty array of schemas")
    for index, sub in enumerate(value):
        _check(sub, _Where(where, f"[{index}]"), found)


def _check_string_set(value: Any, where: Where) -> None:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise SchemaError(f"{where}: must be an array of strings, got {quote(value)}")
    if len(set(value)) != len(value):
        raise SchemaError(f"{where}: must not repeat a name, got {quote(value)}")


def _private_parser() -> Callable[[str], object] | None:
    """``re._parser.parse``, the parser re.compile runs first, if this Python has it as
    3.11 to 3.14 do. It is private, but worth it: parsing ``(?i)[\u0100-\uffff]``
    takes ~10 us, compiling it ~10 ms (a page's pattern of 1000 characters: ~2 s)."""
    try:
        parse: Callable[[str], object] = importlib.import_module("re._parser").parse
        parse("(a|b)+")
    except Exception:  # moved, renamed or changed: the public path below
        return None
    return parse


# re.compile, the public fallback, refuses the same patterns and also those that parse but
# cannot compile (a look-behind of varying width), at the compiling's cost
_parse_pattern: Callable[[str], object] = _private_parser() or re.compile
# What is not a group's parenthesis: an escape, a character class, any other character.
_NOT_A_GROUP = re.compile(r"\\.|\[\^?\]?(?:\\.|[^\]\\])*\]?|[^()]", re.DOTALL)


class PatternsOverBudget(PedelecError):
    """A :func:`charging_patterns` charge refused a pattern: the check stops, unfinished
    (not a ValueError: nothing says the schema is wrong)."""


# the charge of the check under way in this thread (or task), if its caller set one
_CHARGE: contextvars.ContextVar[Callable[[int], None] | None] = contextvars.ContextVar(
    "pedelec_pattern_charge", default=None)


@contextlib.contextmanager
def charging_patterns(charge: Callable[[int], None]) -> Iterator[None]:
    """While inside, each pattern not in :data:`PATTERN_CACHE` calls ``charge(its length)``
    before it is parsed; ``charge`` raises :class:`PatternsOverBudget` (or its own
    exception) to stop the check there."""
    token = _CHARGE.set(charge)
    try:
        yield
    finally:
        _CHARGE.reset(token)


class PatternCache:
    """The verdicts on the patterns checked lately (None: valid; else why not), the
    least recently used dropped first: at most ``entries``, their text at most
    ``max_bytes`` of memory (with the verdicts). Shared by Core's threads, hence the lock."""

    def __init__(self, entries: int, max_bytes: int) -> None:
        self.entries = entries
        self.max_bytes = max_bytes
        self._verdicts: OrderedDict[str, str | None] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, pattern: str) -> tuple[bool, str | None]:
        """``(known, verdict)``."""
        with self._lock:
            if pattern not in self._verdicts:
                return False, None
            self._verdicts.move_to_end(pattern)
            return True, self._verdicts[pattern]

    def put(self, pattern: str, verdict: str | None) -> None:
        with self._lock:
            if pattern in self._verdicts:
                return
            self._verdicts[pattern] = verdict
            self._bytes += _cost(pattern, verdict)
            while len(self._verdicts) > self.entries or self._bytes > self.max_bytes:
                self._bytes -= _cost(*self._verdicts.popitem(last=False))

    def clear(self) -> None:
        with self._lock:
            self._verdicts.clear()
            self._bytes = 0


def _cost(pattern: str, verdict: str | None) -> int:
    return sys.getsizeof(pattern) + (0 if verdict is None else sys.getsizeof(verdict))


#: every check's verdicts: 4096 patterns, 1 MiB of their text at most
PATTERN_CACHE = PatternCache(4096, 1024 * 1024)


def _check_regex(pattern: str, where: Where) -> None:
    """Parsed, never compiled (where this Python has :func:`_private_parser`): compiling
    a page's pattern is where re's cost explodes
    (``(?i)[\\u0100-\\uffff]`` takes ~10 ms per class) and Core never runs one. A pattern
    re can parse but not compile (a look-behind of varying width) fails when the page
    validates args with it, as a schema the validator cannot apply. Each distinct
    pattern is looked at once (:data:`PATTERN_CACHE`), and charged (:func:`charging_patterns`)
    before that."""
    if len(pattern) > MAX_PATTERN_LENGTH:
        raise SchemaError(f"{where}: the regular expression {quote(pattern)} has "
                          f"{len(pattern)} characters; the limit is {MAX_PATTERN_LENGTH}")
    known, verdict = PATTERN_CACHE.get(pattern)
    if not known:
        charge = _CHARGE.get()
        if charge is not None:
            charge(len(pattern))
        verdict = _regex_problem(pattern)
        PATTERN_CACHE.put(pattern, verdict)
    if verdict is not None:
        raise SchemaError(f"{where}: {verdict}")


def _regex_problem(pattern: str) -> str | None:
    """What is wrong with ``pattern`` (without where it is), or None. The parser recurses
    into groups: their nesting is bounded first."""
    parens = _NOT_A_GROUP.sub("", pattern)
    if max(itertools.accumulate(1 if p == "(" else -1 for p in parens), default=0) > (
            MAX_PATTERN_NESTING):
        return (f"the regular expression {quote(pattern)} nests "
                f"groups deeper than {MAX_PATTERN_NESTING}")
    try:
        _parse_pattern(pattern)
    except re.error as exc:
        return f"{quote(pattern)} is not a valid regular expression ({exc})"
    return None


def _is_int(value: Any) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool)) or (
        isinstance(value, float) and value.is_integer()
    )


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _kind(value: Any) -> str:
    return type(value).__name__


# --- validation --------------------------------------------------------------------------

ArgsValidator = Callable[[Any], list[dict[str, str]]]


def compile_validator(schema: dict[str, Any]) -> ArgsValidator:
    """A function returning the list of errors in ``args`` (empty when they are valid).

    Args that :func:`accepts` vouches for are valid at once (~1 µs for a few
    properties, against ~20-50 µs for jsonschema in the page); any other args, and every
    schema it cannot read, are jsonschema's to judge, so its verdict and its messages are
    the only ones ever given."""
    from jsonschema.validators import (  # type: ignore[import-untyped]
        Draft202012Validator,
        validator_for,
    )

    validator = validator_for(schema, default=Draft202012Validator)(schema)
    valid = accepts(schema)

    def errors(args: Any) -> list[dict[str, str]]:
        if valid is not None and valid(args):
            return []
        # jsonschema's messages quote the offending value: clipped, so that the error
        # result of a huge argument stays small (else its frame is over the limit)
        found = [
            {"path": excerpt(json_path(error.absolute_path)), "message": excerpt(error.message)}
            for error in itertools.islice(validator.iter_errors(args), MAX_ARGS_ERRORS)
        ]
        found.sort(key=lambda error: error["path"])
        return found

    return errors


MAX_ARGS_ERRORS = 20


# --- args that are certainly valid, without jsonschema ------------------------------------

Accepts = Callable[[Any], bool]

# Keywords that only annotate (jsonschema asserts none of them; ``format`` neither: its
# validators are built without a format checker).
_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$comment",
                          "deprecated", "readOnly", "writeOnly", "format"})
# The Python type of a JSON value of each type, exactly: a subclass, a tuple, a float
# that is an integer are left to jsonschema.
_EXACT_TYPES: dict[str, tuple[type, ...]] = {
    "null": (type(None),), "boolean": (bool,), "object": (dict,), "array": (list,),
    "number": (int, float), "string": (str,), "integer": (int,),
}
_JSON_TYPES = frozenset({dict, list, str, int, float, bool, type(None)})
_SCALARS = (str, int, bool, type(None))  # compared by type and value: as JSON compares them
_FAST_KEYWORDS = _ANNOTATIONS | {
    "type", "properties", "required", "additionalProperties", "items", "enum", "const",
    "anyOf", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength",
    "maxLength", "minItems", "maxItems",
}


def accepts(schema: Any) -> Accepts | None:
    """A check that is True only for values ``schema`` accepts, for schemas made of the
    common keywords (all those the typed form of ``define_tool`` derives, and a few more);
    None for any other schema (``$ref``, ``pattern``, ``$schema``, ...). It may be False
    for a valid value (a float for an integer, a tuple for an array): jsonschema judges
    those. Bounded by the schema: it never descends deeper than the schema does."""
    if schema is True:
        return lambda value: True
    if not isinstance(schema, dict) or not schema.keys() <= _FAST_KEYWORDS:
        return None
    # Only JSON's own types, exactly: jsonschema's is_type takes subclasses (a list
    # subclass is an array), which the checks below would pass over as "not applicable".
    checks: list[Accepts] = [lambda value: type(value) in _JSON_TYPES]
    kind = schema.get("type")
    if kind is not None:
        names = [kind] if isinstance(kind, str) else kind
        if not isinstance(names, list) or not all(n in _EXACT_TYPES for n in names):
            return None
        types = frozenset(t for n in names for t in _EXACT_TYPES[n])
        checks.append(lambda value: type(value) in types)
    for keyword in ("enum", "const"):
        if keyword in schema:
            allowed = schema[keyword] if keyword == "enum" else [schema[keyword]]
            if not isinstance(allowed, list):
                return None
            checks.append(_one_of(allowed))
    bounds = [(keyword, schema[keyword]) for keyword in _NUMBER_KEYWORDS if keyword in schema]
    if bounds:
        if not all(type(bound) in (int, float) for _, bound in bounds):
            return None
        checks.append(lambda value: type(value) not in (int, float) or _within(value, bounds))
    lengths = [(keyword, schema[keyword]) for keyword in ("minLength", "maxLength",
                                                          "minItems", "maxItems")
               if keyword in schema]
    if lengths:
        if not all(type(limit) is int for _, limit in lengths):
            return None
        checks.append(lambda value: _lengths_fit(value, lengths))
    if "anyOf" in schema:
        if not isinstance(schema["anyOf"], list):
            return None
        options = [accepts(option) for option in schema["anyOf"]]
        if not options or None in options:
            return None
        known = [option for option in options if option is not None]
        checks.append(lambda value: any(option(value) for option in known))
    if "items" in schema:
        each = accepts(schema["items"])
        if each is None:
            return None
        checks.append(lambda value: type(value) is not list or all(each(v) for v in value))
    object_check = _object_check(schema)
    if object_check is None:
        return None
    if object_check is not _NO_CHECK:
        checks.append(object_check)
    if len(checks) == 1:
        return checks[0]
    if len(checks) == 2:
        first, second = checks
        return lambda value: first(value) and second(value)
    return lambda value: all(check(value) for check in checks)


def _one_of(allowed: list[Any]) -> Accepts:
    """``enum``: the same type and value as one of ``allowed`` (JSON's equality, where
    ``true`` is not ``1``), for scalars; any other value is jsonschema's to compare."""
    scalars = frozenset((type(v), v) for v in allowed if type(v) in _SCALARS)
    return lambda value: type(value) in _SCALARS and (type(value), value) in scalars


def _no_check(value: Any) -> bool:
    return True


_NO_CHECK: Accepts = _no_check


def _object_check(schema: dict[str, Any]) -> Accepts | None:
    """``properties``, ``required``, ``additionalProperties``: on an object only."""
    properties = schema.get("properties", {})
    required = schema.get("required", [])
    extra = schema.get("additionalProperties", True)
    if not isinstance(properties, dict) or not isinstance(required, list) or not all(
            isinstance(name, str) for name in required):
        return None
    if not (properties or required or extra is not True):
        return _NO_CHECK
    known: dict[str, Accepts] = {}
    for name, subschema in properties.items():
        check = accepts(subschema)
        if check is None:
            return None
        known[name] = check
    other = None if extra is False else accepts(extra)
    if other is None and extra is not False:
        return None
    needed = tuple(required)

    def valid(value: Any) -> bool:
        if type(value) is not dict:
            return True  # these keywords apply to objects only
        for name in needed:
            if name not in value:
                return False
        for name, item in value.items():
            check = known.get(name)
            if check is None:
                if other is None or not other(item):
                    return False
            elif not check(item):
                return False
        return True

    return valid


def _within(value: float, bounds: list[tuple[str, Any]]) -> bool:
    for keyword, bound in bounds:
        if keyword == "minimum":
            ok = value >= bound
        elif keyword == "maximum":
            ok = value <= bound
        elif keyword == "exclusiveMinimum":
            ok = value > bound
        else:
            ok = value < bound
        if not ok:
            return False
    return True


def _lengths_fit(value: Any, lengths: list[tuple[str, int]]) -> bool:
    kind = type(value)
    for keyword, limit in lengths:
        if keyword.endswith("Length"):
            if kind is not str:
                continue
        elif kind is not list:
            continue
        if (len(value) < limit) if keyword.startswith("min") else (len(value) > limit):
            return False
    return True
