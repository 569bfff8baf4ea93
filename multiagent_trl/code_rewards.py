"""`multiagent_trl.code_rewards`, kept as an import path: code rewards live in `multiagent_trl.rewards.code`."""

from .rewards.code import *  # noqa: F403
from .rewards.code import __all__  # noqa: F401
