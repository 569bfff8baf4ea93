"""CoMLRL compatibility for the actor-critic family: `IACConfig`/`IACTrainer` and `MAACConfig`/`MAACTrainer` with
CoMLRL 1.4.3's names, arguments, defaults and checks, translated onto `ActorCriticConfig` and `ActorCriticTrainer`.

A CoMLRL actor-critic script runs with only its import line changed:

```diff
-from comlrl.trainers.actor_critic import IACConfig, IACTrainer
+from multiagent_trl import IACConfig, IACTrainer
```

Every CoMLRL field is mapped onto the core (`fields.FAMILIES["IACConfig"]`), or raises naming itself where the core
has no counterpart yet. CoMLRL's numbers are kept where they are the algorithm; `docs/actor-critic.md` lists them
and the quirks deliberately not replicated.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from ..actor_critic.config import ActorCriticConfig, check_hidden_dim
from ..actor_critic.samples import RolloutSample, episode_samples
from ..actor_critic.trainer import ActorCriticTrainer
from ..actor_critic.value_model import VALUE_HEAD_FILE, CausalLMWithValueHead, as_critic, critic_load_kwargs
from ..rewards.items import item_reward
from ..rewards.joint import bind_reward
from ..rollout.turns import FormattedTransition, first_turn_formatters, listed_formatters
from .behaviour import CoMLRLBehaviour, agent_sources, apply_model_config, decay_every_parameter
from .fields import (
    CoMLRLOptimization,
    check_accelerate_device,
    check_fields,
    check_parallel,
    comlrl_batch_sizes,
    device_list,
    map_evaluation,
)

# `model_config` keys the actor-critic trainers read beside MAGRPO's.
CRITIC_MODEL_CONFIG_KEYS = ("critic_model_kwargs", "critic_value_head_hidden_dim")


@comlrl_batch_sizes
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
        map_evaluation(self)
        specs = {"agent_devices": self.agent_devices, "critic_devices": self.critic_devices}
        if self.parallel_training == "mp":
            self.agent_devices = device_list(self.agent_devices, self.num_agents, "agent_devices")
            count = self.num_agents if self._separate_critics() else 1
            self.critic_devices = device_list(self.critic_devices or self.agent_devices, count, "critic_devices")
        else:
            self.agent_devices = self.critic_devices = None
        self.reference_devices = None  # only read with reference_kl_enabled, which raises
        super().__post_init__()
        if self.parallel_training == "none":
            for name, spec in specs.items():
                check_accelerate_device(name, spec, self.device)

    def _separate_critics(self) -> bool:
        return not self.joint_critic


@dataclass
class IACConfig(_ActorCriticFields):
    r"""
    `ActorCriticConfig` accepting every field of CoMLRL 1.4.3's `IACConfig`, with its defaults and checks: the table
    `fields.FAMILIES["IACConfig"]` (rendered with notes in `docs/comlrl-users.md`), and below.

    Parameters:
        use_separate_critic (`bool`, *optional*, defaults to `True`):
            `True`: a critic model per agent (`critic_kind="model"`); `False`: a value head on each agent
            (`critic_kind="head"`, trained at the agent's learning rate, as in CoMLRL).
        value_clip_range (`float` or `None`, *optional*, defaults to `0.2`):
            Clips the value loss of a value head on the agent only, as CoMLRL (kept in `comlrl_value_clip_range`).
        critic_value_head_hidden_dim, value_head_hidden_dim (`int` or `None`, defaults to `None`):
            Hidden width of the separate critics' heads, and of the heads on the agents.

    With `num_turns > 1` a buffer holds `rollout_buffer_size // num_turns` episodes (CoMLRL's buffer counts every
    turn's sample). Settings kept from CoMLRL for its numbers: `optim="adamw_torch"`, `weight_decay=0.01` (on every
    parameter), `lr_scheduler_type="constant"`, `max_grad_norm=0.0`, `loss_type="luspo"`, `shuffle_dataset=False`,
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


# ---------------------------------------------------------------------------------------------------- trainers


class _CoMLRLActorCritic(CoMLRLBehaviour, ActorCriticTrainer):
    """What IAC and MAAC share: CoMLRL's constructor arguments, calls and logging on top of `ActorCriticTrainer`."""

    default_config_cls: type[_ActorCriticFields] = IACConfig
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
            model = agent_sources(agent_model, sources, args.num_agents)
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
        critic_sources = self._critic_sources(args, critic_model, critics)
        critic_models = None
        if critic_sources is not None:
            load_kwargs = critic_load_kwargs(config, critic_config.get("critic_model_kwargs"))
            setting = "critic_model" if critics is None else "critics"
            critic_models = [
                as_critic(s, args.critic_value_head_hidden_dim, load_kwargs, setting) for s in critic_sources
            ]

        self.metrics_callback = metrics_callback
        given_formatters = formatters
        formatters = first_turn_formatters(formatters, args.num_agents)
        reward = item_reward(reward_func, reward_processor, args.num_agents, args.num_generations)
        self._item_reward_parts = (reward_func, reward_processor)  # evaluation's items hold one completion each
        if self.joint_tokenizer_from_agent and kwargs.get("critic_processing_class") is None:
            kwargs["critic_processing_class"] = _first_tokenizer(tokenizer, model)
        train_dataset = self.comlrl_setup(args, wandb_config, eval_dataset, train_dataset, kwargs)
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
        if external_transition is not None:  # CoMLRL's actor-critic prompts for the later turns
            listed = None
            if given_formatters is not None and not args.external_prompt_passthrough:
                listed = listed_formatters(given_formatters, args.num_agents)
            self._transition = FormattedTransition(external_transition, None, True, listed)
        for i, state in heads.items():
            if args.critic_kind == "head":
                self.model.critics[i].value_head.load_state_dict(state)
        if args.parallel_training == "mp":
            for critic, device in zip(self.model.critics, args.critic_devices):
                critic.to(device)
        self.comlrl_finish()

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
        offset = self.accelerator.process_index * len(batch.agent_rows[0])
        for item in range(len(self._batch_rows) // width):
            samples = []
            for i, output in enumerate(outputs):
                for g in range(width):
                    samples += episode_samples(
                        i,
                        item * width + g,
                        g,
                        batch,
                        output,
                        self._batch_rows[item * width],
                        offset,
                        self.args.discount,
                    )
            metrics = self.metrics_callback(samples)
            for key, value in (metrics or {}).items():
                try:
                    self._metrics[mode][str(key)].append(float(value))
                except (TypeError, ValueError):
                    continue  # CoMLRL drops values that are not numbers


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


def _first_tokenizer(tokenizer, model):
    """Agent 0's tokenizer: the one given, or loaded from agent 0's id or path."""
    if tokenizer is not None:
        return tokenizer[0] if isinstance(tokenizer, (list, tuple)) else tokenizer
    source = model[0] if isinstance(model, list) else model
    if isinstance(source, torch.nn.Module):
        source = source.config.name_or_path
    return AutoTokenizer.from_pretrained(str(source))


__all__ = ["IACConfig", "IACTrainer", "MAACConfig", "MAACTrainer", "RolloutSample", "item_reward"]
