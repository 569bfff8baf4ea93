"""CoMLRL 1.4.3's reinforce family (`MAGRPO`, `MAREINFORCE`, `MAReMax`, `MARLOO`) translated onto
`MultiAgentGRPOConfig`/`MultiAgentGRPOTrainer`; `docs/comlrl-users.md` maps every name."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..config import MultiAgentGRPOConfig
from ..rollout.evaluation import EvalTrajectories, role_trajectories, row_logger_metrics, turn_metrics
from ..team.placement import resolve_devices
from ..trainer import MultiAgentGRPOTrainer
from .behaviour import CoMLRLBehaviour, agent_sources, apply_model_config, one_of
from .fields import (
    CoMLRLShared,
    buffer_steps,
    check_fields,
    check_parallel,
    comlrl_config,
    confirm_devices,
    map_shared,
)

logger = logging.getLogger(__name__)

# CoMLRL's advantage_mode -> the core's advantage_baseline.
ADVANTAGE_MODES = {"mean": "mean", "raw": "none", "max": "max", "rloo": "leave_one_out"}
# GRPO fields that `MAGRPOConfig.__post_init__` sets from their CoMLRL twins (the CoMLRL value wins), by GRPO name: a
# command line that gives the GRPO name to MAGRPOConfig must learn that its value was replaced.
COMLRL_TWINS = {
    "learning_rate": "agent_learning_rate",
    "max_completion_length": "max_new_tokens",
    "scale_rewards": "advantage_normalization",
    "per_device_train_batch_size": "rollout_buffer_size",
    "steps_per_generation": "train_batch_size",
    "beta": "reference_kl_coef",
    "eval_strategy": "eval_interval",
    "eval_steps": "eval_interval",
    "eval_on_start": "eval_interval",
    "per_device_eval_batch_size": "eval_batch_size",
    "num_generations_eval": "eval_interval",
    "advantage_baseline": "advantage_mode",
}


@comlrl_config("MAGRPOConfig")
@dataclass
class MAGRPOConfig(CoMLRLShared, MultiAgentGRPOConfig):
    """`MultiAgentGRPOConfig` accepting every field of CoMLRL 1.4.3's `MAGRPOConfig`, with its defaults and checks
    (the table `fields.FAMILIES["MAGRPOConfig"]`, rendered in `docs/comlrl-users.md`); a CoMLRL field that is set
    wins over its GRPO twin."""

    output_dir: str | None = "magrpo_output"
    save_strategy: str = field(default="no", metadata={"help": "Checkpoints (CoMLRL: asked for in train())."})
    gradient_checkpointing: bool = field(default=False, metadata={"help": "Recompute activations (CoMLRL: no)."})
    num_train_epochs: float = 20
    logging_steps: float = 50
    num_generations: int | None = 4
    num_turns: int = 2
    cross_credit: str = field(default="sum", metadata={"help": "joint_mode='cross': credit by the tuples' 'sum'."})
    early_termination_threshold: float | None = -0.2
    discount: float = 1.0
    ended_return: str = field(
        default="reward",
        metadata={"help": "An ended node returns its reward alone (CoMLRL's sum).", "choices": ["stand", "reward"]},
    )
    advantage_normalization: bool = True
    advantage_mode: str = field(default="mean", metadata={"choices": list(ADVANTAGE_MODES)})
    reference_kl_enabled: bool = False
    reference_kl_coef: float = 0.1
    reference_devices: list[str] | None = None

    def __post_init__(self):
        check_fields(self, "MAGRPOConfig")
        check_parallel(self, "agent_devices")
        if self.reference_kl_enabled and self.reference_devices is not None:
            resolve_devices(self.reference_devices, self.num_agents, "reference_devices")
        if self.reference_devices is not None and self.parallel_training != "mp" and not self.reference_kl_enabled:
            raise ValueError("`reference_devices` places reference models: it needs `reference_kl_enabled=True`.")
        self.comlrl_discount = self.discount
        if self.discount != 1.0:
            logger.warning(
                "MAGRPOConfig: `discount=%s` is not used in training, as in CoMLRL 1.4.3 (its training return is the "
                "undiscounted reward sum); returns are undiscounted. For discounted returns use MultiAgentGRPOConfig.",
                self.discount,
            )
        self.discount = 1.0
        self.advantage_baseline = ADVANTAGE_MODES[self.advantage_mode]
        self.scale_rewards = "group" if self.advantage_normalization else "none"
        # CoMLRL buffers rollout_buffer_size prompt groups, then takes optimizer steps of train_batch_size groups.
        buffer, per_step = buffer_steps(self)
        self.per_device_train_batch_size = per_step * self.num_generations
        self.steps_per_generation = buffer // per_step
        self.generation_batch_size = None  # TRL derives it from the two above
        if self.reference_kl_enabled:  # else `beta` keeps its value (GRPOConfig's 0.0 unless given, as TRL's name)
            self.beta = self.reference_kl_coef
        references = self.num_agents if self.reference_kl_enabled and self.reference_devices is not None else 0
        given = map_shared(self, {"agent_devices": self.num_agents, "reference_devices": references})
        super().__post_init__()
        confirm_devices(self, given)


class MAGRPOTrainer(CoMLRLBehaviour, MultiAgentGRPOTrainer):
    """`MultiAgentGRPOTrainer` with every argument of CoMLRL 1.4.3's `MAGRPOTrainer`, in its order (the table
    "`MAGRPOTrainer` arguments" in `docs/comlrl-users.md`); the TRL names (`model=`, `reward_funcs=`,
    `processing_class=`, ...) work too, and passing both names of one argument raises. `args=None` uses the class's
    default config (`MAGRPOConfig()`, `MAREINFORCEConfig()`, ...)."""

    default_config_cls: type[MAGRPOConfig] = MAGRPOConfig
    algorithm_name = "MAGRPO"
    record_eval_trajectories = True
    rewards_per_sample = True  # CoMLRL calls its reward function once per joint sample and takes the first value
    # CoMLRL trains its last, partial buffer each epoch: here the last generation batch is completed with items from
    # the start of the epoch's order (`rollout.buffers`), so that every item is trained each epoch too.
    covers_every_item = True

    def __init__(
        self,
        agent_model: str | None = None,
        agents: Sequence[str | PreTrainedModel] | None = None,
        num_agents: int = 2,
        tokenizer: PreTrainedTokenizerBase | Sequence[PreTrainedTokenizerBase] | None = None,
        model_config: dict[str, Any] | None = None,
        train_dataset=None,
        eval_dataset=None,
        reward_func: Callable | None = None,
        reward_processor: Callable[[float], float] | None = None,
        formatters: Callable | Sequence[Callable] | None = None,
        external_transition: Callable | None = None,
        wandb_config: dict[str, Any] | None = None,
        eval_logger: Callable | None = None,
        eval_aggregator: Callable | None = None,
        args: MAGRPOConfig | None = None,
        **kwargs,
    ):
        args = self.comlrl_args(args)
        roles = dict(agents=agents, tokenizer=tokenizer, reward_func=reward_func, formatters=formatters)
        roles["num_agents"] = num_agents
        args = self.centralize(args, roles, kwargs)  # in centralized mode one model writes every role
        agents, tokenizer, reward_func, formatters, num_agents = roles.values()
        model = agent_sources(agent_model, one_of("model", kwargs.pop("model", None), "agents", agents), num_agents)
        reward_funcs = one_of("reward_funcs", kwargs.pop("reward_funcs", None), "reward_func", reward_func)
        processing_class = one_of("processing_class", kwargs.pop("processing_class", None), "tokenizer", tokenizer)
        if model is None:
            raise ValueError("Pass the agents: `agent_model=` (with `num_agents=`) or `agents=[...]` (CoMLRL names).")
        if reward_funcs is None:
            raise ValueError("Pass a joint reward function: `reward_func=` (CoMLRL name) or `reward_funcs=`.")
        if (eval_logger is None) != (eval_aggregator is None):
            raise ValueError("`eval_logger` and `eval_aggregator` work together (CoMLRL calls both): pass both.")
        if isinstance(model, (list, str)):  # a model id: `num_agents` copies, or one base with an adapter per agent
            args.num_agents = len(model) if isinstance(model, list) else num_agents
        model, processing_class = apply_model_config(model, processing_class, model_config, args, kwargs)
        self.eval_logger, self.eval_aggregator = eval_logger, eval_aggregator
        train_dataset = self.comlrl_setup(args, wandb_config, eval_dataset, train_dataset, kwargs)
        super().__init__(
            model=model,
            reward_funcs=reward_funcs,
            args=args,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            reward_processor=reward_processor,
            formatters=formatters,
            external_transition=external_transition,
            **kwargs,
        )
        self.model_name = model if isinstance(model, str) else getattr(self.model.config, "name_or_path", None)
        self.comlrl_finish()

    def trajectory_metrics(self, trajectories: EvalTrajectories) -> dict[str, float]:
        """CoMLRL's evaluation metrics: per turn the mean reward and the expected return, plus `eval_aggregator`'s
        aggregate of `eval_logger`'s per-row metrics; in centralized mode `eval_logger` gets the roles' outputs
        `[role][row][turn]` (the joint completions split by the adapter), as CoMLRL's."""
        if self.centralized_collaboration is not None:
            trajectories = role_trajectories(self.centralized_collaboration, trajectories)
        metrics = turn_metrics(trajectories, self.args.num_turns)
        if self.eval_logger is not None:
            metrics.update(
                row_logger_metrics(self.eval_logger, self.eval_aggregator, trajectories, self.args.num_turns)
            )
        return metrics


@dataclass
class MAREINFORCEConfig(MAGRPOConfig):
    """`MAGRPOConfig` for MAREINFORCE: no baseline (`advantage_mode="raw"`), CoMLRL's default."""

    advantage_mode: str = "raw"


class MAREINFORCETrainer(MAGRPOTrainer):
    """Multi-agent REINFORCE: `MAGRPOTrainer` whose default config has no baseline (`advantage_mode="raw"`)."""

    default_config_cls, algorithm_name = MAREINFORCEConfig, "MAREINFORCE"


@dataclass
class MAReMaxConfig(MAGRPOConfig):
    """`MAGRPOConfig` for MAReMax: the group's best return as baseline (`advantage_mode="max"`)."""

    advantage_mode: str = "max"


class MAReMaxTrainer(MAGRPOTrainer):
    """Multi-agent ReMax: `MAGRPOTrainer` whose default config uses the group max as baseline."""

    default_config_cls, algorithm_name = MAReMaxConfig, "MAReMax"


@dataclass
class MARLOOConfig(MAGRPOConfig):
    """`MAGRPOConfig` for MARLOO: the leave-one-out mean as baseline (`advantage_mode="rloo"`)."""

    advantage_mode: str = "rloo"


class MARLOOTrainer(MAGRPOTrainer):
    """Multi-agent RLOO: `MAGRPOTrainer` whose default config uses the leave-one-out baseline."""

    default_config_cls, algorithm_name = MARLOOConfig, "MARLOO"
