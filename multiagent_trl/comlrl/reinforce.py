"""CoMLRL compatibility: its reinforce family (`MAGRPO`, `MAREINFORCE`, `MAReMax`, `MARLOO`) with CoMLRL 1.4.3's
names, arguments, defaults and checks, translated onto `MultiAgentGRPOConfig` and `MultiAgentGRPOTrainer`.

A script written for the reference library CoMLRL runs with only its import lines changed:

```diff
-from comlrl.utils.reward_processor import RewardProcessors
-from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
+from multiagent_trl import MAGRPOConfig, MAGRPOTrainer, RewardProcessors
```

Everything CoMLRL-specific lives here; the core (`config.py`, `trainer.py`) speaks TRL's names only. Where CoMLRL
needs something GRPO lacks, the core has it under a general name and this module maps onto it: `advantage_mode` ->
`advantage_baseline` (`advantages.py`), `parallel_training="mp"` + `agent_devices` -> `agent_devices`
(`placement.py`), `eval_logger`/`eval_aggregator` -> `trajectory_metrics` (`evaluation.py`), per-agent rewards and
CoMLRL's reward calling conventions (`rewards.py`). `docs/comlrl-users.md` lists every name in tables.
"""

from __future__ import annotations

import logging
import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..config import MultiAgentGRPOConfig
from ..rollout.evaluation import EvalTrajectories, turn_metrics
from ..trainer import MultiAgentGRPOTrainer
from .behaviour import CoMLRLBehaviour, agent_sources, apply_model_config, one_of
from .fields import (
    CoMLRLOptimization,  # noqa: F401 (the preference and marlhf ports import it from here)
    check_accelerate_device,
    check_fields,
    check_parallel,
    comlrl_batch_sizes,
    device_list,
    map_evaluation,
)

logger = logging.getLogger(__name__)
_one_of = one_of  # the name `marlhf` imports

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


@comlrl_batch_sizes
@dataclass
class MAGRPOConfig(MultiAgentGRPOConfig):
    r"""
    `MultiAgentGRPOConfig` that accepts every field of the reference library CoMLRL 1.4.3's `MAGRPOConfig`, with
    its defaults and its checks, so that a CoMLRL script runs with only its import lines changed. Each CoMLRL field
    maps onto a GRPO or team field (the table `fields.FAMILIES["MAGRPOConfig"]`, rendered with the notes in
    `docs/comlrl-users.md`); the GRPO names work too. Where a CoMLRL field is set it wins over its GRPO twin.

    CoMLRL's `train_batch_size` and `eval_batch_size` are stored as `comlrl_train_batch_size` and
    `comlrl_eval_batch_size` (reading the names gives Trainer's properties). `discount` is accepted and unused, as in
    CoMLRL 1.4.3 (kept in `comlrl_discount`). CoMLRL's defaults are kept where a field means the same here;
    `output_dir` defaults to `"magrpo_output"`, `save_strategy` to `"no"` (checkpoints come from
    `train(checkpoint_interval=..., checkpoint_dir=...)`), and `gradient_checkpointing` to `False`, as CoMLRL.
    """

    output_dir: str | None = field(default="magrpo_output", metadata={"help": "Where checkpoints and logs go."})
    save_strategy: str = field(default="no", metadata={"help": "Checkpoints (CoMLRL: asked for in train())."})
    gradient_checkpointing: bool = field(
        default=False, metadata={"help": "Recompute activations in the backward (CoMLRL: no; TRL's GRPO: yes)."}
    )
    num_agents: int | None = field(default=2, metadata={"help": "Number of agents."})
    num_train_epochs: float = field(default=20, metadata={"help": "Number of training epochs."})
    logging_steps: float = field(default=50, metadata={"help": "Log every this many steps."})
    num_generations: int | None = field(default=4, metadata={"help": "Completions per agent per prompt (G)."})
    temperature: float = field(default=0.6, metadata={"help": "Sampling temperature."})
    top_p: float = field(default=0.6, metadata={"help": "Nucleus sampling probability."})
    top_k: int | None = field(default=50, metadata={"help": "Top-k sampling; None or 0 disables it."})
    num_turns: int = field(default=2, metadata={"help": "Turns per episode (CoMLRL's default, 2)."})
    cross_credit: str = field(
        default="sum", metadata={"help": "joint_mode='cross': credit a completion with its tuples' 'sum' (CoMLRL)."}
    )

    agent_learning_rate: float | None = field(
        default=5e-6, metadata={"help": "Learning rate of every agent (CoMLRL name of `learning_rate`)."}
    )
    max_new_tokens: int | None = field(
        default=256, metadata={"help": "Maximum completion length (CoMLRL name of `max_completion_length`)."}
    )
    early_termination_threshold: float | None = field(
        default=-0.2, metadata={"help": "End a trajectory after a turn whose joint reward exceeds this (CoMLRL)."}
    )
    ended_return: str = field(
        default="reward",
        metadata={
            "help": "An ended node returns its 'reward' alone (CoMLRL's sum) or lets it 'stand' for the remaining "
            "turns.",
            "choices": ["stand", "reward"],
        },
    )
    advantage_normalization: bool = field(
        default=True, metadata={"help": "Scale advantages by the group std (maps to scale_rewards)."}
    )
    advantage_mode: str = field(
        default="mean",
        metadata={"help": "Advantage baseline: mean, raw, max or rloo.", "choices": list(ADVANTAGE_MODES)},
    )
    rollout_buffer_size: int = field(default=2, metadata={"help": "Prompts per generation batch."})
    train_batch_size: int | None = field(
        default=None, metadata={"help": "Prompts per optimizer step within a buffer; None: rollout_buffer_size."}
    )
    eval_interval: int = field(default=16, metadata={"help": "Evaluate every this many steps; 0 disables."})
    eval_num_samples: int = field(default=4, metadata={"help": "Rows evaluated each time (one trajectory each)."})
    eval_batch_size: int = field(default=1, metadata={"help": "Rows per evaluation batch."})
    reference_kl_enabled: bool = field(default=False, metadata={"help": "Penalize KL to the initial weights."})
    reference_kl_coef: float = field(default=0.1, metadata={"help": "KL coefficient when reference_kl_enabled."})
    parallel_training: str = field(
        default="none",
        metadata={"help": "'none' (Accelerate's placement) or 'mp' (each agent on its own device, one process)."},
    )
    agent_devices: list[str] | None = field(
        default=None, metadata={"help": "With parallel_training='mp': one device per agent, one for all, or 'auto'."}
    )
    reference_devices: list[str] | None = field(
        default=None, metadata={"help": "With reference_kl_enabled and 'mp': devices of the reference models."}
    )

    def __post_init__(self):
        check_fields(self, "MAGRPOConfig")
        check_parallel(self, "agent_devices")
        if self.reference_kl_enabled and self.reference_devices is not None:
            device_list(self.reference_devices, self.num_agents, "reference_devices")
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
        if self.agent_learning_rate is not None:
            self.learning_rate = self.agent_learning_rate
        if self.max_new_tokens is not None:
            self.max_completion_length = self.max_new_tokens
        if self.top_k is None:
            self.top_k = 0  # TRL's "no top-k filtering"
        self.advantage_baseline = ADVANTAGE_MODES[self.advantage_mode]
        self.scale_rewards = "group" if self.advantage_normalization else "none"
        # CoMLRL buffers rollout_buffer_size prompt groups, then takes optimizer steps of train_batch_size groups.
        per_step = min(self.comlrl_train_batch_size or self.rollout_buffer_size, self.rollout_buffer_size)
        if self.rollout_buffer_size % per_step != 0:
            raise ValueError(
                f"`rollout_buffer_size={self.rollout_buffer_size}` must be a multiple of `train_batch_size="
                f"{per_step}`: each buffer is split into equal optimizer steps here (TRL's steps_per_generation)."
            )
        self.per_device_train_batch_size = per_step * self.num_generations
        self.steps_per_generation = self.rollout_buffer_size // per_step
        self.generation_batch_size = None  # TRL derives it from the two above
        map_evaluation(self)
        if self.reference_kl_enabled:  # else `beta` keeps its value (GRPOConfig's 0.0 unless given, as TRL's name)
            self.beta = self.reference_kl_coef
        # Devices: "mp" is the core's per-agent placement (which checks them); "none" is Accelerate's, which CoMLRL's
        # devices may only confirm.
        specs = {"agent_devices": self.agent_devices, "reference_devices": self.reference_devices}
        if self.parallel_training == "mp":
            self.agent_devices = device_list(self.agent_devices, self.num_agents, "agent_devices")
            if self.reference_kl_enabled and self.reference_devices is not None:
                self.reference_devices = device_list(self.reference_devices, self.num_agents, "reference_devices")
            else:
                self.reference_devices = None
        else:
            self.agent_devices = self.reference_devices = None
        super().__post_init__()
        if self.parallel_training == "none":
            for name, spec in specs.items():
                check_accelerate_device(name, spec, self.device)


class MAGRPOTrainer(CoMLRLBehaviour, MultiAgentGRPOTrainer):
    """`MultiAgentGRPOTrainer` with every argument of CoMLRL 1.4.3's `MAGRPOTrainer`, in its order.

    Each CoMLRL argument maps onto the core (`docs/comlrl-users.md` lists them): `agent_model` + `num_agents` or
    `agents` -> `model`, `tokenizer` -> `processing_class`, `reward_func` -> `reward_funcs`, `model_config` -> how
    agents given by name are loaded, `wandb_config` -> `report_to="wandb"` and its settings, `eval_logger` +
    `eval_aggregator` -> `trajectory_metrics`. The TRL names (`model=`, `reward_funcs=`, `processing_class=`,
    `peft_config=`, `callbacks=`, ...) work too; passing both names of one argument is an error.

    Args:
        agent_model (`str`, *optional*):
            A model id or path: `num_agents` homogeneous agents, each its own copy.
        agents (list, *optional*):
            The agents' models or ids, one per agent.
        num_agents (`int`, *optional*, defaults to `2`):
            With `agent_model`: how many agents (with `agents`, their number).
        tokenizer (*optional*):
            One tokenizer for all agents, or one per agent; loaded from each agent's model when `None`.
        model_config (`dict`, *optional*):
            `torch_dtype` (or `dtype`, including `"auto"`) and `attn_implementation` (default `"sdpa"`) for the
            agents loaded by name, `model_kwargs` (more `from_pretrained` arguments), `special_tokens` (added to
            each tokenizer; each agent's embeddings are resized to match), `name` (informational).
        train_dataset, eval_dataset, reward_func, reward_processor, formatters, external_transition:
            As in CoMLRL: see `MultiAgentGRPOTrainer` (`reward_func` is its `reward_funcs`). As in CoMLRL, a
            trainer without `train_dataset` is built (to evaluate); `train()` then asks for one.
        wandb_config (`dict`, *optional*):
            `project`, `entity`, `name` (or `run_name`), `dir`, `tags`, `id`, `resume`, and `config_sections`
            (recorded in the run's config; `config_sections.output.verbose` sets `verbose`). Turns on
            `report_to="wandb"`.
        eval_logger, eval_aggregator (callables, *optional*):
            Called after every evaluation: `eval_logger(agent_completions_turns=..., batch_items=..., prompts=...)`
            returns one metrics dict per evaluated row, and `eval_aggregator(metrics, num_turns=...)` the metrics to
            log (under `eval_`). Both or neither.
        args (`MAGRPOConfig`, *optional*):
            Configuration; `None` uses the class's default config (`MAGRPOConfig()`, `MAREINFORCEConfig()`, ...).
        **kwargs:
            Every other `MultiAgentGRPOTrainer` argument.
    """

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
        args = args if args is not None else self.default_config_cls()
        model = agent_sources(agent_model, one_of("model", kwargs.pop("model", None), "agents", agents), num_agents)
        reward_funcs = one_of("reward_funcs", kwargs.pop("reward_funcs", None), "reward_func", reward_func)
        processing_class = one_of("processing_class", kwargs.pop("processing_class", None), "tokenizer", tokenizer)
        if model is None:
            raise ValueError("Pass the agents: `agent_model=` (with `num_agents=`) or `agents=[...]` (CoMLRL names).")
        if reward_funcs is None:
            raise ValueError("Pass a joint reward function: `reward_func=` (CoMLRL name) or `reward_funcs=`.")
        if (eval_logger is None) != (eval_aggregator is None):
            raise ValueError("`eval_logger` and `eval_aggregator` work together (CoMLRL calls both): pass both.")
        if isinstance(model, list) or (isinstance(model, str) and kwargs.get("peft_config") is None):
            args.num_agents = len(model) if isinstance(model, list) else num_agents
        elif isinstance(model, str):
            args.num_agents = num_agents  # one base, one adapter per agent
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
        aggregate of `eval_logger`'s per-row metrics."""
        metrics = turn_metrics(trajectories, self.args.num_turns)
        if self.eval_logger is not None and len(trajectories):
            per_row = self.eval_logger(
                agent_completions_turns=trajectories.completions,
                batch_items=trajectories.rows,
                prompts=[row.get("prompt", "") for row in trajectories.rows],
            )
            if not isinstance(per_row, (list, tuple)) or not all(isinstance(m, dict) for m in per_row):
                raise TypeError(
                    f"`eval_logger` returned {type(per_row).__name__}; it must return a list with one dict of metrics "
                    f"per evaluated row ({len(trajectories)} rows)."
                )
            aggregated = self.eval_aggregator(per_row, num_turns=self.args.num_turns)
            if not isinstance(aggregated, dict):
                raise TypeError(
                    f"`eval_aggregator` returned {type(aggregated).__name__}; it must return a dict of metric names "
                    "to numbers."
                )
            for key, value in aggregated.items():
                if isinstance(value, torch.Tensor):
                    value = value.item()
                if isinstance(value, numbers.Real) and math.isfinite(float(value)):
                    metrics[key] = float(value)
                else:
                    raise TypeError(f"`eval_aggregator` returned {key}={value!r}; metrics must be finite numbers.")
        return metrics


@dataclass
class MAREINFORCEConfig(MAGRPOConfig):
    """`MAGRPOConfig` for MAREINFORCE: no baseline (`advantage_mode="raw"`), CoMLRL's default."""

    advantage_mode: str = field(default="raw", metadata={"help": "Advantage baseline (MAREINFORCE: raw)."})


class MAREINFORCETrainer(MAGRPOTrainer):
    """Multi-agent REINFORCE: `MAGRPOTrainer` whose default config has no baseline (`advantage_mode="raw"`)."""

    default_config_cls = MAREINFORCEConfig
    algorithm_name = "MAREINFORCE"


@dataclass
class MAReMaxConfig(MAGRPOConfig):
    """`MAGRPOConfig` for MAReMax: the group's best return as baseline (`advantage_mode="max"`)."""

    advantage_mode: str = field(default="max", metadata={"help": "Advantage baseline (MAReMax: max)."})


class MAReMaxTrainer(MAGRPOTrainer):
    """Multi-agent ReMax: `MAGRPOTrainer` whose default config uses the group max as baseline."""

    default_config_cls = MAReMaxConfig
    algorithm_name = "MAReMax"


@dataclass
class MARLOOConfig(MAGRPOConfig):
    """`MAGRPOConfig` for MARLOO: the leave-one-out mean as baseline (`advantage_mode="rloo"`)."""

    advantage_mode: str = field(default="rloo", metadata={"help": "Advantage baseline (MARLOO: rloo)."})


class MARLOOTrainer(MAGRPOTrainer):
    """Multi-agent RLOO: `MAGRPOTrainer` whose default config uses the leave-one-out baseline."""

    default_config_cls = MARLOOConfig
    algorithm_name = "MARLOO"
