"""The joint reward adapter: convention detection, output validation, processors, cross credit."""

import itertools
import math
from functools import partial

import pytest
import torch

from multiagent_trl.rewards import (
    COMLRL_STYLE,
    TRL_STYLE,
    RewardProcessors,
    apply_processor,
    bind_reward,
    check_rewards,
    cross_credit,
    reward_style,
)


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
