"""One optimizer for the team, a parameter group per agent: per-agent learning rates on Trainer's optimizer."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from accelerate import Accelerator


def split_by_agent(
    optimizer: torch.optim.Optimizer, owners: dict[int, int], learning_rates: Sequence[float] | None
) -> torch.optim.Optimizer:
    """Split each of `optimizer`'s parameter groups (Trainer's decay / no decay) into one group per agent, with the
    agent's learning rate (`learning_rates[i]`, or the group's own); a scheduler then scales every group's rate by
    the same factor. `owners` maps `id(parameter)` to its agent. Returns `optimizer`, regrouped in place.

    >>> a, b = torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)
    >>> opt = torch.optim.AdamW([*a.parameters(), *b.parameters()], lr=1.0)
    >>> owners = {**{id(p): 0 for p in a.parameters()}, **{id(p): 1 for p in b.parameters()}}
    >>> [group["lr"] for group in split_by_agent(opt, owners, [0.1, 0.2]).param_groups]
    [0.1, 0.2]
    """
    groups = []
    for group in optimizer.param_groups:
        for i in sorted(set(owners.values())):
            params = [p for p in group["params"] if owners[id(p)] == i]
            if params:
                lr = learning_rates[i] if learning_rates is not None else group["lr"]
                groups.append({**group, "params": params, "lr": lr, "initial_lr": lr, "agent": i})
    optimizer.param_groups.clear()
    for group in groups:
        optimizer.add_param_group(group)
    return optimizer


def logged_losses(losses: Sequence[torch.Tensor | float], accelerator: Accelerator, accumulation: int) -> list[float]:
    """Each agent's loss of one micro-batch, as `agent_{i}/loss` logs it: on the scale of Trainer's `loss`.

    TRL's loss is already divided over the accumulation window; Trainer logs the window's sum per optimizer step
    (averaged over processes), while TRL's metrics are averaged over their entries, one per micro-batch here. So each
    entry is multiplied by the window's length (`accumulation`): the agents' logged losses then add up to the logged
    `loss`.
    """
    device = accelerator.device
    stacked = torch.stack([torch.as_tensor(loss, dtype=torch.float32, device=device) for loss in losses])
    return (accelerator.gather(stacked[None]).mean(dim=0) * accumulation).tolist()  # (N,)
