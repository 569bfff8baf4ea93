"""CoMLRL's names, arguments and defaults, translated onto the core trainers: the reinforce family (`reinforce`),
the actor-critic family (`actor_critic`), centralized MAGRPO (`centralized`: one model writes every role), MADPO
(`preference`) and iterative MADPO (`iterative`)."""

from ..rewards.centralized import (
    CentralizedComparatorAdapter,
    CentralizedComparatorParseError,
    TaggedCentralizedComparatorAdapter,
)
from .actor_critic import IACConfig, IACTrainer, MAACConfig, MAACTrainer
from .centralized import CentralizedMAGRPOConfig, CentralizedMAGRPOTrainer
from .iterative import MADPOIterConfig, MADPOIterTrainer
from .preference import MADPOConfig, MADPOTrainer
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
    "MARLOOConfig",
    "MARLOOTrainer",
    "TaggedCentralizedComparatorAdapter",
]
