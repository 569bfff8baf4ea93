"""The N agent policies as one `torch.nn.Module`.

The HF `Trainer`, Accelerate, DDP, FSDP and DeepSpeed each expect one model: one `prepare`, one optimizer, one
state dict. `AgentTeam` is that model. It holds the agents under `agents.0`, `agents.1`, ... and routes `forward`
and `generate` to the *active* agent, chosen with `team.use(i)`. Routing inside `forward` (rather than calling an
agent directly) keeps DDP's gradient hooks in the path when the team is wrapped.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import nn
from transformers import PreTrainedModel


class AgentTeam(nn.Module):
    """N causal language models trained together; `forward` and `generate` run the active agent.

    Args:
        agents: One model per agent. Different sizes and architectures are allowed.

    Example:
        >>> from transformers import AutoModelForCausalLM
        >>> from multiagent_trl.testing import tiny_model_path
        >>> team = AgentTeam([AutoModelForCausalLM.from_pretrained(tiny_model_path()) for _ in range(2)])
        >>> with team.use(1):
        ...     team.active
        1
    """

    def __init__(self, agents: Sequence[PreTrainedModel]):
        super().__init__()
        if len(agents) == 0:
            raise ValueError("AgentTeam needs at least one agent.")
        self.agents = nn.ModuleList(agents)
        self.active = 0

    def __len__(self) -> int:
        return len(self.agents)

    @contextmanager
    def use(self, index: int) -> Iterator[PreTrainedModel]:
        """Make agent `index` the one that `forward` and `generate` run, for the duration of the block."""
        if not 0 <= index < len(self.agents):
            raise IndexError(f"Agent index {index} is out of range for a team of {len(self.agents)} agents.")
        previous, self.active = self.active, index
        try:
            yield self.agents[index]
        finally:
            self.active = previous

    def agent_parameters(self, index: int) -> list[nn.Parameter]:
        """The trainable parameters of agent `index`."""
        return [p for p in self.agents[index].parameters() if p.requires_grad]

    def forward(self, *args, **kwargs):
        return self.agents[self.active](*args, **kwargs)

    @torch.no_grad()
    def generate(self, *args, **kwargs):
        return self.agents[self.active].generate(*args, **kwargs)

    # What Trainer and TRL read from "the model" is the active agent's.
    @property
    def config(self):
        return self.agents[self.active].config

    @property
    def generation_config(self):
        return self.agents[self.active].generation_config

    @generation_config.setter
    def generation_config(self, value):
        self.agents[self.active].generation_config = value

    @property
    def dtype(self) -> torch.dtype:
        return self.agents[self.active].dtype

    # Activation (gradient) checkpointing applies to every agent; transformers 5 calls the `activation_*` names,
    # TRL the `gradient_*` ones.
    @property
    def is_activation_checkpointing(self) -> bool:
        return any(getattr(agent, "is_activation_checkpointing", False) for agent in self.agents)

    is_gradient_checkpointing = is_activation_checkpointing

    def activation_checkpointing_enable(self, *args, **kwargs) -> None:
        for agent in self.agents:
            agent.activation_checkpointing_enable(*args, **kwargs)

    def activation_checkpointing_disable(self) -> None:
        for agent in self.agents:
            agent.activation_checkpointing_disable()

    def gradient_checkpointing_enable(self, *args, **kwargs) -> None:
        for agent in self.agents:
            agent.gradient_checkpointing_enable(*args, **kwargs)

    def gradient_checkpointing_disable(self) -> None:
        for agent in self.agents:
            agent.gradient_checkpointing_disable()

    def enable_input_require_grads(self) -> None:
        for agent in self.agents:
            agent.enable_input_require_grads()
