"""Multi-turn episodes: the transition between turns, turn names in metrics, and the episode table.

The rollout's shape (tree or linear trajectories), its returns and its credit are plain data in `rollout.tree`.

An episode runs `num_turns` turns. After turn t, `external_transition` reads what the agents answered and returns
each agent's prompt for turn t + 1 (feedback from a checker, test results, the other agent's answer). Two calling
conventions are accepted, told apart by the function's signature:

- this library's: `external_transition(row, histories, turn) -> prompts`, with `row` the dataset row (every
  column), `histories[i]` the list of agent i's completions in turns 0..turn, and `turn` the index of the turn just
  played; it returns one prompt per agent (text or a conversation), used as it is.
- CoMLRL's keyword convention: `external_transition(prompt=, agent_completions=, num_agents=,
  prompt_history_per_agent=, response_history_per_agent=)`; its prompts go through each agent's formatter as
  `formatter(row, external_prompts=prompt)` unless `external_prompt_passthrough=True`. A function that names one of
  these keywords, or that takes them but not three positional arguments (`transition(**kwargs)`: CoMLRL calls every
  transition with keywords only), is called this way.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .tree import Level, Node, paths, sample_members

COMLRL_TRANSITION_PARAMETERS = ("agent_completions", "prompt_history_per_agent", "response_history_per_agent")
# Every keyword CoMLRL passes to a transition (it passes nothing by position).
COMLRL_TRANSITION_KEYWORDS = ("prompt", "num_agents", *COMLRL_TRANSITION_PARAMETERS)


def transition_style(func: Callable) -> str:
    """`"comlrl"` for CoMLRL's keyword convention, `"native"` for `f(row, histories, turn)`.

    >>> transition_style(lambda row, histories, turn: [])
    'native'
    >>> transition_style(lambda prompt, agent_completions, **kwargs: [])
    'comlrl'
    >>> transition_style(lambda **kwargs: [])  # CoMLRL passes keywords only, so this works there
    'comlrl'
    """
    if not callable(func):
        raise TypeError(f"`external_transition` must be a callable; got {type(func).__name__}.")
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError) as err:
        raise TypeError("Cannot read the signature of `external_transition`.") from err
    parameters = signature.parameters
    if any(name in parameters for name in COMLRL_TRANSITION_PARAMETERS):
        return "comlrl"
    if _accepts(signature, None, None, None):  # (row, histories, turn)
        return "native"
    if _accepts(signature, **dict.fromkeys(COMLRL_TRANSITION_KEYWORDS)):
        return "comlrl"
    raise TypeError(
        "`external_transition` must take `(row, histories, turn)` and return one prompt per agent (or use "
        "CoMLRL's keywords `prompt, agent_completions, num_agents, prompt_history_per_agent, "
        f"response_history_per_agent`); it takes ({', '.join(parameters)})."
    )


def _accepts(signature: inspect.Signature, *args: Any, **kwargs: Any) -> bool:
    try:
        signature.bind(*args, **kwargs)
    except TypeError:
        return False
    return True


@dataclass
class Transition:
    """The trainer's `external_transition`, called for one joint sample of a node: `transition(node, sample)` returns
    the agents' prompts for the child node (checked, and through the formatters for CoMLRL's convention)."""

    func: Callable
    formatters: Sequence[Callable] | None = None
    passthrough: bool = False  # CoMLRL's `external_prompt_passthrough`

    def __post_init__(self):
        self.style = transition_style(self.func)

    def __call__(self, node: Node, sample: list) -> list:
        return next_prompts(
            self.func,
            self.style,
            node.row,
            [h + [c] for h, c in zip(node.response_history, sample, strict=True)],
            [h + [p] for h, p in zip(node.prompt_history, node.prompts, strict=True)],
            node.turn,
            self.formatters,
            self.passthrough,
        )


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


def completion_rows(
    levels: list[Level], advantages: list[list[float]], reward_names: list[str], process_index: int
) -> list[dict[str, Any]]:
    """This process's rows of the completions table, one per root sample following its path (`rollout.tree.paths`;
    in cross mode the tuple `(k, ..., k)`): `prompt` (agent 0's), `completion` (the agents' side by side, every turn
    with several turns), `advantage` (agent 0's), `rewards` and `extra` columns. One turn: each reward function's
    value, each agent's completion and advantage, and the `log_extra` columns. Several turns: the path's `return`,
    and per turn (`turn_k/...`) each function's value and `log_extra` column (NaN or `None` where it had ended).
    `advantages[i]` are agent i's, the root's rows first."""
    num_agents, multi_turn = len(levels[0].rollouts), len(levels) > 1
    table = []
    for k, path in enumerate(paths(levels)):
        _, n0, j0 = path[0]
        row: dict[str, Any] = {"prompt": levels[0].agent_rows[0][k]["prompt"], "advantage": advantages[0][k]}
        row["rewards"], row["extra"], lines = {}, {}, []
        played = {t: (n, j) for t, n, j in path}
        for t, level in enumerate(levels):
            n, j = played.get(t, (None, None))
            index = None if n is None else process_index * len(level.nodes) * level.samples + n * level.samples + j
            prefix = turn_prefix(t) if multi_turn else ""
            columns = row["extra"] if multi_turn else row["rewards"]
            for f, name in enumerate(reward_names):
                columns[prefix + name] = math.nan if index is None else float(level.rewards_per_func[index, f])
            for column, values in level.extras.items():
                row["extra"][prefix + column] = None if index is None else values[index]
            if n is None:
                continue
            completions = [
                level.rollouts[i].completions[m] for i, m in enumerate(sample_members(level, n, j, num_agents))
            ]
            if multi_turn:
                lines.append(f"[turn {t + 1}]")
            lines.extend(f"[agent_{i}] {completion_text(c)}" for i, c in enumerate(completions))
            if not multi_turn and num_agents == 1:
                row["completion"] = completions[0]  # as TRL logs it (a conversation stays one)
        if multi_turn:
            row["rewards"]["return"] = float(levels[0].returns[n0, j0].mean())
        elif num_agents > 1:
            for i in range(num_agents):
                row["extra"][f"agent_{i}/completion"] = completion_text(levels[0].rollouts[i].completions[k])
                row["extra"][f"agent_{i}/advantage"] = advantages[i][k]
        row.setdefault("completion", "\n".join(lines))
        table.append(row)
    return table


def completion_text(completion) -> str:
    """A completion as text: plain completions as they are, conversational ones by their content."""
    if isinstance(completion, str):
        return completion
    return "\n".join(str(message.get("content", "")) for message in completion)


def add_completion_rows(logs: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    """Append `completion_rows`' rows (gathered) to TRL's completions-table buffer `logs` (`GRPOTrainer._logs`)."""
    for row in rows:
        logs["prompt"].append(row["prompt"])
        logs["completion"].append(row["completion"])
        logs["advantages"].append(row["advantage"])
        for name, value in row["rewards"].items():
            logs["rewards"][name].append(value)
        for column, value in row["extra"].items():
            logs["extra"][column].append(value)


def formatted_rows(rows: list[dict], formatter: Callable | None, agent: int) -> list[dict]:
    """Agent `agent`'s rows: each row with its `"prompt"` built by the agent's `formatter` (the rows as they are
    without one); raises, naming the formatter, where one returns something that is not a prompt.

    >>> formatted_rows([{"q": "2+2"}], lambda row: "Q: " + row["q"], 0)
    [{'q': '2+2', 'prompt': 'Q: 2+2'}]
    """
    if formatter is None:
        if "prompt" not in rows[0]:
            raise ValueError(
                f"The dataset rows have no 'prompt' column (columns: {sorted(rows[0])}). Add one, or pass "
                "`formatters=` to build each agent's prompt from a row."
            )
        return rows
    out = [{**row, "prompt": formatter(row)} for row in rows]
    for k, row in enumerate(out):
        if not is_prompt(row["prompt"]):
            name = getattr(formatter, "__name__", type(formatter).__name__)
            raise ValueError(
                f"`formatters` (agent {agent}'s, {name}) returned {row['prompt']!r} for row {k}; a formatter must "
                "return the agent's prompt: a string, or a conversation (a list of message dicts)."
            )
    return out


def listed_formatters(formatters, num_agents: int) -> list[Callable]:
    """One formatter for all agents, or one each, as a list of `num_agents`."""
    listed = list(formatters) if isinstance(formatters, (list, tuple)) else [formatters] * num_agents
    if len(listed) != num_agents:
        raise ValueError(f"{len(listed)} formatters were given for {num_agents} agents: one for all, or one each.")
    return listed


def takes_external(formatter: Callable) -> bool:
    """Whether `formatter` takes `external_prompts=`."""
    try:
        return "external_prompts" in inspect.signature(formatter).parameters
    except (TypeError, ValueError):
        return False


def first_turn_formatters(formatters, num_agents: int) -> list[Callable] | None:
    """Formatters for the first turn: one for all or one per agent; one that takes `external_prompts` is called
    `f(item, external_prompts=None)` (CoMLRL's actor-critic convention)."""
    if formatters is None:
        return None
    listed = listed_formatters(formatters, num_agents)

    def first_turn(formatter):
        if not takes_external(formatter):
            return formatter
        return lambda item: formatter(item, external_prompts=None)

    return [first_turn(f) for f in listed]


@dataclass
class FormattedTransition(Transition):
    """Prompts after the first turn, formatted again (CoMLRL's actor-critic convention): what the transition
    returned, through each agent's formatter (`item_formatters`; `None`: as returned, CoMLRL's
    `external_prompt_passthrough`) applied to the dataset row with its `prompt` replaced by the returned prompt (the
    original kept as `_original_prompt`), and passed as `external_prompts=` to a formatter that takes it. (The MAGRPO
    family calls `formatter(row, external_prompts=)` on the unchanged row.)"""

    item_formatters: Sequence[Callable] | None = None

    def __call__(self, node, sample: list) -> list:
        prompts = super().__call__(node, sample)
        if self.item_formatters is None:
            return prompts
        out = []
        for formatter, prompt in zip(self.item_formatters, prompts, strict=True):
            item = {**node.row, "_original_prompt": node.row.get("prompt", ""), "prompt": prompt}
            out.append(formatter(item, external_prompts=prompt) if takes_external(formatter) else formatter(item))
        return out
