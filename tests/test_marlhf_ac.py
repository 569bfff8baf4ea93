"""MARLHF's actor-critic back-ends (`rl_algorithm="maac"`/`"iac"`, `multiagent_trl.comlrl.marlhf`): CoMLRL MARLHF
scripts with only their imports changed build one trainer (the reward-model stage on IAC/MAAC), online rewards from the
reward model and evaluation on the task reward, the critics and the agents trained, the critic settings reaching the
critics, checkpoints and resume, and the checks.
"""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset
from peft import LoraConfig
from transformers import AutoModelForCausalLM, TrainerCallback

from multiagent_trl import IACTrainer, MAACTrainer, MARLHFConfig, MARLHFTrainer
from multiagent_trl.actor_critic.value_model import CausalLMWithValueHead
from multiagent_trl.preference.reward_model import REWARD_HEAD_FILE
from multiagent_trl.testing import tiny_model_path

from .conftest import changed, snapshot
from .test_actor_critic import run_script

MARLHF_AC_SCRIPT = """
from datasets import Dataset
from comlrl.trainers.preference import MARLHFConfig, MARLHFTrainer


def length_reward(completions1, completions2):
    return [min(len(b) / max(len(a), 1), 2.0) for a, b in zip(completions1, completions2)]


def main(model_path, output_dir, algorithm, extra, trainer_extra):
    dataset = Dataset.from_dict({"prompt": ["Write a title:", "Name a planet:", "Pick a word:", "Say hi:"]})
    config = MARLHFConfig(
        output_dir=output_dir, num_agents=2, num_train_epochs=1, agent_learning_rate=1e-3,
        max_new_tokens=5, rl_algorithm=algorithm, num_generations=2,
        preference_num_candidates=4, preference_pairs_per_sample=2, reward_learning_rate=1e-4,
        reward_train_batch_size=2, rollout_buffer_size=4, logging_steps=1, reward_model_device=None,
        **{"eval_interval": 0, **extra},
    )
    trainer = MARLHFTrainer(
        agent_model=model_path,
        num_agents=2,
        reward_func=length_reward,
        reward_processor=lambda x: 3.0 * x,
        formatters=[lambda item: item["prompt"], lambda item: "Expand: " + item["prompt"]],
        args=config,
        train_dataset=dataset,
        eval_dataset=dataset,
        **trainer_extra,
    )
    trainer.verbose = False
    trainer.train()
    return trainer
"""

OURS = {
    "from comlrl.trainers.preference import MARLHFConfig, MARLHFTrainer": (
        "from multiagent_trl.comlrl import MARLHFConfig, MARLHFTrainer"
    )
}


def run(tmp_path, algorithm: str, trainer_extra: dict | None = None, **extra):
    torch.manual_seed(0)
    path, out = tiny_model_path(), str(tmp_path / "out")
    return run_script(MARLHF_AC_SCRIPT, OURS, path, out, algorithm, extra, trainer_extra or {})


class RecordCritic(TrainerCallback):
    """The critic's weights when `Trainer.train` starts (after the reward-model stage)."""

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.initial = snapshot(model.critics[0])


@pytest.fixture(scope="module")
def maac_run(tmp_path_factory):
    """A MAAC run, with the critic's weights recorded when training starts."""
    record = RecordCritic()
    trainer = run(tmp_path_factory.mktemp("maac"), "maac", dict(callbacks=[record]), critic_type="q")
    return trainer, record.initial


def test_maac_script_trains_the_agents_and_a_joint_critic(maac_run):
    trainer, initial_critic = maac_run
    # One trainer: the reward-model stage on the MAAC translation, no child trainer.
    assert isinstance(trainer, MAACTrainer) and trainer.args.joint_critic
    assert trainer.args.critic_type == "q" and len(trainer.model.critics) == 1
    assert trainer.marlhf_config.rl_algorithm == "maac" and not hasattr(trainer, "online_trainer")
    # 4 items, 2 per buffer (4 samples per agent): two optimizer steps.
    assert trainer.state.global_step == 2
    initial = snapshot(AutoModelForCausalLM.from_pretrained(tiny_model_path()))
    for i, agent in enumerate(trainer.model.models()):
        assert changed(initial, agent), f"agent_{i} did not change"
    assert changed(initial_critic, trainer.model.critics[0]), "the critic did not change"
    # The reward-model stage ran first and is logged in the online phase's first log.
    first = trainer.state.log_history[0]
    assert first["reward_model/pairs"] == len(trainer.preference_pairs) > 0


def test_online_rewards_are_the_reward_models_scores(maac_run):
    trainer, _ = maac_run
    logged = [h for h in trainer.state.log_history if "reward" in h]
    assert logged and all(h["reward"] == pytest.approx(h["rewards/joint_reward_model/mean"]) for h in logged)
    assert all("rewards/length_reward/mean" not in h for h in logged)
    table = trainer._logs  # the last batch's completions: each joint sample's reward is the RM's raw score
    completions = list(zip(table["extra"]["agent_0/completion"], table["extra"]["agent_1/completion"]))
    prompts = [(p, "Expand: " + p) for p in table["prompt"]]
    rewards = list(table["rewards"]["joint_reward_model"])
    assert len(rewards) == 4
    with torch.no_grad():
        scores = trainer.reward_model(prompts=prompts, completions=completions)
    assert rewards == pytest.approx(scores, abs=1e-5)


def test_the_critic_starts_from_the_pretrained_model(maac_run):
    trainer, initial_critic = maac_run
    # The critic's backbone is the agents' pretrained model when training starts (the head is new), then it trains.
    pretrained = AutoModelForCausalLM.from_pretrained(tiny_model_path()).state_dict()
    backbone = {k.removeprefix("model."): v for k, v in initial_critic.items() if k.startswith("model.")}
    assert backbone and backbone.keys() <= pretrained.keys()  # the critic's model has no LM head
    assert all(torch.equal(v, pretrained[k]) for k, v in backbone.items())
    assert changed(snapshot(AutoModelForCausalLM.from_pretrained(tiny_model_path())), trainer.model.critics[0].model)


def test_evaluation_uses_the_task_reward(maac_run):
    trainer, _ = maac_run
    metrics = trainer.evaluate()
    assert "eval_rewards/length_reward/mean" in metrics and "eval_rewards/joint_reward_model/mean" not in metrics
    rows = trainer._logs
    completions = list(zip(rows["extra"]["agent_0/completion"], rows["extra"]["agent_1/completion"]))
    expected = [3.0 * min(len(b) / max(len(a), 1), 2.0) for a, b in completions]  # the processor (x3) applied
    assert list(rows["rewards"]["length_reward"]) == pytest.approx(expected)


def test_iac_script_with_value_heads_on_the_agents(tmp_path):
    trainer = run(tmp_path, "iac", use_separate_critic=False, value_head_hidden_dim=8, eval_interval=1)
    online = trainer  # CoMLRL's child trainer is this one trainer here
    assert isinstance(online, IACTrainer) and not isinstance(online, MAACTrainer)
    args = online.args
    assert args.critic_kind == "head" and not args.joint_critic
    assert args.critic_value_head_hidden_dim == 8 and args.comlrl_value_clip_range == 0.2
    assert args.critic_learning_rate == args.learning_rate == 1e-3  # None: the agents' learning rate
    assert trainer.state.global_step == 2
    initial = snapshot(AutoModelForCausalLM.from_pretrained(tiny_model_path()))
    for i, (agent, critic) in enumerate(zip(trainer.model.models(), online.model.critics)):
        assert changed(initial, agent), f"agent_{i} did not change"
        # A value head on the agent: the critic wraps the agent's own model, with a hidden layer of 8.
        assert isinstance(critic, CausalLMWithValueHead) and critic.model is agent
        assert critic.value_head.pre_projection[0].out_features == 8
    logged = [h for h in online.state.log_history if "reward" in h]
    assert logged and all("rewards/joint_reward_model/mean" in h for h in logged)
    # Evaluation during training (before it and after each step): the task reward (its processor applied inside the
    # item reward, as CoMLRL's actor-critic applies it; `test_evaluation_uses_the_task_reward` checks the values).
    evals = [h for h in online.state.log_history if "eval_reward" in h]
    assert len(evals) == 3
    for h in evals:
        assert "eval_rewards/joint_reward_model/mean" not in h
        assert h["eval_reward"] == pytest.approx(h["eval_rewards/length_reward/mean"])


def test_iac_separate_critics_from_critic_model_name(tmp_path):
    other, samples = tiny_model_path(seed=1), []

    def metrics_callback(rollouts):
        samples.append(rollouts)
        return {"custom/completions": len(rollouts)}

    extra = dict(metrics_callback=metrics_callback, model_config={"critic_model_kwargs": {"dtype": "bfloat16"}})
    trainer = run(tmp_path, "iac", extra, critic_model_name=other, critic_learning_rate=5e-4, value_loss_coef=0.3)
    online = trainer
    # metrics_callback reaches the online trainer: once per item, each agent's 2 samples.
    assert len(samples) == 4 and all(len(r) == 4 for r in samples)
    assert any(h.get("custom/completions") == 4 for h in online.state.log_history)
    # model_config["critic_model_kwargs"] loads the critics (bf16), the agents keep their dtype.
    assert all(c.model.dtype == torch.bfloat16 for c in online.model.critics)
    assert all(a.dtype == torch.float32 for a in trainer.model.models())
    assert online.args.critic_kind == "model" and len(online.model.critics) == 2
    assert online.args.critic_learning_rate == 5e-4 and online.args.value_loss_coef == 0.3
    source = snapshot(AutoModelForCausalLM.from_pretrained(other))
    for critic in online.model.critics:
        assert critic.model not in trainer.model.models()
        assert changed(source, critic.model), "a critic did not train"


DATASET = Dataset.from_dict({"prompt": ["a", "b"]})


def build(algorithm="maac", config=None, **kwargs):
    args = MARLHFConfig(rl_algorithm=algorithm, report_to="none", reward_model_device=None, **(config or {}))
    return MARLHFTrainer(
        agent_model=tiny_model_path(),
        args=args,
        train_dataset=DATASET,
        **{"reward_func": lambda a, b: [0.0] * len(a), **kwargs},
    )


@pytest.mark.parametrize(
    ("config", "error", "message"),
    [
        (dict(rl_algorithm="maac", use_separate_critic=False), ValueError, "joint critic"),
        (dict(rl_algorithm="maac", value_head_hidden_dim=4), ValueError, "value_head_hidden_dim"),
        (dict(rl_algorithm="iac", advantage_mode="max"), ValueError, "drop `advantage_mode`"),
        (dict(rl_algorithm="iac", num_generations=0), ValueError, "num_generations"),
        (dict(rl_algorithm="iac", rollout_buffer_size=4, train_batch_size=3), ValueError, "multiple"),
        (dict(rl_algorithm="iac", reference_kl_enabled=True), NotImplementedError, "reference_kl_enabled"),
        (dict(rl_algorithm="magrpo", critic_type="q"), ValueError, "critic_type"),
        (dict(rl_algorithm="iac", use_separate_critic=False, critic_model_name="x"), ValueError, "drop `critic_model"),
    ],
)
def test_bad_actor_critic_settings_raise_at_construction(config, error, message):
    with pytest.raises(error, match=message):
        MARLHFConfig(report_to="none", **config)


def test_comlrl_defaults_map_onto_the_actor_critic_config():
    # CoMLRL's defaults (num_generations=4, rollout_buffer_size=2): its child fills the buffer an item at a time.
    config = MARLHFConfig(rl_algorithm="maac", report_to="none").actor_critic_config()
    assert (config.num_generations, config.rollout_buffer_size, config.num_turns) == (4, 4, 1)
    assert config.joint_critic and config.critic_learning_rate == config.learning_rate
    config = MARLHFConfig(rl_algorithm="maac", critic_value_head_hidden_dim=16, report_to="none")
    assert config.actor_critic_config().critic_value_head_hidden_dim == 16


def test_actor_critic_num_generations_may_be_one():
    config = MARLHFConfig(rl_algorithm="iac", num_generations=1, rollout_buffer_size=2, report_to="none")
    assert config.actor_critic_config().num_generations == 1
    assert config.actor_critic_config().critic_learning_rate == config.agent_learning_rate


@pytest.mark.parametrize(
    ("algorithm", "config", "kwargs", "message"),
    [
        ("iac", dict(use_separate_critic=False), dict(critic_model=tiny_model_path()), "use_separate_critic=True"),
        ("maac", {}, dict(critics=[tiny_model_path(), tiny_model_path()]), "one joint critic"),
        ("iac", {}, dict(critics=[tiny_model_path()]), "one critic per agent"),
        ("magrpo", {}, dict(critic_model=tiny_model_path()), "critic_model"),
        ("magrpo", {}, dict(metrics_callback=lambda samples: {}), "metrics_callback"),
    ],
)
def test_bad_critic_arguments_raise_at_construction(algorithm, config, kwargs, message):
    with pytest.raises(ValueError, match=message):
        build(algorithm, config, **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(peft_config=LoraConfig(r=2, target_modules="all-linear")), "peft_config"),
        (dict(eval_logger=lambda **kw: [], eval_aggregator=lambda metrics, **kw: {}), "eval_logger"),
    ],
)
def test_unsupported_arguments_raise_with_an_actor_critic_back_end(kwargs, message):
    with pytest.raises(NotImplementedError, match=message):
        build("iac", **kwargs)


def test_candidates_are_ranked_per_joint_sample_with_the_processor(tmp_path):
    # CoMLRL's MARLHF ranks the candidates by its MAGRPO host's reward: one call per joint sample (here a reward that
    # returns one number per call), then `reward_processor`; K=3 candidates need not split into items of G=2.
    def gap(completions1, completions2):
        return float(sum(len(b) - len(a) for a, b in zip(completions1, completions2)))

    config = dict(
        num_generations=2, preference_num_candidates=3, preference_pairs_per_sample=None, pair_selection="all",
        max_new_tokens=8, rollout_buffer_size=2,
    )  # fmt: skip
    trainer = build("maac", config, reward_func=gap, reward_processor=lambda x: x + 100.0)
    trainer.train_reward_stage()
    assert trainer.preference_pairs
    for pair in trainer.preference_pairs:
        chosen, rejected = ([(len(c[1]) - len(c[0]))] for c in (pair.chosen, pair.rejected))
        assert (pair.chosen_reward, pair.rejected_reward) == (chosen[0] + 100.0, rejected[0] + 100.0)
        assert pair.chosen_reward > pair.rejected_reward


def length_ratio(completions1, completions2):
    return [min(len(b) / max(len(a), 1), 2.0) for a, b in zip(completions1, completions2)]


def test_checkpoints_hold_critic_and_reward_model_and_resume_restores_both(tmp_path):
    def make(output: str):
        config = MARLHFConfig(
            output_dir=output, report_to="none", rl_algorithm="maac", num_train_epochs=2, max_new_tokens=4,
            num_generations=2, preference_num_candidates=4, rollout_buffer_size=4, eval_interval=0,
            reward_learning_rate=1e-3, reward_model_device=None,
        )  # fmt: skip
        data = Dataset.from_dict({"prompt": ["Write a title:", "Name a planet:"]})
        return MARLHFTrainer(agent_model=tiny_model_path(), reward_func=length_ratio, args=config, train_dataset=data)

    first = make(str(tmp_path / "a"))
    first.train(checkpoint_dir=str(tmp_path / "ck"))  # a checkpoint per epoch, one step each
    for name in ("checkpoint-1", "checkpoint-2"):
        checkpoint = tmp_path / "ck" / name
        assert (checkpoint / "reward_model" / REWARD_HEAD_FILE).is_file() and (checkpoint / "critic").is_dir()
    # From the last checkpoint: nothing left to train, the critic and the reward model are the checkpoint's.
    done = make(str(tmp_path / "b"))
    assert not torch.equal(done.reward_model.reward_head.weight, first.reward_model.reward_head.weight)
    done.train(resume_from_checkpoint=str(tmp_path / "ck" / "checkpoint-2"))
    assert done.state.global_step == 2 and done.preference_pairs == [] and done.reward_model_history == []
    torch.testing.assert_close(done.reward_model.state_dict(), first.reward_model.state_dict())
    torch.testing.assert_close(done.model.critics[0].state_dict(), first.model.critics[0].state_dict())
    # From the first: one epoch left, trained on the restored reward model (no pairs drawn again).
    resumed = make(str(tmp_path / "c"))
    resumed.train(resume_from_checkpoint=str(tmp_path / "ck" / "checkpoint-1"))
    assert resumed.state.global_step == 2 and resumed.preference_pairs == []
    torch.testing.assert_close(resumed.reward_model.state_dict(), first.reward_model.state_dict())
