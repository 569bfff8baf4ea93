"""CoMLRL 1.4.3 parity: its config fields and defaults, advantage modes, reward conventions, per-agent rewards,
per-agent devices, evaluation pass, trainer arguments and checkpoints."""

import dataclasses
import inspect
import math
import os
import re
import shutil

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

import multiagent_trl.comlrl
from multiagent_trl import (
    MAGRPOConfig,
    MAGRPOTrainer,
    MAREINFORCEConfig,
    MAREINFORCETrainer,
    MAReMaxConfig,
    MAReMaxTrainer,
    MARLOOConfig,
    MARLOOTrainer,
    RewardProcessors,
)
from multiagent_trl.rewards.joint import bind_reward
from multiagent_trl.team.placement import check_devices

from .conftest import PROMPTS, G, changed, completion_ids_of, generation_batch, length_ratio, snapshot

# CoMLRL 1.4.3's MAGRPOConfig, field by field, with its defaults (comlrl/trainers/reinforce/magrpo.py).
COMLRL_DEFAULTS = dict(
    num_train_epochs=20,
    agent_learning_rate=5.0e-6,
    logging_steps=50,
    num_agents=2,
    parallel_training="none",
    agent_devices=None,
    num_generations=4,
    max_new_tokens=256,
    temperature=0.6,
    top_p=0.6,
    top_k=50,
    num_turns=2,
    discount=1.0,
    joint_mode="aligned",
    early_termination_threshold=-0.2,
    external_prompt_passthrough=False,
    eval_interval=16,
    eval_num_samples=4,
    eval_batch_size=1,
    rollout_buffer_size=2,
    train_batch_size=None,
    advantage_normalization=True,
    advantage_mode="mean",
    reference_kl_enabled=False,
    reference_kl_coef=0.1,
    reference_devices=None,
)
CoMLRL_ONLY = {"train_batch_size": "comlrl_train_batch_size", "eval_batch_size": "comlrl_eval_batch_size"}


def comlrl_args(tmp_path, config_class=MAGRPOConfig, **overrides):
    settings = dict(
        output_dir=str(tmp_path / "out"),
        num_turns=1,
        max_new_tokens=8,
        rollout_buffer_size=2,
        agent_learning_rate=1e-3,
        logging_steps=1,
        max_steps=1,
        report_to="none",
        seed=0,
    )
    settings.update(overrides)
    return config_class(**settings)


# ---------------------------------------------------------------------------------------------- 1. the config


def test_every_comlrl_field_is_accepted_with_its_default():
    config = MAGRPOConfig()
    fields = {f.name for f in dataclasses.fields(MAGRPOConfig)}
    assert set(COMLRL_DEFAULTS) <= fields
    for name, default in COMLRL_DEFAULTS.items():
        value = getattr(config, CoMLRL_ONLY.get(name, name))
        if name in ("agent_devices", "reference_devices"):
            continue  # mapped onto the core's per-agent placement (None under "none")
        assert value == default, name
    # The same list as the installed CoMLRL's own dataclass, where it can be imported.
    try:
        from comlrl.trainers.reinforce import MAGRPOConfig as Reference
    except ImportError:
        return
    reference = {f.name: f.default for f in dataclasses.fields(Reference)}
    assert reference == COMLRL_DEFAULTS


@pytest.mark.parametrize(
    "name",
    ["MAGRPOTrainer", "MADPOTrainer", "MARLHFTrainer", "IACTrainer", "MAACTrainer", "CentralizedMAGRPOTrainer"]
    + ["MADPOIterTrainer", "MARLHFIterTrainer"],
)
def test_trainers_take_comlrls_arguments_in_its_order(name):
    """A CoMLRL script passes arguments by position or by keyword: every named argument of CoMLRL 1.4.3's constructor
    is one of ours, of the same kind (positional or keyword-only), in the same order."""
    modules = [
        pytest.importorskip(f"comlrl.trainers.{family}", reason="needs comlrl==1.4.3 (pip install -e '.[dev]')")
        for family in ("reinforce", "preference", "actor_critic")
    ]
    reference = next(getattr(module, name) for module in modules if hasattr(module, name))
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    theirs = [
        (n, p.kind) for n, p in inspect.signature(reference.__init__).parameters.items() if p.kind not in variadic
    ]
    ours = inspect.signature(getattr(multiagent_trl.comlrl, name).__init__).parameters
    assert [(n, ours[n].kind) for n, _ in theirs if n in ours] == theirs


def test_no_gradient_checkpointing_by_default_and_the_same_weights(tmp_path, tiny_path, prompts_dataset):
    """CoMLRL keeps activations; TRL's default (`True`) would recompute them in the backward, for the same weights."""
    assert MAGRPOConfig().gradient_checkpointing is False
    weights, checkpointing = [], []
    for flag in (False, True):
        args = comlrl_args(tmp_path / str(flag), max_steps=2, gradient_checkpointing=flag)
        trainer = MAGRPOTrainer(
            agent_model=tiny_path, num_agents=2, reward_func=length_ratio, args=args, train_dataset=prompts_dataset
        )
        initial = snapshot(trainer.model)
        torch.manual_seed(0)
        trainer.train()
        checkpointing.append(trainer.model.is_gradient_checkpointing)
        weights.append(snapshot(trainer.model))
        assert changed(initial, trainer.model), "training changed nothing"
    assert checkpointing == [False, True]
    for name, value in weights[0].items():
        assert torch.equal(value, weights[1][name]), name


def test_comlrl_batch_sizes_keep_trainers_properties():
    config = MAGRPOConfig(rollout_buffer_size=4, train_batch_size=2, eval_batch_size=3, num_generations=4)
    assert (config.comlrl_train_batch_size, config.comlrl_eval_batch_size) == (2, 3)
    assert config.per_device_train_batch_size == 2 * 4 and config.steps_per_generation == 2
    assert config.train_batch_size == config.per_device_train_batch_size * max(1, config.n_gpu)  # Trainer's property
    assert config.eval_batch_size == 3 * max(1, config.n_gpu) and config.num_generations_eval == 1
    assert MAGRPOConfig(rollout_buffer_size=3).steps_per_generation == 1  # default: one step per buffer


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_train_epochs=0), "`num_train_epochs` must be at least 1"),
        (dict(num_generations=1), "`num_generations` must be at least 2"),
        (dict(rollout_buffer_size=0), "`rollout_buffer_size` must be at least 1"),
        (dict(eval_interval=-1), "`eval_interval` must be at least 0"),
        (dict(eval_num_samples=-1), "`eval_num_samples` must be at least 0"),
        (dict(eval_batch_size=0), "`eval_batch_size` must be at least 1"),
        (dict(train_batch_size=0), "`train_batch_size` must be at least 1"),
        (dict(logging_steps=0), "`logging_steps` must be at least 1"),
        (dict(num_turns=0), "`num_turns` must be at least 1"),
        (dict(advantage_mode="median"), "`advantage_mode` must be one of"),
        (dict(parallel_training="ddp"), "`parallel_training` must be 'none' or 'mp'"),
        (dict(parallel_training="mp"), "needs `agent_devices`"),
        (dict(parallel_training="mp", agent_devices=["cpu", "cpu", "cpu"]), "a list of 1 or 2 devices"),
        (dict(parallel_training="mp", agent_devices=["cpu", "cuda:7"]), "'cuda:7' does not exist on this machine"),
        (dict(parallel_training="mp", agent_devices=["cpu", "gpu0"]), "'gpu0' is not a device name"),
        (dict(agent_devices=["cuda:5"]), "with `parallel_training='none'`"),
        (dict(reference_kl_enabled=True, reference_devices=["cuda:5"]), "`reference_devices=['cuda:5']` with `paral"),
        (dict(reference_kl_coef=-0.1), "`reference_kl_coef` must be >= 0"),
        (dict(rollout_buffer_size=3, train_batch_size=2), "must be a multiple of `train_batch_size=2`"),
    ],
)
def test_comlrl_checks(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        MAGRPOConfig(**kwargs)


ON_CPU = pytest.mark.skipif(torch.cuda.is_available(), reason="the process's device is the CPU here")

# The "MAGRPOConfig fields" table of docs/comlrl-users.md, row by row: (row, CoMLRL fields given, what the core's
# fields hold).
COMLRL_MAPPINGS = [
    ("agent_learning_rate", dict(agent_learning_rate=1e-4), dict(learning_rate=1e-4)),
    ("logging_steps", dict(logging_steps=7), dict(logging_steps=7)),
    ("num_agents", dict(num_agents=3), dict(num_agents=3)),
    ("max_new_tokens", dict(max_new_tokens=64), dict(max_completion_length=64)),
    ("top_k None", dict(top_k=None), dict(top_k=0)),
    ("eval_interval", dict(eval_interval=3), dict(eval_strategy="steps", eval_steps=3, eval_on_start=True)),
    ("eval_interval 0", dict(eval_interval=0), dict(eval_strategy="no", eval_on_start=False)),
    ("advantage_normalization", dict(advantage_normalization=True), dict(scale_rewards="group")),
    ("no advantage_normalization", dict(advantage_normalization=False), dict(scale_rewards="none")),
    ("reference_kl_enabled", dict(reference_kl_enabled=True, reference_kl_coef=0.3), dict(beta=0.3)),
    ("reference_kl disabled", dict(reference_kl_coef=0.3), dict(beta=0.0)),
    ("reference_kl disabled, GRPO's beta", dict(beta=0.2), dict(beta=0.2)),
    ("mp, one device", dict(parallel_training="mp", agent_devices="cpu"), dict(agent_devices=["cpu", "cpu"])),
    ("mp, a list of 1", dict(parallel_training="mp", agent_devices=["cpu"]), dict(agent_devices=["cpu", "cpu"])),
    pytest.param(
        "mp, auto", dict(parallel_training="mp", agent_devices="auto"), dict(agent_devices=["cpu"] * 2), marks=ON_CPU
    ),
    pytest.param("none, the process's device", dict(agent_devices="cpu"), dict(agent_devices=None), marks=ON_CPU),
    ("defaults", {}, dict(output_dir="magrpo_output", save_strategy="no")),
    ("an ended node's return", {}, dict(ended_return="reward")),  # CoMLRL's sum (tests/test_multiturn.py)
]


@pytest.mark.parametrize("row, fields, expected", COMLRL_MAPPINGS)
def test_comlrl_fields_map_onto_the_core(row, fields, expected):
    config = MAGRPOConfig(**fields)
    assert {name: getattr(config, name) for name in expected} == expected


def test_mp_is_refused_under_a_multi_process_launch():
    with pytest.raises(ValueError, match="this run has 2 processes"):
        check_devices(["cpu", "cpu"], "agent_devices", 2, world_size=2)


def test_the_reinforce_family_defaults():
    assert [c().advantage_mode for c in (MAGRPOConfig, MAREINFORCEConfig, MAReMaxConfig, MARLOOConfig)] == [
        "mean",
        "raw",
        "max",
        "rloo",
    ]
    assert [c().advantage_baseline for c in (MAREINFORCEConfig, MAReMaxConfig, MARLOOConfig)] == [
        "none",
        "max",
        "leave_one_out",
    ]
    trainers = (MAGRPOTrainer, MAREINFORCETrainer, MAReMaxTrainer, MARLOOTrainer)
    assert [t.default_config_cls for t in trainers] == [MAGRPOConfig, MAREINFORCEConfig, MAReMaxConfig, MARLOOConfig]


# ---------------------------------------------------------------------------------------------- advantages


def by_hand(rewards, mode, normalize):
    """CoMLRL's advantages of one group, then (normalize) centered and scaled with TRL's std estimator.

    The tests compare these to rtol=atol=1e-4: advantages of Python-float rewards with no model in between, so a CPU
    changes only the float32 rounding of numbers of order 1 (~1e-7; tests/parity.py's forward floor is 1.2e-6)."""
    r = torch.tensor(rewards, dtype=torch.float32)
    g = len(rewards)
    baseline = {"mean": r.mean(), "raw": 0.0, "max": r.max()}.get(mode)
    a = (g * r - r.sum()) / (g - 1) if mode == "rloo" else r - baseline
    if normalize:
        a = (a - a.mean()) / (a.std() + 1e-4)
    return a


@pytest.mark.parametrize(
    "mode, normalize", [("mean", False), ("raw", False), ("max", False), ("rloo", False), ("rloo", True)]
)
def test_advantage_modes_against_hand_computed_values(tmp_path, tiny_path, prompts_dataset, mode, normalize):
    def reward(completions1, completions2, batch_items):  # deterministic in the texts
        return [float(len(a) % 5) + 0.5 * float(len(b) % 3) for a, b in zip(completions1, completions2)]

    args = comlrl_args(tmp_path, advantage_mode=mode, advantage_normalization=normalize)
    trainer = MAGRPOTrainer(
        agent_model=tiny_path, num_agents=2, reward_func=reward, args=args, train_dataset=prompts_dataset
    )
    trainer.model.train()
    output = trainer._generate_and_score_completions(generation_batch(prompts_dataset))
    texts = [
        trainer.processing_class.batch_decode(completion_ids_of(output, a), skip_special_tokens=True) for a in range(2)
    ]
    rewards = reward(*texts, batch_items=None)
    expected = torch.cat([by_hand(rewards[k : k + G], mode, normalize) for k in range(0, len(rewards), G)])
    for agent in range(2):
        torch.testing.assert_close(output[f"agent_{agent}/advantages"], expected, rtol=1e-4, atol=1e-4)
    assert expected.abs().sum() > 0
    if normalize:  # CoMLRL: with normalization every mode gives GRPO's advantages
        grpo = torch.cat([by_hand(rewards[k : k + G], "mean", True) for k in range(0, len(rewards), G)])
        torch.testing.assert_close(expected, grpo, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mode", ["raw", "mean", "rloo"])
def test_cross_mode_advantages_are_comlrls_sums(tmp_path, tiny_path, prompts_dataset, mode):
    """CoMLRL credits a completion with the *sum* of the returns of the G**(N-1) cross tuples holding it; without
    normalization that is G**(N-1) times the core's mean, so the CoMLRL layer must sum."""

    def reward(completions1, completions2):
        return [float(len(a) % 5) + 0.5 * float(len(b) % 3) for a, b in zip(completions1, completions2)]

    args = comlrl_args(tmp_path, joint_mode="cross", advantage_mode=mode, advantage_normalization=False)
    assert args.cross_credit == "sum"
    trainer = MAGRPOTrainer(agent_model=tiny_path, reward_func=reward, args=args, train_dataset=prompts_dataset)
    trainer.model.train()
    output = trainer._generate_and_score_completions(generation_batch(prompts_dataset))
    texts = [trainer.processing_class.batch_decode(completion_ids_of(output, a)) for a in range(2)]
    for agent in range(2):
        credit = []
        for start in range(0, len(texts[0]), G):
            group = [texts[a][start : start + G] for a in range(2)]
            for k in range(G):  # CoMLRL's per-completion sum over the tuples that hold completion k
                pairs = [(group[0][k], b) for b in group[1]] if agent == 0 else [(a, group[1][k]) for a in group[0]]
                credit.append(sum(reward([a], [b])[0] for a, b in pairs))
        expected = torch.cat([by_hand(credit[k : k + G], mode, False) for k in range(0, len(credit), G)])
        torch.testing.assert_close(output[f"agent_{agent}/advantages"], expected, rtol=1e-4, atol=1e-4)
        assert expected.abs().sum() > 0


# ---------------------------------------------------------------------------------------------- 5. rewards


def reference(completions1, completions2):
    return [len(a) - 2.0 * len(b) for a, b in zip(completions1, completions2)]


CONVENTIONS = {
    "per-agent lists": reference,
    "prompts first": lambda prompts, c1, c2: reference(c1, c2),
    "varargs": lambda *completions: reference(*completions),
    "nested": lambda agent_completions: reference(*agent_completions),
    "tensor": lambda c1, c2: torch.tensor(reference(c1, c2)),
    "batch_items and prompts keywords": lambda c1, c2, batch_items, prompts: [
        r + 0 * len(row["target"]) + 0 * len(p) for r, row, p in zip(reference(c1, c2), batch_items, prompts)
    ],
    "kwargs": lambda c1, c2, **kwargs: [
        r + 0 * len(kwargs["batch_items"]) + 0 * len(kwargs["prompts"]) for r in reference(c1, c2)
    ],
}


@pytest.mark.parametrize("name", list(CONVENTIONS))
def test_reward_conventions_give_the_same_rewards(name):
    completions = [("a", "bb"), ("ccc", ""), ("dddd", "e")]
    prompts = [("p0", "q0"), ("p1", "q1"), ("p2", "q2")]
    rows = [{"prompt": "P", "target": "xyz"}] * 3
    bound = bind_reward(CONVENTIONS[name], num_agents=2)
    got = bound(prompts=prompts, completions=completions, completion_ids=None, batch_items=rows, target=["xyz"] * 3)
    assert got == reference(*zip(*completions)) == [-3.0, 3.0, 2.0]


def test_prompts_and_batch_items_are_what_comlrl_passes(tmp_path, tiny_path, prompts_dataset):
    seen = []

    def reward(prompts, completions1, completions2, batch_items=None):
        seen.append((list(prompts), list(batch_items)))
        return [0.0] * len(completions1)

    trainer = MAGRPOTrainer(
        agent_model=tiny_path,
        reward_func=reward,
        args=comlrl_args(tmp_path),
        train_dataset=prompts_dataset,
        formatters=[lambda r: r["prompt"] + " A:", lambda r: r["prompt"] + " B:"],
    )
    trainer.model.train()
    batch = generation_batch(prompts_dataset)
    trainer._generate_and_score_completions(batch)
    # As CoMLRL 1.4.3 calls it: once per joint sample, with agent 0's prompt and the dataset row (every column).
    assert seen == [([row["prompt"] + " A:"], [row]) for row in batch]


def test_reward_is_called_once_per_joint_sample_and_its_first_value_used(tmp_path, tiny_path, prompts_dataset):
    """CoMLRL-style rewards that read element [0] and return one value (CoMLRL's Minecraft project) work in the
    CoMLRL layer, as in CoMLRL 1.4.3; the core calls a function once per batch."""
    calls = []

    def first_only(completions1, completions2):
        calls.append((len(completions1), len(completions2)))
        return [float(len(completions1[0]) - len(completions2[0])), 99.0]  # CoMLRL uses the first value

    trainer = MAGRPOTrainer(
        agent_model=tiny_path, reward_func=first_only, args=comlrl_args(tmp_path), train_dataset=prompts_dataset
    )
    trainer.model.train()
    batch = generation_batch(prompts_dataset)
    output = trainer._generate_and_score_completions(batch)
    assert calls == [(1, 1)] * len(batch)
    texts = [trainer.processing_class.batch_decode(completion_ids_of(output, a)) for a in range(2)]
    expected = [float(len(a) - len(b)) for a, b in zip(*texts)]
    assert trainer._metrics["train"]["reward"] == [pytest.approx(sum(expected) / len(expected), abs=1e-4)]


def test_reward_range_is_checked():
    def reward(c1, c2):
        return [2.0] * len(c1)

    reward.reward_range = (0.0, 1.0)
    with pytest.raises(ValueError, match=r"outside its declared reward_range \(0.0, 1.0\)"):
        bind_reward(reward, 2)(prompts=["p"], completions=[("a", "b")], completion_ids=None)
    reward.reward_range = (1.0, 0.0)
    with pytest.raises(ValueError, match="minimum < maximum"):
        bind_reward(reward, 2)


@pytest.mark.parametrize("returned, scale", [("rows", None), ("tensor", 2.0)])
def test_per_agent_rewards_give_each_agent_its_own_advantages(tmp_path, tiny_path, prompts_dataset, returned, scale):
    """Rows of N numbers or an (S, N) tensor; a `reward_processor` applies to each agent's reward."""

    def reward(completions1, completions2):  # agent 0 rewarded for length, agent 1 for brevity
        rows = [(float(len(a) % 7), -float(len(b) % 5)) for a, b in zip(completions1, completions2)]
        return torch.tensor(rows) if returned == "tensor" else rows

    args = comlrl_args(tmp_path, advantage_normalization=False)
    processor = RewardProcessors.scale(scale) if scale else None
    trainer = MAGRPOTrainer(
        agent_model=tiny_path, reward_func=reward, args=args, train_dataset=prompts_dataset, reward_processor=processor
    )
    trainer.model.train()
    output = trainer._generate_and_score_completions(generation_batch(prompts_dataset))
    texts = [
        trainer.processing_class.batch_decode(completion_ids_of(output, a), skip_special_tokens=True) for a in range(2)
    ]
    rewards = [[float(x) * (scale or 1.0) for x in r] for r in reward(*texts)]
    for agent in range(2):
        own = [r[agent] for r in rewards]
        expected = torch.cat([by_hand(own[k : k + G], "mean", False) for k in range(0, len(own), G)])
        torch.testing.assert_close(output[f"agent_{agent}/advantages"], expected, rtol=1e-4, atol=1e-4)
    # The joint reward logged is the team's: the mean of the agents' rewards.
    assert trainer._metrics["train"]["reward"][-1] == pytest.approx(sum(sum(r) / 2 for r in rewards) / len(rewards))


# ---------------------------------------------------------------------------------------------- 6. devices


def test_mp_places_each_agent_and_reference_on_its_device(tmp_path, tiny_path, prompts_dataset):
    args = comlrl_args(
        tmp_path,
        parallel_training="mp",
        agent_devices=["cpu", "cpu"],
        reference_kl_enabled=True,
        reference_devices="cpu",
        reference_kl_coef=0.05,
    )
    trainer = MAGRPOTrainer(agent_model=tiny_path, reward_func=reference, args=args, train_dataset=prompts_dataset)
    assert args.agent_devices == ["cpu", "cpu"] and args.reference_devices == ["cpu", "cpu"]
    assert trainer.model.hf_device_map == {"agents.0": "cpu", "agents.1": "cpu"}
    for i in range(2):
        assert {p.device.type for p in trainer.model.agents[i].parameters()} == {"cpu"}
        assert {p.device.type for p in trainer._agent_views[i]["ref_model"].parameters()} == {"cpu"}
    before = [p.detach().clone() for p in trainer.model.agent_parameters(1)]
    trainer.train()
    assert trainer.state.global_step == 1
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.model.agent_parameters(1)))


def test_per_agent_device_hooks_move_inputs_and_outputs():
    from multiagent_trl.team.placement import _to

    nested = {"logits": torch.zeros(2), "past": ("cache", [torch.ones(1)])}
    moved = _to(nested, torch.device("meta"))
    assert moved["logits"].device.type == "meta" and moved["past"][1][0].device.type == "meta"
    assert moved["past"][0] == "cache"


def test_wrong_number_of_agent_devices(tmp_path, tiny_path, prompts_dataset):
    args = comlrl_args(tmp_path, parallel_training="mp", agent_devices=["cpu", "cpu"])
    with pytest.raises(ValueError, match="2 devices for 3 agents"):
        MAGRPOTrainer(
            agent_model=tiny_path,
            num_agents=3,
            reward_func=lambda a, b, c: [0.0] * len(a),
            args=args,
            train_dataset=prompts_dataset,
        )


# ---------------------------------------------------------------------------------------------- 4. evaluation


def test_evaluation_calls_logger_and_aggregator_and_logs_turn_metrics(tmp_path, tiny_path, prompts_dataset):
    calls = {}

    def transition(prompt, agent_completions, num_agents, prompt_history_per_agent, response_history_per_agent):
        return [f"{prompt} again", f"{prompt} once more"]

    def eval_logger(agent_completions_turns, batch_items, prompts):
        calls["logger"] = (agent_completions_turns, batch_items, prompts)
        return [
            {"turn_1/length": float(len(c[0])), "turn_2/length": float(len(c[1]))} for c in agent_completions_turns[0]
        ]

    def eval_aggregator(metrics, num_turns):
        calls["aggregator"] = num_turns
        return {k: sum(m[k] for m in metrics) / len(metrics) for k in metrics[0]}

    def reward(c1, c2):
        return [float(len(a) % 3) for a in c1]

    args = comlrl_args(
        tmp_path, num_turns=2, early_termination_threshold=None, eval_interval=1, eval_num_samples=3, eval_batch_size=1
    )
    trainer = MAGRPOTrainer(
        agent_model=tiny_path,
        reward_func=reward,
        args=args,
        train_dataset=prompts_dataset,
        eval_dataset=prompts_dataset,
        external_transition=transition,
        eval_logger=eval_logger,
        eval_aggregator=eval_aggregator,
    )
    metrics = trainer.evaluate()
    completions, rows, prompts = calls["logger"]
    assert len(completions) == 2 and all(len(agent) == 3 for agent in completions)  # 2 agents, 3 rows
    assert all(len(turns) == 2 for agent in completions for turns in agent)  # every turn
    assert rows == [prompts_dataset[i] for i in range(3)] and prompts == PROMPTS[:3]
    assert calls["aggregator"] == 2
    lengths = [len(c[0]) for c in completions[0]]
    assert metrics["eval_turn_1/length"] == pytest.approx(sum(lengths) / 3)
    turn_1 = [reward([c[0]], [None])[0] for c in completions[0]]
    turn_2 = [reward([c[1]], [None])[0] for c in completions[0]]
    assert metrics["eval_turn_1/reward_mean"] == pytest.approx(sum(turn_1) / 3)
    assert metrics["eval_turn_2/reward_mean"] == pytest.approx(sum(turn_2) / 3)
    assert metrics["eval_turn_1/expected_return"] == pytest.approx((sum(turn_1) + sum(turn_2)) / 3)
    # During training: every eval_interval steps and before the first, in the Trainer log.
    trainer.train()
    logged = [h for h in trainer.state.log_history if "eval_turn_1/reward_mean" in h]
    assert len(logged) == 2 and all("eval_turn_2/length" in h for h in logged)
    assert len(calls["logger"][1]) == 3


# ---------------------------------------------------------------------------------------------- 3. trainer arguments


def test_agent_model_num_agents_model_config_and_verbose(tmp_path, tiny_path, prompts_dataset):
    model_config = {
        "torch_dtype": "bfloat16",
        "special_tokens": {"additional_special_tokens": ["<plan>"]},
        "model_kwargs": {"attn_implementation": "eager"},
    }
    trainer = MAGRPOTrainer(
        agent_model=tiny_path,
        num_agents=3,
        model_config=model_config,
        reward_func=lambda a, b, c: [0.0] * len(a),
        args=comlrl_args(tmp_path),
        train_dataset=prompts_dataset,
    )
    assert trainer.num_agents == trainer.args.num_agents == 3 and len(trainer.model.agents) == 3
    tokenizer = trainer.processing_class
    assert "<plan>" in tokenizer.get_vocab()
    for agent in trainer.model.agents:
        assert agent.dtype == torch.bfloat16 and agent.config._attn_implementation == "eager"
        assert agent.get_input_embeddings().num_embeddings >= len(tokenizer)
    assert trainer.verbose
    trainer.verbose = False
    assert trainer.args.disable_tqdm and not trainer.verbose
    with pytest.raises(ValueError, match="no step here reads"):
        MAGRPOTrainer(
            agent_model=tiny_path,
            model_config={"temperature": 0.3},
            reward_func=reference,
            args=comlrl_args(tmp_path),
            train_dataset=prompts_dataset,
        )


def test_auto_dtype_and_per_agent_tokenizers(tmp_path, tiny_path, prompts_dataset):
    tokenizers = [AutoTokenizer.from_pretrained(tiny_path) for _ in range(2)]
    trainer = MAGRPOTrainer(
        agents=[tiny_path, tiny_path],
        tokenizer=tokenizers,
        model_config={"torch_dtype": "auto"},
        reward_func=reference,
        args=comlrl_args(tmp_path),
        train_dataset=prompts_dataset,
    )
    assert [v["processing_class"] for v in trainer._agent_views] == tokenizers
    saved_dtype = AutoModelForCausalLM.from_pretrained(tiny_path).dtype
    assert trainer.model.agents[1].dtype == saved_dtype


def test_wandb_config_records_sections(tmp_path, tiny_path, prompts_dataset, monkeypatch):
    wandb = pytest.importorskip("wandb")
    wandb.teardown()  # wandb keeps the settings of an earlier run in this process (the client-script test's tags)
    monkeypatch.setenv("WANDB_MODE", "offline")
    for name in ("WANDB_PROJECT", "WANDB_ENTITY", "WANDB_DIR", "WANDB_TAGS"):
        monkeypatch.delenv(name, raising=False)
    wandb_config = {
        "project": "parity",
        "entity": "team",
        "name": "run-1",
        "dir": str(tmp_path / "wandb"),
        "tags": ["a", "b"],
        "config_sections": {"dataset": {"name": "stories"}, "output": {"verbose": False}},
    }
    trainer = MAGRPOTrainer(
        agent_model=tiny_path,
        reward_func=reference,
        args=comlrl_args(tmp_path, report_to="none"),
        train_dataset=prompts_dataset,
        wandb_config=wandb_config,
    )
    assert trainer.args.report_to == ["wandb"] and trainer.args.run_name == "run-1" and not trainer.verbose
    try:
        trainer.train()
        run = wandb.run
        assert run.config["dataset"] == {"name": "stories"}
        assert (run.project, run.name, list(run.tags)) == ("parity", "run-1", ["a", "b"])
        assert os.path.isdir(tmp_path / "wandb" / "wandb")
    finally:
        wandb.finish()
    with pytest.raises(ValueError, match="accepted keys"):
        MAGRPOTrainer(
            agent_model=tiny_path,
            reward_func=reference,
            args=comlrl_args(tmp_path),
            train_dataset=prompts_dataset,
            wandb_config={"projekt": "typo"},
        )


class StepCounter(TrainerCallback):
    def __init__(self):
        self.count = 0

    def on_step_end(self, args, state, control, **kwargs):
        self.count += 1


def test_checkpoints_every_interval_epochs_and_resume(tmp_path, tiny_path):
    dataset = Dataset.from_dict({"prompt": PROMPTS[:2]})  # one step per epoch (2 prompts per step)

    def make():
        args = comlrl_args(tmp_path, max_steps=-1, num_train_epochs=3, num_generations=2, max_new_tokens=4)
        return MAGRPOTrainer(agent_model=tiny_path, reward_func=reference, args=args, train_dataset=dataset)

    checkpoints = tmp_path / "ckpt"
    trainer = make()
    trainer.train(checkpoint_dir=str(checkpoints), checkpoint_interval=2)
    assert sorted(p.name for p in checkpoints.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-3"]  # 2 and last
    assert (checkpoints / "checkpoint-2" / "agent_1" / "config.json").is_file()

    # Resumed from epoch 2, the run trains the remaining epoch; a limit of 1 keeps the last checkpoint only.
    resumed, again = make(), tmp_path / "again"
    (again / "checkpoint-1").mkdir(parents=True)  # an older run's, removed by the limit
    resumed.train(
        resume_from_checkpoint=str(checkpoints / "checkpoint-2"),
        checkpoint_dir=str(again),
        checkpoint_interval=1,
        checkpoint_total_limit=1,
    )
    assert resumed.state.global_step == 3 and [p.name for p in again.glob("checkpoint-*")] == ["checkpoint-3"]

    # `resume_from_checkpoint=True`: the latest checkpoint in `checkpoint_dir` (checkpoint-2, once 3 is gone).
    shutil.rmtree(checkpoints / "checkpoint-3")
    latest, steps = make(), StepCounter()
    latest.add_callback(steps)
    latest.train(resume_from_checkpoint=True, checkpoint_dir=str(checkpoints))
    assert (latest.state.global_step, steps.count) == (3, 1)
    with pytest.raises(ValueError, match="`checkpoint_interval` must be a positive integer"):
        make().train(checkpoint_interval=0)
    with pytest.raises(ValueError, match="`checkpoint_total_limit` must be a positive integer"):
        make().train(checkpoint_total_limit=0)
    with pytest.raises(TypeError, match="generation settings are config fields"):
        make().train(do_sample=False)


def test_save_model_writes_one_folder_per_agent(tmp_path, tiny_path, prompts_dataset):
    trainer = MAGRPOTrainer(
        agent_model=tiny_path, reward_func=reference, args=comlrl_args(tmp_path), train_dataset=prompts_dataset
    )
    trainer.save_model(str(tmp_path / "final"))
    for i in range(2):
        assert AutoModelForCausalLM.from_pretrained(tmp_path / "final" / f"agent_{i}").config.model_type == "qwen2"


def test_eval_logger_needs_its_aggregator(tmp_path, tiny_path, prompts_dataset):
    with pytest.raises(ValueError, match="pass both"):
        MAGRPOTrainer(
            agent_model=tiny_path,
            reward_func=reference,
            args=comlrl_args(tmp_path),
            train_dataset=prompts_dataset,
            eval_logger=lambda **kw: [],
        )


def test_agent_model_must_be_a_name(tmp_path, tiny_path, prompts_dataset):
    model = AutoModelForCausalLM.from_pretrained(tiny_path)
    with pytest.raises(ValueError, match="`agent_model` must be a model id or path"):
        MAGRPOTrainer(
            agent_model=model, reward_func=reference, args=comlrl_args(tmp_path), train_dataset=prompts_dataset
        )


COMLRL_TRANSITION_KEYWORDS = [
    "agent_completions",
    "num_agents",
    "prompt",
    "prompt_history_per_agent",
    "response_history_per_agent",
]


def test_a_keyword_only_transition_gets_comlrls_keywords(tmp_path, tiny_path, prompts_dataset):
    """CoMLRL calls a transition with keywords only, so `def transition(**kwargs)` works there (its own tests build
    one, `tests/test_trainer_constraints.py`)."""
    calls = []

    def transition(**kwargs):
        calls.append(sorted(kwargs))
        return [f"{kwargs['prompt']} again"] * kwargs["num_agents"]

    trainer = MAGRPOTrainer(
        agent_model=tiny_path,
        reward_func=reference,
        args=comlrl_args(tmp_path, num_turns=2, num_generations=2, early_termination_threshold=None),
        train_dataset=prompts_dataset,
        external_transition=transition,
    )
    trainer.train()
    assert calls and all(keywords == COMLRL_TRANSITION_KEYWORDS for keywords in calls)


def test_built_without_train_dataset_as_comlrl_allows(tmp_path, tiny_path, prompts_dataset):
    """CoMLRL builds a trainer without training data (to evaluate, and in its own tests: two agents, two turns, a
    `**kwargs` transition) and asks for the data only when training."""
    trainer = MAGRPOTrainer(
        agents=[tiny_path, tiny_path],
        reward_func=reference,
        external_transition=lambda **kwargs: [kwargs["prompt"]] * kwargs["num_agents"],
        args=comlrl_args(tmp_path, num_turns=2, num_generations=2, eval_num_samples=2),
        eval_dataset=prompts_dataset,
    )
    assert trainer.num_agents == 2 and trainer.train_dataset is None
    assert "eval_turn_2/reward_mean" in trainer.evaluate()
    with pytest.raises(ValueError, match=r"Training needs a `train_dataset`.*`train_dataset=`"):
        trainer.train()


def test_discount_is_accepted_and_unused_as_in_comlrl(tmp_path, caplog):
    """CoMLRL 1.4.3 trains on the undiscounted return ("Training return is the undiscounted reward sum")."""
    with caplog.at_level("WARNING", logger="multiagent_trl.comlrl.reinforce"):
        args = comlrl_args(tmp_path, num_turns=2, discount=0.9)
    assert (args.discount, args.comlrl_discount, args.rollout) == (1.0, 0.9, "tree")
    assert [r.getMessage() for r in caplog.records if "discount" in r.getMessage()] == [
        "MAGRPOConfig: `discount=0.9` is not used in training, as in CoMLRL 1.4.3 (its training return is the "
        "undiscounted reward sum); returns are undiscounted. For discounted returns use MultiAgentGRPOConfig."
    ]
    caplog.clear()
    with caplog.at_level("WARNING", logger="multiagent_trl.comlrl.reinforce"):
        comlrl_args(tmp_path, num_turns=2)
    assert not caplog.records


@pytest.mark.parametrize(
    "logger, aggregator, message",
    [
        (
            lambda **kw: {"turn_1/x": 1.0},
            lambda m, num_turns: {},
            r"`eval_logger` returned dict; it must return a list",
        ),
        (lambda **kw: [{}] * 2, lambda m, num_turns: [1.0], r"`eval_aggregator` returned list; it must return a dict"),
        (lambda **kw: [{}] * 2, lambda m, num_turns: {"x": math.nan}, r"`eval_aggregator` returned x=nan"),
    ],
)
def test_evaluation_callables_are_checked_where_they_return(
    tmp_path, tiny_path, prompts_dataset, logger, aggregator, message
):
    args = comlrl_args(tmp_path, eval_interval=1, eval_num_samples=2)
    trainer = MAGRPOTrainer(
        agent_model=tiny_path,
        reward_func=reference,
        args=args,
        train_dataset=prompts_dataset,
        eval_dataset=prompts_dataset,
        eval_logger=logger,
        eval_aggregator=aggregator,
    )
    with pytest.raises(TypeError, match=message):
        trainer.evaluate()


@pytest.mark.parametrize(
    "model_config, dtype, attention",
    [
        ({"dtype": "bfloat16"}, torch.bfloat16, None),
        ({"model_kwargs": {"torch_dtype": "bfloat16"}}, torch.bfloat16, None),
        ({"attn_implementation": "eager"}, torch.float32, "eager"),
        ({"name": "a label"}, torch.float32, None),  # informational
    ],
)
def test_model_config_loads_the_agents_given_by_name(
    tmp_path, tiny_path, prompts_dataset, model_config, dtype, attention
):
    trainer = MAGRPOTrainer(
        agent_model=tiny_path,
        model_config=model_config,
        reward_func=reference,
        args=comlrl_args(tmp_path),
        train_dataset=prompts_dataset,
    )
    for agent in trainer.model.agents:
        assert agent.dtype == dtype
        assert attention is None or agent.config._attn_implementation == attention


def test_wandb_config_sets_wandbs_environment(tmp_path, tiny_path, prompts_dataset, monkeypatch):
    for name in ("WANDB_RUN_ID", "WANDB_RESUME"):
        monkeypatch.setenv(name, "before")  # restored after the test: the trainer sets them for wandb to read
    trainer = MAGRPOTrainer(
        agent_model=tiny_path,
        reward_func=reference,
        args=comlrl_args(tmp_path),
        train_dataset=prompts_dataset,
        wandb_config={"id": "run-7", "resume": True, "run_name": "seven"},
    )
    assert (os.environ["WANDB_RUN_ID"], os.environ["WANDB_RESUME"]) == ("run-7", "allow")
    assert trainer.args.run_name == "seven" and trainer.args.report_to == ["wandb"]


def ask_again(prompt, agent_completions, num_agents, prompt_history_per_agent, response_history_per_agent):
    return [f"{prompt} again"] * num_agents


@pytest.mark.parametrize(
    "trainer_class, config_class",
    [
        (MAGRPOTrainer, MAGRPOConfig),
        (MAREINFORCETrainer, MAREINFORCEConfig),
        (MAReMaxTrainer, MAReMaxConfig),
        (MARLOOTrainer, MARLOOConfig),
    ],
)
def test_no_args_means_the_trainers_default_config(
    tmp_path, tiny_path, prompts_dataset, monkeypatch, trainer_class, config_class
):
    monkeypatch.chdir(tmp_path)  # the default config's output_dir is relative
    trainer = trainer_class(
        agent_model=tiny_path,
        reward_func=reference,
        train_dataset=prompts_dataset,
        external_transition=ask_again,  # the default config plays 2 turns
    )
    assert type(trainer.args) is config_class
    assert trainer.args.advantage_baseline == config_class().advantage_baseline


def test_evaluate_takes_a_number_of_rows_and_needs_an_eval_dataset(tmp_path, tiny_path, prompts_dataset):
    seen = []

    def eval_logger(agent_completions_turns, batch_items, prompts):
        seen.append(len(batch_items))
        return [{} for _ in batch_items]

    trainer = MAGRPOTrainer(
        agent_model=tiny_path,
        reward_func=reference,
        args=comlrl_args(tmp_path, eval_interval=1, eval_num_samples=3),
        train_dataset=prompts_dataset,
        eval_dataset=prompts_dataset,
        eval_logger=eval_logger,
        eval_aggregator=lambda metrics, num_turns: {},
    )
    assert "eval_turn_1/reward_mean" in trainer.evaluate(num_eval_samples=2)
    assert "eval_turn_1/reward_mean" in trainer.evaluate()
    assert seen == [2, 3]  # that many rows, else `eval_num_samples`
    # Without an eval_dataset there is nothing to evaluate: no evaluation during training, and `evaluate()` is {}.
    trainer = MAGRPOTrainer(
        agent_model=tiny_path,
        reward_func=reference,
        args=comlrl_args(tmp_path, eval_interval=1),
        train_dataset=prompts_dataset,
    )
    assert trainer.args.eval_strategy == "no" and trainer.evaluate() == {}


def test_early_termination_applies_during_evaluation(tmp_path, tiny_path, prompts_dataset):
    """Every node's mean reward exceeds the threshold, so each evaluated trajectory ends after turn 1 (CoMLRL's
    evaluation would play turn 2): turn 2 has no reward and adds nothing to the return."""
    turns = []

    def eval_logger(agent_completions_turns, batch_items, prompts):
        turns.extend(len(trajectory) for agent in agent_completions_turns for trajectory in agent)
        return [{} for _ in batch_items]

    trainer = MAGRPOTrainer(
        agent_model=tiny_path,
        reward_func=lambda c1, c2: [1.0] * len(c1),
        args=comlrl_args(tmp_path, num_turns=2, early_termination_threshold=0.5, eval_num_samples=2),
        train_dataset=prompts_dataset,
        eval_dataset=prompts_dataset,
        external_transition=ask_again,
        eval_logger=eval_logger,
        eval_aggregator=lambda metrics, num_turns: {},
    )
    metrics = trainer.evaluate()
    assert turns == [1] * 4  # 2 agents x 2 rows, one turn each
    assert metrics["eval_turn_1/reward_mean"] == metrics["eval_turn_1/expected_return"] == 1.0
    assert metrics["eval_turn_2/reward_mean"] == metrics["eval_turn_2/expected_return"] == 0.0


def test_save_checkpoint_before_training_holds_the_weights_for_load_checkpoint(tmp_path, tiny_path, prompts_dataset):
    """CoMLRL's `save_checkpoint` works between runs, before any optimizer exists: weights, state and RNG."""
    trainer = MAGRPOTrainer(
        agent_model=tiny_path, reward_func=length_ratio, args=comlrl_args(tmp_path), train_dataset=prompts_dataset
    )
    with torch.no_grad():
        trainer.model.agents[1].lm_head.weight.add_(0.5)  # a state no fresh trainer has
    folder = trainer.save_checkpoint(str(tmp_path / "before"))
    assert not os.path.exists(os.path.join(folder, "optimizer.pt"))
    fresh = MAGRPOTrainer(
        agent_model=tiny_path, reward_func=length_ratio, args=comlrl_args(tmp_path), train_dataset=prompts_dataset
    )
    assert fresh.load_checkpoint(folder) == {"global_step": 0, "epoch": 0}
    torch.testing.assert_close(fresh.model.agents[1].lm_head.weight, trainer.model.agents[1].lm_head.weight)
    assert fresh.pending_checkpoint == folder
    with pytest.raises(FileNotFoundError, match="not a checkpoint"):
        fresh.load_checkpoint(str(tmp_path))
