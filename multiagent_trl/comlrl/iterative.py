"""CoMLRL compatibility for iterative MADPO: `MADPOIterConfig`/`MADPOIterTrainer` with CoMLRL 1.4.3's names,
defaults and checks, on top of `MADPOConfig`/`MADPOTrainer`.

```diff
-from comlrl.trainers.preference import MADPOIterConfig, MADPOIterTrainer
+from multiagent_trl import MADPOIterConfig, MADPOIterTrainer
```

Each of `num_iterations` iterations: (1) over the whole training set, the current agents sample K =
`preference_num_candidates` joint candidates per item and the comparator K' = `comparator_num_candidates` (or K); the
joint reward scores them; index-aligned pairs (current k against comparator k) are ordered by `pair_selection` and
the first `preference_pairs_per_sample` kept (`preference.replay.comparison_pairs`); (2) the iteration's pairs are
written to `preference_replay_dir/iteration_XXXX.json` and the training pairs drawn by `preference_replay_mode`
(`preference.replay.replay_selection`); (3) `num_train_epochs` passes over them in batches of `train_batch_size` pairs
(shuffled each pass by Python's `random`), each an update with MADPO's joint DPO loss (`MultiAgentDPOTrainer`'s rows
and loss: `_preference_rows`, `_compute_loss`); the optimizer persists across iterations; (4) with
`policy_checkpoint_dir`, the agents are saved to `policy_checkpoints/iteration_XXXX` (0-based, as CoMLRL; the
initial agents to `initial`). Logged per iteration: `iter/current_iteration`, `iter/current_preference_pairs`,
`iter/total_preference_pairs`, `iter/train_preference_pairs`.

Deliberate differences from CoMLRL 1.4.3, and why:

1. Replay shards and policy checkpoints go under `output_dir` by default (`output_dir/preference_replay`,
   `output_dir/policy_checkpoints`), not under the current working directory.
2. Pairs train on the tokens the agents sampled (prompt as the trainer tokenized it, the completion with its end
   token); CoMLRL re-tokenizes the decoded text (no end token, and not always the sampled tokens). The shards hold
   CoMLRL's records plus the token ids (`token_ids`); a shard without them (CoMLRL's) is re-tokenized as CoMLRL does.
3. `comparator_policy="current"` draws the comparator's candidates with the same models and the global random stream
   right after the current candidates; CoMLRL keeps a separate random stream for the comparator. `"current_copy"` is
   the same thing here: all pairs of an iteration are sampled before any update, so a copy taken at the start of the
   iteration equals the live agents (CoMLRL copies only to put it on `comparator_devices`, which is not supported).
4. `log_reward_distribution` logs CoMLRL's scalar metrics (`iter/reward_distribution/...`,
   `iter/selected_reward_distribution/...`: sample counts, target and comparator means) but no histogram images.
5. An evaluation runs before the first update and every `eval_interval` updates (CoMLRL's rule), through
   `MADPOTrainer.evaluate`; logging follows `logging_steps` in updates.

Centralized collaboration (`collaboration_mode="centralized"`, CoMLRL's): one model writes every role, as in
`MADPOTrainer`'s centralized mode (the joint prompt from the role formatters, the roles' joint reward on the parsed
joint completion, `eval_logger` given the roles). As CoMLRL, the config sets `comparator_generation_mode=
"centralized"` and takes only `comparator_centralized_agent_index=0`; with `comparator_policy="current"`/
`"current_copy"` the comparator is the same model answering the same joint prompt, so every record holds one prompt
(the joint prompt) and one completion (the joint text as written, tags included), as CoMLRL's records do.

Not supported (raise at construction, naming the field): `comparator_policy="model"` and `"history"` (generation by a
model other than the agents is not ported yet), `comparator_policy="api"` (an HTTP endpoint: this library makes no
network calls, and its tests and CI run offline), `comparator_devices`, `comparator_generation_mode="centralized"`
with decentralized agents, more than one process, and CoMLRL's `train(checkpoint_dir=...)` iteration checkpoints.
The `comparator_api_*` fields are accepted with CoMLRL's defaults and checks.

The iterative fields (`IterativePreferenceFields`) and steps 1-2 (`IterativePairs`) are shared with
`marlhf_iter.MARLHFIterTrainer`, which trains a reward model and the agents online on them instead of step 3.
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from ..preference.iterative import candidate_sets, comparison_records, record_tokens
from ..preference.replay import (
    COMPARATOR_POLICIES,
    COMPARATOR_POLICY_ALIASES,
    COMPARISON_PAIR_SELECTIONS,
    REPLAY_MODE_ALIASES,
    REPLAY_MODES,
    ReplayShard,
    canonical,
    replay_selection,
    write_shard,
)
from ..rewards.joint import reward_range
from .preference import MADPOConfig, MADPOTrainer

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
    `MADPOIterConfig` and `MARLHFIterConfig` (each documents them). A config mixes them in before its base config
    and calls `_check_iterative_fields()` at the end of its `__post_init__`."""

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
    comparator_policy: str = field(default="current", metadata={"help": "'current' or 'current_copy'."})
    comparator_generation_mode: str = field(
        default="decentralized", metadata={"help": "'decentralized'; 'centralized' (forced) with a centralized team."}
    )
    comparator_centralized_agent_index: int = field(default=0, metadata={"help": "Centralized comparator's agent."})
    comparator_model_name: str | None = field(default=None, metadata={"help": "comparator_policy='model' (raises)."})
    comparator_agents: list[str] | None = field(default=None, metadata={"help": "comparator_policy='model'."})
    comparator_devices: list[str] | str | None = field(default=None, metadata={"help": "Not supported."})
    comparator_num_candidates: int | None = field(default=None, metadata={"help": "K' (default K)."})
    comparator_history_k: int | None = field(default=None, metadata={"help": "comparator_policy='history'."})
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

    def _check_iterative_fields(self) -> None:
        """CoMLRL's cross-field checks (`_validate_iterative_config`), then what is not supported here."""
        folder = self.preference_replay_dir
        if folder is not None and os.path.exists(folder) and not os.path.isdir(folder):
            raise ValueError(
                f"`preference_replay_dir={folder!r}` is a file; it must be a folder (new or holding earlier shards, "
                "`iteration_XXXX.json`): give another path, or None for `output_dir/preference_replay`."
            )
        if int(self.num_iterations) < 1:
            raise ValueError(f"`num_iterations` must be at least 1, got {self.num_iterations}.")
        self.num_iterations = int(self.num_iterations)
        mode = canonical(
            self.preference_replay_mode, "preference_replay_mode", REPLAY_MODES, REPLAY_MODE_ALIASES, "current"
        )
        self.preference_replay_mode = mode
        k, lam, size = self.preference_replay_k, self.preference_replay_lambda, self.preference_replay_sample_size
        if mode == "current" and k not in (None, 1):
            raise ValueError("`preference_replay_k` must be None or 1 with `preference_replay_mode='current'`.")
        if mode in ("all_history", "lambda_decay") and k is not None:
            raise ValueError("`preference_replay_k` is only valid with `preference_replay_mode='nearest_k'`.")
        if mode != "lambda_decay" and lam is not None:
            raise ValueError("`preference_replay_lambda` is only valid with `preference_replay_mode='lambda_decay'`.")
        if mode == "current" and size is not None:
            raise ValueError(
                "`preference_replay_sample_size` is only valid with `preference_replay_mode` 'nearest_k', "
                "'all_history' or 'lambda_decay': 'current' trains on this iteration's pairs."
            )
        if mode == "nearest_k":
            if k is None:
                raise ValueError(
                    "`preference_replay_mode='nearest_k'` needs `preference_replay_k` (shards to replay)."
                )
            if int(k) < 1:
                raise ValueError(f"`preference_replay_k` must be at least 1, got {k}.")
            self.preference_replay_k = int(k)
        if mode == "lambda_decay":
            if lam is None:
                raise ValueError("`preference_replay_mode='lambda_decay'` needs `preference_replay_lambda` in [0, 1].")
            if not 0.0 <= float(lam) <= 1.0:
                raise ValueError(f"`preference_replay_lambda` must be in [0, 1], got {lam}.")
            self.preference_replay_lambda = float(lam)
        if size is not None:
            if int(size) < 1:
                raise ValueError(f"`preference_replay_sample_size` must be at least 1 or None, got {size}.")
            self.preference_replay_sample_size = int(size)

        policy = canonical(
            self.comparator_policy, "comparator_policy", COMPARATOR_POLICIES, COMPARATOR_POLICY_ALIASES, "current"
        )
        self.comparator_policy = policy
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
                "calls, and its tests and CI run offline. Use `comparator_policy='current'` (or 'current_copy')."
            )
        if policy in ("model", "history"):
            raise NotImplementedError(
                f"`comparator_policy={policy!r}` is not ported yet: sampling from models other than the trained "
                "agents. Use `comparator_policy='current'` (or 'current_copy')."
            )
        if self.comparator_devices is not None:
            raise NotImplementedError(
                "`comparator_devices` places a copy of the agents on other devices, which is not supported: the "
                "comparator samples with the agents where they are. Leave it None."
            )
        if self.collaboration_mode == "centralized":
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


@dataclass
class MADPOIterConfig(IterativePreferenceFields, MADPOConfig):
    r"""
    `MADPOConfig` with CoMLRL 1.4.3's iterative fields (`MADPOIterConfig`), defaults and checks.

    Parameters:
        num_iterations (`int`, *optional*, defaults to `6`):
            Pair-refresh iterations (CoMLRL's meaning; TRL's `num_iterations`, updates per generation batch, is 1).
        num_train_epochs (`1`), preference_num_candidates (`20`), preference_pairs_per_sample (`4`):
            MADPO's fields with the iterative defaults: passes over an iteration's training pairs, K, pairs per item.
        pair_selection (`str`, defaults to `"comparator_reward"`):
            `"comparator_reward"`, `"reward_gap"`, `"random"` or `"all"` (see `preference.replay.comparison_pairs`).
        preference_replay_mode (`str`, defaults to `"current"`):
            `"current"`, `"nearest_k"`, `"all_history"` or `"lambda_decay"` (CoMLRL's aliases accepted).
        preference_replay_k (`int`, required by `nearest_k`): the newest shards `nearest_k` draws from.
        preference_replay_lambda (`float` in [0, 1], required by `lambda_decay`): the shards' age decay.
        preference_replay_sample_size (`int`, *optional*): pairs drawn (default: this iteration's pair count).
        preference_replay_dir (`str`, *optional*): where shards go (default `output_dir/preference_replay`).
        log_reward_distribution (`bool`, defaults to `False`): reward distribution metrics per iteration (needs
            `reward_func.reward_range`).
        policy_checkpoint_dir (`str`, *optional*): save the agents after each iteration there (and the initial ones).
        comparator_policy (`str`, defaults to `"current"`): `"current"` or `"current_copy"`; `"model"`, `"history"`
            and `"api"` raise `NotImplementedError`.

    The comparator's other settings, checked as CoMLRL checks them: `comparator_generation_mode`
    (`"decentralized"`), `comparator_centralized_agent_index` (`0`), `comparator_model_name`, `comparator_agents`,
    `comparator_devices`, `comparator_num_candidates` (K', default K) and `comparator_history_k`. CoMLRL's HTTP
    comparator fields (`comparator_api_url`, `comparator_api_format` (`"generic"`), `comparator_api_model`,
    `comparator_api_max_n_per_request`, `comparator_api_timeout` (`120.0`), `comparator_api_headers`,
    `comparator_api_key`, `comparator_api_key_env`, `comparator_api_key_header` (`"Authorization"`),
    `comparator_api_key_prefix` (`"Bearer"`), `comparator_api_response_field` (`"completions"`),
    `comparator_api_extra_body`) are accepted and checked; `comparator_policy="api"` raises.
    """

    output_dir: str | None = field(default="madpo_iter_output", metadata={"help": "Where outputs go."})
    num_train_epochs: float = field(default=1, metadata={"help": "Passes over an iteration's training pairs."})
    preference_num_candidates: int = field(default=20, metadata={"help": "Joint candidates per item (K, >= 2)."})
    preference_pairs_per_sample: int | None = field(default=4, metadata={"help": "At most this many pairs per item."})
    pair_selection: str = field(
        default="comparator_reward", metadata={"help": "'comparator_reward', 'reward_gap', 'random' or 'all'."}
    )

    centralized_ported: ClassVar[bool] = True

    def __post_init__(self):
        selection = str(self.pair_selection).strip().lower()
        if selection not in COMPARISON_PAIR_SELECTIONS:
            raise ValueError(
                f"`pair_selection` must be one of {', '.join(COMPARISON_PAIR_SELECTIONS)}; "
                f"got {self.pair_selection!r}."
            )
        self.pair_selection = "reward_gap" if selection == "comparator_reward" else selection  # MADPO's checks
        super().__post_init__()
        self.pair_selection = selection
        self._check_iterative_fields()

    def _generation_batch(self) -> tuple[int, int, None]:
        # Pairs are sampled and trained by the iterative loop, not in TRL's generation batches: one step per batch.
        return self.rollout_buffer_size * self.num_generations, 1, None


class IterativePairs:
    """The iterative trainers' shared steps (CoMLRL's `_IterativePreferenceTrainerMixin`), mixed into a team trainer
    whose `args` has `IterativePreferenceFields`: each iteration's pairs of the current policy against the comparator
    over the training set, the shard, the training pairs drawn by the replay mode and the iteration's log entries."""

    replay_shards: list[ReplayShard]
    reward_range: tuple[float, float] | None

    @classmethod
    def _given_config(cls, args: tuple, kwargs: dict):
        """The config passed to the constructor (CoMLRL's `args`, 15th by position), checked for the trainer's kind;
        `None` when none was given (the trainer then builds `default_config_cls()`)."""
        config = kwargs.get("args") if "args" in kwargs else (args[14] if len(args) > 14 else None)
        if config is not None and not isinstance(config, cls.default_config_cls):
            raise TypeError(
                f"`args` is a {type(config).__name__}; {cls.__name__} needs a {cls.default_config_cls.__name__}."
            )
        return config

    @classmethod
    def _reward_bounds(cls, config, args: tuple, kwargs: dict) -> tuple[float, float] | None:
        """The task reward's `reward_range`, which `log_reward_distribution` needs (checked before anything loads)."""
        if not (config or cls.default_config_cls).log_reward_distribution:
            return None
        reward = kwargs.get("reward_func", kwargs.get("reward_funcs", args[7] if len(args) > 7 else None))
        funcs = reward if isinstance(reward, (list, tuple)) else [reward]
        bounds = next((b for b in (reward_range(f) for f in funcs if f is not None) if b is not None), None)
        if bounds is None:
            raise ValueError(
                "`log_reward_distribution=True` needs the reward's range: set `reward_func.reward_range = (min, "
                "max)` (CoMLRL's `set_reward_range`), or turn `log_reward_distribution` off."
            )
        return bounds

    def _init_iterations(self, bounds: tuple[float, float] | None, distributed_alternative: str) -> None:
        self.num_iterations = 1  # TRL's meaning (updates per generation batch); CoMLRL's is `args.num_iterations`
        if self.args.world_size > 1:
            raise NotImplementedError(
                f"{type(self).__name__} runs in one process: its pair sampling and replay are not distributed yet. "
                f"Launch it without `accelerate launch`/`torchrun` (or use {distributed_alternative}, which is)."
            )
        self.reward_range = bounds
        self.replay_shards = []

    def _check_train_arguments(self, resume_from_checkpoint, checkpoint_dir, interval, total_limit, kwargs) -> None:
        if resume_from_checkpoint is not None or checkpoint_dir is not None or total_limit is not None:
            raise NotImplementedError(
                "CoMLRL's iteration checkpoints (`train(checkpoint_dir=..., resume_from_checkpoint=...)`) are not "
                f"ported for {self.algorithm_name}: set `policy_checkpoint_dir` to save the agents after every "
                "iteration."
            )
        if interval != 1 or kwargs:
            raise TypeError(
                f"train() got checkpoint_interval={interval!r} and {sorted(kwargs)}: generation settings "
                "are config fields here, and iteration checkpoints are not ported."
            )
        if self.train_dataset is None:
            raise ValueError("Training needs a `train_dataset`: pass `train_dataset=` to the trainer.")

    def _output_path(self, configured: str | None, name: str) -> str:
        return configured or os.path.join(self.args.output_dir, name)

    @property
    def preference_replay_dir(self) -> str:
        """Where the iteration shards go: `preference_replay_dir`, else `output_dir/preference_replay`."""
        return self._output_path(self.args.preference_replay_dir, "preference_replay")

    @property
    def policy_checkpoint_dir(self) -> str | None:
        """Where the policy checkpoints go (`None`: not saved)."""
        return self.args.policy_checkpoint_dir

    def _training_pairs(
        self, it: int, current: list[dict], candidates: tuple[list[float], list[float]], total: int
    ) -> tuple[list[dict], dict[str, float]]:
        """Write iteration `it`'s shard (0-based `it`, 1-based file name), draw the training pairs by the replay mode,
        and return them with the iteration's log entries (`total`: training pairs of the earlier iterations)."""
        args = self.args
        shard = write_shard(self.preference_replay_dir, it + 1, current)
        if shard is not None:
            self.replay_shards.append(shard)
        train_pairs = replay_selection(
            args.preference_replay_mode,
            current,
            self.replay_shards,
            args.preference_replay_k,
            args.preference_replay_lambda,
            args.preference_replay_sample_size,
        )
        logs = {
            "iter/current_iteration": float(it + 1),
            "iter/current_preference_pairs": float(len(current)),
            "iter/total_preference_pairs": float(total + len(train_pairs)),
            "iter/train_preference_pairs": float(len(train_pairs)),
        }
        if args.log_reward_distribution:
            logs.update(distribution_metrics("iter/reward_distribution", it, *candidates))
            selected = [  # (target, comparator) raw rewards of the training pairs that record them
                [r[key] for r in train_pairs if r.get(key) is not None]
                for key in ("target_raw_reward", "comparator_raw_reward")
            ]
            logs.update(distribution_metrics("iter/selected_reward_distribution", it, *selected, len(train_pairs)))
        return train_pairs, logs

    def _iteration_pairs(self) -> tuple[list[dict], tuple[list[float], list[float]]]:
        """This iteration's pair records over the whole training set, and every candidate's raw reward (current,
        comparator)."""
        args, dataset = self.args, self.train_dataset
        width = args.preference_num_candidates
        comparator_width = args.comparator_num_candidates or width
        records, raw_current, raw_comparator = [], [], []
        for start in range(0, len(dataset), args.rollout_buffer_size):
            items = [dataset[j] for j in range(start, min(start + args.rollout_buffer_size, len(dataset)))]
            current = self._candidates(items, width)
            comparator = self._candidates(items, comparator_width)  # "current"/"current_copy": another draw
            for mine, theirs in zip(current, comparator):
                raw_current += mine["raw"]
                raw_comparator += theirs["raw"]
                records += self._item_records(mine, theirs)
        return records, (raw_current, raw_comparator)

    @torch.no_grad()
    def _candidates(self, items: list[dict], width: int) -> list[dict[str, Any]]:
        """Per item: each agent's prompt, its `width` completions, the joint rewards (`preference.iterative`)."""
        return candidate_sets(self.sample(items, width), width, self.reward_weights)[: len(items)]

    def _item_records(self, current: dict, comparator: dict) -> list[dict[str, Any]]:
        """One item's pairs as CoMLRL's JSON records, with the sampled token ids (`preference.iterative`)."""
        return comparison_records(current, comparator, self.args.pair_selection, self.args.preference_pairs_per_sample)


class MADPOIterTrainer(IterativePairs, MADPOTrainer):
    """Iterative MADPO with CoMLRL 1.4.3's `MADPOIterTrainer` arguments (those of `MADPOTrainer`).

    `train()` runs the iterations described in the module docstring; `evaluate`, `save_model` are `MADPOTrainer`'s.
    Logs go through Trainer's `log` (and so `report_to`), one entry per `logging_steps` updates and one per iteration.
    """

    default_config_cls = MADPOIterConfig
    algorithm_name = "MADPOIter"

    def __init__(self, *args, **kwargs):
        bounds = self._reward_bounds(self._given_config(args, kwargs), args, kwargs)
        super().__init__(*args, **kwargs)
        self._init_iterations(bounds, "MADPOTrainer")

    # ------------------------------------------------------------------ the loop

    def train(
        self,
        resume_from_checkpoint: str | bool | None = None,
        checkpoint_dir: str | None = None,
        checkpoint_interval: int = 1,
        checkpoint_total_limit: int | None = None,
        **kwargs,
    ):
        """Run `num_iterations` iterations: sample pairs against the comparator, write the shard, select the training
        pairs, train on them. Returns the number of updates."""
        self._check_train_arguments(
            resume_from_checkpoint, checkpoint_dir, checkpoint_interval, checkpoint_total_limit, kwargs
        )
        args = self.args
        self.model.train()
        if self.optimizer is None:
            self.create_optimizer()
        self.current_gradient_accumulation_steps = 1
        if self.policy_checkpoint_dir:
            self.save_model(os.path.join(self.policy_checkpoint_dir, "initial"))
        updates, total = 0, 0
        for it in range(args.num_iterations):
            current, candidates = self._iteration_pairs()
            train_pairs, logs = self._training_pairs(it, current, candidates, total)
            total += len(train_pairs)
            self.log(logs)
            updates = self._train_pairs(train_pairs, updates)
            if self.policy_checkpoint_dir:
                self.save_model(os.path.join(self.policy_checkpoint_dir, f"iteration_{it:04d}"))
        return updates

    def _record_tokens(self, record: dict) -> list[tuple[list[int], list[int], list[int]]]:
        """Each agent's `(prompt, winner, loser)` token ids of a record: the sampled ones, or, for a record without
        them (a CoMLRL shard), the text re-tokenized as CoMLRL does (the prompt with special tokens, completions
        without)."""
        if record.get("token_ids") is not None:
            return record_tokens(record)
        tokens = []
        for i in range(self.num_agents):
            tokenizer = self._agent_views[i]["processing_class"]
            tokenizer = getattr(tokenizer, "tokenizer", tokenizer)
            texts = [
                str((record.get(key) or [""] * self.num_agents)[i])
                for key in ("prompts", "winner_completions", "loser_completions")
            ]
            tokens.append(
                (
                    tokenizer.encode(texts[0], add_special_tokens=True),
                    tokenizer.encode(texts[1], add_special_tokens=False),
                    tokenizer.encode(texts[2], add_special_tokens=False),
                )
            )
        return tokens

    def _train_pairs(self, records: list[dict], updates: int) -> int:
        """MADPO's loop over `records` (`num_train_epochs` shuffled passes, `train_batch_size` pairs per update);
        returns the updates seen so far."""
        args = self.args
        per_update = args.comlrl_train_batch_size or args.rollout_buffer_size
        records = list(records)
        for _ in range(int(args.num_train_epochs)):
            random.shuffle(records)  # CoMLRL: Python's random, every pass
            for start in range(0, len(records), per_update):
                if args.eval_interval > 0 and updates % args.eval_interval == 0 and self.eval_dataset is not None:
                    self.evaluate()
                    self.model.train()
                batch = records[start : start + per_update]
                weight = torch.ones(len(batch), device=self.accelerator.device)
                inputs = self._preference_rows([self._record_tokens(r) for r in batch], weight)
                self.optimizer.zero_grad()
                loss = self._compute_loss(self.model, inputs)
                self.accelerator.backward(loss)
                if args.max_grad_norm is not None and args.max_grad_norm > 0:
                    self._clip_grad_norm(self.model)
                self.optimizer.step()
                updates += 1
                self.state.global_step += 1
                self._metrics["train"]["pairs/count"].append(float(len(batch)))
                chosen = sum(float(r.get("winner_reward", 0.0)) for r in batch) / len(batch)  # CoMLRL: 0 if missing
                self._metrics["train"]["pairs/chosen_reward"].append(chosen)
                if self.state.global_step % max(int(args.logging_steps), 1) == 0:
                    self.log({})
        return updates


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


__all__ = ["IterativePairs", "IterativePreferenceFields", "MADPOIterConfig", "MADPOIterTrainer"]
