"""Value-target normalization of the actor-critic trainer (`ActorCriticConfig.value_normalization`): the critic keeps
up with a reward of any scale, its statistics survive a checkpoint, and a checkpoint of the other setting is
refused."""

from __future__ import annotations

import os

import pytest
import torch
from datasets import Dataset

from multiagent_trl.actor_critic.config import ActorCriticConfig
from multiagent_trl.actor_critic.trainer import VALUE_NORM_FILE, ActorCriticTrainer
from multiagent_trl.testing import tiny_model_path

from .conftest import small_args

DATASET = Dataset.from_dict({"prompt": ["Name a red fruit:", "Name a sea fish:"] * 4})
SCALE = 50.0  # the tutorial's ratio rewards are x100: of this order


def large_reward(completions1, completions2):
    return [SCALE + 0.1 * len(a) for a in completions1]


def trainer_with(tmp_path, value_normalization: bool, **overrides):
    args = small_args(
        tmp_path,
        ActorCriticConfig,
        num_agents=2,
        num_generations=2,
        value_normalization=value_normalization,
        learning_rate=3e-4,
        **overrides,
    )
    return ActorCriticTrainer(model=tiny_model_path(), reward_funcs=large_reward, args=args, train_dataset=DATASET)


@pytest.mark.parametrize("value_normalization", [False, True])
def test_the_critic_keeps_up_with_a_large_reward_only_with_value_normalization(tmp_path, value_normalization):
    torch.manual_seed(0)
    trainer = trainer_with(tmp_path, value_normalization, max_steps=4)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "agent_0/value_mean" in h]
    gap = abs(logs[-1]["agent_0/value_mean"] - logs[-1]["agent_0/value_target_mean"])
    if value_normalization:
        assert gap < 0.1 * SCALE  # V_old, read in the reward's scale, is near the targets from the second batch on
    else:
        assert gap > 0.8 * SCALE  # a head near 0 at Adam's steps of 3e-4: the critic is far from the reward


def test_the_statistics_are_saved_with_each_checkpoint_and_restored_on_resume(tmp_path):
    torch.manual_seed(0)
    trainer = trainer_with(tmp_path, True, max_steps=2, save_strategy="steps", save_steps=2)
    trainer.train()
    checkpoint = os.path.join(trainer.args.output_dir, "checkpoint-2")
    assert VALUE_NORM_FILE in os.listdir(checkpoint)
    saved = [normalizer.stats() for normalizer in trainer.value_normalizers]
    resumed = trainer_with(tmp_path, True, max_steps=2, save_strategy="steps", save_steps=2)
    assert resumed.value_normalizers[0].stats()[0].item() == 0.0  # new: the identity
    resumed.train(resume_from_checkpoint=checkpoint)
    for normalizer, (mean, std) in zip(resumed.value_normalizers, saved):
        assert normalizer.stats()[0].item() == pytest.approx(mean.item())
        assert normalizer.stats()[1].item() == pytest.approx(std.item())
        assert mean.item() == pytest.approx(SCALE, rel=0.1)
    # A trainer without normalization reads the critics' outputs as values: it refuses that checkpoint.
    plain = trainer_with(tmp_path, False, max_steps=2)
    with pytest.raises(ValueError, match="value_normalization"):
        plain.train(resume_from_checkpoint=checkpoint)


def test_on_by_default_and_off_in_comlrls_layer(tmp_path):
    """The native default standardizes each critic's targets (without it IAC and MAAC climb and fall again on the
    tutorial task: docs/actor-critic.md); CoMLRL's configs keep CoMLRL's critic, with none."""
    from multiagent_trl import IACConfig, MAACConfig

    args = small_args(tmp_path, ActorCriticConfig, num_agents=2, num_generations=2)
    trainer = ActorCriticTrainer(model=tiny_model_path(), reward_funcs=large_reward, args=args, train_dataset=DATASET)
    assert args.value_normalization and len(trainer.value_normalizers) == 2
    assert not IACConfig(report_to="none").value_normalization
    assert not MAACConfig(report_to="none").value_normalization
