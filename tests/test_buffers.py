"""Generation batches ("buffers") at the edge of the dataset, for every trainer that fills one before updating.

TRL's `RepeatSampler` drops the items that do not fill a last generation batch, every epoch; CoMLRL trains its last,
smaller buffer. These trainers cover every item each epoch instead (`rollout.buffers.CoveringRepeatSampler`), and
train when a buffer is larger than the whole dataset. The plain `MultiAgentGRPOTrainer` keeps TRL's sampler (its
N=1 equivalence with `GRPOTrainer` is `tests/test_equivalence.py`'s).
"""

from __future__ import annotations

import pytest
from datasets import Dataset

from multiagent_trl import (
    ActorCriticConfig,
    ActorCriticTrainer,
    IACConfig,
    IACTrainer,
    MAACConfig,
    MAACTrainer,
    MADPOConfig,
    MADPOTrainer,
    MAGRPOConfig,
    MAGRPOTrainer,
    MultiAgentDPOConfig,
    MultiAgentDPOTrainer,
)
from tests.conftest import small_args

BUFFER = 8  # items per generation batch in every family below


def recording_reward(log: list):
    """A CoMLRL-style joint reward that records the prompt of every row it scores; varied, so that pairs exist."""

    def reward(completions1, completions2, *, batch_items):
        rows = batch_items if len(batch_items) == len(completions1) else batch_items * len(completions1)
        log.extend(row["prompt"] for row in rows)
        return [float(sum(map(ord, a + b)) % 7) for a, b in zip(completions1, completions2)]

    return reward


def native_fields(tmp_path, generations: int) -> dict:
    return dict(
        num_agents=2,
        num_generations=generations,
        per_device_train_batch_size=BUFFER * generations,
        steps_per_generation=1,
        max_completion_length=4,
        max_steps=-1,
        num_train_epochs=1,
        generation_mode="per_agent",
    )


def comlrl_fields(tmp_path) -> dict:
    return dict(
        num_agents=2,
        num_train_epochs=1,
        max_new_tokens=4,
        eval_interval=0,
        report_to="none",
        logging_steps=1,
        output_dir=str(tmp_path / "out"),
    )


def build(family: str, tmp_path, model: str, dataset: Dataset, reward):
    """A trainer of `family` whose generation batch holds `BUFFER` items."""
    if family == "actor-critic":
        args = small_args(tmp_path, ActorCriticConfig, **native_fields(tmp_path, 2), critic_type="v")
        return ActorCriticTrainer(model=model, reward_funcs=reward, args=args, train_dataset=dataset)
    if family == "dpo":
        args = small_args(tmp_path, MultiAgentDPOConfig, **native_fields(tmp_path, 2), preference_pairs_per_sample=1)
        return MultiAgentDPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=dataset)
    if family in ("iac", "maac"):
        config, trainer = (IACConfig, IACTrainer) if family == "iac" else (MAACConfig, MAACTrainer)
        args = config(**comlrl_fields(tmp_path), num_turns=1, num_generations=1, rollout_buffer_size=BUFFER)
        return trainer(agent_model=model, critic_model=model, reward_func=reward, args=args, train_dataset=dataset)
    if family == "madpo":
        args = MADPOConfig(
            **comlrl_fields(tmp_path),
            preference_num_candidates=2,
            preference_pairs_per_sample=1,
            rollout_buffer_size=BUFFER,
        )
        return MADPOTrainer(agent_model=model, reward_func=reward, args=args, train_dataset=dataset)
    if family == "magrpo":
        args = MAGRPOConfig(**comlrl_fields(tmp_path), num_turns=1, num_generations=2, rollout_buffer_size=BUFFER)
        return MAGRPOTrainer(agent_model=model, reward_func=reward, args=args, train_dataset=dataset)
    raise ValueError(family)


FAMILIES = ["actor-critic", "iac", "maac", "dpo", "madpo", "magrpo"]


@pytest.mark.parametrize("family", FAMILIES)
def test_every_item_is_trained_each_epoch(tmp_path, tiny_path, family):
    """10 items and a buffer of 8: the last 2 items are trained in the same epoch (TRL's sampler drops them)."""
    prompts = [f"Item {k}:" for k in range(10)]
    scored: list[str] = []
    trainer = build(family, tmp_path, tiny_path, Dataset.from_dict({"prompt": prompts}), recording_reward(scored))
    if hasattr(trainer, "verbose"):
        trainer.verbose = False
    trainer.train()
    assert set(scored) == set(prompts)
    assert trainer.state.epoch == pytest.approx(1.0)
    # Two generation batches in the epoch: the second holds the last 2 items and 6 from the start of the order.
    assert trainer.state.global_step == 2 * trainer.args.steps_per_generation * trainer.num_iterations


@pytest.mark.parametrize("family", FAMILIES)
def test_a_buffer_larger_than_the_dataset_trains(tmp_path, tiny_path, family):
    """A buffer of 8 items over 4 (IAC's default `rollout_buffer_size` with one turn): one generation batch per
    epoch, every item in it (TRL raised "args.max_steps must be set to a positive value")."""
    prompts = [f"Item {k}:" for k in range(4)]
    scored: list[str] = []
    trainer = build(family, tmp_path, tiny_path, Dataset.from_dict({"prompt": prompts}), recording_reward(scored))
    if hasattr(trainer, "verbose"):
        trainer.verbose = False
    trainer.train()
    assert set(scored) == set(prompts)
    assert trainer.state.global_step == trainer.args.steps_per_generation * trainer.num_iterations


def test_covering_sampler_wraps_the_epoch_order():
    """Every item once per epoch, the last chunk completed from the start of the same epoch's order, and a length
    that matches what it yields (Trainer counts steps per epoch from it)."""
    from multiagent_trl.rollout.buffers import CoveringRepeatSampler

    sampler = CoveringRepeatSampler(list(range(10)), mini_repeat_count=2, batch_size=4, repeat_count=3, seed=0)
    order = list(sampler)
    assert len(order) == len(sampler) == 3 * 4 * 2 * 3
    chunks = [order[k : k + 24][::2][:4] for k in range(0, len(order), 24)]
    first = [i for chunk in chunks for i in chunk]
    assert sorted(set(first)) == list(range(10))
    assert first[10:] == first[:2]  # the padding is the start of this epoch's permutation
    small = CoveringRepeatSampler(list(range(3)), mini_repeat_count=1, batch_size=8, shuffle=False)
    assert list(small) == [0, 1, 2, 0, 1, 2, 0, 1] and len(small) == 8
    empty = CoveringRepeatSampler([], mini_repeat_count=1, batch_size=8)
    assert list(empty) == [] and len(empty) == 0


# ---- a generation batch whose pairs make more optimizer steps than its completions divide into


def test_madpo_config_without_a_pair_limit_builds_and_trains(tmp_path, tiny_path):
    """`MADPOConfig(preference_pairs_per_sample=None)` with CoMLRL's other defaults: 2 items of 80 candidates (160
    completions) make up to 2 * 3160 pairs, 3160 optimizer steps of 2 pairs, which 160 does not divide. CoMLRL
    accepts it; here the generation batch's pairs are split into those steps (`pair_steps_per_generation`)."""
    args = MADPOConfig(preference_pairs_per_sample=None, output_dir=str(tmp_path / "out"))
    assert args.per_device_train_batch_size * args.steps_per_generation == 2 * 80
    assert args.pair_steps == 3160
    scored: list[str] = []
    args = MADPOConfig(
        preference_pairs_per_sample=None,
        max_new_tokens=4,
        max_steps=1,
        eval_interval=0,
        report_to="none",
        output_dir=str(tmp_path / "out"),
    )
    dataset = Dataset.from_dict({"prompt": ["Item 0:", "Item 1:"]})
    reward = recording_reward(scored)
    trainer = MADPOTrainer(agent_model=tiny_path, reward_func=reward, args=args, train_dataset=dataset)
    trainer.verbose = False
    trainer.train()
    assert trainer.state.global_step == 1
    assert len(scored) == 160  # one generation batch: every candidate of both items scored once
    assert trainer.state.log_history[0]["pairs/count"] > 0


def test_madpo_pairs_split_into_steps_the_completions_do_not_divide(tmp_path, tiny_path):
    """4 candidates, every pair (6 per item), 2 items, 2 pairs per step: 6 optimizer steps over 8 completions. One
    epoch trains those 6 steps (the steps per epoch follow the pair steps) on one generation batch."""
    scored: list[str] = []
    args = MADPOConfig(
        **comlrl_fields(tmp_path),
        preference_num_candidates=4,
        preference_pairs_per_sample=None,
        rollout_buffer_size=2,
        train_batch_size=2,
    )
    assert (args.per_device_train_batch_size, args.steps_per_generation, args.pair_steps) == (8, 1, 6)
    dataset = Dataset.from_dict({"prompt": ["Item 0:", "Item 1:", "Item 2:"]})
    reward = recording_reward(scored)
    trainer = MADPOTrainer(agent_model=tiny_path, reward_func=reward, args=args, train_dataset=dataset)
    trainer.verbose = False
    trainer.train()
    assert trainer.state.global_step == 2 * 6  # two generation batches (3 items, buffers of 2), 6 steps each
    assert len(scored) == 2 * 8 and set(scored) == set(dataset["prompt"])
    assert sum(entry.get("pairs/count", 0) > 0 for entry in trainer.state.log_history) >= 1
