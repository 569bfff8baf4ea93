"""CoMLRL's names, arguments and defaults, translated onto the core trainers: the reinforce family (`reinforce`) and
the actor-critic family (`actor_critic`), and centralized MAGRPO (`centralized`: one model writes every role)."""

from ..rewards.centralized import (
    CentralizedComparatorAdapter,
    CentralizedComparatorParseError,
    TaggedCentralizedComparatorAdapter,
)
from .actor_critic import IACConfig, IACTrainer, MAACConfig, MAACTrainer
from .centralized import CentralizedMAGRPOConfig, CentralizedMAGRPOTrainer
from .reinforce import (
    COMLRL_TWINS,
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
    "COMLRL_TWINS",
    "CentralizedComparatorAdapter",
    "CentralizedComparatorParseError",
    "CentralizedMAGRPOConfig",
    "CentralizedMAGRPOTrainer",
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
    "TaggedCentralizedComparatorAdapter",
]
