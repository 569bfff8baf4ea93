"""The per-row evaluation pass: every evaluated row's trajectory (each agent's completion at every turn, the joint
reward of every turn), collected while `Trainer.evaluate` runs, for metrics computed over whole trajectories.

TRL's evaluation averages per-batch metrics (`eval_reward`, ...). Some metrics need the completions themselves, row
by row and turn by turn (did the code pass its tests at turn 2? how many rows improved after feedback?). A trainer
with `record_eval_trajectories = True` records them during the evaluation loop (gathered across processes, in
dataset order) and hands them to its `trajectory_metrics(trajectories)`, whose returned metrics are logged with the
others under the `eval_` prefix.
"""

from __future__ import annotations

import copy
import math
import numbers
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from accelerate.utils import gather_object
from transformers import GenerationConfig

from .tree import Level, sample_members


@dataclass
class EvalTrajectories:
    """What an evaluation produced, one entry per evaluated trajectory (one per row with `num_generations_eval=1`).

    `completions[i][j]` and `prompts[i][j]` are agent i's completions and prompts on trajectory j, one per turn
    played; `rewards[j][t]` is trajectory j's joint reward at turn t (after the reward processor), `nan` where no
    function scored; a trajectory that ended early has fewer turns.
    """

    num_agents: int
    rows: list[dict[str, Any]] = field(default_factory=list)
    prompts: list[list[list]] = field(default_factory=list)
    completions: list[list[list]] = field(default_factory=list)
    rewards: list[list[float]] = field(default_factory=list)

    def __post_init__(self):
        self.prompts = self.prompts or [[] for _ in range(self.num_agents)]
        self.completions = self.completions or [[] for _ in range(self.num_agents)]

    def __len__(self) -> int:
        return len(self.rows)


class EvalRecorder:
    """Collects `EvalTrajectories`, fed by the trainer with every evaluated batch's rollout."""

    def __init__(self, num_agents: int):
        self.trajectories = EvalTrajectories(num_agents)

    def record(self, levels: list[Level], episode_paths: list[list[tuple[int, int, int]]]) -> None:
        """Record one batch's trajectories, one per path (`rollout.tree.paths`; gathered across processes, in
        order): its row, and at every turn it played each agent's prompt and completion and the joint reward."""
        record, num_agents = self.trajectories, self.trajectories.num_agents
        local = []
        for path in episode_paths:
            prompts, completions, rewards = [[] for _ in range(num_agents)], [[] for _ in range(num_agents)], []
            for t, n, j in path:
                level = levels[t]
                for i, k in enumerate(sample_members(level, n, j, num_agents)):
                    prompts[i].append(level.agent_rows[i][k]["prompt"])
                    completions[i].append(level.rollouts[i].completions[k])
                rewards.append(float(torch.nanmean(level.rewards[n, j])))
            local.append((levels[0].nodes[path[0][1]].row, prompts, completions, rewards))
        for row, prompts, completions, rewards in gather_object(local):
            record.rows.append(row)
            record.rewards.append(rewards)
            for i in range(num_agents):
                record.prompts[i].append(prompts[i])
                record.completions[i].append(completions[i])


def turn_metrics(trajectories: EvalTrajectories, num_turns: int) -> dict[str, float]:
    """Per turn k (1-based), over the trajectories: `turn_k/reward_mean`, the mean joint reward at turn k, and
    `turn_k/expected_return`, the mean undiscounted sum of the rewards from turn k on (a turn not played counts 0).

    >>> t = EvalTrajectories(1, rows=[{}, {}], rewards=[[1.0, 2.0], [3.0]])
    >>> turn_metrics(t, 2)  # doctest: +ELLIPSIS
    {'turn_1/reward_mean': 2.0, 'turn_1/expected_return': 3.0, 'turn_2/reward_mean': 2.0, ...}
    """
    metrics: dict[str, float] = {}
    if not trajectories.rewards:
        return metrics
    for t in range(num_turns):
        played = [r[t] for r in trajectories.rewards if len(r) > t]
        returns = [sum(x for x in r[t:] if x == x) for r in trajectories.rewards]  # x == x: not NaN
        metrics[f"turn_{t + 1}/reward_mean"] = float(sum(played) / len(played)) if played else 0.0
        metrics[f"turn_{t + 1}/expected_return"] = float(sum(returns) / len(returns))
    return metrics


@contextmanager
def greedy_decoding(views: list[dict[str, Any]], greedy: bool = True) -> Iterator[None]:
    """Inside the block, every agent's view decodes greedily (evaluation with `eval_do_sample=False`); with
    `greedy=False`, nothing changes."""
    if not greedy:
        yield
        return
    configs = [view["generation_config"] for view in views]
    for view, config in zip(views, configs):
        view["generation_config"] = _greedy(config)
    try:
        yield
    finally:
        for view, config in zip(views, configs):
            view["generation_config"] = config


def _greedy(config: GenerationConfig) -> GenerationConfig:
    greedy = copy.deepcopy(config)
    greedy.do_sample = False
    greedy.temperature = greedy.top_p = greedy.top_k = greedy.min_p = None
    return greedy


def role_trajectories(collaboration, trajectories: EvalTrajectories) -> EvalTrajectories:
    """One writer's evaluation trajectories as the roles' (`[role][row][turn]`, each role with its own prompt), the
    layout CoMLRL's `eval_logger` receives from a centralized team; the rewards are the joint ones. `collaboration`
    is a `rewards.centralized.CentralizedCollaboration` (its `num_roles`, `role_prompts` and `split_eval`)."""
    rows = trajectories.rows
    role_prompts = [collaboration.role_prompts(row) for row in rows]  # (rows, roles)
    return EvalTrajectories(
        collaboration.num_roles,
        rows=rows,
        prompts=[
            [[prompts[r]] * len(turns) for prompts, turns in zip(role_prompts, trajectories.completions[0])]
            for r in range(collaboration.num_roles)
        ],
        completions=collaboration.split_eval(trajectories.completions, rows),
        rewards=trajectories.rewards,
    )


def row_logger_metrics(row_logger, aggregator, trajectories: EvalTrajectories, num_turns: int) -> dict[str, float]:
    """Metrics from a per-row logger and its aggregator: `row_logger(agent_completions_turns=, batch_items=,
    prompts=)` returns one dict per evaluated row, `aggregator(per_row, num_turns=)` the finite numbers to log."""
    if not len(trajectories):
        return {}
    per_row = row_logger(
        agent_completions_turns=trajectories.completions,
        batch_items=trajectories.rows,
        prompts=[row.get("prompt", "") for row in trajectories.rows],
    )
    if not isinstance(per_row, (list, tuple)) or not all(isinstance(m, dict) for m in per_row):
        raise TypeError(
            f"`eval_logger` returned {type(per_row).__name__}; it must return a list with one dict of metrics "
            f"per evaluated row ({len(trajectories)} rows)."
        )
    aggregated = aggregator(per_row, num_turns=num_turns)
    if not isinstance(aggregated, dict):
        raise TypeError(f"`eval_aggregator` returned {type(aggregated).__name__}; it must return a dict of metrics.")
    metrics = {}
    for key, value in aggregated.items():
        value = value.item() if isinstance(value, torch.Tensor) else value
        if not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
            raise TypeError(f"`eval_aggregator` returned {key}={value!r}; metrics must be finite numbers.")
        metrics[key] = float(value)
    return metrics
