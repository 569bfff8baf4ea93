"""How joint samples are scored and credited: reward functions and processors (`joint`), reward models (`models`),
advantage baselines (`advantages`), code rewards (`code`) and the sandbox they run in (`sandbox`).

`from multiagent_trl.rewards import RewardProcessors` (and the other names below) keeps working from before these
were split into modules."""

from .joint import RewardProcessor, RewardProcessors, bind_reward, reward_style

__all__ = ["RewardProcessor", "RewardProcessors", "bind_reward", "reward_style"]
