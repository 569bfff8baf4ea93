"""CoMLRL compatibility: CoMLRL 1.4.3's `CentralizedMAGRPOConfig` and `CentralizedMAGRPOTrainer`, one model that
writes every role from one joint prompt, trained with MAGRPO on the roles' joint reward.

A CoMLRL script runs with only its import lines changed:

```diff
-from comlrl.trainers.preference import TaggedCentralizedComparatorAdapter
-from comlrl.trainers.reinforce import CentralizedMAGRPOConfig, CentralizedMAGRPOTrainer
+from multiagent_trl import CentralizedMAGRPOConfig, CentralizedMAGRPOTrainer, TaggedCentralizedComparatorAdapter
```

It is `MAGRPOTrainer` (`reinforce.py`) with one agent: its formatter is the collaboration's joint prompt and its
reward the collaboration itself (`rewards.centralized.CentralizedCollaboration`), so TRL's GRPO loss trains the one
model on whole joint completions. Only the reward and evaluation see the roles.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..rewards.centralized import check_adapter
from ..rollout.evaluation import EvalTrajectories, role_trajectories
from .behaviour import centralized_team
from .reinforce import MAGRPOConfig, MAGRPOTrainer

__all__ = ["CentralizedMAGRPOConfig", "CentralizedMAGRPOTrainer", "role_trajectories"]  # `marlhf` imports the last

COLLABORATION_MODES = ("centralized",)


@dataclass
class CentralizedMAGRPOConfig(MAGRPOConfig):
    r"""
    `MAGRPOConfig` for one model writing every role (CoMLRL 1.4.3's `CentralizedMAGRPOConfig`): every `MAGRPOConfig`
    field with its default, and two that must keep theirs.

    Parameters:
        num_turns (`int`, *optional*, defaults to `1`):
            Turns per episode; only `1` (CoMLRL's centralized MAGRPO is single-turn).
        collaboration_mode (`str`, *optional*, defaults to `"centralized"`):
            Only `"centralized"`.

    `num_agents` is the number of **roles** the model writes (default 2). The settings the core reads per agent
    (`agent_learning_rates`, `agent_devices`, ...) are the one model's: one value, or a list of one.
    """

    num_turns: int = field(default=1, metadata={"help": "Turns per episode: only 1 for centralized MAGRPO."})
    collaboration_mode: str = field(
        default="centralized",
        metadata={
            "help": "How the roles are written: only 'centralized' (one model).",
            "choices": COLLABORATION_MODES,
        },
    )

    def __post_init__(self):
        if self.collaboration_mode not in COLLABORATION_MODES:
            raise ValueError(
                f"`collaboration_mode` must be 'centralized' for CentralizedMAGRPOConfig, got "
                f"{self.collaboration_mode!r}; for one model per agent use MAGRPOConfig."
            )
        if self.num_turns != 1:
            raise ValueError(f"`num_turns` must be 1 for centralized MAGRPO (single-turn only), got {self.num_turns}.")
        roles = self.num_agents
        if roles is None or roles < 1:
            raise ValueError(f"`num_agents` (the number of roles) must be at least 1, got {roles}.")
        # Everything the core checks per agent is the one model's; `num_agents` stays the role count, as in CoMLRL.
        self.num_agents = 1
        try:
            super().__post_init__()
        finally:
            self.num_agents = roles


class CentralizedMAGRPOTrainer(MAGRPOTrainer):
    """One model writes every role's output from one joint prompt; its completion is split into the roles only for
    the reward and the evaluation (CoMLRL 1.4.3's `CentralizedMAGRPOTrainer`).

    Args:
        centralized_adapter (`CentralizedComparatorAdapter`):
            Builds the joint prompt and splits the joint completion (`TaggedCentralizedComparatorAdapter()`,
            CoMLRL's); required.
        num_agents (`int`, *optional*, defaults to `2`):
            The number of roles; must equal `args.num_agents`.
        agents (*optional*):
            The one model (or id), alone or in a list of one; or give `agent_model=` (an id or path).
        tokenizer (*optional*):
            The model's tokenizer (alone or in a list of one); `None` loads it with the model.
        reward_func (`Callable`):
            The roles' joint reward, as for `MAGRPOTrainer` with `num_agents` agents; it must return one value per
            joint completion. A completion in which the adapter finds no role is scored with every role `""`.
        formatters (*optional*):
            Each role's formatter (one for all, or one per role), or `None` for the rows' `"prompt"`.
        args (`CentralizedMAGRPOConfig`, *optional*):
            Configuration; `None` uses `CentralizedMAGRPOConfig()`.
        **kwargs:
            Every other `MAGRPOTrainer` argument (`agent_model`, `model_config`, `train_dataset`, `eval_dataset`,
            `reward_processor`, `wandb_config`, `eval_logger`, `eval_aggregator`, ...). `eval_logger` receives the
            roles' outputs, `agent_completions_turns[role][row][turn]`.

    `trainer.args` is the core's view of `args` (a copy with `num_agents=1`, the one model); the role count is
    `trainer.num_roles`, and `trainer.centralized_collaboration` holds the prompt builder and the reward.
    """

    default_config_cls = CentralizedMAGRPOConfig
    algorithm_name = "MAGRPO"  # as in CoMLRL

    def __init__(
        self,
        *,
        centralized_adapter=None,
        num_agents: int = 2,
        agents=None,
        tokenizer=None,
        reward_func: Callable | None = None,
        formatters: Callable | Sequence[Callable] | None = None,
        args: CentralizedMAGRPOConfig | None = None,
        **kwargs,
    ):
        args = args if args is not None else self.default_config_cls()
        if getattr(args, "collaboration_mode", None) != "centralized":
            raise ValueError(
                f"CentralizedMAGRPOTrainer needs a CentralizedMAGRPOConfig (`collaboration_mode='centralized'`), got "
                f"{type(args).__name__}."
            )
        if args.num_turns != 1:
            raise ValueError(f"`num_turns` must be 1 for centralized MAGRPO (single-turn only), got {args.num_turns}.")
        if centralized_adapter is None:
            raise TypeError(
                "CentralizedMAGRPOTrainer needs `centralized_adapter=`: TaggedCentralizedComparatorAdapter() "
                "(CoMLRL's <agent_i>...</agent_i> protocol) or your own with `build_prompt` and `parse_completion`."
            )
        check_adapter(centralized_adapter)
        self.num_roles = num_agents
        collaboration, agents, tokenizer, core_args = centralized_team(
            centralized_adapter, agents, tokenizer, reward_func, formatters, num_agents, args, kwargs, "MAGRPO"
        )
        self.centralized_collaboration = collaboration
        super().__init__(
            agents=agents,
            num_agents=1,
            tokenizer=tokenizer,
            reward_func=self.centralized_collaboration,
            formatters=self.centralized_collaboration.build_prompt,
            args=core_args,
            **kwargs,
        )

    def trajectory_metrics(self, trajectories: EvalTrajectories) -> dict[str, float]:
        """`MAGRPOTrainer`'s evaluation metrics, with `eval_logger` given the roles' outputs `[role][row][turn]`."""
        return super().trajectory_metrics(role_trajectories(self.centralized_collaboration, trajectories))
