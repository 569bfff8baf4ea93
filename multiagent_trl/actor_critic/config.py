"""`ActorCriticConfig`: `MultiAgentGRPOConfig` plus the critic's fields, for `ActorCriticTrainer` (IAC and MAAC)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..config import MultiAgentGRPOConfig
from ..team.placement import check_devices, resolve_devices

CRITIC_TYPES = ("v", "q")
CRITIC_KINDS = ("model", "head", "adapter")


def check_hidden_dim(value: int | None, name: str) -> None:
    """Raise a `ValueError` naming the setting `name` unless `value` is a value head's hidden width: a positive
    integer, or `None` for no hidden layer. (CoMLRL reads 0 and negative widths as `None`: say `None`.)"""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(
            f"`{name}` must be a positive width (a hidden `Linear -> Tanh` layer in the value head) or None (one "
            f"linear layer); got {value!r}. CoMLRL reads 0 or a negative width as None: write None."
        )


@dataclass
class ActorCriticConfig(MultiAgentGRPOConfig):
    r"""
    Configuration for `ActorCriticTrainer`: every `MultiAgentGRPOConfig` field, plus the critic's.

    Each agent's advantage is `y - V_old`: the reward its completion is credited with (the target y), minus a learned
    critic's value of it computed when the completion was generated. The critic is trained on the same targets with a
    squared error; the actor on the advantages with TRL's GRPO loss (any `loss_type`, clipping, `beta`,
    `num_iterations`). GRPO's group baseline is not used, so one completion per prompt (`num_generations=1`) works.

    Parameters:
        critic_type (`str`, *optional*, defaults to `"v"`):
            What the critic estimates. Allowed values (case-insensitive): `"v"`, V(prompt), read at the last prompt
            token, the same for every completion of a prompt; `"q"`, Q(prompt, completion), read at the completion's
            last token.
        joint_critic (`bool`, *optional*, defaults to `False`):
            `False` (IAC): one critic per agent, reading that agent's prompt and completion tokens. `True` (MAAC): one
            critic for the team, reading a text of every agent's prompt (and, for `"q"`, every agent's completion;
            `estimators.joint_critic_text`), tokenized with the critic's tokenizer.
        critic_kind (`str`, *optional*, defaults to `"model"`):
            Where a critic lives. Allowed values: `"model"`, a separate causal LM with a value head (the trainer's
            `critic_model`, by default a copy of the agent's starting model); `"head"`, a value head on the agent's
            own model (the value loss trains the agent's weights too; not with `joint_critic`); `"adapter"`, a LoRA
            adapter with a value head on a LoRA team's shared base (one base in memory for actors and critics).
        critic_learning_rate (`float` or `None`, *optional*, defaults to `None`):
            Learning rate of the critics' parameter groups (they follow the same schedule as the agents'). `None`
            uses `learning_rate`.
        value_loss_coef (`float`, *optional*, defaults to `1.0`):
            Weight of the value loss `mean((y - v)^2)`. With a separate critic under Adam it barely matters; with
            `critic_kind="head"` it weighs the value loss against the policy loss in the agent's weights.
        value_clip_range (`float` or `None`, *optional*, defaults to `None`):
            Clip the value loss around the rollout-time value (PPO's pessimistic clipped error): the critic's value
            counts as at most this far from `V_old`. `None` does not clip.
        critic_value_head_hidden_dim (`int` or `None`, *optional*, defaults to `None`):
            Width of a hidden `Linear -> Tanh` layer in each new value head; `None`: one linear layer.
        advantage_normalization (`bool`, *optional*, defaults to `True`):
            Standardize each agent's advantages over its completions of the whole generation batch (gathered across
            processes; population std, at least 1e-6). `False` keeps `y - V_old`.
        value_normalization (`bool`, *optional*, defaults to `True`):
            Each critic learns its targets standardized by running statistics of the targets (moving averages of
            their mean and square, `actor_critic.value_norm.ValueNormalizer`), and its outputs are read back in the
            reward's scale for the advantages and TD targets: the critic keeps up whatever the reward's scale. The
            statistics are saved with each checkpoint (`value_norm.pt`). On by default: without it IAC and MAAC climb
            and fall again on the tutorial task (docs/actor-critic.md); `False` is CoMLRL's critic (its layer's
            default).
        critic_devices (`list[str]` or `None`, *optional*, defaults to `None`):
            With `agent_devices` (one process, each agent on its own device) and `critic_kind="model"`: one device per
            critic (per agent, or one for a joint critic), where the trainer puts it, in `agent_devices`' forms (one
            device for all, or `"auto"`, too). `None`: each critic on its agent's device (a joint critic on agent 0's).

    Multi-turn episodes (`num_turns > 1`, with the trainer's `external_transition`): each turn's target is the TD(0)
    target `r_t + discount * V_old(t + 1)` (the last turn played: its return), advantages are standardized per turn,
    and an episode continues one completion per prompt (`num_generations=1`). `rollout` defaults to `"linear"` here.

    > [!NOTE]
    > `scale_rewards`, `advantage_baseline` and `joint_mode` have no effect on the advantages here (the critic's
    > replace GRPO's); `joint_mode` must be `"aligned"`.
    """

    rollout: str = field(
        default="linear",
        metadata={"help": "Multi-turn rollout shape ('linear': a trajectory per completion, as actor-critic needs)."},
    )
    critic_type: str = field(
        default="v",
        metadata={
            "help": "What the critic estimates: 'v' (V(prompt), at the last prompt token) or 'q' (Q(prompt, "
            "completion), at the last completion token).",
            "choices": list(CRITIC_TYPES),
        },
    )
    joint_critic: bool = field(
        default=False,
        metadata={"help": "One critic for the team reading every agent's prompt (and completion for 'q'): MAAC."},
    )
    critic_kind: str = field(
        default="model",
        metadata={
            "help": "'model' (a separate LM with a value head), 'head' (a value head on the agent's own model) or "
            "'adapter' (a LoRA adapter with a value head on a LoRA team's shared base).",
            "choices": list(CRITIC_KINDS),
        },
    )
    critic_learning_rate: float | None = field(
        default=None, metadata={"help": "Learning rate of the critics; None uses learning_rate."}
    )
    value_loss_coef: float = field(default=1.0, metadata={"help": "Weight of the value loss mean((y - v)^2)."})
    value_clip_range: float | None = field(
        default=None, metadata={"help": "Clip the value loss around the rollout-time value; None: no clipping."}
    )
    critic_value_head_hidden_dim: int | None = field(
        default=None, metadata={"help": "Hidden width of new value heads (Linear -> Tanh -> Linear); None: Linear."}
    )
    advantage_normalization: bool = field(
        default=True,
        metadata={"help": "Standardize each agent's advantages over the generation batch (population std)."},
    )
    value_normalization: bool = field(
        default=True,
        metadata={"help": "Critics learn value targets standardized by running statistics (MAPPO's ValueNorm)."},
    )
    critic_devices: list[str] | None = field(
        default=None,
        metadata={"help": "With agent_devices and critic_kind='model': one device per critic; None: its agent's."},
    )

    def __post_init__(self):
        self.critic_type = str(self.critic_type).lower()
        if self.critic_type not in CRITIC_TYPES:
            raise ValueError(
                f"`critic_type` must be 'v' (V(prompt)) or 'q' (Q(prompt, completion)), got {self.critic_type!r}."
            )
        if self.critic_kind not in CRITIC_KINDS:
            raise ValueError(f"`critic_kind` must be one of {CRITIC_KINDS}, got {self.critic_kind!r}.")
        if self.joint_critic and self.critic_kind == "head":
            raise ValueError(
                "`joint_critic=True` reads every agent's text, which no single agent's model does: set "
                "`critic_kind='model'` (a separate critic model) or `'adapter'` (a LoRA team's critic adapter)."
            )
        if self.value_loss_coef < 0:
            raise ValueError(f"`value_loss_coef` must be >= 0, got {self.value_loss_coef}.")
        if self.value_clip_range is not None and self.value_clip_range <= 0:
            raise ValueError(f"`value_clip_range` must be positive or None, got {self.value_clip_range}.")
        if self.critic_learning_rate is not None and self.critic_learning_rate < 0:
            raise ValueError(f"`critic_learning_rate` must be >= 0 or None, got {self.critic_learning_rate}.")
        check_hidden_dim(self.critic_value_head_hidden_dim, "critic_value_head_hidden_dim")
        if self.num_generations is not None and self.num_generations < 1:
            raise ValueError(f"`num_generations` must be at least 1, got {self.num_generations}.")
        if self.num_turns > 1 and self.num_generations not in (None, 1):
            raise ValueError(
                f"A multi-turn actor-critic episode continues one completion per prompt (TD targets bootstrap from "
                f"its next turn): set `num_generations=1` (got {self.num_generations}), or `num_turns=1`."
            )
        if self.joint_mode != "aligned":
            raise ValueError(
                "The actor-critic trainers score aligned joint samples only (the critic's target is each joint "
                f"sample's reward): set `joint_mode='aligned'` (got {self.joint_mode!r})."
            )
        one_completion = self.num_generations == 1
        if one_completion:
            # GRPO's configs refuse a group of one (its advantage compares the completions of a prompt); a critic's
            # baseline needs no group. Run their checks as for G=2 on twice the rows (the same prompts per batch),
            # then restore the sizes: every count they derive is then the one for G=1.
            saved = (self.per_device_train_batch_size, self.generation_batch_size, self.num_generations_eval)
            self.num_generations = 2
            self.per_device_train_batch_size *= 2
            if self.generation_batch_size is not None:
                self.generation_batch_size *= 2
            if self.num_generations_eval is None:
                self.num_generations_eval = 1  # evaluation keeps one completion per prompt
        try:
            super().__post_init__()
        finally:
            if one_completion:
                self.num_generations = 1
                self.per_device_train_batch_size, generation_batch_size, self.num_generations_eval = saved
                if generation_batch_size is not None:
                    self.generation_batch_size = generation_batch_size
                elif self.steps_per_generation is not None:
                    self.generation_batch_size = (
                        self.per_device_train_batch_size * self.world_size * self.steps_per_generation
                    )
        if self.critic_devices is not None:
            if self.agent_devices is None or self.critic_kind != "model":
                raise ValueError(
                    "`critic_devices` places separate critic models beside agents placed by `agent_devices`: set "
                    "`agent_devices` and `critic_kind='model'`, or leave `critic_devices` unset (value heads and "
                    "adapters live on their agents)."
                )
            count = 1 if self.joint_critic else self.num_agents
            check_devices(self.critic_devices, "critic_devices", count, self.world_size)
            if count is not None:  # one device per critic, from `agent_devices`' forms
                self.critic_devices = resolve_devices(self.critic_devices, count, "critic_devices")

    @property
    def critic_lr(self) -> float:
        """The critics' learning rate: `critic_learning_rate`, or `learning_rate` when it is `None`."""
        return self.learning_rate if self.critic_learning_rate is None else self.critic_learning_rate
