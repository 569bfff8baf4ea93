"""The actor-critic family (CoMLRL's IAC and MAAC): value models (`value_model`), the estimators of advantages, TD
targets and losses as pure functions on tensors (`estimators`), and `ActorCriticConfig`/`ActorCriticTrainer`, the team
trainer with a learned baseline."""

from .config import ActorCriticConfig
from .trainer import ActorCriticTrainer

__all__ = ["ActorCriticConfig", "ActorCriticTrainer"]
