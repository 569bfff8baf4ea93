"""CoMLRL 1.4.3's `CentralizedMAGRPOConfig`/`CentralizedMAGRPOTrainer`: `MAGRPOTrainer` with one agent whose
formatter is the roles' joint prompt and whose reward is the roles' joint reward
(`rewards.centralized.CentralizedCollaboration`); `docs/comlrl-users.md` (Centralized MAGRPO)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..rewards.centralized import check_adapter
from .behaviour import as_one_actor
from .reinforce import MAGRPOConfig, MAGRPOTrainer

__all__ = ["CentralizedMAGRPOConfig", "CentralizedMAGRPOTrainer"]

COLLABORATION_MODES = ("centralized",)


@dataclass
class CentralizedMAGRPOConfig(MAGRPOConfig):
    """`MAGRPOConfig` for one model writing every role: `num_agents` counts the roles (the core's per-agent
    settings are the one model's); `num_turns` and `collaboration_mode` must keep their defaults (1, "centralized")."""

    num_turns: int = 1
    collaboration_mode: str = field(default="centralized", metadata={"choices": COLLABORATION_MODES})

    def __post_init__(self):
        if self.collaboration_mode not in COLLABORATION_MODES:
            raise ValueError(
                f"`collaboration_mode` must be 'centralized' for CentralizedMAGRPOConfig, got "
                f"{self.collaboration_mode!r}; for one model per agent use MAGRPOConfig."
            )
        if self.num_turns != 1:
            raise ValueError(f"`num_turns` must be 1 for centralized MAGRPO (single-turn only), got {self.num_turns}.")
        as_one_actor(self, super().__post_init__)


class CentralizedMAGRPOTrainer(MAGRPOTrainer):
    """One model writes every role's output from one joint prompt, split into the roles by `centralized_adapter`
    (required; `TaggedCentralizedComparatorAdapter()` is CoMLRL's) for the reward and the evaluation. Takes
    `MAGRPOTrainer`'s arguments with one model (`agents`, alone or in a list of one, or `agent_model`) and
    `num_agents` roles; `trainer.args` is the core's copy with `num_agents=1`, the role count `trainer.num_roles`."""

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
        if args is not None and getattr(args, "collaboration_mode", None) != "centralized":
            raise ValueError(
                f"CentralizedMAGRPOTrainer needs a CentralizedMAGRPOConfig (`collaboration_mode='centralized'`), got "
                f"{type(args).__name__}."
            )
        if args is not None and args.num_turns != 1:
            raise ValueError(f"`num_turns` must be 1 for centralized MAGRPO (single-turn only), got {args.num_turns}.")
        if centralized_adapter is None:
            raise TypeError(
                "CentralizedMAGRPOTrainer needs `centralized_adapter=`: TaggedCentralizedComparatorAdapter() "
                "(CoMLRL's <agent_i>...</agent_i> protocol) or your own with `build_prompt` and `parse_completion`."
            )
        check_adapter(centralized_adapter)
        self.centralized_comparator_adapter = centralized_adapter
        roles = dict(agents=agents, tokenizer=tokenizer, reward_func=reward_func, formatters=formatters)
        super().__init__(num_agents=num_agents, args=args, **roles, **kwargs)
