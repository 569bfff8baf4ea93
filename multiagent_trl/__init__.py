"""multiagent_trl: train N cooperating language-model agents with GRPO on one joint reward (MAGRPO), on TRL."""

from .actor_critic import ActorCriticConfig, ActorCriticTrainer
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
from .config import MultiAgentGRPOConfig
from .preference import MultiAgentDPOConfig, MultiAgentDPOTrainer

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
    "MultiAgentGRPOConfig",
    "MultiAgentGRPOTrainer",
    "RewardProcessor",
    "RewardProcessors",
    "Sandbox",
    "TaggedCentralizedComparatorAdapter",
    "shared_environment",
]
