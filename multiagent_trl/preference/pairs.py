"""Which (winner, loser) pairs of one item's joint candidates MADPO and MARLHF train on, as CoMLRL 1.4.3 selects them.

One item: K joint candidates (candidate k is every agent's k-th completion, aligned), each scored by the joint reward
`rewards[k]`. A pair `(w, l)` is ordered: `w` is the candidate that scored strictly higher (`rewards[w] > rewards[l]`;
ties make no pair), and the same index is winner (or loser) for every agent, so a pair compares two joint samples.

Selections (`PAIR_SELECTIONS`), each over the enumeration `w = 0..K-1`, then `l = 0..K-1`:

- `"reward_gap"`: largest gap `rewards[w] - rewards[l]` first; equal gaps keep the enumeration order (a stable sort).
- `"random"`: a shuffle of the enumeration by Python's `random` (the module's global generator by default, as
  CoMLRL's `random.shuffle`; give an `rng` to keep it apart).
- `"all"`: every pair in enumeration order, no limit.

`"reward_gap"` and `"random"` then keep the first `pairs_per_sample` (`None`: all of them).

When every candidate of an item scored the same there is no pair: CoMLRL drops the item silently, and a data set where
that happens everywhere trains on nothing. `check_pair_set` turns that case into an error that says what to change.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

PAIR_SELECTIONS = ("reward_gap", "all", "random")


def ordered_pairs(rewards: Sequence[float]) -> list[tuple[float, int, int]]:
    """Every `(gap, w, l)` with `gap = rewards[w] - rewards[l] > 0`, enumerated with `w` outer, `l` inner.

    >>> ordered_pairs([1.0, 0.0, 1.0])
    [(1.0, 0, 1), (1.0, 2, 1)]
    """
    values = [float(r) for r in rewards]  # (K,)
    return [
        (values[win] - values[lose], win, lose)
        for win in range(len(values))
        for lose in range(len(values))
        if win != lose and values[win] - values[lose] > 0
    ]


def select_pairs(
    rewards: Sequence[float],
    pair_selection: str = "reward_gap",
    pairs_per_sample: int | None = 16,
    rng: random.Random | None = None,
) -> list[tuple[int, int]]:
    """The `(winner, loser)` candidate indices to train on for one item.

    Args:
        rewards: `(K,)` the joint reward of each joint candidate.
        pair_selection: `"reward_gap"` (default), `"random"` or `"all"` (case-insensitive).
        pairs_per_sample: Keep at most this many pairs (`None`: no limit); ignored for `"all"`, as in CoMLRL (whose
            config requires `None` there).
        rng: The generator `"random"` shuffles with; `None` is Python's global one (CoMLRL's `random.shuffle`), so
            `random.seed(s)` before the call gives CoMLRL's pairs for that seed.

    Returns:
        The pairs in training order; empty when all rewards are equal (see `check_pair_set`).

    >>> select_pairs([0.0, 2.0, 1.0], "reward_gap", 2)
    [(1, 0), (1, 2)]
    >>> select_pairs([0.0, 2.0, 1.0], "all", None)
    [(1, 0), (1, 2), (2, 0)]
    >>> select_pairs([1.0, 1.0], "reward_gap")
    []
    """
    mode = str(pair_selection).strip().lower()
    if mode not in PAIR_SELECTIONS:
        raise ValueError(f"pair_selection must be one of {', '.join(PAIR_SELECTIONS)}; got {pair_selection!r}.")
    if pairs_per_sample is not None and pairs_per_sample < 1:
        raise ValueError(f"pairs_per_sample must be at least 1 or None (no limit); got {pairs_per_sample}.")
    pairs = ordered_pairs(rewards)
    if mode == "random":
        (rng or random).shuffle(pairs)  # no draw for fewer than 2 pairs, as in CoMLRL
    elif mode == "reward_gap":
        pairs.sort(key=lambda pair: pair[0], reverse=True)  # stable: equal gaps keep (w, l) enumeration order
    # "all": the enumeration is already sorted by (w, l)
    if mode != "all" and pairs_per_sample is not None:
        pairs = pairs[:pairs_per_sample]
    return [(win, lose) for _, win, lose in pairs]


def played_pairs(
    level, width: int, process_index: int, pair_selection: str, pairs_per_sample: int | None, rows: int | None = None
) -> tuple[list[list[float]], list[tuple[int, int, int]]]:
    """The pairs of a played batch (a `rollout.tree.Level`, one turn of `width` aligned joint candidates per row):
    this process's rows' rewards `(nodes, width)` (`level.joint` is gathered over the processes) and, row by row, its
    `(row, winner, loser)` pairs by `select_pairs`. Placeholder rows (copies that keep processes in step) and rows from
    `rows` on make none. The one place a played batch becomes pairs: `MultiAgentDPOTrainer` (each generation batch)
    and `sampling.collect_preference_pairs` (MARLHF's reward-model stage) call it."""
    nodes = len(level.nodes)
    start = process_index * nodes
    rewards = level.joint.view(-1, width)[start : start + nodes].tolist()
    pairs = []
    for n, node in enumerate(level.nodes[:rows]):
        if not node.placeholder:
            pairs += [(n, w, lose) for w, lose in select_pairs(rewards[n], pair_selection, pairs_per_sample)]
    return rewards, pairs


def check_pair_set(num_pairs: int, num_items: int, num_candidates: int, pair_selection: str = "reward_gap") -> None:
    """Raise when a whole round of pair generation produced no pair (every item's candidates scored the same).

    CoMLRL goes on and trains on nothing; an error here names the ways out.

    Args:
        num_pairs: The pairs selected over all items.
        num_items: The items that were scored.
        num_candidates: K, the joint candidates per item.
        pair_selection: The selection used, for the message.

    >>> check_pair_set(3, num_items=2, num_candidates=4)
    >>> check_pair_set(0, num_items=2, num_candidates=4)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: No preference pair: on each of the 2 items all 4 joint candidates got the same reward, ...
    """
    if num_pairs > 0:
        return
    raise ValueError(
        f"No preference pair: on each of the {num_items} items all {num_candidates} joint candidates got the same "
        "reward, and a pair needs a strictly better candidate. Sample more candidates (preference_num_candidates), "
        "raise the sampling temperature, use a reward with finer grades (partial credit instead of pass/fail), or "
        f"train on other items; pair_selection ({pair_selection!r}) only orders pairs and cannot create one."
    )


__all__ = ["PAIR_SELECTIONS", "check_pair_set", "ordered_pairs", "played_pairs", "select_pairs"]
