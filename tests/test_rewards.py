"""The joint reward adapter: convention detection, output validation, processors, cross credit."""

import itertools
import math
from functools import partial

import pytest
import torch

from multiagent_trl.rewards.joint import (
    COMLRL_STYLE,
    TRL_STYLE,
    RewardProcessors,
    apply_processor,
    bind_reward,
    check_rewards,
    reward_style,
)
from multiagent_trl.rollout.tree import cross_credit

from .conftest import small_args


def comlrl_two(completions1, completions2, bonus=0.0):
    return [len(a) + len(b) + bonus for a, b in zip(completions1, completions2)]


def trl_style(prompts, completions, **kwargs):
    return [float(len(c[0])) for c in completions]


@pytest.mark.parametrize(
    "func, num_agents, style",
    [
        (trl_style, 2, TRL_STYLE),
        (lambda completions, **kw: [0.0] * len(completions), 1, TRL_STYLE),
        (comlrl_two, 2, COMLRL_STYLE),
        (partial(comlrl_two, bonus=1.0), 2, COMLRL_STYLE),
        (lambda *completions: [0.0] * len(completions[0]), 3, COMLRL_STYLE),
        (lambda completions1: [0.0] * len(completions1), 1, COMLRL_STYLE),
    ],
)
def test_reward_style_is_read_from_the_signature(func, num_agents, style):
    assert reward_style(func, num_agents) == style


@pytest.mark.parametrize(
    "func, num_agents, message",
    [
        (comlrl_two, 3, "takes 2 completion arguments"),
        (lambda a, b, c, d: [], 2, "but there are 2 agents"),  # f(a, b, c) is CoMLRL's f(prompts, c1, c2)
        (lambda threshold=0.5: [], 2, "fits neither reward convention"),
    ],
)
def test_reward_that_fits_no_convention_is_refused(func, num_agents, message):
    with pytest.raises(TypeError, match=message):
        reward_style(func, num_agents)


@pytest.mark.parametrize(
    "values, error, message",
    [
        ([1.0], ValueError, "returned 1 rewards but 2 joint samples"),
        ([1.0, math.nan], ValueError, "returned nan for joint sample 1"),
        ([math.inf, 0.0], ValueError, "must be finite"),
        (["good", 1.0], TypeError, "returned 'good'"),
        (3.0, TypeError, "returned float"),
    ],
)
def test_bad_reward_values_name_the_function(values, error, message):
    with pytest.raises(error, match=message) as info:
        check_rewards(values, 2, "my_reward")
    assert "my_reward" in str(info.value)


def test_check_rewards_accepts_numbers_none_and_scalar_tensors():
    assert check_rewards([1, None, torch.tensor(0.5), True], 4, "f") == [1.0, None, 0.5, 1.0]


def test_bound_comlrl_reward_gets_one_list_per_agent():
    seen = []

    def reward(completions1, completions2):
        seen.append((completions1, completions2))
        return [1.0, 2.0]

    bound = bind_reward(reward, num_agents=2)
    out = bound(prompts=[("p", "p")] * 2, completions=[("a", "bb"), ("c", "dd")], completion_ids=None, extra=[1, 2])
    assert out == [1.0, 2.0]
    assert seen == [(["a", "c"], ["bb", "dd"])]
    assert bound.__name__ == "reward"


def test_bound_async_reward_stays_async():
    async def reward(prompts, completions, **kwargs):
        return [1.0] * len(completions)

    import asyncio

    bound = bind_reward(reward, num_agents=2)
    assert asyncio.iscoroutinefunction(bound)
    assert asyncio.run(bound(prompts=[("p", "p")], completions=[("a", "b")])) == [1.0]


def test_processors_compose_left_to_right():
    p = RewardProcessors.compose(
        RewardProcessors.scale(100.0), RewardProcessors.shift(-50.0), RewardProcessors.clip(0)
    )
    assert [p(x) for x in (0.25, 0.75)] == [0.0, 25.0]
    assert RewardProcessors.scale(2.0).then(lambda r: r**2)(3.0) == 36.0
    processed = apply_processor(RewardProcessors.scale(10.0), torch.tensor([1.0, math.nan, -2.0]))
    assert processed[0] == 10.0 and math.isnan(processed[1]) and processed[2] == -20.0


@pytest.mark.parametrize("num_agents, num_generations", [(2, 3), (3, 2)])
def test_cross_credit_is_the_mean_over_tuples_containing_the_completion(num_agents, num_generations):
    groups = 2
    tuples = list(itertools.product(range(num_generations), repeat=num_agents))
    rewards = torch.randn(groups * len(tuples), 2)
    rewards[3, 0] = math.nan  # "no reward" is left out of the mean
    for agent in range(num_agents):
        credit = cross_credit(rewards, num_generations, num_agents, agent)
        assert credit.shape == (groups * num_generations, 2)
        for g in range(groups):
            for k in range(num_generations):
                rows = [g * len(tuples) + t for t, ks in enumerate(tuples) if ks[agent] == k]
                expected = torch.nanmean(rewards[rows], dim=0)
                torch.testing.assert_close(credit[g * num_generations + k], expected)


def test_per_agent_rows_with_none_mean_no_reward_for_that_agent():
    """Issue #28, 2: `[r, None]` rows (what `environment_factory=[EnvA, None]` returns) once crashed the team's mean
    (`TypeError: unsupported operand type(s) for +: 'float' and 'NoneType'`). The team's reward is the mean over the
    agents that were scored, `None` where none was; each agent keeps its own."""

    def own(prompts, completions, **kwargs):
        return [[1.0, None], [None, None], [0.5, 2.5], [None, 3.0]]

    bound = bind_reward(own, num_agents=2)
    assert bound(prompts=[("p", "p")] * 4, completions=[("a", "b")] * 4) == [1.0, None, 1.5, 3.0]
    assert bound.agent_rewards == [[1.0, None], [None, None], [0.5, 2.5], [None, 3.0]]


# ---- "No reward" is one rule everywhere (docs/rewards.md): a table of every way a reward reaches an advantage.

NAN = math.nan
G3 = 3  # num_generations in the table; one prompt per batch, so that the tree stays small


class Unscored:
    """A TRL-style reward function that returns `None` at chosen places, by position in each call (turn `t`'s call
    holds the turn's nodes one after the other, `per_node` joint samples each), and keeps what it returned.

    Turn 1: sample 1 is unscored for agent 1 (per-agent) or for all (joint); sample 2 for all (per-agent). Turn 2:
    node 0 is unscored for agent 0 (per-agent) or for all (joint), and so is sample 1 of node 1 for all."""

    __name__ = "unscored"

    def __init__(self, per_agent: bool, per_node: int):
        self.per_agent, self.per_node, self.calls = per_agent, per_node, []

    def unscored(self, turn: int, k: int) -> str:
        """Who gets no reward for joint sample `k` of turn `turn`'s call: "" (none), "a" (agent 0), "b", "ab"."""
        if turn == 0:
            return {1: "b" if self.per_agent else "ab", 2: "ab" if self.per_agent else ""}.get(k, "")
        if k < self.per_node:
            return "a" if self.per_agent else "ab"
        return "ab" if k == self.per_node + 1 else ""

    def __call__(self, prompts, completions, **kwargs):
        turn, rows = len(self.calls), []
        for k in range(len(completions)):
            a, b = ((7 * k + 3 * turn) % 5) / 2, ((5 * k + turn) % 4) / 2
            none = self.unscored(turn, k)
            if self.per_agent:
                rows.append([None if "a" in none else a, None if "b" in none else b])
            else:
                rows.append(None if none else a)
        self.calls.append(rows)
        return rows

    def agent_values(self, turn: int, agent: int, processor) -> list[float]:
        """What agent `agent` is credited with for each joint sample of turn `turn`'s call (NaN: no reward)."""
        values = [(row[agent] if self.per_agent else row) for row in self.calls[turn]]
        return [NAN if v is None else (processor(v) if processor else v) for v in values]


def again(row, histories, turn):
    return [f"{row['prompt']} Again:"] * len(histories)


def nanmean(values: list[float]) -> float:
    scored = [v for v in values if not math.isnan(v)]
    return sum(scored) / len(scored) if scored else NAN


def centered(values: list[float]) -> list[float]:
    """`scale_rewards="none"` advantages of one group: the value minus the group's mean over the scored; 0 unscored."""
    mean = nanmean(values)
    return [0.0 if math.isnan(v) else v - mean for v in values]


def completion_credit(values: list[float], agent: int) -> list[float]:
    """Cross mode: each of the agent's G completions credited with the mean over the tuples that hold it."""
    tuples = list(itertools.product(range(G3), repeat=2))
    return [nanmean([v for v, t in zip(values, tuples) if t[agent] == k]) for k in range(G3)]


def with_future(reward: float, child: list[float]) -> float:
    """A return (discount 1): no reward, no return; a child with no scored sample adds nothing."""
    future = nanmean(child)
    return reward + (0.0 if math.isnan(future) else future)


def expected_advantages(shape: str, cross: bool, reward: Unscored, agent: int, processor) -> list[float]:
    """Agent `agent`'s advantages, row by row, from what `reward` returned, by the rule alone."""
    first = reward.agent_values(0, agent, processor)
    if shape == "single":
        return centered(completion_credit(first, agent) if cross else first)
    second = reward.agent_values(1, agent, processor)
    per_node = G3 * G3 if cross else (1 if shape == "linear" else G3)
    children = [second[c * per_node : (c + 1) * per_node] for c in range(len(first))]  # child c continues sample c
    root = [with_future(r, child) for r, child in zip(first, children)]
    if shape == "linear":  # turn 2: the G trajectories of the prompt are one group
        return centered(root) + centered([child[0] for child in children])
    groups = [root, *children]  # one group per node
    if cross:
        groups = [completion_credit(values, agent) for values in groups]
    return [a for values in groups for a in centered(values)]


NO_REWARD_CASES = [
    (shape, per_agent, processor, joint_mode)
    for shape in ("single", "tree", "linear")
    for per_agent in (False, True)
    for processor in (False, True)
    for joint_mode in ("aligned", "cross")
    if not (shape == "linear" and joint_mode == "cross")  # linear trajectories are aligned
]


@pytest.mark.parametrize("shape, per_agent, processor, joint_mode", NO_REWARD_CASES)
def test_no_reward_means_no_signal_for_that_sample(
    tmp_path, tiny_path, prompts_dataset, shape, per_agent, processor, joint_mode
):
    """`None` for a sample (or for one agent of it) gives that sample advantage 0 and leaves it out of its group's
    statistics, in a single turn, a tree and linear trajectories, for joint and per-agent rewards, with and without
    a reward processor, aligned and cross; a child node with no scored sample leaves its parent its own reward."""
    from multiagent_trl import MultiAgentGRPOTrainer

    cross = joint_mode == "cross"
    reward = Unscored(per_agent, G3 * G3 if cross else (1 if shape == "linear" else G3))
    process = RewardProcessors.scale(2.0).then(RewardProcessors.shift(-1.0)) if processor else None
    turns = dict(num_turns=1) if shape == "single" else dict(num_turns=2, rollout=shape)
    args = small_args(
        tmp_path,
        num_agents=2,
        num_generations=G3,
        per_device_train_batch_size=G3,
        scale_rewards="none",
        joint_mode=joint_mode,
        **turns,
    )
    trainer = MultiAgentGRPOTrainer(
        model=tiny_path,
        reward_funcs=reward,
        args=args,
        train_dataset=prompts_dataset,
        reward_processor=process,
        external_transition=None if shape == "single" else again,
    )
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    output = trainer._generate_and_score_completions([prompts_dataset[0]] * G3)

    assert len(reward.calls) == (1 if shape == "single" else 2)
    for agent in range(2):
        expected = expected_advantages(shape, cross, reward, agent, process)
        torch.testing.assert_close(output[f"agent_{agent}/advantages"], torch.tensor(expected), msg=f"agent {agent}")
    assert torch.isfinite(trainer.compute_loss(trainer.model, output))
