"""CoMLRL 1.4.3's names, arguments and defaults translated onto the native trainers, one module per CoMLRL family;
what they share is in `behaviour` (the trainers' CoMLRL entry points) and `fields` (the one table of CoMLRL's config
fields, which the configs check and `docs/comlrl-users.md` renders)."""

# ruff: noqa: F401  (the names are re-exported: `__all__` lists them)
from ..preference.reward_model import JointRewardModel
from ..rewards.centralized import (
    CentralizedComparatorAdapter,
    CentralizedComparatorParseError,
    TaggedCentralizedComparatorAdapter,
)
from .actor_critic import IACConfig, IACTrainer, MAACConfig, MAACTrainer
from .centralized import CentralizedMAGRPOConfig, CentralizedMAGRPOTrainer
from .iterative import MADPOIterConfig, MADPOIterTrainer
from .marlhf import MARLHFConfig, MARLHFTrainer
from .marlhf_iter import MARLHFIterConfig, MARLHFIterTrainer
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

__all__ = sorted(name for name in dir() if name[0].isupper())  # every class and table imported above
