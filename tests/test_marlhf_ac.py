"""MARLHF's actor-critic back-ends (`rl_algorithm="maac"`/`"iac"`, `multiagent_trl.comlrl.marlhf`): CoMLRL MARLHF
scripts with only their imports changed, online rewards from the reward model and evaluation on the task reward, the
critics and the agents trained, the critic settings reaching the online trainer's critics, and the checks.
"""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset
from peft import LoraConfig
from transformers import AutoModelForCausalLM

from multiagent_trl import IACTrainer, MAACTrainer, MARLHFConfig, MARLHFTrainer
from multiagent_trl.actor_critic.value_model import CausalLMWithValueHead
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


@pytest.fixture(scope="module")
def maac_run(tmp_path_factory):
    """A MAAC run, with the initial critic's weights recorded when the online trainer builds it."""
    initial = {}
    original = MARLHFTrainer._actor_critic_trainer

    def recording(self):
        trainer = original(self)
        initial["critic"] = snapshot(trainer.model.critics[0])
        return trainer

    MARLHFTrainer._actor_critic_trainer = recording
    try:
        trainer = run(tmp_path_factory.mktemp("maac"), "maac", critic_type="q")
    finally:
        MARLHFTrainer._actor_critic_trainer = original
    return trainer, initial["critic"]


def test_maac_script_trains_the_agents_and_a_joint_critic(maac_run):
    trainer, initial_critic = maac_run
    online = trainer.online_trainer
    assert isinstance(online, MAACTrainer) and online.args.joint_critic
    assert online.args.critic_type == "q" and len(online.model.critics) == 1
    # 4 items, 2 per buffer (4 samples per agent): two optimizer steps, copied back.
    assert online.state.global_step == trainer.state.global_step == 2
    # The same agents: the host's team modules are the online trainer's, and they trained.
    assert all(a is b for a, b in zip(trainer.model.models(), online.model.models()))
    initial = snapshot(AutoModelForCausalLM.from_pretrained(tiny_model_path()))
    for i, agent in enumerate(trainer.model.models()):
        assert changed(initial, agent), f"agent_{i} did not change"
    assert changed(initial_critic, online.model.critics[0]), "the critic did not change"
    # The reward-model stage ran first and is logged in the online phase's first log.
    first = trainer.state.log_history[0]
    assert first["reward_model/pairs"] == len(trainer.preference_pairs) > 0


def test_online_rewards_are_the_reward_models_scores(maac_run):
    trainer, _ = maac_run
    online = trainer.online_trainer
    logged = [h for h in online.state.log_history if "reward" in h]
    assert logged and all(h["reward"] == pytest.approx(h["rewards/joint_reward_model/mean"]) for h in logged)
    assert all("rewards/length_reward/mean" not in h for h in logged)
    table = online._logs  # the last batch's completions: each joint sample's reward is the RM's raw score
    completions = list(zip(table["extra"]["agent_0/completion"], table["extra"]["agent_1/completion"]))
    prompts = [(p, "Expand: " + p) for p in table["prompt"]]
    rewards = list(table["rewards"]["joint_reward_model"])
    assert len(rewards) == 4
    with torch.no_grad():
        scores = trainer.reward_model(prompts=prompts, completions=completions)
    assert rewards == pytest.approx(scores, abs=1e-5)


def test_each_online_phase_gets_a_fresh_critic(maac_run):
    trainer, initial_critic = maac_run
    trained = trainer.online_trainer.model.critics[0]
    fresh = trainer._actor_critic_trainer().model.critics[0]
    assert fresh is not trained
    # The backbone is the pretrained model again (the head is drawn anew), not the trained critic.
    pretrained = snapshot(AutoModelForCausalLM.from_pretrained(tiny_model_path()))
    assert not changed(pretrained, fresh.model)
    assert changed(snapshot(trained.model), fresh.model)


def test_evaluation_uses_the_task_reward(maac_run):
    trainer, _ = maac_run
    metrics = trainer.online_trainer.evaluate()
    assert "eval_rewards/length_reward/mean" in metrics and "eval_rewards/joint_reward_model/mean" not in metrics
    rows = trainer.online_trainer._logs
    completions = list(zip(rows["extra"]["agent_0/completion"], rows["extra"]["agent_1/completion"]))
    expected = [3.0 * min(len(b) / max(len(a), 1), 2.0) for a, b in completions]  # the processor (x3) applied
    assert list(rows["rewards"]["length_reward"]) == pytest.approx(expected)
    # The MARLHF trainer's own evaluation (MAGRPO's) scores the trained team with the task reward too.
    host = trainer.evaluate()
    assert "eval_rewards/length_reward/mean" in host and "eval_rewards/joint_reward_model/mean" not in host


def test_iac_script_with_value_heads_on_the_agents(tmp_path):
    trainer = run(tmp_path, "iac", use_separate_critic=False, value_head_hidden_dim=8, eval_interval=1)
    online = trainer.online_trainer
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
    online = trainer.online_trainer
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
        reward_func=lambda a, b: [0.0] * len(a),
        args=args,
        train_dataset=DATASET,
        **kwargs,
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


def test_checkpoint_arguments_raise_with_an_actor_critic_back_end(tmp_path):
    trainer = build("maac", dict(output_dir=str(tmp_path)))
    with pytest.raises(NotImplementedError, match="Checkpoints"):
        trainer.train(checkpoint_dir=str(tmp_path / "ckpt"))
