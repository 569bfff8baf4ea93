"""Per-sample records of an actor-critic batch: `RolloutSample` (CoMLRL's attribute names) and `episode_samples`,
one agent's samples of one episode turn by turn with each turn's reward and its return to go, for callbacks that read
a trainer's rollouts (the CoMLRL port's `metrics_callback`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class RolloutSample:
    """One agent's sample of one turn, with CoMLRL's attribute names (its `metrics_callback` receives these).

    `metadata` holds `turn_idx`, `generation_idx` and `batch_item` (the dataset row). Tensors are 1-D and on the CPU.
    """

    agent_idx: int
    prompt: Any
    completion: Any
    full_input_ids: torch.Tensor
    attention_mask: torch.Tensor
    prompt_len: int
    response_len: int
    old_logprob: torch.Tensor
    old_value: torch.Tensor
    reward: torch.Tensor
    returns: torch.Tensor
    advantage: torch.Tensor
    normalized_advantage: torch.Tensor | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


def episode_samples(
    agent: int, root: int, generation: int, batch, output: dict, row: Any, offset: int, discount: float
):
    """Agent `agent`'s samples of the episode that starts at row `root` of `batch` (a played `TeamBatch`; `output`
    the agent's scored batch), turn by turn: each turn's own reward, and as `returns` the undiscounted sum of the
    rewards from that turn on. `offset` is the process's first row in `batch.credit`; `row` the dataset row."""
    rows = [root]
    while batch.successors is not None and int(batch.successors[rows[-1]]) >= 0:
        rows.append(int(batch.successors[rows[-1]]))
    returns = [float(batch.credit[agent][offset + k].sum()) for k in rows]  # the core's discounted returns
    rewards = [g_t - discount * (0.0 if math.isnan(g_n) else g_n) for g_t, g_n in zip(returns, returns[1:])]
    rewards.append(returns[-1])  # the last turn played: its return is its reward (`ended_return="reward"`)
    to_go = [sum(rewards[t:]) for t in range(len(rewards))]
    return [_sample(agent, k, generation, t, row, rewards[t], to_go[t], batch, output) for t, k in enumerate(rows)]


def _sample(i, k, g, turn, row, reward, returns, batch, output) -> RolloutSample:
    prompt_mask, completion_mask = output["prompt_mask"][k].bool(), output["completion_mask"][k].bool()
    prompt_ids = output["prompt_ids"][k][prompt_mask].cpu()
    completion_ids = output["completion_ids"][k][completion_mask].cpu()
    target = output["value_targets"][k].detach().cpu().reshape(1)
    old = output["old_values"][k].detach().cpu().reshape(1)
    return RolloutSample(
        agent_idx=i,
        prompt=batch.agent_rows[i][k]["prompt"],
        completion=batch.rollouts[i].completions[k],
        full_input_ids=torch.cat([prompt_ids, completion_ids]),
        attention_mask=torch.ones(len(prompt_ids) + len(completion_ids), dtype=torch.long),
        prompt_len=len(prompt_ids),
        response_len=len(completion_ids),
        old_logprob=torch.zeros(1),  # CoMLRL stores it and never reads it; not computed here
        old_value=old,
        reward=torch.tensor([reward]),
        returns=torch.tensor([returns]),
        advantage=target - old,
        normalized_advantage=output["advantages"][k].detach().cpu().reshape(1),
        metadata={
            "turn_idx": turn,
            "generation_idx": g,
            "batch_item": row,
            "value_target": target,
            "adv_target": target,
        },
    )
