"""CoMLRL compatibility for the actor-critic family: `IACConfig`/`IACTrainer` and `MAACConfig`/`MAACTrainer` with
CoMLRL 1.4.3's names, arguments, defaults and checks, translated onto `ActorCriticConfig` and `ActorCriticTrainer`.

A CoMLRL actor-critic script runs with only its import line changed:

```diff
-from comlrl.trainers.actor_critic import IACConfig, IACTrainer
+from multiagent_trl import IACConfig, IACTrainer
```

Every CoMLRL field is mapped onto the core, or raises naming itself where the core has no counterpart yet. CoMLRL's
numbers are kept where they are the algorithm: the actor's log-probabilities at temperature 1 whatever the sampling
temperature, one policy-gradient pass per buffer with no importance ratio (TRL's `loss_type="luspo"` at ratio 1 has
exactly that gradient), AdamW with weight decay 0.01 on every parameter, a constant learning rate, no gradient
clipping, the reward called once per dataset item with lists of `num_generations` completions, advantages
standardized over each agent's buffer, the value loss `value_loss_coef * mean((y - v)^2)`.

CoMLRL quirks deliberately not replicated: a buffer holds whole prompts (`rollout_buffer_size` must be a multiple of
`num_generations`; CoMLRL overfills it); the epoch's last buffer is as large as the others, completed with items
from the start of the epoch, which train twice in that epoch (CoMLRL trains a smaller last buffer; either way every
item trains each epoch, and a buffer larger than the dataset trains); the end-of-sequence token is always scored
(CoMLRL skips it when the padding token is the end token);
a `TypeError` raised inside the reward function propagates (CoMLRL retries the call once);
MAAC's critic takes one optimizer step per buffer on the mean of the agents' value losses (CoMLRL steps it once per
agent); a multi-turn buffer trains all its turns in one optimizer step (CoMLRL steps once per turn: the same targets
and advantages); `top_k=None` means no top-k filtering (CoMLRL leaves the model's generation config's);
`eval_interval` and `logging_steps` count optimizer steps (CoMLRL counts items and environment steps).
"""

from __future__ import annotations

import inspect
import math
import numbers
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase
from transformers.trainer_utils import SaveStrategy

from ..actor_critic.config import ActorCriticConfig, check_hidden_dim
from ..actor_critic.trainer import ActorCriticTrainer
from ..actor_critic.value_model import VALUE_HEAD_FILE, CausalLMWithValueHead, model_config_of
from ..rewards.joint import bind_reward, comlrl_arguments, comlrl_passing, tensor_values
from ..rollout.turns import Transition
from .reinforce import (
    PARALLEL_TRAINING,
    CoMLRLOptimization,
    MAGRPOTrainer,
    _agent_sources,
    _apply_model_config,
    _apply_wandb_config,
    _check_accelerate_device,
    _CheckpointEveryEpochs,
    _comlrl_batch_size,
    _device_list,
    dataset_order_sampler,
    decay_every_parameter,
    training_data,
)

# `model_config` keys the actor-critic trainers read beside MAGRPO's.
CRITIC_MODEL_CONFIG_KEYS = ("critic_model_kwargs", "critic_value_head_hidden_dim")


@dataclass
class _ActorCriticFields(CoMLRLOptimization, ActorCriticConfig):
    """The fields IAC and MAAC share, with CoMLRL 1.4.3's defaults, and their mapping onto the core."""

    output_dir: str | None = field(default="ac_output", metadata={"help": "Where checkpoints and logs go."})
    loss_type: str = field(
        default="luspo", metadata={"help": "TRL loss; 'luspo' at ratio 1 is CoMLRL's mean(-logp * A) gradient."}
    )
    disable_dropout: bool = field(default=True, metadata={"help": "No dropout (CoMLRL's models stay in eval mode)."})

    agent_learning_rate: float = field(default=5e-6, metadata={"help": "Learning rate of every agent."})
    critic_learning_rate: float | None = field(
        default=5e-6, metadata={"help": "Learning rate of the critics; None: agent_learning_rate."}
    )
    rollout_buffer_size: int = field(
        default=8, metadata={"help": "Samples per agent collected before an update (a multiple of num_generations)."}
    )
    train_batch_size: int | None = field(
        default=None, metadata={"help": "Samples per optimizer step within a buffer; None: rollout_buffer_size."}
    )
    value_loss_coef: float = field(default=0.6, metadata={"help": "Weight of the value loss."})
    advantage_normalization: bool = field(
        default=True, metadata={"help": "Standardize each agent's advantages over its buffer."}
    )
    max_new_tokens: int = field(default=256, metadata={"help": "Maximum completion length."})
    temperature: float = field(default=0.6, metadata={"help": "Sampling temperature."})
    top_p: float = field(default=0.6, metadata={"help": "Nucleus sampling probability."})
    top_k: int | None = field(default=None, metadata={"help": "Top-k sampling; None or 0 disables it."})
    num_train_epochs: float = field(default=40, metadata={"help": "Number of training epochs."})
    critic_type: str = field(default="v", metadata={"help": "'v' (V(prompt)) or 'q' (Q(prompt, completion))."})
    num_agents: int | None = field(default=2, metadata={"help": "Number of agents."})
    num_turns: int = field(default=2, metadata={"help": "Turns per episode (CoMLRL's default, 2)."})
    parallel_training: str = field(
        default="none", metadata={"help": "'none' (Accelerate's placement) or 'mp' (a device per agent)."}
    )
    agent_devices: list[str] | None = field(
        default=None, metadata={"help": "With parallel_training='mp': one device per agent, one for all, or 'auto'."}
    )
    critic_devices: list[str] | None = field(
        default=None, metadata={"help": "With parallel_training='mp': the critics' devices."}
    )
    discount: float = field(default=1.0, metadata={"help": "Discount of the bootstrap value (multi-turn)."})
    num_generations: int | None = field(default=1, metadata={"help": "Completions per agent per prompt."})
    eval_interval: int = field(default=16, metadata={"help": "Evaluate every this many steps; 0 disables."})
    eval_num_samples: int = field(default=4, metadata={"help": "Rows evaluated each time."})
    eval_batch_size: int = field(default=1, metadata={"help": "Rows per evaluation batch."})
    early_termination_threshold: float | None = field(
        default=-0.2, metadata={"help": "End an episode after a turn whose mean reward exceeds this (multi-turn)."}
    )
    logging_steps: float = field(default=1, metadata={"help": "Log every this many steps."})
    ended_return: str = field(
        default="reward", metadata={"help": "An episode's last turn is terminal: its target is its reward (CoMLRL)."}
    )
    reference_kl_enabled: bool = field(
        default=False, metadata={"help": "CoMLRL's KL reward shaping (not supported: use beta)."}
    )
    reference_kl_coef: float = field(default=0.1, metadata={"help": "KL coefficient of the reward shaping."})
    reference_devices: list[str] | None = field(
        default=None, metadata={"help": "Devices of the reference models (with reference_kl_enabled)."}
    )

    def __post_init__(self):
        self._check_comlrl_fields()
        self.learning_rate = self.agent_learning_rate
        if self.critic_learning_rate is None:
            self.critic_learning_rate = self.agent_learning_rate
        self.max_completion_length = self.max_new_tokens
        if self.top_k is None:
            self.top_k = 0  # TRL's "no top-k filtering"
        # A buffer is one generation batch per agent: `rollout_buffer_size` rows, split into optimizer steps of
        # `train_batch_size` rows (per_device_train_batch_size x steps_per_generation).
        if self.rollout_buffer_size % self.num_generations != 0:
            raise ValueError(
                f"`rollout_buffer_size={self.rollout_buffer_size}` must be a multiple of `num_generations="
                f"{self.num_generations}`: here a buffer holds every completion of its prompts (CoMLRL overfills it)."
            )
        buffer = self.rollout_buffer_size
        per_step = min(self.comlrl_train_batch_size or buffer, buffer)
        if buffer % per_step != 0:
            raise ValueError(
                f"`rollout_buffer_size={buffer}` must be a multiple of `train_batch_size="
                f"{per_step}`: each buffer is split into equal optimizer steps here (TRL's steps_per_generation)."
            )
        if self.num_turns > 1:  # CoMLRL's buffer counts every turn's sample: it holds buffer / num_turns episodes
            buffer, per_step = max(buffer // self.num_turns, 1), max(per_step // self.num_turns, 1)
            if buffer % per_step != 0:
                raise ValueError(
                    f"With `num_turns={self.num_turns}` a buffer holds {buffer} episode(s) "
                    f"(`rollout_buffer_size // num_turns`) and a step {per_step} (`train_batch_size // num_turns`): "
                    "make the first a multiple of the second."
                )
        self.per_device_train_batch_size = per_step
        self.steps_per_generation = buffer // per_step
        self.generation_batch_size = None  # TRL derives it from the two above
        if self.eval_interval > 0:
            self.eval_strategy, self.eval_steps, self.eval_on_start = "steps", self.eval_interval, True
        self.per_device_eval_batch_size = self.comlrl_eval_batch_size
        self.num_generations_eval = 1  # CoMLRL evaluates one completion per prompt
        specs = {"agent_devices": self.agent_devices, "critic_devices": self.critic_devices}
        if self.parallel_training == "mp":
            self.agent_devices = _device_list(self.agent_devices, self.num_agents, "agent_devices")
            count = self.num_agents if self._separate_critics() else 1
            self.critic_devices = _device_list(self.critic_devices or self.agent_devices, count, "critic_devices")
        else:
            self.agent_devices = self.critic_devices = None
        self.reference_devices = None  # only read with reference_kl_enabled, which raises
        super().__post_init__()
        if self.parallel_training == "none":
            for name, spec in specs.items():
                _check_accelerate_device(name, spec, self.device)

    def _separate_critics(self) -> bool:
        return not self.joint_critic

    def _check_comlrl_fields(self) -> None:
        """CoMLRL 1.4.3's own checks of the actor-critic configs, raised before anything is mapped."""
        for name, minimum in (
            ("rollout_buffer_size", 1),
            ("num_agents", 1),
            ("num_turns", 1),
            ("num_generations", 1),
            ("eval_interval", 0),
            ("eval_num_samples", 0),
            ("comlrl_eval_batch_size", 1),
            ("logging_steps", 1),
        ):
            value = getattr(self, name)
            if value is not None and value < minimum:
                raise ValueError(f"`{name.removeprefix('comlrl_')}` must be at least {minimum}, got {value}.")
        if self.comlrl_train_batch_size is not None and self.comlrl_train_batch_size < 1:
            raise ValueError(f"`train_batch_size` must be at least 1 (or None), got {self.comlrl_train_batch_size}.")
        if self.num_turns > 1 and self.num_generations != 1:
            raise ValueError(
                f"Multi-turn actor-critic continues one completion per prompt: set `num_generations=1` (got "
                f"{self.num_generations}) with `num_turns={self.num_turns}`."
            )
        parallel = str(self.parallel_training or "none").strip().lower()
        parallel = "none" if parallel == "null" else parallel
        if parallel not in PARALLEL_TRAINING:
            raise ValueError(f"`parallel_training` must be 'none' or 'mp', got {self.parallel_training!r}.")
        if parallel == "mp" and self.agent_devices is None:
            raise ValueError("`parallel_training='mp'` needs `agent_devices`: one device per agent (or 'auto').")
        if parallel == "mp" and self._separate_critics() and self.critic_devices is None:
            raise ValueError("`parallel_training='mp'` needs `critic_devices` too: one device per critic (or 'auto').")
        self.parallel_training = parallel
        if self.reference_kl_coef < 0:
            raise ValueError(f"`reference_kl_coef` must be >= 0, got {self.reference_kl_coef}.")
        if self.reference_kl_enabled:
            raise NotImplementedError(
                "`reference_kl_enabled=True` (CoMLRL's reward shaping by the KL to the initial policy) is not "
                "supported here. Use `beta=<coefficient>` for TRL's KL penalty in the loss instead, or leave it off."
            )


_ActorCriticFields.train_batch_size = _comlrl_batch_size("train_batch_size")
_ActorCriticFields.eval_batch_size = _comlrl_batch_size("eval_batch_size")


@dataclass
class IACConfig(_ActorCriticFields):
    r"""
    `ActorCriticConfig` accepting every field of CoMLRL 1.4.3's `IACConfig`, with its defaults and checks.

    Parameters:
        agent_learning_rate (`float`, *optional*, defaults to `5e-6`): maps to `learning_rate`.
        critic_learning_rate (`float` or `None`, *optional*, defaults to `5e-6`): the critics'; `None`: the agents'.
        rollout_buffer_size (`int`, *optional*, defaults to `8`):
            Samples per agent per update: one generation batch of `rollout_buffer_size / num_generations` prompts
            (it must be a multiple of `num_generations`).
        train_batch_size (`int` or `None`, *optional*, defaults to `None`):
            Samples per optimizer step (`per_device_train_batch_size`); `None`: one step per buffer. Reading
            `config.train_batch_size` gives Trainer's property; CoMLRL's value is `config.comlrl_train_batch_size`.
        value_clip_range (`float` or `None`, *optional*, defaults to `0.2`):
            Clips the value loss of a value head on the agent (`use_separate_critic=False`) only, as CoMLRL; the
            given value stays in `comlrl_value_clip_range`.
        value_loss_coef, advantage_normalization, critic_type (defaults `0.6`, `True`, `"v"`):
            As in `ActorCriticConfig`.
        max_new_tokens (`int`, *optional*, defaults to `256`): maps to `max_completion_length`.
        temperature, top_p, top_k (defaults `0.6`, `0.6`, `None`): sampling (`top_k=None`: no top-k filtering).
        num_train_epochs (defaults to `40`), num_agents (`2`), num_generations (`1`), logging_steps (`1`): as named.
        use_separate_critic (`bool`, *optional*, defaults to `True`):
            `True`: a critic model per agent (`critic_kind="model"`); `False`: a value head on each agent
            (`critic_kind="head"`).
        critic_value_head_hidden_dim, value_head_hidden_dim (`int` or `None`, defaults to `None`):
            Hidden width of the separate critics' heads, and of the heads on the agents.
        num_turns, discount, early_termination_threshold, external_prompt_passthrough (`2`, `1.0`, `-0.2`, `False`):
            Multi-turn episodes with TD targets (the trainer needs `external_transition`); a buffer then holds
            `rollout_buffer_size // num_turns` episodes (CoMLRL's buffer counts every turn's sample).
        parallel_training (`"none"`), agent_devices, critic_devices (`None`):
            `"mp"` puts each agent (`agent_devices`) and each critic (`critic_devices`) on its own device.
        eval_interval (`16`), eval_num_samples (`4`), eval_batch_size (`1`):
            Evaluate every `eval_interval` optimizer steps and before training, on the first `eval_num_samples`
            rows, one completion each.
        reference_kl_enabled (`False`), reference_kl_coef (`0.1`), reference_devices (`None`):
            CoMLRL's KL reward shaping: enabling it raises (use `beta` for TRL's KL in the loss).

    Settings kept from CoMLRL for its numbers: `optim="adamw_torch"`, `weight_decay=0.01` (on every parameter),
    `lr_scheduler_type="constant"`, `max_grad_norm=0.0` (no clipping), `loss_type="luspo"`, `shuffle_dataset=False`,
    `gradient_checkpointing=False`, `disable_dropout=True`; any TRL field may be set as well.
    """

    output_dir: str | None = field(default="iac_output", metadata={"help": "Where checkpoints and logs go."})
    value_clip_range: float | None = field(
        default=0.2, metadata={"help": "Clip the value loss of a value head on the agent (CoMLRL: only there)."}
    )
    use_separate_critic: bool = field(
        default=True, metadata={"help": "A critic model per agent (True) or a value head on each agent (False)."}
    )
    critic_value_head_hidden_dim: int | None = field(
        default=None, metadata={"help": "Hidden width of the separate critics' value heads."}
    )
    value_head_hidden_dim: int | None = field(
        default=None, metadata={"help": "Hidden width of the value heads on the agents (use_separate_critic=False)."}
    )

    def __post_init__(self):
        self.comlrl_value_clip_range = self.value_clip_range
        self.comlrl_critic_value_head_hidden_dim = self.critic_value_head_hidden_dim
        check_hidden_dim(self.value_head_hidden_dim, "value_head_hidden_dim")  # before it is mapped onto the critic's
        if self.use_separate_critic:
            self.critic_kind = "model"
            self.value_clip_range = None  # CoMLRL clips the value loss of a head on the agent only
        else:
            self.critic_kind = "head"
            self.critic_value_head_hidden_dim = self.value_head_hidden_dim
            # CoMLRL's agent optimizer holds the head on the agent: it trains at the agent's learning rate.
            self.critic_learning_rate = self.agent_learning_rate
        super().__post_init__()

    def _separate_critics(self) -> bool:
        return bool(self.use_separate_critic)


@dataclass
class MAACConfig(_ActorCriticFields):
    r"""
    `ActorCriticConfig` accepting every field of CoMLRL 1.4.3's `MAACConfig`: one joint critic for the team
    (`joint_critic=True`), with CoMLRL's defaults and checks. The fields are `IACConfig`'s without
    `use_separate_critic`, `value_clip_range`, `critic_value_head_hidden_dim` and `value_head_hidden_dim` (the joint
    critic's head width comes from the trainer's `model_config["critic_value_head_hidden_dim"]`, as in CoMLRL); its
    critic reads every agent's prompt (and completion, for `critic_type="q"`) as text tokenized with agent 0's
    tokenizer. `parallel_training="mp"` takes one critic device (`critic_devices`).
    """

    output_dir: str | None = field(default="maac_output", metadata={"help": "Where checkpoints and logs go."})
    critic_learning_rate: float = field(default=5e-6, metadata={"help": "Learning rate of the joint critic."})
    joint_critic: bool = field(default=True, metadata={"help": "One critic for the team (MAAC: always)."})

    def __post_init__(self):
        if not self.joint_critic:
            raise ValueError("MAACConfig trains one joint critic: `joint_critic` must stay True (use IACConfig).")
        super().__post_init__()


# ---------------------------------------------------------------------------------------------------- rollouts


@dataclass
class RolloutSample:
    """One agent's completion as CoMLRL's `metrics_callback` receives it (CoMLRL's attribute names).

    `metadata` holds `turn_idx`, `generation_idx` and `batch_item` (the dataset row). Tensors are 1-D and on the CPU.
    """

    agent_idx: int
    prompt: Any
    completion: Any
    full_input_ids: torch.Tensor
    attention_mask: torch.Tensor
    prompt_len: int
    response_len: int
    old_logprob: torch.Tensor
    old_value: torch.Tensor
    reward: torch.Tensor
    returns: torch.Tensor
    advantage: torch.Tensor
    normalized_advantage: torch.Tensor | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


def item_reward(
    func: Callable,
    processor: Callable[[float], float] | None,
    num_agents: int,
    num_generations: int,
) -> Callable:
    """CoMLRL's actor-critic reward calling, as a reward function for the core: `func` is called once per dataset
    item and turn, with one list of the item's `num_generations` completions per agent (and `prompts`, the agents'
    prompts of that turn, and `batch_items=[item]` where it takes them), as CoMLRL 1.4.3's IAC and MAAC call it.

    What `func` returns, after `processor` is applied to each value: one value (every agent, every completion),
    `num_generations` values (one per joint sample, shared by the agents), or `num_agents` values (one per agent,
    shared by the completions; read per joint sample when `num_agents == num_generations`, as CoMLRL reads it).
    """
    name = getattr(func, "__name__", type(func).__name__)
    passing, keywords = comlrl_passing(func, num_agents)  # the core's reading of CoMLRL's conventions

    def reward(prompts, completions, batch_items=None, **kwargs):  # the core's TRL convention: joint samples
        per_agent = [list(c) for c in zip(*completions)] if num_agents > 1 else [list(completions)]  # (N, samples)
        samples = len(per_agent[0])
        if samples % num_generations:
            raise RuntimeError(f"{samples} joint samples do not split into items of {num_generations}.")
        values: list[list[float]] = []  # per item: N lists of G
        for start in range(0, samples, num_generations):
            turn_prompts = list(prompts[start]) if num_agents > 1 else [prompts[start]]
            lists = [c[start : start + num_generations] for c in per_agent]
            args, kw = comlrl_arguments(passing, keywords, turn_prompts, lists, [batch_items[start]])
            raw = _as_floats(func(*args, **kw), name)
            if processor is not None:
                raw = [float(processor(r)) for r in raw]
            values.append(_expand(raw, num_agents, num_generations, name))
        if num_agents > 1 and any(not _shared(v) for v in values):  # some item scored the agents apart
            return [[v[i][g] for i in range(num_agents)] for v in values for g in range(num_generations)]
        return [v[0][g] for v in values for g in range(num_generations)]

    reward.__name__ = name
    return reward


def _shared(per_agent: list[list[float]]) -> bool:
    return all(values == per_agent[0] for values in per_agent)


def _expand(values: list[float], num_agents: int, num_generations: int, name: str) -> list[list[float]]:
    """One item's rewards as `[agent][generation]`, by CoMLRL's length rules (per generation before per agent)."""
    if len(values) == 1:
        return [values * num_generations for _ in range(num_agents)]
    if len(values) == num_generations:
        return [list(values) for _ in range(num_agents)]
    if len(values) == num_agents:
        return [[v] * num_generations for v in values]
    raise ValueError(
        f"Reward function '{name}' returned {len(values)} values for one item: return 1 value, num_generations "
        f"({num_generations}) values, or num_agents ({num_agents}) values."
    )


def _as_floats(values, name: str) -> list[float]:
    if isinstance(values, torch.Tensor):
        values = tensor_values(values.reshape(-1), name)
    elif isinstance(values, numbers.Real):
        values = [values]
    out = []
    for value in list(values):
        if isinstance(value, torch.Tensor):
            value = value.item()
        if not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
            raise ValueError(f"Reward function '{name}' returned {value!r}; rewards must be finite numbers.")
        out.append(float(value))
    return out


def _listed(formatters, num_agents: int) -> list[Callable]:
    listed = list(formatters) if isinstance(formatters, (list, tuple)) else [formatters] * num_agents
    if len(listed) != num_agents:
        raise ValueError(f"{len(listed)} formatters were given for {num_agents} agents: one for all, or one each.")
    return listed


def _takes_external(formatter: Callable) -> bool:
    try:
        return "external_prompts" in inspect.signature(formatter).parameters
    except (TypeError, ValueError):
        return False


def _comlrl_formatters(formatters, num_agents: int) -> list[Callable] | None:
    """CoMLRL's actor-critic formatters: one for all or one per agent; one that takes `external_prompts` is called
    `f(item, external_prompts=None)` on the first turn."""
    if formatters is None:
        return None
    listed = _listed(formatters, num_agents)

    def first_turn(formatter):
        if not _takes_external(formatter):
            return formatter
        return lambda item: formatter(item, external_prompts=None)

    return [first_turn(f) for f in listed]


@dataclass
class _TurnPrompts(Transition):
    """CoMLRL's actor-critic prompts after the first turn: what the transition returned, through each agent's
    formatter (`item_formatters`; `None`: as returned, CoMLRL's `external_prompt_passthrough`) applied to the dataset
    row with its `prompt` replaced by the returned prompt (the original kept as `_original_prompt`), and passed as
    `external_prompts=` to a formatter that takes it. (The MAGRPO family calls `formatter(row, external_prompts=)` on
    the unchanged row.)"""

    item_formatters: Sequence[Callable] | None = None

    def __call__(self, node, sample: list) -> list:
        prompts = super().__call__(node, sample)
        if self.item_formatters is None:
            return prompts
        out = []
        for formatter, prompt in zip(self.item_formatters, prompts, strict=True):
            item = {**node.row, "_original_prompt": node.row.get("prompt", ""), "prompt": prompt}
            out.append(formatter(item, external_prompts=prompt) if _takes_external(formatter) else formatter(item))
        return out


# ---------------------------------------------------------------------------------------------------- trainers


class _CoMLRLActorCritic(ActorCriticTrainer):
    """What IAC and MAAC share: CoMLRL's constructor arguments, calls and logging on top of `ActorCriticTrainer`."""

    default_config_cls: type[_ActorCriticFields] = IACConfig
    algorithm_name = "IAC"
    logprob_temperature = 1.0  # CoMLRL scores the actor's log-probabilities at temperature 1
    reinforce_each_step = True  # one policy-gradient pass per buffer, no importance ratio (CoMLRL's update)
    # CoMLRL's `trainer.verbose` and its evaluation order (dataset order), as the MAGRPO port has them.
    verbose = MAGRPOTrainer.verbose

    def _get_eval_sampler(self, eval_dataset):
        return dataset_order_sampler(eval_dataset, self.num_generations_eval)

    pending_checkpoint = MAGRPOTrainer.pending_checkpoint
    save_checkpoint = MAGRPOTrainer.save_checkpoint
    load_checkpoint = MAGRPOTrainer.load_checkpoint

    def __init__(
        self,
        agent_model: str | PreTrainedModel | None = None,
        critic_model: str | PreTrainedModel | None = None,
        tokenizer: PreTrainedTokenizerBase | Sequence[PreTrainedTokenizerBase] | None = None,
        reward_func: Callable | None = None,
        reward_processor: Callable[[float], float] | None = None,
        formatters: Callable | Sequence[Callable] | None = None,
        args: _ActorCriticFields | None = None,
        train_dataset=None,
        eval_dataset=None,
        model_config: dict[str, Any] | None = None,
        wandb_config: dict[str, Any] | None = None,
        metrics_callback: Callable | None = None,
        external_transition: Callable | None = None,
        agents: Sequence[str | PreTrainedModel | CausalLMWithValueHead] | None = None,
        critics: Sequence[str | PreTrainedModel | CausalLMWithValueHead] | None = None,
        **kwargs,
    ):
        args = args if args is not None else self.default_config_cls()
        if not isinstance(args, self.default_config_cls):
            raise TypeError(
                f"`args` is a {type(args).__name__}; {type(self).__name__} needs a {self.default_config_cls.__name__}."
            )
        # CoMLRL's checks, in its order.
        if reward_func is None or not callable(reward_func):
            raise ValueError("reward_func must be a callable.")
        if agent_model is None and agents is None:
            raise ValueError("Either agent_model or agents must be provided.")
        self._check_critic_arguments(args, critic_model, critics)
        if agents is None and args.num_agents > 1 and isinstance(agent_model, (PreTrainedModel, torch.nn.Module)):
            raise ValueError(
                f"Multi-agent {self.algorithm_name} requires `agent_model` to be a pretrained identifier string."
            )
        if agents is not None and tokenizer is None:
            raise ValueError("Tokenizer must be provided when using agents.")
        if args.num_turns > 1 and external_transition is None:
            raise ValueError(f"Multi-turn {self.algorithm_name} requires an external_transition.")

        # The agents: CoMLRL's value-model wrappers unwrapped (a head they carry is loaded after construction).
        sources = list(agents) if agents is not None else None
        heads = {}
        if sources is not None:
            for i, source in enumerate(sources):
                if isinstance(source, CausalLMWithValueHead) or type(source).__name__ == "CausalLMWithValueHead":
                    if getattr(source, "value_head", None) is not None:
                        heads[i] = source.value_head.state_dict()
                    sources[i] = source.model
        if isinstance(agent_model, torch.nn.Module):  # one agent given as a model (CoMLRL allows it for one)
            model = agent_model.model if hasattr(agent_model, "value_head") else agent_model
            args.num_agents = 1
        else:
            model = _agent_sources(agent_model, sources, args.num_agents)
        if isinstance(model, list):
            args.num_agents = len(model)

        config = dict(model_config or {})
        critic_config = {key: config.pop(key) for key in CRITIC_MODEL_CONFIG_KEYS if key in config}
        model, tokenizer = _apply_model_config(model, tokenizer, config, args, kwargs)
        if "critic_value_head_hidden_dim" in critic_config:
            if not args.joint_critic:
                raise ValueError(
                    "`model_config['critic_value_head_hidden_dim']` sizes MAAC's joint critic head; IAC reads "
                    "`IACConfig.critic_value_head_hidden_dim` (separate critics) or `value_head_hidden_dim` (heads)."
                )
            check_hidden_dim(
                critic_config["critic_value_head_hidden_dim"], "model_config['critic_value_head_hidden_dim']"
            )
            args.critic_value_head_hidden_dim = critic_config["critic_value_head_hidden_dim"]
        critic_sources = self._critic_sources(args, critic_model, critics)
        critic_models = None
        if critic_sources is not None:
            load_kwargs = _critic_load_kwargs(config, critic_config.get("critic_model_kwargs"))
            setting = "critic_model" if critics is None else "critics"
            critic_models = [
                _critic(s, args.critic_value_head_hidden_dim, load_kwargs, setting) for s in critic_sources
            ]

        self.metrics_callback = metrics_callback
        self.wandb_config = wandb_config
        if wandb_config is not None:
            callback = _apply_wandb_config(args, wandb_config)
            if callback is not None:
                kwargs["callbacks"] = [*(kwargs.get("callbacks") or []), callback]
        if eval_dataset is None:
            args.eval_strategy, args.eval_on_start = "no", False  # CoMLRL evaluates only with a dataset
        given_formatters = formatters
        formatters = _comlrl_formatters(formatters, args.num_agents)
        reward = item_reward(reward_func, reward_processor, args.num_agents, args.num_generations)
        self._item_reward_parts = (reward_func, reward_processor)  # evaluation's items hold one completion each
        if self.joint_tokenizer_from_agent and kwargs.get("critic_processing_class") is None:
            kwargs["critic_processing_class"] = _first_tokenizer(tokenizer, model)
        train_dataset, stand_in = training_data(train_dataset)
        self._batch_rows: list[dict] | None = None
        super().__init__(
            model=model,
            reward_funcs=reward,
            args=args,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=tokenizer,
            formatters=formatters,
            external_transition=external_transition,
            critic_model=critic_models,
            **kwargs,
        )
        if stand_in:
            self.train_dataset = None
        if external_transition is not None:  # CoMLRL's actor-critic prompts for the later turns
            listed = None
            if given_formatters is not None and not args.external_prompt_passthrough:
                listed = _listed(given_formatters, args.num_agents)
            self._transition = _TurnPrompts(external_transition, None, True, listed)
        for i, state in heads.items():
            if args.critic_kind == "head":
                self.model.critics[i].value_head.load_state_dict(state)
        if args.parallel_training == "mp":
            for critic, device in zip(self.model.critics, args.critic_devices):
                critic.to(device)
        sections = (wandb_config or {}).get("config_sections") or {}
        output = sections.get("output") if isinstance(sections, dict) else None
        if isinstance(output, dict) and "verbose" in output:
            self.verbose = bool(output["verbose"])

    joint_tokenizer_from_agent = False  # MAAC: the joint critic reads text tokenized with agent 0's tokenizer

    # ------------------------------------------------------------------ CoMLRL's critics

    def _check_critic_arguments(self, args, critic_model, critics) -> None:
        if not args.use_separate_critic and (critics is not None or critic_model is not None):
            raise ValueError("critics can only be provided when use_separate_critic=True.")

    def _critic_sources(self, args, critic_model, critics) -> list | None:
        """The critics' sources (CoMLRL's `critic_model` repeated per agent, or `critics`), or `None` (heads)."""
        if not args.use_separate_critic:
            return None
        if critic_model is None and critics is None:
            raise ValueError("Either critic_model or critics must be provided when use_separate_critic=True.")
        return _sources("critic_model", critic_model, "critics", critics, args.num_agents)

    # ------------------------------------------------------------------ what CoMLRL reports per item

    def _generate_and_score_completions(self, inputs: list[dict]) -> dict[str, Any]:
        self._batch_rows = inputs  # the dataset rows, for `metrics_callback`'s `batch_item`
        try:
            if self.model.training or self.num_generations_eval == self.num_generations:
                return super()._generate_and_score_completions(inputs)
            # Evaluation samples `num_generations_eval` (1) completions per item: the reward groups them so.
            func, processor = self._item_reward_parts
            reward = item_reward(func, processor, self.num_agents, self.num_generations_eval)
            with self._swap(reward_funcs=[bind_reward(reward, self.num_agents)]):
                return super()._generate_and_score_completions(inputs)
        finally:
            self._batch_rows = None

    def _score_agents(self, batch, names, weights):
        outputs = super()._score_agents(batch, names, weights)
        if self.metrics_callback is not None and self._batch_rows is not None:
            self._call_metrics_callback(batch, outputs)
        return outputs

    def _call_metrics_callback(self, batch, outputs) -> None:
        """CoMLRL's `metrics_callback(rollouts)`, once per dataset item with that item's samples of every agent (and
        every turn played); the mean over the items of each numeric value is logged under its own name."""
        mode = "train" if self.model.training else "eval"
        width = self.num_generations if mode == "train" else self.num_generations_eval
        for item in range(len(self._batch_rows) // width):
            samples = []
            for i, output in enumerate(outputs):
                for g in range(width):
                    samples += self._episode_samples(i, item * width + g, g, batch, output, item * width)
            metrics = self.metrics_callback(samples)
            for key, value in (metrics or {}).items():
                try:
                    self._metrics[mode][str(key)].append(float(value))
                except (TypeError, ValueError):
                    continue  # CoMLRL drops values that are not numbers

    def _episode_samples(self, i: int, root: int, g: int, batch, output, item: int) -> list[RolloutSample]:
        """Agent i's samples of the episode that starts at row `root`, turn by turn, as CoMLRL's `RolloutSample`s:
        each turn's own reward, and as `returns` the undiscounted sum of the rewards from that turn on (CoMLRL's)."""
        rows = [root]
        while batch.successors is not None and int(batch.successors[rows[-1]]) >= 0:
            rows.append(int(batch.successors[rows[-1]]))
        start = self.accelerator.process_index * len(batch.agent_rows[0])
        returns = [float(batch.credit[i][start + k].sum()) for k in rows]  # the core's discounted returns
        discount = self.args.discount
        rewards = [g_t - discount * (0.0 if math.isnan(g_n) else g_n) for g_t, g_n in zip(returns, returns[1:])]
        rewards.append(returns[-1])  # the last turn played: its return is its reward (`ended_return="reward"`)
        to_go = [sum(rewards[t:]) for t in range(len(rewards))]
        return [
            self._rollout_sample(i, k, g, t, item, rewards[t], to_go[t], batch, output) for t, k in enumerate(rows)
        ]

    def _rollout_sample(self, i, k, g, turn, item, reward, returns, batch, output) -> RolloutSample:
        prompt_mask, completion_mask = output["prompt_mask"][k].bool(), output["completion_mask"][k].bool()
        prompt_ids = output["prompt_ids"][k][prompt_mask].cpu()
        completion_ids = output["completion_ids"][k][completion_mask].cpu()
        target = output["value_targets"][k].detach().cpu().reshape(1)
        old = output["old_values"][k].detach().cpu().reshape(1)
        return RolloutSample(
            agent_idx=i,
            prompt=batch.agent_rows[i][k]["prompt"],
            completion=batch.rollouts[i].completions[k],
            full_input_ids=torch.cat([prompt_ids, completion_ids]),
            attention_mask=torch.ones(len(prompt_ids) + len(completion_ids), dtype=torch.long),
            prompt_len=len(prompt_ids),
            response_len=len(completion_ids),
            old_logprob=torch.zeros(1),  # CoMLRL stores it and never reads it; not computed here
            old_value=old,
            reward=torch.tensor([reward]),
            returns=torch.tensor([returns]),
            advantage=target - old,
            normalized_advantage=output["advantages"][k].detach().cpu().reshape(1),
            metadata={
                "turn_idx": turn,
                "generation_idx": g,
                "batch_item": self._batch_rows[item],
                "value_target": target,
                "adv_target": target,
            },
        )

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        # CoMLRL's names of each turn's mean reward and return, beside TRL's `reward` and `turn_k/reward`.
        mode = "train" if self.model.training else "eval"
        metrics = self._metrics[mode]
        if self.args.num_turns == 1 and metrics.get("reward"):
            for key in ("turn_1/reward_mean", "turn_1/expected_return"):
                metrics[key] = list(metrics["reward"])
        for key in [k for k in metrics if k.startswith("turn_") and k.endswith("/reward")]:
            metrics[f"{key}_mean"] = list(metrics[key])
        super().log(logs, start_time)

    # ------------------------------------------------------------------ CoMLRL's entry points

    get_decay_parameter_names = decay_every_parameter  # CoMLRL's AdamW decays every parameter

    def train(
        self,
        *,
        resume_from_checkpoint: str | bool | None = None,
        checkpoint_dir: str | None = None,
        checkpoint_interval: int = 1,
        checkpoint_total_limit: int | None = None,
    ):
        """Train (keyword arguments only, as CoMLRL), with CoMLRL's checkpoint arguments mapped onto Trainer's:
        a checkpoint every `checkpoint_interval` epochs in `checkpoint_dir` (`checkpoint_dir/checkpoint-N/`), at most
        `checkpoint_total_limit` kept; `resume_from_checkpoint` a checkpoint folder or `True` for the latest."""
        if self.train_dataset is None:
            raise ValueError("Training requires a dataset: pass `train_dataset=` to the trainer.")
        for name, value, optional in (
            ("checkpoint_interval", checkpoint_interval, False),
            ("checkpoint_total_limit", checkpoint_total_limit, True),
        ):
            if optional and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                allowed = "a positive integer or None" if optional else "a positive integer"
                raise ValueError(f"`{name}` must be {allowed}, got {value!r}.")
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
        return super().train(resume_from_checkpoint=resume_from_checkpoint)

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """Evaluate the first `eval_num_samples` rows of the evaluation dataset, one completion each (CoMLRL calls it
        with no arguments). Returns the metrics, keyed `eval_...`: TRL's, `eval_turn_1/reward_mean`,
        `eval_turn_1/expected_return` and the means of `metrics_callback`'s; `{}` without an evaluation dataset."""
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if dataset is None:
            return {}
        if hasattr(dataset, "select"):
            dataset = dataset.select(range(min(max(self.args.eval_num_samples, 1), len(dataset))))
        return super().evaluate(eval_dataset=dataset, ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)


class IACTrainer(_CoMLRLActorCritic):
    """Independent actor-critic with CoMLRL 1.4.3's `IACTrainer` arguments, in its order: a critic per agent (a
    separate model, `use_separate_critic=True`, or a value head on the agent).

    Args:
        agent_model (`str`, *optional*): a model id or path, loaded `num_agents` times (a model object for one agent).
        critic_model (`str` or model, *optional*): the critics' model id or path, loaded once per agent.
        tokenizer: one tokenizer for all agents, or one per agent (required with `agents`).
        reward_func: called once per dataset item with each agent's list of `num_generations` completions
            (`item_reward`).
        reward_processor: applied to every reward value.
        formatters: one callable for all agents or one per agent, `formatter(item) -> prompt`.
        args (`IACConfig`, *optional*): `None` uses `IACConfig()`.
        train_dataset, eval_dataset: the datasets (a trainer without `train_dataset` can only evaluate).
        model_config (`dict`, *optional*): `torch_dtype`/`dtype`, `attn_implementation`, `model_kwargs` (agents),
            `critic_model_kwargs` (critics), `special_tokens`, `name`.
        wandb_config (`dict`, *optional*): as `MAGRPOTrainer`'s; turns on `report_to="wandb"`.
        metrics_callback (callable, *optional*): `metrics_callback(samples) -> dict`, once per item with its
            `RolloutSample`s; the means over items are logged.
        external_transition: for `num_turns > 1`, CoMLRL's `external_transition(prompt=, agent_completions=, ...)`;
            its prompts go through the formatters as CoMLRL's actor-critic passes them (`_TurnPrompts`).
        agents, critics (lists, *optional*): one model or id per agent, one critic per agent.
        **kwargs: `ActorCriticTrainer`'s TRL arguments (`callbacks`, `peft_config`, ...).

    `save_model(dir)` writes CoMLRL's layout: `dir/agent_i/` with `agent_i/critic/` (and `value_head.pt` for a head
    on the agent); with one agent, the agent in `dir/` and its critic in `dir/critic/`.
    """

    default_config_cls = IACConfig
    algorithm_name = "IAC"

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        if _internal_call or self.num_agents > 1 or hasattr(self.model, "peft_model"):
            return super().save_model(output_dir, _internal_call)
        # CoMLRL's layout for one agent: the agent's files in `output_dir/` itself, its critic in `critic/`.
        if not self.args.should_save:
            return
        self.model.save_agent(0, output_dir)
        self._agent_views[0]["processing_class"].save_pretrained(output_dir)
        critic = self.model.critics[0]
        if self.args.critic_kind == "head":
            torch.save(
                {k: v.detach().cpu() for k, v in critic.value_head.state_dict().items()},
                os.path.join(output_dir, VALUE_HEAD_FILE),
            )
        else:
            critic.save_pretrained(os.path.join(output_dir, "critic"))


class MAACTrainer(_CoMLRLActorCritic):
    """Multi-agent actor-critic with one joint critic, with CoMLRL 1.4.3's `MAACTrainer` arguments (those of
    `IACTrainer`; `critics` holds one model). The critic reads every agent's prompt (and completion for
    `critic_type="q"`) as text (`estimators.joint_critic_text`), tokenized with agent 0's tokenizer.
    `save_model(dir)` writes `dir/agent_i/` and `dir/critic/` (with `value_head.pt`)."""

    default_config_cls = MAACConfig
    algorithm_name = "MAAC"
    joint_tokenizer_from_agent = True

    def _check_critic_arguments(self, args, critic_model, critics) -> None:
        if critic_model is None and critics is None:
            raise ValueError("MAAC requires a critic: pass `critic_model=` (or `critics=[model]`).")

    def _critic_sources(self, args, critic_model, critics) -> list:
        return _sources("critic_model", critic_model, "critics", critics, 1)


# ---------------------------------------------------------------------------------------------------- helpers


def _sources(name: str, model, list_name: str, models, count: int) -> list:
    """CoMLRL's `critic_model` (repeated) or `critics` (`count` entries); both given must name the same models."""
    if models is None:
        if isinstance(model, torch.nn.Module) and count > 1:
            raise ValueError(f"`{name}` must be an id or path for {count} critics; pass models as `{list_name}=`.")
        return [model] * count
    models = list(models)
    if len(models) != count:
        raise ValueError(f"`{list_name}` must hold {count} model(s), got {len(models)}.")
    if model is not None and any(m != model for m in models):
        raise ValueError(f"`{name}` and `{list_name}` conflict: {model!r} != {models!r}; pass one.")
    return models


def _critic_load_kwargs(model_config: dict, critic_kwargs: dict | None) -> dict:
    """`from_pretrained` arguments of critics given by name: `critic_model_kwargs`, with the dtype and attention
    implementation of `model_config` where they do not say."""
    kwargs = dict(critic_kwargs or {})
    if not isinstance(kwargs, dict):
        raise ValueError(f"`model_config['critic_model_kwargs']` must be a dict, got {type(critic_kwargs).__name__}.")
    dtype = kwargs.pop("torch_dtype", None) or kwargs.pop("dtype", None)
    dtype = dtype or model_config.get("torch_dtype") or model_config.get("dtype")
    if isinstance(dtype, str) and dtype != "auto":
        dtype = getattr(torch, dtype)
    if dtype is not None:
        kwargs["dtype"] = dtype
    if "attn_implementation" in model_config:
        kwargs.setdefault("attn_implementation", model_config["attn_implementation"])
    return kwargs


def _critic(source, hidden_dim: int | None, load_kwargs: dict, setting: str) -> CausalLMWithValueHead:
    """A critic from CoMLRL's sources: an id or path (a `value_head.pt` there is loaded), a causal LM (a new head),
    or a CoMLRL or multiagent_trl `CausalLMWithValueHead` (its weights)."""
    if isinstance(source, CausalLMWithValueHead):
        return source
    if type(source).__name__ == "CausalLMWithValueHead":  # CoMLRL's own class: the same layout
        critic = CausalLMWithValueHead(source.model, hidden_dim or _hidden_dim(source.value_head))
        if source.value_head is not None:
            critic.value_head.load_state_dict(source.value_head.state_dict())
        return critic
    if isinstance(source, torch.nn.Module):
        return CausalLMWithValueHead(source, hidden_dim)
    model_config_of(source, setting)  # a ValueError naming the setting, not the Hub's about a repo id
    return CausalLMWithValueHead.from_pretrained(
        str(source), value_head_hidden_dim=hidden_dim, attach_value_head=True, **load_kwargs
    )


def _hidden_dim(head) -> int | None:
    pre = getattr(head, "pre_projection", None)
    return None if pre is None else pre[0].out_features


def _first_tokenizer(tokenizer, model):
    """Agent 0's tokenizer: the one given, or loaded from agent 0's id or path."""
    if tokenizer is not None:
        return tokenizer[0] if isinstance(tokenizer, (list, tuple)) else tokenizer
    source = model[0] if isinstance(model, list) else model
    if isinstance(source, torch.nn.Module):
        source = source.config.name_or_path
    return AutoTokenizer.from_pretrained(str(source))


__all__ = [
    "IACConfig",
    "IACTrainer",
    "MAACConfig",
    "MAACTrainer",
    "RolloutSample",
    "item_reward",
]
