"""multiagent_trl: train N cooperating language-model agents with GRPO on one joint reward (MAGRPO), on TRL."""

import importlib
from typing import TYPE_CHECKING

from ._version import __version__ as __version__
from .actor_critic import ActorCriticConfig, ActorCriticTrainer
from .config import MultiAgentGRPOConfig
from .preference import (
    ActorCriticRLHFConfig,
    ActorCriticRLHFTrainer,
    MultiAgentDPOConfig,
    MultiAgentDPOTrainer,
    MultiAgentIterativeDPOConfig,
    MultiAgentIterativeDPOTrainer,
    MultiAgentIterativeRLHFConfig,
    MultiAgentIterativeRLHFTrainer,
    MultiAgentRLHFConfig,
    MultiAgentRLHFTrainer,
)

# CoMLRL's MARLHF reward model (a causal LM with a scalar head, trainable). The older sequence-classifier wrapper of
# the same name stays at `multiagent_trl.rewards.models.JointRewardModel` (it was never exported here).
from .preference.reward_model import JointRewardModel
from .rewards.centralized import (
    CentralizedComparatorAdapter,
    CentralizedComparatorParseError,
    TaggedCentralizedComparatorAdapter,
)
from .rewards.joint import RewardProcessor, RewardProcessors
from .rewards.sandbox import ExecutionResult, Sandbox
from .team.modules import AgentTeam
from .tools.environments import shared_environment
from .trainer import MultiAgentGRPOTrainer

# CoMLRL's names (the `comlrl` layer) by module, loaded when one is first used (`__getattr__` below): importing the
# package loads only the native trainers.
_COMLRL_MODULES = {
    "actor_critic": ("IACConfig", "IACTrainer", "MAACConfig", "MAACTrainer"),
    "centralized": ("CentralizedMAGRPOConfig", "CentralizedMAGRPOTrainer"),
    "iterative": ("MADPOIterConfig", "MADPOIterTrainer"),
    "marlhf": ("MARLHFConfig", "MARLHFTrainer"),
    "marlhf_iter": ("MARLHFIterConfig", "MARLHFIterTrainer"),
    "preference": ("MADPOConfig", "MADPOTrainer"),
    "reinforce": (
        "MAGRPOConfig",
        "MAGRPOTrainer",
        "MAREINFORCEConfig",
        "MAREINFORCETrainer",
        "MAReMaxConfig",
        "MAReMaxTrainer",
        "MARLOOConfig",
        "MARLOOTrainer",
    ),
}
_COMLRL_NAMES = {name: module for module, names in _COMLRL_MODULES.items() for name in names}

if TYPE_CHECKING:  # for type checkers and the API pages (griffe reads these); never run
    from .comlrl.actor_critic import IACConfig, IACTrainer, MAACConfig, MAACTrainer
    from .comlrl.centralized import CentralizedMAGRPOConfig, CentralizedMAGRPOTrainer
    from .comlrl.iterative import MADPOIterConfig, MADPOIterTrainer
    from .comlrl.marlhf import MARLHFConfig, MARLHFTrainer
    from .comlrl.marlhf_iter import MARLHFIterConfig, MARLHFIterTrainer
    from .comlrl.preference import MADPOConfig, MADPOTrainer
    from .comlrl.reinforce import (
        MAGRPOConfig,
        MAGRPOTrainer,
        MAREINFORCEConfig,
        MAREINFORCETrainer,
        MAReMaxConfig,
        MAReMaxTrainer,
        MARLOOConfig,
        MARLOOTrainer,
    )

__all__ = [
    "ActorCriticRLHFConfig",
    "ActorCriticRLHFTrainer",
    "ActorCriticConfig",
    "ActorCriticTrainer",
    "AgentTeam",
    "CentralizedComparatorAdapter",
    "CentralizedComparatorParseError",
    "CentralizedMAGRPOConfig",
    "CentralizedMAGRPOTrainer",
    "ExecutionResult",
    "IACConfig",
    "IACTrainer",
    "JointRewardModel",
    "MAACConfig",
    "MAACTrainer",
    "MADPOConfig",
    "MADPOIterConfig",
    "MADPOIterTrainer",
    "MADPOTrainer",
    "MAGRPOConfig",
    "MAGRPOTrainer",
    "MAREINFORCEConfig",
    "MAREINFORCETrainer",
    "MAReMaxConfig",
    "MAReMaxTrainer",
    "MARLHFConfig",
    "MARLHFIterConfig",
    "MARLHFIterTrainer",
    "MARLHFTrainer",
    "MARLOOConfig",
    "MARLOOTrainer",
    "MultiAgentDPOConfig",
    "MultiAgentDPOTrainer",
    "MultiAgentIterativeDPOConfig",
    "MultiAgentIterativeDPOTrainer",
    "MultiAgentIterativeRLHFConfig",
    "MultiAgentIterativeRLHFTrainer",
    "MultiAgentGRPOConfig",
    "MultiAgentGRPOTrainer",
    "MultiAgentRLHFConfig",
    "MultiAgentRLHFTrainer",
    "RewardProcessor",
    "RewardProcessors",
    "Sandbox",
    "TaggedCentralizedComparatorAdapter",
    "shared_environment",
]


def __getattr__(name: str):
    """A CoMLRL name, from its `comlrl` module, imported on first use (PEP 562) and then kept as a global; or the
    `comlrl` subpackage itself, which `import multiagent_trl` loaded before it was loaded on use."""
    if name == "comlrl":
        return importlib.import_module(f"{__name__}.comlrl")
    module = _COMLRL_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.comlrl.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
