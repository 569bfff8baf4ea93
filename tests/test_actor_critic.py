"""The actor-critic trainers (`multiagent_trl.actor_critic`, `multiagent_trl.comlrl.actor_critic`): against CoMLRL
1.4.3 itself (the same weights after one update), CoMLRL-style scripts with only their imports changed, and the
native `ActorCriticTrainer` over a table of critics (separate, joint, value head, LoRA adapter).

The parity tests replace both libraries' sampling with one deterministic `generate` (completions drawn from the
prompt's token ids, the agent and the completion's index, ending at the end token or at `max_new_tokens` as real
decoding does), so that both train on the same completions: the update is then compared weight by weight.
"""

from __future__ import annotations

import os
import random
import re
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from peft import PeftModel
from transformers import AutoModelForCausalLM, TrainerCallback

from multiagent_trl import IACConfig, IACTrainer, MAACConfig, MAACTrainer
from multiagent_trl.actor_critic.config import ActorCriticConfig
from multiagent_trl.actor_critic.trainer import ActorCriticTrainer
from multiagent_trl.actor_critic.value_model import VALUE_HEAD_FILE, AdapterValueModel, CausalLMWithValueHead
from multiagent_trl.comlrl.actor_critic import item_reward
from multiagent_trl.testing import save_model_folder, tiny_model_path, tiny_tokenizer

from .conftest import changed, launch_two_processes, lora_config, small_args, snapshot
from .parity import FORWARD_REL, GRADIENT_REL, TINY, assert_close_to_scale, assert_same_update, weight_rounding

PROMPTS = ["Name a red fruit:", "Name a sea fish:"]  # the same length: no padding in TRL's batches
MAX_NEW = 5
LR = 1e-3


def fake_generate(agent: int, eos: int, pad: int):
    """A deterministic `generate` for agent `agent`, called as CoMLRL calls it (one prompt, `num_return_sequences`)
    or as TRL does (a batch of prompts, each repeated): the k-th completion of a prompt is the same in both."""

    def generate(input_ids=None, attention_mask=None, **kwargs):
        count = kwargs.get("num_return_sequences") or 1
        mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
        rows, seen = [], {}
        for row, row_mask in zip(input_ids, mask):
            prompt = tuple(row[row_mask.bool()].tolist())
            for _ in range(count):
                k = seen[prompt] = seen.get(prompt, -1) + 1
                rng = random.Random(hash((agent, prompt, k)))
                # As decoding stops: at the end token (then padding), or after MAX_NEW tokens.
                tokens = [rng.randint(97, 122) for _ in range(rng.randint(0, MAX_NEW - 1))] + [eos]
                if rng.random() < 0.3:
                    tokens = [rng.randint(97, 122) for _ in range(MAX_NEW)]
                rows.append(row.tolist() + tokens + [pad] * (MAX_NEW - len(tokens)))
        return torch.tensor(rows, device=input_ids.device)

    return generate


def parity_reward(completions1, completions2):
    """One value per joint sample, from both agents' texts."""
    return [float(len(a)) - 0.7 * len(b) + 0.3 * a.count("e") for a, b in zip(completions1, completions2)]


def solo_reward(completions1):
    return [float(len(a)) + 0.3 * a.count("e") for a in completions1]


@pytest.fixture(scope="module")
def comlrl():
    pytest.importorskip("comlrl", reason="the parity tests need comlrl==1.4.3 (pip install -e '.[dev]')")
    from comlrl.trainers import actor_critic

    return actor_critic


def build_pair(comlrl, family: str, tmp_path, num_agents: int = 2, transition=None, **fields):
    """The same CoMLRL settings under CoMLRL and under our port, generation replaced by `fake_generate`."""
    settings = dict(
        num_agents=num_agents,
        num_turns=fields.pop("num_turns", 1),
        num_generations=fields.pop("num_generations", 2),
        rollout_buffer_size=4,
        max_new_tokens=MAX_NEW,
        num_train_epochs=1,
        agent_learning_rate=LR,
        critic_learning_rate=2 * LR,
        temperature=0.6,  # sampling only: both score log-probabilities at temperature 1
        early_termination_threshold=None,
        **fields,
    )
    reward = parity_reward if num_agents == 2 else solo_reward
    dataset = Dataset.from_dict({"prompt": PROMPTS})
    critic = tiny_model_path(seed=1)
    separate = fields.get("use_separate_critic", True)
    trainers = []
    for config_cls, trainer_cls, extra in (
        (getattr(comlrl, f"{family}Config"), getattr(comlrl, f"{family}Trainer"), {}),
        (
            IACConfig if family == "IAC" else MAACConfig,
            IACTrainer if family == "IAC" else MAACTrainer,
            dict(report_to="none", generation_mode="per_agent", output_dir=str(tmp_path / "ours")),
        ),
    ):
        torch.manual_seed(0)
        kwargs = dict(critic_model=critic) if separate else {}
        trainer = trainer_cls(
            agent_model=tiny_model_path(),
            reward_func=reward,
            args=config_cls(**settings, **extra),
            train_dataset=dataset,
            external_transition=transition,
            **kwargs,
        )
        trainer.verbose = False
        trainers.append(trainer)
    theirs, ours = trainers
    tokenizer = ours.processing_class
    for i in range(num_agents):
        generate = fake_generate(i, tokenizer.eos_token_id, tokenizer.pad_token_id)
        theirs.agents[i].model.generate = generate
        ours.model.agents[i].generate = generate
    # The same starting value heads (each library draws its own at random).
    their_heads = [c.value_head for c in theirs.critics] if theirs.critics else [a.value_head for a in theirs.agents]
    for critic_ours, head in zip(ours.critics, their_heads):
        critic_ours.value_head.load_state_dict(head.state_dict())
    return theirs, ours


def pairs_of(theirs, ours, critics: bool = True):
    """(name, our module, CoMLRL's module) for every actor, and every critic (or value head on an agent)."""
    pairs = [(f"agent_{i}", ours.model.agents[i], agent.model) for i, agent in enumerate(theirs.agents)]
    if critics:
        if theirs.critics:
            pairs += [(f"critic_{k}", c, t) for k, (c, t) in enumerate(zip(ours.critics, theirs.critics))]
        else:
            pairs += [
                (f"head_{i}", c.value_head, a.value_head) for i, (c, a) in enumerate(zip(ours.critics, theirs.agents))
            ]
    return pairs


def moved(module, path: str) -> float:
    """The largest change of `module`'s weights from the model saved at `path`."""
    start = AutoModelForCausalLM.from_pretrained(path)
    return max((p.detach() - q).abs().max().item() for p, q in zip(module.parameters(), start.parameters()))


# ---- 1. the same weights as CoMLRL 1.4.3 after one update


@pytest.mark.parametrize(
    "fields",
    [
        dict(critic_type="v"),
        dict(critic_type="q"),
        dict(critic_type="v", use_separate_critic=False),  # a value head on each agent, clipped value loss
    ],
    ids=["separate-v", "separate-q", "head-v"],
)
def test_iac_update_matches_comlrl(comlrl, tmp_path, fields):
    theirs, ours = build_pair(comlrl, "IAC", tmp_path, **fields)
    theirs.train()
    ours.train()
    assert ours.state.global_step == 1  # one buffer of 4 samples per agent: one update, as CoMLRL's
    assert moved(ours.model.agents[0], tiny_model_path()) > 0.5 * LR
    assert_same_update(pairs_of(theirs, ours), LR)


def test_maac_update_matches_comlrl(comlrl, tmp_path):
    """One agent: CoMLRL steps the joint critic once per agent, so with one agent the critic matches too."""
    theirs, ours = build_pair(comlrl, "MAAC", tmp_path, num_agents=1, critic_type="q")
    theirs.train()
    ours.train()
    assert_same_update(pairs_of(theirs, ours), LR)


def test_maac_actors_match_comlrl_with_two_agents(comlrl, tmp_path):
    """Two agents: the actors match; CoMLRL steps the critic once per agent, here once on the agents' mean loss."""
    theirs, ours = build_pair(comlrl, "MAAC", tmp_path, critic_type="v")
    theirs.train()
    ours.train()
    assert_same_update(pairs_of(theirs, ours, critics=False), LR)
    assert moved(ours.critics[0], tiny_model_path(seed=1)) > 0.5 * LR


def digit_transition(prompt, agent_completions, num_agents, prompt_history_per_agent, response_history_per_agent):
    """Turn 2's prompts tell each agent its length (one digit: every row keeps one prompt length, no padding)."""
    return [f"{prompt} [{len(c) % 10}]" for c in agent_completions]


def comlrl_episodes(theirs, items):
    """CoMLRL's rollouts of `items`, their advantages prepared as its buffer does (per agent, per turn)."""
    samples = [s for item in items for s in theirs._collect_rollouts(item)]
    for group in {(s.agent_idx, s.metadata["turn_idx"]) for s in samples}:
        theirs._prepare_advantages([s for s in samples if (s.agent_idx, s.metadata["turn_idx"]) == group])
    return samples


@pytest.mark.parametrize(
    "family, fields",
    [("IAC", dict(critic_type="v")), ("IAC", dict(critic_type="q")), ("MAAC", dict(critic_type="v"))],
    ids=["iac-v", "iac-q", "maac-v"],
)
def test_two_turn_targets_and_advantages_match_comlrl(comlrl, tmp_path, family, fields):
    """Two turns on the same completions: each row's rollout value, TD target `r_1 + discount * V_old(turn 2)` (the
    last turn: its reward) and advantage (normalized per agent and turn over the buffer) equal CoMLRL's."""
    theirs, ours = build_pair(
        comlrl, family, tmp_path, num_turns=2, num_generations=1, discount=0.9, transition=digit_transition, **fields
    )
    items = [{"prompt": p} for p in PROMPTS]
    samples = comlrl_episodes(theirs, items)
    ours.model.train()
    batch = ours._generate_and_score_completions(items)
    for i in range(2):
        # Our rows: turn 1 of every item, then turn 2; CoMLRL's samples: item by item, turn by turn.
        their = sorted((s for s in samples if s.agent_idx == i), key=lambda s: s.metadata["turn_idx"])
        expected = {
            "old_values": [float(s.old_value) for s in their],
            "value_targets": [float(s.metadata["adv_target"]) for s in their],
            "advantages": [float(s.normalized_advantage) for s in their],
        }
        for key, values in expected.items():
            # Values and targets of order 1 from a forward (advantages: those, standardized): forward noise.
            assert_close_to_scale(
                batch[f"agent_{i}/{key}"].float().cpu(), torch.tensor(values), FORWARD_REL, atol=1e-6, msg=key
            )
        assert batch[f"agent_{i}/value_targets"][0] != batch[f"agent_{i}/value_targets"][2]  # not the reward alone


# ---- 2. CoMLRL-style scripts with only their imports changed

IAC_SCRIPT = """
from datasets import Dataset
from comlrl.trainers.actor_critic import IACConfig, IACTrainer


def length_reward(completions1, completions2):
    return [min(len(b) / max(len(a), 1), 2.0) for a, b in zip(completions1, completions2)]


def main(model_path, output_dir, callback_log):
    dataset = Dataset.from_dict({"prompt": ["Write a title:", "Name a planet:", "Pick a word:"] * 2})
    config = IACConfig(
        num_agents=2, num_turns=1, num_generations=2, rollout_buffer_size=4, max_new_tokens=6,
        num_train_epochs=1, agent_learning_rate=1e-4, critic_learning_rate=1e-4, critic_type="q",
        eval_interval=0, logging_steps=1,
    )
    trainer = IACTrainer(
        agent_model=model_path,
        critic_model=model_path,
        reward_func=length_reward,
        formatters=[lambda item: item["prompt"], lambda item: "Expand: " + item["prompt"]],
        args=config,
        train_dataset=dataset,
        metrics_callback=lambda samples: callback_log.append(samples) or {"samples": len(samples)},
    )
    trainer.verbose = False
    trainer.train()
    trainer.save_model(output_dir)
    return trainer
"""

MAAC_SCRIPT = """
from datasets import Dataset
from comlrl.trainers.actor_critic import MAACConfig, MAACTrainer
from comlrl.utils.reward_processor import RewardProcessors


def per_agent_reward(completions1, completions2):
    return [float(len(completions1[0])), float(len(completions2[0]))]  # one reward per agent


def main(model_path, output_dir, callback_log):
    dataset = Dataset.from_dict({"prompt": ["Write a title:", "Name a planet:"]})
    config = MAACConfig(
        num_agents=2, num_turns=1, num_generations=1, rollout_buffer_size=2, max_new_tokens=6,
        num_train_epochs=1, agent_learning_rate=1e-4, critic_learning_rate=1e-4, critic_type="v",
        eval_interval=0,
    )
    trainer = MAACTrainer(
        agent_model=model_path,
        critic_model=model_path,
        reward_func=per_agent_reward,
        reward_processor=RewardProcessors.scale(0.1),
        args=config,
        train_dataset=dataset,
        model_config={"critic_value_head_hidden_dim": 8},
    )
    trainer.verbose = False
    trainer.train()
    trainer.save_model(output_dir)
    return trainer
"""


def run_script(source: str, imports: dict[str, str], *args):
    for theirs, ours in imports.items():
        assert source.count(theirs) == 1
        source = source.replace(theirs, ours)
    namespace = {"__name__": "ac_script"}
    exec(compile(source, "ac_script", "exec"), namespace)
    return namespace["main"](*args)


OURS_IAC = {
    "from comlrl.trainers.actor_critic import IACConfig, IACTrainer": (
        "from multiagent_trl import IACConfig, IACTrainer"
    )
}
OURS_MAAC = {
    "from comlrl.trainers.actor_critic import MAACConfig, MAACTrainer": (
        "from multiagent_trl import MAACConfig, MAACTrainer"
    ),
    "from comlrl.utils.reward_processor import RewardProcessors": "from multiagent_trl import RewardProcessors",
}


def test_iac_script_runs_with_only_its_imports_changed(tmp_path, comlrl):
    log: list = []
    trainer = run_script(IAC_SCRIPT, OURS_IAC, tiny_model_path(), str(tmp_path / "ours"), log)
    assert trainer.state.global_step == 3  # 6 items, 2 items (4 samples per agent) per buffer
    # metrics_callback: once per item, with the item's samples of both agents, as CoMLRL calls it.
    assert len(log) == 6 and all(len(samples) == 4 for samples in log)
    first = log[0]
    assert [s.agent_idx for s in first] == [0, 0, 1, 1]
    assert [s.metadata["generation_idx"] for s in first] == [0, 1, 0, 1]
    assert first[2].prompt == "Expand: " + first[0].prompt
    assert first[0].metadata["batch_item"]["prompt"] == first[0].prompt
    logged = trainer.state.log_history[0]
    assert {"turn_1/reward_mean", "turn_1/expected_return", "samples", "agent_1/value_loss"} <= set(logged)
    for i in range(2):  # CoMLRL's layout: agent_i/ and agent_i/critic/ with value_head.pt
        agent_dir = tmp_path / "ours" / f"agent_{i}"
        assert AutoModelForCausalLM.from_pretrained(agent_dir).config.model_type == "qwen2"
        critic = CausalLMWithValueHead.from_pretrained(str(agent_dir / "critic"))
        assert critic.value_head is not None
    # The same script under CoMLRL 1.4.3 writes the same layout.
    run_script(IAC_SCRIPT, {}, tiny_model_path(), str(tmp_path / "theirs"), [])
    for i in range(2):
        assert (tmp_path / "theirs" / f"agent_{i}" / "critic" / VALUE_HEAD_FILE).is_file()


def test_maac_script_runs_with_only_its_imports_changed(tmp_path, comlrl):
    trainer = run_script(MAAC_SCRIPT, OURS_MAAC, tiny_model_path(), str(tmp_path / "ours"), [])
    assert trainer.state.global_step == 1
    assert trainer.critics[0].value_head.hidden_dim == 8  # from model_config, as CoMLRL reads it
    files = {p.relative_to(tmp_path / "ours").as_posix() for p in (tmp_path / "ours").rglob("*")}
    assert {"agent_0/config.json", "agent_1/config.json", "critic/config.json", f"critic/{VALUE_HEAD_FILE}"} <= files
    run_script(MAAC_SCRIPT, {}, tiny_model_path(), str(tmp_path / "theirs"), [])
    assert (tmp_path / "theirs" / "critic" / VALUE_HEAD_FILE).is_file()


TWO_TURN_SCRIPT = """
from datasets import Dataset
from comlrl.trainers.actor_critic import MAACConfig, MAACTrainer


SEEN_PROMPTS = []


def length_reward(completions1, completions2, *, prompts=None):
    SEEN_PROMPTS.append(prompts)  # CoMLRL passes each turn's prompts, one per agent
    return [min(len(b) / max(len(a), 1), 2.0) for a, b in zip(completions1, completions2)]


def feedback(prompt, agent_completions, num_agents, prompt_history_per_agent, response_history_per_agent):
    return [f"You wrote {len(c)} characters. Try again: {prompt}" for c in agent_completions]


def formatter(item):
    return "Task: " + item["prompt"] + " (first asked: " + item.get("_original_prompt", "now") + ")"


def main(model_path, output_dir, callback_log):
    dataset = Dataset.from_dict({"prompt": ["Write a title:", "Name a planet:", "Pick a word:", "Say hi:"]})
    config = MAACConfig(
        num_agents=2, num_turns=2, num_generations=1, rollout_buffer_size=4, max_new_tokens=6,
        num_train_epochs=1, agent_learning_rate=1e-4, critic_learning_rate=1e-4, discount=0.9,
        early_termination_threshold=None, eval_interval=0,
    )
    trainer = MAACTrainer(
        agent_model=model_path,
        critic_model=model_path,
        reward_func=length_reward,
        formatters=formatter,
        args=config,
        train_dataset=dataset,
        external_transition=feedback,
        metrics_callback=lambda samples: callback_log.append(samples) or {"samples": len(samples)},
    )
    trainer.verbose = False
    trainer.train()
    trainer.save_model(output_dir)
    callback_log.append(SEEN_PROMPTS)
    return trainer
"""


def test_two_turn_script_runs_with_only_its_imports_changed(tmp_path, comlrl):
    log: list = []
    imports = {
        "from comlrl.trainers.actor_critic import MAACConfig, MAACTrainer": OURS_MAAC[
            "from comlrl.trainers.actor_critic import MAACConfig, MAACTrainer"
        ]
    }
    trainer = run_script(TWO_TURN_SCRIPT, imports, tiny_model_path(), str(tmp_path / "ours"), log)
    assert trainer.state.global_step == 2  # 4 items, a buffer of 4 samples = 2 two-turn episodes
    # metrics_callback: once per item, with both turns of both agents, each turn's reward and reward-to-go.
    seen = log.pop()  # the prompts each reward call got: every turn's own, one per agent
    assert len(seen) == 8 and sum(p[0].startswith("Task: You wrote") for p in seen) == 4
    assert all(len(p) == 2 for p in seen)
    assert len(log) == 4 and all(len(samples) == 4 for samples in log)
    first = log[0]
    assert [(s.agent_idx, s.metadata["turn_idx"]) for s in first] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert first[0].prompt == "Task: Write a title: (first asked: now)"
    assert first[1].prompt.startswith("Task: You wrote ") and first[1].prompt.endswith("(first asked: Write a title:)")
    assert float(first[0].returns) == pytest.approx(float(first[0].reward) + float(first[1].reward))
    assert float(first[1].metadata["adv_target"]) == pytest.approx(float(first[1].reward))  # the last turn
    logged = trainer.state.log_history[0]
    assert {"turn_1/reward_mean", "turn_2/reward_mean", "turn_2/expected_return", "samples"} <= set(logged)
    assert (tmp_path / "ours" / "critic" / VALUE_HEAD_FILE).is_file()
    run_script(TWO_TURN_SCRIPT, {}, tiny_model_path(), str(tmp_path / "theirs"), [])  # the script is CoMLRL's
    assert (tmp_path / "theirs" / "critic" / VALUE_HEAD_FILE).is_file()


def test_one_agent_iac_saves_flat_like_comlrl(tmp_path, tiny_path, prompts_dataset):
    args = IACConfig(num_agents=1, num_turns=1, max_new_tokens=4, rollout_buffer_size=4, report_to="none")
    trainer = IACTrainer(agent_model=tiny_path, critic_model=tiny_path, reward_func=solo_reward, args=args)
    trainer.save_model(str(tmp_path / "flat"))
    assert (tmp_path / "flat" / "config.json").is_file()
    assert (tmp_path / "flat" / "critic" / VALUE_HEAD_FILE).is_file()


# ---- 3. the reward: CoMLRL's calls, once per dataset item


def test_evaluation_calls_the_reward_once_per_item_with_num_generations_above_one(tiny_path):
    # Evaluation samples one completion per item: each call gets that item's one completion per agent.
    calls = []

    def reward(completions1, completions2, **kwargs):
        calls.append((len(completions1), len(completions2), kwargs["batch_items"][0]["prompt"]))
        return [1.0] * len(completions1)

    dataset = Dataset.from_dict({"prompt": ["a", "b", "c"]})
    args = IACConfig(
        num_turns=1, num_generations=2, max_new_tokens=2, rollout_buffer_size=4, eval_num_samples=3, report_to="none"
    )
    trainer = IACTrainer(
        agent_model=tiny_path, critic_model=tiny_path, reward_func=reward, args=args, eval_dataset=dataset
    )
    metrics = trainer.evaluate()
    assert metrics["eval_reward"] == pytest.approx(1.0)
    assert sorted(calls) == [(1, 1, "a"), (1, 1, "b"), (1, 1, "c")]


def test_reward_is_called_once_per_item_with_lists_of_g():
    calls = []

    def reward(completions1, completions2, batch_items=None, prompts=None):
        calls.append((list(completions1), list(completions2), batch_items, prompts))
        return [1.0, 2.0, 3.0]  # one per generation

    rows = [{"prompt": "a"}] * 3 + [{"prompt": "b"}] * 3
    prompts = [("a!", "a?")] * 3 + [("b!", "b?")] * 3  # each joint sample's prompts, one per agent (this turn's)
    bound = item_reward(reward, lambda r: 10 * r, num_agents=2, num_generations=3)
    values = bound(prompts, list(zip("uvwxyz", "UVWXYZ")), batch_items=rows)
    assert values == [10.0, 20.0, 30.0] * 2
    assert calls[0] == (["u", "v", "w"], ["U", "V", "W"], [rows[0]], ["a!", "a?"])
    assert calls[1][0] == ["x", "y", "z"] and calls[1][3] == ["b!", "b?"]


@pytest.mark.parametrize(
    "returned, expected",
    [
        ([5.0], [5.0, 5.0, 5.0]),  # one value: every agent, every completion
        ([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]),  # one per generation
        ([1.0, 2.0], [[1.0, 2.0]] * 3),  # one per agent: per-agent rewards for the core
    ],
)
def test_reward_lengths_follow_comlrl(returned, expected):
    bound = item_reward(lambda c1, c2: returned, None, num_agents=2, num_generations=3)
    assert bound([("p", "p")] * 3, list(zip("abc", "def")), batch_items=[{"prompt": "p"}] * 3) == expected


def test_per_agent_rewards_read_per_generation_when_n_equals_g():
    """CoMLRL checks the per-generation length first: with N == G, N values are one per generation."""
    bound = item_reward(lambda c1, c2: [1.0, 2.0], None, num_agents=2, num_generations=2)
    assert bound([("p", "p")] * 2, list(zip("ab", "cd")), batch_items=[{"prompt": "p"}] * 2) == [1.0, 2.0]


def test_wrong_reward_length_raises():
    bound = item_reward(lambda c1, c2: [1.0] * 4, None, num_agents=2, num_generations=3)
    with pytest.raises(ValueError, match="returned 4 values for one item"):
        bound([("p", "p")] * 3, list(zip("abc", "def")), batch_items=[{"prompt": "p"}] * 3)


# ---- 4. CoMLRL's fields, defaults and checks


@pytest.mark.parametrize("name", ["IACConfig", "MAACConfig"])
def test_every_comlrl_field_is_accepted_with_its_default(comlrl, name):
    import dataclasses

    ours = {f.name: f for f in dataclasses.fields(IACConfig if name == "IACConfig" else MAACConfig)}
    for field in dataclasses.fields(getattr(comlrl, name)):
        theirs = field.default if field.default is not dataclasses.MISSING else field.default_factory()
        mine = ours[field.name].default
        assert mine == theirs, (field.name, mine, theirs)


def test_comlrl_fields_map_onto_the_core():
    config = IACConfig(num_turns=1, num_generations=2, rollout_buffer_size=8, train_batch_size=4, top_k=None)
    assert (config.per_device_train_batch_size, config.steps_per_generation, config.generation_batch_size) == (4, 2, 8)
    assert (config.learning_rate, config.critic_lr, config.max_completion_length, config.top_k) == (5e-6, 5e-6, 256, 0)
    assert (config.critic_kind, config.value_clip_range, config.comlrl_value_clip_range) == ("model", None, 0.2)
    assert (config.loss_type, config.weight_decay, config.lr_scheduler_type, config.max_grad_norm) == (
        "luspo",
        0.01,
        "constant",
        0.0,
    )
    head = IACConfig(num_turns=1, use_separate_critic=False, value_head_hidden_dim=16, critic_learning_rate=1.0)
    assert (head.critic_kind, head.value_clip_range, head.critic_value_head_hidden_dim, head.critic_lr) == (
        "head",
        0.2,
        16,
        5e-6,  # CoMLRL's head trains in the agent's optimizer
    )
    assert MAACConfig(num_turns=1).joint_critic
    # Two turns: CoMLRL's buffer of 4 samples holds 2 episodes; a step of 4 samples, 2 episodes.
    two = IACConfig(num_turns=2, rollout_buffer_size=4, train_batch_size=4)
    assert (two.per_device_train_batch_size, two.steps_per_generation, two.ended_return) == (2, 1, "reward")
    four = IACConfig(num_turns=4, rollout_buffer_size=1)  # CoMLRL's Minecraft: a buffer of one sample
    assert (four.per_device_train_batch_size, four.steps_per_generation) == (1, 1)


@pytest.mark.parametrize(
    "config_cls, fields, message",
    [
        (IACConfig, dict(num_turns=2, num_generations=2), "num_generations=1"),
        (ActorCriticConfig, dict(num_turns=2, num_generations=2, output_dir="x"), "num_generations=1"),
        (IACConfig, dict(critic_type="w"), "critic_type"),
        (ActorCriticConfig, dict(critic_type="advantage", output_dir="x"), "critic_type"),
        (IACConfig, dict(num_turns=1, num_generations=3, rollout_buffer_size=8), "multiple of `num_generations"),
        (IACConfig, dict(num_turns=1, rollout_buffer_size=6, train_batch_size=4), "multiple of `train_batch_size"),
        (IACConfig, dict(num_turns=4, rollout_buffer_size=20, train_batch_size=10), "multiple of the second"),
        (IACConfig, dict(reference_kl_enabled=True), "beta"),
        (IACConfig, dict(parallel_training="mp"), "agent_devices"),
        (IACConfig, dict(parallel_training="gpus"), "parallel_training"),
        (ActorCriticConfig, dict(joint_critic=True, critic_kind="head", output_dir="x"), "critic_kind"),
        (ActorCriticConfig, dict(joint_mode="cross", output_dir="x"), "aligned"),
    ],
)
def test_bad_configs_raise_with_the_fix(config_cls, fields, message):
    with pytest.raises((ValueError, NotImplementedError), match=message):
        config_cls(**fields)


# ---- 5. bad inputs, caught at construction


def other_vocabulary_model(tmp_path) -> str:
    """A tiny model whose tokenizer has one more token: another vocabulary."""
    tokenizer = tiny_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|tool|>"]})
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path())
    model.resize_token_embeddings(len(tokenizer))
    return save_model_folder(tmp_path / "other-vocab", model, tokenizer)


def native_transition(row, histories, turn):
    return [f"{row['prompt']} (you wrote {len(h[-1])} characters)" for h in histories]


def native_args(tmp_path, **fields):
    settings = dict(num_agents=2, num_generations=2, per_device_train_batch_size=4, max_completion_length=6)
    return small_args(tmp_path, ActorCriticConfig, **{**settings, **fields})


def test_critic_with_another_tokenizer_raises(tmp_path, tiny_path, prompts_dataset):
    with pytest.raises(ValueError, match="another tokenizer than agent 0"):
        ActorCriticTrainer(
            model=tiny_path,
            reward_funcs=parity_reward,
            args=native_args(tmp_path),
            train_dataset=prompts_dataset,
            critic_model=other_vocabulary_model(tmp_path),
        )


def test_joint_critic_too_short_for_the_joint_text_raises(tmp_path, tiny_path, prompts_dataset):
    short = AutoModelForCausalLM.from_pretrained(tiny_path, max_position_embeddings=12)
    path = save_model_folder(tmp_path / "short", short, tiny_tokenizer())
    with pytest.raises(ValueError, match="longer context"):
        ActorCriticTrainer(
            model=tiny_path,
            reward_funcs=parity_reward,
            args=native_args(tmp_path, joint_critic=True, critic_type="q"),
            train_dataset=prompts_dataset,
            critic_model=path,
        )


@pytest.mark.parametrize(
    "fields, kwargs, message",
    [
        (dict(critic_kind="adapter"), {}, "LoRA team"),
        (dict(critic_kind="head"), dict(critic_model="x"), "critic_model"),
    ],
)
def test_unsupported_settings_raise(tmp_path, tiny_path, prompts_dataset, fields, kwargs, message):
    with pytest.raises((ValueError, NotImplementedError), match=message):
        ActorCriticTrainer(
            model=tiny_path,
            reward_funcs=parity_reward,
            args=native_args(tmp_path, **fields),
            train_dataset=prompts_dataset,
            external_transition=lambda row, histories, turn: ["next"] * 2,
            **kwargs,
        )


def test_one_model_object_listed_for_two_critics_raises(tmp_path, tiny_path, prompts_dataset):
    # Two critics on one backbone would train it twice over: each critic needs its own model.
    model = AutoModelForCausalLM.from_pretrained(tiny_path)
    with pytest.raises(ValueError, match="same model object"):
        ActorCriticTrainer(
            model=tiny_path,
            reward_funcs=parity_reward,
            args=native_args(tmp_path),
            train_dataset=prompts_dataset,
            critic_model=[model, model],
        )


@pytest.mark.parametrize(
    "trainer_cls, config_cls, kwargs, message",
    [
        (
            IACTrainer,
            IACConfig,
            dict(critic_model=tiny_model_path(), critics=[tiny_model_path(), "other"]),
            "conflict",
        ),
        (IACTrainer, IACConfig, dict(critics=[tiny_model_path()]), "one critic per agent"),
        (MAACTrainer, MAACConfig, dict(critics=[tiny_model_path()] * 2), "one joint critic"),
        (MAACTrainer, MAACConfig, {}, "MAAC requires a critic"),
        (IACTrainer, IACConfig, dict(critic_model=None), "Either critic_model or critics"),
    ],
)
def test_comlrl_critic_arguments_resolve_as_the_native_trainer_does(
    tmp_path, trainer_cls, config_cls, kwargs, message
):
    args = config_cls(output_dir=str(tmp_path), num_agents=2, num_turns=1, report_to="none")
    with pytest.raises(ValueError, match=message):
        trainer_cls(agent_model=tiny_model_path(), reward_func=parity_reward, args=args, **kwargs)


def test_an_agent_given_with_a_value_head_trains_its_model_and_starts_its_critic_from_the_head(
    tmp_path, tiny_path, prompts_dataset
):
    agents = [CausalLMWithValueHead(AutoModelForCausalLM.from_pretrained(tiny_path)) for _ in range(2)]
    for k, agent in enumerate(agents):
        for p in agent.value_head.parameters():
            torch.nn.init.constant_(p, 0.25 * (k + 1))
    trainer = ActorCriticTrainer(
        model=agents,
        reward_funcs=parity_reward,
        args=native_args(tmp_path, critic_kind="head"),
        train_dataset=prompts_dataset,
        processing_class=tiny_tokenizer(),
    )
    for k, agent in enumerate(agents):
        assert trainer.model.agents[k] is agent.model  # the wrapped LM is the agent trained
        head, carried = trainer.critics[k].value_head.state_dict(), agent.value_head.state_dict()
        assert head.keys() == carried.keys()
        assert all(torch.equal(head[name], carried[name]) for name in head)
    assert all(bool((p == 0.5).all()) for p in trainer.critics[1].value_head.parameters())


def test_iac_agents_with_value_heads_start_the_critics_from_them(tmp_path, tiny_path):
    agents = [CausalLMWithValueHead(AutoModelForCausalLM.from_pretrained(tiny_path), 8) for _ in range(2)]
    args = IACConfig(
        output_dir=str(tmp_path), num_turns=1, use_separate_critic=False, value_head_hidden_dim=8, report_to="none"
    )
    trainer = IACTrainer(agents=agents, tokenizer=tiny_tokenizer(), reward_func=parity_reward, args=args)
    for agent, critic in zip(agents, trainer.critics):
        assert critic.model is agent.model
        assert all(torch.equal(a, b) for a, b in zip(critic.value_head.parameters(), agent.value_head.parameters()))


def test_comlrl_special_tokens_reach_agents_given_with_value_heads(tmp_path, tiny_path):
    """`model_config["special_tokens"]` with agents given as `CausalLMWithValueHead`: the tokens are added, each
    wrapped LM is resized to the tokenizer and trained, and each critic starts from the head its agent carries."""
    agents = [CausalLMWithValueHead(AutoModelForCausalLM.from_pretrained(tiny_path), 8) for _ in range(2)]
    tokenizer = tiny_tokenizer()
    args = IACConfig(
        output_dir=str(tmp_path), num_turns=1, use_separate_critic=False, value_head_hidden_dim=8, report_to="none"
    )
    special = {"additional_special_tokens": ["<plan>"]}
    trainer = IACTrainer(
        agents=agents,
        tokenizer=tokenizer,
        reward_func=parity_reward,
        args=args,
        model_config={"special_tokens": special},
    )
    assert "<plan>" in tokenizer.get_vocab()
    for k, agent in enumerate(agents):
        assert trainer.model.agents[k] is agent.model
        assert agent.model.get_input_embeddings().num_embeddings == len(tokenizer)
        carried = zip(trainer.critics[k].value_head.parameters(), agent.value_head.parameters())
        assert all(torch.equal(a, b) for a, b in carried)


@pytest.mark.parametrize("trainer_cls, config_cls", [(IACTrainer, MAACConfig), (MAACTrainer, IACConfig)])
def test_a_config_of_the_other_family_raises_naming_both(tmp_path, trainer_cls, config_cls):
    args = config_cls(output_dir=str(tmp_path), report_to="none")
    expected = (
        f"`args` is a {config_cls.__name__}; {trainer_cls.__name__} needs a {trainer_cls.default_config_cls.__name__}"
    )
    with pytest.raises(TypeError, match=re.escape(expected)):
        trainer_cls(agent_model=tiny_model_path(), reward_func=parity_reward, args=args)


def test_set_transition_makes_the_later_turn_prompts(tmp_path, tiny_path, prompts_dataset):
    seen = []
    trainer = ActorCriticTrainer(
        model=tiny_path,
        reward_funcs=parity_reward,
        args=native_args(tmp_path, num_turns=2, num_generations=1, per_device_eval_batch_size=2),
        train_dataset=prompts_dataset,
        eval_dataset=prompts_dataset.select(range(2)),
        external_transition=native_transition,
        rollout_metrics=lambda samples: seen.extend(samples) or {},
    )
    trainer.set_transition(lambda node, sample: [f"{node.row['prompt']} again, agent {i}" for i in range(2)])
    trainer.evaluate()
    later = [s for s in seen if s.metadata["turn_idx"] == 1]
    assert later and all(s.prompt == f"{s.metadata['batch_item']['prompt']} again, agent {s.agent_idx}" for s in later)
    with pytest.raises(TypeError, match="transition"):
        trainer.set_transition("not a function")


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(critic_devices=["cpu", "cpu"]), "set `agent_devices`"),
        (dict(agent_devices=["cpu", "cpu"], critic_devices=["cpu", "cpu"], critic_kind="head"), "critic_kind='model'"),
        (dict(agent_devices=["cpu", "cpu"], critic_devices=["cpu", "cpu", "cpu"]), "3 devices for 2"),
        (dict(agent_devices=["cpu", "cpu"], critic_devices=["cpu", "cpu"], joint_critic=True), "2 devices for 1"),
    ],
)
def test_bad_critic_devices_raise(tmp_path, fields, message):
    with pytest.raises(ValueError, match=message):
        native_args(tmp_path, **fields)


def test_critics_are_placed_on_critic_devices(tmp_path, tiny_path, prompts_dataset):
    # Where a GPU is, critic 0 goes there while its agent stays on the CPU: the trainer placed it, not the agent's.
    devices = ["cuda:0" if torch.cuda.is_available() else "cpu", "cpu"]
    trainer = ActorCriticTrainer(
        model=tiny_path,
        reward_funcs=parity_reward,
        args=native_args(tmp_path, agent_devices=["cpu", "cpu"], critic_devices=devices),
        train_dataset=prompts_dataset,
    )
    assert [next(c.parameters()).device for c in trainer.critics] == [torch.device(d) for d in devices]
    # One device for every critic, in `agent_devices`' forms: stored as one per critic.
    assert native_args(tmp_path, agent_devices=["cpu", "cpu"], critic_devices=["cpu"]).critic_devices == ["cpu", "cpu"]
    assert all(next(agent.parameters()).device.type == "cpu" for agent in trainer.model.agents)


# ---- 6. the native trainer: every actor and critic parameter trains


@pytest.mark.parametrize(
    "fields",
    [
        dict(critic_type="v", num_generations=1),  # IAC, one completion per prompt
        dict(critic_type="q", joint_critic=True),  # MAAC
        dict(critic_type="q", critic_kind="head", value_clip_range=0.2, critic_value_head_hidden_dim=8),
        dict(critic_type="v", num_generations=1, num_turns=2, discount=0.9),  # TD targets over two turns
        dict(critic_type="q", num_generations=1, num_turns=2, joint_critic=True),
    ],
    ids=["iac-v-g1", "maac-q", "head-q", "iac-v-two-turns", "maac-q-two-turns"],
)
def test_native_trainer_trains_every_actor_and_critic_parameter(tmp_path, tiny_path, prompts_dataset, fields):
    trainer = ActorCriticTrainer(
        model=tiny_path,
        reward_funcs=parity_reward,
        args=native_args(tmp_path, **fields),
        train_dataset=prompts_dataset,
        external_transition=native_transition if fields.get("num_turns", 1) > 1 else None,
    )
    before = snapshot(trainer.model)
    trainer.train()
    assert changed(before, trainer.model) == set(before)
    logged = trainer.state.log_history[0]
    assert {"agent_0/value_loss", "agent_1/value_mean", "agent_0/loss"} <= set(logged)
    assert ("critic/grad_norm" if fields.get("joint_critic") else "agent_1/critic_grad_norm") in logged
    groups = [g for g in trainer.optimizer.param_groups if "critic" in g]
    assert {g["critic"] for g in groups} == set(range(trainer.num_critics))


@pytest.mark.parametrize("evaluate_first", [False, True], ids=["train", "evaluate-then-train"])
def test_lora_team_with_critic_adapters_trains_and_saves(tmp_path, tiny_path, prompts_dataset, evaluate_first):
    args = native_args(tmp_path, critic_kind="adapter", critic_learning_rate=2e-3)
    trainer = ActorCriticTrainer(
        model=tiny_path,
        reward_funcs=parity_reward,
        args=args,
        train_dataset=prompts_dataset,
        peft_config=lora_config(),
    )
    if evaluate_first:  # PEFT's `set_adapter` under `no_grad` froze the other adapters before the optimizer was built
        trainer.evaluate(prompts_dataset)
    before = snapshot(trainer.model)
    trainer.train()
    trained = changed(before, trainer.model)
    adapters = {n for n in before if ".lora_" in n or n.startswith("critics.")}
    assert trained == adapters  # the base is unchanged; every agent and critic adapter, and every head, trained
    assert any(".critic_1." in n for n in trained) and any(n.startswith("critics.1.value_head") for n in trained)
    assert {g["initial_lr"] for g in trainer.optimizer.param_groups if "critic" in g} == {2e-3}

    trainer.save_model(str(tmp_path / "final"))
    critic_dir = tmp_path / "final" / "agent_1" / "critic"
    assert {"adapter_config.json", "adapter_model.safetensors", VALUE_HEAD_FILE} <= set(os.listdir(critic_dir))
    # Loaded back: the agent's adapter with PEFT, the critic (adapter and head) into a fresh critic adapter.
    base = AutoModelForCausalLM.from_pretrained(tiny_path)
    loaded = PeftModel.from_pretrained(base, str(tmp_path / "final" / "agent_1"), adapter_name="agent_1")
    loaded.add_adapter("critic_1", lora_config())
    critic = AdapterValueModel(loaded, "critic_1")
    critic.load_pretrained(str(critic_dir))
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        expected = trainer.critics[1].values(ids.to(trainer.accelerator.device)).cpu()
        torch.testing.assert_close(critic.values(ids), expected)


def test_checkpoints_hold_the_critics_and_resume(tmp_path, tiny_path, prompts_dataset):
    args = native_args(tmp_path, save_strategy="steps", save_steps=1, max_steps=1)
    trainer = ActorCriticTrainer(model=tiny_path, reward_funcs=parity_reward, args=args, train_dataset=prompts_dataset)
    trainer.train()
    checkpoint = Path(args.output_dir) / "checkpoint-1"
    assert (checkpoint / "agent_0" / "critic" / VALUE_HEAD_FILE).is_file()
    resumed = ActorCriticTrainer(
        model=tiny_path, reward_funcs=parity_reward, args=native_args(tmp_path), train_dataset=prompts_dataset
    )
    resumed._load_from_checkpoint(str(checkpoint))
    for ours, saved in zip(resumed.critics, trainer.critics):
        for (name, p), q in zip(ours.named_parameters(), saved.parameters()):
            torch.testing.assert_close(p, q, msg=name)


def comlrl_iac(tmp_path, tiny_path, epochs: int = 1):
    args = IACConfig(
        num_turns=1,
        num_generations=2,
        rollout_buffer_size=4,
        max_new_tokens=4,
        num_train_epochs=epochs,
        agent_learning_rate=1e-3,
        eval_interval=0,
        report_to="none",
        output_dir=str(tmp_path / "run"),
    )
    dataset = Dataset.from_dict({"prompt": PROMPTS * 2})
    return IACTrainer(
        agent_model=tiny_path, critic_model=tiny_path, reward_func=parity_reward, args=args, train_dataset=dataset
    )


def test_save_checkpoint_and_load_checkpoint_continue_training(tmp_path, tiny_path):
    """CoMLRL's `save_checkpoint(dir)` / `load_checkpoint(dir)`: the weights, optimizer and progress come back, and
    the next `train()` continues from the saved step."""
    trainer = comlrl_iac(tmp_path, tiny_path)
    trainer.train()
    saved = trainer.save_checkpoint(str(tmp_path / "snapshot"))
    assert {"optimizer.pt", "trainer_state.json"} <= set(os.listdir(saved))
    with pytest.raises(FileExistsError, match="not a checkpoint"):
        trainer.save_checkpoint(str(tmp_path))  # a folder that holds other things
    assert trainer.save_checkpoint(saved) == saved  # a checkpoint is replaced

    resumed = comlrl_iac(tmp_path, tiny_path, epochs=2)
    progress = resumed.load_checkpoint(saved)
    assert progress == {"global_step": 2, "epoch": 1.0}
    for ours, theirs in zip([*resumed.model.agents, *resumed.critics], [*trainer.model.agents, *trainer.critics]):
        for (name, p), q in zip(ours.named_parameters(), theirs.parameters()):
            torch.testing.assert_close(p, q, msg=name)
    steps = []
    resumed.add_callback(type("Count", (TrainerCallback,), {"on_step_end": lambda self, *a, **k: steps.append(1)})())
    resumed.train()
    assert (resumed.state.global_step, len(steps)) == (4, 2)  # two more steps: the second epoch only
    adam = resumed.optimizer.state_dict()["state"]
    assert min(int(v["step"]) for v in adam.values()) == 4  # the saved Adam moments went on


def test_gradient_accumulation_matches_the_full_batch(tmp_path, tiny_path, prompts_dataset):
    """The value loss is scaled for accumulation as TRL's policy loss: 4 rows x 2 micro-batches train the actors and
    the critics like one batch of 8 (the advantages are standardized over the whole generation batch either way)."""
    weights, starts = [], []
    for batch_size, accumulation in ((8, 1), (4, 2)):
        args = native_args(
            tmp_path,
            max_steps=1,
            loss_type="grpo",
            per_device_train_batch_size=batch_size,
            gradient_accumulation_steps=accumulation,
            lr_scheduler_type="constant",
            optim="sgd",
            learning_rate=0.1,
        )
        trainer = ActorCriticTrainer(
            model=tiny_path, reward_funcs=parity_reward, args=args, train_dataset=prompts_dataset
        )
        starts.append({n: p.detach().clone() for n, p in trainer.model.named_parameters()})
        trainer.train()
        weights.append({n: p.detach().clone() for n, p in trainer.model.named_parameters()})
    for name in weights[0]:
        # One SGD(lr=0.1) step from the same weights: the steps (lr x gradients) agree to the gradients' noise floor.
        assert torch.equal(starts[0][name], starts[1][name]), name
        steps = [after[name] - start[name] for after, start in zip(weights, starts)]
        atol = TINY + weight_rounding(starts[0][name])
        assert_close_to_scale(steps[1], steps[0], GRADIENT_REL, atol=atol, msg=name)


DDP_SCRIPT = """
import json, sys
from datasets import Dataset
from multiagent_trl.actor_critic.config import ActorCriticConfig
from multiagent_trl.actor_critic.trainer import ActorCriticTrainer
from multiagent_trl.testing import end_launched_process, tiny_model_path

out_dir, joint = sys.argv[1], sys.argv[2] == "joint"
args = ActorCriticConfig(
    output_dir=out_dir + "/run", num_agents=2, num_generations=2, per_device_train_batch_size=4,
    max_completion_length=6, max_steps=2, learning_rate=1e-2, report_to="none", save_strategy="no", seed=0,
    joint_critic=joint, critic_type="q" if joint else "v",
)
trainer = ActorCriticTrainer(
    model=tiny_model_path(),
    reward_funcs=lambda c1, c2: [len(b) / (1 + len(a)) for a, b in zip(c1, c2)],
    args=args,
    train_dataset=Dataset.from_dict({"prompt": [f"Row {i}: tell a story." for i in range(8)]}),
)
critic_sums = lambda: [[float(p.detach().double().sum()) for p in c.parameters()] for c in trainer.critics]
initial = critic_sums()
trainer.train()
with open(f"{out_dir}/rank{trainer.accelerator.process_index}.json", "w") as f:
    agents = [[float(p.detach().double().sum()) for p in trainer.model.agent_parameters(i)] for i in range(2)]
    json.dump({"initial": initial, "critics": critic_sums(), "agents": agents}, f)
end_launched_process()
"""


@pytest.mark.parametrize("kind", ["iac"])  # a joint critic routes the same way; one launch keeps the suite short
def test_two_processes_train_the_same_critics(tmp_path, kind):
    """DDP (two gloo processes on CPU): the critics live in the team module, so their gradients are averaged too."""
    import json

    script = tmp_path / "ddp_actor_critic.py"
    script.write_text(DDP_SCRIPT)
    launch_two_processes(script, tmp_path, kind)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0]["critics"] == ranks[1]["critics"] and ranks[0]["agents"] == ranks[1]["agents"]
    for initial, trained in zip(ranks[0]["initial"], ranks[0]["critics"]):
        assert all(a != b for a, b in zip(initial, trained))


def test_evaluate_takes_no_arguments_and_reports_comlrls_metrics(tmp_path, tiny_path):
    rows = Dataset.from_dict({"prompt": [f"Row {i}: a word." for i in range(6)]})
    calls = []
    args = IACConfig(
        num_turns=1, max_new_tokens=4, rollout_buffer_size=2, eval_num_samples=3, report_to="none",
        output_dir=str(tmp_path / "out"),
    )  # fmt: skip
    trainer = IACTrainer(
        agent_model=tiny_path,
        critic_model=tiny_path,
        reward_func=parity_reward,
        args=args,
        eval_dataset=rows,
        metrics_callback=lambda samples: calls.append(samples) or {"completion_chars": len(samples[0].completion)},
    )
    metrics = trainer.evaluate()
    assert len(calls) == 3 and all(len(samples) == 2 for samples in calls)  # the first 3 rows, 1 completion each
    assert {"eval_turn_1/reward_mean", "eval_turn_1/expected_return", "eval_completion_chars"} <= set(metrics)
    with pytest.raises(ValueError, match="Training requires a dataset"):
        trainer.train()


def test_native_rollout_metrics_are_called_per_item_and_logged(tmp_path, tiny_path, prompts_dataset):
    """`ActorCriticTrainer(rollout_metrics=...)` (CoMLRL's `metrics_callback`, native): once per dataset item with
    that item's samples of every agent and generation; the numbers' means are logged, other values dropped."""
    calls = []

    def rollout_metrics(samples):
        calls.append([(s.agent_idx, s.metadata["generation_idx"]) for s in samples])
        return {"samples_per_item": len(samples), "note": "not a number"}

    trainer = ActorCriticTrainer(
        model=tiny_path,
        reward_funcs=parity_reward,
        args=native_args(tmp_path, max_steps=1),
        train_dataset=prompts_dataset,
        rollout_metrics=rollout_metrics,
    )
    trainer.train()
    assert len(calls) == 2  # 4 rows of 2 generations: 2 items
    assert all(sorted(call) == [(0, 0), (0, 1), (1, 0), (1, 1)] for call in calls)
    logged = [entry for entry in trainer.state.log_history if "samples_per_item" in entry]
    assert logged[0]["samples_per_item"] == 4.0
    assert all("note" not in entry for entry in trainer.state.log_history)
