"""Drawing preference candidates from a team trainer: the one part of the preference family that plays a team
(`MultiAgentGRPOTrainer` or a subclass) outside its training step. What it returns is plain data for `pairs`,
`reward_training` and `replay`.

`collect_preference_pairs` plays the team on a whole dataset (`MultiAgentGRPOTrainer.sample`: every agent's K
completions of each row and the joint rewards of the K aligned joint samples), split over the processes, and pairs
them by CoMLRL's selection (MARLHF's first stage), with what the sampling records kept out of the training logs.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from accelerate.utils import gather_object

from .pairs import check_pair_set, played_pairs
from .reward_training import JointPreferencePair

if TYPE_CHECKING:
    from ..team.protocol import TeamTrainer


def prompts_per_call(generation_batch_size: int, num_candidates: int) -> int:
    """Prompts whose `num_candidates` candidates are generated in one call: a training generation batch's rows (at
    least one prompt). RLHF's pair stage and the iterative rounds' draws both batch by it."""
    return max(generation_batch_size // num_candidates, 1)


def collect_preference_pairs(
    trainer: TeamTrainer,
    dataset,
    num_candidates: int,
    pair_selection: str = "reward_gap",
    pairs_per_sample: int | None = 16,
    items_per_call: int = 1,
) -> list[JointPreferencePair]:
    """Play `trainer`'s team on every item of `dataset` and pair its joint samples by the trainer's reward.

    Each agent samples `num_candidates` completions per item with the trainer's sampling settings (its own prompt
    from the trainer's `formatters`), the trainer's reward functions score the K aligned joint samples (weighted and
    passed through its `reward_processor`, as in training), and `pairs_from_candidates` pairs them. Items are split
    over the processes and the pairs gathered, so that every process gets every pair, in dataset order.

    Args:
        trainer: A team trainer (`MultiAgentGRPOTrainer` or a subclass) holding the current policies and the task
            reward. Its training metrics are left untouched.
        dataset: The items (rows with a `"prompt"` column, or what the trainer's formatters read).
        num_candidates: K, the joint candidates per item (at least 2).
        pair_selection, pairs_per_sample: CoMLRL's selection (`pairs.select_pairs`).
        items_per_call: Items generated together (K completions each); CoMLRL generates one item at a time.

    Returns:
        The pairs, item by item. Raises `ValueError` (`check_pair_set`) when no item gave a pair.
    """
    if num_candidates < 2:
        raise ValueError(f"A pair needs two joint candidates: `num_candidates` must be >= 2, got {num_candidates}.")
    if items_per_call < 1:
        raise ValueError(f"`items_per_call` must be at least 1, got {items_per_call}.")
    if trainer.args.num_turns != 1:
        raise ValueError(f"Preference pairs come from one-turn episodes: `num_turns` is {trainer.args.num_turns}.")
    rows = [dict(row) for row in dataset]
    if not rows:
        raise ValueError("No item to draw preference pairs from: the dataset is empty.")
    accelerator = trainer.accelerator
    rank, world = accelerator.process_index, accelerator.num_processes
    local = rows[rank::world]
    calls = math.ceil(math.ceil(len(rows) / world) / items_per_call)  # the same on every process (collectives)
    pairs: list[JointPreferencePair] = []
    training = trainer.model.training
    trainer.model.train()
    try:
        with trainer.metrics_aside(), torch.no_grad():
            for c in range(calls):
                chunk = local[c * items_per_call : (c + 1) * items_per_call]
                real = len(chunk)
                chunk = chunk or rows[:1]  # a process out of items plays one and keeps nothing
                level = trainer.sample(chunk, num_candidates)
                rewards, selected = played_pairs(level, num_candidates, rank, pair_selection, pairs_per_sample, real)
                for n, winner, loser in selected:
                    pairs.append(
                        JointPreferencePair(
                            prompts=tuple(level.nodes[n].prompts),
                            chosen=tuple(r.completions[n * num_candidates + winner] for r in level.rollouts),
                            rejected=tuple(r.completions[n * num_candidates + loser] for r in level.rollouts),
                            chosen_reward=float(rewards[n][winner]),
                            rejected_reward=float(rewards[n][loser]),
                        )
                    )
    finally:
        trainer.model.train(training)
    if world > 1:
        pairs = [p for shard in gather_object([pairs]) for p in shard]
    check_pair_set(len(pairs), len(rows), num_candidates, pair_selection)
    return pairs


__all__ = ["collect_preference_pairs", "prompts_per_call"]
