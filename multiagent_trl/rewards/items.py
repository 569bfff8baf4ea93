"""Rewards called once per dataset item: `item_reward` turns a function that scores one item's completions (one
list of `num_generations` completions per agent, as CoMLRL's actor-critic calls it) into a joint reward function of
the core's convention, for any team trainer (`reward_funcs=[item_reward(f, None, N, G)]`)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable

import torch

from .joint import comlrl_arguments, comlrl_passing, tensor_values


def item_reward(
    func: Callable,
    processor: Callable[[float], float] | None,
    num_agents: int,
    num_generations: int,
) -> Callable:
    """CoMLRL's actor-critic reward calling, as a reward function for the core: `func` is called once per dataset
    item and turn, with one list of the item's `num_generations` completions per agent (and `prompts`, the agents'
    prompts of that turn, and `batch_items=[item]` where it takes them), as CoMLRL 1.4.3's IAC and MAAC call it.

    What `func` returns, after `processor` is applied to each value: one value (every agent, every completion),
    `num_generations` values (one per joint sample, shared by the agents), or `num_agents` values (one per agent,
    shared by the completions; read per joint sample when `num_agents == num_generations`, as CoMLRL reads it).
    """
    name = getattr(func, "__name__", type(func).__name__)
    passing, keywords = comlrl_passing(func, num_agents)  # the core's reading of CoMLRL's conventions

    def reward(prompts, completions, batch_items=None, **kwargs):  # the core's TRL convention: joint samples
        per_agent = [list(c) for c in zip(*completions)] if num_agents > 1 else [list(completions)]  # (N, samples)
        samples = len(per_agent[0])
        if samples % num_generations:
            raise RuntimeError(f"{samples} joint samples do not split into items of {num_generations}.")
        values: list[list[float]] = []  # per item: N lists of G
        for start in range(0, samples, num_generations):
            turn_prompts = list(prompts[start]) if num_agents > 1 else [prompts[start]]
            lists = [c[start : start + num_generations] for c in per_agent]
            args, kw = comlrl_arguments(passing, keywords, turn_prompts, lists, [batch_items[start]])
            raw = _as_floats(func(*args, **kw), name)
            if processor is not None:
                raw = [float(processor(r)) for r in raw]
            values.append(_expand(raw, num_agents, num_generations, name))
        if num_agents > 1 and any(not _shared(v) for v in values):  # some item scored the agents apart
            return [[v[i][g] for i in range(num_agents)] for v in values for g in range(num_generations)]
        return [v[0][g] for v in values for g in range(num_generations)]

    reward.__name__ = name
    return reward


def _shared(per_agent: list[list[float]]) -> bool:
    return all(values == per_agent[0] for values in per_agent)


def _expand(values: list[float], num_agents: int, num_generations: int, name: str) -> list[list[float]]:
    """One item's rewards as `[agent][generation]`, by CoMLRL's length rules (per generation before per agent)."""
    if len(values) == 1:
        return [values * num_generations for _ in range(num_agents)]
    if len(values) == num_generations:
        return [list(values) for _ in range(num_agents)]
    if len(values) == num_agents:
        return [[v] * num_generations for v in values]
    raise ValueError(
        f"Reward function '{name}' returned {len(values)} values for one item: return 1 value, num_generations "
        f"({num_generations}) values, or num_agents ({num_agents}) values."
    )


def _as_floats(values, name: str) -> list[float]:
    if isinstance(values, torch.Tensor):
        values = tensor_values(values.reshape(-1), name)
    elif isinstance(values, numbers.Real):
        values = [values]
    out = []
    for value in list(values):
        if isinstance(value, torch.Tensor):
            value = value.item()
        if not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
            raise ValueError(f"Reward function '{name}' returned {value!r}; rewards must be finite numbers.")
        out.append(float(value))
    return out
