"""CoMLRL compatibility for MADPO: `MADPOConfig`/`MADPOTrainer` with CoMLRL 1.4.3's names, arguments, defaults and
checks, translated onto `MultiAgentDPOConfig` and `MultiAgentDPOTrainer`.

A CoMLRL MADPO script runs with only its import line changed:

```diff
-from comlrl.trainers.preference import MADPOConfig, MADPOTrainer
+from multiagent_trl import MADPOConfig, MADPOTrainer
```

Everything MAGRPO's port does for CoMLRL's arguments is reused (`reinforce.MAGRPOTrainer`): `agent_model` +
`num_agents` or `agents`, `tokenizer`, `model_config`, `wandb_config`, the reward called once per joint sample as
CoMLRL calls it (`reward_func([c_0], ..., [c_N-1], batch_items=[item])[0]`, then `reward_processor`), formatters,
`eval_logger`/`eval_aggregator`, `train(checkpoint_dir=..., checkpoint_interval=...)`, `evaluate(num_eval_samples)`
and `save_model` (`agent_i/`). CoMLRL's numbers are kept where they are the algorithm: the joint DPO loss with the
other agents' log-ratios detached and taken before the update, reference-free, log-probabilities at temperature 1,
CoMLRL's pair selection (strict reward order, stable ties, Python's `random` for `"random"`), AdamW with weight
decay 0.01 on every parameter, a constant learning rate, no gradient clipping, the dataset in order.

The deliberate differences from CoMLRL 1.4.3 (pairs drawn on-policy each generation batch, the last token scored,
no silent training on nothing, ...) are listed with their reasons in `docs/comlrl-users.md` (MADPO).

Centralized collaboration (`collaboration_mode="centralized"`, CoMLRL's): one model writes every role's output from one
joint prompt. As in CoMLRL, `centralized_comparator_adapter` (default `TaggedCentralizedComparatorAdapter()`, checked
in either mode) builds the joint prompt from the role formatters and splits each joint completion into the roles for
the reward (`rewards.centralized.CentralizedCollaboration`: a completion without any role's section is scored with
every role `""`); `num_agents` (constructor and config, which must agree) counts the roles, and the core trains one
agent on its joint completions: the pairs are ordered by the roles' joint reward, and the DPO loss is that model's
log-ratio alone. Every completion token is scored, the end token included, as CoMLRL's centralized log-probability
does (`drop_last_token=False`, the default, is its parity here; CoMLRL drops the last token only in the decentralized
mode). `eval_logger` receives the roles' outputs `[role][row][turn]`. The model saves as `agent_0/`. `trainer.args`
is the core's copy with `num_agents=1`; the role count is `trainer.num_roles`. The differences above hold in this mode
too (on-policy pairs per generation batch, in particular).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..preference.config import MultiAgentDPOConfig
from ..preference.trainer import DPO_TAG_NAMES, MultiAgentDPOTrainer
from ..rewards.centralized import CentralizedCollaboration, TaggedCentralizedComparatorAdapter, check_adapter
from ..rollout.evaluation import EvalTrajectories, role_trajectories
from .behaviour import centralized_team, decay_every_parameter, one_actor
from .fields import (
    CoMLRLOptimization,
    check_accelerate_device,
    check_fields,
    check_parallel,
    comlrl_batch_sizes,
    device_list,
    map_evaluation,
)
from .reinforce import MAGRPOTrainer

_one_actor = one_actor  # the name `marlhf` imports
logger = logging.getLogger(__name__)

# MAGRPO's fields that CoMLRL's MADPOConfig accepts and its MADPO never reads (single turn, no advantages, the W&B
# x-axis), with their defaults: accepted here too, with a warning when set to something else.
UNUSED_FIELDS = {
    "discount": 1.0,
    "early_termination_threshold": None,
    "external_prompt_passthrough": False,
    "advantage_normalization": True,
    "advantage_mode": "mean",
    "reference_kl_coef": 0.1,
    "reference_devices": None,
    "use_environment_step": True,
    "environment_steps_per_pair": 2,
}


@comlrl_batch_sizes
@dataclass
class MADPOConfig(CoMLRLOptimization, MultiAgentDPOConfig):
    r"""
    `MultiAgentDPOConfig` accepting every field of CoMLRL 1.4.3's `MADPOConfig`, with its defaults and checks.

    Parameters:
        agent_learning_rate (`float`, *optional*, defaults to `5e-6`): maps to `learning_rate`.
        max_new_tokens (`int`, *optional*, defaults to `256`): maps to `max_completion_length`.
        preference_num_candidates (`int`, *optional*, defaults to `80`):
            K, the joint candidates sampled per item (at least 2); maps to `num_generations`.
        preference_pairs_per_sample, pair_selection, dpo_beta (defaults `16`, `"reward_gap"`, `0.1`):
            As in `MultiAgentDPOConfig`.
        rollout_buffer_size (`int`, *optional*, defaults to `2`):
            Items per generation batch (each with K candidates per agent).
        train_batch_size (`int` or `None`, *optional*, defaults to `None`):
            Pairs per optimizer step (`None`: `rollout_buffer_size`); sets `steps_per_generation` (the MADPO
            differences in `docs/comlrl-users.md`, 4). Reading `config.train_batch_size` gives Trainer's property;
            CoMLRL's value is `config.comlrl_train_batch_size`.
        temperature, top_p, top_k (defaults `0.6`, `0.6`, `50`): sampling (`top_k=None`: no top-k filtering).
        num_train_epochs (`20`), num_agents (`2`), logging_steps (`50`): passes over the dataset, agents, log interval
            in optimizer steps.
        collaboration_mode (`str`, defaults to `"decentralized"`): `"centralized"`: one model writes every role
            (`num_agents` roles; see the module docstring). Per-agent settings (`agent_devices`) are the one model's.
        parallel_training (`"none"`), agent_devices (`None`): `"mp"` puts each agent on its own device.
        eval_interval (`16`), eval_num_samples (`4`), eval_batch_size (`1`):
            Evaluate every `eval_interval` optimizer steps and before training, on the first `eval_num_samples` rows,
            one completion each.
        num_turns, joint_mode (defaults `1`, `"aligned"`): must keep their defaults.
        discount, early_termination_threshold, external_prompt_passthrough (defaults `1.0`, `None`, `False`):
            MAGRPO's fields, accepted as CoMLRL accepts them; MADPO does not use them (a warning when one is set to
            another value). The same holds for `advantage_normalization` (`True`) and `advantage_mode` (`"mean"`).
        reference_kl_enabled (`False`; `True` raises), reference_kl_coef (`0.1`), reference_devices (`None`):
            CoMLRL's unused reference-KL fields (difference 7 there).
        use_environment_step (`True`), environment_steps_per_pair (`2`): CoMLRL's W&B x-axis (difference 5 there).

    Settings kept from CoMLRL for its numbers: `optim="adamw_torch"`, `weight_decay=0.01` (on every parameter),
    `lr_scheduler_type="constant"`, `max_grad_norm=0.0` (no clipping), `shuffle_dataset=False`,
    `gradient_checkpointing=False`, `num_generations_eval=1`; any TRL field may be set as well.
    """

    output_dir: str | None = field(default="madpo_output", metadata={"help": "Where checkpoints and logs go."})

    # CoMLRL 1.4.3's fields, in its order.
    num_train_epochs: float = field(default=20, metadata={"help": "Passes over the dataset."})
    agent_learning_rate: float = field(default=5e-6, metadata={"help": "Learning rate of every agent."})
    logging_steps: float = field(default=50, metadata={"help": "Log every this many optimizer steps."})
    num_agents: int | None = field(default=2, metadata={"help": "Number of agents."})
    collaboration_mode: str = field(
        default="decentralized",
        metadata={"help": "'decentralized' (one model per agent) or 'centralized' (one model writes every role)."},
    )
    parallel_training: str = field(
        default="none", metadata={"help": "'none' (Accelerate's placement) or 'mp' (a device per agent)."}
    )
    agent_devices: list[str] | None = field(
        default=None, metadata={"help": "With parallel_training='mp': one device per agent, one for all, or 'auto'."}
    )
    max_new_tokens: int = field(default=256, metadata={"help": "Maximum completion length."})
    temperature: float = field(default=0.6, metadata={"help": "Sampling temperature."})
    top_p: float = field(default=0.6, metadata={"help": "Nucleus sampling probability."})
    top_k: int | None = field(default=50, metadata={"help": "Top-k sampling; None or 0 disables it."})
    num_turns: int = field(default=1, metadata={"help": "Turns per episode (MADPO: 1)."})
    discount: float = field(default=1.0, metadata={"help": "MAGRPO's field; unused by MADPO."})
    joint_mode: str = field(default="aligned", metadata={"help": "Joint samples: 'aligned' (MADPO: only)."})
    early_termination_threshold: float | None = field(
        default=None, metadata={"help": "MAGRPO's field; unused by single-turn MADPO."}
    )
    external_prompt_passthrough: bool = field(
        default=False, metadata={"help": "MAGRPO's field; unused by single-turn MADPO."}
    )
    eval_interval: int = field(default=16, metadata={"help": "Evaluate every this many steps; 0 disables."})
    eval_num_samples: int = field(default=4, metadata={"help": "Rows evaluated each time."})
    eval_batch_size: int = field(default=1, metadata={"help": "Rows per evaluation batch."})
    rollout_buffer_size: int = field(default=2, metadata={"help": "Items per generation batch."})
    train_batch_size: int | None = field(
        default=None, metadata={"help": "Pairs per optimizer step; None: rollout_buffer_size."}
    )
    advantage_normalization: bool = field(default=True, metadata={"help": "MAGRPO's field; unused by MADPO."})
    advantage_mode: str = field(default="mean", metadata={"help": "MAGRPO's field; unused by MADPO."})
    reference_kl_enabled: bool = field(
        default=False, metadata={"help": "CoMLRL loads unused reference models with it; True raises here."}
    )
    reference_kl_coef: float = field(default=0.1, metadata={"help": "CoMLRL's unused KL coefficient."})
    reference_devices: list[str] | None = field(
        default=None, metadata={"help": "CoMLRL's devices of the unused reference models."}
    )
    preference_num_candidates: int = field(default=80, metadata={"help": "Joint candidates per item (K, >= 2)."})
    preference_pairs_per_sample: int | None = field(
        default=16, metadata={"help": "At most this many pairs per item; None: no limit."}
    )
    pair_selection: str = field(default="reward_gap", metadata={"help": "'reward_gap', 'all' or 'random'."})
    dpo_beta: float = field(default=0.1, metadata={"help": "DPO's inverse temperature (> 0)."})
    use_environment_step: bool = field(
        default=True, metadata={"help": "CoMLRL's W&B x-axis in environment steps (not used by TRL's logging)."}
    )
    environment_steps_per_pair: int = field(
        default=2, metadata={"help": "Environment steps per trained pair (CoMLRL's W&B x-axis; >= 1)."}
    )

    def __post_init__(self):
        self._check_comlrl_fields()
        if self.collaboration_mode != "centralized":
            self._map_fields()
            return
        # One actor writes every role: everything read per agent (devices, learning rates, ...) is the one model's,
        # and `num_agents` stays the role count, as in CoMLRL.
        roles = self.num_agents
        self.num_agents = 1
        try:
            self._map_fields()
        finally:
            self.num_agents = roles

    def _map_fields(self) -> None:
        """CoMLRL's fields onto the core's, then the core's own checks."""
        self.learning_rate = self.agent_learning_rate
        self.max_completion_length = self.max_new_tokens
        if self.top_k is None:
            self.top_k = 0  # TRL's "no top-k filtering"
        self.num_generations = self.preference_num_candidates
        self.per_device_train_batch_size, self.steps_per_generation, self.pair_steps_per_generation = (
            self._generation_batch()
        )
        self.generation_batch_size = None  # TRL derives it from the two above
        map_evaluation(self)
        spec = self.agent_devices
        if self.parallel_training == "mp":
            self.agent_devices = device_list(self.agent_devices, self.num_agents, "agent_devices")
        else:
            self.agent_devices = None
        self.reference_devices = None  # only read with reference_kl_enabled, which raises
        super().__post_init__()
        if self.parallel_training == "none":
            check_accelerate_device("agent_devices", spec, self.device)

    def _generation_batch(self) -> tuple[int, int, int | None]:
        """`(per_device_train_batch_size, steps_per_generation, pair_steps_per_generation)`: a generation batch is
        `rollout_buffer_size` items of K candidates; its pairs are split into optimizer steps of `train_batch_size`
        pairs on average. When those steps do not divide the batch's completions (every pair of 80 candidates: 3160
        steps per item), the completions make one TRL step and the pairs are split by `pair_steps_per_generation`."""
        items, per_step = self.rollout_buffer_size, self.comlrl_train_batch_size or self.rollout_buffer_size
        steps = math.ceil(items * self.pairs_per_prompt / per_step)
        rows = items * self.num_generations
        return (rows // steps, steps, None) if rows % steps == 0 else (rows, 1, steps)

    def _check_comlrl_fields(self) -> None:
        """CoMLRL 1.4.3's own checks of `MADPOConfig` (those of fields the core names otherwise; the core checks the
        rest), raised before anything is mapped."""
        check_fields(self, "MADPOConfig")
        check_parallel(self, "agent_devices")
        if (
            self.collaboration_mode == "centralized"
        ):  # CoMLRL's checks of the iterative configs' comparator fields, where they exist
            if getattr(self, "comparator_centralized_agent_index", 0) != 0:
                raise ValueError(
                    "Centralized collaboration has one actor: `comparator_centralized_agent_index` must be 0, got "
                    f"{self.comparator_centralized_agent_index}."
                )
            if hasattr(self, "comparator_generation_mode"):
                self.comparator_generation_mode = "centralized"
        if self.reference_kl_enabled:
            raise ValueError(
                "`reference_kl_enabled=True` has no effect on CoMLRL's MADPO loss (it loads reference models and "
                "never uses them): leave it False. For a frozen reference in the DPO log-ratios set "
                "`reference_free=False`."
            )
        if self.num_turns != 1:
            raise ValueError(f"MADPO supports `num_turns=1` only (as CoMLRL 1.4.3), got {self.num_turns}.")
        values = {name: getattr(self, name) for name in UNUSED_FIELDS}
        changed = {name: value for name, value in values.items() if value != UNUSED_FIELDS[name]}
        if changed:
            logger.warning(
                "MADPOConfig: %s have no effect on MADPO, as in CoMLRL 1.4.3 (single turn, no advantages; logging "
                "counts optimizer steps).",
                ", ".join(f"`{name}={value!r}`" for name, value in changed.items()),
            )


class MADPOTrainer(MAGRPOTrainer, MultiAgentDPOTrainer):
    """Multi-agent DPO with CoMLRL 1.4.3's `MADPOTrainer` arguments, in its order: `MultiAgentDPOTrainer` with the
    argument handling, reward calling, evaluation, checkpoint arguments and saving of MAGRPO's port
    (`reinforce.MAGRPOTrainer`).

    `agent_model`, `agents`, `num_agents`, `tokenizer`, `model_config`, `train_dataset`, `eval_dataset`,
    `reward_func`, `reward_processor`, `formatters`, `external_transition`, `wandb_config`, `eval_logger` and
    `eval_aggregator` are as in `MAGRPOTrainer` (the constructor's `num_agents` sets the team size, as in CoMLRL);
    `reward_func` is called once per joint candidate, with one-element lists, as CoMLRL calls it.

    Args:
        args (`MADPOConfig`, *optional*): `None` uses `MADPOConfig()`.
        centralized_comparator_adapter (*optional*):
            With `collaboration_mode="centralized"`: builds the joint prompt and splits the joint completion into the
            roles (`build_prompt(item, role_prompts)`, `parse_completion(completion, item, num_agents)`); `None` is
            `TaggedCentralizedComparatorAdapter()`, as in CoMLRL. Checked in either mode, used only in centralized
            mode. Centralized mode takes one model (`agent_model`, or `agents` of one) and one tokenizer.
        **kwargs: `MultiAgentDPOTrainer`'s TRL arguments (`peft_config`, `callbacks`, ...).

    `train(resume_from_checkpoint=None, checkpoint_dir=None, checkpoint_interval=1, checkpoint_total_limit=None)`,
    `evaluate(num_eval_samples=None)` and `save_model(output_dir)` (`output_dir/agent_i/`) work as in CoMLRL.
    """

    default_config_cls = MADPOConfig
    algorithm_name = "MADPO"
    _tag_names = DPO_TAG_NAMES  # TRL's class attribute, the native trainer's (MAGRPOTrainer's comes first otherwise)
    _name = "MADPO"

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
        args: MADPOConfig | None = None,
        *,
        centralized_comparator_adapter: Any = None,
        **kwargs,
    ):
        args = args if args is not None else self.default_config_cls()
        if not isinstance(args, MADPOConfig):
            raise TypeError(f"`args` is a {type(args).__name__}; MADPOTrainer needs a MADPOConfig.")
        # CoMLRL checks the adapter (its default: the tagged one) in either mode, and uses it in centralized mode.
        adapter = centralized_comparator_adapter
        adapter = TaggedCentralizedComparatorAdapter() if adapter is None else adapter
        check_adapter(adapter, "centralized_comparator_adapter")
        self.centralized_comparator_adapter = adapter
        self.centralized_collaboration: CentralizedCollaboration | None = None
        self.num_roles = num_agents
        if args.collaboration_mode == "centralized":
            self.centralized_collaboration, agents, tokenizer, args = centralized_team(
                adapter, agents, tokenizer, reward_func, formatters, num_agents, args, kwargs, "MADPO"
            )
            formatters, reward_func = self.centralized_collaboration.build_prompt, self.centralized_collaboration
            num_agents = 1
        super().__init__(
            agent_model=agent_model,
            agents=agents,
            num_agents=num_agents,
            tokenizer=tokenizer,
            model_config=model_config,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            reward_func=reward_func,
            reward_processor=reward_processor,
            formatters=formatters,
            external_transition=external_transition,
            wandb_config=wandb_config,
            eval_logger=eval_logger,
            eval_aggregator=eval_aggregator,
            args=args,
            **kwargs,
        )

    def trajectory_metrics(self, trajectories: EvalTrajectories) -> dict[str, float]:
        """MAGRPO's evaluation metrics; in centralized mode `eval_logger` gets the roles' outputs `[role][row][turn]`
        (the joint completions split by the adapter), as CoMLRL's."""
        if self.centralized_collaboration is not None:
            trajectories = role_trajectories(self.centralized_collaboration, trajectories)
        return super().trajectory_metrics(trajectories)

    get_decay_parameter_names = decay_every_parameter  # CoMLRL's AdamW decays every parameter


__all__ = ["MADPOConfig", "MADPOTrainer"]
