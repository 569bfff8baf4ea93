"""`multiagent_trl.sandbox`, kept as an import path: the sandbox lives in `multiagent_trl.rewards.sandbox`."""

from .rewards.sandbox import *  # noqa: F403
from .rewards.sandbox import __all__  # noqa: F401
