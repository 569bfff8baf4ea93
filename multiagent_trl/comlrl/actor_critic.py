"""CoMLRL 1.4.3's `IACConfig`/`IACTrainer` and `MAACConfig`/`MAACTrainer` translated onto `ActorCriticConfig`/
`ActorCriticTrainer`; `docs/comlrl-users.md` maps every name, `docs/actor-critic.md` lists CoMLRL's numbers kept."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from ..actor_critic.config import ActorCriticConfig, check_hidden_dim
from ..actor_critic.critic_sources import critic_sources
from ..actor_critic.samples import RolloutSample
from ..actor_critic.trainer import ActorCriticTrainer
from ..actor_critic.value_model import (
    VALUE_HEAD_FILE,
    CausalLMWithValueHead,
    as_critic,
    critic_load_kwargs,
    split_value_model,
)
from ..rewards.items import item_reward
from ..rewards.joint import bind_reward
from ..rollout.turns import FormattedTransition, first_turn_formatters, listed_formatters
from ..team.placement import resolve_devices
from .behaviour import CoMLRLBehaviour, agent_sources, apply_model_config, decay_every_parameter
from .fields import (
    CoMLRLOptimization,
    CoMLRLShared,
    buffer_steps,
    check_fields,
    check_parallel,
    comlrl_config,
    confirm_devices,
    map_shared,
)

# `model_config` keys the actor-critic trainers read beside MAGRPO's.
CRITIC_MODEL_CONFIG_KEYS = ("critic_model_kwargs", "critic_value_head_hidden_dim")


@comlrl_config("IACConfig")
@dataclass
class _ActorCriticFields(CoMLRLOptimization, CoMLRLShared, ActorCriticConfig):
    """The fields IAC and MAAC share, with CoMLRL 1.4.3's defaults, and their mapping onto the core."""

    output_dir: str | None = "ac_output"
    loss_type: str = field(default="luspo", metadata={"help": "'luspo' at ratio 1: CoMLRL's mean(-logp * A)."})
    disable_dropout: bool = field(default=True, metadata={"help": "No dropout (CoMLRL's models stay in eval mode)."})
    critic_learning_rate: float | None = 5e-6
    rollout_buffer_size: int = 8
    value_loss_coef: float = 0.6
    advantage_normalization: bool = True
    top_k: int | None = None
    num_train_epochs: float = 40
    critic_type: str = "v"
    num_turns: int = 2
    critic_devices: list[str] | None = None
    discount: float = 1.0
    num_generations: int | None = 1
    early_termination_threshold: float | None = -0.2
    logging_steps: float = 1
    ended_return: str = field(default="reward", metadata={"help": "A last turn's target is its reward (CoMLRL)."})
    value_normalization: bool = field(default=False, metadata={"help": "Standardized value targets (CoMLRL: no)."})
    reference_kl_enabled: bool = False
    reference_kl_coef: float = 0.1
    reference_devices: list[str] | None = None

    def __post_init__(self):
        check_fields(self, "IACConfig")
        check_parallel(self, "agent_devices", *(("critic_devices",) if self._separate_critics() else ()))
        if self.num_turns > 1 and self.num_generations != 1:
            raise ValueError(
                f"Multi-turn actor-critic continues one completion per prompt: set `num_generations=1` (got "
                f"{self.num_generations}) with `num_turns={self.num_turns}`."
            )
        if self.reference_kl_enabled:
            raise NotImplementedError(
                "`reference_kl_enabled=True` (CoMLRL's reward shaping by the KL to the initial policy) is not "
                "supported here. Use `beta=<coefficient>` for TRL's KL penalty in the loss instead, or leave it off."
            )
        if self.critic_learning_rate is None:
            self.critic_learning_rate = self.agent_learning_rate
        # A buffer is one generation batch per agent: `rollout_buffer_size` rows, split into optimizer steps of
        # `train_batch_size` rows (per_device_train_batch_size x steps_per_generation).
        if self.rollout_buffer_size % self.num_generations != 0:
            raise ValueError(
                f"`rollout_buffer_size={self.rollout_buffer_size}` must be a multiple of `num_generations="
                f"{self.num_generations}`: here a buffer holds every completion of its prompts (CoMLRL overfills it)."
            )
        buffer, per_step = buffer_steps(self)
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
        critic_spec = self.critic_devices
        given = map_shared(self, {"agent_devices": self.num_agents, "reference_devices": 0})
        if self.parallel_training == "mp" and self.critic_kind == "model":  # heads live on their agents
            count = 1 if self.joint_critic else self.num_agents
            self.critic_devices = resolve_devices(critic_spec or self.agent_devices, count, "critic_devices")
        else:
            self.critic_devices = None
        super().__post_init__()
        confirm_devices(self, {"agent_devices": given["agent_devices"], "critic_devices": critic_spec})

    def _separate_critics(self) -> bool:
        return not self.joint_critic


@comlrl_config("IACConfig")
@dataclass
class IACConfig(_ActorCriticFields):
    """`ActorCriticConfig` accepting every field of CoMLRL 1.4.3's `IACConfig`, with its defaults and checks (the
    table `fields.FAMILIES["IACConfig"]`, rendered in `docs/comlrl-users.md`)."""

    output_dir: str | None = "iac_output"
    value_clip_range: float | None = 0.2
    use_separate_critic: bool = True
    critic_value_head_hidden_dim: int | None = None
    value_head_hidden_dim: int | None = None

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
    """`ActorCriticConfig` accepting every field of CoMLRL 1.4.3's `MAACConfig`: `IACConfig`'s without
    `use_separate_critic` and the value-head widths, one joint critic for the team (`joint_critic=True`)."""

    output_dir: str | None = "maac_output"
    critic_learning_rate: float = 5e-6
    joint_critic: bool = True

    def __post_init__(self):
        if not self.joint_critic:
            raise ValueError("MAACConfig trains one joint critic: `joint_critic` must stay True (use IACConfig).")
        super().__post_init__()


# ---------------------------------------------------------------------------------------------------- trainers


class _CoMLRLActorCritic(CoMLRLBehaviour, ActorCriticTrainer):
    """What IAC and MAAC share: CoMLRL's constructor arguments, calls and logging on top of `ActorCriticTrainer`."""

    default_config_cls: type[_ActorCriticFields] = IACConfig
    config_family: type[_ActorCriticFields] = IACConfig
    algorithm_name = "IAC"
    logprob_temperature = 1.0  # CoMLRL scores the actor's log-probabilities at temperature 1
    reinforce_each_step = True  # one policy-gradient pass per buffer, no importance ratio (CoMLRL's update)
    one_turn_keys = ("turn_1/reward_mean", "turn_1/expected_return")
    comlrl_log_modes = ("train", "eval")
    get_decay_parameter_names = decay_every_parameter  # CoMLRL's AdamW decays every parameter

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
        args = self.comlrl_args(args)
        # CoMLRL's checks, in its order.
        if reward_func is None or not callable(reward_func):
            raise ValueError("reward_func must be a callable.")
        if agent_model is None and agents is None:
            raise ValueError("Either agent_model or agents must be provided.")
        count = len(agents) if agents is not None else args.num_agents
        critic_sources = self._critic_sources(args, critic_model, critics, count)
        if agents is None and args.num_agents > 1 and isinstance(agent_model, (PreTrainedModel, torch.nn.Module)):
            raise ValueError(
                f"Multi-agent {self.algorithm_name} requires `agent_model` to be a pretrained identifier string."
            )
        if agents is not None and tokenizer is None:
            raise ValueError("Tokenizer must be provided when using agents.")
        if args.num_turns > 1 and external_transition is None:
            raise ValueError(f"Multi-turn {self.algorithm_name} requires an external_transition.")

        # The agents (a `CausalLMWithValueHead` among them: the native trainer trains its LM and starts from its head).
        if isinstance(agent_model, torch.nn.Module):  # one agent given as a model (CoMLRL allows it for one)
            model = agent_model
            args.num_agents = 1
        else:
            model = agent_sources(agent_model, agents, args.num_agents)
        if isinstance(model, list):
            args.num_agents = len(model)

        config = dict(model_config or {})
        critic_config = {key: config.pop(key) for key in CRITIC_MODEL_CONFIG_KEYS if key in config}
        model, tokenizer = apply_model_config(model, tokenizer, config, args, kwargs)
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
        critic_models = None
        if critic_sources is not None:
            load_kwargs = critic_load_kwargs(config, critic_config.get("critic_model_kwargs"))
            setting = "critic_model" if critics is None else "critics"
            critic_models = [
                as_critic(s, args.critic_value_head_hidden_dim, load_kwargs, setting) for s in critic_sources
            ]

        self.metrics_callback = metrics_callback  # CoMLRL's name of `rollout_metrics`
        given_formatters = formatters
        formatters = first_turn_formatters(formatters, args.num_agents)
        reward = item_reward(reward_func, reward_processor, args.num_agents, args.num_generations)
        self._item_reward_parts = (reward_func, reward_processor)  # evaluation's items hold one completion each
        if self.joint_tokenizer_from_agent and kwargs.get("critic_processing_class") is None:
            kwargs["critic_processing_class"] = _first_tokenizer(tokenizer, model)
        train_dataset = self.comlrl_setup(args, wandb_config, eval_dataset, train_dataset, kwargs)
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
            rollout_metrics=metrics_callback,
            **kwargs,
        )
        if external_transition is not None:  # CoMLRL's actor-critic prompts for the later turns
            listed = None
            if given_formatters is not None and not args.external_prompt_passthrough:
                listed = listed_formatters(given_formatters, args.num_agents)
            self.set_transition(FormattedTransition(external_transition, None, True, listed))
        self.comlrl_finish()

    joint_tokenizer_from_agent = False  # MAAC: the joint critic reads text tokenized with agent 0's tokenizer

    # ------------------------------------------------------------------ CoMLRL's critics

    def _critic_sources(self, args, critic_model, critics, count: int) -> list | None:
        """The critics' sources (`critic_model` repeated per critic, or `critics`), or `None` (value heads)."""
        if not args.joint_critic and not args.use_separate_critic:
            if critics is not None or critic_model is not None:
                raise ValueError("critics can only be provided when use_separate_critic=True.")
            return None
        if critic_model is None and critics is None:
            if args.joint_critic:
                raise ValueError("MAAC requires a critic: pass `critic_model=` (or `critics=[model]`).")
            raise ValueError("Either critic_model or critics must be provided when use_separate_critic=True.")
        joint = args.joint_critic
        return critic_sources(1 if joint else count, critic_model, critics, joint=joint)

    # ------------------------------------------------------------------ what CoMLRL reports per item

    def _generate_and_score_completions(self, inputs: list[dict]) -> dict[str, Any]:
        if self.model.training or self.num_generations_eval == self.num_generations:
            return super()._generate_and_score_completions(inputs)
        # Evaluation samples `num_generations_eval` (1) completions per item: the reward groups them so.
        func, processor = self._item_reward_parts
        reward = item_reward(func, processor, self.num_agents, self.num_generations_eval)
        with self._swap(reward_funcs=[bind_reward(reward, self.num_agents)]):
            return super()._generate_and_score_completions(inputs)


class IACTrainer(_CoMLRLActorCritic):
    """Independent actor-critic with CoMLRL 1.4.3's `IACTrainer` arguments, in its order (the table in
    `docs/comlrl-users.md`): a critic per agent, a separate model (`use_separate_critic=True`) or a value head on the
    agent. `save_model(dir)` writes CoMLRL's layout: `dir/agent_i/` with `agent_i/critic/`; with one agent, the
    agent in `dir/` and its critic in `dir/critic/` (or `dir/value_head.pt`)."""

    default_config_cls = config_family = IACConfig
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
    """Multi-agent actor-critic with one joint critic and CoMLRL 1.4.3's `MAACTrainer` arguments (`IACTrainer`'s;
    `critics` holds one model); the critic reads the agents' text tokenized with agent 0's tokenizer."""

    default_config_cls = config_family = MAACConfig
    algorithm_name = "MAAC"
    joint_tokenizer_from_agent = True


# ---------------------------------------------------------------------------------------------------- helpers


def _first_tokenizer(tokenizer, model):
    """Agent 0's tokenizer: the one given, or loaded from agent 0's id or path."""
    if tokenizer is not None:
        return tokenizer[0] if isinstance(tokenizer, (list, tuple)) else tokenizer
    source = split_value_model(model[0] if isinstance(model, list) else model)[0]
    if isinstance(source, torch.nn.Module):
        source = source.config.name_or_path
    return AutoTokenizer.from_pretrained(str(source))


__all__ = ["IACConfig", "IACTrainer", "MAACConfig", "MAACTrainer", "RolloutSample", "item_reward"]
