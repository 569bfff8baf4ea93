"""Drawing preference candidates from a team trainer: the one part of the preference family that plays a team
(`MultiAgentGRPOTrainer` or a subclass) outside its training step. What it returns is plain data for `pairs`,
`reward_training` and `replay`.

`collect_preference_pairs` plays the team on a whole dataset (`MultiAgentGRPOTrainer.sample`: every agent's K
completions of each row and the joint rewards of the K aligned joint samples), split over the processes, and pairs
them by CoMLRL's selection (MARLHF's first stage), with what the sampling records kept out of the training logs.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from accelerate.utils import gather_object

from .pairs import check_pair_set, played_pairs
from .reward_training import JointPreferencePair

if TYPE_CHECKING:
    from ..team.protocol import TeamTrainer


def prompts_per_call(generation_batch_size: int, num_candidates: int, num_processes: int = 1) -> int:
    """Prompts whose `num_candidates` candidates one process generates in one call: its share of a training
    generation batch (TRL's `generation_batch_size` counts every process's rows), at least one prompt. RLHF's pair
    stage and the iterative rounds' draws both batch by it."""
    return max(generation_batch_size // num_processes // num_candidates, 1)


def process_share(accelerator, rows: list, items_per_call: int) -> Iterator[tuple[list, int]]:
    """This process's share of `rows`, in calls of `items_per_call` rows: `(chunk, real)` per call, the chunk's first
    `real` rows being its own. Every process makes the same number of calls with the same number of rows (a played
    batch is gathered over the processes, which needs equal sizes): with several processes a short chunk is filled
    with copies of a row, whose results the caller drops. The shares are contiguous, so results gathered in process
    order (`gather_in_order`) keep the order of `rows`."""
    world = accelerator.num_processes
    share = math.ceil(len(rows) / world)
    local = rows[accelerator.process_index * share :][:share]
    for start in range(0, share, items_per_call):
        chunk = local[start : start + items_per_call]
        real = len(chunk)
        if world > 1:
            chunk = (chunk + [(chunk or rows)[0]] * items_per_call)[:items_per_call]
        yield chunk, real


def gather_in_order(accelerator, results: list) -> list:
    """Every process's `results` (a list of picklable objects), concatenated in process order, on every process."""
    if accelerator.num_processes == 1:
        return results
    return [item for part in gather_object([results]) for item in part]


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
    rank = trainer.accelerator.process_index
    pairs: list[JointPreferencePair] = []
    training = trainer.model.training
    trainer.model.train()
    try:
        with trainer.metrics_aside(), torch.no_grad():
            for chunk, real in process_share(trainer.accelerator, rows, items_per_call):
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
    pairs = gather_in_order(trainer.accelerator, pairs)
    check_pair_set(len(pairs), len(rows), num_candidates, pair_selection)
    return pairs


__all__ = ["collect_preference_pairs", "gather_in_order", "process_share", "prompts_per_call"]
