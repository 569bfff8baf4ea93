"""Multi-turn episodes: playing the turns, the transition between them, and the discounted return-to-go.

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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from accelerate.utils import gather, gather_object
from trl.trainer.utils import nanstd

from .rollouts import Rollout

if TYPE_CHECKING:
    from .trainer import MultiAgentGRPOTrainer

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


@dataclass
class Turn:
    """One turn played by the team: each agent's rows (prompts of this turn), its rollout, and the joint rewards."""

    agent_inputs: list[list[dict]]
    rollouts: list[Rollout]
    rewards_per_func: torch.Tensor  # (trajectories, reward functions), gathered; NaN where a trajectory has ended
    extras: dict[str, list]  # columns reward functions logged with `log_extra` this turn, gathered


def play_episodes(trainer: MultiAgentGRPOTrainer, inputs: list[dict], agent_inputs, mode: str, num_generations: int):
    """Multi-turn: play `num_turns` turns of `num_generations` linear trajectories per prompt, then score every agent
    on every turn with group-relative advantages of the discounted return-to-go. Returns the team batch, keyed
    `agent_{i}/turn_{t}/...`.

    Trajectory j continues joint sample j: after each turn, `external_transition` turns the agents' completions on
    that trajectory into their next prompts. A trajectory that ends early (`early_termination_threshold`) keeps its
    place in the batch so that every process stays in step, but its later turns are masked out: no reward, no
    transition, no gradient. The loss is the sum over turns of each turn's GRPO loss.
    """
    args, num_agents = trainer.args, trainer.num_agents
    metrics = trainer._metrics[mode]
    local = torch.arange(len(inputs)) + trainer.accelerator.process_index * len(inputs)  # rows in gathered tensors
    prompts = [[row["prompt"] for row in rows] for rows in agent_inputs]
    histories = [[[] for _ in inputs] for _ in range(num_agents)]  # [agent][trajectory] -> completions so far
    prompt_histories = [[[] for _ in inputs] for _ in range(num_agents)]
    active = torch.ones(len(inputs), dtype=torch.bool, device=trainer.accelerator.device)
    turns: list[Turn] = []
    rewards = []  # joint reward per turn, gathered; NaN where a trajectory has ended
    for turn in range(args.num_turns):
        playing = gather(active)
        if turn > 0 and not playing.any():  # every trajectory on every process has ended
            break
        turn_inputs = [[{**row, "prompt": p} for row, p in zip(inputs, ps)] for ps in prompts]
        rollouts = [r.masked(active.tolist()) for r in trainer._rollouts(turn_inputs, mode)]
        prefix = f"turn_{turn}/"
        rewards_per_func, extras = trainer._joint_rewards(inputs, turn_inputs, rollouts, num_generations, mode, turn)
        rewards_per_func[~playing] = torch.nan
        rewards.append(trainer._process_rewards(rewards_per_func, mode, prefix=prefix))
        metrics[f"{prefix}active"].append(playing.float().mean().item())
        turns.append(Turn(turn_inputs, rollouts, rewards_per_func, extras))

        if args.early_termination_threshold is not None:
            active &= ~(rewards[-1][local.to(active.device)] > args.early_termination_threshold)
        if turn == args.num_turns - 1:
            break
        for j in torch.nonzero(active).flatten().tolist():
            for i in range(num_agents):
                histories[i][j].append(rollouts[i].completions[j])
                prompt_histories[i][j].append(prompts[i][j])
            step = next_prompts(
                trainer.external_transition,
                trainer._transition_style,
                inputs[j],
                [h[j] for h in histories],
                [h[j] for h in prompt_histories],
                turn,
                trainer.formatters,
                args.external_prompt_passthrough,
            )
            for i in range(num_agents):
                prompts[i][j] = step[i]

    returns = returns_to_go(torch.stack(rewards), args.discount)
    metrics["reward"].append(torch.nanmean(returns[0]).item())  # the episode's (discounted) return
    metrics["reward_std"].append(nanstd(returns[0]).item())
    outputs = {}
    for turn, (played, turn_returns) in enumerate(zip(turns, returns)):
        credited = [turn_returns.unsqueeze(1)] * num_agents
        scored = trainer._score_agents(played.agent_inputs, played.rollouts, credited, ["return"], torch.ones(1))
        for i, output in enumerate(scored):
            outputs.update({f"agent_{i}/turn_{turn}/{key}": value for key, value in output.items()})
    log_episodes(trainer, turns, rewards, returns[0], outputs)
    return outputs


def log_episodes(trainer: MultiAgentGRPOTrainer, turns: list[Turn], rewards, episode_returns, outputs) -> None:
    """Fill the completions table: one row per trajectory, every turn's completions in order."""
    logs = trainer._logs
    lines = [[] for _ in range(len(episode_returns))]
    for t, turn in enumerate(turns):
        completions = [gather_object(rollout.completions) for rollout in turn.rollouts]
        played = ~torch.isnan(rewards[t])
        for j in torch.nonzero(played).flatten().tolist():
            lines[j].append(f"[turn {t}]")
            lines[j].extend(f"[agent_{i}] {completion_text(c[j])}" for i, c in enumerate(completions))
        for k, name in enumerate(trainer.reward_func_names):
            logs["extra"][f"turn_{t}/{name}"].extend(turn.rewards_per_func[:, k].tolist())
        for column, values in turn.extras.items():
            logs["extra"][f"turn_{t}/{column}"].extend(values)
    logs["prompt"].extend(gather_object([row["prompt"] for row in turns[0].agent_inputs[0]]))
    logs["completion"].extend("\n".join(rows) for rows in lines)
    logs["rewards"]["return"].extend(episode_returns.tolist())
    logs["advantages"].extend(gather(outputs["agent_0/turn_0/advantages"]).tolist())


def completion_text(completion) -> str:
    """A completion as text: plain completions as they are, conversational ones by their content."""
    if isinstance(completion, str):
        return completion
    return "\n".join(str(message.get("content", "")) for message in completion)
