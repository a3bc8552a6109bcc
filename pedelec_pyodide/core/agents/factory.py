"""``make_agent``: an agent from its ``--agent`` spec."""

from __future__ import annotations

from ..clock import Clock
from .contract import Agent
from .offline import OfflineAgent

ACCEPTED_SPECS = "offline, openai:MODEL, anthropic:MODEL"
MODEL_PROVIDERS = {"openai": "gpt-4o-mini", "anthropic": "claude-sonnet-4-5"}  # → an example


def make_agent(spec: str, clock: Clock | None = None) -> Agent:
    """``offline`` → :class:`OfflineAgent`; ``openai:MODEL`` / ``anthropic:MODEL`` → a model
    adapter, waiting between retries on ``clock`` (Core's; the system's by default).
    Anything else raises ``ValueError`` listing the accepted forms."""
    kind, colon, model = spec.strip().partition(":")
    if kind == "offline" and not colon:
        return OfflineAgent()
    if kind in MODEL_PROVIDERS and colon:
        if not model.strip():
            raise ValueError(
                f"agent {spec!r} names no model: write {kind}:MODEL, "
                f"e.g. {kind}:{MODEL_PROVIDERS[kind]}"
            )
        return model_adapter(kind, model.strip(), clock)
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
