"""Scoring one turn of a rollout: the joint samples handed to the reward functions, and their rewards turned into
what the rollout keeps (the joint reward, each agent's own, the metrics).

The trainer calls the reward functions itself (TRL's `_calculate_rewards`: async functions, reward models, `None`);
these functions prepare its inputs and read its output, on plain data.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from trl.trainer.utils import nanstd

from ..rollout.tree import Level, cross_credit, sample_members
from .joint import apply_processor, credit_columns, weighted_sum, with_rows


def joint_samples(level: Level, reward_funcs: Sequence) -> tuple[list[dict], list, list, list]:
    """The reward functions' inputs for every joint sample of `level`, node by node: `(rows, prompts, completions,
    completion_ids)`, each entry the tuple of the agents' values (with one agent, the value itself, as TRL gives it).
    `rows` hold each sample's dataset row (and itself as CoMLRL's `batch_items`, where a function asks)."""
    num_agents = len(level.rollouts)
    tuples = [sample_members(level, n, j, num_agents) for n in range(len(level.nodes)) for j in range(level.samples)]

    def joint(per_agent: list[list]) -> list:
        if num_agents == 1:  # a team of one gets exactly what TRL gives a reward function
            return [per_agent[0][t[0]] for t in tuples]
        return [tuple(values[k] for values, k in zip(per_agent, t, strict=True)) for t in tuples]

    level_rows = level.rows()
    rows = with_rows(reward_funcs, [level_rows[t[0]] for t in tuples])
    prompts = [[row["prompt"] for row in rows_i] for rows_i in level.agent_rows]
    completions = joint([r.completions for r in level.rollouts])
    return rows, joint(prompts), completions, joint([r.completion_ids for r in level.rollouts])


def joint_reward(
    rewards_per_func: torch.Tensor,
    weights: torch.Tensor,
    processor: Callable[[float], float] | None,
    names: Sequence[str],
    metrics: dict[str, list],
    prefix: str = "",
) -> torch.Tensor:
    """The joint reward of each scored tuple, `(tuples, F) -> (tuples,)`: the weighted sum of the functions' rewards,
    then the reward `processor`; NaN where no function scored. Logs it and each function's rewards under `prefix`
    into `metrics` (TRL's `_metrics[mode]`).

    >>> m = {"reward": [], "reward_std": [], "rewards/f/mean": [], "rewards/f/std": []}
    >>> joint_reward(torch.tensor([[1.0], [3.0]]), torch.ones(1), None, ["f"], m).tolist(), m["reward"]
    ([1.0, 3.0], [2.0])
    """
    joint = weighted_sum(rewards_per_func, weights)
    if processor is not None:
        joint = apply_processor(processor, joint)
    metrics.setdefault(f"{prefix}reward", []).append(torch.nanmean(joint).item())
    metrics.setdefault(f"{prefix}reward_std", []).append(nanstd(joint).item())
    for k, name in enumerate(names):
        metrics.setdefault(f"{prefix}rewards/{name}/mean", []).append(torch.nanmean(rewards_per_func[:, k]).item())
        metrics.setdefault(f"{prefix}rewards/{name}/std", []).append(nanstd(rewards_per_func[:, k]).item())
    return joint


def level_rewards(
    joint: torch.Tensor,
    agent_rewards: torch.Tensor | None,
    weights: torch.Tensor,
    processor: Callable[[float], float] | None,
    level: Level,
) -> torch.Tensor:
    """This process's rewards of `level`'s samples, `(nodes, samples, A)`: the joint reward (`(tuples,)`, A = 1), or
    each agent's own weighted, processed reward where functions scored the agents apart (`agent_rewards`,
    `(tuples, F, N)`, A = N). Both are this process's slices."""
    per_agent = [joint]
    if agent_rewards is not None:
        per_agent = [weighted_sum(agent_rewards[:, :, i], weights) for i in range(agent_rewards.size(2))]
        if processor is not None:
            per_agent = [apply_processor(processor, r) for r in per_agent]
    return torch.stack(per_agent, dim=1).view(len(level.nodes), level.samples, -1).cpu()


def turn_credit(
    level: Level,
    agent_rewards: torch.Tensor | None,
    processor: Callable[[float], float] | None,
    names: list[str],
    weights: torch.Tensor,
    cross_reduction: str = "mean",
) -> tuple[list[torch.Tensor], list[str], torch.Tensor]:
    """A single turn's credit: each agent's reward columns (gathered, `(rows, F)`, the functions' own, which TRL then
    weighs; `(rows, 1)` after a `processor`, which applies to their weighted sum), with the names and weights TRL
    reads them under. In cross mode each completion is credited with its tuples' rewards (`cross_reduction`)."""
    columns = credit_columns(level.rewards_per_func, level.joint, agent_rewards, processor, weights)
    if processor is not None:
        names, weights = ["reward"], torch.ones(1)
    num_agents, cross = len(level.rollouts), level.samples != level.width
    credited = [columns[i % len(columns)] for i in range(num_agents)]
    if cross:
        credited = [cross_credit(c, level.width, num_agents, i, cross_reduction) for i, c in enumerate(credited)]
    return credited, names, weights
