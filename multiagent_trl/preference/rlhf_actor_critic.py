"""Multi-agent RLHF with an actor-critic online stage, native: `ActorCriticRLHFConfig` / `ActorCriticRLHFTrainer`.

The same reward-model stage as `MultiAgentRLHFTrainer` (`RewardModelStage`: pairs of the team's joint samples ranked
by the task reward, or given `preference_pairs`; a `JointRewardModel` trained on them with the Bradley-Terry loss,
saved in every checkpoint and restored on resume), followed by `ActorCriticTrainer`'s online training on the reward
model's raw scores: a learned critic per agent (IAC, `joint_critic=False`) or one for the team (MAAC,
`joint_critic=True`) in place of GRPO's group baseline, so `num_generations=1` works. Evaluation scores the task
reward. The critics are saved beside the agents, the reward model in `reward_model/`.

```python
from multiagent_trl import ActorCriticRLHFConfig, ActorCriticRLHFTrainer

trainer = ActorCriticRLHFTrainer(
    model="Qwen/Qwen2.5-0.5B",
    reward_funcs=ratio_reward,  # the task reward: ranks the pairs, scores evaluation
    args=ActorCriticRLHFConfig(output_dir="out", num_agents=2, num_generations=1, joint_critic=True),
    train_dataset=dataset,
)
trainer.train()
```

CoMLRL's `MARLHFTrainer(rl_algorithm="iac"/"maac")` runs this composition (`RewardModelStage` on its IAC/MAAC
translation) through `multiagent_trl.comlrl`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..actor_critic.config import ActorCriticConfig
from ..actor_critic.trainer import ActorCriticTrainer
from .rlhf import RewardModelFields, RLHFTrainerBase


@dataclass
class ActorCriticRLHFConfig(RewardModelFields, ActorCriticConfig):
    r"""
    `ActorCriticConfig` (the online phase: critic fields, `TrainingArguments` and GRPO fields) with the reward-model
    stage's fields (`RewardModelFields`, as `MultiAgentRLHFConfig`'s).
    """


class ActorCriticRLHFTrainer(RLHFTrainerBase, ActorCriticTrainer):
    """Multi-agent RLHF trained online by `ActorCriticTrainer` (see the module docstring). Takes
    `MultiAgentRLHFTrainer`'s arguments (`reward_funcs` the task reward, `reward_model`, `preference_pairs`) and
    `ActorCriticTrainer`'s critic arguments (`critic_model`, `critic_processing_class`, `critic_peft_config`,
    `rollout_metrics`); `args` is an `ActorCriticRLHFConfig`."""

    config_class = ActorCriticRLHFConfig
    _tag_names = ["trl", "multiagent-trl", "actor-critic", "rlhf"]
    _name = "ActorCriticRLHF"


__all__ = ["ActorCriticRLHFConfig", "ActorCriticRLHFTrainer"]
