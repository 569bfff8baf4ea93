"""Native iterative RLHF's round fields (`multiagent_trl.preference.iterative_rlhf`): `epochs_per_round` (a round spans
several of Trainer's epochs) and `pair_scoring="reward_model"` (from the second round on the previous round's reward
model ranks the candidates), and their checks."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from datasets import Dataset
from transformers import TrainerCallback

from multiagent_trl import (
    JointRewardModel,
    MultiAgentIterativeDPOConfig,
    MultiAgentIterativeRLHFConfig,
    MultiAgentIterativeRLHFTrainer,
)
from multiagent_trl.preference.iterative_rlhf import RoundSaves
from multiagent_trl.testing import tiny_model_path

from .conftest import small_args
from .parity import assert_same_forward

ROWS = 2


def length_reward(completions1, completions2):
    return [float(len(a) + 2 * len(b)) for a, b in zip(completions1, completions2)]


def build(tmp_path, eval_dataset=None, callbacks=None, **overrides):
    settings = dict(
        num_agents=2,
        max_steps=-1,
        per_device_train_batch_size=4,
        steps_per_generation=2,  # 8 completions: 2 prompts per generation batch, one per step
        preference_num_candidates=3,
        preference_pairs_per_sample=2,
        reward_learning_rate=1e-2,
        reward_freeze_backbone=True,
    )
    settings.update(overrides)
    return MultiAgentIterativeRLHFTrainer(
        model=tiny_model_path(),
        reward_funcs=length_reward,
        args=small_args(tmp_path, MultiAgentIterativeRLHFConfig, **settings),
        train_dataset=Dataset.from_dict({"prompt": [f"Row {i}: say something." for i in range(ROWS)]}),
        eval_dataset=eval_dataset,
        callbacks=callbacks,
    )


def shard(trainer, it: int) -> list[dict]:
    path = os.path.join(trainer.args.output_dir, "preference_replay", f"iteration_{it:04d}.json")
    with open(path) as f:
        return json.load(f)["pairs"]


def test_the_defaults_keep_a_kl_to_the_start_policy_and_replay_every_round(tmp_path):
    """The settings under which iterative RLHF learned the tutorial task (docs/benchmarks.md, "Twice the budget"):
    without the KL the team collapsed (equal-length outputs) within two rounds; trained on the current round's pairs
    only, its reward model let the score swing between 39 and 93 late in the run. Iterative DPO keeps its defaults."""
    trainer = build(tmp_path)
    assert trainer.args.beta == 0.04 and trainer.args.replay_mode == "all_history"
    assert all(view.get("ref_model") is not None for view in trainer._agent_views)  # each agent's start policy
    assert MultiAgentIterativeDPOConfig.replay_mode == "current"


def test_epochs_per_round_spans_a_round_over_several_epochs(tmp_path):
    trainer = build(tmp_path, num_train_epochs=4, epochs_per_round=2)
    heads = []

    class Heads(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            heads.append(trainer.reward_model.reward_head.weight.detach().clone())

    trainer.add_callback(Heads())
    trainer.add_callback(RoundSaves(trainer, str(tmp_path / "rounds")))
    trainer.train()
    # 2 steps an epoch, 4 epochs: 2 rounds of 4 steps; pairs drawn and the reward model trained once per round.
    assert trainer.state.global_step == 8 and len(heads) == 8
    assert len(trainer.reward_model_histories) == 2
    assert all(torch.equal(heads[0], h) for h in heads[1:4]) and all(torch.equal(heads[4], h) for h in heads[5:])
    assert not torch.equal(heads[3], heads[4])
    rounds = [e for e in trainer.state.log_history if "round/index" in e]
    assert [(e["round/index"], e["step"]) for e in rounds] == [(1.0, 1), (2.0, 5)]
    # RoundSaves: the team before training and at each round's end, with that round's reward model.
    for name in ("initial", "iteration_0000", "iteration_0001"):
        assert (tmp_path / "rounds" / name / "agent_1" / "config.json").is_file()
    for k, head in ((0, heads[3]), (1, heads[7])):
        saved = JointRewardModel.from_pretrained(str(tmp_path / "rounds" / f"iteration_{k:04d}" / "reward_model"))
        torch.testing.assert_close(saved.reward_head.weight, head)
    assert sorted(os.listdir(os.path.join(trainer.args.output_dir, "preference_replay"))) == [
        "iteration_0001.json",
        "iteration_0002.json",
    ]


def test_a_run_resumed_at_a_round_start_trains_that_rounds_reward_model(tmp_path):
    """A run that stopped after drawing round 2 (its shard is on disk) but before its next checkpoint resumes from the
    checkpoint at round 1's end: round 2 is drawn and its reward model trained again. Before, the shard on disk made
    the round count as resumed inside it, and round 2 trained the team on round 1's reward model. `RoundSaves` keeps
    the team training started from in `initial/` (before, a resume overwrote it with the checkpoint's)."""
    trainer = build(tmp_path, num_train_epochs=2, save_strategy="steps", save_steps=2)
    trainer.add_callback(RoundSaves(trainer, str(tmp_path / "rounds")))
    trainer.train()
    output = trainer.args.output_dir
    assert trainer.state.global_step == 4 and os.path.isfile(
        os.path.join(output, "preference_replay/iteration_0002.json")
    )
    initial = JointRewardModel.from_pretrained(str(tmp_path / "rounds/initial/reward_model")).reward_head.weight
    first_round = JointRewardModel.from_pretrained(os.path.join(output, "checkpoint-2/reward_model"))
    shutil.rmtree(os.path.join(output, "checkpoint-4"))  # the run stopped inside round 2

    resumed = build(tmp_path, num_train_epochs=2, save_strategy="steps", save_steps=2)
    resumed.add_callback(RoundSaves(resumed, str(tmp_path / "rounds")))
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == 4 and not resumed.round_reloaded
    assert len(resumed.reward_model_histories) == 1  # round 2's reward model, trained on round 2's pairs
    assert not torch.equal(resumed.reward_model.reward_head.weight, first_round.reward_head.weight)
    kept = JointRewardModel.from_pretrained(str(tmp_path / "rounds/initial/reward_model")).reward_head.weight
    assert torch.equal(kept, initial)


class EarliestIsBest(TrainerCallback):
    """Adds `eval_earliest` (minus the step) to every evaluation, so that with `metric_for_best_model="earliest"` the
    first checkpoint evaluated is the best."""

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        metrics["eval_earliest"] = -float(state.global_step)


def test_the_best_model_loaded_at_the_end_comes_with_its_rounds_reward_model(tmp_path):
    """`load_best_model_at_end` with the best checkpoint in round 1: the agents and the reward model are round 1's.
    Before, the agents were, and the reward model stayed round 2's."""
    trainer = build(
        tmp_path, num_train_epochs=2, save_strategy="steps", save_steps=2, eval_strategy="steps", eval_steps=2,
        load_best_model_at_end=True, metric_for_best_model="earliest", greater_is_better=True,
        eval_dataset=Dataset.from_dict({"prompt": ["Row 0: say something."]}), callbacks=[EarliestIsBest()],
    )  # fmt: skip
    trainer.train()
    best = os.path.join(trainer.args.output_dir, "checkpoint-2")
    assert trainer.state.global_step == 4 and trainer.state.best_model_checkpoint == best
    saved = JointRewardModel.from_pretrained(os.path.join(best, "reward_model"))
    last = JointRewardModel.from_pretrained(os.path.join(trainer.args.output_dir, "checkpoint-4", "reward_model"))
    assert not torch.equal(saved.reward_head.weight, last.reward_head.weight)
    for key, value in saved.state_dict().items():
        torch.testing.assert_close(trainer.reward_model.state_dict()[key].cpu(), value, msg=key)


def test_the_history_comparator_draws_against_the_policy_of_k_rounds_back(tmp_path):
    """The rounds' history comparator (`IterativeRounds`) in iterative RLHF: round r's pairs are the agents at its
    start against the agents at the start of round r - 1 (k = 2), the first round's start before that."""
    trainer = build(tmp_path, num_train_epochs=3, comparator="history", comparator_history_k=2)
    sampled, sample = [], trainer.sample

    def recording_sample(rows, num_generations):
        sampled.append(sum(float(p.double().sum()) for p in trainer.policy_parameters()))
        return sample(rows, num_generations)

    trainer.sample = recording_sample
    trainer.train()
    assert len(sampled) == 6  # per round one generation call of both prompts, as the policy, then as the comparator
    starts = sampled[0::2]
    assert len(set(starts)) == 3
    assert sampled[1::2] == [starts[0], starts[0], starts[1]]


def test_pair_scoring_reward_model_ranks_later_rounds_by_the_previous_reward_model(tmp_path):
    trainer = build(tmp_path, num_train_epochs=2, pair_scoring="reward_model", save_strategy="epoch")
    trainer.train()
    # Round 1: no reward model trained yet, the task reward ranks.
    first = shard(trainer, 1)
    assert [r["winner_reward"] for r in first] == pytest.approx(
        [length_reward(*[[c] for c in r["winner_completions"]])[0] for r in first]
    )
    # Round 2: round 1's reward model (the one saved at the end of epoch 1), its raw scores.
    previous = JointRewardModel.from_pretrained(os.path.join(trainer.args.output_dir, "checkpoint-2", "reward_model"))
    records = shard(trainer, 2)
    with torch.no_grad():
        scores = {
            side: previous(
                prompts=[tuple(r["prompts"]) for r in records],
                completions=[tuple(r[f"{side}_completions"]) for r in records],
            )
            for side in ("winner", "loser")
        }
    assert_same_forward([r["winner_reward"] for r in records], scores["winner"], msg="winners")
    assert_same_forward([r["loser_reward"] for r in records], scores["loser"], msg="losers")
    assert [r["raw_rewards"][0] for r in records] == pytest.approx([r["winner_reward"] for r in records])
    # The online reward and the task reward in the logs are left as they were: no pair-scoring metrics leaked.
    assert all("rewards/length_reward/mean" not in e for e in trainer.state.log_history)


@pytest.mark.parametrize(
    "fields, match",
    [
        (dict(epochs_per_round=0), "epochs_per_round"),
        (dict(epochs_per_round=1.5), "epochs_per_round"),
        (dict(num_train_epochs=3, epochs_per_round=2), "whole number of rounds"),
        (dict(num_train_epochs=1.5), "whole number of rounds"),  # before: accepted, half a round drew a whole one
        (dict(pair_scoring="human"), "pair_scoring"),
    ],
)
def test_bad_round_fields_raise_naming_the_field(tmp_path, fields, match):
    with pytest.raises(ValueError, match=match):
        small_args(tmp_path, MultiAgentIterativeRLHFConfig, num_agents=2, max_steps=-1, **fields)


def test_pair_scoring_is_normalised(tmp_path):
    config = small_args(tmp_path, MultiAgentIterativeRLHFConfig, num_agents=2, pair_scoring=" Reward_Model")
    assert (config.pair_scoring, config.epochs_per_round) == ("reward_model", 1)
