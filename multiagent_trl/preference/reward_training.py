"""MARLHF's reward-model stage, as CoMLRL 1.4.3 runs it: preference pairs of joint samples ranked by the task reward,
then a `JointRewardModel` trained on them with the Bradley-Terry loss.

1. Pairs (`pairs_from_candidates`; `sampling.collect_preference_pairs` plays a team for them): per item, K joint
   candidates (candidate k is every
   agent's k-th completion) scored by the task reward (with its `reward_processor`), then CoMLRL's selection
   (`pairs.select_pairs`: strict reward order, stable ties). A pair holds each agent's prompt and the winning and
   losing joint completions. A round without any pair raises (`pairs.check_pair_set`).
2. Training (`train_reward_model`): shuffled batches of pairs (a `DataLoader` with `shuffle=True`, torch's global
   generator, as CoMLRL), per batch the winners' and the losers' joint texts scored in two forwards,
   `bradley_terry_loss`, one AdamW step (weight decay 0.01, constant learning rate, no clipping: CoMLRL's optimizer).
   With a frozen backbone the features of each joint sample are computed once, before the steps (`frozen_features`).
   Every step's loss, accuracy (winner scored higher) and margin come back (CoMLRL logs nothing).

TRL's `RewardTrainer` is not used: it trains a sequence classifier (the joint reward model is a causal LM with its own
head, read at the last attended token), appends an end token to text and drops (not truncates) rows longer than its
`max_length`; with CoMLRL's settings (AdamW with weight decay 0.01 on every parameter, no schedule, no clipping, a
fresh shuffle each epoch) what is left of it is the short loop below.

Everything here takes and returns plain data; drawing the candidates from a team trainer is `sampling`'s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader

from ..team.optim import check_finite_loss
from .losses import bradley_terry_loss
from .pairs import check_pair_set, select_pairs
from .reward_model import JointRewardModel, joint_text


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


# ---- 2. training


def train_reward_model(
    model: JointRewardModel,
    pairs: Sequence[JointPreferencePair],
    learning_rate: float = 1e-5,
    num_train_epochs: int = 1,
    batch_size: int = 1,
    weight_decay: float = 0.01,
    optimizer: torch.optim.Optimizer | None = None,
    margin_scale: float = 0.0,
) -> list[dict[str, float]]:
    """Train `model` with the Bradley-Terry loss on `pairs` (CoMLRL 1.4.3's MARLHF reward-model stage).

    Args:
        model: The joint reward model (with its tokenizer); left in eval mode. With its backbone frozen
            (`model.frozen_backbone`), every distinct joint sample goes through the backbone once (`frozen_features`)
            and the steps train the head on those features: the same steps, without the backbone's forwards.
        pairs: The preference pairs (`collect_preference_pairs`, or your own: human preferences work the same).
        learning_rate, num_train_epochs, batch_size: CoMLRL's `reward_learning_rate` (`1e-5`),
            `reward_num_train_epochs` (`1`), `reward_train_batch_size` (`1`).
        weight_decay: AdamW's (torch's default `0.01`, CoMLRL's).
        optimizer: Use this optimizer instead of a new `AdamW(model.parameters(), learning_rate, weight_decay)`.
        margin_scale: Beyond CoMLRL (`0`, its loss): the Bradley-Terry loss asks each winner to lead by
            `margin_scale * (chosen_reward - rejected_reward)` (`losses.bradley_terry_loss`'s margin), in score units
            per unit of the pairs' task reward. Pairs without rewards (NaN) get no margin.

    Returns:
        One dict per step: `epoch`, `step`, `loss`, `accuracy` (the share of pairs whose winner scored higher) and
        `margin` (mean `score(chosen) - score(rejected)`), measured before the step's update.

    The batches are drawn as CoMLRL draws them (a shuffled `DataLoader` on torch's global generator, reshuffled each
    epoch), so the same torch seed gives CoMLRL's order.
    """
    check_pair_set(len(pairs), len(pairs), 2)
    if learning_rate <= 0:
        raise ValueError(f"`learning_rate` (CoMLRL's `reward_learning_rate`) must be > 0, got {learning_rate}.")
    if margin_scale < 0 or not math.isfinite(margin_scale):
        raise ValueError(f"`margin_scale` must be a finite number >= 0 (0: CoMLRL's loss); got {margin_scale}.")
    if num_train_epochs < 1 or batch_size < 1:
        raise ValueError(f"`num_train_epochs` and `batch_size` must be >= 1; got {num_train_epochs}, {batch_size}.")
    if optimizer is None:
        optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=weight_decay)
    loader = DataLoader(list(pairs), batch_size=batch_size, shuffle=True, collate_fn=list, num_workers=0)
    # Beyond CoMLRL, which runs the backbone on every batch: a frozen backbone's features never change, so each
    # distinct joint sample is read once (without dropout, as a fixed feature extractor) and the steps train the head.
    features = frozen_features(model, pairs) if model.frozen_backbone else None
    model.train()
    history = []
    step = 0
    for epoch in range(num_train_epochs):
        for batch in loader:
            if features is None:
                chosen = model.score_joint([p.prompts for p in batch], [p.chosen for p in batch])  # (B,)
                rejected = model.score_joint([p.prompts for p in batch], [p.rejected for p in batch])  # (B,)
            else:
                chosen = model.score_features(torch.stack([features[p.prompts, p.chosen] for p in batch]))
                rejected = model.score_features(torch.stack([features[p.prompts, p.rejected] for p in batch]))
            margin = None
            if margin_scale > 0:
                gaps = torch.tensor([p.chosen_reward - p.rejected_reward for p in batch])  # (B,)
                margin = margin_scale * torch.nan_to_num(gaps, nan=0.0)
            loss = bradley_terry_loss(chosen, rejected, margin)
            check_finite_loss(loss, "reward-model loss (`reward_model/loss`)", step + 1)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            lead = (chosen - rejected).detach().float()
            history.append(
                {
                    "epoch": float(epoch + 1),
                    "step": float(step),
                    "loss": loss.item(),
                    "accuracy": (lead > 0).float().mean().item(),
                    "margin": lead.mean().item(),
                }
            )
    model.eval()
    return history


def frozen_features(
    model: JointRewardModel, pairs: Sequence[JointPreferencePair], chunk: int = 64
) -> dict[tuple[tuple, tuple], torch.Tensor]:
    """`{(prompts, completions): (F,) features}` of every distinct joint sample of `pairs`, read by `model`'s frozen
    backbone in eval mode, `chunk` samples per forward."""
    samples = list(dict.fromkeys((p.prompts, c) for p in pairs for c in (p.chosen, p.rejected)))
    model.eval()
    with torch.no_grad():
        rows = [
            model.joint_features([s[0] for s in samples[i : i + chunk]], [s[1] for s in samples[i : i + chunk]])
            for i in range(0, len(samples), chunk)
        ]
    return dict(zip(samples, torch.cat(rows)))


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
    "pairs_from_candidates",
    "summarize",
    "train_reward_model",
]
