"""`multiagent_trl.reward_models`, kept as an import path: reward models live in `multiagent_trl.rewards.models`."""

from .rewards.models import *  # noqa: F403
from .rewards.models import __all__  # noqa: F401
