"""One optimizer for the team, parameter groups per agent (and per critic): their own learning rates and clipping."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from accelerate import Accelerator

logger = logging.getLogger(__name__)


@dataclass
class ParameterGroup:
    """Parameters the optimizer and the gradient clipping treat apart: an agent's, or a critic's."""

    params: list[torch.nn.Parameter]
    lr: float | None  # its learning rate; `None`: Trainer's
    metric: str  # its gradient norm's metric name
    tags: dict = field(default_factory=dict)  # written into its optimizer groups (`{"agent": i}`)


def split_by_owner(optimizer: torch.optim.Optimizer, groups: Sequence[ParameterGroup]) -> torch.optim.Optimizer:
    """Split each of `optimizer`'s parameter groups (Trainer's decay / no decay) into one group per owner in `groups`,
    with the owner's learning rate (or the group's own) and tags; a scheduler then scales every group's rate by the
    same factor. Returns `optimizer`, regrouped in place.

    >>> a, b = torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)
    >>> opt = torch.optim.AdamW([*a.parameters(), *b.parameters()], lr=1.0)
    >>> owners = [ParameterGroup(list(a.parameters()), 0.1, "a"), ParameterGroup(list(b.parameters()), None, "b")]
    >>> [group["lr"] for group in split_by_owner(opt, owners).param_groups]
    [0.1, 1.0]
    """
    owner = {id(p): k for k, group in enumerate(groups) for p in group.params}
    regrouped = []
    for group in optimizer.param_groups:
        for k, owned in enumerate(groups):
            params = [p for p in group["params"] if owner[id(p)] == k]
            if params:
                lr = owned.lr if owned.lr is not None else group["lr"]
                regrouped.append({**group, "params": params, "lr": lr, "initial_lr": lr, **owned.tags})
    optimizer.param_groups.clear()
    for group in regrouped:
        optimizer.add_param_group(group)
    return optimizer


def warn_owners_left_out(optimizer: torch.optim.Optimizer, groups: Sequence[ParameterGroup]) -> list[str]:
    """Warn, once each, of the owners in `groups` of which `optimizer` holds no parameter (none requires gradients),
    which therefore never train; returns them, named by their tags (`"agent 0"`, `"critic 1"`). A warning, not an
    error: a frozen partner agent may be meant.

    >>> a, b = torch.nn.Linear(1, 1), torch.nn.Linear(1, 1).requires_grad_(False)
    >>> opt = torch.optim.AdamW(a.parameters())
    >>> owners = [ParameterGroup(list(m.parameters()), None, "", {"agent": i}) for i, m in enumerate((a, b))]
    >>> warn_owners_left_out(opt, owners)
    ['agent 1']
    """
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    left_out = [
        " ".join(f"{key} {value}" for key, value in group.tags.items()) or group.metric
        for group in groups
        if not any(id(p) in held for p in group.params)
    ]
    for owner in left_out:
        logger.warning(
            "%s has no parameter in the optimizer (none requires gradients): it will not train. Unfreeze its "
            "parameters before `train()` if it should.",
            owner.capitalize(),
        )
    return left_out


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


def check_finite_loss(loss: torch.Tensor, name: str, step: int, accelerator: Accelerator | None = None) -> None:
    """Raise a `FloatingPointError` naming the loss (`name`) and the training `step` when `loss` is NaN or infinite,
    before it is backpropagated: one non-finite loss turns every weight it reaches into NaN, while Trainer's logged
    loss filters it out (`logging_nan_inf_filter`). With several processes every one raises, so none waits on the
    others in a collective.

    >>> check_finite_loss(torch.tensor(0.5), "value loss", 1)
    >>> check_finite_loss(torch.tensor(float("inf")), "value loss (`agent_0/value_loss`)", 3)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    FloatingPointError: The value loss (`agent_0/value_loss`) is inf at training step 3: ...
    """
    local = torch.isfinite(loss.detach()).all().float()
    finite = local
    if accelerator is not None and accelerator.num_processes > 1:
        finite = accelerator.gather(local[None]).min()
    if finite.item() == 1.0:
        return
    value = loss.detach().float()
    shown = "not finite on another process" if local.item() == 1.0 else "not finite"
    shown = f"{value.item()}" if value.numel() == 1 and local.item() != 1.0 else shown
    raise FloatingPointError(
        f"The {name} is {shown} at training step {step}: training stopped before this step's update, so no weight "
        "holds NaN. Likely causes: rewards too large for the training precision (a squared error of a reward near "
        "1e20 overflows float32: scale them, e.g. with a `reward_processor`), or a learning rate high enough to "
        "diverge."
    )
