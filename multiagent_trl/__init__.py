"""multiagent_trl: train N cooperating language-model agents with GRPO on one joint reward (MAGRPO), on TRL."""

from .actor_critic import ActorCriticConfig, ActorCriticTrainer
from .comlrl.actor_critic import IACConfig, IACTrainer, MAACConfig, MAACTrainer
from .comlrl.centralized import CentralizedMAGRPOConfig, CentralizedMAGRPOTrainer
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
from .config import MultiAgentGRPOConfig
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

__version__ = "0.1.0"

__all__ = [
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
    "MAACConfig",
    "MAACTrainer",
    "MAGRPOConfig",
    "MAGRPOTrainer",
    "MAREINFORCEConfig",
    "MAREINFORCETrainer",
    "MAReMaxConfig",
    "MAReMaxTrainer",
    "MARLOOConfig",
    "MARLOOTrainer",
    "MultiAgentGRPOConfig",
    "MultiAgentGRPOTrainer",
    "RewardProcessor",
    "RewardProcessors",
    "Sandbox",
    "TaggedCentralizedComparatorAdapter",
    "shared_environment",
]
