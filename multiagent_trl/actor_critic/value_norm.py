"""Value-target normalization: a critic learns its targets standardized by running statistics, so that its scale
does not depend on the reward's.

Without it a critic whose head starts near 0 must climb to the reward's scale by optimizer steps: with rewards of
order 50 (the tutorial's ratio x100) and Adam at 3e-4, its values stay near 0 for the whole run, `y - V_old` is the
reward itself, and the "baseline" is only the batch mean of the advantage normalization (docs/actor-critic.md,
"Value normalization", has the runs). With it (`ActorCriticConfig.value_normalization`) the critic regresses
`(y - mean) / std` and its outputs are read back as `v * std + mean`, the scheme of MAPPO's `ValueNorm` (Yu et al.,
2022, "The Surprising Effectiveness of PPO in Cooperative Multi-Agent Games"): exponential moving averages of the
targets' first two moments, debiased for their zero start.
"""

from __future__ import annotations

import torch
from torch import nn


class ValueNormalizer(nn.Module):
    """Running mean and variance of one critic's value targets, and the maps between their scale and the critic's.

    Before the first `update` it is the identity. The statistics are buffers: `state_dict` saves them with a
    checkpoint and `load_state_dict` restores them.

    >>> norm = ValueNormalizer(decay=0.0)  # no memory: the last batch's statistics
    >>> norm.normalize(torch.tensor([50.0])).item()  # the identity before any update
    50.0
    >>> norm.update(torch.tensor([40.0, 60.0]))
    >>> norm.normalize(torch.tensor([40.0, 60.0])).tolist()
    [-1.0, 1.0]
    >>> norm.denormalize(torch.tensor([0.5])).tolist()
    [55.0]
    """

    def __init__(self, decay: float = 0.99, min_variance: float = 1e-4):
        super().__init__()
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"`decay` must be in [0, 1), got {decay}.")
        self.decay, self.min_variance = decay, min_variance
        self.register_buffer("running_mean", torch.zeros((), dtype=torch.float64))
        self.register_buffer("running_mean_sq", torch.zeros((), dtype=torch.float64))
        self.register_buffer("debias", torch.zeros((), dtype=torch.float64))  # 1 - decay^updates: the weight seen

    def stats(self) -> tuple[torch.Tensor, torch.Tensor]:
        """`(mean, std)` of the targets seen (float64 scalars); `(0, 1)` before any update."""
        if self.debias.item() == 0.0:
            return torch.zeros((), dtype=torch.float64), torch.ones((), dtype=torch.float64)
        mean = self.running_mean / self.debias
        variance = (self.running_mean_sq / self.debias - mean**2).clamp(min=self.min_variance)
        return mean, variance.sqrt()

    @torch.no_grad()
    def update(self, targets: torch.Tensor) -> None:
        """Move the statistics toward the finite values of `targets` (any shape; NaN ones are skipped)."""
        values = targets.detach().double().flatten()
        values = values[torch.isfinite(values)].to(self.running_mean.device)
        if values.numel() == 0:
            return
        keep = self.decay
        self.running_mean.mul_(keep).add_((1 - keep) * values.mean())
        self.running_mean_sq.mul_(keep).add_((1 - keep) * (values**2).mean())
        self.debias.mul_(keep).add_(1 - keep)

    def normalize(self, values: torch.Tensor) -> torch.Tensor:
        """Targets in the critic's scale: `(y - mean) / std`, in `values`' dtype and device."""
        mean, std = (s.to(values.device) for s in self.stats())
        return ((values.double() - mean) / std).to(values.dtype)

    def denormalize(self, values: torch.Tensor) -> torch.Tensor:
        """The critic's outputs in the targets' scale: `v * std + mean`, in `values`' dtype and device."""
        mean, std = (s.to(values.device) for s in self.stats())
        return (values.double() * std + mean).to(values.dtype)


__all__ = ["ValueNormalizer"]
