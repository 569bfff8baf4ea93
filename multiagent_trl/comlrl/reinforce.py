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
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from datasets import Dataset
from peft import PeftConfig
from transformers import PreTrainedModel, PreTrainedTokenizerBase, TrainerCallback, TrainingArguments
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_callback import PrinterCallback, ProgressCallback, TrainerState
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, SaveStrategy
from trl.trainer.utils import RepeatSampler

from ..config import MultiAgentGRPOConfig
from ..rollout.evaluation import EvalTrajectories, turn_metrics
from ..team.loading import load_agents, load_processing_classes
from ..team.views import swapped
from ..trainer import MultiAgentGRPOTrainer

logger = logging.getLogger(__name__)

# CoMLRL's advantage_mode -> the core's advantage_baseline.
ADVANTAGE_MODES = {"mean": "mean", "raw": "none", "max": "max", "rloo": "leave_one_out"}
PARALLEL_TRAINING = ("none", "mp")
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
MODEL_CONFIG_KEYS = ("torch_dtype", "dtype", "attn_implementation", "model_kwargs", "special_tokens", "name")
WANDB_CONFIG_KEYS = ("project", "entity", "name", "run_name", "dir", "tags", "config_sections", "id", "resume")


@dataclass
class MAGRPOConfig(MultiAgentGRPOConfig):
    r"""
    `MultiAgentGRPOConfig` that accepts every field of the reference library CoMLRL 1.4.3's `MAGRPOConfig`, with
    its defaults and its checks, so that a CoMLRL script runs with only its import lines changed. Each CoMLRL field
    maps onto a GRPO or team field; the GRPO names work too. Where a CoMLRL field is set it wins over its GRPO twin.

    Parameters:
        agent_learning_rate (`float` or `None`, *optional*, defaults to `5e-6`):
            Learning rate of every agent; maps to `learning_rate`.
        max_new_tokens (`int` or `None`, *optional*, defaults to `256`):
            Maximum completion length; maps to `max_completion_length`.
        num_turns (`int`, *optional*, defaults to `2`):
            Turns per episode (CoMLRL's default: a script that trains one turn says `num_turns=1`); more than one
            needs the trainer's `external_transition`. The rollout is CoMLRL's tree (`rollout="tree"`): every joint
            sample of a turn spawns a node of `num_generations` joint samples at the next; `joint_mode` and
            `external_prompt_passthrough` are the same fields as in `MultiAgentGRPOConfig`.
        discount (`float`, *optional*, defaults to `1.0`):
            Accepted as CoMLRL accepts it, and, as in CoMLRL 1.4.3, unused: training returns are undiscounted
            (`discount` is set to 1.0, and a value other than 1.0 is warned about once; the given value stays in
            `comlrl_discount`).
        early_termination_threshold (`float` or `None`, *optional*, defaults to `-0.2`):
            A node whose mean joint reward exceeds it has no children (CoMLRL's node-level termination). `None` runs
            every turn.
        ended_return (`str`, *optional*, defaults to `"reward"`):
            An ended node's samples return their reward alone, CoMLRL's sum of the rewards received (the core's
            default, `"stand"`, counts their last reward again for each remaining turn, so that finishing sooner is
            never worth less than finishing later).
        cross_credit (`str`, *optional*, defaults to `"sum"`):
            With `joint_mode="cross"`, a completion is credited with the sum of the returns of the tuples that hold
            it, as CoMLRL does (the core's default is the mean; the two differ without `advantage_normalization`).
        advantage_mode (`str`, *optional*, defaults to `"mean"`):
            Baseline of the advantage within a group, CoMLRL's names of `advantage_baseline`: `"mean"` (group mean,
            GRPO), `"raw"` (no baseline), `"max"` (group max), `"rloo"` (leave-one-out mean).
        advantage_normalization (`bool`, *optional*, defaults to `True`):
            Center the baselined advantages and divide them by their group standard deviation; maps to
            `scale_rewards="group"` (`True`) or `"none"` (`False`). As in CoMLRL, with normalization every
            `advantage_mode` gives the same (GRPO) advantages.
        rollout_buffer_size (`int`, *optional*, defaults to `2`):
            Prompts per generation batch. CoMLRL buffers this many *nodes* per agent and then takes one optimizer
            step per turn present in the buffer; with one turn a node is a prompt, so the step counts agree. With
            several turns a prompt's tree has `1 + G + ... + G**(T-1)` nodes (aligned), and CoMLRL takes about that
            many times more steps per prompt; here each generation batch's whole tree is split into
            `steps_per_generation` steps. For CoMLRL's number of updates, lower `rollout_buffer_size` (fewer prompts
            per step) or raise `num_train_epochs`. Every item is trained each epoch, as in CoMLRL, but where CoMLRL
            trains a smaller last buffer, here the epoch's last generation batch is completed with items from the
            start of the epoch (TRL's step machinery needs whole generation batches), which are then trained twice
            in that epoch; a buffer larger than the dataset holds every item, some more than once.
        train_batch_size (`int` or `None`, *optional*, defaults to `None`):
            Prompts per optimizer step within a buffer; `None` is `rollout_buffer_size` (one step per buffer).
            Maps to `per_device_train_batch_size = train_batch_size * num_generations` and `steps_per_generation =
            rollout_buffer_size / train_batch_size`. The name is also a read-only `TrainingArguments` property (the
            batch size Trainer loads); reading `config.train_batch_size` keeps giving Trainer's value, and CoMLRL's
            is `config.comlrl_train_batch_size`.
        eval_interval (`int`, *optional*, defaults to `16`):
            Evaluate every this many optimizer steps, and before training (maps to `eval_strategy="steps"`,
            `eval_steps`, `eval_on_start`); `0` disables evaluation, and so does a trainer without `eval_dataset`.
        eval_num_samples (`int`, *optional*, defaults to `4`):
            Rows of `eval_dataset` evaluated each time (the first ones), one trajectory per row through all turns.
        eval_batch_size (`int`, *optional*, defaults to `1`):
            Rows per evaluation batch; maps to `per_device_eval_batch_size` (with `num_generations_eval=1`). Like
            `train_batch_size`, reading it gives Trainer's property; CoMLRL's value is `config.comlrl_eval_batch_size`.
        reference_kl_enabled (`bool`, *optional*, defaults to `False`):
            KL penalty to each agent's initial weights; with `reference_kl_coef`, maps to `beta = reference_kl_coef`
            when enabled, else 0.
        reference_kl_coef (`float`, *optional*, defaults to `0.1`):
            The KL coefficient when `reference_kl_enabled` (see above).
        parallel_training (`str`, *optional*, defaults to `"none"`):
            `"none"`: Accelerate's placement (every agent on the process's device; data parallel across processes).
            `"mp"`: one process, each agent on its own device from `agent_devices` (required).
        agent_devices (`str`, `list[str]` or `None`, *optional*, defaults to `None`):
            With `"mp"`: one device per agent, one device for all, or `"auto"` (the visible GPUs in order, or the
            CPU). With `"none"` it may only name the device Accelerate uses anyway.
        reference_devices (`str`, `list[str]` or `None`, *optional*, defaults to `None`):
            With `reference_kl_enabled` and `"mp"`: the devices of the agents' reference models (default: the
            agents' own).

    CoMLRL's defaults are kept where the field means the same here: `num_agents=2`, `num_generations=4`,
    `temperature=0.6`, `top_p=0.6`, `top_k=50` (`None`: no top-k filtering), `num_train_epochs=20`,
    `logging_steps=50`. `output_dir` defaults to `"magrpo_output"`, and `save_strategy` to `"no"`: as in CoMLRL,
    checkpoints are written when `train(checkpoint_interval=..., checkpoint_dir=...)` asks for them.
    `gradient_checkpointing` defaults to `False` (TRL's `GRPOConfig`: `True`): CoMLRL keeps activations, and
    recomputing them costs each loss pass a second forward for the same gradients (`docs/benchmarks.md`).
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
        self._check_comlrl_fields()
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
        if self.eval_interval > 0:
            self.eval_strategy, self.eval_steps, self.eval_on_start = "steps", self.eval_interval, True
        self.per_device_eval_batch_size = self.comlrl_eval_batch_size
        self.num_generations_eval = 1  # one trajectory per evaluated row, as CoMLRL evaluates
        if self.reference_kl_enabled:  # else `beta` keeps its value (GRPOConfig's 0.0 unless given, as TRL's name)
            self.beta = self.reference_kl_coef
        # Devices: "mp" is the core's per-agent placement (which checks them); "none" is Accelerate's, which CoMLRL's
        # devices may only confirm.
        specs = {"agent_devices": self.agent_devices, "reference_devices": self.reference_devices}
        if self.parallel_training == "mp":
            self.agent_devices = _device_list(self.agent_devices, self.num_agents, "agent_devices")
            if self.reference_kl_enabled and self.reference_devices is not None:
                self.reference_devices = _device_list(self.reference_devices, self.num_agents, "reference_devices")
            else:
                self.reference_devices = None
        else:
            self.agent_devices = self.reference_devices = None
        super().__post_init__()
        if self.parallel_training == "none":
            for name, spec in specs.items():
                _check_accelerate_device(name, spec, self.device)

    def _check_comlrl_fields(self) -> None:
        """CoMLRL 1.4.3's own checks, with its limits, raised before anything is mapped."""
        for name, minimum in (
            ("num_train_epochs", 1),
            ("num_agents", 1),
            ("num_generations", 2),
            ("rollout_buffer_size", 1),
            ("eval_interval", 0),
            ("eval_num_samples", 0),
            ("comlrl_eval_batch_size", 1),
            ("num_turns", 1),
            ("logging_steps", 1),
            ("max_new_tokens", 1),
        ):
            value = getattr(self, name)
            if value is not None and value < minimum:
                shown = name.removeprefix("comlrl_")
                raise ValueError(f"`{shown}` must be at least {minimum}, got {value}.")
        if self.comlrl_train_batch_size is not None and self.comlrl_train_batch_size < 1:
            raise ValueError(f"`train_batch_size` must be at least 1 (or None), got {self.comlrl_train_batch_size}.")
        mode = str(self.advantage_mode).strip().lower()
        if mode not in ADVANTAGE_MODES:
            raise ValueError(f"`advantage_mode` must be one of {list(ADVANTAGE_MODES)}, got {self.advantage_mode!r}.")
        self.advantage_mode = mode
        parallel = str(self.parallel_training or "none").strip().lower()
        parallel = "none" if parallel == "null" else parallel
        if parallel not in PARALLEL_TRAINING:
            raise ValueError(f"`parallel_training` must be 'none' or 'mp', got {self.parallel_training!r}.")
        if parallel == "mp" and self.agent_devices is None:
            raise ValueError("`parallel_training='mp'` needs `agent_devices`: one device per agent (or 'auto').")
        self.parallel_training = parallel
        if self.reference_kl_coef < 0:
            raise ValueError(f"`reference_kl_coef` must be >= 0, got {self.reference_kl_coef}.")
        if self.reference_kl_enabled and self.reference_devices is not None:
            _device_list(self.reference_devices, self.num_agents, "reference_devices")
        if self.reference_devices is not None and parallel != "mp" and self.reference_kl_enabled is False:
            raise ValueError("`reference_devices` places reference models: it needs `reference_kl_enabled=True`.")


# CoMLRL's `train_batch_size` and `eval_batch_size` are dataclass fields here, but `TrainingArguments` reads the same
# names as properties (the batch sizes Trainer loads). The properties keep Trainer's meaning when read; assigning
# them (the dataclass `__init__` does) stores CoMLRL's value under `comlrl_<name>`.
def _comlrl_batch_size(name: str) -> property:
    trainer_property = getattr(TrainingArguments, name)

    def setter(self, value):
        self.__dict__[f"comlrl_{name}"] = value

    return property(trainer_property.fget, setter, doc=f"Trainer's {name}; CoMLRL's is `comlrl_{name}`.")


MAGRPOConfig.train_batch_size = _comlrl_batch_size("train_batch_size")
MAGRPOConfig.eval_batch_size = _comlrl_batch_size("eval_batch_size")


@dataclass
class CoMLRLOptimization:
    """The training settings of CoMLRL's actor-critic and preference trainers, as config fields with CoMLRL's values:
    torch's AdamW with weight decay 0.01 (on every parameter: `decay_every_parameter`), a constant learning rate, no
    gradient clipping, the dataset in order, activations kept, checkpoints only when `train()` asks for them. Listed
    before the core config among a config's bases, so that these defaults win."""

    save_strategy: str = field(default="no", metadata={"help": "Checkpoints (CoMLRL: asked for in train())."})
    gradient_checkpointing: bool = field(
        default=False, metadata={"help": "Recompute activations in the backward (CoMLRL: no)."}
    )
    optim: str = field(default="adamw_torch", metadata={"help": "Optimizer (CoMLRL: torch.optim.AdamW)."})
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay (torch's default, CoMLRL's)."})
    lr_scheduler_type: str = field(default="constant", metadata={"help": "Learning-rate schedule (CoMLRL: none)."})
    max_grad_norm: float = field(default=0.0, metadata={"help": "Gradient clipping; 0 disables it (CoMLRL: none)."})
    shuffle_dataset: bool = field(default=False, metadata={"help": "Shuffle the dataset (CoMLRL: dataset order)."})


def decay_every_parameter(trainer, model) -> list[str]:
    """`Trainer.get_decay_parameter_names` as CoMLRL's AdamW has it: every parameter decays (Trainer exempts biases
    and norms)."""
    return [name for name, _ in model.named_parameters()]


def _device_list(spec, num_agents: int, name: str) -> list[str]:
    """CoMLRL's device specification (one device, a list of one or `num_agents`, or `"auto"`) as one per agent."""
    if spec is None or (isinstance(spec, str) and spec.lower() == "auto"):
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            return ["cpu"] * num_agents
        return [f"cuda:{i}" for i in range(num_agents)] if count >= num_agents else ["cuda:0"] * num_agents
    if isinstance(spec, str):
        return [spec] * num_agents
    if isinstance(spec, Sequence) and len(spec) in (1, num_agents):
        return [str(s) for s in spec] * (num_agents if len(spec) == 1 else 1)
    raise ValueError(f"`{name}` must be one device, 'auto', or a list of 1 or {num_agents} devices; got {spec!r}.")


def _check_accelerate_device(name: str, spec, device: torch.device) -> None:
    if spec is None or (isinstance(spec, str) and spec.lower() == "auto"):
        return
    specs = [spec] if isinstance(spec, str) else list(spec)
    if any(torch.device(s) != device for s in specs):
        raise ValueError(
            f"`{name}={spec!r}` with `parallel_training='none'`: here Accelerate places every agent on the process's "
            f"device ({device}). Set `parallel_training='mp'` to put each agent on its own device, or choose the "
            "device with CUDA_VISIBLE_DEVICES / `accelerate launch`."
        )


class _CheckpointEveryEpochs(TrainerCallback):
    """CoMLRL's `train(checkpoint_interval=k)`: a checkpoint after every k-th epoch and after the last one."""

    def __init__(self, interval: int):
        self.interval = interval

    def on_epoch_end(self, args, state, control, **kwargs):
        epoch = round(state.epoch or 0)
        if epoch % self.interval == 0 or state.global_step >= state.max_steps:
            control.should_save = True
        return control


class _WandbSections(TrainerCallback):
    """Record CoMLRL's `wandb_config["config_sections"]` (and the CoMLRL run summary) in the wandb run's config."""

    def __init__(self, sections: dict[str, Any]):
        self.sections = sections

    def on_train_begin(self, args, state, control, **kwargs):
        import wandb  # only with report_to="wandb", which installs it

        if wandb.run is not None and state.is_world_process_zero:
            wandb.run.config.update(self.sections, allow_val_change=True)


class MAGRPOTrainer(MultiAgentGRPOTrainer):
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

    pending_checkpoint: str | None = None  # set by `load_checkpoint`: the next `train()` resumes from it

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
        model = _one_of("model", kwargs.pop("model", None), "agents", agents)
        model = _agent_sources(agent_model, model, num_agents)
        reward_funcs = _one_of("reward_funcs", kwargs.pop("reward_funcs", None), "reward_func", reward_func)
        processing_class = _one_of("processing_class", kwargs.pop("processing_class", None), "tokenizer", tokenizer)
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
        if eval_dataset is None:
            args.eval_strategy, args.eval_on_start = "no", False  # CoMLRL skips evaluation without a dataset
        model, processing_class = _apply_model_config(model, processing_class, model_config, args, kwargs)
        self.eval_logger, self.eval_aggregator = eval_logger, eval_aggregator
        self.wandb_config = wandb_config
        if wandb_config is not None:
            callback = _apply_wandb_config(args, wandb_config)
            if callback is not None:
                kwargs["callbacks"] = [*(kwargs.get("callbacks") or []), callback]
        train_dataset, stand_in = training_data(train_dataset)
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
        if stand_in:
            self.train_dataset = None
        self.model_name = model if isinstance(model, str) else getattr(self.model.config, "_name_or_path", None)
        sections = (wandb_config or {}).get("config_sections") or {}
        output = sections.get("output") if isinstance(sections, dict) else None
        if isinstance(output, dict) and "verbose" in output:
            self.verbose = bool(output["verbose"])

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        # CoMLRL's training name of a turn's mean reward, `turn_k/reward_mean`, beside TRL's `turn_k/reward` (in
        # evaluation, `trajectory_metrics` computes CoMLRL's per-trajectory values under that name).
        if self.model.training:
            metrics = self._metrics["train"]
            if self.args.num_turns == 1 and metrics.get("reward"):  # CoMLRL logs turn 1 of a one-turn episode too
                for key in ("turn_1/reward", "turn_1/expected_return"):  # one turn: its reward is the return
                    metrics[key] = list(metrics["reward"])
            for key in [k for k in metrics if k.startswith("turn_") and k.endswith("/reward")]:
                metrics[f"{key}_mean"] = list(metrics[key])
        super().log(logs, start_time)

    # ------------------------------------------------------------------ what CoMLRL scripts do after construction

    @property
    def verbose(self) -> bool:
        """Progress bars (`True`) or plain log lines (`False`); CoMLRL's `trainer.verbose`."""
        return not self.args.disable_tqdm

    @verbose.setter
    def verbose(self, value: bool) -> None:
        self.args.disable_tqdm = not value
        old, new = (PrinterCallback, ProgressCallback) if value else (ProgressCallback, PrinterCallback)
        self.remove_callback(old)
        if not any(isinstance(cb, new) for cb in self.callback_handler.callbacks):
            self.add_callback(new)

    def train(
        self,
        resume_from_checkpoint: str | bool | None = None,
        checkpoint_dir: str | None = None,
        checkpoint_interval: int = 1,
        checkpoint_total_limit: int | None = None,
        **kwargs,
    ):
        """Train, with CoMLRL's checkpoint arguments mapped onto Trainer's checkpoints.

        Args:
            resume_from_checkpoint: A `checkpoint-N` folder written by this trainer, or `True` for the latest one in
                `checkpoint_dir` (or `args.output_dir`). The run continues to `num_train_epochs` in total.
            checkpoint_dir: Where checkpoints go (`checkpoint_dir/checkpoint-N/`); sets `args.output_dir`.
            checkpoint_interval: A checkpoint after every this many epochs (and after the last epoch).
            checkpoint_total_limit: Keep at most this many checkpoints (Trainer's `save_total_limit`).
            **kwargs: `transformers.Trainer.train`'s own (`trial`, `ignore_keys_for_eval`).
        """
        if self.train_dataset is None:
            raise ValueError(
                "Training needs a `train_dataset`: this trainer was built without one (as CoMLRL allows, to "
                "evaluate). Pass `train_dataset=` to the trainer."
            )
        if (
            isinstance(checkpoint_interval, bool)
            or not isinstance(checkpoint_interval, numbers.Integral)
            or checkpoint_interval < 1
        ):
            raise ValueError(f"`checkpoint_interval` must be a positive integer (epochs); got {checkpoint_interval!r}")
        if checkpoint_total_limit is not None and (
            isinstance(checkpoint_total_limit, bool)
            or not isinstance(checkpoint_total_limit, numbers.Integral)
            or checkpoint_total_limit < 1
        ):
            raise ValueError(
                f"`checkpoint_total_limit` must be a positive integer or None, got {checkpoint_total_limit!r}."
            )
        unknown = set(kwargs) - {"trial", "ignore_keys_for_eval"}
        if unknown:
            raise TypeError(
                f"train() got {sorted(unknown)}: CoMLRL passed these to generation; here generation settings are "
                "config fields (`temperature`, `top_p`, `top_k`, `generation_kwargs={...}`)."
            )
        if checkpoint_dir is not None or checkpoint_interval != 1 or checkpoint_total_limit is not None:
            if checkpoint_dir is not None:
                self.args.output_dir = checkpoint_dir
            self.args.save_strategy = SaveStrategy.NO  # the callback decides, per epoch
            self.args.save_total_limit = checkpoint_total_limit
            self.callback_handler.callbacks = [
                cb for cb in self.callback_handler.callbacks if not isinstance(cb, _CheckpointEveryEpochs)
            ]
            self.add_callback(_CheckpointEveryEpochs(checkpoint_interval))
        if resume_from_checkpoint is None:  # `load_checkpoint` asked for this one
            resume_from_checkpoint, self.pending_checkpoint = self.pending_checkpoint, None
        return super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)

    def save_checkpoint(self, output_dir: str) -> str:
        """CoMLRL's snapshot between training runs: the team (and critics), the optimizer and scheduler once training
        has built them, the RNG states and the trainer state, in Trainer's checkpoint format, written under another
        name and renamed when complete. `load_checkpoint(output_dir)` or `train(resume_from_checkpoint=output_dir)`
        continue from it. Refuses to replace a folder that is not a checkpoint, as CoMLRL does. Returns the folder."""
        target = os.path.abspath(os.path.expanduser(output_dir))
        if os.path.islink(target) or (
            os.path.exists(target) and not os.path.isfile(os.path.join(target, TRAINER_STATE_NAME))
        ):
            raise FileExistsError(f"Refusing to replace a folder that is not a checkpoint: {target}")
        parent = os.path.dirname(target)
        os.makedirs(parent, exist_ok=True)
        staging = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}-", dir=parent)
        try:
            # Trainer's own checkpoint (`checkpoint-N/` under the staging folder); weights only before training.
            with swapped(self.args, output_dir=staging, save_only_model=self.optimizer is None, save_total_limit=None):
                self._save_checkpoint(self.model, trial=None)
            written = os.path.join(staging, f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
            if os.path.exists(target):
                shutil.rmtree(target)
            os.replace(written, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return target

    def load_checkpoint(self, checkpoint: str) -> dict[str, float]:
        """Load what `save_checkpoint` (or a `checkpoint-N/` of `train`) wrote: the weights now, and the optimizer,
        scheduler and loop position when `train()` next runs (as `train(resume_from_checkpoint=checkpoint)`).
        Returns the saved progress, `{"global_step", "epoch"}`."""
        state_file = os.path.join(checkpoint, TRAINER_STATE_NAME)
        if not os.path.isfile(state_file):
            raise FileNotFoundError(f"{checkpoint} is not a checkpoint: it has no {TRAINER_STATE_NAME}.")
        self._load_from_checkpoint(checkpoint)
        self.pending_checkpoint = checkpoint
        state = TrainerState.load_from_json(state_file)
        return {"global_step": state.global_step, "epoch": state.epoch}

    def evaluate(self, num_eval_samples: int | None = None, eval_dataset=None, ignore_keys=None, **kwargs):
        """Evaluate `num_eval_samples` rows (default `args.eval_num_samples`; the first rows of the evaluation
        dataset), one trajectory each through all turns, as CoMLRL does. Returns the metrics, keyed `eval_...`:
        TRL's, `eval_turn_k/reward_mean`, `eval_turn_k/expected_return` and what `eval_aggregator` returned; `{}`
        without an evaluation dataset."""
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if dataset is None:
            return {}
        count = self.args.eval_num_samples if num_eval_samples is None else int(num_eval_samples)
        if hasattr(dataset, "select"):  # CoMLRL evaluates at least one row
            dataset = dataset.select(range(min(max(count, 1), len(dataset))))
        return super().evaluate(eval_dataset=dataset, ignore_keys=ignore_keys, **kwargs)

    def _get_eval_sampler(self, eval_dataset):
        return dataset_order_sampler(eval_dataset, self.num_generations_eval)

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


# ---------------------------------------------------------------------------------------------------- helpers


def dataset_order_sampler(eval_dataset, num_generations: int) -> RepeatSampler:
    """CoMLRL's evaluation order: the rows in dataset order (its logger's lists follow it), each `num_generations`
    times; TRL's sampler shuffles them."""
    return RepeatSampler(eval_dataset, mini_repeat_count=num_generations, shuffle=False)


def training_data(train_dataset):
    """`(dataset, stand_in)`: `train_dataset`, or an empty stand-in when there is none. CoMLRL builds a trainer without
    training data (to evaluate, or in its own tests) and asks for the data only when training; TRL's GRPOTrainer
    refuses one at construction, so the stand-in serves until the trainer resets `train_dataset` to `None`."""
    if train_dataset is not None:
        return train_dataset, False
    return Dataset.from_dict({"prompt": []}), True


def _one_of(name: str, value, alias: str, alias_value):
    if value is not None and alias_value is not None:
        raise ValueError(f"Pass either `{name}` or its CoMLRL name `{alias}`, not both.")
    return value if value is not None else alias_value


def _agent_sources(agent_model, agents, num_agents: int):
    """CoMLRL's `agent_model` / `agents` / `num_agents`, as the core's `model`."""
    if agent_model is None:
        return list(agents) if isinstance(agents, (list, tuple)) else agents
    if not isinstance(agent_model, (str, os.PathLike)):
        raise ValueError("`agent_model` must be a model id or path (N homogeneous agents); pass models as `agents=`.")
    if num_agents < 1:
        raise ValueError(f"`num_agents` must be at least 1, got {num_agents}.")
    if agents is None:
        return str(agent_model)
    if not isinstance(agents, (list, tuple)) or len(agents) != num_agents:
        raise ValueError(f"`agents` must be a list of `num_agents` ({num_agents}) models when `agent_model` is given.")
    if any(a != agent_model for a in agents):
        raise ValueError(f"`agent_model` and `agents` conflict: {agent_model!r} != {list(agents)!r}; pass one.")
    return list(agents)


def _apply_model_config(model, processing_class, model_config, args: MAGRPOConfig, kwargs: dict):
    """CoMLRL's `model_config`: loading kwargs for agents given by name, and special tokens for every tokenizer
    (with each agent's embeddings resized to its tokenizer)."""
    config = dict(model_config or {})
    unknown = set(config) - set(MODEL_CONFIG_KEYS)
    if unknown:
        raise ValueError(
            f"`model_config` has {sorted(unknown)}, which no step here reads. Accepted: {list(MODEL_CONFIG_KEYS)}; "
            "put other `from_pretrained` arguments under `model_config['model_kwargs']`."
        )
    init_kwargs = dict(args.model_init_kwargs or {})
    nested = config.get("model_kwargs") or {}
    if not isinstance(nested, dict):
        raise ValueError(f"`model_config['model_kwargs']` must be a dict, got {type(nested).__name__}.")
    init_kwargs.update({k: v for k, v in nested.items() if k not in ("torch_dtype", "dtype")})
    dtype = nested.get("torch_dtype") or nested.get("dtype") or config.get("torch_dtype") or config.get("dtype")
    if dtype is not None:
        init_kwargs["dtype"] = dtype
    if "attn_implementation" in config:
        init_kwargs.setdefault("attn_implementation", config["attn_implementation"])
    args.model_init_kwargs = init_kwargs or None
    special_tokens = config.get("special_tokens") or {}
    if not special_tokens:
        return model, processing_class
    # Special tokens change the vocabulary: load the agents and tokenizers here, add the tokens, resize embeddings.
    shared_base = isinstance(kwargs.get("peft_config"), PeftConfig) and isinstance(model, (str, os.PathLike))
    models = load_agents(model, args, kwargs.get("quantization_config"), copies=not shared_base)
    tokenizers = load_processing_classes(processing_class, models, args)
    for tok in {id(t): t for t in tokenizers}.values():
        tok.add_special_tokens(special_tokens)
    for agent, tok in zip(models, tokenizers, strict=True):
        if agent.get_input_embeddings().num_embeddings < len(tok):
            agent.resize_token_embeddings(len(tok))
    if shared_base:
        return models[0], tokenizers[0]
    return models, tokenizers if len({id(t) for t in tokenizers}) > 1 else tokenizers[0]


def _apply_wandb_config(args: MAGRPOConfig, wandb_config: dict[str, Any]) -> TrainerCallback | None:
    """CoMLRL's `wandb_config` onto `report_to="wandb"` and wandb's environment variables; a callback that records
    `config_sections` in the run's config."""
    if not isinstance(wandb_config, dict):
        raise TypeError(f"`wandb_config` must be a dict, got {type(wandb_config).__name__}.")
    unknown = set(wandb_config) - set(WANDB_CONFIG_KEYS)
    if unknown:
        raise ValueError(f"`wandb_config` has {sorted(unknown)}; accepted keys: {list(WANDB_CONFIG_KEYS)}.")
    env = {"project": "WANDB_PROJECT", "entity": "WANDB_ENTITY", "dir": "WANDB_DIR", "id": "WANDB_RUN_ID"}
    for key, name in env.items():
        if wandb_config.get(key):
            os.environ[name] = str(wandb_config[key])
    if wandb_config.get("dir"):
        os.makedirs(wandb_config["dir"], exist_ok=True)
    if wandb_config.get("resume"):
        os.environ["WANDB_RESUME"] = "allow" if wandb_config["resume"] is True else str(wandb_config["resume"])
    if wandb_config.get("tags"):
        os.environ["WANDB_TAGS"] = ",".join(wandb_config["tags"])
    name = wandb_config.get("name") or wandb_config.get("run_name")
    if name:
        args.run_name = name
    args.report_to = ["wandb"]
    sections = wandb_config.get("config_sections")
    if sections is None:
        return None
    if not isinstance(sections, dict):
        raise TypeError(f"`wandb_config['config_sections']` must be a dict, got {type(sections).__name__}.")
    return _WandbSections(dict(sections))
