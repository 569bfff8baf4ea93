"""Centralized MARLHF: `MARLHFConfig(collaboration_mode="centralized")` trains one model
that writes every role. A CoMLRL centralized MARLHF script with only its imports changed (the model's weights change,
the reward model is trained on pairs ranked by the roles' joint reward, online rewards are the reward model's
scores, evaluation is on the task reward with `eval_logger` given the roles), the reward model's texts against the
ones CoMLRL 1.4.3 builds for the same joint prompts and completions, and the arguments refused at construction.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM

from multiagent_trl import JointRewardModel, MARLHFConfig, MARLHFTrainer
from multiagent_trl.testing import tiny_model_path

from .conftest import changed, snapshot
from .test_actor_critic import parity_reward, run_script


@pytest.fixture(scope="module")
def comlrl():
    pytest.importorskip("comlrl", reason="the parity tests need comlrl==1.4.3 (pip install -e '.[dev]')")
    from comlrl.trainers.preference import collaboration, marlhf

    return SimpleNamespace(collaboration=collaboration, marlhf=marlhf)


SCRIPT = """
from datasets import Dataset
from comlrl.trainers.preference import MARLHFConfig, MARLHFTrainer
from comlrl.utils.reward_processor import RewardProcessors


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


def main(model_path, output_dir):
    dataset = Dataset.from_dict({"prompt": ["Write a title:", "Name a planet:", "Pick a word:", "Say hi:"]})
    config = MARLHFConfig(
        collaboration_mode="centralized", num_agents=2, num_train_epochs=1, agent_learning_rate=1e-3,
        max_new_tokens=8, rl_algorithm="magrpo", num_generations=2, preference_num_candidates=4,
        preference_pairs_per_sample=2, reward_learning_rate=1e-4, reward_train_batch_size=2,
        reward_model_device=None, rollout_buffer_size=2, eval_interval=0, logging_steps=1,
    )
    trainer = MARLHFTrainer(
        agent_model=model_path,
        num_agents=2,
        reward_func=role_reward,
        reward_processor=RewardProcessors.scale(2.0),
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
    trainer.save_model(output_dir)
    return trainer, LOGGED, HalvesAdapter(), role_reward
"""

OURS = {
    "from comlrl.trainers.preference import MARLHFConfig, MARLHFTrainer": (
        "from multiagent_trl.comlrl import MARLHFConfig, MARLHFTrainer"
    ),
    "from comlrl.utils.reward_processor import RewardProcessors": "from multiagent_trl import RewardProcessors",
}
PROMPTS = ["Write a title:", "Name a planet:", "Pick a word:", "Say hi:"]
FORMATTERS = [lambda item: item["prompt"], lambda item: "Expand: " + item["prompt"]]


def task_reward(role_reward, adapter, completion: str) -> float:
    a, b = adapter.parse_completion(completion, {}, 2)
    return 2.0 * role_reward([a], [b])[0]  # the script's reward on the parsed roles, and its processor


@pytest.fixture(scope="module")
def script_run(tmp_path_factory):
    """Our run of the script, with every text the reward model reads recorded (`JointRewardModel.tokenize`)."""
    out = tmp_path_factory.mktemp("marlhf_centralized")
    scored: list[list[str]] = []
    tokenize = JointRewardModel.tokenize

    def recording(self, texts, spans=None):
        scored.append(list(texts))
        return tokenize(self, texts, spans)

    cwd = os.getcwd()
    os.chdir(out)
    JointRewardModel.tokenize = recording
    try:
        torch.manual_seed(0)
        trainer, logged, adapter, role_reward = run_script(SCRIPT, OURS, tiny_model_path(), str(out / "final"))
    finally:
        JointRewardModel.tokenize = tokenize
        os.chdir(cwd)
    # The last training batch's completions table (before any evaluation replaces it).
    table = {"prompt": list(trainer._logs["prompt"]), "completion": list(trainer._logs["completion"])}
    table["rewards"] = list(trainer._logs["rewards"]["joint_reward_model"])
    return SimpleNamespace(
        trainer=trainer, logged=logged, adapter=adapter, role_reward=role_reward, scored=scored, out=out, table=table
    )


def test_centralized_script_trains_one_model_on_the_reward_model(script_run):
    trainer, out = script_run.trainer, script_run.out
    assert trainer.num_agents == 1 and trainer.num_roles == 2 and trainer.args.num_agents == 1
    assert trainer.args.advantage_mode == "mean" and trainer.centralized_collaboration is not None
    # 4 items, 2 per generation batch (2 samples each), one step each.
    assert trainer.state.global_step == 2
    # One model, saved where CoMLRL saves it (agent_0/), its weights changed; the reward model beside it.
    saved = AutoModelForCausalLM.from_pretrained(out / "final" / "agent_0")
    assert changed(snapshot(AutoModelForCausalLM.from_pretrained(tiny_model_path())), saved)
    assert not (out / "final" / "agent_1").exists()
    assert (out / "final" / "reward_model").is_dir()
    # Step 1: pairs of the joint candidates, ranked by the roles' joint reward (parsed roles, processor x2).
    pairs = trainer.preference_pairs
    joint_prompts = {trainer.centralized_collaboration.build_prompt({"prompt": p}) for p in PROMPTS}
    assert 0 < len(pairs) <= 4 * 2
    for pair in pairs:
        assert len(pair.prompts) == len(pair.chosen) == 1 and pair.prompts[0] in joint_prompts
        assert pair.chosen_reward == pytest.approx(
            task_reward(script_run.role_reward, script_run.adapter, *pair.chosen)
        )
        assert pair.rejected_reward == pytest.approx(
            task_reward(script_run.role_reward, script_run.adapter, *pair.rejected)
        )
        assert pair.chosen_reward > pair.rejected_reward
    # Step 2: the reward model was trained on them (logged in the first training log).
    first = trainer.state.log_history[0]
    assert first["reward_model/pairs"] == len(pairs)
    assert first["reward_model/steps"] == len(trainer.reward_model_history) == -(-len(pairs) // 2)


def test_online_rewards_are_reward_model_scores_and_evaluation_the_task_reward(script_run):
    trainer = script_run.trainer
    logged = [h for h in trainer.state.log_history if "reward" in h]
    assert logged and all(h["reward"] == pytest.approx(h["rewards/joint_reward_model/mean"]) for h in logged)
    # The last batch: each joint completion's training reward is the reward model's raw score of its joint text.
    table = script_run.table
    prompts, completions, rewards = table["prompt"], table["completion"], table["rewards"]
    assert len(rewards) == 4
    with torch.no_grad():
        scores = trainer.reward_model(prompts=[(p,) for p in prompts], completions=[(c,) for c in completions])
    assert rewards == pytest.approx(scores, abs=1e-5)
    assert rewards != pytest.approx([task_reward(script_run.role_reward, script_run.adapter, c) for c in completions])
    # Evaluation: the task reward on the parsed roles, through the processor; eval_logger gets [role][item][turn].
    metrics = trainer.evaluate()
    roles = script_run.logged[-1]
    assert metrics["eval_roles"] == 2.0 and len(roles) == 2 and [len(r) for r in roles] == [4, 4]
    expected = [2.0 * script_run.role_reward([roles[0][i][0]], [roles[1][i][0]])[0] for i in range(4)]
    assert metrics["eval_turn_1/reward_mean"] == pytest.approx(sum(expected) / 4)
    assert "eval_rewards/joint_reward_model/mean" not in metrics


def comlrl_texts(comlrl, adapter, item, completions):
    """CoMLRL 1.4.3's centralized reward-model texts for one item's joint completions: its `MARLHFTrainer` in
    centralized mode holds one actor (`num_agents=1`) whose formatter is its `CentralizedCollaboration.build_prompt`,
    and `_compute_reward_model_rewards` scores `_format_joint_text` of that prompt and each joint completion."""
    collab = comlrl.collaboration.CentralizedCollaboration(adapter, FORMATTERS, parity_reward, 2)
    texts = []
    bare = object.__new__(comlrl.marlhf.MARLHFTrainer)
    bare.__dict__.update(
        num_agents=1,
        formatters=[collab.build_prompt],
        reward_model=object(),
        args=SimpleNamespace(joint_mode="aligned"),
        _score_reward_texts=lambda batch: (texts.extend(batch), torch.zeros(len(batch)))[1],
    )
    bare._compute_reward_model_rewards(["ignored"], [list(completions)], batch_items=[item])
    return texts, collab


def test_reward_model_reads_the_texts_comlrl_builds(script_run, comlrl):
    trainer, adapter, scored = script_run.trainer, script_run.adapter, script_run.scored
    every = [text for batch in scored for text in batch]
    # The reward-model stage: each pair's chosen and rejected texts, as CoMLRL's `_format_joint_reward_text` builds
    # them (its pairs hold the joint prompt and the joint completion, one actor).
    for pair in trainer.preference_pairs:
        item = next(
            {"prompt": p}
            for p in PROMPTS
            if trainer.centralized_collaboration.build_prompt({"prompt": p}) in pair.prompts
        )
        theirs, collab = comlrl_texts(comlrl, adapter, item, [pair.chosen[0], pair.rejected[0]])
        assert collab.build_prompt(item) == pair.prompts[0]  # the same joint prompt from the role formatters
        assert theirs[0] in every and theirs[1] in every
    # The online phase: the last batch's texts (its items' joint completions, scored together) are CoMLRL's.
    prompts, completions = script_run.table["prompt"], script_run.table["completion"]
    by_prompt = {trainer.centralized_collaboration.build_prompt({"prompt": p}): {"prompt": p} for p in PROMPTS}
    theirs = []
    for start in range(0, len(prompts), 2):  # num_generations=2 joint completions per item
        assert prompts[start] == prompts[start + 1]
        theirs += comlrl_texts(comlrl, adapter, by_prompt[prompts[start]], completions[start : start + 2])[0]
    assert len(theirs) == 4 and theirs in scored
    assert theirs[0].startswith("Joint multi-agent response\n\nAgent 1 prompt:\nWrite both parts")
    assert "Agent 2" not in theirs[0]  # one actor: the joint prompt and the unparsed joint completion


def test_the_same_script_runs_under_comlrl(tmp_path, comlrl):
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        torch.manual_seed(0)
        trainer, *_ = run_script(SCRIPT, {}, tiny_model_path(), str(tmp_path / "theirs"))
    finally:
        os.chdir(cwd)
    assert trainer.num_agents == 1 and trainer.centralized_collaboration is not None
    assert (tmp_path / "theirs" / "agent_0" / "config.json").is_file()
    assert not (tmp_path / "theirs" / "agent_1").exists()


# ---- bad inputs raise at construction


class NoParse:
    def build_prompt(self, batch_item, agent_prompts):
        return "joint"


def centralized_args(tmp_path, **overrides):
    settings = dict(
        collaboration_mode="centralized", num_agents=2, max_new_tokens=4, num_generations=2,
        preference_num_candidates=2, eval_interval=0, reward_model_device=None, report_to="none",
        output_dir=str(tmp_path),
    )  # fmt: skip
    return MARLHFConfig(**{**settings, **overrides})


CASES = {
    "adapter without parse_completion": (
        dict(centralized_comparator_adapter=NoParse()),
        TypeError,
        "parse_completion",
    ),
    "two agent models": (dict(agent_model=None, agents=["a", "b"]), ValueError, "exactly one actor"),
    "two tokenizers": (dict(tokenizer=[None, None]), ValueError, "one tokenizer"),
    "num_agents mismatch": (dict(num_agents=3), ValueError, "num_agents=3"),
    "no reward": (dict(reward_func=None), ValueError, "reward_func"),
    "metrics_callback": (dict(metrics_callback=print), ValueError, "metrics_callback"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_arguments_raise_at_construction(case, tmp_path):
    overrides, error, message = CASES[case]
    kwargs = {"agent_model": tiny_model_path(), "reward_func": parity_reward, **overrides}
    with pytest.raises(error, match=message):
        MARLHFTrainer(args=centralized_args(tmp_path), **kwargs)


@pytest.mark.parametrize(
    ("fields", "error", "message"),
    [
        (dict(rl_algorithm="iac"), NotImplementedError, "centralized"),
        (dict(rl_algorithm="maac"), NotImplementedError, "MAGRPO family"),
        (dict(num_agents=0), ValueError, "num_agents"),
        (dict(collaboration_mode="both"), ValueError, "collaboration_mode"),
    ],
)
def test_bad_configs_raise(fields, error, message, tmp_path):
    with pytest.raises(error, match=message):
        centralized_args(tmp_path, **fields)


def test_config_keeps_the_role_count_and_checks_the_adapter_in_either_mode(tmp_path):
    config = centralized_args(tmp_path, num_agents=3)
    assert (config.collaboration_mode, config.num_agents) == ("centralized", 3)
    assert MARLHFConfig(collaboration_mode=" Centralized ", report_to="none").collaboration_mode == "centralized"
    decentralized = MARLHFConfig(
        max_new_tokens=4, num_generations=2, preference_num_candidates=2, eval_interval=0, reward_model_device=None,
        report_to="none", output_dir=str(tmp_path),
    )  # fmt: skip
    with pytest.raises(TypeError, match="centralized_comparator_adapter"):
        MARLHFTrainer(
            agent_model=tiny_model_path(), reward_func=parity_reward, args=decentralized,
            centralized_comparator_adapter=NoParse(),
        )  # fmt: skip
