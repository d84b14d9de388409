"""The host side of the device agent (docs/agent-protocol.md): its frames (``protocol``), the links that
carry them (``transport``: exec://, tcp://, adb://) and ``AgentRuntime``, a Runtime whose device is behind
the agent. ``open_agent(spec)`` connects; ``tuner.measure.open_runner`` measures through it."""

from .runtime import AgentRuntime
from .transport import AgentLinkError, is_agent_spec, parse_spec

__all__ = ["AgentRuntime", "AgentLinkError", "is_agent_spec", "parse_spec", "open_agent"]


def open_agent(spec: str, **kwargs) -> AgentRuntime:
    """Connect to the agent ``spec`` names and open its device."""
    return AgentRuntime(spec, **kwargs)
