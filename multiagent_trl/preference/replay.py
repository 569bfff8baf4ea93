"""Iterative preference data, as CoMLRL 1.4.3's `MADPOIterTrainer` builds and replays it: pairs of the current policy
against a comparator, one JSON shard per iteration, and the training pairs drawn from the shards.

Plain data in, plain data out; the trainers (`multiagent_trl.preference.iterative`, and the CoMLRL layer's
iterative trainers) hold the state and call these.

Pairs against a comparator (`comparison_pairs`) are **index-aligned**: for each `k < min(K, K')`, the current policy's
joint candidate `k` and the comparator's candidate `k` make a pair when their rewards differ, the better one winning.
They are then ordered by `pair_selection`:

- `"comparator_reward"`: the comparator's reward first, then the gap, both descending (a stable sort);
- `"reward_gap"`: the gap descending; `"random"`: a shuffle (Python's `random`); `"all"`: by `k`, no limit;

and the first `pairs_per_sample` are kept (`None`: all).

Replay (`replay_selection`): each iteration's pairs are written to `iteration_{it:04d}.json` (1-based,
`{"iteration", "num_pairs", "pairs": [records]}`, CoMLRL's format); the shards with at least one pair are the history.
`"current"` trains on this iteration's pairs; `"nearest_k"` samples from the last k shards, `"all_history"` from all of
them, `"lambda_decay"` from all of them with weights `(1 - lambda) lambda**age` (age 0: the newest; `lambda = 1`:
uniform). The sample size is `preference_replay_sample_size`, else this iteration's pair count, else the newest
shard's.
Each draw picks a shard (`random.choices` with the weights); each shard then gives its count of records without
replacement (whole shuffled copies when more are asked than it holds), and the sample is shuffled. Every random draw is
Python's global `random`, in CoMLRL's order, so `random.seed(s)` gives CoMLRL's sample for that seed.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

REPLAY_MODES = ("current", "nearest_k", "all_history", "lambda_decay")
REPLAY_MODE_ALIASES = {
    "latest": "current",
    "new": "current",
    "recent_k": "nearest_k",
    "last_k": "nearest_k",
    "k": "nearest_k",
    "lambda": "lambda_decay",
    "td_lambda": "lambda_decay",
    "td-lambda": "lambda_decay",
}
COMPARATOR_POLICIES = ("current", "current_copy", "model", "history", "api")
COMPARATOR_POLICY_ALIASES = {
    "self": "current",
    "online": "current",
    "copy": "current_copy",
    "online_copy": "current_copy",
    "current-offload": "current_copy",
    "current_offload": "current_copy",
    "external": "model",
    "comparator": "model",
    "reference": "model",
    "ref": "model",
    "checkpoint": "history",
    "previous": "history",
    "previous_iteration": "history",
    "http": "api",
    "endpoint": "api",
}
COMPARISON_PAIR_SELECTIONS = ("comparator_reward", "reward_gap", "random", "all")

Side = tuple[str, int]  # ("current" or "comparator", candidate index)


def canonical(value: str | None, name: str, allowed: Sequence[str], aliases: dict[str, str], default: str) -> str:
    """`value` lower-cased and resolved through CoMLRL's aliases; a `ValueError` naming `name` otherwise.

    >>> canonical("TD_Lambda", "preference_replay_mode", REPLAY_MODES, REPLAY_MODE_ALIASES, "current")
    'lambda_decay'
    """
    mode = str(value or default).strip().lower()
    mode = aliases.get(mode, mode)
    if mode not in allowed:
        raise ValueError(f"`{name}` must be one of {', '.join(allowed)} (or CoMLRL's aliases); got {value!r}.")
    return mode


def check_replay_fields(
    mode: str | None,
    k: int | None,
    replay_lambda: float | None,
    sample_size: int | None,
    directory: str | None = None,
    prefix: str = "",
) -> tuple[str, int | None, float | None, int | None]:
    """The replay fields' rules, one place for the native round configs and CoMLRL's iterative ones; the fields
    normalised (`mode` canonical, the numbers as `int`/`float`), or a `ValueError` naming the field as
    `prefix + "replay_mode"` etc. (CoMLRL's layer prints `preference_replay_...` with `prefix="preference_"`).

    `k` only with `"nearest_k"` (which needs it, >= 1; `"current"` also takes 1, as CoMLRL), the lambda only with
    `"lambda_decay"` (which needs it, in [0, 1]), a sample size (>= 1) only with a replaying mode, and `directory`
    not a file.

    >>> check_replay_fields("last_k", 2, None, 8)
    ('nearest_k', 2, None, 8)
    """
    mode_field = f"{prefix}replay_mode"
    if directory is not None and os.path.exists(directory) and not os.path.isdir(directory):
        raise ValueError(
            f"`{prefix}replay_dir={directory!r}` is a file; it must be a folder (new or holding earlier shards, "
            "`iteration_XXXX.json`): give another path, or None for `output_dir/preference_replay`."
        )
    mode = canonical(mode, mode_field, REPLAY_MODES, REPLAY_MODE_ALIASES, "current")
    if mode == "current" and k not in (None, 1):
        raise ValueError(f"`{prefix}replay_k` must be None or 1 with `{mode_field}='current'`.")
    if mode in ("all_history", "lambda_decay") and k is not None:
        raise ValueError(f"`{prefix}replay_k` is only valid with `{mode_field}='nearest_k'`.")
    if mode != "lambda_decay" and replay_lambda is not None:
        raise ValueError(f"`{prefix}replay_lambda` is only valid with `{mode_field}='lambda_decay'`.")
    if mode == "current" and sample_size is not None:
        raise ValueError(
            f"`{prefix}replay_sample_size` is only valid with `{mode_field}` 'nearest_k', 'all_history' or "
            "'lambda_decay': 'current' trains on the round's own pairs."
        )
    if mode == "nearest_k":
        if k is None:
            raise ValueError(f"`{mode_field}='nearest_k'` needs `{prefix}replay_k` (the newest shards to replay).")
        if int(k) < 1:
            raise ValueError(f"`{prefix}replay_k` must be at least 1, got {k}.")
        k = int(k)
    if mode == "lambda_decay":
        if replay_lambda is None:
            raise ValueError(f"`{mode_field}='lambda_decay'` needs `{prefix}replay_lambda` in [0, 1].")
        if not 0.0 <= float(replay_lambda) <= 1.0:
            raise ValueError(f"`{prefix}replay_lambda` must be in [0, 1], got {replay_lambda}.")
        replay_lambda = float(replay_lambda)
    if sample_size is not None:
        if int(sample_size) < 1:
            raise ValueError(f"`{prefix}replay_sample_size` must be at least 1 or None, got {sample_size}.")
        sample_size = int(sample_size)
    return mode, k, replay_lambda, sample_size


def comparison_pairs(
    current_rewards: Sequence[float],
    comparator_rewards: Sequence[float],
    pair_selection: str = "comparator_reward",
    pairs_per_sample: int | None = 4,
    rng: random.Random | None = None,
) -> list[tuple[Side, Side]]:
    """The `(winner, loser)` pairs of one item, each side `(source, index)`, in training order.

    Args:
        current_rewards: `(K,)` the current policy's joint candidates' rewards.
        comparator_rewards: `(K',)` the comparator's.
        pair_selection: `"comparator_reward"`, `"reward_gap"`, `"random"` or `"all"`.
        pairs_per_sample: Keep the first this many (`None`: all; ignored for `"all"`).
        rng: The generator `"random"` shuffles with (`None`: Python's global one, as CoMLRL).

    >>> comparison_pairs([1.0, 0.0, 2.0], [0.0, 1.0, 2.0], "comparator_reward", None)
    [(('comparator', 1), ('current', 1)), (('current', 0), ('comparator', 0))]
    >>> comparison_pairs([3.0, 0.0], [0.0, 1.0], "reward_gap", 1)
    [(('current', 0), ('comparator', 0))]
    """
    mode = str(pair_selection).strip().lower()
    if mode not in COMPARISON_PAIR_SELECTIONS:
        raise ValueError(f"pair_selection must be one of {', '.join(COMPARISON_PAIR_SELECTIONS)}; got {mode!r}.")
    candidates = []  # (|gap|, comparator reward, k, winner, loser)
    for k in range(min(len(current_rewards), len(comparator_rewards))):
        mine, theirs = float(current_rewards[k]), float(comparator_rewards[k])
        if mine > theirs:
            candidates.append((mine - theirs, theirs, k, ("current", k), ("comparator", k)))
        elif mine < theirs:
            candidates.append((theirs - mine, theirs, k, ("comparator", k), ("current", k)))
    if mode == "random":
        (rng or random).shuffle(candidates)
    elif mode == "comparator_reward":
        candidates.sort(key=lambda c: (c[1], c[0]), reverse=True)
    elif mode == "reward_gap":
        candidates.sort(key=lambda c: c[0], reverse=True)
    # "all": already in index order
    if mode != "all" and pairs_per_sample is not None:
        candidates = candidates[: int(pairs_per_sample)]
    return [(winner, loser) for _, _, _, winner, loser in candidates]


def lambda_decay_weights(num_shards: int, replay_lambda: float) -> list[float]:
    """Sampling weights of `num_shards` shards, oldest first: `(1 - lambda) lambda**age`, normalized (age 0 is the
    newest shard); uniform for `lambda = 1`; all weight on the newest for `lambda = 0`.

    >>> lambda_decay_weights(3, 0.5)
    [0.14285714285714285, 0.2857142857142857, 0.5714285714285714]
    >>> lambda_decay_weights(2, 1.0)
    [0.5, 0.5]
    """
    if num_shards < 1:
        return []
    lam = float(replay_lambda)
    if lam == 1.0:
        return [1.0 / num_shards] * num_shards
    newest_first = [(1.0 - lam) * lam**age for age in range(num_shards)]
    total = sum(newest_first)
    if total <= 0:
        newest_first, total = [1.0] + [0.0] * (num_shards - 1), 1.0
    return [w / total for w in reversed(newest_first)]


@dataclass
class ReplayShard:
    """One iteration's pairs on disk: `iteration` (1-based), the JSON file, and how many pairs it holds."""

    iteration: int
    path: str
    num_pairs: int


def write_shard(directory: str, iteration: int, records: Sequence[dict[str, Any]]) -> ReplayShard | None:
    """Write `directory/iteration_{iteration:04d}.json` (atomically); the shard, or `None` when it holds no pair (an
    empty shard is written but is not part of the history, as in CoMLRL)."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"iteration_{int(iteration):04d}.json")
    payload = {"iteration": int(iteration), "num_pairs": len(records), "pairs": list(records)}
    with open(f"{path}.tmp", "w", encoding="utf-8") as handle:
        json.dump(payload, handle, ensure_ascii=False)
    os.replace(f"{path}.tmp", path)
    return ReplayShard(int(iteration), path, len(records)) if records else None


def load_records(shard: ReplayShard) -> list[dict[str, Any]]:
    """The pair records of a shard (CoMLRL's format, or a bare list of records)."""
    with open(shard.path, encoding="utf-8") as handle:
        payload = json.load(handle)
    records = payload.get("pairs", []) if isinstance(payload, dict) else payload
    return [r for r in records if isinstance(r, dict)] if isinstance(records, list) else []


def sample_records(records: Sequence[dict], count: int) -> list[dict]:
    """`count` records without replacement; more than the shard holds: whole shuffled copies, then a sample."""
    if not records or count <= 0:
        return []
    if count <= len(records):
        return random.sample(list(records), k=int(count))
    sampled, remaining = [], int(count)
    while remaining > 0:
        if remaining >= len(records):
            copy = list(records)
            random.shuffle(copy)
            sampled += copy
            remaining -= len(copy)
        else:
            sampled += random.sample(list(records), k=remaining)
            remaining = 0
    return sampled


def sample_replay(
    shards: Sequence[ReplayShard], sample_size: int, weights: Sequence[float] | None = None
) -> list[dict]:
    """`sample_size` records from `shards` (their non-empty ones), each draw choosing a shard by `weights`."""
    if sample_size <= 0:
        return []
    eligible = [(s, 1.0 if weights is None else float(weights[k])) for k, s in enumerate(shards) if s.num_pairs > 0]
    if not eligible:
        return []
    counts = [0] * len(eligible)
    for _ in range(int(sample_size)):
        counts[random.choices(range(len(eligible)), weights=[w for _, w in eligible], k=1)[0]] += 1
    sampled = []
    for (shard, _), count in zip(eligible, counts):
        if count > 0:
            sampled += sample_records(load_records(shard), count)
    random.shuffle(sampled)
    return sampled


def replay_sample_size(current_count: int, shards: Sequence[ReplayShard], configured: int | None) -> int:
    """`configured`, else this iteration's pair count, else the newest non-empty shard's."""
    if configured is not None:
        return int(configured)
    if current_count > 0:
        return int(current_count)
    return next((s.num_pairs for s in reversed(shards) if s.num_pairs > 0), 0)


def replay_selection(
    mode: str,
    current: Sequence[dict],
    shards: Sequence[ReplayShard],
    k: int | None = None,
    replay_lambda: float | None = None,
    sample_size: int | None = None,
) -> list[dict]:
    """The records to train on this iteration.

    Args:
        mode: `"current"`, `"nearest_k"`, `"all_history"` or `"lambda_decay"`.
        current: This iteration's records.
        shards: The history, oldest first, this iteration's shard included (when it has pairs).
        k, replay_lambda, sample_size: `preference_replay_k`, `preference_replay_lambda`,
            `preference_replay_sample_size`.
    """
    if mode == "current":
        return list(current)
    size = replay_sample_size(len(current), shards, sample_size)
    if mode == "nearest_k":
        return sample_replay(list(shards)[-int(k) :], size)
    if mode == "all_history":
        return sample_replay(shards, size)
    if mode == "lambda_decay":
        return sample_replay(shards, size, lambda_decay_weights(len(shards), replay_lambda))
    raise ValueError(f"`preference_replay_mode` must be one of {', '.join(REPLAY_MODES)}; got {mode!r}.")


__all__ = [
    "COMPARATOR_POLICIES",
    "COMPARISON_PAIR_SELECTIONS",
    "REPLAY_MODES",
    "ReplayShard",
    "canonical",
    "check_replay_fields",
    "comparison_pairs",
    "lambda_decay_weights",
    "load_records",
    "replay_sample_size",
    "replay_selection",
    "sample_records",
    "sample_replay",
    "write_shard",
]
