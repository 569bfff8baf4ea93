"""Multi-turn episodes: the transition between turns and the discounted return-to-go.

An episode runs `num_turns` turns. After turn t, `external_transition` reads what the agents answered and returns
each agent's prompt for turn t + 1 (feedback from a checker, test results, the other agent's answer). Two calling
conventions are accepted, told apart by the function's signature:

- this library's: `external_transition(row, histories, turn) -> prompts`, with `row` the dataset row (every
  column), `histories[i]` the list of agent i's completions in turns 0..turn, and `turn` the index of the turn just
  played; it returns one prompt per agent (text or a conversation), used as it is.
- CoMLRL's keyword convention: `external_transition(prompt=, agent_completions=, num_agents=,
  prompt_history_per_agent=, response_history_per_agent=)`; its prompts go through each agent's formatter as
  `formatter(row, external_prompts=prompt)` unless `external_prompt_passthrough=True`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch

COMLRL_TRANSITION_PARAMETERS = ("agent_completions", "prompt_history_per_agent", "response_history_per_agent")


def transition_style(func: Callable) -> str:
    """`"comlrl"` for CoMLRL's keyword convention, `"native"` for `f(row, histories, turn)`.

    >>> transition_style(lambda row, histories, turn: [])
    'native'
    >>> transition_style(lambda prompt, agent_completions, **kwargs: [])
    'comlrl'
    """
    if not callable(func):
        raise TypeError(f"`external_transition` must be a callable; got {type(func).__name__}.")
    try:
        parameters = inspect.signature(func).parameters
    except (TypeError, ValueError) as err:
        raise TypeError("Cannot read the signature of `external_transition`.") from err
    if any(name in parameters for name in COMLRL_TRANSITION_PARAMETERS):
        return "comlrl"
    positional = [p for p in parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) < 3 and not any(p.kind == p.VAR_POSITIONAL for p in parameters.values()):
        raise TypeError(
            "`external_transition` must take `(row, histories, turn)` and return one prompt per agent (or use "
            "CoMLRL's keywords `prompt, agent_completions, num_agents, prompt_history_per_agent, "
            f"response_history_per_agent`); it takes ({', '.join(parameters)})."
        )
    return "native"


def next_prompts(
    transition: Callable,
    style: str,
    row: dict[str, Any],
    histories: Sequence[list],
    prompt_histories: Sequence[list],
    turn: int,
    formatters: Sequence[Callable] | None,
    passthrough: bool,
) -> list:
    """Call the transition for one trajectory; return the agents' prompts for turn `turn + 1`, checked."""
    num_agents = len(histories)
    if style == "native":
        prompts = transition(row, [list(h) for h in histories], turn)
    else:
        prompts = transition(
            prompt=row.get("prompt", ""),
            agent_completions=[h[-1] for h in histories],
            num_agents=num_agents,
            prompt_history_per_agent=[list(h) for h in prompt_histories],
            response_history_per_agent=[list(h) for h in histories],
        )
    if not isinstance(prompts, (list, tuple)) or len(prompts) != num_agents:
        got = f"{len(prompts)} values" if isinstance(prompts, (list, tuple)) else type(prompts).__name__
        raise ValueError(
            f"`external_transition` returned {got} after turn {turn}; it must return a list of {num_agents} prompts, "
            "one per agent."
        )
    if style == "comlrl" and not passthrough and formatters is not None:
        prompts = [
            formatter(row, external_prompts=prompt) if _takes_external_prompts(formatter) else prompt
            for formatter, prompt in zip(formatters, prompts, strict=True)
        ]
    return list(prompts)


def _takes_external_prompts(formatter: Callable) -> bool:
    try:
        parameters = inspect.signature(formatter).parameters
    except (TypeError, ValueError):
        return False
    return "external_prompts" in parameters or any(p.kind == p.VAR_KEYWORD for p in parameters.values())


def returns_to_go(rewards: torch.Tensor, discount: float) -> torch.Tensor:
    """Discounted return-to-go `R_t = r_t + discount * R_{t+1}` of per-turn rewards shaped `(turns, trajectories)`.

    A NaN reward (a trajectory that has ended, or a turn no reward function scored) makes that turn's return NaN (no
    advantage there) and counts as 0 in the earlier turns' returns.

    >>> returns_to_go(torch.tensor([[1.0, 0.0], [2.0, float("nan")]]), discount=0.5)
    tensor([[2., 0.],
            [2., nan]])
    """
    returns = torch.empty_like(rewards)
    future = torch.zeros_like(rewards[0])
    for t in range(rewards.size(0) - 1, -1, -1):
        future = torch.nan_to_num(rewards[t], nan=0.0) + discount * future
        returns[t] = torch.where(torch.isnan(rewards[t]), rewards[t], future)
    return returns
