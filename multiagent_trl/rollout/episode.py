"""A multi-turn rollout as one training batch: the played levels' returns, each agent's rows in advantage groups,
the value each row is credited with, and how many rows are trained.

`episode_batch` takes the levels (`rollout.tree`) and returns plain data; the collectives it needs go through the
`accelerator` it is handed (every process calls it, as the trainer's step does).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from accelerate import Accelerator
from accelerate.utils import gather
from trl.trainer.utils import nanstd

from .replay import Rollout
from .tree import Level, batch_layout, returns, successor_rows
from .turns import turn_prefix

ROW_AVERAGED_LOSSES = ("grpo", "sapo", "luspo", "dr_grpo")  # TRL's losses that average (or divide) over rows


@dataclass
class EpisodeBatch:
    """Each agent's training batch over a whole rollout."""

    agent_rows: list[list[dict]]  # (agents, rows): the dataset row and prompt of every training row
    rollouts: list[Rollout]  # (agents,): the completions of those rows, untrained ones masked
    credit: list[torch.Tensor]  # (agents,) of (rows * processes, 1): the return each row is credited with, gathered
    trained_rows: torch.Tensor | None  # 0-d: trained rows over every process (`None`: every row is trained)
    trained: torch.Tensor | None = None  # (rows,) bool: this process's trained rows (`None`: a single turn)
    turns: torch.Tensor | None = None  # (rows,): each row's turn (`None`: a single turn)
    successors: torch.Tensor | None = None  # (rows,): the row continuing each row's sample next turn, -1 if none


def episode_batch(
    levels: list[Level], args, num_agents: int, mode: str, accelerator: Accelerator, metrics: dict[str, list]
) -> EpisodeBatch:
    """Each agent's training rows over the whole rollout (`tree.batch_layout`), with their rollouts and credited
    returns (`tree.returns`, stored in each `level.returns`). Logs into `metrics` (TRL's `_metrics[mode]`) the expected
    return and the node count per turn, and the episode's return as `reward`."""
    device = accelerator.device
    stand = args.ended_return == "stand"
    for turn, (level, value) in enumerate(zip(levels, returns(levels, args.discount, args.num_turns, stand))):
        level.returns = value
        node_returns = torch.nanmean(value.mean(dim=2), dim=1)[level.scored()]  # (real nodes,)
        stats = torch.tensor([node_returns.nansum(), len(node_returns)], device=device)
        total, count = accelerator.gather(stats).view(-1, 2).sum(dim=0).tolist()
        metrics[f"{turn_prefix(turn)}expected_return"].append(total / max(count, 1))
        metrics[f"{turn_prefix(turn)}nodes"].append(count)
    root = gather(levels[0].returns.mean(dim=2).flatten().to(device))
    metrics["reward"].append(torch.nanmean(root).item())  # the episode's return
    metrics["reward_std"].append(nanstd(root).item())

    multiple = args.steps_per_generation if mode == "train" else 1  # TRL splits a training batch into steps
    index, keep, credit = batch_layout(
        levels, args.rollout, args.num_turns, args.discount, multiple, args.cross_credit, stand
    )
    agent_rows, rollouts = [], []
    for i in range(num_agents):
        joined = [row for level in levels for row in level.agent_rows[i]]
        agent_rows.append([joined[k] for k in index])
        rollouts.append(Rollout.concat([level.rollouts[i] for level in levels], index).masked(keep))
    trained_rows = gather(torch.tensor([float(sum(keep))], device=device)).sum()
    credit = [gather(c.to(device).unsqueeze(1)) for c in credit]
    trained = torch.tensor(keep, device=device)
    turns = successors = None
    if all(level.width == 1 for level in levels[1:]):  # one successor per sample: linear, or one completion
        turns, successors = (torch.tensor(v, device=device) for v in successor_rows(levels, index, keep))
    return EpisodeBatch(agent_rows, rollouts, credit, trained_rows, trained, turns, successors)


def trained_row_scale(loss_type: str, rows: int, trained_rows: torch.Tensor | float | None, steps: int) -> float:
    """The factor that makes a micro-batch's loss count trained rows only. TRL's `grpo`, `sapo` and `luspo` losses
    average over a micro-batch's `rows` and `dr_grpo` divides by them; the factor replaces `rows` by the micro-batch's
    share of the generation batch's `trained_rows` (over `steps`: micro-batches times processes), so that a row weighs
    the same whatever shares its micro-batch. 1.0 where every row is trained, for the token-normalized losses
    (`dapo`, `bnpo`, `cispo`, `vespo`: untrained rows have no tokens in the loss), and for a single turn
    (`trained_rows` is `None`).

    >>> trained_row_scale("grpo", rows=4, trained_rows=4.0, steps=2)  # 2 trained rows per step
    2.0
    >>> trained_row_scale("dapo", rows=4, trained_rows=4.0, steps=2)
    1.0
    """
    if trained_rows is None or loss_type not in ROW_AVERAGED_LOSSES:
        return 1.0
    share = float(trained_rows) / steps
    return rows / share if share > 0 else 1.0
