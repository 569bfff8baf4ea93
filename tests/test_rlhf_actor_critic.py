"""Native RLHF with an actor-critic online stage (`multiagent_trl.preference.rlhf_actor_critic`): the reward-model
stage of `MultiAgentRLHFTrainer` followed by `ActorCriticTrainer`'s training on the reward model's scores, evaluated on
the task reward; checkpoints hold the critics and the reward model, and resuming restores both."""

from __future__ import annotations

import os

import pytest
import torch

from multiagent_trl import ActorCriticRLHFConfig, ActorCriticRLHFTrainer, JointRewardModel, MultiAgentRLHFConfig
from multiagent_trl.testing import tiny_model_path

from .conftest import small_args
from .test_rlhf import DATASET, length_reward


def ac_rlhf_args(tmp_path, **overrides):
    settings = dict(
        num_agents=2,
        num_generations=1,
        joint_critic=True,
        preference_num_candidates=4,
        preference_pairs_per_sample=2,
        reward_learning_rate=1e-3,
    )
    settings.update(overrides)
    return small_args(tmp_path, ActorCriticRLHFConfig, **settings)


def test_the_critic_trains_on_reward_model_scores_and_evaluation_on_the_task_reward(tmp_path):
    torch.manual_seed(0)
    trainer = ActorCriticRLHFTrainer(
        model=tiny_model_path(),
        reward_funcs=length_reward,
        args=ac_rlhf_args(tmp_path),
        train_dataset=DATASET,
        eval_dataset=DATASET.select(range(2)),
    )
    critic = {k: v.clone() for k, v in trainer.model.critics[0].state_dict().items()}
    trainer.train()
    assert trainer.preference_pairs and all(p.chosen_reward > p.rejected_reward for p in trainer.preference_pairs)
    assert trainer.state.log_history[0]["reward_model/pairs"] == len(trainer.preference_pairs)
    logged = [h for h in trainer.state.log_history if "reward" in h and "eval_reward" not in h]
    assert logged and all(h["reward"] == pytest.approx(h["rewards/joint_reward_model/mean"]) for h in logged)
    assert all("rewards/length_reward/mean" not in h for h in logged)
    trained = trainer.model.critics[0].state_dict()
    assert any(not torch.equal(v, trained[k]) for k, v in critic.items())  # the joint critic learned
    metrics = trainer.evaluate()
    assert metrics["eval_reward"] == pytest.approx(metrics["eval_rewards/length_reward/mean"])
    assert not any("joint_reward_model" in key for key in metrics)


def test_checkpoints_hold_critic_and_reward_model_and_resume_restores_both(tmp_path):
    args = ac_rlhf_args(tmp_path, save_strategy="steps", save_steps=2, max_steps=2)
    trainer = ActorCriticRLHFTrainer(
        model=tiny_model_path(), reward_funcs=length_reward, args=args, train_dataset=DATASET
    )
    trainer.train()
    checkpoint = os.path.join(args.output_dir, "checkpoint-2")
    assert all(os.path.isdir(os.path.join(checkpoint, name)) for name in ("reward_model", "critic"))
    saved_reward = JointRewardModel.from_pretrained(os.path.join(checkpoint, "reward_model")).state_dict()
    saved_critic = {k: v.clone() for k, v in trainer.model.critics[0].state_dict().items()}
    del trainer

    torch.manual_seed(123)
    resumed = ActorCriticRLHFTrainer(
        model=tiny_model_path(),
        reward_funcs=length_reward,
        args=ac_rlhf_args(tmp_path, save_strategy="steps", save_steps=2, max_steps=2),
        train_dataset=DATASET,
    )
    resumed.train(resume_from_checkpoint=True)  # nothing left to train: the restored state is the checkpoint's
    assert resumed.state.global_step == 2
    assert resumed.preference_pairs == [] and resumed.reward_model_history == []  # restored, not trained again
    for key, value in resumed.reward_model.state_dict().items():
        torch.testing.assert_close(value, saved_reward[key], msg=key)
    for key, value in resumed.model.critics[0].state_dict().items():
        torch.testing.assert_close(value, saved_critic[key], msg=key)


def test_a_config_without_the_critic_fields_raises_naming_the_config(tmp_path):
    with pytest.raises(TypeError, match="ActorCriticRLHFTrainer needs an ActorCriticRLHFConfig"):
        ActorCriticRLHFTrainer(
            model=tiny_model_path(),
            reward_funcs=length_reward,
            args=small_args(tmp_path, MultiAgentRLHFConfig, num_agents=2),
            train_dataset=DATASET,
        )
    with pytest.raises(ValueError, match="reward_learning_rate"):
        ac_rlhf_args(tmp_path, reward_learning_rate=0.0)
