"""CoMLRL 1.4.3's `MARLHFConfig`/`MARLHFTrainer` translated onto the native reward-model stage
(`preference.rlhf.RewardModelStage`), online on MAGRPO's port (`reinforce.MAGRPOTrainer`) or, with `rl_algorithm=
"iac"`/`"maac"`, on the IAC/MAAC translation (`MARLHFIACTrainer`/`MARLHFMAACTrainer`); either way `train()` is one
`Trainer.train`, the reward-model stage first. docs/preference.md ("MARLHF") and docs/comlrl-users.md have the steps
and every deliberate difference from CoMLRL."""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from typing import Any

import torch
from transformers import AutoTokenizer

from ..actor_critic.config import check_hidden_dim
from ..actor_critic.value_model import model_config_of
from ..preference.reward_model import JointRewardModel
from ..preference.rlhf import RewardModelFields, RewardModelStage, check_reward_model_fields
from ..rewards.joint import bind_reward
from .actor_critic import IACConfig, IACTrainer, MAACConfig, MAACTrainer
from .behaviour import as_one_actor, comparator_adapter, expected_config, with_keywords
from .fields import FAMILIES, ONLINE_CRITIC, STORED_AS, CoMLRLPreferenceFields, check_fields, comlrl_config
from .reinforce import MAGRPOConfig, MAGRPOTrainer

# CoMLRL's rl_algorithm -> the MAGRPO family's advantage_mode.
RL_ALGORITHMS = {"magrpo": "mean", "mareinforce": "raw", "maremax": "max", "marloo": "rloo"}
ACTOR_CRITIC_ALGORITHMS = ("maac", "iac")
RL_ALGORITHM_ALIASES = {"mareforce": "mareinforce"}
# Fields that CoMLRL's MARLHF accepts but reads only with an actor-critic back-end, or never: only their defaults are
# accepted otherwise (read off the config class).
CRITIC_FIELDS = tuple(row.name for row in FAMILIES["MARLHFConfig"] if row.native.endswith(ONLINE_CRITIC))
UNUSED_MADPO_FIELDS = ("dpo_beta", "use_environment_step", "environment_steps_per_pair")
# IAC's critic fields that MAAC (one joint critic model) has no use for.
MAAC_UNUSED_FIELDS = ("use_separate_critic", "value_clip_range", "value_head_hidden_dim")
# The MARLHF fields the online actor-critic config is built from (CoMLRL's `_build_actor_critic_common_config` and
# `_build_iac_config`): CoMLRL's IACConfig fields, less the batch sizes (read from their stored CoMLRL values), plus
# three IAC shares with MAGRPO.
ACTOR_CRITIC_FIELDS = (
    *(row.name for row in FAMILIES["IACConfig"] if row.name not in STORED_AS),
    "num_train_epochs",
    "external_prompt_passthrough",
    "reference_devices",
)
# The reward-model stage's fields, set on the online actor-critic config (CoMLRL's MARLHF has no `reward_pooling`: its
# head reads the last token, the stage's default without the field).
REWARD_STAGE_FIELDS = tuple(f.name for f in dataclass_fields(RewardModelFields) if f.name != "reward_pooling")
# TRL/Trainer settings of the run that the online actor-critic trainer shares.
SHARED_TRL_FIELDS = (
    "output_dir", "seed", "data_seed", "report_to", "run_name", "logging_dir", "use_cpu", "bf16", "fp16",
    "disable_tqdm", "log_completions", "shuffle_dataset",
)  # fmt: skip


@comlrl_config("MARLHFConfig")
@dataclass
class MARLHFConfig(CoMLRLPreferenceFields, MAGRPOConfig):
    """`MAGRPOConfig` accepting every field of CoMLRL 1.4.3's `MARLHFConfig`, with its defaults and checks: the
    reward-model stage's fields, `rl_algorithm` (the online phase), the critic fields of the actor-critic back-ends
    (`actor_critic_config()`), and MADPO's fields that CoMLRL's MARLHF never reads; the table
    `fields.FAMILIES["MARLHFConfig"]` says what each becomes here."""

    output_dir: str | None = field(default="marlhf_output", metadata={"help": "Where checkpoints and logs go."})
    num_turns: int = field(default=1, metadata={"help": "Turns per episode (MARLHF: 1)."})
    early_termination_threshold: float | None = field(
        default=None, metadata={"help": "MAGRPO's field; unused by single-turn MARLHF."}
    )
    collaboration_mode: str = "decentralized"
    rl_algorithm: str = "magrpo"
    reward_model_name: str | None = None
    reward_model_device: str | None = "cuda:0"
    reward_learning_rate: float = 1e-5
    reward_num_train_epochs: int = 1
    reward_train_batch_size: int = 1
    reward_max_length: int | None = None
    reward_freeze_backbone: bool = False
    critic_model_name: str | None = None
    critic_learning_rate: float | None = None
    critic_devices: list[str] | None = None
    use_separate_critic: bool = True
    critic_type: str = "v"
    value_loss_coef: float = 0.6
    value_clip_range: float | None = 0.2
    critic_value_head_hidden_dim: int | None = None
    value_head_hidden_dim: int | None = None

    def __post_init__(self):
        self._check_marlhf_fields()
        as_one_actor(self, super().__post_init__)

    def _check_marlhf_fields(self) -> None:
        """CoMLRL 1.4.3's checks of `MARLHFConfig` and of MADPO's fields, and what this port does not support,
        raised before anything is mapped: the table's limits (`check_fields`), the native reward-model stage's
        (`check_reward_model_fields`: single turn, aligned, the pair fields), then what only this translation has."""
        algorithm = str(self.rl_algorithm or "magrpo").strip().lower()
        self.rl_algorithm = RL_ALGORITHM_ALIASES.get(algorithm, algorithm)
        self.critic_type = self.critic_type or "v"
        check_fields(self, "MARLHFConfig")  # the table's limits and choices (lower-cased)
        check_reward_model_fields(self)
        algorithm, actor_critic = self.rl_algorithm, self.rl_algorithm in ACTOR_CRITIC_ALGORITHMS
        minimum = 1 if actor_critic else 2  # the MAGRPO family compares a prompt's samples
        if self.num_generations is None or self.num_generations < minimum:
            raise ValueError(
                f"`num_generations` must be >= {minimum} for `rl_algorithm={algorithm!r}`, got {self.num_generations}."
            )
        given = str(self.advantage_mode).strip().lower()
        if actor_critic and given != "mean":
            raise ValueError(
                f"`advantage_mode={self.advantage_mode!r}` serves the MAGRPO family; `rl_algorithm={algorithm!r}` "
                "takes its advantages from the critic: drop `advantage_mode`."
            )
        if not actor_critic:
            mode = RL_ALGORITHMS[algorithm]
            if given not in ("mean", mode):  # "mean" is the default, which CoMLRL overwrites from rl_algorithm
                raise ValueError(
                    f"`advantage_mode={self.advantage_mode!r}` contradicts `rl_algorithm={algorithm!r}` (advantage "
                    f"mode {mode!r}); MARLHF sets it from `rl_algorithm`: drop `advantage_mode` or choose the "
                    f"`rl_algorithm` of that mode ({ {v: k for k, v in RL_ALGORITHMS.items()}.get(given, 'none')!r})."
                )
            self.advantage_mode = mode
        if self.collaboration_mode == "centralized" and actor_critic:
            raise NotImplementedError(
                f"`collaboration_mode='centralized'` with `rl_algorithm={algorithm!r}` is not ported: the "
                f"centralized team trains online with the MAGRPO family ({list(RL_ALGORITHMS)}); use one of "
                "those, or `collaboration_mode='decentralized'` for the actor-critic back-ends."
            )
        checks = [(UNUSED_MADPO_FIELDS, "is a MADPO field that MARLHF never reads (CoMLRL ignores it too)")]
        if not actor_critic:
            why = f"serves `rl_algorithm='iac'`/`'maac'`, not `rl_algorithm={algorithm!r}`"
            checks.append((CRITIC_FIELDS, why))
        elif algorithm == "maac":
            checks.append((MAAC_UNUSED_FIELDS, "serves IAC's critics; MAAC trains one joint critic model"))
        for names, why in checks:
            for name in names:
                default = self.__dataclass_fields__[name].default
                if getattr(self, name) != default:
                    raise ValueError(f"`{name}={getattr(self, name)!r}` {why}: leave it at its default ({default!r}).")
        if algorithm == "iac" and not self.use_separate_critic and self.critic_model_name is not None:
            raise ValueError(
                "`critic_model_name` names separate critics, but `use_separate_critic=False` puts a value head on "
                "each agent: drop `critic_model_name` or set `use_separate_critic=True`."
            )
        if actor_critic:
            # The online phase's config, from the fields as given (the MAGRPO host below rewrites some of them);
            # building it now raises its checks at construction.
            self._actor_critic_fields = {name: getattr(self, name) for name in ACTOR_CRITIC_FIELDS}
            self._actor_critic_fields["train_batch_size"] = self.comlrl_train_batch_size
            self._actor_critic_fields["eval_batch_size"] = self.comlrl_eval_batch_size
            self.actor_critic_config()
            # The host only samples the preference candidates and evaluates; MAGRPO's config wants 2 samples.
            self.num_generations = max(self.num_generations, 2)

    def actor_critic_config(self, num_agents: int | None = None) -> IACConfig | MAACConfig:
        """The online phase's `IACConfig`/`MAACConfig` (`rl_algorithm="iac"`/`"maac"`): CoMLRL's
        `_build_actor_critic_common_config` fields (the critic's learning rate `None` -> `agent_learning_rate`;
        `num_turns=1`), IAC's critic fields, and the run's TRL settings (`output_dir`, `seed`, `report_to`, ...);
        `num_agents` (the trainer's, as CoMLRL's MARLHFTrainer takes it) replaces the config's."""
        if self.rl_algorithm not in ACTOR_CRITIC_ALGORITHMS:
            raise ValueError(f"`rl_algorithm={self.rl_algorithm!r}` trains no critic: it has no actor-critic config.")
        values = dict(self._actor_critic_fields)
        if num_agents is not None:
            values["num_agents"] = num_agents
        values["critic_learning_rate"] = values["critic_learning_rate"] or values["agent_learning_rate"]
        # CoMLRL's child updates once its buffer holds `rollout_buffer_size` samples, filled an item (G samples) at
        # a time: the buffer it trains on is the size rounded up to whole items.
        generations = values["num_generations"]
        values["rollout_buffer_size"] = -(-values["rollout_buffer_size"] // generations) * generations
        if self.rl_algorithm == "maac":
            for name in MAAC_UNUSED_FIELDS:
                values.pop(name)
            hidden = values.pop("critic_value_head_hidden_dim")
            check_hidden_dim(hidden, "critic_value_head_hidden_dim")
            config = MAACConfig(**values, **self._trl_settings())
            config.critic_value_head_hidden_dim = hidden  # CoMLRL's MAAC reads it from model_config; see the docs
            return config
        return IACConfig(**values, **self._trl_settings())

    def _trl_settings(self) -> dict[str, Any]:
        names = {f.name for f in dataclass_fields(self)}
        return {name: getattr(self, name) for name in SHARED_TRL_FIELDS if name in names}


class MARLHFStage(RewardModelStage):
    """The reward-model stage as CoMLRL's MARLHF runs it, on whichever CoMLRL-layer trainer follows it in the bases:
    `train()` takes CoMLRL's checkpoint arguments and runs the stage (or restores the reward model from the checkpoint
    resumed) before the one `Trainer.train`."""

    def train(
        self,
        resume_from_checkpoint: str | bool | None = None,
        checkpoint_dir: str | None = None,
        checkpoint_interval: int = 1,
        checkpoint_total_limit: int | None = None,
        **kwargs,
    ):
        """Pairs, reward model, online training (docs/preference.md's steps 1-3), with CoMLRL's checkpoint
        arguments. Resuming from a checkpoint that holds `reward_model/` skips steps 1 and 2."""
        if self.train_dataset is not None:
            self.prepare_online_reward(resume_from_checkpoint or self.pending_checkpoint, checkpoint_dir)
        return super().train(
            resume_from_checkpoint, checkpoint_dir, checkpoint_interval, checkpoint_total_limit, **kwargs
        )


class MARLHFTrainer(MARLHFStage, MAGRPOTrainer):
    """Multi-agent RLHF with CoMLRL 1.4.3's `MARLHFTrainer` arguments, in its order: `MAGRPOTrainer`'s (`reward_func`,
    with `reward_processor`, is the task reward: it ranks the preference candidates and scores evaluation), then
    `centralized_comparator_adapter` (CoMLRL's, checked in either mode, used with `collaboration_mode="centralized"`),
    `metrics_callback`, `critic_model` and `critics` (the actor-critic back-ends': IAC one critic per agent, MAAC one;
    without them `critic_model_name`, else the agents' model), and beyond CoMLRL `reward_model` (a `JointRewardModel`
    to train instead of loading `args.reward_model_name`). After `train()`: `reward_model`, `preference_pairs`,
    `reward_model_history`. With `rl_algorithm="iac"`/`"maac"` the trainer built is a `MARLHFIACTrainer`/
    `MARLHFMAACTrainer` (the stage on the IAC/MAAC translation). docs/preference.md has the steps and the differences
    from CoMLRL.
    """

    default_config_cls = config_family = MARLHFConfig
    algorithm_name = "MARLHF"

    def __new__(cls, *args, **kwargs):
        # CoMLRL's one MARLHFTrainer trains either family online: the actor-critic back-ends are their own trainer
        # (the stage on IAC/MAAC), built here from the same arguments.
        config = MARLHF_SIGNATURE.bind_partial(None, *args, **kwargs).arguments.get("args")
        algorithm = getattr(config, "rl_algorithm", None) if isinstance(config, MARLHFConfig) else None
        if cls is MARLHFTrainer and algorithm in ACTOR_CRITIC_ALGORITHMS:
            return (MARLHFMAACTrainer if algorithm == "maac" else MARLHFIACTrainer)(*args, **kwargs)
        return super().__new__(cls)

    def __init__(
        self, *args, centralized_comparator_adapter=None, reward_model: JointRewardModel | None = None, **kwargs
    ):
        self.centralized_comparator_adapter = comparator_adapter(centralized_comparator_adapter)
        for name in ("metrics_callback", "critic_model", "critics"):
            if kwargs.pop(name, None) is not None:
                raise ValueError(
                    f"`{name}` serves MARLHF's actor-critic back-ends (`rl_algorithm='iac'`/`'maac'`); this trainer "
                    f"runs the MAGRPO family: drop `{name}` or set `rl_algorithm='iac'` or `'maac'`."
                )
        super().__init__(*args, **kwargs)
        self.setup_reward_model(reward_model, None, self.model_name)

    __init__.__signature__ = with_keywords(
        MAGRPOTrainer.__init__,
        "centralized_comparator_adapter", "metrics_callback", "critic_model", "critics", "reward_model",
    )  # fmt: skip


class MARLHFActorCriticStage(MARLHFStage):
    """`MARLHFTrainer` with `rl_algorithm="iac"`/`"maac"`: the reward-model stage on the IAC/MAAC translation (as the
    native `ActorCriticRLHFTrainer` is on `ActorCriticTrainer`), one trainer. It takes `MARLHFTrainer`'s arguments,
    with CoMLRL's checks; `args` becomes `args.actor_critic_config()` with the reward-model stage's fields (the
    `MARLHFConfig` given stays as `marlhf_config`). The preference candidates are ranked as CoMLRL's MARLHF ranks them
    (the task reward called once per joint sample, then `reward_processor`); checkpoints hold the critics and the
    reward model, and `train(resume_from_checkpoint=...)` restores both."""

    def __init__(self, *args, **kwargs):
        given = MARLHF_SIGNATURE.bind(self, *args, **kwargs)
        given.apply_defaults()
        arguments = given.arguments
        config = self.marlhf_config = expected_config(arguments["args"], MARLHFConfig, MARLHFConfig, "MARLHFTrainer")
        self.centralized_comparator_adapter = comparator_adapter(arguments["centralized_comparator_adapter"])
        kwargs = arguments["kwargs"]
        for name in ("eval_logger", "eval_aggregator", "peft_config"):
            if arguments.get(name, kwargs.get(name)) is not None:
                raise NotImplementedError(
                    f"`{name}` is not supported with `rl_algorithm={config.rl_algorithm!r}` (the online actor-critic "
                    f"trainer does not take it): drop `{name}` or use `rl_algorithm` in {list(RL_ALGORITHMS)}."
                )
        agent_model, agents, tokenizer = arguments["agent_model"], arguments["agents"], arguments["tokenizer"]
        agents = list(agents) if agents is not None else None
        count = len(agents) if agents is not None else arguments["num_agents"]
        source = agent_model if agent_model is not None else _model_name(agents[0] if agents else None)
        critic_model, critics = _critic_sources(config, arguments["critic_model"], arguments["critics"], count, source)
        if agents is not None and tokenizer is None:  # CoMLRL's MARLHF loads the agents' own (its IAC would refuse)
            tokenizer = [AutoTokenizer.from_pretrained(str(_model_name(agent))) for agent in agents]
        online_args = config.actor_critic_config(num_agents=count)
        for name in REWARD_STAGE_FIELDS:  # what the reward-model stage reads off `args`
            setattr(online_args, name, getattr(config, name))
        super().__init__(
            **{name: arguments[name] for name in SHARED_ARGUMENTS},
            agents=agents,
            tokenizer=tokenizer,
            args=online_args,
            critic_model=critic_model,
            critics=critics,
            **kwargs,
        )
        # CoMLRL's MARLHF ranks the candidates by its MAGRPO host's reward: one call per joint sample, processed.
        task_reward = bind_reward(arguments["reward_func"], self.num_agents, per_sample=True)
        self.ranking_reward = (task_reward, arguments["reward_processor"])
        self.setup_reward_model(arguments["reward_model"], None, source)

    def train_reward_stage(self) -> None:
        """The stage, with the candidates ranked by `ranking_reward` (the online trainer scores items, not samples)."""
        with self.scored_by(*self.ranking_reward):
            super().train_reward_stage()


# `MARLHFTrainer`'s arguments (`MARLHFActorCriticStage` takes them too); those the IAC/MAAC port takes as they are.
MARLHF_SIGNATURE = inspect.signature(MARLHFTrainer.__init__)
SHARED_ARGUMENTS = (
    "agent_model", "model_config", "train_dataset", "eval_dataset", "reward_func", "reward_processor", "formatters",
    "external_transition", "wandb_config", "metrics_callback",
)  # fmt: skip


class MARLHFIACTrainer(MARLHFActorCriticStage, IACTrainer):
    """`MARLHFTrainer(args=MARLHFConfig(rl_algorithm="iac"))`: independent critics (`MARLHFActorCriticStage`)."""


class MARLHFMAACTrainer(MARLHFActorCriticStage, MAACTrainer):
    """`MARLHFTrainer(args=MARLHFConfig(rl_algorithm="maac"))`: one joint critic (`MARLHFActorCriticStage`)."""


def _model_name(agent) -> str | None:
    """An agent's model id or path: the one given, or a model's `name_or_path`."""
    if agent is None or isinstance(agent, (str, os.PathLike)):
        return agent
    return getattr(getattr(agent, "config", None), "name_or_path", None)


def _critic_sources(args: MARLHFConfig, critic_model, critics, num_agents: int, agents_model) -> tuple[Any, Any]:
    """`(critic_model, critics)` for the online trainer, with CoMLRL's checks, as CoMLRL resolves them: `critics`,
    else `critic_model`, else `critic_model_name`, else the agents' model; `(None, None)` for value heads."""
    if critics is not None or (args.rl_algorithm == "iac" and not args.use_separate_critic):
        # The translation checks them (`actor_critic.critic_sources`): one per critic, or none for value heads.
        return (critic_model if critics is None else None), critics
    source = critic_model or args.critic_model_name or agents_model
    if source is None or (isinstance(source, torch.nn.Module) and args.rl_algorithm == "iac"):
        raise ValueError(
            "MARLHF with an actor-critic back-end needs the critics' model: set `critic_model_name` (a model id "
            "or path), or pass `critic_model=` (an id or path) or `critics=[...]` (models)."
        )
    if critic_model is None and isinstance(source, (str, os.PathLike)):  # the online trainer names `critic_model`
        model_config_of(source, "critic_model_name" if args.critic_model_name else "agent_model")
    return source, None


__all__ = ["MARLHFConfig", "MARLHFTrainer"]
