"""CoMLRL's names, arguments and defaults, translated onto the native trainers: the reinforce family (`reinforce`),
the actor-critic family (`actor_critic`), centralized MAGRPO (`centralized`: one model writes every role), MADPO
(`preference`), MARLHF (`marlhf`, with CoMLRL's `JointRewardModel`: `multiagent_trl.preference.reward_model`'s),
iterative MADPO (`iterative`) and iterative MARLHF (`marlhf_iter`). What they share is in two modules: `behaviour`
(the trainers' CoMLRL entry points: `train()`'s checkpoint arguments, `evaluate`, `log`, `verbose`, `wandb_config`,
the centralized setup) and `fields` (the one table of CoMLRL's config fields, their native counterparts and limits,
which the configs check and `docs/comlrl-users.md` renders)."""

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

__all__ = [
    "COMLRL_TWINS",
    "CentralizedComparatorAdapter",
    "CentralizedComparatorParseError",
    "CentralizedMAGRPOConfig",
    "CentralizedMAGRPOTrainer",
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
    "MARLOOConfig",
    "MARLHFConfig",
    "MARLHFIterConfig",
    "MARLHFIterTrainer",
    "MARLHFTrainer",
    "MARLOOTrainer",
    "TaggedCentralizedComparatorAdapter",
]
