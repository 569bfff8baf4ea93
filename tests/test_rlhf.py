"""Native RLHF (`multiagent_trl.preference.rlhf`): `MultiAgentRLHFTrainer` trains a joint reward model from the team's
own samples ranked by the task reward, or from given `JointPreferencePair`s, trains the team on its scores, evaluates
on the task reward, saves the reward model in every checkpoint and restores it on resume; bad input raises at
construction naming the argument."""

from __future__ import annotations

import os

import pytest
import torch
from datasets import Dataset

from multiagent_trl import JointRewardModel, MultiAgentRLHFConfig, MultiAgentRLHFTrainer
from multiagent_trl.preference.reward_training import JointPreferencePair
from multiagent_trl.testing import tiny_model_path

from .conftest import small_args

DATASET = Dataset.from_dict({"prompt": ["Say hi:", "Pick a word:"] * 4})


def length_reward(completions1, completions2):
    """The task reward: longer first answers, shorter second ones."""
    return [float(len(a)) - 0.5 * len(b) for a, b in zip(completions1, completions2)]


def rlhf_args(tmp_path, **overrides):
    settings = dict(
        num_agents=2, preference_num_candidates=4, preference_pairs_per_sample=2, reward_learning_rate=1e-3
    )
    settings.update(overrides)
    return small_args(tmp_path, MultiAgentRLHFConfig, **settings)


def test_trains_on_reward_model_scores_from_self_ranked_pairs_and_evaluates_on_the_task_reward(tmp_path):
    torch.manual_seed(0)
    trainer = MultiAgentRLHFTrainer(
        model=tiny_model_path(),
        reward_funcs=length_reward,
        args=rlhf_args(tmp_path),
        train_dataset=DATASET,
        eval_dataset=DATASET.select(range(2)),
    )
    head = {k: v.clone() for k, v in trainer.reward_model.reward_head.state_dict().items()}
    trainer.train()
    # The reward model was trained on the team's own pairs, ranked by the task reward.
    assert trainer.preference_pairs and all(p.chosen_reward > p.rejected_reward for p in trainer.preference_pairs)
    for pair in trainer.preference_pairs:
        assert length_reward([pair.chosen[0]], [pair.chosen[1]])[0] == pytest.approx(pair.chosen_reward)
    assert trainer.reward_model_history
    assert any(not torch.equal(v, trainer.reward_model.reward_head.state_dict()[k]) for k, v in head.items())
    first = trainer.state.log_history[0]
    assert first["reward_model/pairs"] == len(trainer.preference_pairs)
    # Training rewards are the reward model's scores ...
    logged = [h for h in trainer.state.log_history if "reward" in h]
    assert logged and all(h["reward"] == pytest.approx(h["rewards/joint_reward_model/mean"]) for h in logged)
    assert all("rewards/length_reward/mean" not in h for h in logged)
    # ... evaluation is the task reward's.
    metrics = trainer.evaluate()
    assert "eval_rewards/length_reward/mean" in metrics
    assert not any("joint_reward_model" in key for key in metrics)
    assert metrics["eval_reward"] == pytest.approx(metrics["eval_rewards/length_reward/mean"])


class CountedSampling(MultiAgentRLHFTrainer):
    """Records the rows of every `sample` call (one generation call per agent)."""

    def sample(self, rows, num_generations):
        self.sampled_rows = [*getattr(self, "sampled_rows", []), len(rows)]
        return super().sample(rows, num_generations)


def test_the_pair_stage_draws_a_generation_batch_of_rows_per_call(tmp_path):
    """As training and the iterative rounds do, the pair stage generates `generation_batch_size` rows per call
    (here 8 rows: 2 prompts of K 4 candidates), not one prompt per call (CoMLRL's loop)."""
    trainer = CountedSampling(
        model=tiny_model_path(), reward_funcs=length_reward, args=rlhf_args(tmp_path), train_dataset=DATASET
    )
    trainer.train_reward_stage()
    assert trainer.args.generation_batch_size == 8
    assert trainer.sampled_rows == [2, 2, 2, 2]  # the 8 prompts, 2 per call
    assert len(trainer.preference_pairs) == 2 * len(DATASET)  # every prompt still gives its pairs


def test_trains_the_reward_model_from_given_preference_pairs(tmp_path):
    pairs = [
        JointPreferencePair(("Say hi:", "Say hi:"), ("hello there", "hi"), ("x", "a very long answer")),
        JointPreferencePair(("Pick a word:", "Pick a word:"), ("apple pie", "ok"), ("", "what a long word")),
    ]
    trainer = MultiAgentRLHFTrainer(
        model=tiny_model_path(),
        reward_funcs=length_reward,
        args=rlhf_args(tmp_path, reward_num_train_epochs=3),
        train_dataset=DATASET,
        preference_pairs=pairs,
    )
    trainer.train()
    assert trainer.preference_pairs == pairs  # the given ones, not drawn from the team
    assert len(trainer.reward_model_history) == 3 * len(pairs)
    assert trainer.state.log_history[0]["reward_model/pairs"] == len(pairs)
    with torch.no_grad():
        chosen = trainer.reward_model.score_joint([p.prompts for p in pairs], [p.chosen for p in pairs])
        rejected = trainer.reward_model.score_joint([p.prompts for p in pairs], [p.rejected for p in pairs])
    assert (chosen > rejected).all()  # learned the given ranking


def test_checkpoints_hold_the_reward_model_and_resume_restores_it(tmp_path):
    args = rlhf_args(tmp_path, save_strategy="steps", save_steps=2, max_steps=2)
    trainer = MultiAgentRLHFTrainer(
        model=tiny_model_path(), reward_funcs=length_reward, args=args, train_dataset=DATASET
    )
    trainer.train()
    checkpoint = os.path.join(args.output_dir, "checkpoint-2")
    assert os.path.isdir(os.path.join(checkpoint, "reward_model"))
    saved = JointRewardModel.from_pretrained(os.path.join(checkpoint, "reward_model")).state_dict()
    del trainer

    # A new process's trainer: a fresh head, then resumed from the latest checkpoint, one step more.
    torch.manual_seed(123)
    resumed = MultiAgentRLHFTrainer(
        model=tiny_model_path(),
        reward_funcs=length_reward,
        args=rlhf_args(tmp_path, save_strategy="steps", save_steps=2, max_steps=3),
        train_dataset=DATASET,
    )
    fresh = {k: v.clone() for k, v in resumed.reward_model.state_dict().items()}
    assert any(not torch.equal(fresh[k], saved[k]) for k in saved)
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == 3
    assert resumed.preference_pairs == [] and resumed.reward_model_history == []  # restored, not trained again
    for key, value in resumed.reward_model.state_dict().items():
        torch.testing.assert_close(value, saved[key], msg=key)
    assert os.path.isdir(os.path.join(args.output_dir, "checkpoint-3", "reward_model"))


def test_resuming_without_a_checkpoint_is_refused_before_the_reward_model_stage(tmp_path):
    """`train(resume_from_checkpoint=True)` with no checkpoint in `output_dir` raises Trainer's error, before the pair
    draw and the reward model's training (which before ran first, and were lost to the error)."""
    trainer = MultiAgentRLHFTrainer(
        model=tiny_model_path(), reward_funcs=length_reward, args=rlhf_args(tmp_path), train_dataset=DATASET
    )
    with pytest.raises(ValueError, match="No valid checkpoint found in output directory"):
        trainer.train(resume_from_checkpoint=True)
    assert trainer.preference_pairs == [] and trainer.reward_model_history == []


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"reward_learning_rate": 0.0}, "reward_learning_rate"),
        ({"preference_num_candidates": 1}, "preference_num_candidates"),
        ({"pair_selection": "best"}, "pair_selection"),
        ({"reward_model_device": "gpu!"}, "reward_model_device"),
        ({"reward_pooling": "first"}, "reward_pooling"),
        ({"num_turns": 2}, "num_turns=1"),
        ({"joint_mode": "cross"}, "joint_mode='aligned'"),
    ],
)
def test_bad_config_raises_naming_the_field(tmp_path, overrides, match):
    with pytest.raises(ValueError, match=match):
        rlhf_args(tmp_path, **overrides)


def test_bad_trainer_arguments_raise_at_construction(tmp_path):
    common = dict(model=tiny_model_path(), args=rlhf_args(tmp_path), train_dataset=DATASET)
    with pytest.raises(ValueError, match="reward_funcs"):
        MultiAgentRLHFTrainer(**common)
    with pytest.raises(TypeError, match="preference_pairs"):
        MultiAgentRLHFTrainer(**common, reward_funcs=length_reward, preference_pairs=[("a", "b")])
    with pytest.raises(ValueError, match="preference_pairs"):
        MultiAgentRLHFTrainer(**common, reward_funcs=length_reward, preference_pairs=[])
    one_agent = JointPreferencePair(("p",), ("a",), ("b",))
    with pytest.raises(ValueError, match="preference_pairs"):
        MultiAgentRLHFTrainer(**common, reward_funcs=length_reward, preference_pairs=[one_agent])
    with pytest.raises(TypeError, match="reward_model"):
        MultiAgentRLHFTrainer(**common, reward_funcs=length_reward, reward_model="not a model")
    # Before: 'meta' failed in train(), inside the kernels package; 'xpu' (absent here) raised torch's assertion.
    absent = [] if torch.xpu.is_available() else [("xpu", "is not on this machine")]
    for device, message in [("meta", "holds no weights"), *absent]:
        args = rlhf_args(tmp_path, reward_model_device=device)
        with pytest.raises(ValueError, match=rf"`reward_model_device='{device}'` {message}"):
            MultiAgentRLHFTrainer(**{**common, "args": args}, reward_funcs=length_reward)
    three_agents = JointRewardModel.from_causal_lm(tiny_model_path(), pooling="span_sums", num_agents=3)
    with pytest.raises(ValueError, match=r"`reward_model` pools 3 agents' responses .* build it with `num_agents=2`"):
        MultiAgentRLHFTrainer(**common, reward_funcs=length_reward, reward_model=three_agents)
    with pytest.raises(TypeError, match="MultiAgentRLHFConfig"):
        MultiAgentRLHFTrainer(model=tiny_model_path(), reward_funcs=length_reward, args=small_args(tmp_path))


def test_a_new_reward_head_pools_each_agents_response_by_default_and_the_comlrl_layer_keeps_the_last_token(tmp_path):
    common = dict(model=tiny_model_path(), reward_funcs=length_reward, train_dataset=DATASET)
    native = MultiAgentRLHFTrainer(**common, args=rlhf_args(tmp_path))
    assert (native.reward_model.pooling, native.reward_model.num_agents) == ("span_sums", 2)
    assert native.reward_model.reward_head.in_features == 2 * native.reward_model.backbone.config.hidden_size
    last = MultiAgentRLHFTrainer(**common, args=rlhf_args(tmp_path, reward_pooling="last"))
    assert last.reward_model.pooling == "last"

    from multiagent_trl import MARLHFConfig, MARLHFTrainer

    comlrl = MARLHFTrainer(
        agent_model=tiny_model_path(),
        num_agents=2,
        reward_func=length_reward,
        args=MARLHFConfig(output_dir=str(tmp_path / "comlrl"), num_agents=2, report_to=[]),
        train_dataset=DATASET,
    )
    assert comlrl.reward_model.pooling == "last"
