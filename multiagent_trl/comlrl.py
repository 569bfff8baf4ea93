"""CoMLRL compatibility: its `MAGRPOConfig` and `MAGRPOTrainer` names, arguments and defaults, translated onto
[`MultiAgentGRPOConfig`] and [`MultiAgentGRPOTrainer`].

A script written for the reference library CoMLRL runs with only its import lines changed:

```diff
-from comlrl.utils.reward_processor import RewardProcessors
-from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
+from multiagent_trl import MAGRPOConfig, MAGRPOTrainer, RewardProcessors
```

Everything CoMLRL-specific lives here; the core (`config.py`, `trainer.py`) speaks TRL's names only.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .config import MultiAgentGRPOConfig
from .trainer import MultiAgentGRPOTrainer


@dataclass
class MAGRPOConfig(MultiAgentGRPOConfig):
    r"""
    [`MultiAgentGRPOConfig`] that also accepts the field names of the reference library CoMLRL's `MAGRPOConfig`, so
    that a CoMLRL script runs with only its import lines changed. Each CoMLRL field maps onto a GRPO field; the GRPO
    names work too. Where a CoMLRL field is set it wins over its GRPO twin.

    Parameters:
        agent_learning_rate (`float` or `None`, *optional*, defaults to `5e-6`):
            Learning rate of every agent; maps to `learning_rate`.
        max_new_tokens (`int` or `None`, *optional*, defaults to `256`):
            Maximum completion length; maps to `max_completion_length`.
        num_turns (`int`, *optional*, defaults to `1`):
            Turns per episode, as in [`MultiAgentGRPOConfig`] (CoMLRL defaults to 2; a one-turn default keeps a
            script without `external_transition` runnable). `discount` and `external_prompt_passthrough` are the same
            fields as there.
        early_termination_threshold (`float` or `None`, *optional*, defaults to `-0.2`):
            CoMLRL's default: a trajectory ends after a turn whose joint reward exceeds it (for rewards that are
            never negative, after the first turn). Set `None` to run every turn.
        advantage_normalization (`bool`, *optional*, defaults to `True`):
            Divide group-centered rewards by their group standard deviation; maps to `scale_rewards="group"`
            (`True`) or `"none"` (`False`).
        advantage_mode (`str`, *optional*, defaults to `"mean"`):
            Baseline of the advantage. Only `"mean"` (the GRPO group mean) is supported; `"raw"`, `"max"` and
            `"rloo"` raise `NotImplementedError`.
        rollout_buffer_size (`int`, *optional*, defaults to `2`):
            Prompts per optimizer step (CoMLRL updates after this many prompt groups). Maps to
            `per_device_train_batch_size = rollout_buffer_size * num_generations` (completions per device and step).
            CoMLRL's `train_batch_size` is not accepted: the name is a read-only property of `TrainingArguments`.
        eval_interval (`int`, *optional*, defaults to `0`):
            Evaluate every this many steps (maps to `eval_strategy="steps"`, `eval_steps`); `0` disables
            evaluation. (CoMLRL defaults to 16, which needs an `eval_dataset`.)
        reference_kl_enabled (`bool`, *optional*, defaults to `False`) and `reference_kl_coef` (`float`, defaults to
        `0.1`):
            KL penalty to each agent's initial weights; map to `beta = reference_kl_coef` when enabled, else 0.

    CoMLRL's defaults are kept where the field means the same here: `num_agents=2`, `num_generations=4`,
    `temperature=0.6`, `top_p=0.6`, `top_k=50`, `num_train_epochs=20`, `logging_steps=50`. `output_dir` defaults to
    `"magrpo_output"`.
    """

    output_dir: str | None = field(default="magrpo_output", metadata={"help": "Where checkpoints and logs go."})
    num_agents: int | None = field(default=2, metadata={"help": "Number of agents."})
    num_train_epochs: float = field(default=20, metadata={"help": "Number of training epochs."})
    logging_steps: float = field(default=50, metadata={"help": "Log every this many steps."})
    num_generations: int | None = field(default=4, metadata={"help": "Completions per agent per prompt (G)."})
    temperature: float = field(default=0.6, metadata={"help": "Sampling temperature."})
    top_p: float = field(default=0.6, metadata={"help": "Nucleus sampling probability."})
    top_k: int = field(default=50, metadata={"help": "Top-k sampling; 0 disables it."})

    agent_learning_rate: float | None = field(
        default=5e-6, metadata={"help": "Learning rate of every agent (CoMLRL name of `learning_rate`)."}
    )
    max_new_tokens: int | None = field(
        default=256, metadata={"help": "Maximum completion length (CoMLRL name of `max_completion_length`)."}
    )
    early_termination_threshold: float | None = field(
        default=-0.2, metadata={"help": "End a trajectory after a turn whose joint reward exceeds this (CoMLRL)."}
    )
    advantage_normalization: bool = field(
        default=True, metadata={"help": "Scale advantages by the group std (maps to scale_rewards)."}
    )
    advantage_mode: str = field(default="mean", metadata={"help": "Advantage baseline; only 'mean' is supported."})
    rollout_buffer_size: int = field(default=2, metadata={"help": "Prompts per optimizer step."})
    eval_interval: int = field(default=0, metadata={"help": "Evaluate every this many steps; 0 disables."})
    reference_kl_enabled: bool = field(default=False, metadata={"help": "Penalize KL to the initial weights."})
    reference_kl_coef: float = field(default=0.1, metadata={"help": "KL coefficient when reference_kl_enabled."})

    def __post_init__(self):
        if self.advantage_mode != "mean":
            raise NotImplementedError(
                f"`advantage_mode={self.advantage_mode!r}` is not supported; only 'mean' (the GRPO group baseline) "
                "is. Remove it or set `advantage_mode='mean'`."
            )
        if self.agent_learning_rate is not None:
            self.learning_rate = self.agent_learning_rate
        if self.max_new_tokens is not None:
            self.max_completion_length = self.max_new_tokens
        self.scale_rewards = "group" if self.advantage_normalization else "none"
        if self.rollout_buffer_size < 1:
            raise ValueError(f"`rollout_buffer_size` must be at least 1, got {self.rollout_buffer_size}.")
        self.per_device_train_batch_size = self.rollout_buffer_size * self.num_generations
        if self.eval_interval > 0:
            self.eval_strategy = "steps"
            self.eval_steps = self.eval_interval
            self.per_device_eval_batch_size = self.num_generations
        if self.reference_kl_enabled:
            self.beta = self.reference_kl_coef
        super().__post_init__()


class MAGRPOTrainer(MultiAgentGRPOTrainer):
    """[`MultiAgentGRPOTrainer`] with CoMLRL's argument names: `agents`, `reward_func`, `tokenizer`, `wandb_config`.

    Each CoMLRL name maps onto its TRL twin (`agents` -> `model`, `reward_func` -> `reward_funcs`, `tokenizer` ->
    `processing_class`); passing both names of one argument is an error. The TRL names work too, so a
    `MAGRPOTrainer` takes every `MultiAgentGRPOTrainer` argument.

    Args:
        agents (list, *optional*):
            The agents' models or ids (CoMLRL name of `model`).
        reward_func (callable, *optional*):
            The joint reward function (CoMLRL name of `reward_funcs`).
        tokenizer (*optional*):
            One tokenizer for all agents, or one per agent (CoMLRL name of `processing_class`).
        wandb_config (`dict`, *optional*):
            CoMLRL-style wandb settings (`project`, `entity`, `name`, `dir`, `tags`); turns on `report_to="wandb"`.
        **kwargs:
            Every [`MultiAgentGRPOTrainer`] argument (`args`, `train_dataset`, `formatters`, `reward_processor`,
            `external_transition`, ...).
    """

    def __init__(
        self,
        model: str | PreTrainedModel | Sequence[str | PreTrainedModel] | None = None,
        reward_funcs: Callable | Sequence[Callable] | None = None,
        args: MultiAgentGRPOConfig | None = None,
        *,
        agents: Sequence[str | PreTrainedModel] | None = None,
        reward_func: Callable | None = None,
        tokenizer: PreTrainedTokenizerBase | Sequence[PreTrainedTokenizerBase] | None = None,
        wandb_config: dict[str, Any] | None = None,
        **kwargs,
    ):
        model = _one_of("model", model, "agents", agents)
        reward_funcs = _one_of("reward_funcs", reward_funcs, "reward_func", reward_func)
        kwargs["processing_class"] = _one_of(
            "processing_class", kwargs.get("processing_class"), "tokenizer", tokenizer
        )
        if model is None:
            raise ValueError("Pass the agents: `agents=[...]` (CoMLRL name) or `model=` (an id, a path, or a list).")
        if reward_funcs is None:
            raise ValueError("Pass a joint reward function: `reward_func=` (CoMLRL name) or `reward_funcs=`.")
        if args is None:
            args = MAGRPOConfig()
        if wandb_config:
            _apply_wandb_config(args, wandb_config)
        super().__init__(model=model, reward_funcs=reward_funcs, args=args, **kwargs)


def _one_of(name: str, value, alias: str, alias_value):
    if value is not None and alias_value is not None:
        raise ValueError(f"Pass either `{name}` or its CoMLRL name `{alias}`, not both.")
    return value if value is not None else alias_value


def _apply_wandb_config(args: MultiAgentGRPOConfig, wandb_config: dict[str, Any]) -> None:
    for key, env in (("project", "WANDB_PROJECT"), ("entity", "WANDB_ENTITY"), ("dir", "WANDB_DIR")):
        if wandb_config.get(key):
            os.environ[env] = str(wandb_config[key])
    if wandb_config.get("tags"):
        os.environ["WANDB_TAGS"] = ",".join(wandb_config["tags"])
    if wandb_config.get("name"):
        args.run_name = wandb_config["name"]
    args.report_to = ["wandb"]
