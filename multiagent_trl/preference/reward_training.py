"""MARLHF's reward-model stage, as CoMLRL 1.4.3 runs it: preference pairs of joint samples ranked by the task reward,
then a `JointRewardModel` trained on them with the Bradley-Terry loss.

1. Pairs (`pairs_from_candidates`, `collect_preference_pairs`): per item, K joint candidates (candidate k is every
   agent's k-th completion) scored by the task reward (with its `reward_processor`), then CoMLRL's selection
   (`pairs.select_pairs`: strict reward order, stable ties). A pair holds each agent's prompt and the winning and
   losing joint completions. A round without any pair raises (`pairs.check_pair_set`).
2. Training (`train_reward_model`): shuffled batches of pairs (a `DataLoader` with `shuffle=True`, torch's global
   generator, as CoMLRL), per batch the winners' and the losers' joint texts scored in two forwards,
   `bradley_terry_loss`, one AdamW step (weight decay 0.01, constant learning rate, no clipping: CoMLRL's optimizer).
   Every step's loss, accuracy (winner scored higher) and margin come back (CoMLRL logs nothing).

TRL's `RewardTrainer` is not used: it trains a sequence classifier (the joint reward model is a causal LM with its own
head, read at the last attended token), appends an end token to text and drops (not truncates) rows longer than its
`max_length`; with CoMLRL's settings (AdamW with weight decay 0.01 on every parameter, no schedule, no clipping, a
fresh shuffle each epoch) what is left of it is the short loop below.

`collect_preference_pairs` is the one step that needs a team trainer (it plays the team on the items); everything
else takes and returns plain data.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch.utils.data import DataLoader

from ..team.views import metrics_aside
from .losses import bradley_terry_loss
from .pairs import check_pair_set, select_pairs
from .reward_model import JointRewardModel, joint_text

if TYPE_CHECKING:
    from ..trainer import MultiAgentGRPOTrainer


@dataclass(frozen=True)
class JointPreferencePair:
    """Two joint samples of one item, the first ranked higher by the task reward.

    Attributes:
        prompts: `(N,)` each agent's prompt.
        chosen: `(N,)` each agent's completion in the winning joint sample.
        rejected: `(N,)` each agent's completion in the losing joint sample.
        chosen_reward, rejected_reward: Their task rewards (`chosen_reward > rejected_reward`).
    """

    prompts: tuple
    chosen: tuple
    rejected: tuple
    chosen_reward: float = math.nan
    rejected_reward: float = math.nan

    def texts(self) -> tuple[str, str]:
        """The joint texts the reward model reads: `(chosen, rejected)`."""
        return joint_text(self.prompts, self.chosen), joint_text(self.prompts, self.rejected)


# ---- 1. pairs


def pairs_from_candidates(
    prompts: Sequence,
    candidates: Sequence[Sequence],
    rewards: Sequence[float],
    pair_selection: str = "reward_gap",
    pairs_per_sample: int | None = 16,
    rng=None,
) -> list[JointPreferencePair]:
    """One item's preference pairs from its K joint candidates.

    Args:
        prompts: `(N,)` each agent's prompt for the item.
        candidates: `(K, N)` candidate k's completion of each agent.
        rewards: `(K,)` each candidate's (processed) task reward.
        pair_selection, pairs_per_sample, rng: As in `pairs.select_pairs` (CoMLRL's selection).

    >>> pairs = pairs_from_candidates(["Q", "R"], [("a", "b"), ("c", "d"), ("e", "f")], [0.0, 2.0, 1.0], "all", None)
    >>> [(p.chosen, p.rejected) for p in pairs]
    [(('c', 'd'), ('a', 'b')), (('c', 'd'), ('e', 'f')), (('e', 'f'), ('a', 'b'))]
    """
    if len(candidates) != len(rewards):
        raise ValueError(f"{len(candidates)} joint candidates but {len(rewards)} rewards: give one reward each.")
    return [
        JointPreferencePair(
            prompts=tuple(prompts),
            chosen=tuple(candidates[w]),
            rejected=tuple(candidates[lose]),
            chosen_reward=float(rewards[w]),
            rejected_reward=float(rewards[lose]),
        )
        for w, lose in select_pairs(rewards, pair_selection, pairs_per_sample, rng)
    ]


def collect_preference_pairs(
    trainer: MultiAgentGRPOTrainer,
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
    from accelerate.utils import gather_object

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
    metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    training = trainer.model.training
    trainer.model.train()
    try:
        with trainer._swap(_metrics=metrics), metrics_aside(trainer._agent_views), torch.no_grad():
            for c in range(calls):
                chunk = local[c * items_per_call : (c + 1) * items_per_call]
                real = len(chunk)
                chunk = chunk or rows[:1]  # a process out of items plays one and keeps nothing
                inputs = [row for row in chunk for _ in range(num_candidates)]  # each item K times, as TRL's sampler
                agent_inputs = [trainer._agent_inputs(inputs, i) for i in range(trainer.num_agents)]
                level = trainer._play(inputs, agent_inputs, num_candidates, "train")[0]
                nodes = len(level.nodes)
                # (nodes, K): this process's items
                rewards = level.joint.view(-1, num_candidates)[rank * nodes : (rank + 1) * nodes].tolist()
                for n, node in enumerate(level.nodes[:real]):
                    if node.placeholder:
                        continue
                    candidates = [
                        tuple(rollout.completions[n * num_candidates + k] for rollout in level.rollouts)
                        for k in range(num_candidates)
                    ]
                    pairs += pairs_from_candidates(
                        node.prompts, candidates, rewards[n], pair_selection, pairs_per_sample
                    )
    finally:
        trainer.model.train(training)
    if world > 1:
        pairs = [p for shard in gather_object([pairs]) for p in shard]
    check_pair_set(len(pairs), len(rows), num_candidates, pair_selection)
    return pairs


# ---- 2. training


def train_reward_model(
    model: JointRewardModel,
    pairs: Sequence[JointPreferencePair],
    learning_rate: float = 1e-5,
    num_train_epochs: int = 1,
    batch_size: int = 1,
    weight_decay: float = 0.01,
    optimizer: torch.optim.Optimizer | None = None,
) -> list[dict[str, float]]:
    """Train `model` with the Bradley-Terry loss on `pairs` (CoMLRL 1.4.3's MARLHF reward-model stage).

    Args:
        model: The joint reward model (with its tokenizer); left in eval mode.
        pairs: The preference pairs (`collect_preference_pairs`, or your own: human preferences work the same).
        learning_rate, num_train_epochs, batch_size: CoMLRL's `reward_learning_rate` (`1e-5`),
            `reward_num_train_epochs` (`1`), `reward_train_batch_size` (`1`).
        weight_decay: AdamW's (torch's default `0.01`, CoMLRL's).
        optimizer: Use this optimizer instead of a new `AdamW(model.parameters(), learning_rate, weight_decay)`.

    Returns:
        One dict per step: `epoch`, `step`, `loss`, `accuracy` (the share of pairs whose winner scored higher) and
        `margin` (mean `score(chosen) - score(rejected)`), measured before the step's update.

    The batches are drawn as CoMLRL draws them (a shuffled `DataLoader` on torch's global generator, reshuffled each
    epoch), so the same torch seed gives CoMLRL's order.
    """
    check_pair_set(len(pairs), len(pairs), 2)
    if learning_rate <= 0:
        raise ValueError(f"`learning_rate` (CoMLRL's `reward_learning_rate`) must be > 0, got {learning_rate}.")
    if num_train_epochs < 1 or batch_size < 1:
        raise ValueError(f"`num_train_epochs` and `batch_size` must be >= 1; got {num_train_epochs}, {batch_size}.")
    if optimizer is None:
        optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=weight_decay)
    loader = DataLoader(list(pairs), batch_size=batch_size, shuffle=True, collate_fn=list, num_workers=0)
    model.train()
    history = []
    step = 0
    for epoch in range(num_train_epochs):
        for batch in loader:
            chosen = model.score([joint_text(p.prompts, p.chosen) for p in batch])  # (B,)
            rejected = model.score([joint_text(p.prompts, p.rejected) for p in batch])  # (B,)
            loss = bradley_terry_loss(chosen, rejected)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            margin = (chosen - rejected).detach().float()
            history.append(
                {
                    "epoch": float(epoch + 1),
                    "step": float(step),
                    "loss": loss.item(),
                    "accuracy": (margin > 0).float().mean().item(),
                    "margin": margin.mean().item(),
                }
            )
    model.eval()
    return history


def summarize(history: Sequence[dict[str, float]], num_pairs: int) -> dict[str, float]:
    """The metrics logged for a reward-model stage: the last epoch's mean loss, accuracy and margin, the step count
    and the pairs trained on, keyed `reward_model/...`.

    >>> summarize([{"epoch": 1.0, "loss": 0.9, "accuracy": 0.0, "margin": -1.0},
    ...            {"epoch": 2.0, "loss": 0.5, "accuracy": 1.0, "margin": 1.0}], num_pairs=1)["reward_model/loss"]
    0.5
    """
    last = [h for h in history if h["epoch"] == history[-1]["epoch"]]
    out = {f"reward_model/{key}": sum(h[key] for h in last) / len(last) for key in ("loss", "accuracy", "margin")}
    out.update({"reward_model/steps": float(len(history)), "reward_model/pairs": float(num_pairs)})
    return out


__all__ = [
    "JointPreferencePair",
    "collect_preference_pairs",
    "pairs_from_candidates",
    "summarize",
    "train_reward_model",
]
