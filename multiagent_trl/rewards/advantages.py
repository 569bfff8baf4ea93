"""Advantage baselines: what each reward is compared with inside its group of `num_generations` (G) samples.

TRL's `GRPOTrainer` computes GRPO's advantage, `(r - mean(group)) / std(group)`. `advantage_baseline` names other
baselines from the policy-gradient literature; this module computes them from the same rewards:

- `"mean"`: the group mean (GRPO; the trainer leaves it to TRL).
- `"none"`: no baseline, the advantage is the reward (REINFORCE).
- `"max"`: the group's best reward, so the best sample gets 0 and the others less (ReMax-like).
- `"leave_one_out"`: the mean of the *other* G - 1 rewards (RLOO), `A_j = (G r_j - sum_k r_k) / (G - 1)`.

With `scale_rewards` other than `"none"`, the baselined values are then centered and divided by their standard
deviation (per group for `"group"`, over the batch for `"batch"`), with TRL's estimator (unbiased, `+ 1e-4`).
Centering removes any constant per group, so after normalization every baseline gives GRPO's advantages, as in
CoMLRL, which combines `advantage_mode` with `advantage_normalization` the same way.
"""

from __future__ import annotations

import torch
from trl.trainer.utils import nanstd


def baseline_advantages(
    rewards: torch.Tensor, num_generations: int, baseline: str, scale_rewards: str
) -> torch.Tensor:
    """Advantages of `rewards` (1-D, groups of `num_generations` in order; NaN means "no reward") under `baseline`.

    NaN rewards take no part in their group's baseline or scale, and get advantage 0, as in TRL.

    >>> r = torch.tensor([1.0, 2.0, 3.0, 6.0])
    >>> baseline_advantages(r, 4, "none", "none").tolist()
    [1.0, 2.0, 3.0, 6.0]
    >>> baseline_advantages(r, 4, "max", "none").tolist()
    [-5.0, -4.0, -3.0, 0.0]
    >>> [round(a, 4) for a in baseline_advantages(r, 4, "leave_one_out", "none").tolist()]  # r_j - mean(others)
    [-2.6667, -1.3333, 0.0, 4.0]
    """
    grouped = rewards.view(-1, num_generations)  # (groups, G)
    if baseline == "mean":
        advantages = grouped - torch.nanmean(grouped, dim=1, keepdim=True)
    elif baseline == "none":
        advantages = grouped.clone()
    elif baseline == "max":
        best = torch.nan_to_num(grouped, nan=-torch.inf).amax(dim=1, keepdim=True)
        advantages = grouped - best
    elif baseline == "leave_one_out":
        scored = (~torch.isnan(grouped)).sum(dim=1, keepdim=True)
        total = torch.nansum(grouped, dim=1, keepdim=True)
        # A group with a single scored sample has no "others": its advantage is 0, like GRPO's.
        advantages = torch.where(scored > 1, (scored * grouped - total) / (scored - 1).clamp(min=1), 0.0 * grouped)
    else:
        raise ValueError(f"Unknown advantage baseline {baseline!r}.")
    if scale_rewards == "group":
        advantages = (advantages - torch.nanmean(advantages, dim=1, keepdim=True)) / (
            nanstd(advantages, dim=1).unsqueeze(1) + 1e-4
        )
    elif scale_rewards == "batch":
        advantages = (advantages - torch.nanmean(advantages)) / (nanstd(advantages) + 1e-4)
    elif scale_rewards != "none":
        raise ValueError(f"Unknown scale_rewards {scale_rewards!r}: use 'group', 'batch' or 'none'.")
    return torch.nan_to_num(advantages, nan=0.0).flatten()


def local_baseline_advantages(
    rewards: torch.Tensor, group: int, baseline: str, scale_rewards: str, process_index: int, num_processes: int
) -> torch.Tensor:
    """This process's slice of the advantages of `rewards` (gathered, one per sample of the generation batch, in
    groups of `group`) under `baseline` (`advantage_baseline`).

    >>> local_baseline_advantages(torch.tensor([1.0, 3.0, 0.0, 0.0]), 2, "none", "none", 1, 2)
    tensor([0., 0.])
    """
    advantages = baseline_advantages(rewards, group, baseline, scale_rewards)
    size = len(advantages) // num_processes
    return advantages[process_index * size :][:size]
