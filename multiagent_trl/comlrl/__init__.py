"""CoMLRL's names, arguments and defaults, translated onto the core trainers: the reinforce family (`reinforce`), the
actor-critic family (`actor_critic`) and MADPO (`preference`)."""

from .actor_critic import IACConfig, IACTrainer, MAACConfig, MAACTrainer
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
    "IACConfig",
    "IACTrainer",
    "MAACConfig",
    "MAACTrainer",
    "MADPOConfig",
    "MADPOTrainer",
    "MAGRPOConfig",
    "MAGRPOTrainer",
    "MAREINFORCEConfig",
    "MAREINFORCETrainer",
    "MAReMaxConfig",
    "MAReMaxTrainer",
    "MARLOOConfig",
    "MARLOOTrainer",
]
