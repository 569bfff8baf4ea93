"""Native iterative MADPO (`multiagent_trl.preference.iterative`): rounds of pairs against a comparator trained by one
`Trainer.train`: one optimizer and one learning-rate schedule over every round, `global_step` the sum of the rounds'
steps, callbacks on every step, gradient accumulation, replay shards, and checkpoint/resume inside the run."""

from __future__ import annotations

import json
import os

import pytest
import torch
from datasets import Dataset
from peft import LoraConfig
from transformers import AutoModelForCausalLM, TrainerCallback

from multiagent_trl import JointRewardModel, MultiAgentIterativeRLHFConfig, MultiAgentIterativeRLHFTrainer
from multiagent_trl.preference.iterative import MultiAgentIterativeDPOConfig, MultiAgentIterativeDPOTrainer, RoundSaves
from multiagent_trl.preference.replay import write_shard
from multiagent_trl.testing import tiny_model_path

from .conftest import small_args, snapshot

ROWS = 4


def length_reward(completions1, completions2):
    return [float(len(a) + 2 * len(b)) for a, b in zip(completions1, completions2)]


class StepRecorder(TrainerCallback):
    """Every optimizer step Trainer reports, with the learning rate the scheduler gave it."""

    def __init__(self):
        self.steps, self.lrs = [], []

    def on_step_end(self, args, state, control, optimizer=None, lr_scheduler=None, **kwargs):
        self.steps.append(state.global_step)
        self.lrs.append(lr_scheduler.get_last_lr()[0])


def build(tmp_path, rounds=3, callbacks=None, reward=length_reward, **overrides):
    settings = dict(
        num_agents=2,
        num_train_epochs=rounds,
        max_steps=-1,
        per_device_train_batch_size=4,
        steps_per_generation=2,  # 8 completions: 2 prompts per generation batch, 2 generation batches per round
        preference_pairs_per_sample=2,
        lr_scheduler_type="linear",
    )
    settings.update(overrides)
    args = small_args(tmp_path, MultiAgentIterativeDPOConfig, **settings)
    return MultiAgentIterativeDPOTrainer(
        model=tiny_model_path(),
        reward_funcs=reward,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": [f"Row {i}: say something." for i in range(ROWS)]}),
        callbacks=callbacks,
    )


def test_one_schedule_and_step_count_over_every_round(tmp_path):
    recorder = StepRecorder()
    trainer = build(tmp_path, rounds=3, callbacks=[recorder])
    optimizer_ids = set()

    class Optimizers(TrainerCallback):
        def on_step_end(self, args, state, control, optimizer=None, **kwargs):
            optimizer_ids.add(id(optimizer))

    trainer.add_callback(Optimizers())
    trainer.train()
    # 2 generation batches per round, 2 optimizer steps each: 4 steps a round, 12 over the run.
    assert trainer.state.global_step == 12
    assert recorder.steps == list(range(1, 13))  # the callback saw every step, numbered once over the run
    assert len(optimizer_ids) == 1
    # One linear decay from the first step to the last: no restart at a round boundary.
    lr0 = trainer.args.learning_rate
    expected = [lr0 * (1 - s / 12) for s in range(1, 13)]
    assert recorder.lrs == pytest.approx(expected, rel=1e-6)
    rounds = [e["round/index"] for e in trainer.state.log_history if "round/index" in e]
    assert rounds == [1.0, 2.0, 3.0]
    shards = sorted(os.listdir(os.path.join(trainer.args.output_dir, "preference_replay")))
    assert shards == ["iteration_0001.json", "iteration_0002.json", "iteration_0003.json"]
    with open(os.path.join(trainer.args.output_dir, "preference_replay", shards[0])) as handle:
        assert json.load(handle)["num_pairs"] > 0


def test_gradient_accumulation_counts_optimizer_steps(tmp_path):
    recorder = StepRecorder()
    trainer = build(tmp_path, rounds=2, callbacks=[recorder], gradient_accumulation_steps=2)
    trainer.train()
    # 4 micro-batches a round, 2 per optimizer step: 2 steps a round.
    assert trainer.state.global_step == 4
    assert recorder.steps == [1, 2, 3, 4]


def test_resume_inside_the_run(tmp_path):
    trainer = build(tmp_path, rounds=2, save_strategy="steps", save_steps=2)
    trainer.train()
    assert trainer.state.global_step == 8
    checkpoint = os.path.join(trainer.args.output_dir, "checkpoint-6")  # in the middle of round 2
    assert os.path.isdir(checkpoint)
    recorder = StepRecorder()
    resumed = build(tmp_path, rounds=2, callbacks=[recorder], save_strategy="steps", save_steps=2)
    resumed.train(resume_from_checkpoint=checkpoint)
    assert recorder.steps == [7, 8]
    assert resumed.state.global_step == 8
    assert resumed.round_index == 1  # the interrupted round's pairs came back from its shard


def round_pair_counts(trainer) -> list[float]:
    return [e["round/train_pairs"] for e in trainer.state.log_history if "round/train_pairs" in e]


def test_pair_rounds_train_as_many_steps_as_their_pairs(tmp_path):
    recorder = StepRecorder()
    trainer = build(tmp_path, rounds=2, callbacks=[recorder], pair_batch_size=3, pair_passes=2)
    trainer.train()
    counts = round_pair_counts(trainer)
    assert len(counts) == 2 and all(0 < c <= ROWS * 2 for c in counts)
    # Each round: 2 passes over its pairs, 3 pairs per step; the steps numbered once over the run.
    steps = sum(2 * -(-int(c) // 3) for c in counts)
    assert trainer.state.global_step == steps and recorder.steps == list(range(1, steps + 1))
    # One linear schedule over the run, sized on the most pairs a round can draw (4 prompts x 2): 2 x 3 steps a round.
    lr0 = trainer.args.learning_rate
    assert trainer.state.max_steps == 12
    assert recorder.lrs == pytest.approx([lr0 * (1 - s / 12) for s in range(1, steps + 1)], rel=1e-6)
    trained = [e["pairs/count"] for e in trainer.state.log_history if "pairs/count" in e]
    assert trained and all(1 <= c <= 3 for c in trained)


def test_pair_rounds_with_gradient_accumulation_take_whole_optimizer_steps(tmp_path):
    recorder = StepRecorder()
    trainer = build(tmp_path, rounds=2, callbacks=[recorder], pair_batch_size=1, gradient_accumulation_steps=2)
    trainer.train()
    steps = sum(-(-int(c) // 2) for c in round_pair_counts(trainer))  # 1 pair per micro-batch, 2 per step
    assert trainer.state.global_step == steps and recorder.steps == list(range(1, steps + 1))


def test_pair_rounds_refuse_what_they_cannot_do(tmp_path):
    with pytest.raises(ValueError, match="pair_batch_size"):
        small_args(tmp_path, MultiAgentIterativeDPOConfig, num_agents=2, pair_passes=2)
    with pytest.raises(ValueError, match="num_train_epochs"):
        small_args(tmp_path, MultiAgentIterativeDPOConfig, num_agents=2, pair_batch_size=2, max_steps=4)
    with pytest.raises(ValueError, match=r"`num_train_epochs=1.5` counts the rounds"):  # before: half a round drew one
        small_args(tmp_path, MultiAgentIterativeDPOConfig, num_agents=2, num_train_epochs=1.5, max_steps=-1)
    trainer = build(tmp_path, rounds=1, pair_batch_size=2)
    with pytest.raises(NotImplementedError, match="Resuming"):
        trainer.train(resume_from_checkpoint=str(tmp_path))


def test_round_saves_keep_the_team_at_each_pair_rounds_end(tmp_path):
    """`RoundSaves` on iterative MADPO: a round is one epoch, saved when it ends, also when it drew fewer pairs than
    the most a round can (its epoch then ends at a fraction)."""

    def parity(completions1, completions2):  # ties often: rounds draw fewer pairs than the most
        return [float(len(a) % 2) for a in completions1]

    trainer = build(tmp_path, rounds=2, reward=parity, pair_batch_size=1)
    ends = []

    class RoundEnds(TrainerCallback):
        def on_epoch_end(self, args, state, control, **kwargs):
            ends.append((state.epoch, snapshot(trainer.model)))

    trainer.add_callback(RoundEnds())
    trainer.add_callback(RoundSaves(trainer, str(tmp_path / "rounds")))
    trainer.train()
    assert sorted(os.listdir(tmp_path / "rounds")) == ["initial", "iteration_0000", "iteration_0001"]
    assert len(ends) == 2
    assert any(epoch != int(epoch) for epoch, _ in ends)  # a round ended early
    for k, (_, weights) in enumerate(ends):
        saved = AutoModelForCausalLM.from_pretrained(tmp_path / "rounds" / f"iteration_{k:04d}" / "agent_1")
        for name, param in saved.named_parameters():
            torch.testing.assert_close(param, weights[f"agents.1.{name}"])


def test_a_fresh_run_draws_anew_over_an_older_runs_shard(tmp_path):
    trainer = build(tmp_path, rounds=1)
    folder = os.path.join(trainer.args.output_dir, "preference_replay")
    old = {"prompts": ["Old", "Old"], "winner_completions": ["a", "a"], "loser_completions": ["", ""]}
    write_shard(folder, 1, [old])
    trainer.train()
    assert not trainer.round_reloaded
    with open(os.path.join(folder, "iteration_0001.json")) as handle:
        assert all(p["prompts"][0].startswith("Row ") for p in json.load(handle)["pairs"])


def test_a_second_train_call_draws_its_rounds_anew(tmp_path):
    trainer = build(tmp_path, rounds=1, pair_batch_size=2)
    trainer.train()
    trainer.train()
    # The log is the second run's: its round was drawn (not served from the first run), its steps follow its pairs.
    assert [e["round/index"] for e in trainer.state.log_history if "round/index" in e] == [1.0]
    assert trainer.state.global_step == -(-int(round_pair_counts(trainer)[0]) // 2)


def test_comparator_fields_are_checked(tmp_path):
    with pytest.raises(ValueError, match="`comparator` must be one of"):
        small_args(tmp_path, MultiAgentIterativeDPOConfig, num_agents=2, comparator="api")
    with pytest.raises(ValueError, match="`comparator='model'` needs `comparator_model`"):
        small_args(tmp_path, MultiAgentIterativeDPOConfig, num_agents=2, comparator="model")
    with pytest.raises(ValueError, match="only valid with `comparator='model'`"):
        small_args(tmp_path, MultiAgentIterativeDPOConfig, num_agents=2, comparator_model="m")
    with pytest.raises(ValueError, match="replay_k"):
        small_args(tmp_path, MultiAgentIterativeDPOConfig, num_agents=2, replay_mode="nearest_k")
    with pytest.raises(ValueError, match="only valid with `comparator='history'`"):
        small_args(tmp_path, MultiAgentIterativeDPOConfig, num_agents=2, comparator_history_k=2)
    with pytest.raises(ValueError, match="`comparator_history_k` must be at least 1"):
        small_args(tmp_path, MultiAgentIterativeDPOConfig, num_agents=2, comparator="history", comparator_history_k=0)
    config = small_args(tmp_path, MultiAgentIterativeDPOConfig, num_agents=2, comparator="history")
    assert config.comparator_history_k == 1


def fingerprint(trainer) -> float:
    return sum(float(p.double().sum()) for p in trainer.policy_parameters())


@pytest.mark.parametrize("k", [1, 2])
def test_the_history_comparator_samples_the_policy_of_k_rounds_back(tmp_path, k):
    """Each round draws the current agents (the round's start, S_r) against the agents at the start of round
    `max(r - k + 1, 0)` (CoMLRL's policy from k iterations ago; 1 is the round's own start), and trains on from its
    own weights: after the draw the agents hold S_r again."""
    trainer = build(tmp_path, rounds=3, comparator="history", comparator_history_k=k)
    sampled, after_draw = recorded_draws(trainer)
    swaps = []
    trainer.weights_changed = lambda: swaps.append(fingerprint(trainer))
    trainer.train()
    # 4 prompts, 2 per generation call: a round samples both batches as the policy, then both as the comparator (one
    # swap of the weights a round).
    assert len(sampled) == 12
    rounds = [sampled[4 * r : 4 * r + 4] for r in range(3)]
    starts = [calls[0] for calls in rounds]
    assert len(set(starts)) == 3  # the agents trained between rounds
    for r, (current, current_again, comparator, comparator_again) in enumerate(rounds):
        assert current == current_again == starts[r]
        assert comparator == comparator_again == starts[max(r - k + 1, 0)]
    assert after_draw == starts  # each round trains on from its own start
    # Weights are swapped in (and back) only for a round whose comparator is an earlier round's start; a round's own
    # start is what the agents hold, and with k=1 no later round reads it, so none is written.
    assert swaps == [x for r in range(1, 3) if k > 1 for x in (starts[max(r - k + 1, 0)], starts[r])]
    replay = os.path.join(trainer.args.output_dir, "preference_replay")
    kept = sorted(name for name in os.listdir(replay) if name.startswith("round_start"))
    assert kept == ([f"round_start_{r + 1:04d}.pt" for r in range(3 - k, 3)] if k > 1 else [])


def recorded_draws(trainer) -> tuple[list[float], list[float]]:
    """Record the agents' `fingerprint` at every `sample` call and right after each round's draw."""
    sampled, after_draw = [], []
    sample, round_pairs_for = trainer.sample, trainer.round_pairs_for

    def recording_sample(rows, num_generations):
        sampled.append(fingerprint(trainer))
        return sample(rows, num_generations)

    def recording_round_pairs_for(epoch):
        drawing = epoch != trainer.round_index
        pairs = round_pairs_for(epoch)
        if drawing:
            after_draw.append(fingerprint(trainer))
        return pairs

    trainer.sample, trainer.round_pairs_for = recording_sample, recording_round_pairs_for
    return sampled, after_draw


@pytest.mark.parametrize("seeds", [(1,), (1, 2)], ids=["one-model", "one-per-agent"])
def test_the_model_comparator_samples_the_given_models(tmp_path, seeds):
    """`comparator="model"`: each round's comparator candidates come from `comparator_model` (its weights in the
    agents for the draw: one model for every agent, or one per agent), and the agents train on from their own."""
    sources = [tiny_model_path(seed=seed) for seed in seeds]
    trainer = build(
        tmp_path, rounds=2, comparator="model", comparator_model=sources[0] if len(seeds) == 1 else sources
    )
    sampled, after_draw = recorded_draws(trainer)
    trainer.train()
    models = [AutoModelForCausalLM.from_pretrained(sources[i % len(sources)]) for i in range(2)]
    theirs = sum(float(p.double().sum()) for model in models for p in model.parameters())
    # Per round: both batches of prompts as the policy, then both as the comparator.
    assert len(sampled) == 8 and [sampled[i] for i in (2, 3, 6, 7)] == [pytest.approx(theirs, abs=1e-6)] * 4
    assert sampled[0] == sampled[1] != sampled[4] == sampled[5]  # the agents' own, trained between the rounds
    assert after_draw == sampled[0::4]


@pytest.mark.parametrize(
    "trainer_cls, config_cls",
    [
        (MultiAgentIterativeDPOTrainer, MultiAgentIterativeDPOConfig),
        (MultiAgentIterativeRLHFTrainer, MultiAgentIterativeRLHFConfig),
    ],
)
def test_a_streamed_dataset_is_refused_at_construction(tmp_path, trainer_cls, config_cls):
    """A round draws over the whole training set and is one of Trainer's epochs: a stream has neither (a run on one
    logged a single round in 6 steps of 1.3 epochs)."""
    stream = Dataset.from_dict({"prompt": [f"Row {i}: say something." for i in range(ROWS)]}).to_iterable_dataset()
    with pytest.raises(ValueError, match=r"a streamed `train_dataset` \(an IterableDataset\) has neither of"):
        trainer_cls(
            model=tiny_model_path(),
            reward_funcs=length_reward,
            args=small_args(tmp_path, config_cls, num_agents=2, max_steps=6),
            train_dataset=stream,
        )


def test_the_model_comparator_is_refused_what_it_cannot_hold(tmp_path):
    with pytest.raises(ValueError, match="is not of agent 0's architecture"):
        build(tmp_path, comparator="model", comparator_model=tiny_model_path("tiny-llama"))
    with pytest.raises(ValueError, match="names 3 models for 2 agents"):
        build(tmp_path, comparator="model", comparator_model=[tiny_model_path()] * 3)
    # Before: the Hub client's "Repo id must be in the form", and "'Qwen2ForCausalLM' object is not iterable".
    with pytest.raises(ValueError, match=r"`comparator_model` '/no/such/model' is not a model id or a folder"):
        build(tmp_path, comparator="model", comparator_model="/no/such/model")
    with pytest.raises(TypeError, match="`comparator_model` takes model ids or folders .* got Qwen2ForCausalLM"):
        small_args(
            tmp_path, MultiAgentIterativeDPOConfig, num_agents=2, comparator="model",
            comparator_model=AutoModelForCausalLM.from_pretrained(tiny_model_path()),
        )  # fmt: skip
    with pytest.raises(NotImplementedError, match="a team of LoRA adapters cannot hold"):
        MultiAgentIterativeDPOTrainer(
            model=tiny_model_path(),
            reward_funcs=length_reward,
            args=small_args(tmp_path, MultiAgentIterativeDPOConfig, num_agents=2, comparator="model",
                            comparator_model=tiny_model_path()),
            train_dataset=Dataset.from_dict({"prompt": ["Row 0: say something."]}),
            peft_config=LoraConfig(r=4, target_modules=["q_proj", "v_proj"]),
        )  # fmt: skip


def test_the_history_comparator_resumes_from_the_round_starts_it_wrote(tmp_path):
    """A run killed inside round 2 and resumed draws round 3 against round 2's start (k = 2) as the uninterrupted run
    did: the round starts are written to `replay_dir` beside the shards, and only the k newest are kept there."""
    settings = dict(rounds=3, comparator="history", comparator_history_k=2, save_strategy="steps", save_steps=2)
    first = build(tmp_path, **settings)
    sampled, _ = recorded_draws(first)
    first.train()
    replay = os.path.join(first.args.output_dir, "preference_replay")
    assert sorted(n for n in os.listdir(replay) if n.startswith("round_start")) == [
        "round_start_0002.pt",
        "round_start_0003.pt",
    ]
    resumed = build(tmp_path, **settings)
    resumed_sampled, _ = recorded_draws(resumed)
    resumed.train(resume_from_checkpoint=os.path.join(first.args.output_dir, "checkpoint-6"))  # inside round 2
    assert resumed.state.global_step == 12
    # Round 2 came back from its shard; round 3 drew both batches as the policy, then both as the comparator: round
    # 2's start.
    assert len(resumed_sampled) == 4 and resumed_sampled[2] == resumed_sampled[3] == sampled[4]
    os.remove(os.path.join(replay, "round_start_0002.pt"))
    again = build(tmp_path, **settings)
    with pytest.raises(FileNotFoundError, match="start of round 2"):
        again.train(resume_from_checkpoint=os.path.join(first.args.output_dir, "checkpoint-6"))


def served_pairs(trainer) -> list[tuple[int, int]]:
    """Record `(step, the pair's index in its round)` of every pair a training batch is built from."""
    served, token_ids = [], trainer.record_token_ids

    def recording_token_ids(record):
        served.append((trainer.state.global_step, trainer.round_pairs.index(record)))
        return token_ids(record)

    trainer.record_token_ids = recording_token_ids
    return served


def test_a_run_resumed_inside_a_round_goes_on_with_the_pairs_not_reached(tmp_path):
    """Round 2 serves its 8 pairs in 2 generation batches of 4 (steps 5-6, then 7-8). Resumed from checkpoint-6, after
    the first batch, the run trains steps 7-8 on pairs 4-7, as the run that stopped would have; before, the round's
    cursor started over, training pairs 0-3 twice and never 4-7."""
    first = build(tmp_path, rounds=2, save_strategy="steps", save_steps=2)
    uninterrupted = served_pairs(first)
    first.train()
    resumed = build(tmp_path, rounds=2, save_strategy="steps", save_steps=2)
    again = served_pairs(resumed)
    resumed.train(resume_from_checkpoint=os.path.join(first.args.output_dir, "checkpoint-6"))
    assert resumed.round_reloaded and resumed.round_pairs == first.round_pairs and len(first.round_pairs) == 8
    assert [i for step, i in uninterrupted if step == 4] == [0, 1, 2, 3]
    assert [i for step, i in again] == [i for step, i in uninterrupted if step == 6] == [4, 5, 6, 7]


def test_a_round_drawn_after_a_resume_serves_its_pairs_from_the_first(tmp_path):
    """Resumed from checkpoint-1, inside round 1's first generation batch, the run's generation batches fall a step
    later than the stopped run's (TRL starts its batch count over), so round 2's first batch is built a step into the
    round. Round 2 is drawn by this run: it serves its pairs from the first (before, from the fifth)."""
    first = build(tmp_path, rounds=2, save_strategy="steps", save_steps=1)
    first.train()
    resumed = build(tmp_path, rounds=2, save_strategy="steps", save_steps=1)
    served = served_pairs(resumed)
    resumed.train(resume_from_checkpoint=os.path.join(first.args.output_dir, "checkpoint-1"))
    assert not resumed.round_reloaded and resumed.round_index == 1  # round 2 was drawn, not reloaded
    round_2 = [i for step, i in served if step >= 4]
    assert round_2[:4] == [0, 1, 2, 3]


REPLAY_RULES = [
    (dict(replay_mode="all_history", replay_k=2), "`replay_k` is only valid with `replay_mode='nearest_k'`"),
    (dict(replay_mode="current", replay_k=3), "`replay_k` must be None or 1"),
    (dict(replay_mode="nearest_k", replay_k=0), "`replay_k` must be at least 1"),
    (dict(replay_lambda=0.5), "`replay_lambda` is only valid with `replay_mode='lambda_decay'`"),
    (dict(replay_mode="lambda_decay", replay_lambda=1.5), r"`replay_lambda` must be in \[0, 1\]"),
    (dict(replay_mode="current", replay_sample_size=4), "`replay_sample_size` is only valid with `replay_mode`"),
    (dict(replay_mode="all_history", replay_sample_size=0), "`replay_sample_size` must be at least 1"),
    (dict(replay_mode="sometimes"), "`replay_mode` must be one of"),
]


@pytest.mark.parametrize("config_class", [MultiAgentIterativeDPOConfig, MultiAgentIterativeRLHFConfig])
@pytest.mark.parametrize(("fields", "match"), REPLAY_RULES, ids=[str(i) for i in range(len(REPLAY_RULES))])
def test_replay_fields_out_of_their_mode_raise_naming_the_field(tmp_path, config_class, fields, match):
    with pytest.raises(ValueError, match=match):
        small_args(tmp_path, config_class, num_agents=2, **fields)


def test_replay_fields_are_normalised_and_a_file_is_no_replay_dir(tmp_path):
    config = small_args(tmp_path, MultiAgentIterativeDPOConfig, num_agents=2, replay_mode="Last_K", replay_k=2.0)
    assert (config.replay_mode, config.replay_k, type(config.replay_k)) == ("nearest_k", 2, int)
    (tmp_path / "shards").write_text("not a folder")
    with pytest.raises(ValueError, match="`replay_dir=.*` is a file"):
        small_args(tmp_path, MultiAgentIterativeRLHFConfig, num_agents=2, replay_dir=str(tmp_path / "shards"))


# ---------------------------------------------------------------- iterative RLHF


def build_rlhf(tmp_path, rounds=2, callbacks=None, **overrides):
    settings = dict(
        num_agents=2,
        num_train_epochs=rounds,
        max_steps=-1,
        per_device_train_batch_size=4,
        steps_per_generation=2,
        preference_num_candidates=3,
        preference_pairs_per_sample=2,
        reward_learning_rate=1e-3,
        lr_scheduler_type="linear",
    )
    settings.update(overrides)
    args = small_args(tmp_path, MultiAgentIterativeRLHFConfig, **settings)
    return MultiAgentIterativeRLHFTrainer(
        model=tiny_model_path(),
        reward_funcs=length_reward,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": [f"Row {i}: say something." for i in range(ROWS)]}),
        callbacks=callbacks,
    )


def test_rlhf_rounds_train_the_reward_model_then_the_team_in_one_run(tmp_path):
    recorder = StepRecorder()
    trainer = build_rlhf(tmp_path, rounds=2, callbacks=[recorder])
    heads = []

    class Heads(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            heads.append(trainer.reward_model.reward_head.weight.detach().clone())

    trainer.add_callback(Heads())
    trainer.train()
    # 4 steps a round (as iterative MADPO's), 8 over the run, on one linear schedule.
    assert trainer.state.global_step == 8
    assert recorder.steps == list(range(1, 9))
    lr0 = trainer.args.learning_rate
    assert recorder.lrs == pytest.approx([lr0 * (1 - s / 8) for s in range(1, 9)], rel=1e-6)
    # The reward model was trained once per round: fixed inside a round, changed between rounds.
    assert len(trainer.reward_model_histories) == 2
    assert all(torch.equal(heads[0], h) for h in heads[1:4]) and all(torch.equal(heads[4], h) for h in heads[5:])
    assert not torch.equal(heads[3], heads[4])
    rounds = [e for e in trainer.state.log_history if "round/index" in e]
    assert [e["round/index"] for e in rounds] == [1.0, 2.0]
    assert all(e["reward_model/pairs"] == e["round/train_pairs"] for e in rounds)
    # The online reward is the reward model's raw score.
    logged = [h for h in trainer.state.log_history if "rewards/joint_reward_model/mean" in h]
    assert logged and all(h["reward"] == pytest.approx(h["rewards/joint_reward_model/mean"]) for h in logged)
    shards = sorted(os.listdir(os.path.join(trainer.args.output_dir, "preference_replay")))
    assert shards == ["iteration_0001.json", "iteration_0002.json"]


def test_rlhf_resume_inside_a_round_restores_its_reward_model(tmp_path):
    trainer = build_rlhf(tmp_path, rounds=2, save_strategy="steps", save_steps=2)
    trainer.train()
    checkpoint = os.path.join(trainer.args.output_dir, "checkpoint-6")  # in the middle of round 2
    saved = JointRewardModel.from_pretrained(os.path.join(checkpoint, "reward_model")).state_dict()
    recorder = StepRecorder()
    torch.manual_seed(7)
    resumed = build_rlhf(tmp_path, rounds=2, callbacks=[recorder], save_strategy="steps", save_steps=2)
    resumed.train(resume_from_checkpoint=checkpoint)
    assert recorder.steps == [7, 8]
    assert resumed.round_index == 1 and resumed.reward_model_histories == []  # restored, not trained again
    for key, value in resumed.reward_model.state_dict().items():
        torch.testing.assert_close(value, saved[key], msg=key)


def test_rlhf_reward_model_reset_starts_each_round_from_the_initial_weights(tmp_path):
    trainer = build_rlhf(tmp_path, rounds=2, reward_model_reset=True)
    start = {k: v.clone() for k, v in trainer.initial_reward_state.items()}
    trainer.train()
    assert len(trainer.reward_model_histories) == 2
    assert all(torch.equal(trainer.initial_reward_state[k], v) for k, v in start.items())


def test_rlhf_bad_input_is_refused(tmp_path):
    with pytest.raises(TypeError, match="MultiAgentIterativeRLHFConfig"):
        MultiAgentIterativeRLHFTrainer(
            model=tiny_model_path(),
            reward_funcs=length_reward,
            args=small_args(tmp_path, MultiAgentIterativeDPOConfig, num_agents=2),
        )
    with pytest.raises(ValueError, match="replay_k"):
        small_args(tmp_path, MultiAgentIterativeRLHFConfig, num_agents=2, replay_mode="nearest_k")
