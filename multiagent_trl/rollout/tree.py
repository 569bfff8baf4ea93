"""Rollouts as plain data: the levels of a multi-turn rollout, its returns, and each agent's credit.

A *node* is one state of the team at one turn: the dataset row, the prompt every agent sees, and the path that led
there. Every agent answers a node `width` times, and the joint reward scores the node's joint samples: the `width`
aligned tuples (j-th completion of every agent), or all `width**N` tuples with `joint_mode="cross"`. A *level* holds
the nodes of one turn, over the whole generation batch, so that one generation call and one reward call serve a turn.

Two shapes (`MultiAgentGRPOConfig.rollout`):

- `"tree"` (MAGRPO's definition, CoMLRL's `_train_step_returns`): every node has `width = G` (`num_generations`),
  and each joint sample of a node spawns one child node, whose prompts the transition makes from that sample's
  history. Turn t holds up to `B * S**t` nodes (S = G aligned, G**N cross). A node whose *mean* reward passes
  `early_termination_threshold` has no children. A node's return for sample j is its reward plus `discount` times
  the mean return of its child's samples. Siblings share one state, so a node's G samples are one advantage group.
- `"linear"`: G trajectories per prompt; after the root, a node is one trajectory's turn (`width = 1`). A trajectory
  whose reward passes the threshold ends. Turn-t advantages compare the G trajectories of one prompt at turn t
  (different states: cheaper than the tree, noisier).

In both shapes an ended sample's answer stands (`stand=True`): its remaining turns score as its last reward,
discounted, so that finishing sooner is never worth less than finishing later at the same reward. `stand=False` is
CoMLRL's sum: an ended sample returns the rewards it received.

"No reward" (a reward function's `None`, NaN here) means one thing everywhere: no signal for that sample. Its return
is NaN (advantage 0, outside its group's statistics, as TRL treats a NaN reward); its parent's mean over the child's
samples leaves it out, and a child with no scored sample adds nothing to its parent's reward.

A single-turn step is a rollout of one level. Nothing here needs a model: tests build levels by hand.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

TREE, LINEAR = "tree", "linear"
SHAPES = (TREE, LINEAR)


def cross_tuples(num_generations: int, num_agents: int) -> list[tuple[int, ...]]:
    """Indices of every joint tuple of one prompt group in `joint_mode="cross"`, agent 0's index slowest.

    >>> cross_tuples(2, 2)
    [(0, 0), (0, 1), (1, 0), (1, 1)]
    """
    return list(itertools.product(range(num_generations), repeat=num_agents))


def cross_credit(
    rewards: torch.Tensor, num_generations: int, num_agents: int, agent: int, reduction: str = "mean"
) -> torch.Tensor:
    """Credit each of `agent`'s completions with the mean (or, with `reduction="sum"`, CoMLRL's sum) of the rewards
    of the cross tuples that contain it.

    Args:
        rewards: `(num_groups * G**N, F)` rewards of the cross tuples, groups in order, tuples as `cross_tuples`.
    Returns:
        `(num_groups * G, F)`: row `g * G + k` is the credit of the agent's k-th completion in group g (NaN-aware).

    >>> r = torch.tensor([[1.0], [2.0], [3.0], [4.0]])  # one group, G=2, N=2: tuples (0,0) (0,1) (1,0) (1,1)
    >>> cross_credit(r, 2, 2, agent=0).flatten().tolist(), cross_credit(r, 2, 2, agent=1).flatten().tolist()
    ([1.5, 3.5], [2.0, 3.0])
    >>> cross_credit(r, 2, 2, agent=0, reduction="sum").flatten().tolist()
    [3.0, 7.0]
    """
    num_funcs = rewards.size(1)
    grid = rewards.view(-1, *([num_generations] * num_agents), num_funcs)  # (B, G, ..., G, F)
    other_dims = [1 + a for a in range(num_agents) if a != agent]
    if not other_dims:
        return grid.reshape(-1, num_funcs)
    if reduction not in ("mean", "sum"):
        raise ValueError(f"Unknown cross credit reduction {reduction!r}: use 'mean' or 'sum'.")
    credit = torch.nanmean(grid, dim=other_dims)  # (B, G, F); NaN only where no tuple was scored
    if reduction == "sum":
        credit = torch.where(torch.isnan(credit), credit, torch.nansum(grid, dim=other_dims))
    return credit.reshape(-1, num_funcs)


@dataclass
class Node:
    """One state of the team: what each agent sees at `turn`, and how the episode got there."""

    row: dict[str, Any]  # the dataset row (every column)
    turn: int
    prompts: list  # (agents,): each agent's prompt at this turn
    prompt_history: list[list] = field(default_factory=list)  # (agents, turn): prompts of the earlier turns
    response_history: list[list] = field(default_factory=list)  # (agents, turn): completions on this path
    parent: tuple[int, int] | None = None  # (node index in the previous level, the joint sample it continues)
    trajectory: int = 0  # linear shape: the trajectory (root row of the generation batch) this node continues
    placeholder: bool = False  # a copy that keeps processes in step: generated, but neither scored nor trained


@dataclass
class Level:
    """The nodes of one turn. Each node has `width` rows per agent, consecutive (node n: rows n*width..)."""

    nodes: list[Node]
    width: int
    samples: int  # joint samples per node: `width` (aligned) or `width**N` (cross)
    rewards: torch.Tensor | None = None  # (nodes, samples, A): joint (A = 1) or each agent's (A = N); NaN: none
    children: list[list[int | None]] = field(default_factory=list)  # (nodes, samples): child index in next level
    stands: torch.Tensor | None = None  # (nodes, samples) bool: ended here by the threshold, before the last turn
    returns: torch.Tensor | None = None  # (nodes, samples, A), from `returns`
    # What was played, filled by the trainer: each agent's rows and rollout, and the scores of every process.
    agent_rows: list[list[dict]] | None = None  # (agents, nodes * width)
    rollouts: list | None = None  # (agents,) `rollout.replay.Rollout`
    rewards_per_func: torch.Tensor | None = None  # (processes * nodes * samples, F), gathered; NaN: not scored
    joint: torch.Tensor | None = None  # (processes * nodes * samples,), gathered, after the reward processor
    extras: dict[str, list] = field(default_factory=dict)  # `log_extra` columns, gathered

    def rows(self) -> list[dict]:
        """The dataset row of every generation row (node n's row, `width` times)."""
        return [node.row for node in self.nodes for _ in range(self.width)]

    def prompts(self, agent: int) -> list:
        """Agent `agent`'s prompt on every generation row."""
        return [node.prompts[agent] for node in self.nodes for _ in range(self.width)]

    def scored(self) -> torch.Tensor:
        """`(nodes,)` bool: which nodes are real (not placeholders)."""
        return torch.tensor([not node.placeholder for node in self.nodes], dtype=torch.bool)

    def agent_inputs(self, num_agents: int) -> list[list[dict]]:
        """Each agent's generation rows: the dataset row with the agent's prompt at this turn."""
        return [[{**row, "prompt": p} for row, p in zip(self.rows(), self.prompts(i))] for i in range(num_agents)]


def root_level(rows: list[dict], agent_prompts: list[list], width: int, samples: int) -> Level:
    """The first turn: one node per prompt group of the generation batch (`rows` repeats each row `width` times,
    as TRL's sampler hands it over; `agent_prompts[i]` are agent i's prompts of those rows)."""
    nodes = [
        Node(row=rows[k], turn=0, prompts=[p[k] for p in agent_prompts], trajectory=k)
        for k in range(0, len(rows), width)
    ]
    for node in nodes:
        node.prompt_history, node.response_history = [[] for _ in agent_prompts], [[] for _ in agent_prompts]
    return Level(nodes, width, samples)


def padded(level: Level, num_nodes: int, template: Node | None = None) -> Level:
    """`level` with placeholder copies of its first node (or of `template`, where it has none) appended up to
    `num_nodes` nodes: every process must run the same generation and reward collectives, so a process with fewer
    live nodes than another fills up."""
    if len(level.nodes) >= num_nodes:
        return level
    template = level.nodes[0] if level.nodes else template
    # A placeholder continues no sample: it has no parent in the previous level (its rows continue the first one's).
    extra = [dataclasses.replace(template, placeholder=True, parent=None) for _ in range(num_nodes - len(level.nodes))]
    return dataclasses.replace(level, nodes=level.nodes + extra)


def sample_members(level: Level, node: int, sample: int, num_agents: int) -> list[int]:
    """The generation row of each agent's completion in joint sample `sample` of node `node`.

    >>> level = Level(nodes=[None, None], width=2, samples=4)
    >>> sample_members(level, 1, 2, num_agents=2)  # cross: sample 2 of a node is the tuple (1, 0)
    [3, 2]
    """
    start = node * level.width
    if level.samples == level.width:
        return [start + sample] * num_agents
    return [start + k for k in cross_tuples(level.width, num_agents)[sample]]


def continuing(level: Level, shape: str, threshold: float | None) -> torch.Tensor:
    """`(nodes, samples)` bool: which joint samples go on to another turn. Placeholders never do. In a tree, a node
    whose mean reward passes `threshold` ends with all its samples; on linear trajectories each sample ends alone.

    >>> level = Level([Node({}, 0, []), Node({}, 0, [])], width=2, samples=2)
    >>> level.rewards = torch.tensor([[[1.0], [0.0]], [[0.2], [0.0]]])
    >>> continuing(level, "tree", 0.4).tolist(), continuing(level, "linear", 0.4).tolist()
    ([[False, False], [True, True]], [[False, True], [True, True]])
    """
    joint = torch.nanmean(level.rewards, dim=2)  # (nodes, samples)
    go_on = level.scored().unsqueeze(1).expand_as(joint).clone()
    if threshold is None:
        return go_on
    if shape == LINEAR:
        return go_on & ~(joint > threshold)
    return go_on & ~(torch.nanmean(joint, dim=1, keepdim=True) > threshold)


def child(level: Level, node: int, sample: int, completions: list, prompts: list, shape: str) -> Node:
    """The node that continues joint sample `sample` of node `node`: `completions` are the sample's (one per agent),
    `prompts` what the transition returned for the next turn."""
    parent = level.nodes[node]
    return Node(
        row=parent.row,
        turn=parent.turn + 1,
        prompts=list(prompts),
        prompt_history=[h + [p] for h, p in zip(parent.prompt_history, parent.prompts, strict=True)],
        response_history=[h + [c] for h, c in zip(parent.response_history, completions, strict=True)],
        parent=(node, sample),
        trajectory=parent.trajectory + (sample if shape == LINEAR and parent.turn == 0 else 0),
    )


def next_level(level: Level, shape: str, threshold: float | None, transition: Callable) -> Level:
    """The nodes of the next turn: one per joint sample of `level` that goes on (`continuing`), its prompts
    `transition(node, sample)` for the sample's completions (one per agent)."""
    num_agents = len(level.rollouts)
    nodes = []
    for n, j in continuing(level, shape, threshold).nonzero().tolist():
        members = sample_members(level, n, j, num_agents)
        sample = [level.rollouts[i].completions[k] for i, k in enumerate(members)]
        nodes.append(child(level, n, j, sample, transition(level.nodes[n], sample), shape))
    width = level.width if shape == TREE else 1
    return Level(nodes, width, width**num_agents if level.samples != level.width else width)


def continued_rows(previous: Level, level: Level) -> list[list[int]]:
    """`(agents, rows)`: the row of `previous` that each agent's row of `level` continues (its node's parent sample;
    a placeholder continues the first), e.g. to carry an environment over."""
    num_agents = len(previous.rollouts)
    parents = [sample_members(previous, *(node.parent or (0, 0)), num_agents) for node in level.nodes]
    return [[members[i] for members in parents for _ in range(level.width)] for i in range(num_agents)]


def link(levels: list[Level], num_turns: int) -> None:
    """Fill each level's `children` and `stands` (the real samples with no child before the last turn: their node,
    or their linear trajectory, passed the threshold) from the next level's parents."""
    for t, level in enumerate(levels):
        level.children = [[None] * level.samples for _ in level.nodes]
        if t + 1 < len(levels):
            for k, node in enumerate(levels[t + 1].nodes):
                if node.parent is not None and not node.placeholder:
                    level.children[node.parent[0]][node.parent[1]] = k
        ended = torch.tensor([[c is None for c in row] for row in level.children], dtype=torch.bool)
        level.stands = ended & level.scored().unsqueeze(1) & (t < num_turns - 1)


def returns(levels: list[Level], discount: float, num_turns: int, stand: bool = True) -> list[torch.Tensor]:
    """Each level's returns, `(nodes, samples, A)`, bottom up: a sample's reward plus `discount` times the mean
    return of its child's scored samples (tree; on linear trajectories the child has one sample). A sample without a
    child returns its reward; one ended early by the threshold (`Level.stands`) with `stand`, its reward again for
    each remaining turn, discounted. An unscored sample returns NaN. Call `link` first.

    >>> root = Level([Node({}, 0, [])], width=2, samples=2, rewards=torch.tensor([[[1.0], [0.0]]]))
    >>> children = [Node({}, 1, [], parent=(0, 0)), Node({}, 1, [], parent=(0, 1))]
    >>> leaf = Level(children, width=2, samples=2, rewards=torch.tensor([[[1.0], [3.0]], [[0.0], [0.0]]]))
    >>> link([root, leaf], num_turns=2)
    >>> [r.squeeze(-1).tolist() for r in returns([root, leaf], 0.5, num_turns=2)]
    [[[2.0, 0.0]], [[1.0, 3.0], [0.0, 0.0]]]
    """
    out: list[torch.Tensor] = [torch.empty(0)] * len(levels)
    for t in range(len(levels) - 1, -1, -1):
        level = levels[t]
        value = level.rewards.clone()  # (nodes, samples, A); NaN stays NaN: no reward, no return
        if stand:  # the remaining turns of an ended node or trajectory score as its last
            stood = sum(discount**k for k in range(1, num_turns - t))
            value = torch.where(level.stands.unsqueeze(2), value * (1 + stood), value)
        for n, row in enumerate(level.children):
            for j, c in enumerate(row):
                if c is not None:
                    future = torch.nanmean(out[t + 1][c], dim=0)  # (A,): NaN where the child has no scored sample
                    value[n, j] = value[n, j] + discount * torch.nan_to_num(future)
        out[t] = value
    return out


def agent_credit(level: Level, values: torch.Tensor, agent: int, num_agents: int, reduction: str) -> torch.Tensor:
    """Agent `agent`'s credit on each of its rows of `level`, `(nodes * width,)`, from per-sample `values` shaped
    `(nodes, samples, A)`: the sample's value (aligned), or over the cross tuples that hold the completion, their
    `reduction` (`"mean"`, or `"sum"` as CoMLRL credits)."""
    column = values[:, :, min(agent, values.size(2) - 1)]  # (nodes, samples)
    if level.samples == level.width:
        return column.reshape(-1)
    return cross_credit(column.reshape(-1, 1), level.width, num_agents, agent, reduction).flatten()


def linear_groups(levels: list[Level], group: int) -> list[list[tuple[int, int] | None]]:
    """For each level of linear trajectories, its rows in advantage groups of `group` (the G trajectories of a
    prompt, in order): `(node, row in node)` where the trajectory played that turn, `None` where it had ended."""
    out = []
    for t, level in enumerate(levels):
        if t == 0:
            out.append([(k // level.width, k % level.width) for k in range(len(level.nodes) * level.width)])
            continue
        where = {node.trajectory: (n, 0) for n, node in enumerate(level.nodes) if not node.placeholder}
        out.append([where.get(k) for k in range(len(levels[0].nodes) * group)])
    return out


def paths(levels: list[Level]) -> list[list[tuple[int, int, int]]]:
    """One path per root row (`(turn, node, joint sample)` per turn played): the root's aligned sample j (in cross
    mode the tuple `(j, ..., j)`), then in each child its first sample (the only one on linear trajectories). The
    completions table and evaluation trajectories follow these paths.

    >>> root = Level([Node({}, 0, [])], width=2, samples=4, children=[[None, None, None, 0]])
    >>> leaf = Level([Node({}, 1, [], parent=(0, 3))], width=2, samples=4, children=[[None] * 4])
    >>> paths([root, leaf])
    [[(0, 0, 0)], [(0, 0, 3), (1, 0, 0)]]
    """
    out = []
    root = levels[0]
    for n, node in enumerate(root.nodes):
        if node.placeholder:
            continue
        for j in range(root.width):
            sample = j if root.samples == root.width else j * (root.samples - 1) // max(root.width - 1, 1)
            path = [(0, n, sample)]
            c = root.children[n][sample] if root.children else None
            while c is not None:
                t = len(path)
                path.append((t, c, 0))
                c = levels[t].children[c][0] if levels[t].children else None
            out.append(path)
    return out


def tree_completions(num_prompts: int, width: int, num_agents: int, num_turns: int, cross: bool, shape: str) -> int:
    """The most completions one agent generates for `num_prompts` prompts (no early termination).

    >>> tree_completions(1, 2, 2, 4, cross=False, shape="tree")  # CoMLRL's Minecraft: 2 + 4 + 8 + 16
    30
    >>> tree_completions(1, 4, 2, 2, cross=True, shape="tree")  # 4 + 16 nodes of 4
    68
    >>> tree_completions(1, 4, 2, 3, cross=False, shape="linear")
    12
    """
    if shape == LINEAR:
        return num_prompts * width * num_turns
    branching = width**num_agents if cross else width
    return num_prompts * width * sum(branching**t for t in range(num_turns))


def training_rows(
    levels: list[Level], values: list[torch.Tensor], shape: str, num_turns: int, discount: float, stand: bool = True
) -> tuple[list[tuple[int, int, bool]], list[torch.Tensor]]:
    """The rows every agent is trained on, in advantage groups of the root's width, and the value each row is
    credited with per agent column: `(rows, values)` with `rows[r] = (turn, generation row in that turn's level,
    trained)` and `values[a]` shaped `(rows,)` for column a of `values` (`returns`' output, aligned samples).

    Tree: every row of every level (a node's rows are its group; placeholders are not trained). Linear: per turn,
    the G trajectories of each prompt in order; a trajectory that ended repeats its last row untrained, credited
    with its standing answer (its last reward, once per remaining turn, discounted; with `stand=False` the rewards it
    received from that turn on: none), so that the others are still compared with it.
    """
    columns = values[0].size(2)
    rows: list[tuple[int, int, bool]] = []
    credit: list[list[float]] = [[] for _ in range(columns)]
    last: dict[int, tuple[int, int, int]] = {}  # linear trajectory -> (turn, node, sample) of its last turn played
    groups = linear_groups(levels, levels[0].width) if shape == LINEAR else None
    for t, level in enumerate(levels):
        slots = [(n, j) for n in range(len(level.nodes)) for j in range(level.width)]
        if groups is not None and t > 0:
            slots = groups[t]
        for k, slot in enumerate(slots):
            if slot is None:  # a linear trajectory that ended: its answer stands
                t_end, n, j = last[k]
                stood = sum(discount**i for i in range(num_turns - t)) if stand else 0.0  # NaN * 0.0 stays NaN
                row = n * levels[t_end].width + j
                rows.append((t_end, row, False))
                for a in range(columns):
                    credit[a].append(float(levels[t_end].rewards[n, j, a]) * stood)
                continue
            n, j = slot
            rows.append((t, n * level.width + j, not level.nodes[n].placeholder))
            for a in range(columns):
                credit[a].append(float(values[t][n, j, a]))
            if shape == LINEAR:
                last[level.nodes[n].trajectory + (j if t == 0 else 0)] = (t, n, j)
    return rows, [torch.tensor(c) for c in credit]


def batch_layout(
    levels: list[Level],
    shape: str,
    num_turns: int,
    discount: float,
    multiple: int,
    reduction: str,
    stand: bool = True,
) -> tuple[list[int], list[bool], list[torch.Tensor]]:
    """Each agent's training batch over the whole rollout, in advantage groups of the root's width: the generation
    rows it takes (`index`, counted over the levels one after the other), which of them are trained, and per agent
    the value each row is credited with (`training_rows`; in cross mode `agent_credit`). Untrained groups are added
    until the batch is a multiple of `multiple` rows (TRL splits it into that many equal steps). Call `returns` and
    store them in `level.returns` first."""
    values = [level.returns for level in levels]
    rows, credit = training_rows(levels, values, shape, num_turns, discount, stand)
    width, num_agents = levels[0].width, len(levels[0].rollouts)
    while len(rows) % multiple:
        rows += [(0, k, False) for k in range(width)]
        credit = [torch.cat([c, torch.full((width,), math.nan)]) for c in credit]
    offsets = torch.tensor([0] + [len(level.nodes) * level.width for level in levels]).cumsum(0).tolist()
    index = [offsets[t] + k for t, k, _ in rows]
    keep = [trained for *_, trained in rows]
    if levels[0].samples == width:
        return index, keep, [credit[min(i, len(credit) - 1)] for i in range(num_agents)]
    cross = []  # each completion credited with its tuples' returns
    for i in range(num_agents):
        value = torch.cat([agent_credit(level, level.returns, i, num_agents, reduction) for level in levels])[index]
        value[~torch.tensor(keep)] = math.nan
        cross.append(value)
    return index, keep, cross


def successor_rows(levels: list[Level], index: list[int], keep: list[bool]) -> tuple[list[int], list[int]]:
    """For each training row (`batch_layout`'s `index` and `keep`): its turn, and the training row that continues
    its sample in the next turn (-1: none, the episode ended there, or the row is not trained). A critic's TD target
    bootstraps from that row's value.

    The next turn's node must have one row (`width == 1`: linear trajectories after the root, or one completion per
    prompt), so that a sample has one successor.

    >>> root = Level([Node({}, 0, []), Node({}, 0, [])], width=1, samples=1, children=[[0], [None]])
    >>> leaf = Level([Node({}, 1, [], parent=(0, 0))], width=1, samples=1, children=[[None]])
    >>> successor_rows([root, leaf], index=[0, 1, 2, 1], keep=[True, True, True, False])
    ([0, 0, 1, 0], [2, -1, -1, -1])
    """
    offsets = torch.tensor([0] + [len(level.nodes) * level.width for level in levels]).cumsum(0).tolist()
    turn_of = [max(t for t in range(len(levels)) if offsets[t] <= k) for k in index]
    trained_row = {k: r for r, (k, kept) in enumerate(zip(index, keep)) if kept}  # generation row -> training row
    successors = []
    for r, (k, kept) in enumerate(zip(index, keep)):
        t = turn_of[r]
        level, node_row = levels[t], k - offsets[t]
        c = level.children[node_row // level.width][node_row % level.width] if kept and level.children else None
        if c is None:
            successors.append(-1)
            continue
        if levels[t + 1].width != 1:
            raise ValueError("A sample's successor is one row: the next turn's nodes must have width 1.")
        successors.append(trained_row.get(offsets[t + 1] + c, -1))
    return turn_of, successors
