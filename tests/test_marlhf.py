"""MARLHF (`multiagent_trl.comlrl.marlhf`, `multiagent_trl.preference.reward_training`): the reward-model stage
against CoMLRL 1.4.3's own `_train_reward_model` (loss and weights after AdamW steps, shuffled batches), a CoMLRL
MARLHF script with only its imports changed (pairs from the task reward, online rewards from the reward model,
evaluation on the task reward), the saved reward model reloaded and used as a `reward_funcs` entry of the native
trainer, and the config's fields and checks.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from datasets import Dataset
from torch import nn
from transformers import AutoModelForCausalLM, PretrainedConfig

from multiagent_trl import JointRewardModel, MARLHFConfig, MARLHFTrainer, MultiAgentGRPOConfig, MultiAgentGRPOTrainer
from multiagent_trl.preference.reward_model import REWARD_HEAD_FILE
from multiagent_trl.preference.reward_training import JointPreferencePair, pairs_from_candidates, train_reward_model
from multiagent_trl.preference.sampling import collect_preference_pairs
from multiagent_trl.testing import tiny_model_path, tiny_tokenizer

from .conftest import changed, small_args, snapshot
from .parity import FORWARD_REL, TINY, assert_same_forward, assert_same_update
from .test_actor_critic import run_script


@pytest.fixture(scope="module")
def comlrl():
    pytest.importorskip("comlrl", reason="the parity tests need comlrl==1.4.3 (pip install -e '.[dev]')")
    from comlrl.trainers.preference import madpo, marlhf

    return SimpleNamespace(madpo=madpo, marlhf=marlhf)


# ---- 1. the reward-model stage against CoMLRL's own

PAIRS = [
    (("Sum 2 and 3:", "Check:"), ("5", "correct"), ("6", "wrong, it is 5")),
    (("Name a fruit.", "Name a colour."), ("apple", "red"), ("rock", "")),
    (("Hi", "Yo"), ("hello there, how are you?", "fine"), ("x", "y")),
]


def comlrl_rm_trainer(comlrl, lr: float, batch_size: int, epochs: int, freeze: bool = False):
    """CoMLRL's MARLHFTrainer, bare, holding its reward model (seeded head) and AdamW as its `_init_reward_model`
    builds them; `_train_reward_model` reads nothing else."""
    tokenizer = tiny_tokenizer()
    tokenizer.padding_side = "right"  # CoMLRL pads on the tokenizer's side; ours always on the right
    torch.manual_seed(3)
    model = comlrl.marlhf.JointRewardModel(AutoModelForCausalLM.from_pretrained(tiny_model_path()), freeze)
    trainer = object.__new__(comlrl.marlhf.MARLHFTrainer)
    trainer.__dict__.update(
        num_agents=2,
        reward_model=model,
        reward_tokenizer=tokenizer,
        reward_device=torch.device("cpu"),
        verbose=False,
        reward_optimizer=torch.optim.AdamW(model.parameters(), lr=lr),
        args=SimpleNamespace(
            reward_max_length=None, reward_train_batch_size=batch_size, reward_num_train_epochs=epochs
        ),
    )
    return trainer


def our_rm(freeze: bool = False) -> JointRewardModel:
    torch.manual_seed(3)
    return JointRewardModel(AutoModelForCausalLM.from_pretrained(tiny_model_path()), tiny_tokenizer(), freeze)


def their_pairs(comlrl):
    return [
        comlrl.madpo.PreferencePair(
            prompts=list(p),
            winner_completions=list(w),
            loser_completions=list(lo),
            agent_tensors=[],
            winner_reward=1.0,
            loser_reward=0.0,
            candidate_reward_mean=0.5,
        )
        for p, w, lo in PAIRS
    ]


def our_pairs():
    return [JointPreferencePair(p, w, lo, 1.0, 0.0) for p, w, lo in PAIRS]


@pytest.mark.parametrize(("batch_size", "epochs"), [(3, 1), (2, 2)])
def test_reward_model_training_matches_comlrl(comlrl, batch_size, epochs):
    lr = 1e-3
    theirs = comlrl_rm_trainer(comlrl, lr, batch_size, epochs)
    ours = our_rm()
    torch.testing.assert_close(ours.state_dict(), theirs.reward_model.state_dict())  # the same seeded head
    # The loss before any step: CoMLRL's scores of the winners' and losers' texts, its formula.
    pairs = their_pairs(comlrl)
    with torch.no_grad():
        winners = theirs._score_reward_texts([theirs._format_joint_reward_text(p, use_winner=True) for p in pairs])
        losers = theirs._score_reward_texts([theirs._format_joint_reward_text(p, use_winner=False) for p in pairs])
        their_loss = -F.logsigmoid(winners - losers).mean().item()
    torch.manual_seed(11)  # the DataLoader's shuffles draw from torch's global generator, in both
    theirs._train_reward_model(pairs)
    torch.manual_seed(11)
    history = train_reward_model(ours, our_pairs(), learning_rate=lr, num_train_epochs=epochs, batch_size=batch_size)
    assert len(history) == epochs * -(-len(PAIRS) // batch_size)
    if batch_size == len(PAIRS):
        assert history[0]["loss"] == pytest.approx(their_loss, rel=FORWARD_REL, abs=TINY)
    # Every weight (backbone and head) after the AdamW steps (weight decay 0.01), in the same shuffled order.
    assert ours.state_dict().keys() == theirs.reward_model.state_dict().keys()
    assert_same_update([("reward_model", ours, theirs.reward_model)], lr, steps=len(history))
    assert not ours.training and not theirs.reward_model.training


def test_frozen_backbone_reads_each_joint_sample_once_and_trains_the_head_as_comlrl(comlrl):
    lr, batch_size, epochs = 1e-2, 2, 3
    theirs = comlrl_rm_trainer(comlrl, lr, batch_size, epochs, freeze=True)
    ours = our_rm(freeze=True)
    forwards = []
    ours.backbone.get_decoder().register_forward_hook(lambda module, args, output: forwards.append(1))
    torch.manual_seed(11)
    theirs._train_reward_model(their_pairs(comlrl))
    torch.manual_seed(11)
    history = train_reward_model(ours, our_pairs(), learning_rate=lr, num_train_epochs=epochs, batch_size=batch_size)
    # CoMLRL runs the backbone twice per step (6 steps here); ours once, on the 6 distinct joint samples together.
    assert len(history) == 6 and len(forwards) == 1
    # The same head after the same AdamW steps; features read in one padded batch instead of per step agree to float
    # rounding (the backbone's rows are padded on the right, which a causal model does not read).
    assert_same_update([("reward_model", ours, theirs.reward_model)], lr, steps=len(history))
    assert not ours.training


def test_reward_model_training_freezes_the_backbone_and_logs():
    model = our_rm(freeze=True)
    before = snapshot(model)
    history = train_reward_model(model, our_pairs(), learning_rate=1e-2, num_train_epochs=3, batch_size=3)
    assert changed(before, model) == {"reward_head.weight", "reward_head.bias"}
    assert [h["step"] for h in history] == [1.0, 2.0, 3.0]
    assert all(0.0 <= h["accuracy"] <= 1.0 and h["loss"] > 0 for h in history)
    assert history[-1]["loss"] < history[0]["loss"]  # the head learns the three pairs
    with pytest.raises(ValueError, match="No preference pair"):
        train_reward_model(model, [])
    with pytest.raises(ValueError, match="reward_learning_rate"):
        train_reward_model(model, our_pairs(), learning_rate=0.0)


def test_pairs_from_candidates_keep_the_joint_samples():
    pairs = pairs_from_candidates(["p0", "p1"], [("a", "b"), ("c", "d")], [1.0, 3.0])
    assert pairs == [JointPreferencePair(("p0", "p1"), ("c", "d"), ("a", "b"), 3.0, 1.0)]
    assert pairs_from_candidates(["p"], [("a",), ("b",)], [1.0, 1.0]) == []
    with pytest.raises(ValueError, match="one reward each"):
        pairs_from_candidates(["p"], [("a",), ("b",)], [1.0])


# ---- 2. a CoMLRL MARLHF script with only its imports changed

MARLHF_SCRIPT = """
from datasets import Dataset
from comlrl.trainers.preference import MARLHFConfig, MARLHFTrainer
from comlrl.utils.reward_processor import RewardProcessors


def length_reward(completions1, completions2):
    return [min(len(b) / max(len(a), 1), 2.0) for a, b in zip(completions1, completions2)]


def main(model_path, output_dir):
    dataset = Dataset.from_dict({"prompt": ["Write a title:", "Name a planet:", "Pick a word:", "Say hi:"]})
    config = MARLHFConfig(
        num_agents=2, num_train_epochs=1, agent_learning_rate=1e-3, max_new_tokens=6, rl_algorithm="magrpo",
        num_generations=2, preference_num_candidates=4, preference_pairs_per_sample=2, pair_selection="reward_gap",
        reward_learning_rate=1e-4, reward_num_train_epochs=1, reward_train_batch_size=2,
        rollout_buffer_size=2, eval_interval=0, logging_steps=1,
    )
    trainer = MARLHFTrainer(
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
    trainer.save_model(output_dir)
    return trainer
"""

OURS_MARLHF = {
    "from comlrl.trainers.preference import MARLHFConfig, MARLHFTrainer": (
        "from multiagent_trl.comlrl import MARLHFConfig, MARLHFTrainer"
    ),
    "from comlrl.utils.reward_processor import RewardProcessors": "from multiagent_trl import RewardProcessors",
}


def task_reward(a: str, b: str) -> float:
    return 2.0 * min(len(b) / max(len(a), 1), 2.0)  # the script's reward and processor


@pytest.fixture(scope="module")
def script_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("marlhf")
    cwd = os.getcwd()
    os.chdir(out)  # the script keeps CoMLRL's default output_dir, "marlhf_output", under the working directory
    try:
        torch.manual_seed(0)
        trainer = run_script(MARLHF_SCRIPT, OURS_MARLHF, tiny_model_path(), str(out / "final"))
    finally:
        os.chdir(cwd)
    return trainer, out


def test_marlhf_script_runs_and_trains_the_agents(script_run):
    trainer, out = script_run
    assert trainer.args.advantage_mode == "mean" and trainer.args.num_generations == 2
    # The default reward_model_device="cuda:0" on a machine without CUDA: the team's device.
    if not torch.cuda.is_available():
        assert next(trainer.reward_model.parameters()).device == trainer.accelerator.device
    # 4 items, 2 per generation batch, one step each.
    assert trainer.state.global_step == 2
    initial = AutoModelForCausalLM.from_pretrained(tiny_model_path())
    for i in range(2):
        trained = AutoModelForCausalLM.from_pretrained(out / "final" / f"agent_{i}")
        assert changed(snapshot(initial), trained), f"agent_{i} did not change"
    # Step 1: pairs of the initial policies' joint candidates, ranked by the processed task reward.
    pairs = trainer.preference_pairs
    assert 0 < len(pairs) <= 4 * 2
    for pair in pairs:
        assert pair.prompts[1] == "Expand: " + pair.prompts[0]
        assert pair.chosen_reward == pytest.approx(task_reward(*pair.chosen))
        assert pair.rejected_reward == pytest.approx(task_reward(*pair.rejected))
        assert pair.chosen_reward > pair.rejected_reward
    # Step 2: the reward model's stage is logged in the first training log.
    first = trainer.state.log_history[0]
    assert first["reward_model/pairs"] == len(pairs)
    assert first["reward_model/steps"] == len(trainer.reward_model_history) == -(-len(pairs) // 2)


def test_online_rewards_come_from_the_reward_model_and_evaluation_from_the_task(script_run):
    trainer, _ = script_run
    logged = [h for h in trainer.state.log_history if "reward" in h]
    assert logged and all(h["reward"] == pytest.approx(h["rewards/joint_reward_model/mean"]) for h in logged)
    assert all("rewards/length_reward/mean" not in h for h in logged)
    # The last batch's completions table: each joint sample's training reward is the reward model's raw score.
    table = trainer._logs
    completions = list(zip(table["extra"]["agent_0/completion"], table["extra"]["agent_1/completion"]))
    prompts = [(p, "Expand: " + p) for p in table["prompt"]]
    rewards = list(table["rewards"]["joint_reward_model"])
    assert len(rewards) == 4
    assert_same_forward(
        rewards, trainer.reward_model(prompts=prompts, completions=completions), msg="training rewards"
    )
    # Evaluation: the task reward, through the processor (x2).
    metrics = trainer.evaluate()
    assert "eval_rewards/length_reward/mean" in metrics and "eval_rewards/joint_reward_model/mean" not in metrics
    assert metrics["eval_turn_1/reward_mean"] == pytest.approx(2.0 * metrics["eval_rewards/length_reward/mean"])


def test_saved_reward_model_reloads_and_serves_as_reward_funcs(script_run, tmp_path):
    trainer, out = script_run
    assert os.path.isfile(out / "final" / "reward_model" / REWARD_HEAD_FILE)  # save_model writes it beside the agents
    assert not (out / "marlhf_output" / "reward_model").exists()  # nothing written unasked
    loaded = JointRewardModel.from_pretrained(str(out / "final" / "reward_model"))
    prompts, completions = [("Say hi:", "Expand: Say hi:"), ("a", "b")], [("hello", "hello there"), ("x", "")]
    with torch.no_grad():
        scores = loaded(prompts=prompts, completions=completions)
        assert_same_forward(scores, trainer.reward_model(prompts=prompts, completions=completions), msg="reloaded")
    # The native path: the trained reward model as a `reward_funcs` entry of the team trainer.
    native = MultiAgentGRPOTrainer(
        model=tiny_model_path(),
        reward_funcs=loaded,
        args=small_args(tmp_path, num_agents=2, max_steps=1),
        train_dataset=Dataset.from_dict({"prompt": ["Say hi:", "Pick a word:"] * 4}),
    )
    native.train()
    log = native.state.log_history[0]
    assert log["reward"] == pytest.approx(log["rewards/joint_reward_model/mean"])
    table = native._logs
    completions = list(zip(table["extra"]["agent_0/completion"], table["extra"]["agent_1/completion"]))
    prompts = [(p, p) for p in table["prompt"]]
    scores = loaded(prompts=prompts, completions=completions)
    assert_same_forward(list(table["rewards"]["joint_reward_model"]), scores, msg="team rewards")


# ---- 3. collection on its own, and a reward that never ranks


def constant_reward(completions1, completions2):
    return [1.0] * len(completions1)


def test_no_pair_raises_with_the_fix(tmp_path):
    trainer = MARLHFTrainer(
        agent_model=tiny_model_path(),
        reward_func=constant_reward,
        args=MARLHFConfig(
            output_dir=str(tmp_path), report_to="none", max_new_tokens=2, preference_num_candidates=2, eval_interval=0
        ),
        train_dataset=Dataset.from_dict({"prompt": ["Hi"]}),
    )
    with pytest.raises(ValueError, match="No preference pair.*preference_num_candidates"):
        trainer.train()
    with pytest.raises(ValueError, match="num_candidates"):
        collect_preference_pairs(trainer, trainer.train_dataset, num_candidates=1)


def test_collecting_pairs_leaves_the_training_metrics_empty(tmp_path):
    """Sampling pairs is not a training step: what TRL records while the agents generate (completion lengths, the
    rewards) must not land in the first training log, for the team or any agent."""

    def graded(completions1, completions2):
        return [float(len(a)) - 0.5 * len(b) for a, b in zip(completions1, completions2)]

    trainer = MultiAgentGRPOTrainer(
        model=tiny_model_path(),
        reward_funcs=graded,
        args=MultiAgentGRPOConfig(
            output_dir=str(tmp_path), report_to="none", num_agents=2, num_generations=2, max_completion_length=4
        ),
        train_dataset=Dataset.from_dict({"prompt": ["Hi", "Yo"]}),
    )
    pairs = collect_preference_pairs(trainer, trainer.train_dataset, num_candidates=4, pairs_per_sample=2)
    assert pairs
    assert not any(trainer._metrics["train"].values())
    for view in trainer._agent_views:
        assert not any(view["_metrics"]["train"].values())


# ---- 4. the config and the constructor: CoMLRL's fields, defaults and checks


def test_every_comlrl_field_is_accepted_with_its_default(comlrl):
    fields = [(f.name, f.default) for f in dataclasses.fields(comlrl.marlhf.MARLHFConfig)]
    assert len(fields) == 50
    ours = {f.name: f.default for f in dataclasses.fields(MARLHFConfig)}
    for name, default in fields:
        assert name in ours, name
        assert ours[name] == default, name
        MARLHFConfig(**{name: default}, report_to="none")
    config = MARLHFConfig(report_to="none")
    assert (config.num_turns, config.num_generations, config.preference_num_candidates) == (1, 4, 80)
    assert config.reward_model_device == "cuda:0"


@pytest.mark.parametrize(
    ("algorithm", "mode"),
    [("magrpo", "mean"), ("mareinforce", "raw"), ("mareforce", "raw"), ("maremax", "max"), ("marloo", "rloo")],
)
def test_rl_algorithm_sets_the_advantage_mode(comlrl, algorithm, mode):
    assert comlrl.marlhf.MARLHFConfig(rl_algorithm=algorithm).advantage_mode == mode
    config = MARLHFConfig(rl_algorithm=algorithm, report_to="none")
    assert config.advantage_mode == mode
    assert config.advantage_baseline == {"mean": "mean", "raw": "none", "max": "max", "rloo": "leave_one_out"}[mode]


BAD = [
    (dict(rl_algorithm="ppo"), "rl_algorithm"),
    (dict(reward_learning_rate=0.0), "reward_learning_rate"),
    (dict(reward_learning_rate=-1e-5), "reward_learning_rate"),
    (dict(num_generations=1), "num_generations"),
    (dict(reward_num_train_epochs=0), "reward_num_train_epochs"),
    (dict(reward_train_batch_size=0), "reward_train_batch_size"),
    (dict(reward_max_length=0), "reward_max_length"),
    (dict(critic_type="x"), "critic_type"),
    (dict(value_loss_coef=0.0), "value_loss_coef"),
    (dict(pair_selection="all"), "preference_pairs_per_sample=None"),
]


@pytest.mark.parametrize(("fields", "message"), BAD, ids=[f"{next(iter(f))}{i}" for i, (f, _) in enumerate(BAD)])
def test_bad_configs_raise_as_in_comlrl(comlrl, fields, message):
    with pytest.raises(ValueError):  # CoMLRL refuses them too
        comlrl.marlhf.MARLHFConfig(**fields)
    with pytest.raises(ValueError, match=message):
        MARLHFConfig(**fields, report_to="none")


@pytest.mark.parametrize(
    ("fields", "error", "message"),
    [
        (dict(collaboration_mode="centralized", rl_algorithm="iac"), NotImplementedError, "centralized"),
        (dict(critic_model_name="x"), ValueError, "critic_model_name"),
        (dict(dpo_beta=0.5), ValueError, "dpo_beta"),
        (dict(rl_algorithm="marloo", advantage_mode="max"), ValueError, "maremax"),
        (dict(num_turns=2), ValueError, "num_turns=1"),
        (dict(joint_mode="cross"), ValueError, "joint_mode='aligned'"),
    ],
)
def test_unsupported_settings_raise_with_the_fix(fields, error, message):
    with pytest.raises(error, match=message):
        MARLHFConfig(**fields, report_to="none")


def test_a_reward_model_that_does_not_fit_raises_at_construction(tmp_path):
    # A head trained on another backbone (hidden size 64) next to a backbone of hidden size 48.
    llama = tmp_path / "llama_rm"
    shutil.copytree(tiny_model_path("tiny-llama"), llama)
    our_rm().save_pretrained(str(tmp_path / "qwen_rm"))
    shutil.copy(tmp_path / "qwen_rm" / REWARD_HEAD_FILE, llama / REWARD_HEAD_FILE)
    args = dict(output_dir=str(tmp_path / "out"), report_to="none", eval_interval=0, max_new_tokens=2)
    with pytest.raises(ValueError, match="reward head"):
        MARLHFTrainer(
            agent_model=tiny_model_path(),
            reward_func=constant_reward,
            args=MARLHFConfig(reward_model_name=str(llama), **args),
            train_dataset=Dataset.from_dict({"prompt": ["Hi"]}),
        )
    # Another vocabulary and size is fine: the reward model reads text.
    trainer = MARLHFTrainer(
        agent_model=tiny_model_path(),
        reward_func=constant_reward,
        args=MARLHFConfig(reward_model_name=tiny_model_path("tiny-llama"), **args),
        train_dataset=Dataset.from_dict({"prompt": ["Hi"]}),
    )
    assert trainer.reward_model.reward_head.in_features == 48

    class NoHidden(nn.Module):
        config = PretrainedConfig()

        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(2, 2)

    with pytest.raises(ValueError, match="hidden size"):
        JointRewardModel(NoHidden())
    with pytest.raises(ValueError, match="critic_model"):
        MARLHFTrainer(
            agent_model=tiny_model_path(), reward_func=constant_reward, critic_model="x", args=MARLHFConfig(**args)
        )


def length_ratio(completions1, completions2):
    return [min(len(b) / max(len(a), 1), 2.0) for a, b in zip(completions1, completions2)]


def test_checkpoints_hold_the_reward_model_and_resume_reuses_it(tmp_path):
    def make(output: str):
        config = MARLHFConfig(
            output_dir=output, report_to="none", num_train_epochs=2, max_new_tokens=4, num_generations=2,
            preference_num_candidates=4, rollout_buffer_size=2, eval_interval=0, logging_steps=1,
            reward_learning_rate=1e-3,
        )  # fmt: skip
        data = Dataset.from_dict({"prompt": ["Write a title:", "Name a planet:"]})
        return MARLHFTrainer(agent_model=tiny_model_path(), reward_func=length_ratio, args=config, train_dataset=data)

    first = make(str(tmp_path / "a"))
    first.train(checkpoint_dir=str(tmp_path / "ck"))
    checkpoint = tmp_path / "ck" / "checkpoint-1"
    assert (checkpoint / "reward_model" / REWARD_HEAD_FILE).is_file() and (checkpoint / "agent_0").is_dir()
    resumed = make(str(tmp_path / "b"))
    assert not torch.equal(resumed.reward_model.reward_head.weight, first.reward_model.reward_head.weight)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert resumed.preference_pairs == [] and resumed.state.global_step == 2  # no pairs drawn, one step left
    torch.testing.assert_close(resumed.reward_model.state_dict(), first.reward_model.state_dict())
