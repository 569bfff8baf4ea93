"""Returns of hand-built rollouts (`multiagent_trl.rollout.tree`): no model, rewards written out.

`nan` is a reward function's `None` ("no reward"); `A` is the reward column (1 joint, or one per agent).
"""

import math

import pytest
import torch

from multiagent_trl.rewards.advantages import baseline_advantages
from multiagent_trl.rollout.tree import Level, Node, link, returns, training_rows

nan = math.nan


def level(rewards: list[list[float]], parents: list[tuple[int, int]] | None, trajectories: list[int] | None = None):
    """A level of aligned nodes: `rewards[n]` are node n's samples' joint rewards, `parents[n]` the sample it
    continues (`None` for the root level)."""
    nodes = [
        Node({}, 0 if parents is None else 1, [], parent=None if parents is None else parents[n])
        for n in range(len(rewards))
    ]
    for n, node in enumerate(nodes):
        node.trajectory = trajectories[n] if trajectories else 0
    width = len(rewards[0])
    return Level(nodes, width, width, rewards=torch.tensor(rewards).unsqueeze(2))  # (nodes, samples, 1)


def scored_returns(levels, discount=1.0, num_turns=None, **kwargs):
    num_turns = num_turns or len(levels)
    link(levels, num_turns)
    return [r.squeeze(2) for r in returns(levels, discount, num_turns, **kwargs)]


def test_an_unscored_sample_returns_nan_and_gets_no_advantage():
    """Issue #28, 1: turn-1 rewards [1, 1, 1, 1, None, 1, 1, None] once returned 1 for the unscored samples (their
    child's mean, as if they had scored 0), ranking them below their siblings."""
    root = level([[1.0, 1.0, 1.0, 1.0, nan, 1.0, 1.0, nan]], None)
    children = level([[k / 10] * 8 for k in range(8)], [(0, k) for k in range(8)])
    root_returns = scored_returns([root, children])[0][0]  # (8,)
    expected = [1.0, 1.1, 1.2, 1.3, nan, 1.5, 1.6, nan]
    torch.testing.assert_close(root_returns, torch.tensor(expected), equal_nan=True)
    # The advantage path (TRL's and `baseline_advantages`): no reward, advantage 0, out of the group's mean.
    mean = (1.0 + 1.1 + 1.2 + 1.3 + 1.5 + 1.6) / 6
    advantages = baseline_advantages(root_returns, 8, "mean", "none")
    torch.testing.assert_close(advantages, torch.tensor([0.0 if math.isnan(v) else v - mean for v in expected]))


def test_a_child_node_with_no_scored_sample_leaves_its_parent_its_own_reward():
    """Issue #28, 1: a sample that scored 1.0 whose whole child node returned None once got a nan return (and left
    its group) while its 0.0 sibling got 1.0."""
    root = level([[1.0, 0.0]], None)
    children = level([[nan, nan], [1.0, 1.0]], [(0, 0), (0, 1)])
    root_returns, child_returns = scored_returns([root, children], discount=0.5)
    torch.testing.assert_close(root_returns, torch.tensor([[1.0, 0.5]]))
    torch.testing.assert_close(child_returns, torch.tensor([[nan, nan], [1.0, 1.0]]), equal_nan=True)


def test_per_agent_columns_are_scored_apart():
    """`[r, None]` rows (an agent without an environment): the other agent's column keeps its returns."""
    root = Level([Node({}, 0, [])], 2, 2, rewards=torch.tensor([[[1.0, nan], [0.0, 2.0]]]))
    child = Level(
        [Node({}, 1, [], parent=(0, 0)), Node({}, 1, [], parent=(0, 1))],
        2,
        2,
        rewards=torch.tensor([[[1.0, nan], [3.0, nan]], [[nan, 1.0], [nan, 3.0]]]),
    )
    link([root, child], 2)
    root_returns = returns([root, child], 1.0, 2)[0]
    torch.testing.assert_close(root_returns, torch.tensor([[[3.0, nan], [0.0, 4.0]]]), equal_nan=True)


def early_and_late(shape: str) -> list[Level]:
    """Three turns, threshold 0.5 (rewards: fail 0.2, success 1.0). Root sample 0's continuation succeeds at turn 2
    and ends; sample 1's fails at turn 2 and succeeds at turn 3."""
    if shape == "tree":
        root = level([[0.2, 0.2]], None)
        turn_2 = level([[1.0, 1.0], [0.2, 0.2]], [(0, 0), (0, 1)])  # node 0 ends (mean 1.0 > 0.5)
        turn_3 = level([[1.0, 1.0], [1.0, 1.0]], [(1, 0), (1, 1)])  # node 1's children
        return [root, turn_2, turn_3]
    root = level([[0.2, 0.2]], None, trajectories=[0])  # 2 trajectories of one prompt
    turn_2 = level([[1.0], [0.2]], [(0, 0), (0, 1)], trajectories=[0, 1])  # trajectory 0 ends
    turn_3 = level([[1.0]], [(1, 0)], trajectories=[1])
    return [root, turn_2, turn_3]


@pytest.mark.parametrize("shape", ["tree", "linear"])
@pytest.mark.parametrize("discount", [1.0, 0.9])
def test_an_early_success_never_returns_less_than_a_later_one(shape, discount):
    """Issue #28, 5: with CoMLRL's sum, the tree returned 0.2 + 1.0 for the early success and 0.2 + 0.2 + 1.0 for
    the late one. An ended node's (or trajectory's) samples keep their last reward for the remaining turns."""
    d = discount
    root = scored_returns(early_and_late(shape), discount=d)[0]
    early, late = 0.2 + d * (1.0 + d * 1.0), 0.2 + d * (0.2 + d * 1.0)
    torch.testing.assert_close(root, torch.tensor([[early, late]]))
    assert early > late


def test_comlrls_sum_is_kept_when_asked():
    """`stand=False` (`ended_return="reward"`, CoMLRL's layer): an ended node returns its reward alone."""
    root = scored_returns(early_and_late("tree"), stand=False)[0]
    torch.testing.assert_close(root, torch.tensor([[1.2, 1.4]]))


@pytest.mark.parametrize("stand, stood", [(True, 1.0), (False, 0.0)])
def test_a_linear_trajectory_that_ended_is_credited_with_its_standing_answer(stand, stood):
    levels = early_and_late("linear")
    values = [r.unsqueeze(2) for r in scored_returns(levels, discount=0.9, stand=stand)]
    rows, credit = training_rows(levels, values, "linear", 3, 0.9, stand=stand)
    # Turn 3: trajectory 0 ended at turn 2 (repeated, untrained), trajectory 1 played it.
    assert rows[4:] == [(1, 0, False), (2, 0, True)]
    torch.testing.assert_close(credit[0][4:], torch.tensor([stood, 1.0]))
