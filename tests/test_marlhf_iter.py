"""Iterative MARLHF (`multiagent_trl.comlrl.marlhf_iter`): a CoMLRL MARLHFIter script with only its imports changed
(shards, the reward model retrained every iteration, online training on its scores, evaluation on the task reward,
`preference_scoring_reward="reward_model"`), the reward model restarting from its initial weights while the online
run (optimizer, steps) continues, and the config's fields and checks against CoMLRL 1.4.3's."""

from __future__ import annotations

import dataclasses
import json
import os
import re

import pytest
import torch
from datasets import Dataset
from transformers import TrainerCallback
from trl import TrlParser

from multiagent_trl import JointRewardModel, MADPOIterConfig, MARLHFConfig, MARLHFIterConfig, MARLHFIterTrainer
from multiagent_trl.preference.iterative_rlhf import record_pair
from multiagent_trl.preference.losses import bradley_terry_loss
from multiagent_trl.preference.reward_model import REWARD_HEAD_FILE
from multiagent_trl.testing import tiny_model_path

from .conftest import changed, snapshot
from .parity import assert_same_forward
from .test_actor_critic import run_script


@pytest.fixture(scope="module")
def theirs():
    pytest.importorskip("comlrl", reason="the parity tests need comlrl==1.4.3 (pip install -e '.[dev]')")
    from comlrl.trainers.preference import iterative

    return iterative


def length_reward(completions1, completions2):
    return [min(len(b) / max(len(a), 1), 2.0) for a, b in zip(completions1, completions2)]


def shard(folder, it: int) -> dict:
    return json.loads((folder / f"iteration_{it:04d}.json").read_text())


def rm_scores(model: JointRewardModel, records: list[dict], side: str) -> list[float]:
    """`model`'s scores of the records' winning (`side="winner"`) or losing joint samples."""
    with torch.no_grad():
        return model(
            prompts=[tuple(r["prompts"]) for r in records],
            completions=[tuple(r[f"{side}_completions"]) for r in records],
        )


# ---- 1. a CoMLRL MARLHFIter script with only its imports changed

MARLHF_ITER_SCRIPT = """
from datasets import Dataset
from comlrl.trainers.preference import MARLHFIterConfig, MARLHFIterTrainer
from comlrl.utils.reward_processor import RewardProcessors


def length_reward(completions1, completions2):
    return [min(len(b) / max(len(a), 1), 2.0) for a, b in zip(completions1, completions2)]


def main(model_path, output_dir):
    dataset = Dataset.from_dict({"prompt": ["Write a title:", "Name a planet:", "Pick a word:", "Say hi:"]})
    config = MARLHFIterConfig(
        num_iterations=2, num_agents=2, num_train_epochs=1, agent_learning_rate=1e-3, max_new_tokens=6,
        num_generations=2, preference_num_candidates=4, preference_pairs_per_sample=2,
        pair_selection="comparator_reward", preference_scoring_reward="reward_model",
        reward_learning_rate=1e-3, reward_num_train_epochs=2, reward_train_batch_size=4,
        rollout_buffer_size=2, eval_interval=0, logging_steps=1,
        preference_replay_dir=output_dir + "/replay", policy_checkpoint_dir=output_dir + "/policies",
    )
    trainer = MARLHFIterTrainer(
        agent_model=model_path,
        num_agents=2,
        reward_func=length_reward,
        reward_processor=RewardProcessors.scale(2.0),
        formatters=[lambda item: item["prompt"], lambda item: "Expand: " + item["prompt"]],
        args=config,
        train_dataset=dataset,
        eval_dataset=dataset,
    )
    trainer.verbose = False
    trainer.train()
    trainer.save_model(output_dir + "/final")
    return trainer
"""

OURS_MARLHF_ITER = {
    "from comlrl.trainers.preference import MARLHFIterConfig, MARLHFIterTrainer": (
        "from multiagent_trl import MARLHFIterConfig, MARLHFIterTrainer"
    ),
    "from comlrl.utils.reward_processor import RewardProcessors": "from multiagent_trl import RewardProcessors",
}


@pytest.fixture(scope="module")
def script_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("marlhf_iter")
    cwd = os.getcwd()
    os.chdir(out)  # the script keeps CoMLRL's default output_dir under the working directory
    try:
        torch.manual_seed(0)
        trainer = run_script(MARLHF_ITER_SCRIPT, OURS_MARLHF_ITER, tiny_model_path(), str(out))
    finally:
        os.chdir(cwd)
    return trainer, out


def test_marlhf_iter_script_writes_shards_and_trains_each_iteration(script_run):
    trainer, out = script_run
    counts = []
    for it in (1, 2):
        data = shard(out / "replay", it)
        assert data["iteration"] == it and data["num_pairs"] == len(data["pairs"]) > 0
        for record in data["pairs"]:
            assert record["prompts"][1] == "Expand: " + record["prompts"][0]
            assert record["winner_reward"] > record["loser_reward"]
        counts.append(data["num_pairs"])
    assert all(0 < c <= 4 * 2 for c in counts)  # 4 items, at most 2 pairs each
    iterations = [log for log in trainer.state.log_history if "iter/current_iteration" in log]
    assert [log["iter/current_iteration"] for log in iterations] == [1.0, 2.0]
    assert [log["iter/train_preference_pairs"] for log in iterations] == counts  # replay "current"
    assert [log["reward_model/pairs"] for log in iterations] == counts
    # The reward model trained each iteration: 2 epochs of ceil(pairs / 4) steps.
    assert [len(h) for h in trainer.reward_model_histories] == [2 * -(-c // 4) for c in counts]
    # An iteration's entries ride on its first training log (the native rounds'), beside `round/...`: one run.
    assert [log["step"] for log in iterations] == [1, 3]
    assert [log["round/index"] for log in iterations] == [1.0, 2.0]
    assert [log["iter/total_preference_pairs"] for log in iterations] == [counts[0], counts[0] + counts[1]]
    # Online: 4 items, 2 per generation batch, one step each, one epoch per iteration; one run of 4 steps.
    assert trainer.state.global_step == 4 and trainer.state.epoch == 2.0
    steps = [log["step"] for log in trainer.state.log_history if "loss" in log]
    assert steps == [1, 2, 3, 4]
    initial = snapshot(MARLHFIterTrainer(agent_model=tiny_model_path(), reward_func=length_reward).model)
    moved = changed(initial, trainer.model)
    assert any(n.startswith("agents.0.") for n in moved) and any(n.startswith("agents.1.") for n in moved)
    for name in ("initial", "iteration_0000", "iteration_0001"):
        assert (out / "policies" / name / "agent_1" / "config.json").is_file()
    assert (out / "policies" / "iteration_0000" / "reward_model" / REWARD_HEAD_FILE).is_file()
    assert (out / "final" / "reward_model" / REWARD_HEAD_FILE).is_file()
    assert not (out / "preference_replay").exists()  # preference_replay_dir was given


def test_online_training_uses_the_reward_model_and_evaluation_the_task(script_run):
    trainer, _ = script_run
    logged = [h for h in trainer.state.log_history if "reward" in h]
    assert len(logged) == 4 and all(h["reward"] == pytest.approx(h["rewards/joint_reward_model/mean"]) for h in logged)
    assert all("rewards/length_reward/mean" not in h for h in trainer.state.log_history)
    # No pair-sampling metrics in the logs: iteration 1's pairs were scored by the task reward, absent above.
    # The last batch's training rewards: the last reward model's raw scores.
    table = trainer._logs
    completions = list(zip(table["extra"]["agent_0/completion"], table["extra"]["agent_1/completion"]))
    prompts = [(p, "Expand: " + p) for p in table["prompt"]]
    with torch.no_grad():
        scores = trainer.reward_model(prompts=prompts, completions=completions)
    assert_same_forward(list(table["rewards"]["joint_reward_model"]), scores, msg="training rewards")
    metrics = trainer.evaluate()
    assert "eval_rewards/length_reward/mean" in metrics and "eval_rewards/joint_reward_model/mean" not in metrics
    assert metrics["eval_turn_1/reward_mean"] == pytest.approx(2.0 * metrics["eval_rewards/length_reward/mean"])


def test_reward_model_scoring_ranks_iteration_two_by_the_previous_reward_model(script_run):
    _, out = script_run
    # Iteration 1: no reward model yet, the task reward (x2 by the processor; raw without it).
    for record in shard(out / "replay", 1)["pairs"]:
        assert record["winner_reward"] == pytest.approx(
            2.0 * length_reward(*[[c] for c in record["winner_completions"]])[0]
        )
        assert record["raw_rewards"][0] == pytest.approx(record["winner_reward"] / 2.0)
    # Iteration 2: the reward model trained in iteration 1 (saved with the iteration's policy checkpoint), raw.
    previous = JointRewardModel.from_pretrained(str(out / "policies" / "iteration_0000" / "reward_model"))
    records = shard(out / "replay", 2)["pairs"]
    winners, losers = rm_scores(previous, records, "winner"), rm_scores(previous, records, "loser")
    assert_same_forward([r["winner_reward"] for r in records], winners, msg="winners")
    assert_same_forward([r["loser_reward"] for r in records], losers, msg="losers")
    flat = [value for r in records for value in r["raw_rewards"]]  # [winner, loser] raw = processed
    assert_same_forward(flat, [value for pair in zip(winners, losers) for value in pair], msg="raw rewards")


# ---- 2. the reward model restarts each iteration; the online run continues


def test_reward_model_restarts_from_its_initial_weights_and_the_online_run_continues(tmp_path):
    torch.manual_seed(1)
    config = MARLHFIterConfig(
        output_dir=str(tmp_path), report_to="none", num_iterations=2, num_train_epochs=1, max_new_tokens=4,
        num_generations=2, preference_num_candidates=4, preference_pairs_per_sample=2, rollout_buffer_size=2,
        reward_learning_rate=1e-2, reward_num_train_epochs=1, reward_train_batch_size=64, reward_freeze_backbone=True,
        eval_interval=0, logging_steps=1, policy_checkpoint_dir=str(tmp_path / "policies"),
        preference_replay_mode="all_history",
    )  # fmt: skip
    trainer = MARLHFIterTrainer(
        agent_model=tiny_model_path(),
        reward_func=length_reward,
        args=config,
        train_dataset=Dataset.from_dict({"prompt": ["Write a title:", "Name a planet:"]}),
    )
    initial = {k: v.clone() for k, v in trainer.reward_model.state_dict().items()}
    trainer.train()
    # Iteration 2's pairs: the task reward, raw (no processor).
    records = json.loads((tmp_path / "preference_replay" / "iteration_0002.json").read_text())["pairs"]
    assert [r["winner_reward"] for r in records] == pytest.approx(
        [length_reward(*[[c] for c in r["winner_completions"]])[0] for r in records]
    )
    # Iteration 2's first reward-model step (one batch of every training pair, loss measured before the update) saw
    # the initial reward model, not iteration 1's.
    reference = JointRewardModel.from_pretrained(str(tmp_path / "policies" / "iteration_0000" / "reward_model"))
    first_iteration = {k: v.clone() for k, v in reference.state_dict().items()}
    # all_history: iteration 2 trains on as many pairs as it drew, sampled from both shards (read back from JSON).
    pairs = trainer.preference_pairs
    shards = [json.loads((tmp_path / "preference_replay" / f"iteration_{i:04d}.json").read_text()) for i in (1, 2)]
    assert len(pairs) == len(records) and {p.texts() for p in pairs} <= {
        record_pair(r).texts() for data in shards for r in data["pairs"]
    }

    def loss_under(state) -> float:
        reference.load_state_dict(state)
        reference.eval()
        with torch.no_grad():
            scores = [reference.score(list(texts)) for texts in zip(*(p.texts() for p in pairs))]  # (chosen, rejected)
            return bradley_terry_loss(*scores).item()

    assert_same_forward(trainer.reward_model_histories[1][0]["loss"], loss_under(initial), msg="loss")
    assert loss_under(first_iteration) != pytest.approx(trainer.reward_model_histories[1][0]["loss"], abs=1e-4)
    # Frozen backbone: only the head ever moved.
    final = trainer.reward_model.state_dict()
    assert {k for k in initial if not torch.equal(initial[k], final[k])} == {"reward_head.weight", "reward_head.bias"}
    # The online phases are one run: 2 steps, and the agents' AdamW counted both.
    assert trainer.state.global_step == 2
    moments = [state["step"] for state in trainer.optimizer.state.values() if "step" in state]
    assert moments and all(float(step) == 2.0 for step in moments)


def test_iterations_are_one_trainer_run_of_native_rounds(tmp_path):
    events = []

    class Events(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            events.append("begin")

        def on_step_end(self, args, state, control, **kwargs):
            events.append(state.global_step)

    def ranged_reward(completions1, completions2):  # separates nearly any two texts: a round of ties would raise
        return [float(sum(map(ord, a + b)) % 97) for a, b in zip(completions1, completions2)]

    ranged_reward.reward_range = (0.0, 100.0)
    config = MARLHFIterConfig(
        output_dir=str(tmp_path), report_to="none", num_iterations=2, num_train_epochs=2, max_new_tokens=4,
        num_generations=2, preference_num_candidates=3, preference_pairs_per_sample=2, rollout_buffer_size=2,
        comparator_num_candidates=2, preference_replay_mode="nearest_k", preference_replay_k=1,
        reward_freeze_backbone=True, eval_interval=0, logging_steps=1, log_reward_distribution=True,
    )  # fmt: skip
    native = config.native_config()
    assert (native.num_train_epochs, native.epochs_per_round, native.num_iterations) == (4, 2, 1)
    assert (native.replay_mode, native.replay_k, native.comparator_num_generations) == ("nearest_k", 1, 2)
    assert native.reward_model_reset and native.pair_scoring == "task" and config.num_train_epochs == 2
    trainer = MARLHFIterTrainer(
        agent_model=tiny_model_path(),
        reward_func=ranged_reward,
        args=config,
        train_dataset=Dataset.from_dict({"prompt": ["Write a title:", "Name a planet:"]}),
        callbacks=[Events()],
    )
    assert trainer.comlrl_args is config and trainer.args.epochs_per_round == 2
    trainer.train()
    # One Trainer.train: one on_train_begin, then the steps of both iterations (2 epochs of 1 step each).
    assert events == ["begin", 1, 2, 3, 4]
    assert len(trainer.reward_model_histories) == 2
    iterations = [log for log in trainer.state.log_history if "iter/current_iteration" in log]
    assert [(log["iter/current_iteration"], log["step"]) for log in iterations] == [(1.0, 1), (2.0, 3)]
    # log_reward_distribution: every candidate of the draw (2 items x K=3, x K'=2), as CoMLRL counts them.
    for log in iterations:
        assert (
            log["iter/reward_distribution/target_sample_count"] == 6.0 and log["iter/reward_distribution/target_mean"]
        )
        assert log["iter/reward_distribution/comparator_sample_count"] == 4.0
        assert log["iter/selected_reward_distribution/pair_count"] == log["iter/train_preference_pairs"]


# ---- 3. the config: CoMLRL's fields, defaults and checks


def test_every_comlrl_field_is_accepted_with_its_default(theirs):
    fields = [(f.name, f.default) for f in dataclasses.fields(theirs.MARLHFIterConfig)]
    assert len(fields) == 79
    ours = {f.name: f.default for f in dataclasses.fields(MARLHFIterConfig)}
    for name, default in fields:
        assert name in ours, name
        assert ours[name] == default, name
    config = MARLHFIterConfig(report_to="none")
    assert (config.num_iterations, config.num_train_epochs, config.reward_num_train_epochs) == (6, 2, 2)
    assert (config.preference_num_candidates, config.preference_pairs_per_sample) == (20, 4)
    assert (config.pair_selection, config.preference_scoring_reward) == ("comparator_reward", "task")
    assert MARLHFIterConfig(preference_scoring_reward="Learned", report_to="none").preference_scoring_reward == (
        "reward_model"
    )


@pytest.mark.parametrize(
    "fields, error, message",
    [
        (dict(preference_scoring_reward="human"), ValueError, "preference_scoring_reward"),
        (dict(pair_selection="best"), ValueError, "pair_selection"),
        (dict(pair_selection="all"), ValueError, "preference_pairs_per_sample=None"),
        (dict(preference_replay_mode="nearest_k"), ValueError, "needs `preference_replay_k`"),
        (dict(preference_replay_sample_size=4), ValueError, "only valid with"),
        (dict(num_iterations=0), ValueError, "num_iterations"),
        (dict(reward_num_train_epochs=0), ValueError, "reward_num_train_epochs"),
        (dict(num_generations=1), ValueError, "num_generations"),
        (dict(comparator_policy="api", comparator_api_url="http://localhost:1"), NotImplementedError, "no network"),
        (dict(rl_algorithm="iac"), NotImplementedError, "rl_algorithm='iac'"),
        (dict(num_train_epochs=1.5), ValueError, "whole number"),
        (dict(max_steps=3), ValueError, "max_steps"),
    ],
)
def test_bad_configs_raise_naming_the_field(theirs, fields, error, message):
    ours_only = {"num_train_epochs", "max_steps"}  # CoMLRL's int epochs and no max_steps
    if error is ValueError and not ours_only & set(fields):
        with pytest.raises(ValueError):  # CoMLRL refuses them too
            theirs.MARLHFIterConfig(**fields)
    with pytest.raises(error, match=message):
        MARLHFIterConfig(**fields, report_to="none")


@pytest.mark.parametrize("config_class", [MARLHFIterConfig, MADPOIterConfig])
def test_the_iterative_configs_parse_from_the_command_line(config_class):
    line = ["--num_iterations", "3", "--preference_replay_mode", "last_k", "--preference_replay_k", "2"]
    (config,) = TrlParser(config_class).parse_args_and_config([*line, "--report_to", "none"])
    assert (config.num_iterations, config.preference_replay_mode, config.preference_replay_k) == (3, "nearest_k", 2)


def test_the_trainer_refuses_other_configs_and_iteration_checkpoints(tmp_path):
    with pytest.raises(TypeError, match="MARLHFIterConfig"):
        MARLHFIterTrainer(
            agent_model=tiny_model_path(), reward_func=length_reward, args=MARLHFConfig(report_to="none")
        )
    trainer = MARLHFIterTrainer(
        agent_model=tiny_model_path(),
        reward_func=length_reward,
        args=MARLHFIterConfig(output_dir=str(tmp_path), report_to="none"),
        train_dataset=Dataset.from_dict({"prompt": ["Hi"]}),
    )
    with pytest.raises(NotImplementedError, match="policy_checkpoint_dir"):
        trainer.train(checkpoint_dir=str(tmp_path / "ckpt"))
    with pytest.raises(NotImplementedError, match="policy_checkpoint_dir"):
        trainer.load_checkpoint(str(tmp_path / "ckpt"))
    args = MARLHFIterConfig(output_dir=str(tmp_path), log_reward_distribution=True, report_to="none")
    with pytest.raises(ValueError, match="reward_range"):
        MARLHFIterTrainer(agent_model=tiny_model_path(), reward_func=length_reward, args=args)


@pytest.mark.parametrize(
    "trainer_name, config",
    [("MARLHFIterTrainer", MARLHFConfig(report_to="none")), ("MADPOIterTrainer", MARLHFIterConfig(report_to="none"))],
)
def test_a_config_of_another_family_raises_naming_both(trainer_name, config):
    import multiagent_trl

    trainer_cls = getattr(multiagent_trl, trainer_name)
    expected = f"`args` is a {type(config).__name__}; {trainer_name} needs a {trainer_cls.default_config_cls.__name__}"
    with pytest.raises(TypeError, match=re.escape(expected)):
        trainer_cls(agent_model=tiny_model_path(), args=config)
    with pytest.raises(TypeError, match=re.escape(expected)):  # CoMLRL's 15th positional argument
        trainer_cls(tiny_model_path(), *[None] * 13, config)
