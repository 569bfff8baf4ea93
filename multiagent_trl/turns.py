"""Multi-turn episodes: the transition between turns, turn names in metrics, and the episode table.

The rollout's shape (tree or linear trajectories), its returns and its credit are plain data in `rollout_tree`.

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
import math
from collections.abc import Callable, Sequence
from typing import Any

from .rollout_tree import Level, paths, sample_members

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
    name = getattr(transition, "__name__", type(transition).__name__)
    shown = repr(prompts)
    shown = shown if len(shown) <= 200 else shown[:200] + "..."
    if not isinstance(prompts, (list, tuple)) or len(prompts) != num_agents:
        got = f"{len(prompts)} values" if isinstance(prompts, (list, tuple)) else f"a {type(prompts).__name__}"
        raise ValueError(
            f"`external_transition` ({name}) returned {got} after turn {turn}: {shown}. It must return a list of "
            f"{num_agents} prompts, one per agent (each a string or a conversation: a list of message dicts)."
        )
    for i, prompt in enumerate(prompts):
        if not is_prompt(prompt):
            raise ValueError(
                f"`external_transition` ({name}) returned {shown} after turn {turn}: agent {i}'s prompt is a "
                f"{type(prompt).__name__}; each prompt must be a string or a conversation (a list of message dicts "
                "with 'role' and 'content')."
            )
    if style == "comlrl" and not passthrough and formatters is not None:
        prompts = [
            formatter(row, external_prompts=prompt) if _takes_external_prompts(formatter) else prompt
            for formatter, prompt in zip(formatters, prompts, strict=True)
        ]
    return list(prompts)


def is_prompt(prompt: Any) -> bool:
    """Whether `prompt` is a prompt: a string, or a conversation (a list of message dicts with a role).

    >>> is_prompt("Hi"), is_prompt([{"role": "user", "content": "Hi"}]), is_prompt(None), is_prompt(["Hi"])
    (True, True, False, False)
    """
    return isinstance(prompt, str) or (
        isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m for m in prompt)
    )


def _takes_external_prompts(formatter: Callable) -> bool:
    try:
        parameters = inspect.signature(formatter).parameters
    except (TypeError, ValueError):
        return False
    return "external_prompts" in parameters or any(p.kind == p.VAR_KEYWORD for p in parameters.values())


def turn_prefix(turn: int) -> str:
    """The metric prefix of turn index `turn`: turns are numbered from 1 in every name, as CoMLRL numbers them.

    >>> turn_prefix(0)
    'turn_1/'
    """
    return f"turn_{turn + 1}/"


def episode_rows(levels: list[Level], reward_names: list[str], process_index: int) -> list[dict[str, Any]]:
    """This process's part of a multi-turn batch's completions table: one row per root sample, following its path
    (`rollout_tree.paths`): its first prompt (agent 0's), every turn's completions (`[turn k]`, then `[agent_i] ...`),
    its return, and per turn each reward function's value and each `log_extra` column (`turn_k/<name>`, NaN or
    `None` where the path had ended)."""
    table = []
    for path in paths(levels):
        _, n0, j0 = path[0]
        lines: list[str] = []
        row: dict[str, Any] = {"prompt": levels[0].nodes[n0].prompts[0]}
        row["return"] = float(levels[0].returns[n0, j0].mean())
        played = {t: (n, j) for t, n, j in path}
        for t, level in enumerate(levels):
            n, j = played.get(t, (None, None))
            tuples = len(level.nodes) * level.samples
            index = None if n is None else process_index * tuples + n * level.samples + j
            if n is not None:
                lines.append(f"[turn {t + 1}]")
                members = sample_members(level, n, j, len(level.rollouts))
                lines.extend(
                    f"[agent_{i}] {completion_text(level.rollouts[i].completions[k])}" for i, k in enumerate(members)
                )
            for k, name in enumerate(reward_names):
                row[f"{turn_prefix(t)}{name}"] = math.nan if index is None else float(level.rewards_per_func[index, k])
            for column, values in level.extras.items():
                row[f"{turn_prefix(t)}{column}"] = None if index is None else values[index]
        row["completion"] = "\n".join(lines)
        table.append(row)
    return table


def completion_text(completion) -> str:
    """A completion as text: plain completions as they are, conversational ones by their content."""
    if isinstance(completion, str):
        return completion
    return "\n".join(str(message.get("content", "")) for message in completion)
