"""CoMLRL's iterative steps over the training set (its `_IterativePreferenceTrainerMixin`), mixed into a CoMLRL
iterative trainer: each iteration's pairs of the current policy against the comparator with every candidate's raw
reward, the shard and replay draw (`MARLHFIterTrainer`), the iteration's `iter/...` log entries, and the CoMLRL
constructor and `train()` checks. `MADPOIterTrainer` uses the draw, the logs and the checks; its rounds, shards and
replay are the native `IterativeRounds`'."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch

from ..preference.iterative import candidate_sets, comparison_records
from ..preference.replay import ReplayShard, replay_selection, write_shard
from ..rewards.joint import reward_range


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
        return train_pairs, self.iteration_logs(it, len(current), candidates, train_pairs, total + len(train_pairs))

    def iteration_logs(
        self, it: int, drawn: int, candidates: tuple[list[float], list[float]], train_pairs: list[dict], total: int
    ) -> dict[str, float]:
        """Iteration `it`'s (0-based) `iter/...` log entries: `drawn` pairs, `total` training pairs so far, and with
        `log_reward_distribution` the candidates' and the training pairs' raw reward distributions."""
        logs = {
            "iter/current_iteration": float(it + 1),
            "iter/current_preference_pairs": float(drawn),
            "iter/total_preference_pairs": float(total),
            "iter/train_preference_pairs": float(len(train_pairs)),
        }
        if self.args.log_reward_distribution:
            logs.update(distribution_metrics("iter/reward_distribution", it, *candidates))
            selected = [  # (target, comparator) raw rewards of the training pairs that record them
                [r[key] for r in train_pairs if r.get(key) is not None]
                for key in ("target_raw_reward", "comparator_raw_reward")
            ]
            logs.update(distribution_metrics("iter/selected_reward_distribution", it, *selected, len(train_pairs)))
        return logs

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


__all__ = ["IterativePairs", "distribution_metrics"]
