"""``make_agent``: an agent from its ``--agent`` spec."""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..clock import Clock
from .contract import Agent
from .offline import OfflineAgent

ACCEPTED_SPECS = "offline, openai:MODEL, anthropic:MODEL, ag-ui:URL"
MODEL_PROVIDERS = {"openai": "gpt-4o-mini", "anthropic": "claude-sonnet-4-5"}  # → an example
#: seconds an AG-UI agent's events may be apart when no ``event_timeout`` is given (the
#: default ``--tool-timeout``)
DEFAULT_EVENT_TIMEOUT = 30.0
#: seconds an AG-UI agent's run may last when no ``run_limit`` is given (the default
#: ``--max-total-factor`` times that)
DEFAULT_RUN_LIMIT = 10 * DEFAULT_EVENT_TIMEOUT

# RFC 9110: a field name is a token; a value is visible ASCII, spaces and tabs
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_FIELD_VALUE = re.compile(r"[\x20-\x7e\t]*")
#: headers Core sets itself on every run (its body, its framing, the answer it takes): one
#: from --agent-header would be sent twice, or make the request another one than it is
CORE_HEADERS = frozenset({
    "accept", "accept-encoding", "connection", "content-encoding", "content-length",
    "content-type", "expect", "keep-alive", "te", "trailer", "transfer-encoding", "upgrade"})


def make_agent(spec: str, clock: Clock | None = None, *,
               headers: Sequence[tuple[str, str]] = (),
               event_timeout: float = DEFAULT_EVENT_TIMEOUT,
               run_limit: float = DEFAULT_RUN_LIMIT) -> Agent:
    """``offline`` → :class:`OfflineAgent`; ``openai:MODEL`` / ``anthropic:MODEL`` → a model
    adapter, waiting between retries on ``clock`` (Core's; the system's by default);
    ``ag-ui:URL`` → the AG-UI agent at URL, sent ``headers`` with every run, its events at
    most ``event_timeout`` seconds apart and its runs at most ``run_limit`` seconds long.
    Anything else raises ``ValueError`` listing the
    accepted forms."""
    kind, colon, rest = spec.strip().partition(":")
    if headers and kind != "ag-ui":
        raise ValueError("--agent-header is for an AG-UI agent (--agent ag-ui:URL) only")
    if kind == "offline" and not colon:
        return OfflineAgent()
    if kind in MODEL_PROVIDERS and colon:
        if not rest.strip():
            raise ValueError(
                f"agent {spec!r} names no model: write {kind}:MODEL, "
                f"e.g. {kind}:{MODEL_PROVIDERS[kind]}"
            )
        return model_adapter(kind, rest.strip(), clock)
    if kind == "ag-ui" and colon:
        from .ag_ui_agent import AgUiAgent  # ag-ui-protocol, only when asked for

        return AgUiAgent.from_spec(rest, headers, event_timeout, run_limit, clock=clock)
    raise ValueError(f"unknown agent {spec!r}: use one of {ACCEPTED_SPECS}")


def model_adapter(provider: str, model: str, clock: Clock | None = None) -> Agent:
    """The model adapter for ``provider`` (``openai`` or ``anthropic``), configured from the
    environment (keys, base URLs, ``PEDELEC_*`` limits: ``docs/how-to/models.md``). Raises
    :class:`AgentUnavailable` when its API key is missing, ``ValueError`` for a bad limit."""
    if provider == "openai":
        from .openai_agent import OpenAIAgent

        return OpenAIAgent.from_env(model, clock=clock)
    from .anthropic_agent import AnthropicAgent

    return AnthropicAgent.from_env(model, clock=clock)


def parse_header(text: str) -> tuple[str, str]:
    """``NAME: VALUE`` (``--agent-header``) as a pair. Raises ``ValueError`` naming only
    the header's name, never its value (an API key, often)."""
    name, colon, value = text.partition(":")
    name = name.strip()
    if not colon:
        raise ValueError("--agent-header: expected NAME: VALUE (there is no colon)")
    if not _TOKEN.fullmatch(name):  # not quoted: it may be the value, misspelt
        raise ValueError("--agent-header: expected NAME: VALUE, with NAME an HTTP header "
                         "name (letters, digits and !#$%&'*+-.^_`|~ only)")
    if name.lower() in CORE_HEADERS:
        raise ValueError(f"--agent-header {name}: Core sets this header itself")
    value = value.strip(" \t")
    if "\r" in value or "\n" in value:
        raise ValueError(f"--agent-header {name}: the value holds a line break (CR or LF)")
    if not _FIELD_VALUE.fullmatch(value):
        raise ValueError(f"--agent-header {name}: the value holds a character other than "
                         "visible ASCII, space and tab")
    return name, value
