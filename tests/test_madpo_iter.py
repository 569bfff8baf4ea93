"""Iterative MADPO (`multiagent_trl.comlrl.iterative`, `multiagent_trl.preference.replay`): the comparator pairs and
the replay sampling against CoMLRL 1.4.3's own functions, a CoMLRL MADPOIter script with only its imports changed,
and the config's fields and checks."""

from __future__ import annotations

import dataclasses
import json
import random
from types import SimpleNamespace

import pytest
from datasets import Dataset
from transformers import AutoModelForCausalLM, TrainerCallback

from multiagent_trl import MADPOIterConfig, MADPOIterTrainer, MARLHFIterConfig
from multiagent_trl.preference.replay import (
    ReplayShard,
    comparison_pairs,
    lambda_decay_weights,
    replay_sample_size,
    replay_selection,
    sample_replay,
    write_shard,
)
from multiagent_trl.testing import tiny_model_path

from .conftest import changed, snapshot
from .test_actor_critic import run_script


@pytest.fixture(scope="module")
def theirs():
    pytest.importorskip("comlrl", reason="the parity tests need comlrl==1.4.3 (pip install -e '.[dev]')")
    from comlrl.trainers.preference import iterative

    return iterative


# ---- 1. comparator pairs: CoMLRL's `_select_policy_comparison_pairs` on fixed rewards

REWARDS = [
    ([1.0, 0.0, 2.0, 0.5], [0.0, 1.0, 2.0, 0.25]),
    ([0.0, 0.0, 0.0], [1.0, 3.0, 2.0, 5.0]),  # K' > K: index-aligned over min(K, K')
    ([3.0, 1.0, 2.0, 0.0, 1.5], [1.0, 1.0, 0.0, 2.0, 0.5]),
    ([1.0, 1.0], [1.0, 1.0]),  # ties: no pair
]


@pytest.mark.parametrize("selection", ["comparator_reward", "reward_gap", "random", "all"])
@pytest.mark.parametrize("limit", [None, 1, 2])
@pytest.mark.parametrize("rewards", REWARDS)
def test_comparison_pairs_match_comlrl(theirs, selection, limit, rewards):
    if selection == "all" and limit is not None:
        pytest.skip("CoMLRL's config requires no limit with 'all'")
    current, comparator = rewards
    host = SimpleNamespace(args=SimpleNamespace(pair_selection=selection, preference_pairs_per_sample=limit))
    random.seed(7)
    expected = theirs.MADPOIterTrainer._select_policy_comparison_pairs(host, current, comparator)
    random.seed(7)
    assert comparison_pairs(current, comparator, selection, limit) == expected


# ---- 2. replay: CoMLRL's shard sampling and lambda weights on fixed shards


def make_shards(tmp_path, sizes):
    """Shards of `sizes` records each (0: an empty shard, written but not kept), records tagged by shard and index."""
    shards = []
    for it, size in enumerate(sizes, start=1):
        records = [{"prompts": [f"s{it}-{k}"], "winner_reward": float(k)} for k in range(size)]
        shard = write_shard(str(tmp_path), it, records)
        assert (tmp_path / f"iteration_{it:04d}.json").is_file()
        if shard is not None:
            shards.append(shard)
    return shards


@pytest.mark.parametrize("replay_lambda", [0.0, 0.3, 0.8, 1.0])
@pytest.mark.parametrize("count", [1, 2, 5])
def test_lambda_weights_match_comlrl(theirs, replay_lambda, count):
    host = SimpleNamespace(args=SimpleNamespace(preference_replay_lambda=replay_lambda))
    expected = theirs.MADPOIterTrainer._lambda_decay_weights(host, count)
    assert lambda_decay_weights(count, replay_lambda) == pytest.approx(expected, abs=0, rel=0)


@pytest.mark.parametrize(
    "mode, k, replay_lambda, sample_size",
    [
        ("current", None, None, None),
        ("nearest_k", 2, None, None),
        ("nearest_k", 1, None, 9),  # more than the shard holds: whole shuffled copies
        ("all_history", None, None, 7),
        ("lambda_decay", None, 0.5, 12),
        ("lambda_decay", None, 1.0, None),
    ],
)
def test_replay_selection_matches_comlrl(theirs, tmp_path, mode, k, replay_lambda, sample_size):
    shards = make_shards(tmp_path, [3, 0, 5, 4])
    assert [s.iteration for s in shards] == [1, 3, 4]
    current = [{"prompts": ["s4-0"]}] * 4
    host = SimpleNamespace(
        args=SimpleNamespace(preference_replay_lambda=replay_lambda, preference_replay_sample_size=sample_size),
        _load_replay_records=theirs.MADPOIterTrainer._load_replay_records,
        _sample_replay_records=theirs.MADPOIterTrainer._sample_replay_records,
        _preference_pair_from_record=lambda record: record,  # records stay records
    )
    their_shards = [theirs.PreferenceReplayShard(s.iteration, s.path, s.num_pairs) for s in shards]
    trainer_cls = theirs.MADPOIterTrainer
    size = trainer_cls._replay_sample_size(host, len(current), their_shards)
    assert replay_sample_size(len(current), shards, sample_size) == size
    random.seed(3)
    if mode == "current":
        expected = list(current)
    else:
        chosen = their_shards[-k:] if mode == "nearest_k" else their_shards
        weights = trainer_cls._lambda_decay_weights(host, len(chosen)) if mode == "lambda_decay" else None
        expected = trainer_cls._sample_replay_preferences(host, chosen, size, weights=weights)
    random.seed(3)
    ours = replay_selection(mode, current, shards, k, replay_lambda, sample_size)
    assert ours == expected and len(ours) == (4 if mode == "current" else size)


def test_sample_replay_skips_empty_shards(tmp_path):
    empty = ReplayShard(9, str(tmp_path / "none.json"), 0)
    assert sample_replay([empty], 3) == [] and sample_replay(make_shards(tmp_path, [2]), 0) == []


# ---- 3. a CoMLRL MADPOIter script with only its imports changed

MADPO_ITER_SCRIPT = """
from datasets import Dataset
from comlrl.trainers.preference import MADPOIterConfig, MADPOIterTrainer


def length_reward(completions1, completions2):
    return [min(len(b) / max(len(a), 1), 2.0) for a, b in zip(completions1, completions2)]


length_reward.reward_range = (0.0, 2.0)


def main(model_path, output_dir):
    dataset = Dataset.from_dict({"prompt": ["Write a title:", "Name a planet:", "Pick a word:", "Say hi:"]})
    config = MADPOIterConfig(
        num_iterations=2, num_agents=2, agent_learning_rate=1e-4, max_new_tokens=6,
        preference_num_candidates=4, preference_pairs_per_sample=2, pair_selection="comparator_reward",
        preference_replay_mode="lambda_decay", preference_replay_lambda=0.8, dpo_beta=0.1,
        rollout_buffer_size=2, train_batch_size=2, eval_interval=0, logging_steps=1,
        comparator_policy="current", policy_checkpoint_dir=output_dir + "/policies", log_reward_distribution=True,
    )
    config.output_dir = output_dir
    trainer = MADPOIterTrainer(
        agent_model=model_path,
        num_agents=2,
        reward_func=length_reward,
        formatters=[lambda item: item["prompt"], lambda item: "Expand: " + item["prompt"]],
        args=config,
        train_dataset=dataset,
    )
    trainer.verbose = False
    trainer.train()
    trainer.save_model(output_dir + "/final")
    return trainer
"""

OURS_MADPO_ITER = {
    "from comlrl.trainers.preference import MADPOIterConfig, MADPOIterTrainer": (
        "from multiagent_trl import MADPOIterConfig, MADPOIterTrainer"
    ),
}


def test_madpo_iter_script_runs_with_only_its_imports_changed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing may land in the working directory
    out = tmp_path / "out"
    start = snapshot(MADPOIterTrainer(agent_model=tiny_model_path(), reward_func=lambda a, b: [0.0] * len(a)).model)
    random.seed(0)
    trainer = run_script(MADPO_ITER_SCRIPT, OURS_MADPO_ITER, tiny_model_path(), str(out))
    for it in (1, 2):
        shard = json.loads((out / "preference_replay" / f"iteration_{it:04d}.json").read_text())
        assert shard["iteration"] == it and shard["num_pairs"] == len(shard["pairs"]) > 0
        record = shard["pairs"][0]
        assert len(record["prompts"]) == 2 and record["winner_reward"] > record["loser_reward"]
        assert record["prompts"][1].startswith("Expand: ")
        assert set(record["token_ids"]) == {"prompt", "winner", "loser"}
    iterations = [log for log in trainer.state.log_history if "iter/current_iteration" in log]
    assert [log["iter/current_iteration"] for log in iterations] == [1.0, 2.0]
    # 4 items of 4 current and 4 comparator candidates per iteration.
    assert iterations[0]["iter/reward_distribution/target_sample_count"] == 16
    assert iterations[0]["iter/reward_distribution/comparator_sample_count"] == 16
    assert 0.0 <= iterations[1]["iter/selected_reward_distribution/target_mean"] <= 2.0
    current = [log["iter/current_preference_pairs"] for log in iterations]
    trained = [log["iter/train_preference_pairs"] for log in iterations]
    assert iterations[1]["iter/total_preference_pairs"] == sum(trained)
    assert all(0 < c <= 8 for c in current)  # 4 items, at most 2 pairs each
    # One update per 2 training pairs (the last one shorter), one epoch per iteration.
    assert trainer.state.global_step == sum(-(-count // 2) for count in trained)
    assert sum(trained) > 0 and {"agent_0/loss", "agent_1/rewards/margins"} <= set(trainer.state.log_history[1])
    moved = changed(start, trainer.model)
    assert any(n.startswith("agents.0.") for n in moved) and any(n.startswith("agents.1.") for n in moved)
    for name in ("initial", "iteration_0000", "iteration_0001"):
        for i in range(2):
            assert (out / "policies" / name / f"agent_{i}" / "config.json").is_file()
    assert (out / "final" / "agent_1" / "config.json").is_file()
    assert not (tmp_path / "preference_replay").exists()  # CoMLRL's default is the working directory


def test_training_on_a_comlrl_shard_retokenizes_its_text(tmp_path):
    trainer = MADPOIterTrainer(
        agent_model=tiny_model_path(),
        reward_func=lambda a, b: [0.0] * len(a),
        args=MADPOIterConfig(output_dir=str(tmp_path), num_iterations=1, report_to="none"),
    )
    record = {"prompts": ["Say hi:", "Say ho:"], "winner_completions": [" hi", " ho"], "loser_completions": ["x", ""]}
    tokenizer = trainer.processing_class
    tokens = trainer.record_token_ids(record)
    assert tokens[0] == (tokenizer.encode("Say hi:"), tokenizer.encode(" hi", add_special_tokens=False), [87])
    before = snapshot(trainer.model)
    trainer.create_optimizer()
    trainer.current_gradient_accumulation_steps = 1
    trainer.model.train()
    trainer.training_step(trainer.model, trainer.pair_batch([record]), None)  # the rows a round's micro-batch holds
    trainer.optimizer.step()
    assert changed(before, trainer.model)


def test_the_model_comparator_trains_through_the_translation(tmp_path):
    """`comparator_policy="model"` with `comparator_model_name`: its weights are loaded at construction and the
    iteration's pairs rank the agents against that model's candidates (tests/test_iterative.py checks the draw)."""
    config = MADPOIterConfig(
        output_dir=str(tmp_path), num_iterations=1, num_agents=2, max_new_tokens=6, preference_num_candidates=4,
        rollout_buffer_size=2, eval_interval=0, report_to="none", comparator_policy="model",
        comparator_model_name=tiny_model_path(seed=1),
    )  # fmt: skip
    trainer = MADPOIterTrainer(
        agent_model=tiny_model_path(),
        num_agents=2,
        reward_func=lambda a, b: [float(len(x) + 2 * len(y)) for x, y in zip(a, b)],
        args=config,
        train_dataset=Dataset.from_dict({"prompt": ["Say hi:", "Name a planet:"]}),
    )
    theirs = AutoModelForCausalLM.from_pretrained(tiny_model_path(seed=1))
    assert len(trainer.comparator_model_weights) == 2 * len(list(theirs.parameters()))
    before = snapshot(trainer.model)
    trainer.train()
    shard = json.loads((tmp_path / "preference_replay" / "iteration_0001.json").read_text())
    assert shard["num_pairs"] > 0 and changed(before, trainer.model)


class StepRecorder(TrainerCallback):
    """Every optimizer step Trainer reports, with the learning rate the scheduler gave it."""

    def __init__(self):
        self.steps, self.lrs = [], []

    def on_step_end(self, args, state, control, lr_scheduler=None, **kwargs):
        self.steps.append(state.global_step)
        self.lrs.append(lr_scheduler.get_last_lr()[0])


def test_iterations_train_through_trainer_callbacks_schedule_and_accumulation(tmp_path):
    """The iterations are Trainer epochs: callbacks see every optimizer step, one learning-rate schedule decays over
    every iteration, `gradient_accumulation_steps` groups the pair batches into optimizer steps, and Trainer
    evaluates before the first update and every `eval_interval` updates."""
    recorder = StepRecorder()
    dataset = Dataset.from_dict({"prompt": ["Write a title:", "Name a planet:", "Pick a word:", "Say hi:"]})
    config = MADPOIterConfig(
        output_dir=str(tmp_path),
        num_iterations=2,
        num_agents=2,
        preference_num_candidates=4,
        preference_pairs_per_sample=2,
        max_new_tokens=6,
        rollout_buffer_size=2,
        train_batch_size=1,
        eval_interval=2,
        logging_steps=1,
        report_to="none",
        lr_scheduler_type="linear",
        gradient_accumulation_steps=2,
    )
    trainer = MADPOIterTrainer(
        agent_model=tiny_model_path(),
        reward_func=lambda a, b: [float(len(x) + 2 * len(y)) for x, y in zip(a, b)],
        args=config,
        train_dataset=dataset,
        eval_dataset=dataset,
        callbacks=[recorder],
    )
    trainer.train()
    trained = [e["iter/train_preference_pairs"] for e in trainer.state.log_history if "iter/current_iteration" in e]
    assert len(trained) == 2
    steps = sum(-(-int(count) // 2) for count in trained)  # one pair per micro-batch, two per optimizer step
    assert trainer.state.global_step == steps and recorder.steps == list(range(1, steps + 1))
    # One linear schedule over the run, sized on the most pairs an iteration can draw (4 items x 2): 4 steps each.
    assert trainer.state.max_steps == 8
    lr0 = trainer.args.learning_rate
    assert recorder.lrs == pytest.approx([lr0 * (1 - s / 8) for s in range(1, steps + 1)], rel=1e-6)
    evaluated = [e["step"] for e in trainer.state.log_history if "eval_reward" in e]
    # CoMLRL's rule (before updates 0, 2, 4, ...); Trainer also evaluates after the last update when it is the 2nd.
    assert evaluated in (list(range(0, steps, 2)), list(range(0, steps + 1, 2)))
    assert trainer.args.num_train_epochs == 1  # CoMLRL's passes, back after training


# ---- 4. the config: CoMLRL's fields, defaults and checks


def test_every_comlrl_field_is_accepted_with_its_default(theirs):
    fields = [(f.name, f.default) for f in dataclasses.fields(theirs.MADPOIterConfig)]
    assert len(fields) == 60
    ours = {f.name: f.default for f in dataclasses.fields(MADPOIterConfig)}
    for name, default in fields:
        assert name in ours, name
        assert ours[name] == default, name
    config = MADPOIterConfig(report_to="none")
    assert (config.num_iterations, config.num_train_epochs, config.num_generations) == (6, 1, 20)
    assert (config.pair_selection, config.preference_pairs_per_sample) == ("comparator_reward", 4)
    assert MADPOIterConfig(preference_replay_mode="TD_Lambda", preference_replay_lambda=1, report_to="none")


def test_a_fraction_of_a_pass_is_refused_naming_num_train_epochs():
    """MADPOIter's `num_train_epochs` counts passes over an iteration's pairs: 1.5 was cut to 1 pass."""
    with pytest.raises(ValueError, match=r"`num_train_epochs` must be a whole number, got 1.5"):
        MADPOIterConfig(num_train_epochs=1.5, report_to="none")


@pytest.mark.parametrize(
    "fields, error, message",
    [
        (dict(comparator_policy="api", comparator_api_url="http://localhost:1"), NotImplementedError, "no network"),
        (dict(comparator_policy="api"), ValueError, "needs `comparator_api_url`"),
        (dict(preference_replay_mode="nearest_k"), ValueError, "needs `preference_replay_k`"),
        (dict(preference_replay_mode="lambda_decay", preference_replay_lambda=1.5), ValueError, r"in \[0, 1\]"),
        (dict(preference_replay_mode="lambda_decay"), ValueError, "needs `preference_replay_lambda`"),
        (dict(preference_replay_sample_size=4), ValueError, "only valid with"),
        (dict(preference_replay_mode="all_history", preference_replay_k=2), ValueError, "only valid with"),
        (dict(preference_replay_mode="sometimes"), ValueError, "preference_replay_mode"),
        (dict(comparator_policy="model"), ValueError, "needs `comparator_model_name`"),
        (dict(comparator_history_k=2), ValueError, "only valid with `comparator_policy='history'`"),
        (dict(comparator_model_name="m"), ValueError, "only valid with `comparator_policy='model'`"),
        (dict(comparator_devices="cpu"), NotImplementedError, "comparator_devices"),
        (dict(comparator_num_candidates=0), ValueError, "comparator_num_candidates"),
        (dict(num_iterations=0), ValueError, "num_iterations"),
        (dict(pair_selection="best"), ValueError, "pair_selection"),
        (dict(pair_selection="all"), ValueError, "preference_pairs_per_sample=None"),
    ],
)
def test_bad_configs_raise_naming_the_field(theirs, fields, error, message):
    if error is ValueError:
        with pytest.raises(ValueError):  # CoMLRL refuses them too
            theirs.MADPOIterConfig(**fields)
    with pytest.raises(error, match=message):
        MADPOIterConfig(**fields, report_to="none")


def test_reward_distribution_needs_a_reward_range(tmp_path):
    args = MADPOIterConfig(output_dir=str(tmp_path), log_reward_distribution=True, report_to="none")
    with pytest.raises(ValueError, match="reward_range"):
        MADPOIterTrainer(agent_model=tiny_model_path(), reward_func=lambda a, b: [0.0] * len(a), args=args)


def test_comlrl_iteration_checkpoints_raise(tmp_path):
    trainer = MADPOIterTrainer(
        agent_model=tiny_model_path(),
        reward_func=lambda a, b: [0.0] * len(a),
        args=MADPOIterConfig(output_dir=str(tmp_path), report_to="none"),
    )
    with pytest.raises(NotImplementedError, match="policy_checkpoint_dir"):
        trainer.train(checkpoint_dir=str(tmp_path / "ckpt"))


# ---- 5. CoMLRL's centralized mode: one model writes every role

CENTRALIZED_SCRIPT = """
from datasets import Dataset
from comlrl.trainers.preference import MADPOIterConfig, MADPOIterTrainer


class HalvesAdapter:
    def build_prompt(self, batch_item, agent_prompts):
        return "Write both parts, one after the other.\\n" + "\\n".join(
            f"Part {i}: {p}" for i, p in enumerate(agent_prompts)
        ) + "\\n"

    def parse_completion(self, completion, batch_item, num_agents):
        half = len(completion) // 2
        return [completion[:half], completion[half:]]


def role_reward(completions1, completions2):
    return [len(set(a)) - 0.5 * len(set(b)) for a, b in zip(completions1, completions2)]


LOGGED = []


def eval_logger(agent_completions_turns, batch_items, prompts):
    LOGGED.append(agent_completions_turns)
    return [{"roles": float(len(agent_completions_turns))} for _ in batch_items]


def main(model_path, output_dir, comparator_policy):
    dataset = Dataset.from_dict({"prompt": ["Write a title:", "Name a planet:", "Pick a word:", "Say hi:"]})
    config = MADPOIterConfig(
        collaboration_mode="centralized", num_iterations=2, num_agents=2, agent_learning_rate=1e-4,
        max_new_tokens=8, preference_num_candidates=4, preference_pairs_per_sample=2,
        pair_selection="comparator_reward", dpo_beta=0.1, rollout_buffer_size=2, train_batch_size=2,
        eval_interval=0, logging_steps=1, comparator_policy=comparator_policy,
        preference_replay_dir=output_dir + "/preference_replay",
    )
    trainer = MADPOIterTrainer(
        agent_model=model_path,
        num_agents=2,
        reward_func=role_reward,
        formatters=[lambda item: item["prompt"], lambda item: "Expand: " + item["prompt"]],
        args=config,
        train_dataset=dataset,
        eval_dataset=dataset,
        eval_logger=eval_logger,
        eval_aggregator=lambda rows, num_turns: {"roles": rows[0]["roles"]},
        centralized_comparator_adapter=HalvesAdapter(),
    )
    trainer.verbose = False
    trainer.train()
    trainer.save_model(output_dir + "/final")
    return trainer, LOGGED, HalvesAdapter(), role_reward
"""


@pytest.mark.parametrize("comparator", ["current", "current_copy", "history"])
def test_centralized_madpo_iter_script_runs_with_only_its_imports_changed(tmp_path, monkeypatch, comparator):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    random.seed(0)
    trainer, logged, adapter, role_reward = run_script(
        CENTRALIZED_SCRIPT, OURS_MADPO_ITER, tiny_model_path(), str(out), comparator
    )
    assert trainer.num_agents == 1 and trainer.num_roles == 2
    assert trainer.args.comparator_generation_mode == "centralized"  # forced, as CoMLRL does
    joint_prompts = {
        trainer.centralized_collaboration.build_prompt({"prompt": p}) for p in ["Say hi:", "Pick a word:"]
    }
    for it in (1, 2):
        shard = json.loads((out / "preference_replay" / f"iteration_{it:04d}.json").read_text())
        assert shard["num_pairs"] == len(shard["pairs"]) > 0
        for record in shard["pairs"]:
            # One actor: the joint prompt and the joint completions as written; rewards on the parsed roles.
            assert len(record["prompts"]) == len(record["winner_completions"]) == len(record["loser_completions"]) == 1
            assert record["prompts"][0].startswith("Write both parts, one after the other.\nPart 0: ")
            for key, reward in (("winner_completions", "winner_reward"), ("loser_completions", "loser_reward")):
                roles = adapter.parse_completion(record[key][0], {}, 2)
                assert record[reward] == pytest.approx(role_reward([roles[0]], [roles[1]])[0])
            assert record["winner_reward"] > record["loser_reward"]
    shard = json.loads((out / "preference_replay" / "iteration_0001.json").read_text())
    assert joint_prompts & {r["prompts"][0] for r in shard["pairs"]}
    iterations = [log for log in trainer.state.log_history if "iter/current_iteration" in log]
    trained = [log["iter/train_preference_pairs"] for log in iterations]
    assert len(iterations) == 2 and trainer.state.global_step == sum(-(-count // 2) for count in trained)
    # One model, saved where CoMLRL saves it (agent_0/), its weights changed.
    saved = AutoModelForCausalLM.from_pretrained(out / "final" / "agent_0")
    assert changed(snapshot(AutoModelForCausalLM.from_pretrained(tiny_model_path())), saved)
    assert not (out / "final" / "agent_1").exists()
    metrics = trainer.evaluate(num_eval_samples=2)
    assert metrics["eval_roles"] == 2.0 and [len(r) for r in logged[-1]] == [2, 2]  # [role][item][turn]
    if comparator == "current":  # the same script runs under CoMLRL 1.4.3
        pytest.importorskip("comlrl")
        theirs, *_ = run_script(CENTRALIZED_SCRIPT, {}, tiny_model_path(), str(tmp_path / "theirs"), comparator)
        assert theirs.args.comparator_generation_mode == "centralized" and theirs.num_agents == 1
        record = json.loads((tmp_path / "theirs" / "preference_replay" / "iteration_0001.json").read_text())["pairs"][
            0
        ]
        assert len(record["prompts"]) == len(record["winner_completions"]) == 1
        assert record["prompts"][0] in {
            trainer.centralized_collaboration.build_prompt({"prompt": p})
            for p in ["Write a title:", "Name a planet:", "Pick a word:", "Say hi:"]
        }


def test_the_history_and_model_comparators_are_the_native_ones():
    """CoMLRL's `comparator_policy="history"` and `"model"` (by any of their names) run the native rounds'
    comparators (tests/test_iterative.py); "current_copy" draws as "current"."""
    config = MADPOIterConfig(comparator_policy="previous", comparator_history_k=2, report_to="none")
    assert (config.comparator_policy, config.comparator, config.comparator_history_k) == ("history", "history", 2)
    assert MADPOIterConfig(comparator_policy="history", report_to="none").comparator_history_k == 1
    assert MADPOIterConfig(comparator_policy="current_copy", report_to="none").comparator == "current"
    native = MARLHFIterConfig(comparator_policy="history", comparator_history_k=3, report_to="none").native_config()
    assert (native.comparator, native.comparator_history_k) == ("history", 3)
    # "model": `comparator_agents` (one per agent), else `comparator_model_name`, as the native `comparator_model`.
    config = MADPOIterConfig(comparator_policy="reference", comparator_model_name="m", report_to="none")
    assert (config.comparator, config.comparator_model) == ("model", "m")
    config = MADPOIterConfig(comparator_policy="model", comparator_agents=["a", "b"], report_to="none")
    assert config.comparator_model == ["a", "b"]
    native = MARLHFIterConfig(comparator_policy="model", comparator_model_name="m", report_to="none").native_config()
    assert (native.comparator, native.comparator_model) == ("model", "m")


def test_centralized_madpo_iter_config_checks(tmp_path):
    config = MADPOIterConfig(collaboration_mode="centralized", num_agents=3, report_to="none")
    assert (config.num_agents, config.comparator_generation_mode) == (3, "centralized")
    with pytest.raises(ValueError, match="comparator_centralized_agent_index"):
        MADPOIterConfig(collaboration_mode="centralized", comparator_centralized_agent_index=1, report_to="none")
    with pytest.raises(NotImplementedError, match="decentralized agents"):
        MADPOIterConfig(comparator_generation_mode="centralized", report_to="none")
