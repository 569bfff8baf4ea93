"""What CoMLRL 1.4.3's two iterative trainers share, over the native rounds (`preference.iterative.IterativeRounds`):
its iterative fields (its `_IterativePreferenceConfig`) and their checks, taken by `MADPOIterConfig`
(`comlrl.iterative`) and `MARLHFIterConfig` (`comlrl.marlhf_iter`), which `docs/comlrl-users.md` maps onto the
native round fields; the reward-range check of `log_reward_distribution` (`reward_bounds`); and an iteration's
`iter/...` log entries (`iteration_logs`), written from a round's pairs and candidate rewards."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..preference.iterative import RoundSaves
from ..preference.replay import (
    COMPARATOR_POLICIES,
    COMPARATOR_POLICY_ALIASES,
    COMPARISON_PAIR_SELECTIONS,
    canonical,
    check_replay_fields,
)
from ..rewards.joint import reward_range
from .behaviour import expected_config

# CoMLRL's iterative field -> the native round field it becomes (`IterativeRoundFields`).
ROUND_FIELDS = {f"preference_{name}": name for name in ("replay_mode", "replay_k", "replay_lambda", "replay_dir")}
ROUND_FIELDS |= {
    "preference_replay_sample_size": "replay_sample_size",
    "comparator_num_candidates": "comparator_num_generations",
}
GENERATION_MODES = ("decentralized", "centralized")
GENERATION_MODE_ALIASES = {
    "decentralised": "decentralized",
    "multi_agent": "decentralized",
    "multi-agent": "decentralized",
    "centralised": "centralized",
    "single_agent": "centralized",
    "single-agent": "centralized",
}


@dataclass
class IterativePreferenceFields:
    """CoMLRL 1.4.3's iterative fields (its `_IterativePreferenceConfig`) and their cross-field checks, shared by
    `MADPOIterConfig` and `MARLHFIterConfig` (each documents them). A config mixes them in before its base config;
    its `__post_init__` ends with `super().__post_init__()`, which checks them, then the base config."""

    num_iterations: int = field(default=6, metadata={"help": "Pair-refresh iterations (CoMLRL's meaning)."})
    preference_replay_mode: str = field(
        default="current", metadata={"help": "'current', 'nearest_k', 'all_history' or 'lambda_decay'."}
    )
    preference_replay_k: int | None = field(default=None, metadata={"help": "Shards replayed by nearest_k."})
    preference_replay_lambda: float | None = field(default=None, metadata={"help": "lambda_decay's lambda in [0, 1]."})
    preference_replay_sample_size: int | None = field(default=None, metadata={"help": "Pairs drawn by replay."})
    preference_replay_dir: str | None = field(default=None, metadata={"help": "Shard folder (output_dir/...)."})
    log_reward_distribution: bool = field(default=False, metadata={"help": "Reward distribution metrics."})
    policy_checkpoint_dir: str | None = field(default=None, metadata={"help": "Save the agents every iteration."})
    comparator_policy: str = field(default="current", metadata={"help": "'current', 'current_copy', 'history', ..."})
    comparator_generation_mode: str = field(
        default="decentralized", metadata={"help": "'decentralized'; 'centralized' (forced) with a centralized team."}
    )
    comparator_centralized_agent_index: int = field(default=0, metadata={"help": "Centralized comparator's agent."})
    comparator_model_name: str | None = field(default=None, metadata={"help": "comparator_policy='model': its model."})
    comparator_agents: list[str] | None = field(default=None, metadata={"help": "'model': one model per agent."})
    comparator_devices: list[str] | str | None = field(default=None, metadata={"help": "Not supported."})
    comparator_num_candidates: int | None = field(default=None, metadata={"help": "K' (default K)."})
    comparator_history_k: int | None = field(default=None, metadata={"help": "History: the policy k rounds back."})
    comparator_api_url: str | None = field(default=None, metadata={"help": "HTTP comparator (not supported)."})
    comparator_api_format: str = field(default="generic", metadata={"help": "HTTP comparator's format."})
    comparator_api_model: str | None = field(default=None, metadata={"help": "HTTP comparator's model."})
    comparator_api_max_n_per_request: int | None = field(default=None, metadata={"help": "HTTP: n per request."})
    comparator_api_timeout: float = field(default=120.0, metadata={"help": "HTTP timeout (s)."})
    comparator_api_headers: dict[str, str] | None = field(default=None, metadata={"help": "HTTP headers."})
    comparator_api_key: str | None = field(default=None, metadata={"help": "HTTP key."})
    comparator_api_key_env: str | None = field(default=None, metadata={"help": "HTTP key's variable."})
    comparator_api_key_header: str = field(default="Authorization", metadata={"help": "HTTP key header."})
    comparator_api_key_prefix: str = field(default="Bearer", metadata={"help": "HTTP key prefix."})
    comparator_api_response_field: str = field(default="completions", metadata={"help": "HTTP response field."})
    comparator_api_extra_body: dict[str, Any] | None = field(default=None, metadata={"help": "HTTP extra body."})

    centralized_ported: ClassVar[bool] = False  # whether the config takes `collaboration_mode="centralized"`

    def __post_init__(self):
        """CoMLRL's iterative checks (its names in the errors, before a native check reads the round fields), then
        `pair_selection`'s and the base config's."""
        self._check_iterative_fields()
        selection = str(self.pair_selection).strip().lower()
        if selection not in COMPARISON_PAIR_SELECTIONS:
            raise ValueError(
                f"`pair_selection` must be one of {list(COMPARISON_PAIR_SELECTIONS)}, got {self.pair_selection!r}."
            )
        # The base configs (MADPO's, MARLHF's) know no comparator: "comparator_reward" takes "reward_gap"'s limits.
        self.pair_selection = "reward_gap" if selection == "comparator_reward" else selection
        super().__post_init__()
        self.pair_selection = selection

    def _check_iterative_fields(self) -> None:
        """CoMLRL's cross-field checks (`_validate_iterative_config`), then what is not supported here."""
        if int(self.num_iterations) < 1:
            raise ValueError(f"`num_iterations` must be at least 1, got {self.num_iterations}.")
        self.num_iterations = int(self.num_iterations)
        replay = check_replay_fields(
            self.preference_replay_mode,
            self.preference_replay_k,
            self.preference_replay_lambda,
            self.preference_replay_sample_size,
            self.preference_replay_dir,
            prefix="preference_",
        )
        self.preference_replay_mode, self.preference_replay_k = replay[:2]
        self.preference_replay_lambda, self.preference_replay_sample_size = replay[2:]

        policy = canonical(
            self.comparator_policy, "comparator_policy", COMPARATOR_POLICIES, COMPARATOR_POLICY_ALIASES, "current"
        )
        self.comparator_policy = policy
        # The native comparator: "current_copy" draws as "current" does (every pair of a round is drawn before any
        # update); "history" and "model" are the native ones (the latter from `comparator_agents`, one per agent,
        # or `comparator_model_name`).
        self.comparator = policy if policy in ("history", "model") else "current"
        self.comparator_model = (self.comparator_agents or self.comparator_model_name) if policy == "model" else None
        self.comparator_generation_mode = canonical(
            self.comparator_generation_mode,
            "comparator_generation_mode",
            GENERATION_MODES,
            GENERATION_MODE_ALIASES,
            "decentralized",
        )
        if self.comparator_generation_mode == "centralized":
            index = int(self.comparator_centralized_agent_index)
            if not 0 <= index < int(self.num_agents):
                raise ValueError(f"`comparator_centralized_agent_index` must be in [0, num_agents), got {index}.")
        for name in ("comparator_num_candidates", "comparator_api_max_n_per_request"):
            value = getattr(self, name)
            if value is not None:
                if int(value) < 1:
                    raise ValueError(f"`{name}` must be at least 1 or None, got {value}.")
                setattr(self, name, int(value))
        named_model = self.comparator_model_name is not None or self.comparator_agents is not None
        if policy == "model" and not named_model:
            raise ValueError("`comparator_policy='model'` needs `comparator_model_name` or `comparator_agents`.")
        if policy != "model" and named_model:
            raise ValueError(
                "`comparator_model_name` and `comparator_agents` are only valid with `comparator_policy='model'`."
            )
        if policy == "history":
            history = 1 if self.comparator_history_k is None else int(self.comparator_history_k)
            if history < 1:
                raise ValueError(f"`comparator_history_k` must be at least 1, got {self.comparator_history_k}.")
            self.comparator_history_k = history
        elif self.comparator_history_k is not None:
            raise ValueError("`comparator_history_k` is only valid with `comparator_policy='history'`.")
        if policy == "api" and not self.comparator_api_url:
            raise ValueError("`comparator_policy='api'` needs `comparator_api_url`.")

        # What this port does not do (CoMLRL accepts these).
        if policy == "api":
            raise NotImplementedError(
                "`comparator_policy='api'` (an HTTP comparator) is not supported: multiagent_trl makes no network "
                "calls, and its tests and CI run offline. Use 'current', 'current_copy', 'history' or 'model'."
            )
        if self.comparator_devices is not None:
            raise NotImplementedError(
                "`comparator_devices` places a copy of the agents on other devices, which is not supported: the "
                "comparator samples with the agents where they are. Leave it None."
            )
        if str(self.collaboration_mode).strip().lower() == "centralized":  # the base config lower-cases it later
            if not self.centralized_ported:
                raise NotImplementedError(
                    f"`collaboration_mode='centralized'` is not ported to {type(self).__name__} yet: use "
                    "`collaboration_mode='decentralized'` (MADPOIter and MARLHF take the centralized mode)."
                )
            # CoMLRL's centralized team: its comparator is the one model on the joint prompt (forced above).
        elif self.comparator_generation_mode == "centralized":
            raise NotImplementedError(
                "`comparator_generation_mode='centralized'` with decentralized agents is not supported: use "
                "'decentralized' (each agent answers its own prompt), or `collaboration_mode='centralized'`."
            )


def iterative_config(trainer_cls: type, args: tuple, kwargs: dict):
    """The config given to a CoMLRL iterative trainer (`args=`, or CoMLRL's 15th positional argument; `None` if
    none), refused unless a `trainer_cls.default_config_cls`; with `log_reward_distribution`, the reward's range is
    checked too (`reward_bounds`), before anything loads."""
    config = kwargs.get("args", args[14] if len(args) > 14 else None)
    if config is not None:
        expected = trainer_cls.default_config_cls
        expected_config(config, expected, expected, trainer_cls.__name__)
    reward = kwargs.get("reward_func", kwargs.get("reward_funcs", args[7] if len(args) > 7 else None))
    reward_bounds(config is not None and config.log_reward_distribution, reward)
    return config


def save_rounds(trainer) -> None:
    """CoMLRL's `policy_checkpoint_dir`: the native `RoundSaves` saves the agents there after every round."""
    if trainer.args.policy_checkpoint_dir:
        trainer.add_callback(RoundSaves(trainer, trainer.args.policy_checkpoint_dir))


def reward_bounds(log_reward_distribution: bool, reward) -> tuple[float, float] | None:
    """The task reward's `reward_range` (of `reward`, a function or a list of them: the first that declares one), which
    `log_reward_distribution` needs: raises without one, checked before anything loads; `None` when the
    distribution is not logged."""
    if not log_reward_distribution:
        return None
    funcs = reward if isinstance(reward, (list, tuple)) else [reward]
    bounds = next((b for b in (reward_range(f) for f in funcs if f is not None) if b is not None), None)
    if bounds is None:
        raise ValueError(
            "`log_reward_distribution=True` needs the reward's range: set `reward_func.reward_range = (min, "
            "max)` (CoMLRL's `set_reward_range`), or turn `log_reward_distribution` off."
        )
    return bounds


def distribution_metrics(
    namespace: str,
    iteration: int,
    target: Sequence[float],
    comparator: Sequence[float],
    pair_count: int | None = None,
) -> dict[str, float]:
    """CoMLRL's scalar reward-distribution metrics of one iteration (its plots are not drawn)."""
    if not target and not comparator:
        return {}
    metrics = {f"{namespace}/current_iteration": float(iteration + 1)}
    if pair_count is not None:
        metrics[f"{namespace}/pair_count"] = float(pair_count)
    metrics[f"{namespace}/target_sample_count"] = float(len(target))
    metrics[f"{namespace}/comparator_sample_count"] = float(len(comparator))
    if target:
        metrics[f"{namespace}/target_mean"] = float(sum(target) / len(target))
    if comparator:
        metrics[f"{namespace}/comparator_mean"] = float(sum(comparator) / len(comparator))
    return metrics


def iteration_logs(
    index: int,
    drawn: int,
    candidate_rewards: tuple[Sequence[float], Sequence[float]],
    train_pairs: Sequence[dict],
    total: int,
    log_distribution: bool,
) -> dict[str, float]:
    """CoMLRL's `iter/...` entries of iteration `index` (0-based): `drawn` pairs (the round's own,
    `round_records`), its training pairs (`round_pairs`) and `total` training pairs so far; with `log_distribution`,
    the raw reward distributions of every candidate (`round_candidate_rewards`: current, comparator) and of the
    training pairs that record them."""
    logs = {
        "iter/current_iteration": float(index + 1),
        "iter/current_preference_pairs": float(drawn),
        "iter/total_preference_pairs": float(total),
        "iter/train_preference_pairs": float(len(train_pairs)),
    }
    if log_distribution:
        logs.update(distribution_metrics("iter/reward_distribution", index, *candidate_rewards))
        selected = [  # (target, comparator) raw rewards of the training pairs that record them
            [r[key] for r in train_pairs if r.get(key) is not None]
            for key in ("target_raw_reward", "comparator_raw_reward")
        ]
        logs.update(distribution_metrics("iter/selected_reward_distribution", index, *selected, len(train_pairs)))
    return logs


__all__ = [
    "GENERATION_MODES",
    "GENERATION_MODE_ALIASES",
    "IterativePreferenceFields",
    "ROUND_FIELDS",
    "distribution_metrics",
    "iterative_config",
    "iteration_logs",
    "reward_bounds",
    "save_rounds",
]
