"""CoMLRL's config fields as one table: each field's native counterpart and its limit. The configs check their limits
from it (`check_fields`), and `docs/comlrl-users.md`'s field tables are generated from it with the defaults read off
the config classes (`python docs/comlrl_fields.py` rewrites them; `tests/test_docs.py` checks them). Also
the config pieces every CoMLRL config shares: CoMLRL's optimization defaults, its device lists and batch-size names."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple

import torch
from transformers import TrainingArguments

from ..config import whole_number


class Field(NamedTuple):
    """One row: CoMLRL's name, what it becomes here, and what it accepts (`minimum`, `choices` and `positive` are
    checked)."""

    name: str
    native: str
    minimum: float | None = None  # an int reads "at least", a float ">="
    choices: tuple[str, ...] = ()
    positive: bool = False  # "> 0" (None passes)


SHARED = (
    Field("agent_learning_rate", "`learning_rate`", 0.0),
    Field("max_new_tokens", "`max_completion_length`", 1),
    Field("num_agents", "same", 1),
    Field("num_turns", "same", 1),
    Field("logging_steps", "same (optimizer steps)", 1),
    Field("temperature", "same"),
    Field("top_p", "same"),
    Field("top_k", "same; `None` -> 0 (no top-k filtering)"),
    Field("rollout_buffer_size", "a generation batch (`steps_per_generation` x `per_device_train_batch_size`)", 1),
    Field("train_batch_size", "rows per optimizer step (None: `rollout_buffer_size`); `comlrl_train_batch_size`", 1),
    Field("eval_interval", "`eval_strategy='steps'`, `eval_steps`, `eval_on_start`; 0 disables", 0),
    Field("eval_num_samples", "the first rows of `eval_dataset`, one completion each", 0),
    Field("eval_batch_size", "`per_device_eval_batch_size`; `comlrl_eval_batch_size`", 1),
    Field("parallel_training", "`none`: Accelerate's placement; `mp`: `agent_devices`", None, ("none", "mp")),
    Field("agent_devices", "with `mp`: `agent_devices` (one, one per agent, or `auto`)"),
)
GRPO_ONLY = (
    Field("num_train_epochs", "same", 1),
    Field("num_generations", "same (G)", 2),
    Field("discount", "unused, as in CoMLRL 1.4.3 (kept in `comlrl_discount`; returns undiscounted)"),
    Field("early_termination_threshold", "same (a node above it has no children)"),
    Field("advantage_normalization", "`scale_rewards='group'` or `'none'`"),
    Field("advantage_mode", "`advantage_baseline`", None, ("mean", "raw", "max", "rloo")),
    Field("reference_kl_enabled", "`beta = reference_kl_coef` when enabled"),
    Field("reference_kl_coef", "`beta`", 0.0),
    Field("reference_devices", "with `mp`: the reference models' devices"),
)
ACTOR_CRITIC = (
    Field("num_generations", "same", 1),
    Field("critic_learning_rate", "same (None: `agent_learning_rate`)"),
    Field("value_loss_coef", "same"),
    Field("advantage_normalization", "same (over each agent's buffer)"),
    Field("critic_type", "same: `v` or `q`"),
    Field("discount", "same (bootstrap discount)"),
    Field("early_termination_threshold", "same"),
    Field("critic_devices", "with `mp`: the critics' devices"),
    Field("use_separate_critic", "IAC: `critic_kind='model'` (True) or `'head'` (False)"),
    Field("value_clip_range", "IAC: clips a head on the agent only (`comlrl_value_clip_range`)"),
    Field("critic_value_head_hidden_dim", "IAC: the separate critics' head width (a positive width)"),
    Field("value_head_hidden_dim", "IAC: the heads' width on the agents (a positive width)"),
    Field("reference_kl_enabled", "`True` raises (use `beta`)"),
    Field("reference_kl_coef", "unused", 0.0),
)
MADPO = (
    Field("num_train_epochs", "passes over the dataset, each drawing new pairs", 1),
    Field(
        "collaboration_mode", "same; `centralized`: one model writes all roles", None, ("decentralized", "centralized")
    ),
    Field("preference_num_candidates", "`num_generations` (K)", 2),
    Field("preference_pairs_per_sample", "same (None: no limit)", 1),
    Field("pair_selection", "same"),
    Field("dpo_beta", "same"),
    Field("environment_steps_per_pair", "unused (CoMLRL's W&B x-axis)", 1),
    Field("reference_kl_enabled", "`True` raises (`reference_free=False` is a reference)"),
    Field("reference_kl_coef", "unused", 0.0),
)
ONLINE_CRITIC = "`iac`/`maac` only (else their default only)"
MARLHF = (  # MARLHF's own fields; the others are MAGRPOConfig's, for the online phase
    Field(
        "rl_algorithm",
        "`advantage_mode` (the MAGRPO family), or the critics (`iac`, `maac`); CoMLRL's `mareforce` too",
        None,
        ("magrpo", "mareinforce", "maremax", "marloo", "iac", "maac"),
    ),
    Field(
        "collaboration_mode", "same (`centralized`: the MAGRPO family online)", None, ("decentralized", "centralized")
    ),
    Field("preference_num_candidates", "same (K joint candidates per item)", 2),
    Field("preference_pairs_per_sample", "same (None: no limit)", 1),
    Field("pair_selection", "same: `reward_gap`, `random`, `all`"),
    Field("reward_model_name", "same (None: the agents' model)"),
    Field("reward_model_device", "same; None, or CUDA without CUDA: the team's device"),
    Field("reward_learning_rate", "same", positive=True),
    Field("reward_num_train_epochs", "same", 1),
    Field("reward_train_batch_size", "same", 1),
    Field("reward_max_length", "same (None: no cut)", 1),
    Field("reward_freeze_backbone", "same"),
    Field("critic_model_name", f"the critics' model (None: the agents'); {ONLINE_CRITIC}"),
    Field("critic_learning_rate", f"same (None: `agent_learning_rate`); {ONLINE_CRITIC}", positive=True),
    Field("critic_devices", f"with `mp`; {ONLINE_CRITIC}"),
    Field("use_separate_critic", f"IAC: a critic model per agent, or a head on each; MAAC: True; {ONLINE_CRITIC}"),
    Field("critic_type", f"same; {ONLINE_CRITIC}", None, ("v", "q")),
    Field("value_loss_coef", f"same; {ONLINE_CRITIC}", positive=True),
    Field("value_clip_range", f"IAC's heads on the agents; {ONLINE_CRITIC}", positive=True),
    Field("critic_value_head_hidden_dim", f"the critics' head width (MAAC's too); {ONLINE_CRITIC}"),
    Field("value_head_hidden_dim", f"IAC's heads on the agents: their width; {ONLINE_CRITIC}"),
    Field("dpo_beta", "MADPO's, unused (default only)", positive=True),
    Field("use_environment_step", "MADPO's, unused (default only)"),
    Field("environment_steps_per_pair", "MADPO's, unused (default only)", 1),
)
FAMILIES = {
    "MAGRPOConfig": SHARED + GRPO_ONLY,
    "IACConfig": SHARED + ACTOR_CRITIC,
    "MADPOConfig": SHARED + MADPO,
    "MARLHFConfig": MARLHF,
}
TABLE_HELP = "CoMLRL's; here: "  # how a field's help from the table starts
STORED_AS = {"train_batch_size": "comlrl_train_batch_size", "eval_batch_size": "comlrl_eval_batch_size"}


def check_fields(config, family: str) -> None:
    """CoMLRL 1.4.3's limits of `family`'s fields (the table's `minimum` and `choices`), raised naming the field
    before anything is mapped; a choice is read case-insensitively and stored lower-cased (`"null"` is `"none"`)."""
    for row in FAMILIES[family]:
        attribute = STORED_AS.get(row.name, row.name)
        value = getattr(config, attribute, None)
        if row.choices:
            value = "none" if value in (None, "null") and "none" in row.choices else str(value).strip().lower()
            if value not in row.choices:
                two = len(row.choices) == 2
                allowed = " or ".join(map(repr, row.choices)) if two else f"one of {list(row.choices)}"
                raise ValueError(f"`{row.name}` must be {allowed}, got {getattr(config, attribute)!r}.")
            setattr(config, attribute, value)
        elif row.minimum is not None and value is not None and value < row.minimum:
            bound = f">= {row.minimum:g}" if isinstance(row.minimum, float) else f"at least {row.minimum}"
            raise ValueError(f"`{row.name}` must be {bound}, got {value}.")
        elif row.positive and value is not None and not value > 0:
            raise ValueError(f"`{row.name}` must be > 0, got {value}.")


# ---------------------------------------------------------------------------------------------------- shared config


@dataclass
class CoMLRLOptimization:
    """The training settings of CoMLRL's actor-critic and preference trainers, as config fields with CoMLRL's values:
    torch's AdamW with weight decay 0.01 (on every parameter: `decay_every_parameter`), a constant learning rate, no
    gradient clipping, the dataset in order, activations kept, checkpoints only when `train()` asks for them. Listed
    before the core config among a config's bases, so that these defaults win."""

    save_strategy: str = field(default="no", metadata={"help": "Checkpoints (CoMLRL: asked for in train())."})
    gradient_checkpointing: bool = field(default=False, metadata={"help": "Recompute activations (CoMLRL: no)."})
    optim: str = field(default="adamw_torch", metadata={"help": "Optimizer (CoMLRL: torch.optim.AdamW)."})
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay (torch's default, CoMLRL's)."})
    lr_scheduler_type: str = field(default="constant", metadata={"help": "Learning-rate schedule (CoMLRL: none)."})
    max_grad_norm: float = field(default=0.0, metadata={"help": "Gradient clipping; 0 disables it (CoMLRL: none)."})
    shuffle_dataset: bool = field(default=False, metadata={"help": "Shuffle the dataset (CoMLRL: dataset order)."})


@dataclass
class CoMLRLPreferenceFields:
    """CoMLRL 1.4.3's preference fields with its defaults, which its `MARLHFConfig` inherits from `MADPOConfig`: the
    pairs (K candidates per item, pairs kept, their selection) and MADPO's own (`dpo_beta`, CoMLRL's W&B x-axis)."""

    preference_num_candidates: int = 80
    preference_pairs_per_sample: int | None = 16
    pair_selection: str = "reward_gap"
    dpo_beta: float = 0.1
    use_environment_step: bool = True
    environment_steps_per_pair: int = 2


@dataclass
class CoMLRLShared:
    """The fields of the table's `SHARED` rows, with the defaults every CoMLRL config has (a family declares its own
    where its default differs). Listed before the core config among a config's bases, so that these win."""

    agent_learning_rate: float | None = 5e-6
    max_new_tokens: int | None = 256
    num_agents: int | None = 2
    temperature: float = 0.6
    top_p: float = 0.6
    top_k: int | None = 50
    rollout_buffer_size: int = 2
    train_batch_size: int | None = None
    eval_interval: int = 16
    eval_num_samples: int = 4
    eval_batch_size: int = 1
    parallel_training: str = "none"
    agent_devices: list[str] | None = None


def check_parallel(config, *device_fields: str) -> None:
    """`parallel_training="mp"` needs each of `device_fields` (one device per agent, or 'auto')."""
    for name in device_fields if config.parallel_training == "mp" else ():
        if getattr(config, name) is None:
            raise ValueError(f"`parallel_training='mp'` needs `{name}`: one device per agent (or 'auto').")


def map_shared(config, device_counts: dict[str, int]) -> dict:
    """The fields every CoMLRL config maps the same way: `agent_learning_rate`, `max_new_tokens`, `top_k` (`None`:
    TRL's 0), the evaluation fields (before training and every `eval_interval` optimizer steps, one completion per
    row) and the device fields named in `device_counts`: with `"mp"` and a count (models placed), the native field
    takes CoMLRL's forms as they are (`team.placement.resolve_devices`); else it is left `None` (Accelerate's
    placement). Returns the device fields as given, for `confirm_devices`."""
    if config.agent_learning_rate is not None:
        config.learning_rate = config.agent_learning_rate
    if config.max_new_tokens is not None:
        config.max_completion_length = config.max_new_tokens
    if config.top_k is None:
        config.top_k = 0
    if config.eval_interval > 0:
        config.eval_strategy, config.eval_steps, config.eval_on_start = "steps", config.eval_interval, True
    config.per_device_eval_batch_size = config.comlrl_eval_batch_size
    config.num_generations_eval = 1
    given = {name: getattr(config, name) for name in device_counts}
    for name, count in device_counts.items():
        if config.parallel_training != "mp" or not count:
            setattr(config, name, None)
    return given


def buffer_steps(config) -> tuple[int, int]:
    """CoMLRL's buffer: `(rollout_buffer_size, rows per optimizer step)`, the step `train_batch_size` (None: the whole
    buffer); a buffer that the steps do not divide raises (here each buffer is TRL's `steps_per_generation` steps)."""
    buffer = config.rollout_buffer_size
    per_step = min(config.comlrl_train_batch_size or buffer, buffer)
    if buffer % per_step != 0:
        raise ValueError(
            f"`rollout_buffer_size={buffer}` must be a multiple of `train_batch_size={per_step}`: each buffer is "
            "split into equal optimizer steps here (TRL's steps_per_generation)."
        )
    return buffer, per_step


def confirm_devices(config, given: dict) -> None:
    """After the core's checks: with `parallel_training="none"` a CoMLRL device field (`given`: name -> value as
    given) may only name the device Accelerate uses anyway."""
    for name, spec in given.items() if config.parallel_training == "none" else ():
        if spec is None or (isinstance(spec, str) and spec.lower() == "auto"):
            continue
        if any(torch.device(s) != config.device for s in ([spec] if isinstance(spec, str) else list(spec))):
            raise ValueError(
                f"`{name}={spec!r}` with `parallel_training='none'`: here Accelerate places every agent on the "
                f"process's device ({config.device}). Set `parallel_training='mp'` to put each agent on its own "
                "device, or choose the device with CUDA_VISIBLE_DEVICES / `accelerate launch`."
            )


def comlrl_config(family: str):
    """Decorator finishing a CoMLRL config class of `family` from the table: each of the family's fields declared
    without a help text gets its row's `native` column as one (what `--help` prints), and CoMLRL's `train_batch_size`
    and `eval_batch_size` become properties: `TrainingArguments` reads the same names as the batch sizes Trainer
    loads, so reading keeps Trainer's meaning and assigning (the dataclass `__init__` does) stores CoMLRL's value
    under `comlrl_<name>`."""

    def finish(config_cls: type) -> type:
        declared = config_cls.__dataclass_fields__
        ours = {
            name
            for c in config_cls.__mro__
            if c.__module__.startswith(__package__)
            for name in vars(c).get("__annotations__", {})
        }
        for row in FAMILIES[family]:  # CoMLRL's own fields only: an inherited one is the native config's too
            if row.name not in ours:
                continue
            given = declared[row.name].metadata.get("help")
            if given is None or given.startswith(TABLE_HELP):
                # A copy for this class: a field inherited from another family's config keeps that family's text.
                declared[row.name] = copy.copy(declared[row.name])
                text = f"{TABLE_HELP}{row.native}."
                declared[row.name].metadata = MappingProxyType({**declared[row.name].metadata, "help": text})
        for name in STORED_AS:
            trainer_property = getattr(TrainingArguments, name)

            def setter(self, value, name=name):
                self.__dict__[f"comlrl_{name}"] = whole_number(name, value)

            doc = f"Trainer's; CoMLRL's: comlrl_{name}."
            setattr(config_cls, name, property(trainer_property.fget, setter, doc=doc))
        return config_cls

    return finish
