"""Bad settings and inputs refused early, naming the setting: non-finite numbers in every family's config, a
non-finite loss during training, CoMLRL's `batch_items` rewards in the actor-critic trainers, and raw errors that
named no setting."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, HfArgumentParser

from multiagent_trl import MultiAgentGRPOConfig, MultiAgentGRPOTrainer
from multiagent_trl.actor_critic.config import ActorCriticConfig
from multiagent_trl.actor_critic.trainer import ActorCriticTrainer
from multiagent_trl.actor_critic.value_model import CausalLMWithValueHead
from multiagent_trl.comlrl import (
    CentralizedMAGRPOConfig,
    IACConfig,
    IACTrainer,
    MAACConfig,
    MAACTrainer,
    MADPOConfig,
    MADPOIterConfig,
    MAGRPOConfig,
    MAREINFORCEConfig,
    MAReMaxConfig,
    MARLHFConfig,
    MARLHFIterConfig,
    MARLHFTrainer,
    MARLOOConfig,
)
from multiagent_trl.comlrl.actor_critic import item_reward
from multiagent_trl.config import SETTING_RANGES, annotation_parts, declared_type, whole_number_field
from multiagent_trl.preference.config import MultiAgentDPOConfig
from multiagent_trl.preference.iterative import MultiAgentIterativeDPOConfig, MultiAgentIterativeDPOTrainer
from multiagent_trl.preference.iterative_rlhf import MultiAgentIterativeRLHFConfig
from multiagent_trl.preference.reward_model import JointRewardModel
from multiagent_trl.preference.reward_training import JointPreferencePair, train_reward_model
from multiagent_trl.preference.rlhf import MultiAgentRLHFConfig, MultiAgentRLHFTrainer
from multiagent_trl.preference.rlhf_actor_critic import ActorCriticRLHFConfig
from multiagent_trl.preference.trainer import MultiAgentDPOTrainer

from .conftest import changed, length_ratio, small_args, snapshot
from .test_actor_critic import other_vocabulary_model

CONFIGS = [
    MultiAgentGRPOConfig,
    ActorCriticConfig,
    MultiAgentDPOConfig,
    MultiAgentIterativeDPOConfig,
    MultiAgentRLHFConfig,
    ActorCriticRLHFConfig,
    MultiAgentIterativeRLHFConfig,
    MAGRPOConfig,
    MAREINFORCEConfig,
    MAReMaxConfig,
    MARLOOConfig,
    CentralizedMAGRPOConfig,
    IACConfig,
    MAACConfig,
    MADPOConfig,
    MADPOIterConfig,
    MARLHFConfig,
    MARLHFIterConfig,
]


def float_fields(config_class) -> list[tuple[str, bool]]:
    """`(name, takes a list)` of every field of `config_class` typed as a float (TRL's, the team's, CoMLRL's)."""
    found = []
    for f in dataclasses.fields(config_class):
        kind = str(f.type)
        if f.init and re.search(r"\bfloat\b", kind):
            found.append((f.name, "list[" in kind))
    return found


def not_refused(tmp_path, config_class, fields: list[tuple[str, bool]], value, refusal: str) -> list[str]:
    """Each of `fields` (`(name, takes a list)`) of `config_class` set to `value` (in a list where it takes one): those
    the config accepts, or refuses without `refusal` (formatted with the field's `name`) in its error."""
    missed = []
    for name, listed in fields:
        try:
            config_class(output_dir=str(tmp_path), report_to="none", **{name: [value] if listed else value})
        except ValueError as error:
            if refusal.format(name=name) not in str(error):
                missed.append(f"{name}: {error}")
        else:
            missed.append(f"{name}: accepted")
    return missed


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("config_class", CONFIGS, ids=lambda c: c.__name__)
def test_non_finite_settings_are_refused_naming_the_field(tmp_path, config_class, value):
    missed = not_refused(tmp_path, config_class, float_fields(config_class), value, "`{name}` must be a finite number")
    assert not missed, "\n".join(missed)


def whole_fields(config_class) -> list[tuple[str, bool]]:
    """`(name, takes a list)` of every field of `config_class` that counts, sizes or indexes (`whole_number_field`)."""
    declared = {f.name: declared_type(config_class, f.name) for f in dataclasses.fields(config_class)}
    return [(name, "list[" in str(kind)) for name, kind in declared.items() if whole_number_field(kind)]


# What users set most, which the checks must cover: the floats (non-finite), the counts and sizes (fractions).
SET_MOST = {
    "float": (
        "learning_rate",
        "beta",
        "epsilon",
        "temperature",
        "top_p",
        "max_grad_norm",
        "discount",
        "critic_learning_rate",
        "value_loss_coef",
        "dpo_beta",
        "agent_learning_rate",
        "reward_learning_rate",
    ),
    "whole": (
        "num_generations",
        "steps_per_generation",
        "max_completion_length",
        "top_k",
        "preference_pairs_per_sample",
        "pair_steps_per_generation",
        "comparator_history_k",
        "comparator_num_generations",
        "replay_k",
        "replay_sample_size",
        "pair_batch_size",
        "pair_passes",
        "reward_num_train_epochs",
        "reward_train_batch_size",
        "reward_max_length",
        "critic_value_head_hidden_dim",
        "rollout_buffer_size",
    ),
}


@pytest.mark.parametrize("kind", sorted(SET_MOST))
def test_the_checked_fields_include_the_settings_users_set(kind):
    fields = float_fields if kind == "float" else whole_fields
    names = {name for cls in CONFIGS for name, _ in fields(cls)}
    assert set(SET_MOST[kind]) <= names, set(SET_MOST[kind]) - names


@pytest.mark.parametrize("config_class", CONFIGS, ids=lambda c: c.__name__)
def test_fractional_counts_are_refused_naming_the_field(tmp_path, config_class):
    """A fraction in a field of whole numbers is refused by the config, naming it; before, `pair_passes=1.5` or
    `reward_num_train_epochs=1.5` passed every range check and failed in `train()` as a bare `TypeError` (in
    `range()`, a slice, a sampler), and `replay_k=1.7` was cut to 1."""
    missed = not_refused(tmp_path, config_class, whole_fields(config_class), 1.5, "`{name}` must be a whole number")
    assert not missed, "\n".join(missed)


@pytest.mark.parametrize("config_class", CONFIGS, ids=lambda c: c.__name__)
def test_a_string_in_a_flag_is_refused_naming_the_field(tmp_path, config_class):
    """Every non-empty string is true: before, `reference_free="False"` built no reference models and
    `value_normalization="False"` built the normalizers."""
    declared = {f.name: declared_type(config_class, f.name) for f in dataclasses.fields(config_class)}
    flags = [name for name, kind in declared.items() if annotation_parts(kind) in ({"bool"}, {"bool", "None"})]
    assert {"reference_free", "value_normalization", "bf16"} & set(flags)
    missed = not_refused(tmp_path, config_class, [(name, False) for name in flags], "False", "`{name}` is a flag")
    assert not missed, "\n".join(missed)


def test_the_checks_read_the_declared_types_after_a_command_line_is_parsed(tmp_path):
    """`HfArgumentParser` rewrites the dataclass fields' `type` in place (`str | bool` becomes `bool`): read from
    there, every config built after a parse refused TRL's default `include_num_input_tokens_seen="no"` as a string flag
    (707 tests failed in a fresh-clone run that parsed a command line first)."""
    HfArgumentParser(MultiAgentIterativeDPOConfig).parse_args_into_dataclasses(["--output_dir", str(tmp_path)])
    config = MultiAgentIterativeDPOConfig(output_dir=str(tmp_path), report_to="none")
    assert config.include_num_input_tokens_seen == "no"


def test_a_whole_float_becomes_the_int(tmp_path):
    config = MultiAgentIterativeDPOConfig(
        output_dir=str(tmp_path), report_to="none", num_agents=2, num_generations=4.0, pair_batch_size=2.0,
        top_k=[3.0, 5.0],
    )  # fmt: skip
    assert (config.num_generations, config.pair_batch_size, config.top_k) == (4, 2, [3, 5])
    assert all(type(v) is int for v in (config.num_generations, config.pair_batch_size, *config.top_k))


OUT_OF_RANGE = {
    "temperature": 0.0,
    "top_p": 2.0,
    "top_k": -3,
    "min_p": 5.0,
    "repetition_penalty": 0.0,
    "learning_rate": -1e-3,
    "beta": -0.1,
    "epsilon": -0.2,
    "num_iterations": 0,
}
NATIVE_CONFIGS = [cls for cls in CONFIGS if not cls.__module__.startswith("multiagent_trl.comlrl")]


@pytest.mark.parametrize("config_class", NATIVE_CONFIGS, ids=lambda c: c.__name__)
def test_settings_out_of_range_are_refused_by_the_config(tmp_path, config_class):
    """Sampling settings out of range failed inside `train()`, at the first `generate`, in transformers' words (which
    name no agent and call `repetition_penalty` "penalty"), or, `top_p` above 1, acted as 1 without a word; a negative
    learning rate failed in the optimizer; a negative `beta` or `epsilon` trained; `num_iterations=0` trained no step.
    Each is refused by the config, one value or one per agent."""
    assert set(OUT_OF_RANGE) == set(SETTING_RANGES)
    for name, value in OUT_OF_RANGE.items():
        with pytest.raises(ValueError, match=rf"`{name}` must be"):
            config_class(output_dir=str(tmp_path), report_to="none", **{name: value})
    with pytest.raises(ValueError, match=r"`top_p` must be in \(0, 1\]"):
        config_class(output_dir=str(tmp_path), report_to="none", num_agents=2, top_p=[0.9, 7.0])


EMPTY_DATASET_TRAINERS = {
    "grpo": (MultiAgentGRPOConfig, MultiAgentGRPOTrainer, {}),
    "dpo": (MultiAgentDPOConfig, MultiAgentDPOTrainer, {}),
    "iterative_dpo": (MultiAgentIterativeDPOConfig, MultiAgentIterativeDPOTrainer, {}),
    "iterative_dpo_pairs": (MultiAgentIterativeDPOConfig, MultiAgentIterativeDPOTrainer, {"pair_batch_size": 1}),
    "rlhf": (MultiAgentRLHFConfig, MultiAgentRLHFTrainer, {}),
    "actor_critic": (ActorCriticConfig, ActorCriticTrainer, {}),
}


@pytest.mark.parametrize("family", sorted(EMPTY_DATASET_TRAINERS))
def test_a_dataset_that_fills_no_generation_batch_is_refused_when_training_starts(tmp_path, tiny_path, family):
    """Before, an empty dataset trained no step and returned (Trainer's warning only), or failed on Trainer's
    "args.max_steps must be set" (iterative DPO); RLHF's empty one raised after nothing, a one-row one after its whole
    reward-model stage."""
    config_class, trainer_class, settings = EMPTY_DATASET_TRAINERS[family]
    if family.startswith("iterative"):
        settings = {**settings, "max_steps": -1}
    args = small_args(tmp_path, config_class, num_agents=2, **settings)
    for rows, message in ((0, r"`train_dataset` is empty"), (1, r"has 1 rows, fewer than one generation batch's 2")):
        if rows and family != "grpo" and family != "rlhf":
            continue  # these complete a short last batch (every item trained each epoch): one row trains
        trainer = trainer_class(
            model=tiny_path,
            reward_funcs=length_ratio,
            args=args,
            train_dataset=Dataset.from_dict({"prompt": ["Say hi:"] * rows}),
        )
        with pytest.raises(ValueError, match=message):
            trainer.train()
        assert trainer.state.global_step == 0
        if family == "rlhf":
            assert trainer.preference_pairs == [] and trainer.reward_model_history == []


# ---- a non-finite loss stops training, naming the loss and the step, before any weight takes it


def huge_reward(completions1, completions2):
    """Finite, but its squared error overflows float32."""
    return [1e20] * len(completions1)


def test_an_overflowing_value_loss_stops_training_before_the_critics_update(tmp_path, tiny_path, prompts_dataset):
    # Raw targets: value normalization (the default) standardizes them, and then a reward of 1e20 trains finitely.
    args = small_args(
        tmp_path,
        ActorCriticConfig,
        num_agents=2,
        num_generations=2,
        per_device_train_batch_size=4,
        value_normalization=False,
    )
    trainer = ActorCriticTrainer(model=tiny_path, reward_funcs=huge_reward, args=args, train_dataset=prompts_dataset)
    before = [snapshot(critic) for critic in trainer.critics]
    agents = snapshot(trainer.model)
    message = r"value loss of agent 0's critic \(`agent_0/value_loss`\) is inf at training step 1"
    with pytest.raises(FloatingPointError, match=message):
        trainer.train()
    for critic, weights in zip(trainer.critics, before):
        assert not changed(weights, critic)
        assert all(torch.isfinite(p).all() for p in critic.parameters())
    assert not changed(agents, trainer.model)
    trainer.save_model(str(tmp_path / "saved"))  # what a user saves after the error holds no NaN
    saved = CausalLMWithValueHead.from_pretrained(str(tmp_path / "saved" / "agent_0" / "critic"))
    assert all(torch.isfinite(p).all() for p in saved.parameters())


def diverging_reward(holder: dict):
    """A reward that turns agent 0's weights NaN once its completions are drawn (a diverged update would): the loss
    then scores them with those weights."""

    def reward(completions1, completions2):
        for p in holder["trainer"].model.agents[0].parameters():
            p.data.fill_(math.nan)
        return [float(k % 2) for k in range(len(completions1))]

    return reward


@pytest.mark.parametrize(
    "trainer_class, config_class, loss",
    [
        (MultiAgentGRPOTrainer, MultiAgentGRPOConfig, "policy loss"),
        (MultiAgentDPOTrainer, MultiAgentDPOConfig, "DPO loss"),
    ],
    ids=["policy", "dpo"],
)
def test_a_nan_agent_loss_stops_training_naming_it(tmp_path, tiny_path, trainer_class, config_class, loss):
    holder = {}
    args = small_args(tmp_path, config_class, num_agents=2, per_device_train_batch_size=4, generation_mode="per_agent")
    trainer = holder["trainer"] = trainer_class(
        model=tiny_path,
        reward_funcs=diverging_reward(holder),
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["Name a fruit:", "Name a fish:"] * 2}),
    )
    agent_1 = snapshot(trainer.model.agents[1])
    with pytest.raises(FloatingPointError, match=rf"{loss} of agent 0 \(`agent_0/loss`\) is nan at training step 1"):
        trainer.train()
    assert not changed(agent_1, trainer.model.agents[1])


def test_a_nan_reward_model_loss_stops_its_training_naming_it(tiny_path):
    model = JointRewardModel(AutoModelForCausalLM.from_pretrained(tiny_path), AutoTokenizer.from_pretrained(tiny_path))
    model.reward_head.weight.data.fill_(math.nan)
    backbone = snapshot(model.backbone)
    pairs = [JointPreferencePair(("Hi", "Hi"), ("a", "b"), ("c", "d"), 1.0, 0.0)] * 2
    with pytest.raises(
        FloatingPointError, match=r"reward-model loss \(`reward_model/loss`\) is nan at training step 1"
    ):
        train_reward_model(model, pairs, learning_rate=1e-3, batch_size=2)
    assert not changed(backbone, model.backbone)


# ---- CoMLRL's `f(completions1, completions2, batch_items=None)` in the actor-critic trainers


@pytest.mark.parametrize("family", ["native", "iac", "maac"])
def test_a_reward_with_batch_items_trains_and_sees_the_rows(tmp_path, tiny_path, prompts_dataset, family):
    seen = []

    def reward(completions1, completions2, batch_items=None):
        seen.append(batch_items)
        return [float(len(b) > len(a)) for a, b in zip(completions1, completions2)]

    if family == "native":
        args = small_args(tmp_path, ActorCriticConfig, num_agents=2, num_generations=2, per_device_train_batch_size=4)
        trainer = ActorCriticTrainer(model=tiny_path, reward_funcs=reward, args=args, train_dataset=prompts_dataset)
    else:
        config_class, trainer_class = (IACConfig, IACTrainer) if family == "iac" else (MAACConfig, MAACTrainer)
        args = config_class(
            output_dir=str(tmp_path), num_turns=1, num_generations=2, max_new_tokens=4, rollout_buffer_size=4,
            max_steps=1, eval_interval=0, report_to="none",
        )  # fmt: skip
        trainer = trainer_class(
            agent_model=tiny_path, critic_model=tiny_path, reward_func=reward, args=args, train_dataset=prompts_dataset
        )
    before = snapshot(trainer.model)
    trainer.train()
    assert changed(before, trainer.model)
    prompts = {row["prompt"] for call in seen for row in call}
    assert seen and prompts <= set(prompts_dataset["prompt"]) and prompts


# ---- settings refused at construction, naming the setting and the fix


@pytest.mark.parametrize(
    "config_class, fields, name",
    [
        (ActorCriticConfig, dict(critic_value_head_hidden_dim=0), "critic_value_head_hidden_dim"),
        (IACConfig, dict(critic_value_head_hidden_dim=0), "critic_value_head_hidden_dim"),
        (IACConfig, dict(use_separate_critic=False, value_head_hidden_dim=0), "value_head_hidden_dim"),
        (MARLHFConfig, dict(rl_algorithm="iac", critic_value_head_hidden_dim=0), "critic_value_head_hidden_dim"),
        (MARLHFConfig, dict(rl_algorithm="maac", critic_value_head_hidden_dim=0), "critic_value_head_hidden_dim"),
    ],
)
def test_a_value_head_of_width_zero_is_refused(tmp_path, config_class, fields, name):
    with pytest.raises(ValueError, match=rf"`{name}` must be a positive width .* or None"):
        config_class(output_dir=str(tmp_path), report_to="none", **fields)


def test_actor_critic_arguments_in_the_wrong_form_are_refused_at_construction(tmp_path, tiny_path, prompts_dataset):
    """Before: `rollout_metrics=5` failed at the first step ("'int' object is not callable"), and a tokenizer's id as
    `critic_processing_class` at construction as "'str' object has no attribute 'get_vocab'"."""
    args = small_args(tmp_path, ActorCriticConfig, num_agents=2, num_generations=2, per_device_train_batch_size=4)
    common = dict(model=tiny_path, reward_funcs=good_reward, args=args, train_dataset=prompts_dataset)
    with pytest.raises(TypeError, match="`rollout_metrics` must be a callable"):
        ActorCriticTrainer(**common, rollout_metrics=5)
    with pytest.raises(TypeError, match="`critic_processing_class` takes tokenizers, not ids or paths"):
        ActorCriticTrainer(**common, critic_model=tiny_path, critic_processing_class=tiny_path)


def test_a_bogus_reward_model_device_is_refused_at_construction(tmp_path):
    with pytest.raises(ValueError, match=r"`reward_model_device='bogus'` is not a device"):
        MARLHFConfig(output_dir=str(tmp_path), report_to="none", reward_model_device="bogus")


@pytest.mark.parametrize("config_class", [MADPOIterConfig, MARLHFIterConfig])
def test_a_replay_dir_that_is_a_file_is_refused_at_construction(tmp_path, config_class):
    path = tmp_path / "shards.json"
    path.write_text("{}")
    with pytest.raises(ValueError, match=r"`preference_replay_dir=.*shards.json'` is a file"):
        config_class(output_dir=str(tmp_path), report_to="none", preference_replay_dir=str(path))


BAD_CRITICS = {"missing": "/no/such/critic", "not a model": "{folder}", "bad id": "not a//repo id"}


@pytest.mark.parametrize("bad", list(BAD_CRITICS))
@pytest.mark.parametrize("family", ["native", "iac", "marlhf-iac", "marlhf-maac"])
def test_a_critic_model_that_is_no_model_names_the_setting(tmp_path, tiny_path, prompts_dataset, family, bad):
    source = BAD_CRITICS[bad].format(folder=tmp_path)
    match = rf"`critic_model='{re.escape(source)}'` is not a model id or a folder holding a saved model"
    with pytest.raises(ValueError, match=match):
        if family == "native":
            args = small_args(
                tmp_path, ActorCriticConfig, num_agents=2, num_generations=2, per_device_train_batch_size=4
            )
            ActorCriticTrainer(
                model=tiny_path,
                reward_funcs=good_reward,
                args=args,
                train_dataset=prompts_dataset,
                critic_model=source,
            )
        elif family == "iac":
            args = IACConfig(
                output_dir=str(tmp_path), num_turns=1, max_new_tokens=4, rollout_buffer_size=4, report_to="none"
            )
            IACTrainer(agent_model=tiny_path, critic_model=source, reward_func=good_reward, args=args)
        else:
            marlhf(tmp_path, tiny_path, prompts_dataset, family.split("-")[1], critic_model=source)


def good_reward(completions1, completions2):
    return [0.0] * len(completions1)


def marlhf(tmp_path, tiny_path, dataset, algorithm, **kwargs):
    args = MARLHFConfig(output_dir=str(tmp_path), rl_algorithm=algorithm, report_to="none", reward_model_device=None)
    return MARLHFTrainer(agent_model=tiny_path, reward_func=good_reward, args=args, train_dataset=dataset, **kwargs)


def test_marlhf_checks_an_independent_critics_vocabulary_at_construction(tmp_path, tiny_path, prompts_dataset):
    with pytest.raises(ValueError, match="another tokenizer than agent 0"):
        marlhf(tmp_path, tiny_path, prompts_dataset, "iac", critic_model=other_vocabulary_model(tmp_path))


def test_a_reward_tensor_on_the_meta_device_names_the_function(tmp_path, tiny_path, prompts_dataset):
    def meta_reward(completions1, completions2):
        return torch.zeros(len(completions1), device="meta")

    trainer = MultiAgentGRPOTrainer(
        model=tiny_path,
        reward_funcs=meta_reward,
        args=small_args(tmp_path, num_agents=2),
        train_dataset=prompts_dataset,
    )
    with pytest.raises(ValueError, match=r"'meta_reward' returned a tensor on the meta device"):
        trainer.train()


def test_a_comlrl_actor_critic_reward_tensor_on_the_meta_device_names_the_function():
    def meta_reward(completions1, completions2):
        return torch.zeros(len(completions1), device="meta")

    bound = item_reward(meta_reward, None, num_agents=2, num_generations=2)
    with pytest.raises(ValueError, match=r"'meta_reward' returned a tensor on the meta device"):
        bound([("p", "p")] * 2, [("a", "b"), ("c", "d")], batch_items=[{"prompt": "p"}] * 2)
