"""The agents Core can run: the offline default, a scripted one for tests, and the factory
that turns an ``--agent`` spec into one (model adapters plug in there)."""

from .factory import make_agent
from .model import AgentUnavailable
from .offline import OfflineAgent
from .scripted import ScriptedAgent, Step

__all__ = ["AgentUnavailable", "OfflineAgent", "ScriptedAgent", "Step", "make_agent"]
