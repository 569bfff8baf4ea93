"""The agents as one module: how they are loaded, placed, sharded, viewed one at a time and checkpointed."""

from .modules import AgentTeam, LoraAgentTeam
from .protocol import TeamTrainer

__all__ = ["AgentTeam", "LoraAgentTeam", "TeamTrainer"]
